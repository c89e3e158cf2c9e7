"""ihsweep/runs/claims.py: the one rule of a takeover — the group directory's lock, not the
claim's heartbeat, says whether its worker lives."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from ihsweep.base import atomic
from ihsweep.runs import claims, ownership, rundir

HOLD_LOCK = """
import fcntl, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.seek(0); f.truncate(); f.write("pid %d on elsewhere" % __import__("os").getpid()); f.flush()
print("locked", flush=True)
time.sleep(600)
"""


def _stale_claim(workdir, group_id, pid):
  """A claim of another worker on this host (a live ``pid``) whose heartbeat is long past."""
  path = os.path.join(workdir, "groups", group_id, claims.CLAIM_FILE)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  claim = {"worker": f"{socket.gethostname()}:{pid}", "host": socket.gethostname(), "pid": pid}
  with open(path, "w") as f:
    json.dump({**claim, "heartbeat": time.time() - 3600}, f)


@pytest.fixture
def holder(tmp_path):
  """A live process holding ``groups/g000``'s directory lock (as a worker training it does)."""
  group = tmp_path / "groups" / "g000"
  group.mkdir(parents=True)
  proc = subprocess.Popen(
    [sys.executable, "-c", HOLD_LOCK, str(group / atomic.LOCK_FILE)],
    stdout=subprocess.PIPE,
    text=True,
  )
  assert proc.stdout.readline().strip() == "locked"
  yield proc
  proc.kill()
  proc.wait()


def test_a_stale_claim_whose_directory_is_held_is_not_taken_over(tmp_path, holder):
  workdir = str(tmp_path)
  _stale_claim(workdir, "g000", holder.pid)
  assert claims.claim_is_stale(claims.read_claim(workdir, "g000"))  # by its heartbeat
  assert (
    atomic.lock_holder(os.path.join(workdir, "groups", "g000")) == f"pid {holder.pid} on elsewhere"
  )
  assert claims.try_claim(workdir, "g000", ["cpu:0"]) is None  # its worker lives: left to it
  assert claims.read_claim(workdir, "g000")["pid"] == holder.pid
  holder.kill()  # the lock dies with its process: now the group is taken over
  holder.wait()
  assert atomic.lock_holder(os.path.join(workdir, "groups", "g000")) is None
  assert claims.try_claim(workdir, "g000", ["cpu:0"]) == "taken over"
  assert claims.holds_claim(workdir, "g000")


def test_the_lock_holder_reclaims_a_claim_taken_while_it_was_silent(tmp_path):
  """A worker paused past the stale time whose claim another worker took (it could not lock the
  directory, so it cannot train the group) writes its claim back at its next heartbeat."""
  workdir = str(tmp_path)
  group = rundir.group_dir(workdir, "g000")
  with ownership.workdir_lock(group, local=True):
    _stale_claim(workdir, "g000", 1)  # the claim now names another worker
    assert not claims.holds_claim(workdir, "g000")
    assert claims.refresh_claim(workdir, "g000")
    assert claims.holds_claim(workdir, "g000")
  log = [json.loads(line) for line in open(tmp_path / claims.CLAIMS_LOG)]
  assert log[-1]["event"] == "reclaimed" and log[-1]["previous"] == f"{socket.gethostname()}:1"
  _stale_claim(workdir, "g000", 1)  # without the lock a lost claim stays lost
  assert not claims.refresh_claim(workdir, "g000")


def test_a_probe_never_makes_the_owner_fail_to_lock(tmp_path):
  """``lock_holder`` takes a free lock for an instant; ``workdir_lock`` retries through that."""
  group = str(tmp_path / "g")
  os.makedirs(group)
  probing = subprocess.Popen(
    [
      sys.executable,
      "-c",
      "import sys; from ihsweep.runs import atomic\n"
      "for _ in range(3000): atomic.lock_holder(sys.argv[1])",
      group,
    ]
  )
  try:
    for _ in range(50):
      with ownership.workdir_lock(group, local=True):
        pass
  finally:
    probing.wait()


def test_of_many_workers_taking_over_one_stale_claim_exactly_one_wins(tmp_path):
  """Claims take no lock: 8 thread workers try to take over the same stale claim at once (a
  silent worker's, no directory lock), 20 times; each time exactly one gets the group ("taken
  over", or "claimed" where it found the stale claim already moved aside by another), the claim
  names it, and claims.jsonl logs one event per round."""
  import threading

  workdir = str(tmp_path)
  for round_ in range(20):
    _stale_claim(workdir, "g000", 1)  # pid 1 is alive but not ours; its heartbeat long past
    barrier, results = threading.Barrier(8), {}

    def take(index):
      claims.set_thread_worker(index)
      barrier.wait()
      results[index] = claims.try_claim(workdir, "g000", ["cpu:0"])
      results[f"name{index}"] = claims.worker_id()

    threads = [threading.Thread(target=take, args=(i,)) for i in range(8)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    winners = [i for i in range(8) if results[i] is not None]
    assert len(winners) == 1, (round_, results)
    assert all(results[i] is None for i in range(8) if i not in winners)
    assert claims.read_claim(workdir, "g000")["worker"] == results[f"name{winners[0]}"]
  rows = [json.loads(line) for line in open(tmp_path / claims.CLAIMS_LOG)]
  assert len(rows) == 20 and {r["event"] for r in rows} <= {"taken over", "claimed"}
  assert sum(r["event"] == "taken over" for r in rows) >= 10  # mostly a takeover proper
  leftovers = set(os.listdir(tmp_path / "groups" / "g000")) - {claims.CLAIM_FILE}
  assert not leftovers, leftovers  # no temporary or moved-aside file stays behind


def test_a_directory_lock_taken_by_a_thread_worker_names_it(tmp_path):
  """A thread of worker 2 of its process writes ``, worker w2`` into the group directory's
  lock it takes (what another worker's "left to it" line and ``ihsweep status`` name)."""
  import threading

  seen = []

  def worker():
    claims.set_thread_worker(2)
    with ownership.workdir_lock(str(tmp_path / "g"), local=True):
      seen.append(atomic.lock_holder(str(tmp_path / "g")))

  t = threading.Thread(target=worker)
  t.start()
  t.join()
  assert seen == [f"pid {os.getpid()} on {socket.gethostname()}, worker w2"]


def test_rewrite_when_free_never_waits_and_the_holder_rewrites_for_others(tmp_path):
  """A writer that finds the derived file's lock held returns at once; the holder, seeing the
  request left beside the lock, rewrites once more after its own write."""
  lock = str(tmp_path / ".derived.lock")
  writes = []
  inner = []

  def nested_write():
    writes.append("holder")
    if len(writes) == 1:  # a second writer arrives while the first holds the lock
      start = time.monotonic()
      inner.append(atomic.rewrite_when_free(lock, lambda: writes.append("other")))
      assert time.monotonic() - start < 0.5

  assert atomic.rewrite_when_free(lock, nested_write)
  assert inner == [False] and writes == ["holder", "holder"]
  assert not os.path.exists(lock + ".again")
