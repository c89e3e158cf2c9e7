"""ihsweep/base/environment.py: every environment variable the tool reads is checked when a command
starts — one line naming it, its value and what is allowed, exit status 2, nothing created."""

import os

import pytest

from ihsweep import cli
from ihsweep.base import environment


def _main(capsys, *args):
  code = cli.main(["ihsweep", *args])
  return code, capsys.readouterr().err


BAD = [
  ("IHSWEEP_CLAIM_HEARTBEAT_S", "abc", "a finite number of seconds > 0"),
  ("IHSWEEP_CLAIM_HEARTBEAT_S", "inf", "a finite number of seconds > 0"),
  ("IHSWEEP_CLAIM_STALE_S", "-3", "a finite number of seconds > 0"),
  (
    "IHSWEEP_CLAIM_STALE_S",
    "5",
    "at least 3 claim heartbeats (3 × IHSWEEP_CLAIM_HEARTBEAT_S = 30 s)",
  ),
  ("IHSWEEP_DEVICE_MEMORY", "abc", "a number of bytes from 1 to 2^63 - 1"),
  ("IHSWEEP_DEVICE_MEMORY", "inf", "a number of bytes from 1 to 2^63 - 1"),
  ("IHSWEEP_DEVICE_MEMORY", "1e30", "a number of bytes from 1 to 2^63 - 1"),
  ("IHSWEEP_GPUS_PER_HOST", "0", "a whole number of GPUs >= 1"),
  ("IHSWEEP_GPUS_PER_HOST", "abc", "a whole number of GPUs >= 1"),
  ("IHSWEEP_HEARTBEAT_S", "0", "a finite number of seconds > 0"),
  ("IHSWEEP_NUM_PROCESSES", "two", "a whole number of processes >= 1"),
  ("IHSWEEP_NUM_PROCESSES", "2", "set only with IHSWEEP_COORDINATOR"),
  ("IHSWEEP_COORDINATOR", "localhost", "host:port"),
  ("IHSWEEP_LOCAL_DEVICE_IDS", "0,0", "distinct device ids"),
  ("IHSWEEP_DISTRIBUTED", "yes", "1 (JAX detects the cluster"),
]


@pytest.mark.parametrize("name,value,allowed", BAD)
def test_a_bad_variable_is_one_line_before_anything(
  tmp_path, monkeypatch, capsys, name, value, allowed
):
  monkeypatch.setenv(name, value)
  workdir = tmp_path / "run"
  code, err = _main(capsys, "status", f"--workdir={workdir}")
  assert code == 2
  assert err == f"ihsweep: {name}={value!r} is not allowed: {err.split('allowed: ', 1)[1]}"
  assert allowed in err and len(err.splitlines()) == 1
  assert not workdir.exists()


@pytest.mark.parametrize("kind", ["file", "read-only"])
def test_a_cache_that_cannot_be_written_is_refused_at_start(tmp_path, monkeypatch, capsys, kind):
  if kind == "file":
    path = tmp_path / "afile"
    path.write_text("x")
  else:
    if os.geteuid() == 0:
      pytest.skip("root writes into a read-only directory")
    path = tmp_path / "ro"
    path.mkdir()
    path.chmod(0o500)
  monkeypatch.setenv("IHSWEEP_CACHE", str(path))
  code, err = _main(capsys, "predict", "--batch_size=8", "--context_size=64")
  assert code == 2 and err.startswith(f"ihsweep: IHSWEEP_CACHE={str(path)!r} is not allowed: a ")
  assert "directory this user can write" in err


def test_a_cache_that_can_become_a_directory_is_allowed(tmp_path, monkeypatch):
  monkeypatch.setenv("IHSWEEP_CACHE", str(tmp_path / "new" / "cache"))
  environment.check()
  assert environment.get("IHSWEEP_CACHE") == str(tmp_path / "new" / "cache")
  assert os.listdir(tmp_path / "new" / "cache") == []  # created, its probe file removed
  monkeypatch.setenv("IHSWEEP_CACHE", "/proc/nope")  # writable by permissions for root, not in fact
  with pytest.raises(environment.EnvironmentVariableError, match="IHSWEEP_CACHE='/proc/nope'"):
    environment.check()


def test_process_id_must_be_below_the_count_and_stale_after_heartbeats(monkeypatch):
  monkeypatch.setenv("IHSWEEP_NUM_PROCESSES", "2")
  with pytest.raises(environment.EnvironmentVariableError, match="only with IHSWEEP_COORDINATOR"):
    environment.check()  # it would run alone
  monkeypatch.setenv("IHSWEEP_COORDINATOR", "localhost:1234")
  monkeypatch.setenv("IHSWEEP_PROCESS_ID", "2")
  with pytest.raises(environment.EnvironmentVariableError, match="below IHSWEEP_NUM_PROCESSES"):
    environment.check()
  monkeypatch.setenv("IHSWEEP_PROCESS_ID", "1")
  environment.check()
  monkeypatch.setenv("IHSWEEP_CLAIM_HEARTBEAT_S", "0.5")
  monkeypatch.setenv("IHSWEEP_CLAIM_STALE_S", "1.5")
  assert environment.claim_stale_s() == 1.5
  monkeypatch.setenv("IHSWEEP_CLAIM_STALE_S", "1.4")
  with pytest.raises(environment.EnvironmentVariableError, match="at least 3 claim heartbeats"):
    environment.check()
  monkeypatch.delenv("IHSWEEP_CLAIM_STALE_S")
  assert environment.claim_stale_s() == 6.0  # 12 heartbeats


def test_distributed_outside_a_cluster_is_one_line(tmp_path, monkeypatch, capsys):
  """JAX's own error ("coordinator_address should be defined") came from inside
  jax.distributed.initialize; now the run is refused before its directory exists."""
  for name in list(os.environ):
    if name.startswith(("SLURM_", "OMPI_", "KUBERNETES_", "IHSWEEP_COORDINATOR")):
      monkeypatch.delenv(name)
  monkeypatch.setenv("IHSWEEP_DISTRIBUTED", "1")
  workdir = tmp_path / "run"
  code, err = _main(capsys, "run", "--config=configs/demo.py", f"--workdir={workdir}")
  assert code == 2 and len(err.splitlines()) == 1, err
  assert err.startswith("ihsweep: IHSWEEP_DISTRIBUTED='1' is not allowed: 1 only inside a cluster")
  assert "launch/local_multiprocess.sh" in err and not workdir.exists()
  monkeypatch.setenv("SLURM_JOB_ID", "7")  # JAX's SLURM detection needs all five
  for name, value in (("SLURM_STEP_NODELIST", "n1"), ("SLURM_NTASKS", "1"), ("SLURM_PROCID", "0")):
    monkeypatch.setenv(name, value)
  monkeypatch.setenv("SLURM_LOCALID", "0")
  assert environment.distributed_cluster() == "SlurmCluster"


def test_every_variable_the_code_reads_is_listed():
  """A new ``os.environ`` read of an IHSWEEP_ variable in the package goes through
  ``environment``, so it is checked at start: no module but environment reads one directly."""
  root = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ihsweep")
  found = []
  for here, _, files in os.walk(root):
    for name in files:
      if name.endswith(".py") and name != "environment.py":
        text = open(os.path.join(here, name)).read()
        for line in text.splitlines():
          if ("os.environ" in line or "getenv" in line) and "IHSWEEP_" in line:
            found.append(f"{name}: {line.strip()}")
  assert not found, found


def test_the_docs_list_every_variable_as_the_module_does():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  text = open(os.path.join(root, "docs", "usage.md")).read()
  assert environment.reference_table() in text
