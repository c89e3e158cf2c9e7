"""The report's limitations paragraph (``limitations_paragraph``): censored cells, emerged
models whose jump lies at the end of their curve, seeds per grid point, the spacing of the
checkpoints, the probe length, a single model size, too few degrees of freedom
(``analysis.summary``'s module docstring)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .prose import config_field, interval_of, number, number_span, seeds_per_point, sentence

# What the measured calibration of the law's verdicts (benchmarks/calibration.py) leaves out.
CALIBRATION_CAVEAT = (
  "The law's verdicts (the lack-of-fit tests' 1% level, the intervals' 95% coverage, the "
  "censored check's 1% false alarms) were calibrated by simulation on log-normal scatter about "
  "a power law with a deviation per grid point shared by its seeds, 1–3 seeds, 3 × 3 to 6 × 6 "
  "grids and censoring at one cap (docs/benchmarks.md); not covered: heavier tails than "
  "log-normal, seed effects shared across grid points, unequal seeds per point, and caps that "
  "differ between points (the lack-of-fit test averages a point's seeds, which assumes equal "
  "counts)."
)


def limitations_paragraph(
  points: pd.DataFrame, law: dict | None, cfg, keys, sensitivity: dict | None = None
) -> str:
  items = []
  cens = points["censored"].astype(bool)
  n_c = int(cens.sum())
  if n_c:
    items.append(_censored_words(points, cens, law))
  caution = _caution_words(points, law, sensitivity, any_censored=bool(n_c))
  if not n_c:
    items.append("No model was censored" + (f", but {caution}" if caution else "."))
  elif caution:
    items.append(sentence(caution))
  items.append(_seed_words(points, cens, law, keys))
  items.append(_resolution_words(points))
  probe = _probe_words(points, cfg)
  if probe:
    items.append(probe)
  if "n_params" in points and points["n_params"].nunique() == 1:
    items.append(
      "One model size, so the study's finding that the emergence point does not "
      "depend on model size is not tested."
    )
  if law is not None:
    dof = law.get("dof")
    if dof is not None and dof < 3:
      items.append(
        f"The law has {dof} residual degree(s) of freedom: it passes (nearly) "
        f"through its points and describes these models only."
      )
    items.append(CALIBRATION_CAVEAT)
    items.append(
      f"The fitted law describes B {points['batch_size'].min():g}–"
      f"{points['batch_size'].max():g} and C {points['context_size'].min():g}–"
      f"{points['context_size'].max():g} on this data; outside that range it is an "
      f"extrapolation."
    )
  return "**Limitations.** " + " ".join(i for i in items if i)


def _censored_words(points: pd.DataFrame, cens, law: dict | None) -> str:
  """How many models are censored, at which grid points, and how the law treated them."""
  n_c = int(cens.sum())
  where = points[cens].groupby(["batch_size", "context_size"]).size()
  spots = ", ".join(
    f"B {b:g}/C {c:g}" + (f" ({m})" if m > 1 else "") for (b, c), m in where.items()
  )
  treated = ""
  if law is not None:
    method = str(law.get("method") or "")
    if "MLE" in method or "censored" in method:
      eo = law.get("emerged_only") or {}
      them = "it" if n_c == 1 else "them"
      treated = (
        f" The law counts {them} as censored; fitted to the emerged models alone it "
        f"would give α = {eo['alpha']:.2f}, β = {eo['beta']:.2f}."
        if "alpha" in eo
        else f" The law counts {them} as censored."
      )
    else:
      treated = (
        " The law leaves censored models out, which biases it towards early "
        "emergence where they cluster."
      )
  return (
    f"{n_c} of {len(points)} models had not emerged by their last checkpoint "
    f"(censored; {spots}): "
    + (
      "its emergence point is a lower bound."
      if n_c == 1
      else "their emergence points are lower bounds."
    )
    + treated
  )


def _seed_words(points: pd.DataFrame, cens, law: dict | None, keys) -> str:
  """Seeds per grid point, how far apart they emerged, and the models' scatter about the law."""
  lo, hi = seeds_per_point(points, keys)
  if hi <= 1:
    return (
      "One seed per grid point: seed-to-seed scatter is not measured, and each "
      "emergence point is one model's."
    )
  em = points[~cens]
  spread = (
    em.groupby(keys)["emergence_step"]
    .agg(lambda s: float(s.max() / s.min()) if len(s) > 1 else math.nan)
    .dropna()
  )
  seeds = f"{lo}" if lo == hi else f"{lo}–{hi}"
  text = f"{seeds} seeds per grid point"
  if len(spread):
    text += (
      f"; seeds of a grid point emerged up to {spread.max():.2f}× apart (median "
      f"{spread.median():.2f}×)"
    )
  if law is not None and law.get("sigma") is not None and np.isfinite(law["sigma"]):
    text += (
      f"; the scatter of models about the law is σ = {law['sigma']:.2f} in ln UPT (a "
      f"typical model within {math.exp(law['sigma']):.2f}× of it)"
    )
  return text + "."


def _model_name(row) -> str:
  """'B 8/C 64 seed 1' (the seed, else the cell id, where the table has one)."""
  name = f"B {float(row['batch_size']):g}/C {float(row['context_size']):g}"
  for col in ("seed", "cell"):
    if col in row and pd.notna(row[col]):
      v = row[col]
      v = int(v) if isinstance(v, (float, np.floating)) and float(v).is_integer() else v
      return f"{name} {col} {v}"
  return name


def _estimate(law: dict, name: str, fmt) -> str:
  """'0.62 [0.50, 0.70]': a coefficient with its 95% interval where the law has one."""
  ci = interval_of(law, name)
  return fmt(law[name]) + (f" [{fmt(ci[0])}, {fmt(ci[1])}]" if ci else "")


def _caution_words(
  points: pd.DataFrame, law: dict | None, sensitivity: dict | None, any_censored: bool
) -> str:
  """The emerged models whose point lies at the end of their curve (``analysis.emergence
  .caution``: the last checkpoint interval, or a late plateau on fewer than 3 checkpoints) and
  how the law moves with them censored at their last checkpoint (``sensitivity``: that refit's
  ``LawFit.to_dict()``, or ``{"error": why not}``); '' when none is flagged. A clause: it follows
  'No model was censored, but' or stands as a sentence after the censored models."""
  from . import emergence

  censored = points[points["censored"].astype(bool)]
  flagged = emergence.flagged(points)
  why = flagged["caution"] if "caution" in flagged else emergence.cautions(flagged)
  if flagged.empty:
    return ""
  k = len(flagged)
  listed = []
  for i, row in flagged.head(8).iterrows():
    where = ""
    if {"step_before", "step_after"} <= set(row.index) and pd.notna(row["step_after"]):
      where = (
        f": jumped between updates {number(row['step_before'])} and {number(row['step_after'])}"
      )
      if "last_step" in row and pd.notna(row["last_step"]):
        where += f", last checkpoint {number(row['last_step'])}"
    listed.append(f"{_model_name(row)} ({why[i]}{where})")
  if k > 8:
    listed.append(f"and {k - 8} more")
  one = k == 1
  text = (
    f"{'besides, ' if any_censored else ''}{k} of the {len(points) - len(censored)} "
    f"emerged models jumped so close to the end of training that a slightly shorter run would "
    f"have censored {'it' if one else 'them'} — {'its' if one else 'their'} late plateau "
    f"rests on the last checkpoints only, unconfirmed by later ones: " + "; ".join(listed) + "."
  )
  em = points[~points["censored"].astype(bool)]
  steps = em["emergence_step"].astype(float)
  slowest = steps.idxmax() if len(em) and (steps == steps.max()).sum() == 1 else None
  if law is not None and slowest in flagged.index:
    text += f" {_model_name(points.loc[slowest])} is the slowest emergence point in the fit."
  if law is None or sensitivity is None:
    return text
  them = "it" if one else "them"
  if sensitivity.get("error"):
    return text + f" With {them} censored the law cannot be fitted ({sensitivity['error']})."
  two = lambda v: f"{v:.2f}"  # noqa: E731
  changes = [
    f"{sym} {_estimate(law, name, two)} → {_estimate(sensitivity, name, two)}"
    for name, sym in (("alpha", "α"), ("beta", "β"))
    if name in law and name in sensitivity
  ]
  if "T" in law and "T" in sensitivity:
    changes.append(f"T {_estimate(law, 'T', number)} → {_estimate(sensitivity, 'T', number)}")
  return text + (
    f" The law counts {them} as emerged; with {them} censored at "
    f"{'its' if one else 'their'} last checkpoint (95% intervals in brackets): "
    + ", ".join(changes)
    + "."
  )


def _resolution_words(points: pd.DataFrame) -> str:
  """How finely the checkpoints around the emergence points resolve them (``step_before``,
  ``step_after``: the checkpoints bracketing each emerged model's point)."""
  em = points[~points["censored"].astype(bool)]
  if not {"step_before", "step_after"} <= set(em) or em.empty:
    return ""
  before, after = em["step_before"].astype(float), em["step_after"].astype(float)
  ok = (before > 0) & (after > before)
  if not ok.any():
    return ""
  gap, factor = (after - before)[ok], (after / before)[ok]
  return (
    f"Checkpoint resolution: the checkpoints around the emergence points lie "
    f"{number_span(gap.min(), gap.max())} updates apart (a factor {factor.median():.2f} "
    f"between neighbours, median; at most {factor.max():.2f}); each point is interpolated "
    f"between them, so differences between models much smaller than that spacing are not "
    f"resolved."
  )


def _probe_length(context_size: int, probe_len) -> int | None:
  """The probes' block length L at context size C, as ``ihsweep.data.probes.block_length``
  decides it (the study's min(50, C/2) unless ``eval.probe_len`` fixes it); None if refused."""
  try:
    from ihsweep.data.probes import block_length

    return int(block_length(int(context_size), probe_len))
  except Exception:  # an L the probes refuse (< 3), or a block_length of another signature
    if not probe_len:
      return min(50, int(context_size) // 2)
    return int(probe_len) if isinstance(probe_len, (int, np.integer)) and probe_len > 0 else None


def _probe_words(points: pd.DataFrame, cfg) -> str:
  """A probe block length that follows C (``eval.probe_len`` 0: L = min(50, C/2)) confounds the C
  effect with the probe's; one length at every C is said so."""
  probe_len = config_field(cfg, "eval.probe_len", None)
  cs = sorted(points["context_size"].astype(int).unique())
  if probe_len is None or len(cs) < 2:
    return ""
  lengths = [_probe_length(c, probe_len) for c in cs]
  if any(v is None for v in lengths):
    return ""
  if len(set(lengths)) == 1:
    where = {
      "end": "as the last 2L tokens of a full C-token input (eval.probe_position 'end')",
      "middle": "with the second block starting at position C/2 (eval.probe_position 'middle')",
    }.get(
      config_field(cfg, "eval.probe_position", "start"),
      f"at positions 0–{2 * lengths[0] - 1} of the input, however long C is",
    )
    return f"Probes of one block length L = {lengths[0]} at every C, {where}."
  return (
    f"The probes' block length follows C (L = {', '.join(map(str, lengths))} at C = "
    f"{', '.join(map(str, cs))}), so the measured effect of C includes the probe's."
  )


# ---------------------------------------------------------------- all together
