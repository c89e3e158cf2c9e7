"""``python tests/storage_faults.py KIND STEP [GROUP [PROCESS]] -- ARGS``: the ``ihsweep ARGS``
command whose full-state save at update STEP (in the run directory named GROUP, a sweep's group,
if given; in process PROCESS of a jax.distributed job, if given) meets a fault. The tests' fault
injection, kept out of the product: it patches the writer, ``RunCheckpoints.save_state``. As a
launcher's ``IHSWEEP`` (``launch/local_multiprocess.sh``) it runs in every process it starts.

KIND:

* ``KILL``: the process is SIGKILLed right after the save has started (its asynchronous write
  possibly unfinished): a crash, a preemption without warning, the OOM killer.
* ``TERM``: the process is sent SIGTERM right after the save has started: a stop request (a
  scheduler's preemption notice), which it handles (not a fault: the save goes on).

* ``ENOSPC``: the save raises what orbax raises on a full disk (tried on a 2 MB tmpfs): a
  ``ValueError`` from tensorstore, ``RESOURCE_EXHAUSTED: … No space left on device
  [os_error_code='28']``.
* ``EFBIG``: a real one: the process's file-size limit (``RLIMIT_FSIZE``, as ``ulimit -f`` sets
  it) drops to 4 KB just before the save (below every file it writes), so tensorstore's write
  fails (``… File too large [os_error_code='27']``, asynchronously where saves are; Python
  ignores SIGXFSZ, so the write fails instead of the process being killed).
* any other errno name (``EROFS``, ``EIO``): the save raises ``OSError(errno.KIND)``, as a write
  from Python would.

``KIND1,KIND2 STEP GROUP1,GROUP2``: group GROUP1's save meets KIND1, GROUP2's KIND2 (each
patch wraps the one before).
"""

import errno
import os
import resource
import signal
import sys

import jax

from ihsweep import cli
from ihsweep.runs import checkpoint


def _failing(kind: str, at: int, group: str | None, process: int | None):
  save = checkpoint.RunCheckpoints.save_state

  def save_state(self, step, state, extra=None):
    here = os.path.basename(os.path.dirname(os.path.normpath(self.directory)))
    elsewhere = process is not None and jax.process_index() != process
    if step != at or (group and here != group) or elsewhere:
      return save(self, step, state, extra)
    if kind in ("KILL", "TERM"):
      saved = save(self, step, state, extra)
      os.kill(os.getpid(), getattr(signal, f"SIG{kind}"))
      return saved
    if kind == "ENOSPC":
      tmp = os.path.join(self.directory, "state", f"{step}.orbax-checkpoint-tmp")
      raise ValueError(
        f'RESOURCE_EXHAUSTED: Error writing local file "{tmp}/_sharding": Failed '
        f'writing: "{tmp}/_sharding.__lock": Failed to write 6231 bytes to file 7: '
        f"No space left on device [os_error_code='28']"
      )
    if kind == "EFBIG":
      nbytes = sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(state))
      self.wait()  # the earlier saves complete (asynchronous ones may still be writing)
      # Below every file the save writes: orbax splits the state over OCDBT data files whose
      # sizes vary from run to run (a tiny run's largest: 69 KB of a 178 KB state one time, 97
      # KB the next), so a limit of half the state's bytes let the save through about half the
      # time. 4 KB stops its metadata files too (11-12 KB). A record that grows past it (the
      # metrics, 7 KB by update 40) meets the same limit: a storage fault all the same.
      limit = min(4096, nbytes // 2)
      resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
      return save(self, step, state, extra)
    code = getattr(errno, kind)
    raise OSError(code, os.strerror(code), os.path.join(self.directory, "state"))

  return save_state


if __name__ == "__main__":
  split = sys.argv.index("--")
  kind, at, *where = sys.argv[1:split]
  group, process = (where + [None, None])[:2]
  if "," in kind:  # KIND1,KIND2 STEP GROUP1,GROUP2: each group's save meets its own fault
    for k, g in zip(kind.split(","), group.split(","), strict=True):
      checkpoint.RunCheckpoints.save_state = _failing(k, int(at), g, None)
  else:
    checkpoint.RunCheckpoints.save_state = _failing(
      kind, int(at), group or None, None if process is None else int(process)
    )
  sys.exit(cli.main(["ihsweep", *sys.argv[split + 1 :]]))
