"""Every environment variable ihsweep's Python code reads, read and checked in one place.

``check()`` runs when a command starts (``ihsweep.cli.main``), before anything is created or
compiled: a value out of its range ends the command with one line naming the variable, its
value and what is allowed (``EnvironmentVariableError``, exit status 2). The code that uses a
variable reads it with ``get(name)``, which applies the same rule, so a value is never trusted
in one place and refused in another. The launchers' own variables (``IHSWEEP_GPUS``,
``IHSWEEP_PORT``, ``IHSWEEP_REPO``, …) are checked by the shell scripts that read them.

A leaf module: importing it imports nothing of JAX (``distributed_cluster`` imports JAX's cluster
detection when ``IHSWEEP_DISTRIBUTED`` asks for it).
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

from ihsweep.base.errors import IhsweepError


class EnvironmentVariableError(IhsweepError, ValueError):
  """An environment variable ihsweep reads holds a value it cannot use; the message is one
  line: ``NAME='value' is not allowed: what is``."""

  def __init__(self, name: str, value: str, allowed: str):
    self.name, self.value, self.allowed = name, value, allowed
    super().__init__(f"{name}={value!r} is not allowed: {allowed}")


def _number(kind: type, low: float, *, strict: bool = False) -> Callable[[str], Any]:
  """A parser of ``kind`` (int or float) >= ``low`` (> ``low`` when ``strict``), finite."""

  def parse(text: str):
    value = float(text) if kind is float else int(text.strip())
    if not math.isfinite(value) or value < low or (strict and value == low):
      raise ValueError
    return value

  return parse


def _bytes(text: str) -> int:
  """A byte count in [1, 2^63), written as an integer or in floating point (``80e9``)."""
  value = float(text)
  if not math.isfinite(value) or value < 1 or value >= 2**63:
    raise ValueError
  return int(value)


def _address(text: str) -> str:
  host, sep, port = text.strip().rpartition(":")
  if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
    raise ValueError
  return text.strip()


def _device_ids(text: str) -> list[int]:
  ids = [int(x) for x in text.split(",")]
  if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
    raise ValueError
  return ids


def _flag(text: str) -> bool:
  if text.strip() not in ("0", "1"):
    raise ValueError
  return text.strip() == "1"


def _path(text: str) -> str:
  return os.path.abspath(os.path.expanduser(text))


def _writable_directory(path: str) -> None:
  """``check``'s test of a directory: created if missing, and a file written and removed in it
  (permissions alone do not tell: root passes them on /proc). Raises ``ValueError``."""
  import tempfile

  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".ihsweep-probe-"):
      pass
  except OSError:
    raise ValueError from None


@dataclasses.dataclass(frozen=True)
class Variable:
  """One variable: ``parse`` turns its text into the value (raising ``ValueError`` when the
  text is not allowed, as ``allowed`` says); ``default`` is the value when it is unset or
  empty; ``verify`` (optional) tests the value against the machine once, in ``check``, where
  that needs I/O (``get``, called wherever the value is used, only parses)."""

  name: str
  parse: Callable[[str], Any]
  allowed: str
  default: Any
  help: str
  verify: Callable[[Any], None] | None = None


_SECONDS = "a finite number of seconds > 0"
# A claim is refreshed every heartbeat; a stale time of fewer heartbeats than this would let a
# live worker's claim look stale between two refreshes.
MIN_STALE_HEARTBEATS = 3
VARIABLES = {
  v.name: v
  for v in (
    Variable(
      "IHSWEEP_CACHE",
      _path,
      "a directory this user can write, or a path where one can be created",
      None,
      "the cache root: corpora, tokenized corpora, the XLA compilation cache (ihsweep.data.cache)",
      _writable_directory,
    ),
    Variable(
      "IHSWEEP_COMPILED_TIMES",
      _path,
      "a directory path",
      None,
      "where `ihsweep plan --target` keeps each group's compiled seconds per update, which "
      "the FLOPs plan and `ihsweep run`'s auto layout on that chip read "
      "(ihsweep.planning.compiled_times; default $IHSWEEP_CACHE/compiled/times)",
    ),
    Variable(
      "IHSWEEP_CLAIM_HEARTBEAT_S",
      _number(float, 0, strict=True),
      _SECONDS,
      10.0,
      "seconds between a sweep worker's claim refreshes (ihsweep.runs.claims)",
    ),
    Variable(
      "IHSWEEP_CLAIM_STALE_S",
      _number(float, 0, strict=True),
      _SECONDS,
      None,  # 12 heartbeats: stale_after_s()
      "seconds without a refresh after which a claim is stale (default 12 heartbeats; at "
      f"least {MIN_STALE_HEARTBEATS} heartbeats)",
    ),
    Variable(
      "IHSWEEP_DEVICE_MEMORY",
      _bytes,
      "a number of bytes from 1 to 2^63 - 1 (e.g. 80e9)",
      None,
      "bytes a program may use per device, instead of what the device reports "
      "(ihsweep.training.memory)",
    ),
    Variable(
      "IHSWEEP_GPUS_PER_HOST",
      _number(int, 1),
      "a whole number of GPUs >= 1",
      8,
      "GPUs per host of a GPU --target for `ihsweep plan` (ihsweep.planning.toolchain)",
    ),
    Variable(
      "IHSWEEP_COORDINATOR",
      _address,
      "host:port of process 0 (e.g. localhost:12345)",
      None,
      "jax.distributed coordinator; with IHSWEEP_NUM_PROCESSES and IHSWEEP_PROCESS_ID",
    ),
    Variable(
      "IHSWEEP_NUM_PROCESSES",
      _number(int, 1),
      "a whole number of processes >= 1",
      1,
      "processes of the jax.distributed job",
    ),
    Variable(
      "IHSWEEP_PROCESS_ID",
      _number(int, 0),
      "a whole number >= 0, below IHSWEEP_NUM_PROCESSES",
      0,
      "this process's index in the jax.distributed job",
    ),
    Variable(
      "IHSWEEP_DISTRIBUTED",
      _flag,
      "1 (JAX detects the cluster: SLURM, Open MPI, Cloud TPU, Kubernetes) or 0",
      False,
      "jax.distributed with JAX's own cluster detection",
    ),
    Variable(
      "IHSWEEP_HEARTBEAT_S",
      _number(float, 0, strict=True),
      _SECONDS,
      100.0,
      "seconds the processes of a job wait for a silent one (ihsweep.base.sharding)",
    ),
    Variable(
      "IHSWEEP_LOCK_TIMES",
      _path,
      "a file path",
      None,
      "a file to which each brief lock's hold and wait are appended (ihsweep run; "
      "benchmarks/claims_lock.py)",
    ),
    Variable(
      "IHSWEEP_LOCAL_DEVICE_IDS",
      _device_ids,
      "distinct device ids >= 0, comma-separated (e.g. 0,1)",
      None,
      "the local_device_ids this process passes to jax.distributed.initialize",
    ),
  )
}


def _raw(name: str) -> str | None:
  text = os.environ.get(name)
  return text if text is not None and text.strip() != "" else None


def get(name: str):
  """The value of variable ``name`` (its default when unset or empty).

  Raises:
    EnvironmentVariableError: the value is not allowed (the message says what is).
    KeyError: ``name`` is not one of ``VARIABLES``.
  """
  var = VARIABLES[name]
  text = _raw(name)
  if text is None:
    return var.default
  try:
    return var.parse(text)
  except (ValueError, OverflowError):
    raise EnvironmentVariableError(name, text, var.allowed) from None


def claim_heartbeat_s() -> float:
  return get("IHSWEEP_CLAIM_HEARTBEAT_S")


def claim_stale_s() -> float:
  """``IHSWEEP_CLAIM_STALE_S``, default 12 heartbeats.

  Raises:
    EnvironmentVariableError: below ``MIN_STALE_HEARTBEATS`` heartbeats (a live worker's claim
      would look stale between two refreshes).
  """
  beat, stale = claim_heartbeat_s(), get("IHSWEEP_CLAIM_STALE_S")
  if stale is None:
    return 12 * beat
  if stale < MIN_STALE_HEARTBEATS * beat:
    raise EnvironmentVariableError(
      "IHSWEEP_CLAIM_STALE_S",
      os.environ["IHSWEEP_CLAIM_STALE_S"],
      f"at least {MIN_STALE_HEARTBEATS} claim heartbeats "
      f"({MIN_STALE_HEARTBEATS} × IHSWEEP_CLAIM_HEARTBEAT_S = {MIN_STALE_HEARTBEATS * beat:g} s): "
      "a live worker's claim would look stale between two refreshes",
    )
  return stale


def distributed_cluster() -> str:
  """The cluster JAX's own detection finds for ``IHSWEEP_DISTRIBUTED=1`` (its class name).

  JAX's detectors are asked, except that a Cloud TPU VM is taken as found without querying its
  metadata server (JAX queries it when it initialises).

  Raises:
    EnvironmentVariableError: JAX detects no cluster here.
  """
  from jax._src import clusters
  from jax._src.cloud_tpu_init import running_in_cloud_tpu_vm

  if running_in_cloud_tpu_vm:
    return "Cloud TPU VM"
  for env in clusters.ClusterEnv._cluster_types:
    if env.opt_in_only_method or "Tpu" in env.__name__:
      continue
    try:
      if env.is_env_present():
        return env.__name__
    except Exception:  # noqa: BLE001 — a detector that cannot tell finds nothing
      continue
  raise EnvironmentVariableError(
    "IHSWEEP_DISTRIBUTED",
    os.environ.get("IHSWEEP_DISTRIBUTED", ""),
    "1 only inside a cluster JAX detects (a SLURM step: srun; Open MPI: mpirun; a Cloud TPU "
    "pod; Kubernetes); none is here — for processes on one machine use "
    "launch/local_multiprocess.sh (IHSWEEP_COORDINATOR)",
  )


def reference_table() -> str:
  """The markdown table of ``VARIABLES`` that docs/usage.md holds (a test keeps them equal)."""
  rows = ["| variable | allowed | default | what it sets |", "|---|---|---|---|"]
  for v in VARIABLES.values():
    default = {
      "IHSWEEP_CACHE": "`$XDG_CACHE_HOME/ihsweep`, else `~/.cache/ihsweep`",
      "IHSWEEP_CLAIM_STALE_S": "12 heartbeats",
    }.get(
      v.name,
      "unset"
      if v.default is None
      else f"`{int(v.default)}`"
      if isinstance(v.default, bool)
      else f"`{v.default}`",
    )
    rows.append(f"| `{v.name}` | {v.allowed} | {default} | {v.help} |")
  return "\n".join(rows)


def check(*, distributed: bool = False) -> None:
  """Checks every variable of ``VARIABLES`` that is set (its ``verify`` too), and those that
  depend on each other (the claims' stale time against their heartbeat, the process id against
  the count); with
  ``distributed`` (commands that train) also that ``IHSWEEP_DISTRIBUTED=1`` finds a cluster.

  Raises:
    EnvironmentVariableError: the first variable whose value is not allowed.
  """
  for name, var in VARIABLES.items():
    value = get(name)
    if var.verify is not None and value is not None:
      try:
        var.verify(value)
      except ValueError:
        raise EnvironmentVariableError(name, os.environ[name], var.allowed) from None
  claim_stale_s()
  if _raw("IHSWEEP_PROCESS_ID") is not None and get("IHSWEEP_PROCESS_ID") >= get(
    "IHSWEEP_NUM_PROCESSES"
  ):
    raise EnvironmentVariableError(
      "IHSWEEP_PROCESS_ID",
      os.environ["IHSWEEP_PROCESS_ID"],
      f"below IHSWEEP_NUM_PROCESSES ({get('IHSWEEP_NUM_PROCESSES')})",
    )
  for name in ("IHSWEEP_NUM_PROCESSES", "IHSWEEP_PROCESS_ID"):
    if _raw(name) is not None and get("IHSWEEP_COORDINATOR") is None:
      raise EnvironmentVariableError(
        name,
        os.environ[name],
        "set only with IHSWEEP_COORDINATOR (host:port of the job's process 0); without it "
        "this process would run alone",
      )
  if distributed and get("IHSWEEP_DISTRIBUTED") and get("IHSWEEP_COORDINATOR") is None:
    distributed_cluster()
