"""Integer arithmetic the checks and the planner share, in time that does not grow with the
value: a config field or flag of 2·10⁹ is answered as fast as one of 8. A leaf module: it
imports nothing of ihsweep or JAX."""

from __future__ import annotations

import math


def divisors(n: int) -> list[int]:
  """The positive divisors of ``n`` (an int >= 1), ascending: a mesh axis, a microbatch count.
  O(√n) steps (about 45,000 at n = 2·10⁹)."""
  small, large = [], []
  for k in range(1, math.isqrt(n) + 1):
    if n % k == 0:
      small.append(k)
      if k != n // k:
        large.append(n // k)
  return small + large[::-1]


def some(values: list[int], near: int, limit: int = 12) -> str:
  """``values`` for an error message: all of them if at most ``limit``, else the ``limit``
  closest to ``near`` with their count (``1, 2, 4, … 64, 128 (of 31)``)."""
  if len(values) <= limit:
    return ", ".join(map(str, values))
  chosen = sorted(sorted(values, key=lambda v: (abs(v - near), v))[:limit])
  parts = [str(v) for v in chosen]
  if chosen[0] != values[0]:
    parts.insert(0, f"{values[0]} …")
  if chosen[-1] != values[-1]:
    parts.append(f"… {values[-1]}")
  return f"{', '.join(parts)} ({len(values)} in all)"
