"""Whether workers ever wait on each other's locks: one `ihsweep run` of 8 groups with the auto
layout (4 workers of 2 devices side by side) on 8 fake CPU devices, or ``--processes`` such
processes on one run directory, every lock they take recorded (``IHSWEEP_LOCK_TIMES``,
``atomic.brief_lock``: how long it was held and how long its taker waited for it).

  python benchmarks/claims_lock.py [--processes 2] [--updates 200] [--json]

The target (issue 57): no worker waits on another's work; a claims lock, if any, held at most
10 ms at a time. Claims take no lock (``ihsweep.runs.claims``: atomic file creation, renames
and hard links), so no claim lock appears below; the ones that do are the derived files'
(``.cells.lock``, ``.sweep.lock``: held while cells.csv or sweep.json is rebuilt, taken without
waiting, ``atomic.rewrite_when_free``) and ``.prepare.lock`` (held while a new sweep's first
files are written, the one lock a starting worker waits for).

Prints, per lock file: the number of holds, the median, 99th percentile and maximum time held,
and the longest wait (ms).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = [
  "--config=configs/default.py",
  "--noprogress",
  "--config.model.n_layers=1",
  "--config.model.d_mlp=0",
  "--config.model.vocab_size=32",
  "--config.model.max_context=16",
  "--config.model.d_model=8",
  "--config.model.dtype=float32",
  "--config.train.steps_per_call=10",
  "--config.train.batch_size=2",
  "--config.train.context_size=16",
  "--config.eval.every_steps=0",
  "--config.checkpoint.params_schedule=none",
  "--config.ensemble.size=1",
  "--config.sweep.seeds=1",
  "--grid=model.n_heads=1,2",
  "--grid=model.pos_encoding=learned,rotary",
  "--grid=train.b2=0.95,0.99",
]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--processes", type=int, default=1, help="ihsweep run processes")
  parser.add_argument("--updates", type=int, default=200, help="updates per group")
  parser.add_argument("--heartbeat", type=float, default=0.5, help="IHSWEEP_CLAIM_HEARTBEAT_S")
  parser.add_argument("--json", action="store_true", help="one JSON object")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    times = os.path.join(tmp, "lock_times.txt")
    env = {
      **os.environ,
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
      "IHSWEEP_LOCK_TIMES": times,
      "IHSWEEP_CLAIM_HEARTBEAT_S": str(args.heartbeat),
    }
    flags = [
      *FLAGS,
      f"--config.train.num_steps={args.updates}",
      f"--config.checkpoint.state_every_steps={max(args.updates // 4, 1)}",
    ]
    start = time.time()
    procs = [
      subprocess.Popen(
        [sys.executable, "-m", "ihsweep.cli", "run", f"--workdir={tmp}/run", *flags],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
      )  # fmt: skip
      for _ in range(args.processes)
    ]
    for p in procs:
      _, err = p.communicate()
      if p.returncode:
        sys.exit(f"ihsweep run exited {p.returncode}:\n{err[-3000:]}")
    held, waited = collections.defaultdict(list), collections.defaultdict(float)
    with open(times) as f:
      for line in f:
        name, seconds, wait = line.split()
        held[name].append(float(seconds) * 1e3)
        waited[name] = max(waited[name], float(wait) * 1e3)
  out = {"processes": args.processes, "updates": args.updates, "wall_s": round(time.time() - start)}
  for name, ms in sorted(held.items()):
    ms.sort()
    out[name] = {
      "holds": len(ms),
      "median_ms": round(ms[len(ms) // 2], 3),
      "p99_ms": round(ms[min(int(0.99 * len(ms)), len(ms) - 1)], 3),
      "max_ms": round(ms[-1], 3),
      "longest_wait_ms": round(waited[name], 3),
    }
  if args.json:
    print(json.dumps(out))
    return
  print(f"{args.processes} process(es), {args.updates} updates per group, {out['wall_s']} s")
  for name in sorted(held):
    r = out[name]
    print(
      f"  {name:12s} {r['holds']:5d} holds: median {r['median_ms']:.2f} ms, "
      f"99th percentile {r['p99_ms']:.2f} ms, max {r['max_ms']:.2f} ms; longest wait "
      f"{r['longest_wait_ms']:.2f} ms"
    )


if __name__ == "__main__":
  main()
