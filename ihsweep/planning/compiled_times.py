"""Per-update times of a group's compiled programs on a chip, kept on disk by ``ihsweep plan
--target`` so that every later decision about layouts prices the groups alike: the FLOPs plan
(``plan --flops_per_s=F --network=CHIP``), the compiled plan itself and ``ihsweep run``'s auto
layout on that chip (``timing.runtime_model``) all read the same seconds per update
(``timing.FlopsModel`` with ``compiled``).

Why: FLOPs alone cannot see a group bound by memory traffic. On a v5e core exp1's B 8 × C 64
group takes 15.3 ms per update by its compiled program's bytes (the roofline,
``targets.update_time_terms``), 3.7× its FLOPs time at 40% of peak, so a FLOPs plan packed it
on small workers and chose a layout that the compiled plan timed at 1.7× longer.

An entry is one group on one chip: the roofline seconds per update of its train program on m
devices (the compute and memory part; the gradient all-reduce over a data axis is priced by
the model on the chip's network, as the compiled plan prices it), for every m a plan compiled
it on, or None where it did not fit there. One JSON file per (chip, group) under
``$IHSWEEP_COMPILED_TIMES/CHIP`` (default ``$IHSWEEP_CACHE/compiled/times/CHIP``:
``default_dir``), CHIP the chip's ``chips.NETWORKS`` name (h100, h200, a100, l40s, v4, v5e,
v5p, v6e). A group is named by what its update's program depends on (``group_key``): the
model, B, C, E, the attention kernel, the memory setting fields and the data source, not its
seeds, learning rate or number of updates, so a plan of the same corners with other seeds or
budgets reads the same entries. The versions of the compilers that made an entry are written in
it, not keyed on: a newer compiler's time is still the best estimate there is until the plan is
run again. The directory may be deleted at any time; the plans then fall back to FLOPs and say so.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os

from ihsweep.base.atomic import atomic_write_json
from ihsweep.data.cache import default_cache_dir

log = logging.getLogger("ihsweep")

FORMAT = 1  # bumped whenever what an entry holds, or how it is keyed, changes
# The fields of a group's config its update's program depends on (besides E = job.n_models).
KEY_FIELDS = {
  "model": None,  # every field
  "train": (
    "batch_size",
    "context_size",
    "attention",
    "remat",
    "gradient_accumulation_steps",
  ),
  "ensemble": ("size", "vmap_chunk"),
  "data": ("source",),
}


def default_dir() -> str:
  """``$IHSWEEP_COMPILED_TIMES``, else ``$IHSWEEP_CACHE/compiled/times``
  (``~/.cache/ihsweep/compiled/times`` without either)."""
  from ihsweep.base import environment

  return environment.get("IHSWEEP_COMPILED_TIMES") or os.path.join(
    default_cache_dir(), "compiled", "times"
  )


def group_key(job) -> str:
  """The name of ``job``'s entry: a sha256 (hex) of ``KEY_FIELDS`` of its config and E."""
  cfg = job.cfg
  picked: dict = {"n_models": int(job.n_models)}
  for section, names in KEY_FIELDS.items():
    part = cfg.get(section, {})
    items = part.to_dict() if names is None else {n: part.get(n) for n in names}
    picked[section] = {k: items[k] for k in sorted(items)}
  text = json.dumps(picked, sort_keys=True, default=str)
  return hashlib.sha256(f"{FORMAT}\n{text}".encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class GroupTimes:
  """One group's entry: ``update_s`` {m devices: roofline seconds per update, or None where its
  programs do not fit m devices}; ``source``: which plan wrote it, in words."""

  update_s: dict
  source: str = ""

  def fitting(self) -> dict:
    return {m: s for m, s in self.update_s.items() if s is not None}

  def seconds_per_update(self, m: int) -> float:
    """Seconds per update on m devices: the entry at m, else scaled from the nearest m0
    compiled (the widest below m, else the narrowest above) as m0 / m — the compiled plan's
    rule for wider workers (``targets._wider_layouts``: the batch split further).

    Raises:
      KeyError: no m at which the group fits.
    """
    fits = self.fitting()
    if not fits:
      raise KeyError("no fitting entry")
    if m in fits:
      return fits[m]
    below = [k for k in fits if k < m]
    m0 = max(below) if below else min(fits)
    return fits[m0] * m0 / m

  def does_not_fit(self, m: int) -> bool:
    """Whether the group is known not to fit m devices: compiled there, or on more devices
    (each device holds more on fewer), and found too large."""
    return any(s is None and k >= m for k, s in self.update_s.items())


@dataclasses.dataclass
class CompiledTimes:
  """The entries of one chip (``chip``: its ``chips.NETWORKS`` name) in ``directory`` (default
  ``default_dir()``; None: nothing on disk, as for a model built in memory)."""

  chip: str
  directory: str | None = dataclasses.field(default_factory=default_dir)

  def _path(self, job) -> str | None:
    if self.directory is None:
      return None
    return os.path.join(self.directory, self.chip, f"{group_key(job)}.json")

  def read(self, job) -> GroupTimes | None:
    """``job``'s entry, or None (none, or a damaged file: logged at debug, as a missing one)."""
    path = self._path(job)
    if path is None:
      return None
    try:
      with open(path) as f:
        d = json.load(f)
      if d.get("format") != FORMAT:
        return None
      times = {int(m): (None if s is None else float(s)) for m, s in d["update_s"].items()}
      return GroupTimes(times, str(d.get("source", "")))
    except FileNotFoundError:
      return None
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
      log.debug("compiled times: ignoring %s (%s)", path, e)
      return None

  def write(self, job, update_s: dict, source: str) -> None:
    """Merges ``update_s`` ({m: seconds per update, or None: does not fit}) into ``job``'s
    entry (what this plan compiled replaces what an earlier one found at the same m). A
    read-only cache only costs the later plans these times: logged at debug."""
    path = self._path(job)
    if path is None:
      return
    old = self.read(job)
    merged = {**(old.update_s if old else {}), **{int(m): s for m, s in update_s.items()}}
    from ihsweep.training.compiled_facts import _versions

    body = {
      "format": FORMAT,
      "chip": self.chip,
      "group": {
        "n_models": int(job.n_models),
        "batch_size": int(job.batch_size),
        "context_size": int(job.context_size),
        "n_params": int(job.n_params),
      },
      "update_s": {str(m): merged[m] for m in sorted(merged)},
      "source": source,
      "versions": _versions(),
    }
    try:
      os.makedirs(os.path.dirname(path), exist_ok=True)
      atomic_write_json(path, body)
    except OSError as e:
      log.debug("compiled times: not kept in %s (%s)", path, e)

  def for_jobs(self, jobs) -> tuple[dict | None, str]:
    """``({group id: GroupTimes}, words)`` where every one of ``jobs`` has an entry that fits
    somewhere, else ``(None, why not)``: a plan prices all its groups one way, never some by
    compiled times and the rest by FLOPs."""
    found, missing = {}, []
    for job in jobs:
      times = self.read(job)
      if times is None or not times.fitting():
        missing.append(job.id)
      else:
        found[job.id] = times
    if not jobs:
      return None, "no groups"
    if missing:
      some = ", ".join(missing[:4]) + (", …" if len(missing) > 4 else "")
      what = "none" if len(missing) == len(jobs) else f"{len(jobs) - len(missing)}"
      return None, (
        f"compiled times for {self.chip} exist for {what} of the {len(jobs)} groups "
        f"(missing: {some})"
      )
    return found, f"compiled times for {self.chip} from {self.directory}"
