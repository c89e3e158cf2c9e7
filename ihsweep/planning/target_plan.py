"""The records of a compiled plan (``targets.plan_for_target``): ``TargetPlan``, its
``PlannedGroup`` rows and ``Layout``s. Each is frozen; ``to_json`` gives what ``ihsweep plan
--target --json`` prints (keys in this order) and ``from_json`` reads it back, so a saved plan
formats as the tool would have printed it (``plan_text.format_plan``)."""

from __future__ import annotations

import dataclasses

from ihsweep.planning.list_schedule import Slot


@dataclasses.dataclass(frozen=True)
class AttentionBytes:
  """The train step's attention kernel (``compiled``, ``train.resolve_attention``) and, per
  device against the explicit ``[B·H, C, C]`` pattern at the same setting, ``explicit_bytes``
  (where ``--compare_attention`` compiled it) and ``saved_bytes`` (0 for the explicit pattern
  itself); None where not known, and then absent from the JSON."""

  compiled: str
  explicit_bytes: int | None = None
  saved_bytes: int | None = None

  def to_json(self) -> dict:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class GroupMemory:
  """Bytes per device of a group's programs at its setting: ``per_device_bytes`` (arguments +
  temporaries, ``memory.Choice``), of which ``argument_bytes`` and ``temp_bytes`` are the train
  program's; ``capacity_bytes`` the device's less the headroom; ``fits``."""

  per_device_bytes: int
  argument_bytes: int
  temp_bytes: int
  capacity_bytes: int
  fits: bool


@dataclasses.dataclass(frozen=True)
class PlannedGroup:
  """One group compiled on ``devices`` (m) of the target: its shape (B, C, E models of
  ``n_params``), mesh [ensemble, data], memory setting (k, chunk, remat, attention) and bytes;
  its update's FLOPs and bytes per device (``flops_per_update``, from ``cost_from``; the
  analytic PaLM count per device beside it), ``kernels_per_update`` (XLA:GPU, else None), the
  roofline terms (seconds, ``targets.update_time_terms``) and their max ``roofline_update_s``;
  ``all_reduce_s`` per update on the chip's network; ``update_s`` their sum; over ``updates``,
  ``roofline_s`` and ``seconds``; ``checkpoints`` (``schedule.checkpoint_bytes``).
  ``compiled_settings`` settings compiled in ``compile_s`` seconds, each in ``tried``."""

  id: str
  batch_size: int
  context_size: int
  n_models: int
  n_params: int
  devices: int
  mesh: tuple[int, int]
  gradient_accumulation_steps: int
  vmap_chunk: int
  remat: str
  attention: AttentionBytes
  memory_from: str
  cost_from: str
  memory: GroupMemory
  compiled_settings: int
  compile_s: float
  tried: list
  flops_per_update: float
  analytic_flops_per_update: float
  bytes_per_update: float
  kernels_per_update: int | None
  roofline_terms: dict
  roofline_from: str
  roofline_update_s: float
  all_reduce_s: float
  update_s: float
  updates: int
  roofline_s: float
  seconds: float
  checkpoints: dict

  def to_json(self) -> dict:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out.update(
      mesh=list(self.mesh),
      attention=self.attention.to_json(),
      memory=dataclasses.asdict(self.memory),
    )
    return out

  @classmethod
  def from_json(cls, d: dict) -> PlannedGroup:
    return cls(
      **{
        **d,
        "mesh": tuple(d["mesh"]),
        "attention": AttentionBytes(**d["attention"]),
        "memory": GroupMemory(**d["memory"]),
      }
    )


@dataclasses.dataclass(frozen=True)
class Layout:
  """Workers of ``devices_per_worker`` (D) over the target: ``n_workers`` of them, the list
  schedule's ``makespan_s`` and ``utilisation``, the groups whose gradient is all-reduced
  (``data_axis_groups``), the all-reduces' share of the groups' device-time (``comm_share``),
  ``not_launchable`` (why the launchers cannot start it, or None) and its ``schedule``."""

  devices_per_worker: int
  n_workers: int
  makespan_s: float
  utilisation: float
  data_axis_groups: int
  comm_share: float
  not_launchable: str | None = None
  schedule: tuple[Slot, ...] = ()

  def to_json(self) -> dict:
    """The layout's JSON without its schedule (the plan holds the best one's)."""
    out = dataclasses.asdict(self)
    del out["schedule"]
    return out


@dataclasses.dataclass(frozen=True)
class RefusedLayout:
  """Devices per worker the plan tried before its layout, and why it refused them."""

  devices_per_worker: int
  why: str


@dataclasses.dataclass(frozen=True)
class Launch:
  """``launch.launch_lines`` for the plan's layout: shell ``lines`` and a ``note``."""

  lines: list[str]
  note: str


@dataclasses.dataclass(frozen=True)
class TargetPlan:
  """``targets.plan_for_target``'s result. ``target``: ``toolchain.Target.to_json``;
  ``refused``: layouts tried before the first at which every group fits,
  ``compiled_devices_per_worker`` (None where none fits, and then ``groups`` is empty);
  ``groups`` compiled there; ``layouts``: it and every wider one; ``best``: the plan's
  (``targets.best_layout``), with ``unpriced`` where the chip's network has no published figure;
  ``phases`` (each a ``Phase.to_json``), ``phases_reason`` and ``phases_makespan_s``: how
  ``ihsweep run`` lays the sweep out on the target with the same times (none where the config
  fixes mesh.num_devices or the network is unpriced); ``chosen``: "phases" (the plan's choice
  is run's own layout, as ``placement.best_layout`` decides: unless ``best`` beats it by more
  than ``phases.PHASE_TIE``) or "layout" (``best``); ``time_model``: how every time was priced
  (``timing.FlopsModel.describe`` with the compiled times); ``launch``: the choice's lines
  (None without the run's flags); ``checkpoints``
  (``schedule.checkpoint_totals``); ``headroom`` (a share of capacity) and ``roofline`` (how
  times are bounded, words)."""

  target: dict
  refused: tuple[RefusedLayout, ...]
  groups: tuple[PlannedGroup, ...] = ()
  compiled_devices_per_worker: int | None = None
  layouts: tuple[Layout, ...] = ()
  best: Layout | None = None
  unpriced: str | None = None
  phases: tuple = ()
  phases_reason: str | None = None
  phases_makespan_s: float | None = None
  chosen: str = "layout"
  time_model: str | None = None
  launch: Launch | None = None
  checkpoints: dict | None = None
  headroom: float | None = None
  roofline: str | None = None

  @property
  def fits(self) -> bool:
    return bool(self.groups) and all(g.memory.fits for g in self.groups)

  def to_json(self) -> dict:
    refused = [dataclasses.asdict(r) for r in self.refused]
    if self.best is None:
      return {"target": self.target, "fits": False, "refused": refused, "groups": []}
    best = self.best
    return {
      "target": self.target,
      "devices_per_worker": best.devices_per_worker,
      "n_workers": best.n_workers,
      "compiled_devices_per_worker": self.compiled_devices_per_worker,
      "refused": refused,
      "groups": [g.to_json() for g in self.groups],
      "layouts": [lay.to_json() for lay in self.layouts],
      "schedule": [dataclasses.asdict(slot) for slot in best.schedule],
      "makespan_s": best.makespan_s,
      "utilisation": best.utilisation,
      "unpriced": self.unpriced,
      "phases": list(self.phases),
      "phases_reason": self.phases_reason,
      "phases_makespan_s": self.phases_makespan_s,
      "chosen": self.chosen,
      "time_model": self.time_model,
      "launch": dataclasses.asdict(self.launch) if self.launch else None,
      "fits": self.fits,
      "checkpoints": self.checkpoints,
      "headroom": self.headroom,
      "roofline": self.roofline,
    }

  @classmethod
  def from_json(cls, d: dict) -> TargetPlan:
    """The plan ``to_json`` (``ihsweep plan --target --json``) printed."""
    refused = tuple(RefusedLayout(**r) for r in d["refused"])
    if not d["groups"]:
      return cls(d["target"], refused)
    best_d, schedule = d["devices_per_worker"], tuple(Slot(**s) for s in d["schedule"])
    layouts = tuple(
      Layout(**lay, schedule=schedule if lay["devices_per_worker"] == best_d else ())
      for lay in d["layouts"]
    )
    return cls(
      target=d["target"],
      refused=refused,
      groups=tuple(PlannedGroup.from_json(g) for g in d["groups"]),
      compiled_devices_per_worker=d["compiled_devices_per_worker"],
      layouts=layouts,
      best=next(lay for lay in layouts if lay.devices_per_worker == best_d),
      unpriced=d["unpriced"],
      phases=tuple(d.get("phases", ())),
      phases_reason=d.get("phases_reason"),
      phases_makespan_s=d.get("phases_makespan_s"),
      chosen=d.get("chosen", "layout"),
      time_model=d.get("time_model"),
      launch=Launch(**d["launch"]) if d["launch"] else None,
      checkpoints=d["checkpoints"],
      headroom=d["headroom"],
      roofline=d["roofline"],
    )
