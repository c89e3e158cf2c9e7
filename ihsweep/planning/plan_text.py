"""The text ``ihsweep plan --target`` prints for a compiled plan (``targets.plan_for_target``'s
``target_plan.TargetPlan``): the target, each group's memory and update time, the layouts and
the launch lines."""

from __future__ import annotations

from ihsweep.planning.target_plan import PlannedGroup, TargetPlan


def _signed_gib(n_bytes: int) -> str:
  from ihsweep.training.memory import gib

  return ("-" if n_bytes < 0 else "") + gib(abs(n_bytes))


def _bound(group: PlannedGroup) -> str:
  """Which lower bound sets a group's roofline: flops, memory or launch."""
  terms = group.roofline_terms or {"flops_s": 1.0}
  top = max(terms, key=terms.get)
  return {"flops_s": "flops", "launch_s": "launch"}.get(top, "memory")


def format_plan(p: TargetPlan) -> str:
  """The text ``ihsweep plan --target`` prints."""
  from ihsweep.compute.schedule import describe_checkpoint_totals
  from ihsweep.planning.prediction import duration
  from ihsweep.training.memory import gib

  t = p.target
  lines = [
    f"target {t['name']}: {t['devices']} {t['chip']} device(s), {t['devices_per_host']} per host, "
    f"{gib(t['capacity_bytes'])} each (memory from the {t['memory_from']}); peak "
    f"{t['peak_flops_per_device'] / 1e12:.0f} TFLOP/s bf16 and "
    f"{t['hbm_bytes_per_s_per_device'] / 1e9:.0f} GB/s per device",
  ]
  for r in p.refused:
    lines.append(f"  {r.devices_per_worker} device(s) per worker refused: {r.why}")
  if not p.groups:
    lines.append("no layout fits every group")
    return "\n".join(lines)
  lines += _group_lines(p) + _attention_lines(p) + _layout_lines(p) + _phase_lines(p)
  if p.chosen == "phases":
    lines.append(
      f"roofline makespan {duration(p.phases_makespan_s)} in `ihsweep run`'s phases "
      f"({_phases_shape(p)}; {p.roofline})"
    )
  else:
    lines.append(
      f"roofline makespan {duration(p.best.makespan_s)}, utilisation {p.best.utilisation:.0%} "
      f"on {p.best.n_workers} worker(s) × {p.best.devices_per_worker} device(s) ({p.roofline})"
    )
  lines.append(_analytic_floor_line(p))
  lines.append(describe_checkpoint_totals(p.checkpoints) + " (roofline times)")
  lines.append("every group fits" if p.fits else "NOT every group fits")
  return "\n".join(lines + _launch_lines(p))


def _group_lines(p: TargetPlan) -> list[str]:
  """The table of groups: shape, mesh, memory setting, bytes, FLOPs and times per update."""
  from ihsweep.planning.prediction import duration
  from ihsweep.training.memory import gib

  lines = [
    f"compiled on workers of {p.compiled_devices_per_worker} device(s), the fewest at which "
    f"every group fits; per group (memory per device with {p.headroom:.0%} headroom):",
    "  group     B     C  E  dev  mesh   k  chunk remat  attention   memory/device       "
    "fits  TFLOP/upd  roofline/upd bound  all-reduce/upd      time",
  ]
  for g in p.groups:
    mem = g.memory
    lines.append(
      f"  {g.id:<6} {g.batch_size:>4} {g.context_size:>5} {g.n_models:>2} "
      f"{g.devices:>4}  {g.mesh[0]}x{g.mesh[1]:<3} {g.gradient_accumulation_steps:>3} "
      f"{g.vmap_chunk:>5} {g.remat:<6} {g.attention.compiled:<9}  "
      f"{gib(mem.per_device_bytes):>9} / "
      f"{gib(mem.capacity_bytes):<9} {'yes' if mem.fits else 'NO':<4} "
      f"{g.flops_per_update / 1e12:>9.3f}  {g.roofline_update_s * 1e3:>9.2f} ms "
      f"{_bound(g):<6} "
      f"{g.all_reduce_s * 1e3:>11.2f} ms  {duration(g.seconds):>8}"
    )
  return lines


def _attention_lines(p: TargetPlan) -> list[str]:
  """The fused attention's kernel and, where compared, the bytes it saves."""
  from ihsweep.training.memory import gib

  fused = [g for g in p.groups if g.attention.compiled != "explicit"]
  if not fused:
    return []
  if any(g.attention.explicit_bytes is None for g in fused):
    return [
      f"attention: {len(fused)} group(s) compiled with {fused[0].attention.compiled} "
      f"(--compare_attention compiles each once more with the explicit pattern, to show what "
      f"it saves)"
    ]
  saved = [g.attention.saved_bytes for g in fused]
  widest = max(fused, key=lambda g: (g.context_size, g.attention.saved_bytes))
  before, after = widest.attention.explicit_bytes, widest.memory.per_device_bytes
  return [
    f"attention: {len(fused)} group(s) compiled with {fused[0].attention.compiled}; "
    f"bytes per device saved against the explicit pattern at the same setting: "
    f"{_signed_gib(min(saved))} to {_signed_gib(max(saved))} (group {widest.id}, C = "
    f"{widest.context_size}: {gib(before)} -> {gib(after)})"
  ]


def _layout_lines(p: TargetPlan) -> list[str]:
  """Each layout's makespan and utilisation, the best marked; an unpriced network's note."""
  from ihsweep.planning.prediction import duration

  lines = [
    "layouts (wider workers: compute scaled by devices, all-reduces on the wider mesh, memory "
    "no larger):"
  ]
  for lay in p.layouts:
    mark = "  <- best" if lay.devices_per_worker == p.best.devices_per_worker else ""
    if lay.not_launchable:
      mark += f"  (not launchable: {lay.not_launchable})"
    comm = lay.comm_share or 0.0
    lines.append(
      f"  {lay.n_workers:>4} worker(s) × {lay.devices_per_worker:>3} device(s): roofline "
      f"makespan {duration(lay.makespan_s)}, utilisation {lay.utilisation:.0%}"
      + (f", all-reduces {comm:.0%} of the groups' device-time" if comm else "")
      + mark
    )
  if p.unpriced:
    lines.append(f"network: {p.unpriced}")
  return lines


def _phases_shape(p: TargetPlan) -> str:
  """'1 phase: 4 worker(s) × 2 device(s)' or '2 phases: …, then …'."""
  shape = ", then ".join(
    f"{ph['n_workers']} worker(s) × {ph['devices_per_worker']} device(s)" for ph in p.phases
  )
  return f"{len(p.phases)} phase(s): {shape}"


def _phase_lines(p: TargetPlan) -> list[str]:
  """How ``ihsweep run`` lays the sweep out on the target with these times, and whether that is
  the plan's choice (the same rule as ``ihsweep plan --flops_per_s``: ``placement.best_layout``)."""
  from ihsweep.planning.prediction import duration

  if not p.phases:
    return []
  verdict = (
    "the plan's choice"
    if p.chosen == "phases"
    else "slower than the best layout by more than 1%: the plan's choice is that layout"
  )
  return [
    f"`ihsweep run` on the target: {_phases_shape(p)}, roofline makespan "
    f"{duration(p.phases_makespan_s)}; {verdict}",
    f"  phases: {p.phases_reason}",
    f"  times (the same in `ihsweep plan --flops_per_s --network={p.target['network']['name']}` "
    f"and `ihsweep run`'s auto layout on this chip): {p.time_model}",
  ]


def _analytic_floor_line(p: TargetPlan) -> str:
  """How the FLOPs-only plan (``--flops_per_s``) compares: the F above which it would promise
  less time than this roofline."""
  peak = p.target["peak_flops_per_device"]
  analytic = sum(g.analytic_flops_per_update * g.devices * g.updates for g in p.groups)
  device_s = sum(g.roofline_s * g.devices for g in p.groups)
  f_max = analytic / device_s if device_s else 0.0
  return (
    f"`ihsweep plan --flops_per_s=F` prices PaLM's analytic FLOPs alone at F per device: "
    f"{analytic / peak / 3600:.2f} device-hours at this peak, divided by "
    f"the fraction of it you give; this roofline's {device_s / 3600:.2f} device-hours add what "
    f"the compiled programs say (their FLOPs, state bytes and kernel launches): an F above "
    f"{f_max:.3g} FLOP/s ({_share(f_max / peak)} of peak) would promise less "
    f"time than it (a floor where FLOPs or memory set it; launches are an estimate)"
  )


def _share(x: float) -> str:
  """A share as a percentage, with two significant digits below 10% (never a bare 0%)."""
  return f"{x:.0%}" if x >= 0.1 or x == 0 else f"{x * 100:.2g}%"


def _launch_lines(p: TargetPlan) -> list[str]:
  """The lines that start the recommended layout, or why it cannot be launched as planned."""
  launch = p.launch
  if launch is None:
    return []
  if launch.lines:
    what = (
      _phases_shape(p)
      if p.chosen == "phases"
      else f"{p.best.n_workers} worker(s) × {p.best.devices_per_worker} device(s)"
    )
    return [f"to run it ({what}; {launch.note}):"] + [f"  {line}" for line in launch.lines]
  if launch.note:
    return [f"not launchable as planned: {launch.note}"]
  return []
