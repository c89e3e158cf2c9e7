"""The report's opening words, generated from a run's config and its results.

``summary`` turns the tables the report builds — one row per cell with its emergence point
(``analysis.emergence.primary``), the fitted law (``analysis.law_fit.LawFit.to_dict``) and the
run's config — into four paragraphs: the setup, the finding, the comparison with the study, and
the limitations that apply. Every claim is decided from the numbers, with the rules below, so a
grid that cannot support a sentence does not get it:

* **Direction with B or C** ("emergence comes in fewer updates at larger B"): only when the 95%
  interval of the exponent (α for B, β for C) excludes 0; an interval that includes 0 reads "no
  clear dependence"; no interval (too few cells, no bootstrap, or a fixed coefficient) means no
  direction is claimed.
* **In sequences and tokens**: at a given C the sequences seen by the transition, UPT · B, and
  the tokens, UPT · B · C, go as B^(1−α); at a given B the tokens go as C^(1−β). "A roughly
  fixed number of sequences" is said when the interval of 1 − α includes 0, or when its
  estimate is within ``ROUGHLY`` of 0 (then with the slight trend and its interval).
* **Against the study**: whether the study's α = 0.37 and β = 0.62 lie inside the fitted
  intervals, and how far the study's law is from the emerged cells, always with the reason why
  such a comparison crosses data and scale (docs/study.md).
* **Limitations**: censored cells (and how the fit treated them), emerged models whose jump lies
  at the end of their curve (``analysis.emergence.caution``) with the law refitted with them
  censored, seeds per grid point and their scatter, the spacing of the checkpoints around the
  emergence points, a probe block length that changes with C, a single model size, too few
  residual degrees of freedom.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ihsweep.base.law import STUDY, STUDY_N_PARAMS, STUDY_TOKENS

from .limitations import limitations_paragraph
from .prose import config_field, interval_of, number, number_span, sentence
from .setup_words import (
  big_number,
  by_axis_words,
  data_words,
  models_words,
  setup_paragraph,
)

# |exponent| at most this: "roughly fixed" (doubling changes the count by at most 2^0.25 = 19%,
# about the spacing of checkpoints at 4 per octave).
ROUGHLY = 0.25


# ---------------------------------------------------------------- setup


# ---------------------------------------------------------------- finding


def _interval(lo: float, hi: float) -> str:
  return f"95% interval {lo:.2f} to {hi:.2f}"


def _trend(
  name: str, value: float, ci, var: str, quantity: str, fixed: bool, why_none: str = ""
) -> tuple[str, int]:
  """A sentence on how UPT moves with ``var`` for exponent ``name`` (UPT ∝ var^−value), and the
  sign decided: +1 falls, −1 rises, 0 no clear dependence, None not decided."""
  sym = {"alpha": "α", "beta": "β"}[name]
  if fixed:
    return (
      f"{sym} was held at {value:.2f}, not fitted, so the grid says nothing about {quantity}",
      None,
    )
  if ci is None:
    return (
      f"{sym} = {value:.2f}, without an interval ({why_none or 'too few cells'}), so no "
      f"direction with {var} is claimed",
      None,
    )
  lo, hi = ci
  if lo > 0:
    saved = 1 - 2**-value
    return (
      f"emergence comes in fewer updates at larger {var}: UPT ∝ {var}^−{value:.2f} "
      f"({sym}: {_interval(lo, hi)}), so doubling {var} saves {saved:.0%} of the updates",
      1,
    )
  if hi < 0:
    more = 2**-value - 1
    return (
      f"emergence takes more updates at larger {var}: UPT ∝ {var}^{-value:.2f} ({sym}: "
      f"{_interval(lo, hi)}), {more:.0%} more per doubling of {var}",
      -1,
    )
  return (
    f"the updates to emergence show no clear dependence on {var} ({sym} = {value:.2f}, "
    f"{_interval(lo, hi)}, includes 0)",
    0,
  )


def _count_trend(value: float, ci, var: str, what: str) -> tuple[str, str | None]:
  """How a count ∝ var^value (value = 1 − exponent) moves: ('roughly fixed' | 'grows' |
  'falls' | None) with its sentence; ci the interval of ``value``."""
  if ci is None:
    return "", None
  lo, hi = ci
  trend = f"{var}^{value:.2f} ({_interval(lo, hi)})"
  if lo <= 0 <= hi:
    return (
      f"the {what} to emergence is roughly fixed across {var}: it goes as "
      f"{var}^{value:.2f} ({_interval(lo, hi)}, which includes 0)",
      "fixed",
    )
  per = 2**value - 1
  if abs(value) <= ROUGHLY:
    return (
      f"the {what} to emergence is roughly fixed across {var}, "
      f"{'growing' if value > 0 else 'falling'} only slightly: as {trend}, "
      f"{abs(per):.0%} {'more' if value > 0 else 'fewer'} per doubling of {var}",
      "fixed",
    )
  if value > 0:
    near = " — about in proportion" if lo <= 1 <= hi else ""
    return f"the {what} to emergence grows with {var}{near}: as {trend}", "grows"
  return f"the {what} to emergence falls with {var}: as {trend}", "falls"


def finding_paragraph(
  points: pd.DataFrame, law: dict | None, law_error: str | None, keys: list[str], axes=()
) -> str:
  text = _finding(points, law, law_error, keys)
  by_axis = by_axis_words(points, axes)
  return f"{text} {by_axis}" if by_axis else text


def _finding(points: pd.DataFrame, law: dict | None, law_error: str | None, keys: list[str]) -> str:
  emerged = ~points["censored"].astype(bool)
  n, k = len(points), int(emerged.sum())
  parts = [f"**Finding.** {k} of {n} models emerged by their last checkpoint"]
  if k == 0:
    return parts[0] + _none_emerged(points)
  em = points[emerged]
  steps = em["emergence_step"].astype(float)
  first, last = em.loc[steps.idxmin()], em.loc[steps.idxmax()]
  parts[0] += (
    f", between update {number(steps.min())} (B {first['batch_size']:g}, C "
    f"{first['context_size']:g}) and {number(steps.max())} (B {last['batch_size']:g}, "
    f"C {last['context_size']:g})."
  )
  if law is None:
    parts.append(
      "No law was fitted"
      + (f" ({law_error.rstrip('.')})" if law_error else "")
      + ", so how emergence moves with B and C is not summarised beyond the table "
      "below."
    )
    return " ".join(parts)
  parts += _law_finding(law, em)
  return " ".join(parts)


def _none_emerged(points: pd.DataFrame) -> str:
  """The finding's clause when no model emerged: where the checkpoints ended."""
  last = points["censor_step"].astype(float)
  where = (
    f"update {number(last.min())}"
    if last.min() == last.max()
    else f"updates {number(last.min())}–{number(last.max())}"
  )
  return (
    f"; none did, so every emergence point is only known to lie beyond the last "
    f"checkpoint ({where}), and nothing is said here about how emergence moves "
    f"with B or C."
  )


def _law_finding(law: dict, em: pd.DataFrame) -> list[str]:
  """The finding's sentences about the fitted law: how emergence moves with B and C, in
  updates and in sequences and tokens, and whether a roughly fixed number of sequences fits
  (``em``: the emerged models)."""
  fixed = set((law.get("fixed") or {}).keys())
  how = _fit_words(law)
  parts = [f"The law ln UPT = ln T − α ln B − β ln C was fitted {how}."]
  why = law.get("ci_note") or ("no bootstrap" if law.get("n_boot") == 0 else "")
  a_text, a_sign = _trend(
    "alpha",
    law["alpha"],
    interval_of(law, "alpha"),
    "B",
    "how emergence moves with B",
    "alpha" in fixed,
    why,
  )
  b_text, b_sign = _trend(
    "beta",
    law["beta"],
    interval_of(law, "beta"),
    "C",
    "how emergence moves with C",
    "beta" in fixed,
    why,
  )
  # Where a free level per value fits the cells better than the power law (analysis.lack_of_fit),
  # the exponent averages a shape the law cannot take: say what the grid does instead.
  lacking = {t["symbol"]: t for t in law.get("lack_of_fit") or [] if t.get("lacks_fit")}
  if "B" in lacking:
    a_text = f"{lacking['B']['sentence']}, so α = {law['alpha']:.2f} is not a trend"
  if "C" in lacking:
    b_text, b_sign = f"{lacking['C']['sentence']}, so β = {law['beta']:.2f} is not a trend", None
  # Some evidence against the law, short of the report's level: the trend stands, with what
  # the free levels show beside it.
  some = {t["symbol"]: t for t in law.get("lack_of_fit") or [] if t.get("evidence") == "some"}
  if "B" in some:
    a_text = f"{a_text}; but {some['B']['sentence']}"
  if "C" in some:
    b_text = f"{b_text}; but {some['C']['sentence']}"
  a_ci, b_ci = interval_of(law, "alpha"), interval_of(law, "beta")
  if "B" in lacking:
    a_ci = None  # no count trend is read from an exponent that does not describe the grid
  if "C" in lacking:
    b_ci = None
  seq = tok_c = (None, None)
  sentences = [f"Batch size: {a_text}"]
  if a_ci is not None and "alpha" not in fixed:
    seq = _count_trend(
      1 - law["alpha"],
      (1 - a_ci[1], 1 - a_ci[0]),
      "B",
      "number of sequences (UPT·B; tokens at a given C)",
    )
    sentences.append(seq[0])
  sentences.append(f"Context size: {b_text}")
  if b_ci is not None and "beta" not in fixed:
    tok_c = _count_trend(
      1 - law["beta"], (1 - b_ci[1], 1 - b_ci[0]), "C", "number of tokens (UPT·B·C; at a given B)"
    )
    sentences.append(tok_c[0])
  sep = law.get("separability") or {}
  if sep.get("evidence") in ("rejected", "some"):
    sentences.append(f"Separability: {sep['sentence']}")
  parts.append(" ".join(sentence(t) for t in sentences if t))
  if seq[1] == "fixed" and b_sign == 0:
    seqs = em["emergence_step"].astype(float) * em["batch_size"].astype(float)
    parts.append(
      f"Together: over this grid, induction heads formed after a roughly fixed "
      f"number of sequences, whatever B and C (UPT·B of the emerged models: median "
      f"{number(seqs.median())}, range {number_span(seqs.min(), seqs.max())})."
    )
  return parts


def _fit_words(law: dict) -> str:
  method = str(law.get("method") or "")
  n_cens = int(law.get("n_censored") or 0)
  n_em = int(law.get("n_emerged") or (law.get("n", 0) if "MLE" not in method else 0))
  if "MLE" in method or "censored" in method:
    return (
      f"by maximum likelihood to {n_em} emerged and {models_words(n_cens, 'censored model')} (a "
      f"censored model counts by the chance that it emerges after its last checkpoint)"
    )
  return f"by least squares to the {law.get('n', n_em)} emerged models" + (
    f" ({n_cens} censored left out)" if n_cens else ""
  )


# ---------------------------------------------------------------- against the study


def study_paragraph(points: pd.DataFrame, law: dict | None, cfg) -> str:
  parts = ["**Against the study.**"]
  if law is not None:
    inside = []
    for name, sym in (("alpha", "α"), ("beta", "β")):
      ci = interval_of(law, name)
      study = STUDY[name]
      fixed = name in (law.get("fixed") or {})
      if fixed:
        inside.append(f"{sym} was fixed at {law[name]:.2f}")
      elif ci is None:
        inside.append(
          f"{sym} = {law[name]:.2f} against the study's {study:.2f} (no interval to compare with)"
        )
      else:
        where = "inside" if ci[0] <= study <= ci[1] else "outside"
        inside.append(
          f"{sym} = {law[name]:.2f} ({_interval(*ci)}) against the study's "
          f"{study:.2f}, {where} the interval"
        )
    parts.append(
      f"The study's law has ln T = {STUDY['log_T']}, α = {STUDY['alpha']}, β = {STUDY['beta']} "
      "(UPT falls with both, "
      "more with C); here " + "; ".join(inside) + f"; ln T = {law['log_T']:.2f}."
    )
  em = points[~points["censored"].astype(bool)]
  if len(em):
    b, c = em["batch_size"].astype(float), em["context_size"].astype(float)
    pred = np.exp(STUDY["log_T"] - STUDY["alpha"] * np.log(b) - STUDY["beta"] * np.log(c))
    ratio = float(np.exp(np.mean(np.log(pred / em["emergence_step"].astype(float)))))
    side = (
      f"about when these models did ({ratio:.2f}×)"  # not '1.0× later'
      if f"{max(ratio, 1 / ratio):.1f}" == "1.0"
      else f"{ratio:.1f}× later than these models did"
      if ratio >= 1
      else f"{1 / ratio:.1f}× earlier than these models did"
    )
    parts.append(
      f"Scored on the {len(em)} emerged models, the study's law predicts "
      f"{number_span(pred.min(), pred.max())} updates, on average (geometric mean) "
      f"{side}."
    )
  cens = points[points["censored"].astype(bool) & points["censor_step"].notna()]
  if len(cens):
    b, c = cens["batch_size"].astype(float), cens["context_size"].astype(float)
    pred = np.exp(STUDY["log_T"] - STUDY["alpha"] * np.log(b) - STUDY["beta"] * np.log(c))
    past = int((cens["censor_step"].astype(float) >= pred).sum())
    if past:
      parts.append(
        f"{past} of the {models_words(len(cens), 'censored model')} trained past the "
        f"update the study's law predicts for it without emerging."
      )
    else:
      last = number_span(cens["censor_step"].min(), cens["censor_step"].max())
      if len(cens) == 1:
        parts.append(
          f"The censored model had not reached the update the study's law predicts "
          f"for it ({number_span(pred.min(), pred.max())}; its last checkpoint {last}), so "
          f"its not emerging does not contradict it."
        )
      else:
        parts.append(
          f"None of the {len(cens)} censored models reached the update the study's "
          f"law predicts for it ({number_span(pred.min(), pred.max())}; their last "
          f"checkpoints {last}), so their not emerging does not contradict it."
        )
  parts.append(_scale_words(points, cfg))
  return " ".join(parts)


def _scale_words(points: pd.DataFrame, cfg) -> str:
  """Why the comparison crosses data and scale: the study's data, model size and tokens beside
  this run's."""
  source = config_field(cfg, "data.source", "?")
  if source == "natural":
    data = (
      "natural text here too, but another corpus and tokenizer "
      f"({config_field(cfg, 'data.corpus') or config_field(cfg, 'data.tfds_name') or 'a corpus'})"
      f" than "
      f"the study's Common Crawl text"
    )
  else:
    data = (
      f"{data_words(cfg).split(':')[0].split(' (')[0]} here against the study's natural "
      f"web text (Common Crawl)"
    )
  size = ""
  if "n_params" in points and points["n_params"].notna().any():
    ours = float(points["n_params"].dropna().astype(float).max())
    size = (
      f"; models of {big_number(ours)} parameters against the study's about "
      f"{big_number(STUDY_N_PARAMS)} (2 layers, d_model 768, with MLPs), "
      f"{STUDY_N_PARAMS / ours:,.0f}× larger"
    )
  tokens = ""
  if "last_step" in points and points["last_step"].notna().any():
    t = (
      points["last_step"].astype(float)
      * points["batch_size"].astype(float)
      * points["context_size"].astype(float)
    )
    tokens = (
      f"; at most {big_number(t.max())} training tokens per model here against "
      f"{big_number(STUDY_TOKENS)} there"
    )
  return (
    f"This comparison crosses data and scale — {data}{size}{tokens} — so a difference "
    f"says how this setting departs from the study's, not that either law is wrong, and a "
    f"match would not confirm the study's law on natural text."
  )


# ---------------------------------------------------------------- limitations


def summary(
  points: pd.DataFrame,
  law: dict | None = None,
  *,
  config=None,
  axes=(),
  law_error: str | None = None,
  metric: str = "ps_max",
  method: str = "threshold",
  n_runs: int = 1,
  sensitivity: dict | None = None,
) -> list[str]:
  """The report's opening paragraphs (Markdown; bold lead words), from the report's tables.

  Args:
    points: one row per model (``analysis.emergence.primary``): ``batch_size``,
      ``context_size``, ``emergence_step`` (updates; NaN if censored), ``censored`` (bool),
      ``censor_step``; optional ``run``, ``seed``, grid-axis columns, ``n_params``,
      ``step_before``/``step_after`` (checkpoints bracketing the point), ``last_step`` (the
      last checkpoint of the model's curve), ``budget_updates``, ``late_points`` and
      ``last_interval`` (``analysis.emergence.Emergence``) or ``caution`` (its words).
    law: the fitted law (``LawFit.to_dict()``: ``log_T``, ``alpha``, ``beta``, ``ci``, ``n``,
      ``n_censored``, ``dof``, optional ``fixed``, ``method``, ``sigma``, ``n_emerged``,
      ``emerged_only``) or None (then ``law_error`` says why).
    config: the run's resolved config (ConfigDict or nested dicts); missing fields are left out
      of the words.
    axes: grid-axis columns other than B and C.
    sensitivity: the law refitted with the flagged models (``caution``, else
      ``analysis.emergence.cautions`` of ``late_points``/``last_interval``) censored at their
      ``last_step`` (``LawFit.to_dict()``), or ``{"error": why it could not be fitted}``; None:
      the flagged models are listed without it.

  Returns:
    Four paragraphs: setup, finding, against the study, limitations.

  Raises:
    ValueError: ``points`` is empty or lacks batch_size, context_size, emergence_step or
      censored.
  """
  need = {"batch_size", "context_size", "emergence_step", "censored"}
  if points is None or points.empty or not need <= set(points):
    missing = sorted(need - set(points if points is not None else []))
    raise ValueError(
      f"summary needs one row per model with {sorted(need)}"
      + (f"; missing {missing}" if missing else "; got no rows")
    )
  points = points.copy()
  if "censor_step" not in points:
    points["censor_step"] = math.nan
  cfg = config if config is not None else {}
  keys = [k for k in ("run", *axes, "batch_size", "context_size") if k in points]
  keys = list(dict.fromkeys(keys))
  return [
    setup_paragraph(points, cfg, keys, list(axes), metric, method, n_runs),
    finding_paragraph(points, law, law_error, keys, list(axes)),
    study_paragraph(points, law, cfg),
    limitations_paragraph(points, law, cfg, keys, sensitivity),
  ]
