"""Reading a sweep's state from its run directory: per-group rows and the table
``ihsweep status`` prints (``status_rows``, ``format_status``), and the summary ``ihsweep run``
writes to sweep.json and prints at its end (``summarize``, ``format_summary``)."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from ihsweep.base.errors import IhsweepError
from ihsweep.runs import claims, rundir
from ihsweep.runs.rundir import group_dir, read_status

if TYPE_CHECKING:  # the grid (and with it JAX) only for the annotation: status reads files only
  from ihsweep.configuration.grid import Plan


def summarize(plan: Plan, workdir: str) -> dict:
  """Per-group state and totals: cells by state, diverged cells, and the compute the
  'emergence' budget saved (tokens not trained because a group stopped before its cap)."""
  groups, totals = [], {s: 0 for s in rundir.STATES}
  budget_tokens = used_tokens = 0
  for group in plan.groups:
    status = read_status(workdir, group.id)
    b, c = int(group.cfg.train.batch_size), int(group.cfg.train.context_size)
    e = len(group.cells)
    step = status.get("step")
    budget_tokens += e * group.num_steps * b * c
    if status["state"] == "done":
      used_tokens += e * step * b * c
    totals[status["state"]] += e
    groups.append(
      {
        "group": group.id,
        "state": status["state"],
        "cells": e,
        "batch_size": b,
        "context_size": c,
        "budget_updates": group.num_steps,
        "step": step,
        "stopped_early": status.get("stopped_early", False),
        "diverged": status.get("diverged", {}),
        "not_learning": status.get("not_learning", {}),
        "error": status.get("error"),
      }
    )
  done_budget = sum(
    g["cells"] * g["budget_updates"] * g["batch_size"] * g["context_size"]
    for g in groups
    if g["state"] == "done"
  )
  return {
    "cells": len(plan.cells),
    "groups": groups,
    "cells_by_state": totals,
    "diverged_cells": sum(len(g["diverged"]) for g in groups),
    # a finite final loss above ln V + 1 nat (evaluation.not_learning), not NaN-diverged
    "not_learning_cells": sum(len(set(g["not_learning"]) - set(g["diverged"])) for g in groups),
    "budget": plan.budget,
    "budget_tokens": budget_tokens,
    "done_budget_tokens": done_budget,
    "trained_tokens_done_groups": used_tokens,
    "saved_fraction": (1 - used_tokens / done_budget) if done_budget else 0.0,
  }


def format_summary(summary: dict) -> str:
  """The lines ``ihsweep run`` prints at the end."""
  by = summary["cells_by_state"]
  lines = [
    f"sweep: {summary['cells']} cells in {len(summary['groups'])} groups; cells "
    + ", ".join(f"{s}: {n}" for s, n in by.items() if n)
  ]
  if summary["diverged_cells"]:
    lines.append(f"diverged cells (loss NaN/inf, frozen): {summary['diverged_cells']}")
  if summary.get("not_learning_cells"):
    lines.append(
      f"cells that diverged or did not learn (final loss > ln V + 1, worse than a uniform "
      f"guess): {summary['not_learning_cells']}"
    )
  if summary["budget"] == "emergence" and summary["done_budget_tokens"]:
    lines.append(
      f"early stops saved {summary['saved_fraction']:.1%} of the finished groups' "
      f"budget ({summary['done_budget_tokens'] - summary['trained_tokens_done_groups']:,}"
      f" of {summary['done_budget_tokens']:,} tokens)"
    )
  for g in summary["groups"]:
    if g["state"] == "failed":
      lines.append(f"  {g['group']} failed: {g['error']}")
  return "\n".join(lines)


class NotASweep(IhsweepError, ValueError):
  """A directory without a sweep's cells.csv."""


def status_rows(workdir: str, notes: list[str] | None = None) -> list[dict]:
  """Per-group state of a sweep directory, from its files only: ``group``, ``state`` (a
  'running' group whose claim is stale, or whose process is gone on this host, reads
  'stopped'), ``cells``, ``B``, ``C``, ``step`` (last logged update), ``budget``, ``diverged``
  cell ids, ``error``, ``worker`` (the claim's or the last status's; a worker spanning
  processes adds which) and ``reported_s_ago``
  (seconds since the claim's last heartbeat; None without a claim).

  A damaged or truncated cells.csv is read as the analysis reads it (``read_cells``,
  ``recover_cells``): the cells it lacks are rebuilt from the group directories, and one line
  naming the file and what was recovered is appended to ``notes``.

  Raises:
    NotASweep: no cells.csv in ``workdir``, or neither readable rows nor group directories.
  """
  import pandas as pd

  path = os.path.join(workdir, "cells.csv")
  found: list[str] = []
  cells, why = rundir.read_cells(path, found.append)
  if cells is None and not (
    os.path.exists(path) and os.path.isdir(os.path.join(workdir, "groups"))
  ):
    raise NotASweep(
      f"{workdir} is not a sweep run directory (no readable cells.csv: {why}); "
      f"`ihsweep run --config=FILE --workdir={workdir}` makes one"
    )
  if cells is None:
    found.append(f"it cannot be read as a cells table ({why})")
    cells = pd.DataFrame(
      {c: pd.Series(dtype=int) for c in (*rundir.REQUIRED_CELL_COLUMNS, "group")}
    )
  cells = rundir.recover_cells(workdir, cells, (), found.append)
  if found and notes is not None:
    notes.append(f"{path} is damaged or cut short: {'; '.join(found)}")
  if cells.empty:
    raise NotASweep(f"{path}: no usable rows, and no group directory to rebuild them from")
  rows = []
  for gid, members in cells.groupby("group", sort=True):
    status = read_status(workdir, gid)
    state = claims.group_state(workdir, gid, status)
    claim = claims.read_claim(workdir, gid)
    step = rundir.last_step(os.path.join(group_dir(workdir, gid), "train_log.jsonl"))
    first = members.iloc[0]
    budget = pd.to_numeric(
      members.get("budget_updates", pd.Series(dtype=float)), errors="coerce"
    ).max()
    rows.append(
      {
        "group": gid,
        "state": state,
        "cells": len(members),
        "B": int(first["batch_size"]),
        "C": int(first["context_size"]),
        "step": status.get("step", step) if state == "done" else (step or 0),
        "budget": int(status.get("num_steps", 0) if pd.isna(budget) else budget),
        "stopped_early": bool(status.get("stopped_early", False)),
        "diverged": sorted(int(c) for c in status.get("diverged", {})),
        "error": status.get("error"),
        "unreadable": status.get("unreadable", False),
        "unverified": status.get("unverified"),
        "worker": _worker_name((claim or status).get("worker"), status.get("processes")),
        "reported_s_ago": (time.time() - float(claim["heartbeat"])) if claim else None,
      }
    )
  return rows


def _worker_name(worker: str | None, processes: list | None) -> str | None:
  """The worker that holds or held a group: its (lead's) claim name, and for a worker spanning
  processes of a jax.distributed job, which ones (``processes`` of its status)."""
  if worker and processes and len(processes) > 1:
    return f"{worker} with processes {processes[0]}–{processes[-1]}"
  return worker


def format_status(workdir: str) -> str:
  """``ihsweep status``: one line per group, a count of cells by state (after a warning line
  when cells.csv is damaged: ``status_rows``), and the worker layout of each process holding a
  running group (``claims.read_layouts``: ``workers.jsonl``)."""
  notes: list[str] = []
  rows = status_rows(workdir, notes)
  lines = [f"warning: {n}" for n in notes]
  lines.append(
    f"{'group':6s} {'state':11s} {'cells':>5s} {'B':>5s} {'C':>6s} {'updates':>17s}  notes"
  )
  counts: dict[str, int] = {}
  for r in rows:
    counts[r["state"]] = counts.get(r["state"], 0) + r["cells"]
    notes = []
    if r["stopped_early"]:
      notes.append("stopped early (emergence)")
    if r["diverged"]:
      notes.append(f"diverged cells {','.join(map(str, r['diverged']))}")
    if r["state"] == "stopped":
      notes.append(
        "its worker is gone (its process died, or it stopped answering and holds nothing): "
        "a waiting worker or a rerun takes it over"
      )
    elif r["state"] == "running" and r["worker"]:
      seen = r["reported_s_ago"]
      notes.append(
        f"worker {r['worker']}" + (f", last report {seen:.0f} s ago" if seen is not None else "")
      )
      holder = claims.not_answering(workdir, r["group"])
      if holder:
        notes.append(
          f"not answering (paused or hung), but its directory is held by {holder}, a live "
          "process: nothing takes it over"
        )
    if r["unreadable"]:
      notes.append("status.json unreadable: a rerun resumes it from its checkpoints")
    if r["unverified"]:
      notes.append(f"status.json says done, but {r['unverified']}: a rerun resumes it")
    if r["error"]:
      notes.append(r["error"].splitlines()[0][:120])
    lines.append(
      f"{r['group']:6s} {r['state']:11s} {r['cells']:5d} {r['B']:5d} {r['C']:6d} "
      f"{r['step']:>8,d}/{r['budget']:<8,d}  {'; '.join(notes)}"
    )
  lines.append("cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
  layouts = claims.read_layouts(workdir)
  running = sorted(
    {_process_of(r["worker"]) for r in rows if r["state"] == "running" and r["worker"]}
  )
  for process in running:
    if process in layouts:
      lines.append(f"process {process}: {layouts[process]}")
  return "\n".join(lines)


def _process_of(worker: str) -> str:
  """The process a worker name belongs to: ``host:pid[/pN]`` without a thread's ``/wK`` (and
  without what ``_worker_name`` appends)."""
  name = worker.split(" ", 1)[0]
  head, _, last = name.rpartition("/")
  return head if head and last.startswith("w") and last[1:].isdigit() else name
