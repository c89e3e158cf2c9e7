"""Calibration of the report's verdicts on known truths: how often each verdict the report
prints is right when the truth is known.

Emergence points are drawn from a law ln UPT = ln T − α ln B − β ln C (the study's: 13.26,
0.37, 0.62) plus, per grid point, a deviation u ~ N(0, σ_p²) shared by its seeds, and per cell
seed scatter N(0, σ_s²); optionally a U in C (ends +u, middle −u in ln UPT), or an exponent in B
that drifts with C (``interaction``: α changes by that much from the smallest to the largest C,
a non-separable truth). Slow cells are censored at a cap in updates: one cap for the grid (the
1 − ``censored`` quantile of its law medians), or a token budget per cell as the study's design
gives (``cap`` = 'tokens': updates = tokens / (B·C), the budget set so that a ``censored`` share
of the law medians is past it; about half of a grid at 0.5), and caps that vary by seed
(``seed_cap_spread``: each cell's cap times e^N(0, spread²), as runs stopped at different
checkpoints). Over many draws it measures:

* ``lack_of_fit``: the share of grids the lack-of-fit test (``analysis.lack_of_fit``) flags, per
  axis, and the separability test (an added ln B · ln C term): their level on power-law
  truths, their power on a U and on a drifting exponent, and how often each lands in the
  report's middle band (p from 1% to 10%: "some evidence");
* ``held_out``: the share of left-out emerged cells inside their 95% one-cell prediction
  interval (``analysis.held_out``), and the median |ln error|;
* ``coverage``: the share of 95% intervals of ln T, α, β (``analysis.scaling.fit_law``) that
  hold the truth;
* ``censored_check``: the share of power-law grids with any censored cell marked as
  contradicting the law (``analysis.scaling.censored_check``);
* ``detector``: the emergence-point detector (``analysis.emergence.emergence_point``) on
  ps_max-like curves with a known transition at 4 checkpoints per octave: its error in ln
  updates, and the share of jump-free or too-late curves it calls emerged.

    .venv/bin/python benchmarks/calibration.py            # the table of docs/benchmarks.md
    .venv/bin/python benchmarks/calibration.py --json --draws 100

tests/test_calibration.py runs a small fixed-seed version with bounds from the binomial.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from analysis import emergence, scaling  # noqa: E402
from ihsweep.base.law import STUDY  # noqa: E402

GRIDS = {  # name: (batch sizes, context sizes)
  "3x3 demo": ((8, 16, 32), (16, 32, 64)),
  "4x4": ((8, 16, 32, 64), (64, 128, 256, 512)),
  "5x5 exp1": ((8, 16, 32, 64, 128), (64, 128, 256, 512, 1024)),
  "6x6": ((4, 8, 16, 32, 64, 128), (32, 64, 128, 256, 512, 1024)),
}


@dataclasses.dataclass(frozen=True)
class Truth:
  """A known truth to draw grids from (module docstring). ``u_shape``: the U's half-height in
  ln UPT (0: a power law); ``censored``: the share of the grid's law medians past the cap."""

  grid: str = "5x5 exp1"
  seeds: int = 2
  sigma_point: float = 0.3
  sigma_seed: float = 0.15
  u_shape: float = 0.0
  censored: float = 0.0
  interaction: float = 0.0
  cap: str = "quantile"
  seed_cap_spread: float = 0.0

  def label(self) -> str:
    shape = f"U ±{self.u_shape:g}" if self.u_shape else "power law"
    if self.interaction:
      shape = f"α drifts {self.interaction:+g} over C"
    cap = "token-budget caps" if self.cap == "tokens" else "capped"
    if self.seed_cap_spread:
      cap += f" varying by seed (×e^N(0, {self.seed_cap_spread:g}²))"
    return (
      f"{self.grid}, {self.seeds} seed(s), σ_p {self.sigma_point:g}, σ_s {self.sigma_seed:g}, "
      f"{shape}, {self.censored:.0%} {cap}"
    )


def draw(truth: Truth, rng: np.random.Generator) -> pd.DataFrame:
  """One grid's cells as fit-law reads them: batch_size, context_size, seed, emergence_step
  (updates; NaN where censored), censored, censor_step."""
  bs, cs = GRIDS[truth.grid]
  lb, lc = np.log(bs), np.log(cs)
  z = (lc - lc.mean()) / (lc.max() - lc.mean())
  shape = truth.u_shape * (2 * z**2 - 1)
  # α(C) = α + interaction · (ln C − mean) / (ln C range): −α(C) ln B, centred in ln B
  drift = truth.interaction * np.outer(lb - lb.mean(), (lc - lc.mean()) / (lc.max() - lc.min()))
  mean = np.array([[law_ln_upt(b, c) + shape[j] for j, c in enumerate(cs)] for b in bs]) - drift
  ln_cap = _ln_caps(truth, mean, lb, lc)  # [B, C]
  rows = []
  for i, b in enumerate(bs):
    for j, c in enumerate(cs):
      point = mean[i, j] + rng.normal(0, truth.sigma_point)
      for s in range(truth.seeds):
        y = point + rng.normal(0, truth.sigma_seed)
        cap = ln_cap[i, j] + (rng.normal(0, truth.seed_cap_spread) if truth.seed_cap_spread else 0)
        late = y > cap
        rows.append(
          dict(
            batch_size=b,
            context_size=c,
            seed=s,
            emergence_step=math.nan if late else math.exp(y),
            censored=bool(late),
            censor_step=math.exp(cap) if late else math.nan,
          )
        )
  return pd.DataFrame(rows)


def _ln_caps(truth: Truth, mean: np.ndarray, lb: np.ndarray, lc: np.ndarray) -> np.ndarray:
  """ln cap in updates per grid point [B, C]: one cap at the 1 − ``censored`` quantile of the law
  medians ``mean``, or a token budget K per cell (ln cap = ln K − ln B − ln C) with K at the
  same quantile of the medians' tokens; +inf without censoring."""
  if not truth.censored:
    return np.full(mean.shape, np.inf)
  if truth.cap == "tokens":
    ln_tokens = mean + lb[:, None] + lc[None, :]
    return np.quantile(ln_tokens, 1 - truth.censored) - lb[:, None] - lc[None, :]
  if truth.cap != "quantile":
    raise ValueError(f"cap = {truth.cap!r}: 'quantile' or 'tokens'")
  return np.full(mean.shape, np.quantile(mean, 1 - truth.censored))


def law_ln_upt(b: float, c: float) -> float:
  return STUDY["log_T"] - STUDY["alpha"] * math.log(b) - STUDY["beta"] * math.log(c)


def lack_of_fit(truth: Truth, draws: int, seed: int = 0) -> dict:
  """Share of draws whose lack-of-fit test flags C and B and whose separability test flags the
  grid (``flagged_*``, p < 1%), share in the middle band (``some_*``, 1% <= p < 10%), and share
  not tested (``untested_*``)."""
  rng = np.random.default_rng(seed)
  names = ("C", "B", "BxC")
  flags, some, untested = ({n: 0 for n in names} for _ in range(3))
  for _ in range(draws):
    fit = scaling.fit_law(draw(truth, rng), n_boot=0, held_out=False)
    tests = {t.symbol: t for t in fit.lack_of_fit}
    tests["BxC"] = fit.separability
    for n, t in tests.items():
      flags[n] += t.lacks_fit
      some[n] += t.evidence == "some"
      untested[n] += not t.tested
  out = {}
  for n in names:
    out[f"flagged_{n}"] = flags[n] / draws
    out[f"some_{n}"] = some[n] / draws
    out[f"untested_{n}"] = untested[n] / draws
  return out


def held_out(truth: Truth, draws: int, seed: int = 0) -> dict:
  """Over draws: the share of left-out emerged cells inside their 95% one-cell prediction
  interval (pooled over draws) with its standard error from the draws' spread (a ratio
  estimator: the cells of one draw are not independent, the draws are), the median over draws
  of the median |ln error|, and the same for the study's law (the truth's own law when the
  truth is a power law)."""
  rng = np.random.default_rng(seed)
  inside, study_inside, cells, med, study_med = [], [], [], [], []
  for _ in range(draws):
    h = scaling.fit_law(draw(truth, rng), n_boot=0).held_out
    if h.fitted is None or not h.n_emerged:
      continue
    em = h.cells[~h.cells["censored"]]
    obs = em["observed_updates"]
    inside.append(int(em["inside"].sum()))
    study_inside.append(int(((em["study_lo"] <= obs) & (obs <= em["study_hi"])).sum()))
    cells.append(len(em))
    med.append(h.fitted.median_abs_ln)
    study_med.append(h.study.median_abs_ln)
  inside, study_inside, cells = (np.asarray(v, float) for v in (inside, study_inside, cells))
  n = cells.sum()
  cov = inside.sum() / n if n else math.nan
  se = math.sqrt(((inside - cov * cells) ** 2).sum()) / n if n else math.nan
  return {
    "held_out_coverage": float(cov),
    "held_out_coverage_se": float(se),
    "held_out_cells": int(n),
    "held_out_median_abs_ln": float(np.median(med)) if med else math.nan,
    "study_coverage": float(study_inside.sum() / n) if n else math.nan,
    "study_median_abs_ln": float(np.median(study_med)) if study_med else math.nan,
  }


def coverage(truth: Truth, draws: int, seed: int = 0, n_boot: int = 300) -> dict:
  """Share of draws whose 95% interval of ln T, α and β holds the truth (draws without
  intervals counted apart)."""
  rng = np.random.default_rng(seed)
  hit = {n: 0 for n in ("log_T", "alpha", "beta")}
  with_ci = 0
  for d in range(draws):
    fit = scaling.fit_law(draw(truth, rng), n_boot=n_boot, seed=d, held_out=False)
    if not fit.ci:
      continue
    with_ci += 1
    for n in hit:
      lo, hi = fit.ci[n]
      hit[n] += lo <= STUDY[n] <= hi
  out = {f"coverage_{n}": (h / with_ci if with_ci else math.nan) for n, h in hit.items()}
  out["without_intervals"] = 1 - with_ci / draws
  return out


def censored_check(truth: Truth, draws: int, seed: int = 0) -> dict:
  """Share of power-law grids with any censored cell marked as contradicting the law."""
  rng = np.random.default_rng(seed)
  alarms, with_censored = 0, 0
  for _ in range(draws):
    points = draw(truth, rng)
    if not points["censored"].any():
      continue
    with_censored += 1
    check = scaling.censored_check(scaling.fit_law(points, n_boot=0, held_out=False), points)
    alarms += bool(check["contradicts"].any())
  return {"false_alarm": alarms / with_censored if with_censored else math.nan}


def detector(draws: int, seed: int = 0, noise: float = 0.03, width: float = 0.25) -> dict:
  """The threshold detector on ps_max-like curves: 0.05 → 0.9 along a logistic in ln updates
  (``width`` its scale) plus N(0, ``noise``²) per checkpoint, checkpoints at 4 per octave from
  16 to 2^16 updates; transitions log-uniform in [2^7, 2^13]. Reports the error ln(t̂ / t) of
  emerged curves (median, 95th percentile of its size), the share of such curves censored,
  and the share called emerged among curves without a jump and among curves whose
  transition lies 4 octaves past the last checkpoint."""
  rng = np.random.default_rng(seed)
  steps = 2.0 ** np.arange(4, 16.01, 0.25)

  def curve(t0):
    rise = 1 / (1 + np.exp(-(np.log(steps) - math.log(t0)) / width))
    return 0.05 + 0.85 * rise + rng.normal(0, noise, len(steps))

  errors, missed = [], 0
  for _ in range(draws):
    t0 = 2.0 ** rng.uniform(7, 13)
    e = emergence.emergence_point(steps, curve(t0))
    if e.censored:
      missed += 1
    else:
      errors.append(math.log(e.emergence_step / t0))
  flat = sum(
    not emergence.emergence_point(steps, 0.05 + rng.normal(0, noise, len(steps))).censored
    for _ in range(draws)
  )
  late = sum(
    not emergence.emergence_point(steps, curve(steps[-1] * 16)).censored for _ in range(draws)
  )
  errors = np.asarray(errors)
  return {
    "median_error_ln": float(np.median(errors)),
    "p95_abs_error_ln": float(np.percentile(np.abs(errors), 95)),
    "missed": missed / draws,
    "false_emergence_flat": flat / draws,
    "false_emergence_late": late / draws,
  }


# The table of docs/benchmarks.md: each verdict on the truths it must hold on.
LEVEL_TRUTHS = [
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15),
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, censored=0.2),
  Truth(grid="5x5 exp1", sigma_point=0.2, sigma_seed=0.2, censored=0.2),
  Truth(grid="5x5 exp1", sigma_point=0.0, sigma_seed=0.3, censored=0.2),
  Truth(grid="5x5 exp1", seeds=1, sigma_point=0.3, sigma_seed=0.15, censored=0.2),
  Truth(grid="5x5 exp1", seeds=3, sigma_point=0.3, sigma_seed=0.15, censored=0.2),
  Truth(grid="3x3 demo", sigma_point=0.3, sigma_seed=0.15),
  Truth(grid="3x3 demo", sigma_point=0.3, sigma_seed=0.15, censored=0.2),
  Truth(grid="4x4", sigma_point=0.5, sigma_seed=0.1, censored=0.4),
  Truth(grid="6x6", sigma_point=0.3, sigma_seed=0.15, censored=0.2),
  # the study's design: one token budget per cell, about half of the grid past it
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, censored=0.5, cap="tokens"),
  Truth(sigma_point=0.3, sigma_seed=0.15, censored=0.5, cap="tokens", seed_cap_spread=0.3),
  Truth(sigma_point=0.2, sigma_seed=0.2, censored=0.5, cap="tokens", seed_cap_spread=0.5),
  Truth(grid="4x4", sigma_point=0.3, sigma_seed=0.15, censored=0.5, cap="tokens"),
]
POWER_TRUTHS = [
  Truth(grid="5x5 exp1", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="5x5 exp1", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5, censored=0.1),
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5, censored=0.2),
  Truth(grid="3x3 demo", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="6x6", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5, censored=0.2),
  # an exponent in B that changes over the C range by as much as the study's α (0.37)
  Truth(grid="5x5 exp1", sigma_point=0.1, sigma_seed=0.1, interaction=0.37),
  Truth(grid="5x5 exp1", sigma_point=0.1, sigma_seed=0.15, interaction=0.37),
  Truth(
    grid="5x5 exp1", sigma_point=0.1, sigma_seed=0.1, interaction=0.37, censored=0.5, cap="tokens"
  ),
  Truth(grid="3x3 demo", sigma_point=0.1, sigma_seed=0.1, interaction=0.37),
]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--draws", type=int, default=400, help="draws per truth (level and power)")
  ap.add_argument("--coverage-draws", type=int, default=200, help="draws per truth (intervals)")
  ap.add_argument("--held-out-draws", type=int, default=100, help="draws per truth (held out)")
  ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
  ap.add_argument("--seed", type=int, default=0)
  opts = ap.parse_args(argv)
  t0 = time.time()
  rows = []
  for truth in LEVEL_TRUTHS:
    row = {"truth": truth.label(), "kind": "level", **lack_of_fit(truth, opts.draws, opts.seed)}
    if truth.censored:
      row.update(censored_check(truth, opts.draws, opts.seed))
    if opts.coverage_draws:
      row.update(coverage(truth, opts.coverage_draws, opts.seed))
    if opts.held_out_draws:
      row.update(held_out(truth, opts.held_out_draws, opts.seed))
    rows.append(row)
    print(json.dumps(row), file=sys.stderr)
  for truth in POWER_TRUTHS:
    rows.append(
      {"truth": truth.label(), "kind": "power", **lack_of_fit(truth, opts.draws, opts.seed)}
    )
    print(json.dumps(rows[-1]), file=sys.stderr)
  out = {"draws": opts.draws, "coverage_draws": opts.coverage_draws, "truths": rows}
  out["detector"] = detector(opts.draws, opts.seed)
  out["seconds"] = round(time.time() - t0, 1)
  if opts.json:
    print(json.dumps(out, indent=1))
  else:
    print(pd.DataFrame(rows).to_markdown(index=False, floatfmt=".3f"))
    print(json.dumps(out["detector"]))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
