"""Calibration of the report's verdicts on known truths: how often each verdict the report
prints is right when the truth is known.

Emergence points are drawn from a law ln UPT = ln T − α ln B − β ln C (the study's: 13.26,
0.37, 0.62) plus, per grid point, a deviation u ~ N(0, σ_p²) shared by its seeds, and per cell
seed scatter N(0, σ_s²); optionally a U in C (ends +u, middle −u in ln UPT); slow cells
censored at a cap in updates (the 1 − ``censored`` quantile of the grid's law medians). Over
many draws it measures:

* ``lack_of_fit``: the share of grids the lack-of-fit test (``analysis.lack_of_fit``) flags, per
  axis: its level on power-law truths, its power on a U;
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

  def label(self) -> str:
    shape = f"U ±{self.u_shape:g}" if self.u_shape else "power law"
    return (
      f"{self.grid}, {self.seeds} seed(s), σ_p {self.sigma_point:g}, σ_s {self.sigma_seed:g}, "
      f"{shape}, {self.censored:.0%} capped"
    )


def draw(truth: Truth, rng: np.random.Generator) -> pd.DataFrame:
  """One grid's cells as fit-law reads them: batch_size, context_size, seed, emergence_step
  (updates; NaN where censored), censored, censor_step."""
  bs, cs = GRIDS[truth.grid]
  lc = np.log(cs)
  z = (lc - lc.mean()) / (lc.max() - lc.mean())
  shape = truth.u_shape * (2 * z**2 - 1)
  mean = np.array([[law_ln_upt(b, c) + shape[j] for j, c in enumerate(cs)] for b in bs])  # [B, C]
  cap = np.quantile(mean, 1 - truth.censored) if truth.censored else np.inf
  rows = []
  for i, b in enumerate(bs):
    for j, c in enumerate(cs):
      point = mean[i, j] + rng.normal(0, truth.sigma_point)
      for s in range(truth.seeds):
        y = point + rng.normal(0, truth.sigma_seed)
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


def law_ln_upt(b: float, c: float) -> float:
  return STUDY["log_T"] - STUDY["alpha"] * math.log(b) - STUDY["beta"] * math.log(c)


def lack_of_fit(truth: Truth, draws: int, seed: int = 0) -> dict:
  """Share of draws whose lack-of-fit test flags C and B, and share it could not test."""
  rng = np.random.default_rng(seed)
  flags, untested = {"C": 0, "B": 0}, {"C": 0, "B": 0}
  for _ in range(draws):
    for t in scaling.fit_law(draw(truth, rng), n_boot=0).lack_of_fit:
      flags[t.symbol] += t.lacks_fit
      untested[t.symbol] += not getattr(t, "tested", True)
  return {
    "flagged_C": flags["C"] / draws,
    "flagged_B": flags["B"] / draws,
    "untested_C": untested["C"] / draws,
    "untested_B": untested["B"] / draws,
  }


def coverage(truth: Truth, draws: int, seed: int = 0, n_boot: int = 300) -> dict:
  """Share of draws whose 95% interval of ln T, α and β holds the truth (draws without
  intervals counted apart)."""
  rng = np.random.default_rng(seed)
  hit = {n: 0 for n in ("log_T", "alpha", "beta")}
  with_ci = 0
  for d in range(draws):
    fit = scaling.fit_law(draw(truth, rng), n_boot=n_boot, seed=d)
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
    check = scaling.censored_check(scaling.fit_law(points, n_boot=0), points)
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
]
POWER_TRUTHS = [
  Truth(grid="5x5 exp1", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="5x5 exp1", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5, censored=0.1),
  Truth(grid="5x5 exp1", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5, censored=0.2),
  Truth(grid="3x3 demo", sigma_point=0.2, sigma_seed=0.15, u_shape=0.5),
  Truth(grid="6x6", sigma_point=0.3, sigma_seed=0.15, u_shape=0.5, censored=0.2),
]


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--draws", type=int, default=400, help="draws per truth (level and power)")
  ap.add_argument("--coverage-draws", type=int, default=200, help="draws per truth (intervals)")
  ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
  ap.add_argument("--seed", type=int, default=0)
  opts = ap.parse_args(argv)
  t0 = time.time()
  rows = []
  for truth in LEVEL_TRUTHS:
    row = {"truth": truth.label(), "kind": "level", **lack_of_fit(truth, opts.draws, opts.seed)}
    if truth.censored:
      row.update(censored_check(truth, opts.draws, opts.seed))
    row.update(coverage(truth, opts.coverage_draws, opts.seed))
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
