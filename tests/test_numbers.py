"""ihsweep/base/numbers.py and the checks built on it: answers whose cost does not grow with the
value (a field or flag of 2·10⁹ is refused as fast as one of 8)."""

import pytest

from ihsweep.base import numbers, sharding
from ihsweep.planning import list_schedule


def test_divisors_known_answers_and_against_the_definition():
  assert numbers.divisors(1) == [1]
  assert numbers.divisors(12) == [1, 2, 3, 4, 6, 12]
  assert numbers.divisors(49) == [1, 7, 49]
  for n in range(1, 400):
    assert numbers.divisors(n) == [k for k in range(1, n + 1) if n % k == 0], n
  big = numbers.divisors(2_000_000_000)  # 2^10 · 5^9: 11 · 10 divisors
  assert len(big) == 110 and big[:4] == [1, 2, 4, 5] and big[-1] == 2_000_000_000
  assert numbers.divisors(2_147_483_647) == [1, 2_147_483_647]  # a prime


def test_some_lists_all_or_those_nearest_the_value():
  assert numbers.some([1, 2, 4], 3) == "1, 2, 4"
  text = numbers.some(numbers.divisors(2_000_000_000), 3)
  assert text.startswith("1, 2, 4, 5, 8") and text.endswith("… 2000000000 (110 in all)")


def _usable_by_definition(n_models, batch_size, n_devices):
  """The rule before it was made fast: the longest prefix mesh_shape accepts, D, D-1, …"""
  for n in range(n_devices, 0, -1):
    for e in range(n, 0, -1):
      if n % e == 0 and n_models % e == 0 and batch_size % (n // e) == 0:
        return n
  return 1


@pytest.mark.parametrize("n_models", [1, 2, 3, 4, 6, 12])
@pytest.mark.parametrize("batch_size", [1, 5, 8, 12])
def test_usable_devices_and_mesh_shape_equal_their_definition(n_models, batch_size):
  for n in range(1, 26):
    devices = list(range(n))
    want = _usable_by_definition(n_models, batch_size, n)
    assert len(sharding.usable_devices(n_models, batch_size, devices)) == want, n
    e, d = sharding.mesh_shape(n_models, batch_size, want)
    assert e * d == want and n_models % e == 0 and batch_size % d == 0
    assert e == max(
      k
      for k in range(1, want + 1)
      if want % k == 0 and n_models % k == 0 and batch_size % (want // k) == 0
    )


def test_huge_counts_answer_at_once():
  """At 10⁹ devices: a usable-device count, a mesh and a list schedule of a few groups (each
  looped to the value before)."""
  assert list_schedule.usable_device_count(4, 16, 1_000_000_000) == 64
  # E = 2^9·5^9, B = 2^10·5^9: the largest 2^a·5^b below 10⁹ is 2^2·5^12
  assert list_schedule.usable_device_count(10**9, 2 * 10**9, 10**9 - 1) == 976_562_500
  assert sharding.mesh_shape(1_000_000_000, 1, 1_000_000_000) == (1_000_000_000, 1)
  entries = [(f"g{i}", 1, 10.0 * (i + 1)) for i in range(3)]
  schedule = list_schedule.simulate(entries, 1_000_000_000, 1)
  assert [(s.group, s.worker, s.start_s) for s in schedule.slots] == [
    ("g0", 0, 0.0),
    ("g1", 1, 0.0),
    ("g2", 2, 0.0),
  ]
