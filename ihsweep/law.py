"""The emergence law: updates and tokens until induction heads form, from (B, C).

Aoyama, Wilcox & Schneider, "Predicting the Emergence of Induction Heads in Language Model
Pretraining" (arXiv 2511.16893 v2, experiment 1):

    UPT = T / (B^α · C^β),   ln T = 13.26, α = 0.37, β = 0.62

UPT is the number of updates (optimizer steps) at the transition for batch size B (sequences per
update) and context size C (tokens per sequence); the tokens seen by then are UPT · B · C. A law
fitted by ``python -m analysis fit-law`` (JSON with ``log_T``, ``alpha``, ``beta``) replaces the
study's constants via ``Law.from_json``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from numbers import Real


MAX_LOG_UPDATES = 100  # e^100 updates: a prediction past this is a broken law, not a plan


class LawError(ValueError):
  """A law file that cannot be read, or a (B, C) outside the law's domain."""


@dataclasses.dataclass(frozen=True)
class Law:
  """``UPT = exp(log_T) / (B^alpha · C^beta)`` (natural log; the study's values by default)."""

  log_T: float = 13.26
  alpha: float = 0.37
  beta: float = 0.62
  source: str = "Aoyama et al. 2025 (arXiv 2511.16893), experiment 1"

  @property
  def T(self) -> float:
    return math.exp(self.log_T)

  def updates(self, batch_size: float, context_size: float) -> float:
    """Predicted updates at the transition (float; >0).

    Raises:
      LawError: if B or C is not a positive number.
    """
    for name, v in (("batch_size", batch_size), ("context_size", context_size)):
      if isinstance(v, bool) or not isinstance(v, Real) or not v > 0 or not math.isfinite(v):
        raise LawError(f"{name} = {v!r}: the law needs a positive number")
    log_upt = self.log_T - self.alpha * math.log(batch_size) - self.beta * math.log(context_size)
    if log_upt > MAX_LOG_UPDATES:
      raise LawError(f"the law (log_T = {self.log_T:g}, alpha = {self.alpha:g}, beta = "
                     f"{self.beta:g}) predicts e^{log_upt:.0f} updates for B = {batch_size}, "
                     f"C = {context_size}: beyond any run (more than e^{MAX_LOG_UPDATES})")
    return math.exp(log_upt)

  def tokens(self, batch_size: float, context_size: float) -> float:
    """Predicted tokens per model at the transition: UPT · B · C."""
    return self.updates(batch_size, context_size) * batch_size * context_size

  def to_dict(self) -> dict:
    return {"log_T": self.log_T, "T": self.T, "alpha": self.alpha, "beta": self.beta,
            "source": self.source}

  @classmethod
  def from_json(cls, path: str) -> "Law":
    """Reads a law JSON: ``{"log_T": …, "alpha": …, "beta": …}`` (or ``T`` instead of ``log_T``;
    other keys, e.g. a fit's ``r`` and ``ci``, ignored) — the format of the analysis package's
    fitted law.

    Raises:
      LawError: unreadable file, not a JSON object, missing/non-numeric/non-finite fields, or
        ``T`` and ``log_T`` that disagree.
    """
    try:
      with open(path) as f:
        obj = json.load(f)
    except (OSError, ValueError) as e:
      raise LawError(f"law file {path}: cannot read a JSON law ({e})") from None
    if not isinstance(obj, dict):
      raise LawError(f"law file {path}: expected a JSON object with log_T, alpha, beta")
    if "T" in obj:
      t = obj["T"]
      if isinstance(t, bool) or not isinstance(t, Real) or not 0 < t < math.inf:
        raise LawError(f"law file {path}: T = {t!r} must be a positive finite number")
      if "log_T" not in obj:
        obj = {**obj, "log_T": math.log(t)}
      elif isinstance(obj["log_T"], Real) and not math.isclose(math.log(t), obj["log_T"],
                                                               rel_tol=1e-6, abs_tol=1e-9):
        raise LawError(f"law file {path}: T = {t!r} and log_T = {obj['log_T']!r} disagree "
                       f"(ln T = {math.log(t):.6g}); give one of them")
    values = {}
    for key in ("log_T", "alpha", "beta"):
      if key not in obj:
        raise LawError(f"law file {path}: missing field {key!r}"
                       + (" (or 'T')" if key == "log_T" else "")
                       + "; a law JSON needs log_T (or T), alpha and beta")
      v = obj[key]
      if isinstance(v, bool) or not isinstance(v, Real) or not math.isfinite(v):
        raise LawError(f"law file {path}: field {key!r} = {v!r}; need a finite number")
      values[key] = float(v)
    return cls(**values, source=path)
