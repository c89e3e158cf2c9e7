"""Sweep overhead: wall time of a sweep with 1 worker vs W independent workers, per-group
start-up, and the share of worker time not spent in training calls.

  python benchmarks/sweep_overhead.py [--config configs/demo.py] [--workers 1,2]
      [--updates N] [--grid FIELD=V1,V2 ...] [--set FIELD=VALUE ...] [--json]
      [--cache_dir DIR | --no_cache] [--law FILE] [--gpus 0] [--cpu_devices N]
      [--workdir BASE] [--keep] [--plan]
      [-- more `ihsweep run` flags]

Each entry of ``--workers`` is one sweep from scratch into its own run directory
(BASE/wW_i), started by ``launch/local_multiprocess.sh W --independent`` (W = 1: one worker)
and timed from the launch to the last worker's exit. ``--updates N`` shrinks a sweep to a fixed
N updates per group (sets ``sweep.budget=updates`` and ``train.num_steps=N``); ``--grid`` and
``--set`` (``--config.FIELD=VALUE``) change the config as on the ``ihsweep run`` command line.
Examples (2-core CPU):

  python benchmarks/sweep_overhead.py --workers 1,2          # the demo's 9 groups (≈ 15 min each)
  python benchmarks/sweep_overhead.py --config configs/default.py:tiny --workers 1,2 \\
      --updates 300 --grid train.batch_size=8,16,32,64 --set eval.every_steps=100

From each group's ``status.json``: ``timings`` = {setup_s (start-up before its first update:
building, compiling), train_s (time in training calls), total_s} as the worker recorded it, and
from ``claims.jsonl`` the worker that trained it. Per sweep of W workers:
  busy = Σ train_s / (W · wall): the share of worker time spent in training calls;
  overhead_s = W · wall − Σ train_s, overhead = 1 − busy (for W = 1: wall − Σ train_s as a
  share of wall);
  outside_s = W · wall − Σ total_s: worker time outside any group (process start, imports,
  planning, waiting for a group to take over, exit).
A group without timings (an ihsweep that does not record them) leaves these empty.
Compilation cache: by default every sweep gets a new empty JAX persistent compilation cache
(each pays its compiles: a first run); ``--cache_dir DIR`` gives every sweep DIR (a warm DIR
measures a rerun). Either way with ihsweep's thresholds (every program cached). ``--no_cache``
turns the cache off (``JAX_ENABLE_COMPILATION_CACHE=false``), and with it compiling the next
group ahead: every group compiles its programs when it starts, as before either existed.
``--plan``: ``ihsweep plan``'s predicted makespan for each W (W workers of this machine's CPU
devices; the plan measures a step and each group shape's start-up here, with an empty cache),
beside the measured wall time: plan_error = wall / makespan − 1. ``--law FILE`` is passed to
``ihsweep plan`` (an 'emergence' budget's groups stop where that law puts their transition; the
demo's fitted law is in docs/results.md).

Prints a table per sweep and per group, or with ``--json`` one JSON object: ``runs`` (one per
sweep), ``groups`` (one per group and sweep), ``notes``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pandas as pd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHER = os.path.join(ROOT, "launch", "local_multiprocess.sh")


def run_flags(args) -> list[str]:
  """The ``ihsweep run`` flags (after --config and --workdir) the options describe."""
  flags = ["--noprogress"]
  if args.updates:
    flags += ["--config.sweep.budget=updates", f"--config.train.num_steps={args.updates}"]
  flags += [f"--grid={g}" for g in args.grid]
  flags += [f"--config.{s}" for s in args.set]
  return flags + list(args.extra)


def cache_env(cache_dir: str, off: bool = False) -> dict:
  """JAX's persistent compilation cache in ``cache_dir`` with ihsweep's own thresholds (every
  program cached: ``ihsweep.workers.compile_cache``; a cache named by JAX_COMPILATION_CACHE_DIR
  would otherwise keep JAX's, which skip programs compiled in under a second); ``off``: no cache."""
  if off:
    return {"JAX_ENABLE_COMPILATION_CACHE": "false"}
  return {
    "JAX_COMPILATION_CACHE_DIR": cache_dir,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
  }


def devices_per_worker(args, workers: int) -> int:
  """CPU devices each worker gets: --cpu_devices, else the launcher's cores / W (at least 1)."""
  return args.cpu_devices or max(len(os.sched_getaffinity(0)) // workers, 1)


def predict(args, workers: int, base: str) -> dict:
  """``ihsweep plan``'s predicted makespan and utilisation for W workers of this machine's
  devices (its step and start-up measured here, with an empty compilation cache: a cold
  sweep's)."""
  per = devices_per_worker(args, workers)
  xla = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in xla:
    xla = f"{xla} --xla_force_host_platform_device_count={per}".strip()
  cache = tempfile.mkdtemp(prefix="plan_cache_", dir=base)
  env = {**os.environ, **cache_env(cache), "XLA_FLAGS": xla}
  flags = [f for f in run_flags(args) if f != "--noprogress"]
  cmd = [
    *os.environ.get("IHSWEEP", f"{sys.executable} -m ihsweep.cli").split(),
    "plan",
    f"--config={args.config}",
    *flags,
    f"--devices={workers * per}",
    f"--devices_per_worker={per}",
    "--json",
  ] + ([f"--law={args.law}"] if args.law else [])
  try:
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
  except subprocess.TimeoutExpired:
    r = subprocess.CompletedProcess(cmd, "timeout", "", f"timed out after {args.timeout} s")
  shutil.rmtree(cache, ignore_errors=True)
  try:
    plan = json.loads(r.stdout.strip().splitlines()[-1])
    return {
      "plan_makespan_s": round(plan["makespan_s"], 2),
      "plan_utilisation": round(plan["utilisation"], 3),
    }
  except (IndexError, KeyError, TypeError, ValueError):
    return {
      "plan_makespan_s": None,
      "plan_utilisation": None,
      "plan_failed": (r.stderr or r.stdout)[-300:],
    }


def stop(launcher: subprocess.Popen) -> str:
  """Ends a launcher and its workers (its process group): SIGTERM (they checkpoint and exit),
  SIGKILL after 60 s. Returns what it printed."""
  try:
    os.killpg(launcher.pid, signal.SIGTERM)
    out, _ = launcher.communicate(timeout=60)
  except subprocess.TimeoutExpired:
    os.killpg(launcher.pid, signal.SIGKILL)
    out, _ = launcher.communicate()
  except ProcessLookupError:
    out, _ = launcher.communicate()
  return out or ""


def run_sweep(args, workers: int, workdir: str, cache_dir: str) -> dict:
  """Runs one sweep with ``workers`` independent workers; returns its wall time and status."""
  env = {**os.environ, **cache_env(cache_dir, args.no_cache)}
  env.setdefault("IHSWEEP", f"{sys.executable} -m ihsweep.cli")
  if args.cpu_devices:
    env["IHSWEEP_CPU_DEVICES"] = str(args.cpu_devices)
  if args.gpus:
    env["IHSWEEP_GPUS"] = args.gpus
  cmd = [
    "bash",
    LAUNCHER,
    str(workers),
    "--independent",
    f"--config={args.config}",
    f"--workdir={workdir}",
    *run_flags(args),
  ]
  start = time.perf_counter()
  # Its own process group: at the timeout the launcher and its workers are ended together.
  launcher = subprocess.Popen(
    cmd,
    cwd=ROOT,
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  try:
    out, _ = launcher.communicate(timeout=args.timeout)
    status = launcher.returncode
  except subprocess.TimeoutExpired:
    out, status = stop(launcher), "timeout"
  except BaseException:  # SIGTERM or Ctrl-C of this script: no workers left behind
    stop(launcher)
    raise
  return {
    "workers": workers,
    "wall_s": round(time.perf_counter() - start, 2),
    "exit_status": status,
    "workdir": workdir,
    "output_tail": out[-2000:],
  }


def group_rows(workdir: str) -> list[dict]:
  """One row per group directory: state, the worker(s) that claimed it, its timings."""
  claims = collections.defaultdict(list)
  log = os.path.join(workdir, "claims.jsonl")
  if os.path.exists(log):
    with open(log) as f:
      for line in f:
        try:
          row = json.loads(line)
        except ValueError:
          continue  # a line cut by a killed worker
        if row.get("event") in ("claimed", "taken over"):
          claims[row.get("group")].append(row.get("worker"))
  rows = []
  groups = os.path.join(workdir, "groups")
  for g in sorted(os.listdir(groups)) if os.path.isdir(groups) else []:
    try:
      with open(os.path.join(groups, g, "status.json")) as f:
        status = json.load(f)
    except (OSError, ValueError):
      status = {}
    t = status.get("timings") or {}
    rows.append(
      {
        "group": g,
        "state": status.get("state", "pending"),
        "worker": ", ".join(claims.get(g, [])) or None,
        "claims": len(claims.get(g, [])),
        "setup_s": t.get("setup_s"),
        "train_s": t.get("train_s"),
        "total_s": t.get("total_s"),
        "error": (status.get("error") or "")[:300] or None,
      }
    )
  return rows


def summarise(run: dict, rows: list[dict]) -> dict:
  """Adds the sweep's totals and overhead to ``run`` (None where a group lacks timings)."""
  w, wall = run["workers"], run["wall_s"]
  timed = rows and all(r["train_s"] is not None for r in rows)
  total = lambda key: round(sum(r[key] or 0.0 for r in rows), 2) if timed else None
  run.update(
    groups=len(rows),
    done=sum(r["state"] == "done" for r in rows),
    setup_s=total("setup_s"),
    train_s=total("train_s"),
    group_total_s=total("total_s"),
  )
  if timed:
    busy = run["train_s"] / (w * wall)
    run.update(
      busy=round(busy, 3),
      overhead_s=round(w * wall - run["train_s"], 2),
      overhead=round(1 - busy, 3),
      outside_s=round(w * wall - run["group_total_s"], 2),
    )
  else:
    run.update(busy=None, overhead_s=None, overhead=None, outside_s=None)
  return run


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", default="configs/demo.py", help="sweep config (FILE[:ARG])")
  p.add_argument(
    "--workers", default="1,2", help="comma-separated worker counts, one sweep each, in this order"
  )
  p.add_argument(
    "--updates",
    type=int,
    default=0,
    help="a fixed budget of N updates per group (sweep.budget=updates)",
  )
  p.add_argument("--grid", action="append", default=[], help="FIELD=V1,V2 (as ihsweep run)")
  p.add_argument("--set", action="append", default=[], help="FIELD=VALUE (--config.FIELD)")
  p.add_argument(
    "--cache_dir",
    default="",
    help="JAX persistent compilation cache for every sweep (default: a new empty one per sweep)",
  )
  p.add_argument(
    "--no_cache",
    action="store_true",
    help="no persistent compilation cache (and so no compiling ahead): 'before'",
  )
  p.add_argument("--law", default="", help="--law for ihsweep plan (with --plan)")
  p.add_argument("--gpus", default="", help="IHSWEEP_GPUS for the launcher, e.g. 0")
  p.add_argument(
    "--cpu_devices",
    type=int,
    default=0,
    help="CPU devices per worker (default: the launcher's cores / W)",
  )
  p.add_argument(
    "--workdir",
    default="",
    help="base directory of the run directories (default: a temporary one, removed after)",
  )
  p.add_argument("--keep", action="store_true", help="keep the run directories")
  p.add_argument("--timeout", type=float, default=3600, help="seconds per sweep")
  p.add_argument(
    "--plan",
    action="store_true",
    help="also ihsweep plan's predicted makespan for each W (CPU workers; "
    "measures a step and the start-up of each group shape here)",
  )
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("extra", nargs="*", help="after --: more ihsweep run flags")
  args = p.parse_args(argv)
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs the clean-up of run_sweep
  counts = [int(x) for x in args.workers.split(",") if x]
  if not counts or min(counts) < 1:
    p.error(f"--workers={args.workers!r}: comma-separated whole numbers >= 1")
  if args.no_cache and args.cache_dir:
    p.error("--no_cache and --cache_dir: choose one")
  if args.law and not args.plan:
    p.error("--law is for ihsweep plan: give --plan too")
  if args.plan and args.gpus:
    p.error("--plan predicts CPU workers (ihsweep plan does not model workers sharing a GPU)")
  base = args.workdir or tempfile.mkdtemp(prefix="ihsweep-overhead-")
  os.makedirs(base, exist_ok=True)
  runs, groups, notes = [], [], []
  try:
    for i, w in enumerate(counts):
      workdir = os.path.join(base, f"w{w}_{i}")
      cache = args.cache_dir or os.path.join(base, f"xla_cache_{i}")
      run = run_sweep(args, w, workdir, cache)
      rows = group_rows(workdir)
      runs.append(summarise(run, rows))
      if args.plan:
        run.update(predict(args, w, base))
        if run["plan_makespan_s"]:
          run["plan_error"] = round(run["wall_s"] / run["plan_makespan_s"] - 1, 3)
        else:
          notes.append(f"sweep {i}: ihsweep plan gave no makespan: {run['plan_failed']!r}")
      groups += [{"workers": w, "run": i, **r} for r in rows]
      if run["exit_status"] != 0:
        errors = sorted({r["error"] for r in rows if r["error"]})
        notes.append(
          f"sweep {i} ({w} worker(s)) ended with status {run['exit_status']}; "
          + (
            f"group errors: {'; '.join(errors)}"
            if errors
            else f"its output ends: {run['output_tail'][-300:]!r}"
          )
        )
      if rows and run["train_s"] is None:
        notes.append(
          f"sweep {i}: groups without timings in status.json (unfinished, or an "
          f"ihsweep that does not record them): no overhead"
        )
      if not args.json:
        print(
          f"sweep {i}: {w} worker(s), {run['wall_s']} s, exit {run['exit_status']}", file=sys.stderr
        )
  finally:
    if not (args.keep or args.workdir):
      shutil.rmtree(base, ignore_errors=True)
  base_wall = runs[0]["wall_s"]
  for run in runs:
    run["speedup"] = round(base_wall / run["wall_s"], 2) if run["wall_s"] else None
    del run["output_tail"]
  out = {
    "config": args.config,
    "flags": run_flags(args),
    "cache": "off" if args.no_cache else args.cache_dir or "empty per sweep",
    "runs": runs,
    "groups": groups,
    "notes": notes,
  }
  if args.json:
    print(json.dumps(out))
  else:
    cols = [
      "workers",
      "wall_s",
      "speedup",
      "groups",
      "done",
      "setup_s",
      "train_s",
      "group_total_s",
      "outside_s",
      "busy",
      "overhead_s",
      "overhead",
      "exit_status",
    ]
    if args.plan:
      cols[3:3] = ["plan_makespan_s", "plan_error"]
    print(pd.DataFrame(runs).reindex(columns=cols).to_string(index=False))
    if groups:
      print()
      print(
        pd.DataFrame(groups)[
          ["workers", "group", "state", "worker", "claims", "setup_s", "train_s", "total_s"]
        ].to_string(index=False)
      )
    for note in notes:
      print("note:", note)
  return 0 if all(r["exit_status"] == 0 for r in runs) else 1


if __name__ == "__main__":
  sys.exit(main())
