"""The compiled plan of a sweep for a target (``ihsweep plan --target=NAME``, ``plan_for_target``):
every group's programs compiled for the target's devices (``toolchain.make_target``) at the
memory setting that fits, each layout of workers over the devices priced (update time from the
compiled program's FLOPs, bytes and kernels, gradient all-reduces on the chip's interconnect:
``chips``, ``chips.NETWORKS``) and packed into phases, and the best layout with the lines that
launch it. Its text: ``plan_text.format_plan``.
"""

from __future__ import annotations

import copy
import dataclasses

from ihsweep.base import numbers
from ihsweep.planning import kernels, list_schedule, phases
from ihsweep.planning.target_plan import (
  AttentionBytes,
  GroupMemory,
  Launch,
  Layout,
  PlannedGroup,
  RefusedLayout,
  TargetPlan,
)
from ihsweep.planning.toolchain import Target, TargetError


def planned_source(cfg):
  """The data source a group's programs are compiled with for a target: the config's own,
  except that natural text (whose corpus need not be on this machine) is a host-fed stand-in
  of the corpus dtype (``[E, U, B, C + 1]`` per call, as at study scale)."""
  from ihsweep.data import make_source
  from ihsweep.data.source import Source

  mcfg, tr = cfg.model, cfg.train
  if cfg.data.source != "natural":
    return make_source(cfg.data, mcfg.vocab_size, tr.batch_size, tr.context_size)
  import numpy as np

  dtype = np.uint16 if mcfg.vocab_size <= 1 << 16 else np.uint32

  @dataclasses.dataclass
  class PlannedText(Source):
    vocab_size: int
    batch_size: int
    context_size: int
    on_device = False
    has_held_out_windows = True

    def sample(self, key, data_params, arrays):
      raise NotImplementedError("a planned corpus is host-fed")

    def host_batches(self, keys, first_step, n_steps):
      return np.zeros((len(keys), n_steps, self.batch_size, self.context_size + 1), dtype)

  return PlannedText(mcfg.vocab_size, tr.batch_size, tr.context_size)


def update_cost(choice, cfg, mesh_shape: tuple, platform: str = "cpu") -> tuple[float, float]:
  """FLOPs and bytes accessed per device for one update of the group, from the compiled train
  program's ``cost_analysis``. XLA counts a loop's body once, so its numbers are one microbatch
  of one vmap chunk with one vocabulary tile of the loss: they are scaled by k × chunks, and the
  other tiles' FLOPs (8 · t · D per token: forward, recomputed forward, two gradients) are added,
  and with cuDNN's attention the FLOPs of its custom calls (``fused_attention_flops``). Bytes of
  the other tiles are not (a lower bound where the loss is tiled). ``platform``: that of the
  devices compiled for (the tile rule, ``losses.logits_budget``)."""
  from ihsweep.compute import losses

  s = choice.setting
  n_ens, n_data = mesh_shape
  local = int(cfg.ensemble.size) // n_ens
  k, chunks = s.gradient_accumulation_steps, local // s.vmap_chunk
  b, c = int(cfg.train.batch_size), int(cfg.train.context_size)
  v, d = int(cfg.model.vocab_size), int(cfg.model.d_model)
  tokens = b // k * c  # per microbatch per model
  tile = losses.auto_vocab_tile(v, tokens, losses.logits_budget(platform))
  n_tiles = -(-v // tile)
  missing = 8.0 * (n_tiles - 1) * tile * d * (tokens / n_data) * s.vmap_chunk if tile < v else 0.0
  scale = k * chunks
  if cfg.train.get("attention", "explicit") == "cudnn":
    layers, c = int(cfg.model.n_layers), int(cfg.train.context_size)
    missing += fused_attention_flops(layers, d, c, tokens / n_data) * s.vmap_chunk
  return (choice.train.flops + missing) * scale, choice.train.bytes_accessed * scale


ROOFLINE_TERMS = {
  "flops_s": "FLOPs / peak",
  "bytes_s": "bytes accessed / HBM bandwidth",
  "state_bytes_s": "2 x train state / HBM bandwidth",
  "launch_s": "kernels x launch latency",
}


def update_time_terms(train, flops: float, n_bytes: float, target) -> dict:
  """The terms of one update's time on a device of ``target`` whose maximum is the plan's
  roofline (seconds), two lower bounds and an estimate: ``flops_s`` = FLOPs / peak; the memory
  term, ``bytes_s`` = bytes
  accessed / HBM bandwidth where the compiled program counted them, else ``state_bytes_s`` =
  twice the donated train state (``train.alias_bytes``: AdamW reads and writes every parameter
  and moment once per update at least) / HBM bandwidth — the lowered program's bytes count
  every unfused op and would over-state it; and for XLA:GPU programs ``launch_s`` = kernels per
  update (``planning.kernels``) × ``kernels.LAUNCH_S`` (an estimate: XLA's CUDA-graph command
  buffers can launch for less). ``train``: the train program's
  ``memory.ProgramMemory``."""

  terms = {"flops_s": flops / target.peak_flops}
  if train.cost_from != "lowered HLO":
    terms["bytes_s"] = n_bytes / target.hbm_bytes_per_s
  else:
    terms["state_bytes_s"] = 2.0 * train.alias_bytes / target.hbm_bytes_per_s
  if train.kernels_per_update:
    terms["launch_s"] = train.kernels_per_update * kernels.LAUNCH_S
  return terms


def fused_attention_flops(n_layers: int, d_model: int, context: int, tokens: float) -> float:
  """Training FLOPs of one model's attention scores and weighted values (QKᵀ, AV) over
  ``tokens`` tokens in sequences of C = ``context``, which cuDNN's flash attention computes
  inside a custom call that XLA's cost analysis counts as none: PaLM's 12 · n_layers · d_model ·
  C per token (Chowdhery et al. 2022,
  appendix B; forward + backward over the full C × C matrix), halved, because cuDNN skips the
  tiles the causal mask removes; its backward's recomputed scores are not counted (a lower
  bound, as the roofline is)."""
  return 0.5 * 12.0 * n_layers * d_model * context * tokens


def candidate_layouts(target: Target) -> list[int]:
  """Devices per worker, smallest first: those ``ihsweep plan`` tries on N devices of H per
  host (``list_schedule.candidate_layouts``: divisors of N up to H), then teams of 2, … hosts."""

  host, n = target.devices_per_host, len(target.devices)
  teams = [p * host for p in numbers.divisors(n // host) if p > 1]
  return list_schedule.candidate_layouts(n, host) + teams


def _layout_sizes(jobs, target: Target, d: int) -> dict | None:
  """Each group's devices on workers of ``d`` (``list_schedule.usable_device_count``), or None when
  ``d`` spans hosts and a group cannot use all of them (``phases.fills``)."""

  if d > target.devices_per_host and not all(phases.fills(j, d) for j in jobs):
    return None
  return {j.id: list_schedule.usable_device_count(j.n_models, j.batch_size, d) for j in jobs}


def plan_for_target(
  cfg,
  target: Target,
  law=None,
  log=lambda line: None,
  *,
  compare_attention: bool = False,
  run_flags: list[str] | None = None,
) -> TargetPlan:
  """Every group compiled for ``target`` (module docstring) at the smallest devices per worker
  D at which every group fits (memory chosen per group, ``runner.resolve_memory``): each
  group's memory, FLOPs and roofline time there, and the list schedule of the groups on the
  target's devices (``list_schedule.simulate``, plan order, each on its worker's
  ``usable_device_count``). Progress goes to ``log``: a line as each group's compile starts and
  ends, with its pass, "group i of n" and the seconds since the plan began.

  ``compare_attention``: each group whose train step's attention is not the explicit ``[B·H, C,
  C]`` pattern is compiled once more with that pattern at the setting chosen, to report what
  its kernel saves. Off by default: it changes no decision of the plan (the setting, D and the
  layout are chosen with the kernel ``train.resolve_attention`` gives on the target, the rule
  ``ihsweep run`` applies there) and doubles its compiles. ``run_flags``: the ``ihsweep run``
  flags of the planned sweep (``placement.run_flags``) for the launch lines.

  Returns a ``target_plan.TargetPlan``: the groups compiled at D (``PlannedGroup``: memory,
  FLOPs, roofline and all-reduce time per update, ``seconds`` at D), the layouts refused before D
  and why, ``layouts`` (D and every wider layout: groups on more devices, times scaled by the
  device ratio) and the best of them (the shortest makespan among the launchable layouts, and
  where the chip's network has no published figure among those without all-reduces,
  ``unpriced`` saying so), with its launch lines (``launch.launch_lines``; None without
  ``run_flags``). Its JSON (``to_json``) is what ``ihsweep plan --target --json`` prints.
  """
  import time

  from ihsweep.compute import schedule
  from ihsweep.planning import kernels, placement, timing
  from ihsweep.training import memory

  t0 = time.perf_counter()
  fixed = int(cfg.mesh.num_devices)
  if fixed and fixed not in candidate_layouts(target):
    raise TargetError(
      f"config.mesh.num_devices = {fixed} is not allowed with --target={target.name} on "
      f"{len(target.devices)} device(s): 0 (the plan chooses the devices per worker) or one of "
      f"{', '.join(map(str, candidate_layouts(target)))}"
    )
  _, jobs = placement.make_jobs(cfg, law, check_data=False)
  for j in jobs:  # too large on every device of the target at any setting: refused uncompiled
    widest = list_schedule.usable_device_count(j.n_models, j.batch_size, len(target.devices))
    memory.check_possible(
      j.cfg, target.devices[:widest], f"group {j.id}", target.capacity_bytes, j.n_params
    )
  compile_group = _GroupCompiler(target, log, t0)
  refused = []
  layout = _first_fitting_layout(jobs, target, compile_group, refused, fixed)
  if layout is None:
    return TargetPlan(target.to_json(), tuple(refused))
  d, sizes = layout
  fused = [j for j in jobs if compile_group(j, sizes[j.id])[0].train.attention != "explicit"]
  if compare_attention and fused:
    compile_group.passes += 1
    for i, j in enumerate(fused):
      where = (
        f"pass {compile_group.passes} (--compare_attention: the explicit pattern), group "
        f"{i + 1} of {len(fused)}"
      )
      compile_group.explicit_bytes(j, sizes[j.id], where)
  comm_model = timing.FlopsModel(target.peak_flops, target.network, target.devices_per_host)
  groups = [_group_row(j, sizes[j.id], compile_group, target, comm_model) for j in jobs]
  model = _compiled_model(jobs, groups, compile_group, target)
  layouts, best, unpriced, phased, reason = decide(cfg, jobs, target, model, d, fixed)
  chose_phases = phased is not None and not phased.beaten_by(best)
  launch = None
  if run_flags is not None:
    launch = _launch(run_flags, cfg, best, target, phased if chose_phases else None)
  return TargetPlan(
    target=target.to_json(),
    refused=tuple(refused),
    groups=tuple(groups),
    compiled_devices_per_worker=d,
    layouts=tuple(layouts),
    best=best,
    unpriced=unpriced,
    phases=tuple(ph.to_json() for ph in phased.phases) if phased else (),
    phases_reason=reason,
    phases_makespan_s=phased.makespan_s if phased else None,
    chosen="phases" if chose_phases else "layout",
    time_model=model.describe(),
    launch=launch,
    checkpoints=schedule.checkpoint_totals([g.checkpoints for g in groups]),
    headroom=memory.HEADROOM,
    roofline="per update and device the largest of two lower bounds, FLOPs / peak and the "
    "bytes accessed / HBM bandwidth (where the compiled program counts them, else twice the "
    "train state), and for GPUs an estimate, kernels per update x "
    f"{kernels.LAUNCH_S * 1e6:.0f} us per launch (update_time_terms), + the gradient "
    "all-reduce over a data axis on the chip's network ("
    + (target.network.describe() if target.network else "no published figure: not priced")
    + "); evaluation, checkpoints and start-up not counted",
  )


def decide(cfg, jobs, target: Target, model, d: int, fixed: int = 0) -> tuple:
  """``(layouts, best, unpriced, phased, reason)``: the plan's layouts from D = ``d`` up
  (``_wider_layouts``), the best of them (``best_layout``), and the phases ``ihsweep run``
  lays the sweep out in on the target (``_run_phases``; None where the config fixes
  mesh.num_devices, ``fixed``, or the network is unpriced), all priced by ``model``. The
  plan's choice is the phases unless ``best`` beats them by more than ``phases.PHASE_TIE``
  (``PhasedSchedule.beaten_by``), as ``ihsweep plan --flops_per_s`` decides
  (``placement.best_layout``)."""
  layouts = _wider_layouts(jobs, target, d, model, fixed)
  best, unpriced = best_layout(layouts, target)
  phased = reason = None
  if not fixed and unpriced is None:
    phased, reason = _run_phases(cfg, jobs, model, target)
  return layouts, best, unpriced, phased, reason


def best_layout(layouts: list[Layout], target: Target) -> tuple[Layout, str | None]:
  """``(the plan's layout, None or why its choice is unpriced)``: of ``_wider_layouts``' layouts
  the launchable ones (``not_launchable`` None): of those within ``list_schedule.LAYOUT_TIE``
  (1%) of the shortest makespan, the fewest devices per worker (``list_schedule.choose_layout``'s
  rule, which ``ihsweep plan --flops_per_s`` applies). Where the chip's network has no published
  figure the all-reduces are not priced, so only layouts without any (``data_axis_groups`` 0:
  every group's models whole on their devices) compete; where none is, the choice is the same
  and ``unpriced`` says it ignored their all-reduces."""
  pool = [lay for lay in layouts if lay.not_launchable is None] or layouts
  unpriced = None
  if target.network is None:
    nil = [lay for lay in pool if lay.data_axis_groups == 0]
    unpriced = (
      f"{target.chip.name}: no published interconnect figure, so gradient all-reduces are not "
      f"priced; "
      + (
        "the plan's layout is the best of those without any"
        if nil
        else "every layout all-reduces some group's gradient: the choice ignores that time"
      )
    )
    pool = nil or pool
  fastest = min(lay.makespan_s for lay in pool)
  best = min(
    (lay for lay in pool if lay.makespan_s <= fastest * (1 + list_schedule.LAYOUT_TIE)),
    key=lambda lay: lay.devices_per_worker,
  )
  return best, unpriced


def _compiled_model(jobs, groups, compile_group, target: Target):
  """The time model every layout of the plan is priced with, and that later plans and runs on
  the chip read back (``compiled_times``): each group's roofline seconds per update where it
  was compiled (and where it did not fit, which m) kept under the chip's name, then a
  ``timing.FlopsModel`` of the target's network bound to those times
  (``FlopsModel.compiled_for``: what ``plan --flops_per_s --network`` and ``ihsweep run``'s
  auto layout then compute). Where the cache cannot be written, this plan's own times."""
  import datetime

  from ihsweep.planning import compiled_times, timing

  base = timing.FlopsModel(target.peak_flops, target.network, target.devices_per_host)
  if target.network is None:
    return base
  store = compiled_times.CompiledTimes(target.network.name)
  source = f"ihsweep plan --target={target.name} on {datetime.date.today().isoformat()}"
  own = {}
  for j, row in zip(jobs, groups):
    times = {m: None for (_, m), (_, _, why) in _fits_tried(compile_group, j) if why}
    times[row.devices] = row.roofline_update_s
    own[j.id] = compiled_times.GroupTimes(times, "this plan")
    store.write(j, times, source)
  model = base.compiled_for(jobs, store)
  if model.compiled is None:  # not kept (a read-only cache): this plan's times alone
    model = timing.FlopsModel(
      target.peak_flops, target.network, target.devices_per_host, own, "this plan's own", jobs
    )
  return model


def _fits_tried(compile_group, job):
  """``((group id, m), (cfg, choice, why))`` of every compile of ``job``'s group this plan made."""
  return [
    (key, found) for key, found in compile_group.memo.items() if len(key) == 2 and key[0] == job.id
  ]


def _run_phases(cfg, jobs, model, target: Target):
  """``(phases.PhasedSchedule, reason)``: the phases ``ihsweep run`` lays the sweep out in on
  the target's P hosts of H devices (``placement._default_phases``: its auto layout with the
  config's sweep.processes_per_worker and sweep.devices_per_worker), priced with ``model``."""
  from ihsweep.planning import placement
  from ihsweep.planning.phases import PhasedSchedule

  host, n = target.devices_per_host, len(target.devices)
  sweep = cfg.get("sweep", {})
  # a flops_per_s (any) makes it choose with ``model`` itself, as run does with its own model
  steps, reason = placement._default_phases(jobs, model, sweep, n // host, host, 1.0)
  return PhasedSchedule(n, steps), reason


def _launch(run_flags, cfg, best: Layout, target: Target, phased) -> Launch:
  """The lines that start the plan's choice, in the form ``ihsweep plan --flops_per_s`` prints
  for the same layout: ``ihsweep run``'s own layout (``launch.default_launch_lines``) where the
  plan chose the phases it computes, else the one-phase layout's (``launch.launch_lines``)."""
  from ihsweep.planning.launch import default_launch_lines, launch_lines
  from ihsweep.planning.prediction import local_workers

  host, platform = target.devices_per_host, target.chip.platform
  if phased is None:
    return Launch(*launch_lines(run_flags, best.n_workers, best.devices_per_worker, host, platform))
  pinned = int(cfg.get("sweep", {}).get("devices_per_worker", 0) or 0)
  flags = run_flags + ([f"--config.sweep.devices_per_worker={pinned}"] if pinned else [])
  lines, note = default_launch_lines(flags, len(target.devices) // host, host, platform)
  local = next((x for x in phased.phases if x.processes_per_worker == 1), None)
  what = f" ({local_workers(host, local.devices_per_worker)})" if local else ""
  how = "layout of the config's sweep.devices_per_worker" if pinned else "auto layout"
  return Launch(lines, f"`ihsweep run`'s {how}{what}; {note}")


class _GroupCompiler:
  """``(compiled config, memory.Choice, why it does not fit or None)`` of a job on its first m
  devices of the target (``runner.resolve_memory``, bf16 compute where the dtype is 'auto'),
  compiled once per (job, m), with a progress line to ``log`` as each compile starts and ends
  (its pass, "group i of n" and the seconds since the plan began)."""

  def __init__(self, target: Target, log, t0: float):
    self.target, self.log, self.memo = target, log, {}
    self.facts = target.compiled_facts()
    self.t0, self.passes = t0, 0  # the plan's start (time.perf_counter); passes begun

  def _progress(self, where: str, text: str) -> float:
    """Logs ``[seconds since the plan began] where: text``; returns time.perf_counter()."""
    import time

    now = time.perf_counter()
    self.log(f"[{now - self.t0:6.0f} s] {where}: {text}")
    return now

  def _reused(self, hits_before: int, own_before: int) -> str:
    """How many of the programs just asked for were read back, and whose they were: an
    earlier plan's, or this plan's own (the same program met again, e.g. two groups alike)."""
    own = self.facts.own_hits - own_before
    earlier = self.facts.hits - hits_before - own
    where = self.facts.directory
    parts = []
    if earlier:
      parts.append(f"{earlier} program(s) read back from {where}, compiled by an earlier plan")
    if own:
      parts.append(f"{own} program(s) compiled earlier in this plan, read back")
    return "".join(f"; {x}" for x in parts)

  def __call__(self, job, m: int, where: str = "") -> tuple:
    import time

    from ihsweep.training import memory, runner

    target, memo = self.target, self.memo
    if (job.id, m) not in memo:
      hits, own = self.facts.hits, self.facts.own_hits
      start = self._progress(
        where,
        f"group {job.id} (E = {job.n_models}, B = {job.batch_size}, C = {job.context_size}): "
        f"compiling for {target.name} on {m} device(s) ...",
      )
      cfg = copy.deepcopy(job.cfg)
      if cfg.model.dtype == "auto":  # as on the target: bf16 compute (ModelConfig.dtype)
        with cfg.unlocked():
          cfg.model.dtype = "bfloat16"
      try:
        out, choice = runner.resolve_memory(
          cfg,
          target.devices[:m],
          f"group {job.id}",
          target.capacity_bytes,
          planned_source(job.cfg),
          target.chip.platform,
          count_kernels=_kernels_per_update if target.devices[0].platform == "gpu" else None,
          facts=self.facts,
        )
        memo[(job.id, m)] = (out, choice, None)
      except memory.DoesNotFit as e:
        memo[(job.id, m)] = (cfg, e.choice, str(e))
      c = memo[(job.id, m)][1]
      self._progress(
        where,
        f"group {job.id} done in {time.perf_counter() - start:.0f} s: {c.setting.describe()}, "
        f"{memory.gib(c.per_device_bytes)} per device ({len(c.tried)} setting(s) "
        f"{'tried' if self.facts.hits > hits else 'compiled'}{self._reused(hits, own)})",
      )
    return memo[(job.id, m)]

  def explicit_bytes(self, job, m: int, where: str = "") -> int:
    """Bytes per device of the job's programs on m devices at the setting chosen there, with
    the explicit attention pattern instead of the chosen kernel (compiled once more)."""
    import time

    from ihsweep.training import memory, runner

    if ("explicit", job.id, m) not in self.memo:
      out, choice, _ = self(job, m)
      s = choice.setting
      cfg = copy.deepcopy(out)
      with cfg.unlocked():
        cfg.train.attention = "explicit"
        cfg.train.gradient_accumulation_steps = s.gradient_accumulation_steps
        cfg.train.remat = s.remat
        cfg.ensemble.vmap_chunk = s.vmap_chunk
      hits, own = self.facts.hits, self.facts.own_hits
      start = self._progress(
        where,
        f"group {job.id}: compiling with the explicit attention pattern (what "
        f"{out.train.attention} saves) ...",
      )
      try:
        _, found = runner.resolve_memory(
          cfg,
          self.target.devices[:m],
          f"group {job.id}",
          self.target.capacity_bytes,
          planned_source(job.cfg),
          self.target.chip.platform,
          facts=self.facts,
        )
      except memory.DoesNotFit as e:
        found = e.choice
      self.memo[("explicit", job.id, m)] = found.per_device_bytes
      self._progress(
        where,
        f"group {job.id} done in {time.perf_counter() - start:.0f} s: "
        f"{memory.gib(found.per_device_bytes)} per device{self._reused(hits, own)}",
      )
    return self.memo[("explicit", job.id, m)]


def _first_fitting_layout(jobs, target: Target, compile_group, refused: list, fixed: int = 0):
  """``(D, {group id: devices})``: the first of ``candidate_layouts`` (only ``fixed``, the
  config's mesh.num_devices, if set) at which every group fits, or None; the layouts refused
  before it are appended to ``refused`` with why."""
  for d in [fixed] if fixed else candidate_layouts(target):
    sizes = _layout_sizes(jobs, target, d)
    if sizes is None:
      refused.append(RefusedLayout(d, "a group cannot use every device of a worker spanning hosts"))
      continue
    bad = None
    compile_group.passes += 1
    for i, j in enumerate(jobs):
      where = (
        f"pass {compile_group.passes} (memory on workers of {d} device(s)), group {i + 1} of "
        f"{len(jobs)}"
      )
      _, _, why = compile_group(j, sizes[j.id], where)
      if why:
        bad = why
        break
    if bad is None:
      return d, sizes
    refused.append(RefusedLayout(d, bad))
  return None


def _group_row(j, m: int, compile_group, target: Target, comm_model) -> PlannedGroup:
  """One group of ``plan_for_target``'s ``groups``: compiled on m devices, its memory, FLOPs,
  roofline and all-reduce time per update, and its updates' time."""
  from ihsweep.base import sharding
  from ihsweep.compute import schedule

  out, choice, _ = compile_group(j, m)
  mesh = sharding.mesh_shape(j.n_models, j.batch_size, m)
  flops, n_bytes = update_cost(choice, out, mesh, target.devices[0].platform)
  terms = update_time_terms(choice.train, flops, n_bytes, target)
  roofline = max(terms.values())
  all_reduce = comm_model.all_reduce_s(j, m)
  per_update = roofline + all_reduce
  s = choice.setting
  attention = AttentionBytes(out.train.get("attention", "explicit"))
  if attention.compiled == "explicit":
    attention = dataclasses.replace(attention, saved_bytes=0)
  elif ("explicit", j.id, m) in compile_group.memo:  # compiled by --compare_attention
    explicit = compile_group.explicit_bytes(j, m)
    attention = dataclasses.replace(
      attention, explicit_bytes=explicit, saved_bytes=explicit - choice.per_device_bytes
    )
  return PlannedGroup(
    id=j.id,
    batch_size=j.batch_size,
    context_size=j.context_size,
    n_models=j.n_models,
    n_params=j.n_params,
    devices=m,
    mesh=tuple(mesh),
    gradient_accumulation_steps=s.gradient_accumulation_steps,
    vmap_chunk=s.vmap_chunk,
    remat=s.remat,
    attention=attention,
    memory_from=target.estimate,
    cost_from=choice.train.cost_from,
    memory=GroupMemory(
      per_device_bytes=choice.per_device_bytes,
      argument_bytes=choice.train.argument_bytes,
      temp_bytes=choice.train.temp_bytes,
      capacity_bytes=target.capacity_bytes,
      fits=choice.fits,
    ),
    compiled_settings=len(choice.tried),
    compile_s=sum(t for _, _, t in choice.tried),
    tried=choice.to_json()["tried"],
    flops_per_update=flops,
    analytic_flops_per_update=j.flops_per_update / m,
    bytes_per_update=n_bytes,
    kernels_per_update=choice.train.kernels_per_update,
    roofline_terms=terms,
    roofline_from="max(" + ", ".join(ROOFLINE_TERMS[t] for t in terms) + ")",
    roofline_update_s=roofline,
    all_reduce_s=all_reduce,
    update_s=per_update,
    updates=j.updates,
    roofline_s=roofline * j.updates,
    seconds=per_update * j.updates,
    checkpoints=schedule.checkpoint_bytes(j.cfg, j.n_params, j.updates, per_update * j.updates),
  )


def _wider_layouts(jobs, target: Target, d: int, model, fixed: int = 0) -> list[Layout]:
  """D and every wider layout (D alone when ``fixed``, the config's mesh.num_devices), each
  list-scheduled (``list_schedule.simulate``) with ``model``'s seconds (``_compiled_model``),
  with the groups whose mesh has a data axis there (``data_axis_groups``), the all-reduces'
  share of the groups' device-time (``comm_share``) and, on a TPU, workers narrower than a
  host ``not_launchable`` (launch/tpu_pod.sh runs one process per host, a worker over all its
  devices)."""
  from ihsweep.base import sharding

  # Wider workers: each group on m' = usable_device_count(E, B, D') ≥ m devices, its compute time
  # scaled from its compiled one as m / m' (its batch split further: the model's rule), plus its
  # all-reduces on m' devices, and its memory per device no larger than at m (compiled there).
  n = len(target.devices)
  layouts = []
  for wide in [w for w in candidate_layouts(target) if w >= d and (not fixed or w == d)]:
    m_wide = _layout_sizes(jobs, target, wide)
    if m_wide is None:
      continue
    times = {j.id: model.seconds(j, m_wide[j.id]) for j in jobs}
    rows = [(j.id, m_wide[j.id], times[j.id].total_s) for j in jobs]
    held = sum(mw * t for _, mw, t in rows)
    comm = sum(m_wide[i] * t.comm_s for i, t in times.items())
    sched = list_schedule.simulate(rows, n, wide)
    host = target.devices_per_host
    layouts.append(
      Layout(
        devices_per_worker=wide,
        n_workers=n // wide,
        makespan_s=sched.makespan_s,
        utilisation=sched.utilisation,
        data_axis_groups=sum(
          sharding.mesh_shape(j.n_models, j.batch_size, m_wide[j.id])[1] > 1 for j in jobs
        ),
        comm_share=comm / held if held else 0.0,
        not_launchable=(
          f"a TPU host runs one process, whose workers take slices of its {host} devices "
          f"or whole hosts"
          if target.chip.platform == "tpu" and wide % host and host % wide
          else None
        ),
        schedule=tuple(sched.slots),
      )
    )
  return layouts


def _kernels_per_update(hlo_text: str) -> int:
  """The kernels an XLA:GPU program launches per update (``kernels.per_update``)."""
  return kernels.per_update(hlo_text)["kernels"]
