"""``python tests/counting.py OUT.json -- ARGS``: the ``ihsweep ARGS`` command, counting per group
how often this process resolves it (``runner.resolve``), checks its memory
(``memory.check_possible``), chooses its memory setting (``runner.resolve_memory``: compiled
against the devices' capacity on GPUs and TPUs) and builds its programs (a ``ResolvedGroup``'s
parts: each build traces and compiles them once); written to OUT.json as ``{what: {group id:
count}}`` when the command returns. The tests' instrument, kept out of the product (as
tests/storage_faults.py): it wraps the functions it counts."""

import collections
import json
import re
import sys
import threading

from ihsweep import cli
from ihsweep.commands.common import start_logging

start_logging()  # before the training stack's imports configure logging their way
from ihsweep.training import memory, runner  # noqa: E402

COUNTS: dict = collections.defaultdict(collections.Counter)
_LOCK = threading.Lock()


def _count(what: str, group) -> None:
  with _LOCK:
    COUNTS[what][str(group)] += 1


def _group_of(name: str) -> str:
  found = re.search(r"g\d{3}", name or "")
  return found.group(0) if found else str(name)


def _wrap() -> None:
  resolve, check, choose = runner.resolve, memory.check_possible, runner.resolve_memory
  parts = runner.ResolvedGroup.parts

  def counted_resolve(cfg, *args, group_id=None, **kwargs):
    _count("resolve", group_id)
    return resolve(cfg, *args, group_id=group_id, **kwargs)

  def counted_check(cfg, devices, name, *args, **kwargs):
    _count("check_possible", _group_of(name))
    return check(cfg, devices, name, *args, **kwargs)

  def counted_choose(cfg, devices, name="the run", *args, **kwargs):
    _count("resolve_memory", _group_of(name))
    return choose(cfg, devices, name, *args, **kwargs)

  def counted_parts(self):
    with self._lock:
      fresh = not self._built
    if fresh:
      _count("build", self.id)
    return parts(self)

  runner.resolve, memory.check_possible = counted_resolve, counted_check
  runner.resolve_memory, runner.ResolvedGroup.parts = counted_choose, counted_parts


if __name__ == "__main__":
  split = sys.argv.index("--")
  (out,) = sys.argv[1:split]
  _wrap()
  code = cli.main(["ihsweep", *sys.argv[split + 1 :]])
  with open(out, "w") as f:
    json.dump({k: dict(v) for k, v in COUNTS.items()}, f)
  sys.exit(code)
