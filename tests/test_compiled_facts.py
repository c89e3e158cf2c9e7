"""ihsweep.training.compiled_facts: a program compiled once per target, its facts read back."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from ihsweep.training import compiled_facts, memory


def _lowered(n: int = 64):
  x = jax.ShapeDtypeStruct((n, n), jnp.float32)
  return jax.jit(lambda a: jnp.tanh(a @ a).sum(0)).lower(x)


class _Counting:
  """A ``jax.stages.Lowered`` that counts its compiles."""

  def __init__(self, lowered):
    self.lowered, self.compiles = lowered, 0

  def compile(self):
    self.compiles += 1
    return self.lowered.compile()

  def __getattr__(self, name):
    return getattr(self.lowered, name)


def test_a_program_is_compiled_once_per_target_and_its_facts_read_back(tmp_path, monkeypatch):
  facts = compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path))
  program = _Counting(_lowered())
  first = facts.analyse(program, 1, count_kernels=lambda text: text.count("fusion"))
  assert program.compiles == 1 and (facts.hits, facts.misses) == (0, 1)
  compiled = _lowered().compile()
  expected = dataclasses.replace(
    memory.analyse(compiled, _lowered()), kernels_per_update=compiled.as_text().count("fusion")
  )
  assert first == expected and first.argument_bytes == 64 * 64 * 4
  again = facts.analyse(program, 1, count_kernels=lambda text: text.count("fusion"))
  assert again == first and program.compiles == 1 and (facts.hits, facts.misses) == (1, 1)
  (entry,) = tmp_path.iterdir()
  assert json.loads(entry.read_text())["argument_bytes"] == 64 * 64 * 4
  # Anything the compile depends on is in the key: another program, target, capacity, device
  # count, XLA_FLAGS or plugin version compiles again.
  for other in (
    lambda: (compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path)), _lowered(32), 1),
    lambda: (compiled_facts.CompiledFacts("tpu test", 1 << 30, str(tmp_path)), _lowered(), 1),
    lambda: (compiled_facts.CompiledFacts("cpu test", 1 << 31, str(tmp_path)), _lowered(), 1),
    lambda: (compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path)), _lowered(), 2),
    # the same 2 devices spanning 2 hosts
    lambda: (compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path), 1), _lowered(), 2),
  ):
    f, lowered, n = other()
    f.analyse(lowered, n)
    assert f.misses == 1
  # The target's size is not: a program on one device of a host of 8 is the one-device program.
  f = compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path), devices_per_host=8)
  assert f.analyse(_lowered(), 1, count_kernels=lambda text: 0) == first
  assert (f.hits, f.misses) == (1, 0)
  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nonexistent-never-written")
  f = compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path))
  f.analyse(_lowered(), 1)
  assert (f.hits, f.misses) == (0, 1)


def test_a_new_compiler_version_or_a_damaged_entry_compiles_again(tmp_path, monkeypatch):
  facts = compiled_facts.CompiledFacts("cpu test", 1 << 30, str(tmp_path))
  first = facts.analyse(_lowered(), 1)
  (entry,) = tmp_path.iterdir()
  entry.write_text('{"argument_bytes": 1')  # cut short
  program = _Counting(_lowered())
  assert facts.analyse(program, 1) == first and program.compiles == 1
  versions = compiled_facts._versions()
  monkeypatch.setattr(compiled_facts, "_versions", lambda: {**versions, "libtpu": "0.0.99"})
  program = _Counting(_lowered())
  assert facts.analyse(program, 1) == first and program.compiles == 1
  assert len(list(tmp_path.iterdir())) == 2


def test_resource_exhausted_is_kept_and_other_compiler_errors_are_raised(tmp_path):
  class Refused(_Counting):
    def __init__(self, lowered, message):
      super().__init__(lowered)
      self.message = message

    def compile(self):
      self.compiles += 1
      raise RuntimeError(self.message)

  facts = compiled_facts.CompiledFacts("tpu test", 16 << 30, str(tmp_path))
  big = Refused(_lowered(), "RESOURCE_EXHAUSTED: HLO temporaries 43.71G exceed available HBM")
  found = facts.analyse(big, 1)
  assert found.temp_bytes == int(43.71 * (1 << 30)) and found.peak_bytes == found.temp_bytes
  assert facts.analyse(big, 1) == found and big.compiles == 1
  bad = Refused(_lowered(48), "INTERNAL: the compiler crashed")
  with pytest.raises(RuntimeError, match="INTERNAL"):
    facts.analyse(bad, 1)
  with pytest.raises(RuntimeError, match="INTERNAL"):  # an error is never kept
    facts.analyse(bad, 1)
  assert bad.compiles == 2 and len(list(tmp_path.iterdir())) == 1


def test_without_a_directory_nothing_is_kept(tmp_path):
  facts = compiled_facts.CompiledFacts("cpu test", 1 << 30, directory=None)
  program = _Counting(_lowered())
  facts.analyse(program, 1)
  facts.analyse(program, 1)
  assert program.compiles == 2 and facts.hits == 0
