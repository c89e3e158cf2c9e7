"""The ``ihsweep`` command.

  ihsweep run --config=FILE --workdir=DIR [--grid=train.batch_size=8,16 ...]
  ihsweep status --workdir=DIR
  ihsweep train --config=configs/default.py --workdir=DIR [--config.train.lr=3e-4 ...]
  ihsweep corpus fetch python-docs [--cache_dir=DIR]
  ihsweep corpus prepare --config=FILE   (tokenize and cache the config's corpus; print counts)
  ihsweep predict --batch_size=B --context_size=C [--law=FILE] [--json]
  ihsweep plan --config=FILE --devices=N [--devices_per_worker=D] [--flops_per_s=F] [--json]
  ihsweep report DIR [DIR ...] [--out OUT] ...   (= python -m analysis report, from anywhere)
  ihsweep fit-law --csv FILE [--fix alpha=0.37] ...   (= python -m analysis fit-law)
  ihsweep export --workdir=DIR --cell=N [--step=S] --to=transformer_lens|hf [--out=PATH]

Flags are parsed by absl; ``--config`` is an ml_collections config file with ``get_config()``
(``FILE:ARG`` passes ARG to it) and every field can be overridden as ``--config.a.b=value``.
Each command takes only its own flags (``COMMAND_FLAGS``, also listed by its ``--help``); any
other flag is refused with exit status 2 before anything is parsed or loaded.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
import re
import sys
import traceback

from absl import flags
from ml_collections import config_flags

COMMANDS = {
  "run": "run a sweep: the config's sweep.grid × seeds, one ensemble per group of equal shapes",
  "status": "per-group state of a sweep's run directory (done, running, pending, failed)",
  "train": "train one ensemble (config sections model/train/ensemble/data/mesh)",
  "corpus": "corpus fetch NAME (embedded corpora: python-docs) | corpus prepare --config=FILE",
  "predict": "updates and tokens until induction heads form, by the emergence law",
  "plan": "a sweep's schedule, makespan and device utilisation on N devices (no training)",
  "export": "one model of a run as a TransformerLens HookedTransformer or a Hugging Face GPT-2",
}

# The analysis package's commands (its own argparse flags: `ihsweep report --help`), reached from
# any directory through its installed name, ihsweep_analysis (the analysis/ folder).
ANALYSIS_COMMANDS = {
  "report": "curves, emergence points, law fit, figures and report.md/.html from run dirs",
  "fit-law": "fit the emergence law to a CSV of emergence points (one JSON object)",
}

FLAGS = flags.FLAGS
DEFAULT_HOST = 8  # placement.DEFAULT_DEVICES_PER_HOST (not imported: it imports jax)
_ARGV: list[str] = []  # the command line --config.X overrides are read from (main sets it)
config_flags.DEFINE_config_file(
  "config", None, "config file (configs/*.py), FILE[:ARG]", lock_config=True, sys_argv=_ARGV
)
flags.DEFINE_string("workdir", None, "run directory (created if missing)")
flags.DEFINE_bool("progress", True, "show a progress bar")
flags.DEFINE_integer("batch_size", None, "predict: batch size B (sequences per update)")
flags.DEFINE_integer("context_size", None, "predict: context size C (tokens per sequence)")
flags.DEFINE_string(
  "law",
  None,
  "predict, plan: a law JSON with log_T (or T), alpha, beta; "
  "default: the study's ln T = 13.26, alpha = 0.37, beta = 0.62 (plan: the "
  "sweep's law); plan: where an 'emergence' budget stops each group; predict: "
  "a law from `python -m analysis fit-law` also gives 95% intervals and warns "
  "outside the B and C it was fitted on",
)
flags.DEFINE_multi_string(
  "grid",
  [],
  "run, plan: a sweep axis FIELD=V1,V2,... (repeatable; "
  "adds to or replaces the config's sweep.grid), e.g. "
  "--grid=train.batch_size=8,16",
)
flags.DEFINE_multi_string(
  "zip", [], "run, plan: a zipped sweep axis FIELD=V1,V2,... (zip axes vary together)"
)
flags.DEFINE_bool("json", False, "predict, plan: print one JSON object")
flags.DEFINE_string(
  "target",
  None,
  "plan: compile every group for this accelerator without it (a TPU topology such as "
  "v5e:8x8, or h100-80gb / h200-141gb / a100-80gb with --devices=N)",
)
flags.DEFINE_integer("devices", None, "plan: N, the devices the sweep runs on")
flags.DEFINE_integer(
  "devices_per_worker",
  None,
  "plan: D, devices per worker (one process "
  "each); default: chosen (--flops_per_s) or this machine's devices",
)
flags.DEFINE_integer(
  "devices_per_host",
  None,
  "plan: the most devices one worker (one "
  "process, one host) can have, with --flops_per_s; default 8",
)
flags.DEFINE_float(
  "flops_per_s",
  None,
  "plan: sustained FLOP/s per device (e.g. 4e14: an H100 "
  "at 40% MFU in bf16); default: measure on this machine",
)
flags.DEFINE_string(
  "network",
  None,
  "plan, with --flops_per_s: the interconnect that prices each update's gradient all-reduce "
  "over a data axis and each phase switch: h100 (default), v5e, v5p, or none",
)
flags.DEFINE_string(
  "cache_dir",
  None,
  "corpus fetch: cache directory (default: $IHSWEEP_CACHE "
  "or ~/.cache/ihsweep; training reads config.data.cache_dir)",
)
flags.DEFINE_integer("cell", None, "export: the model (cell id) to export")
flags.DEFINE_integer("step", None, "export: the saved update to export (default: the last)")
flags.DEFINE_string("to", None, "export: transformer_lens or hf")
flags.DEFINE_string(
  "out",
  None,
  "export: the new file (transformer_lens) or directory (hf); default under DIR/analysis",
)


# The flags each command takes (corpus: per subcommand); anything else is refused before parsing.
COMMAND_FLAGS = {
  "run": ("config", "workdir", "progress", "grid", "zip"),
  "status": ("workdir",),
  "train": ("config", "workdir", "progress"),
  "corpus fetch": ("cache_dir",),
  "corpus prepare": ("config",),
  "predict": ("batch_size", "context_size", "law", "json"),
  "plan": (
    "config",
    "grid",
    "zip",
    "devices",
    "devices_per_worker",
    "devices_per_host",
    "flops_per_s",
    "network",
    "law",
    "json",
    "target",
  ),
  "export": ("workdir", "cell", "step", "to", "out"),
}
FLAG_FORMS = {
  "config": "--config=FILE[:VARIANT] --config.SECTION.FIELD=VALUE",
  "workdir": "--workdir=DIR",
  "progress": "--[no]progress",
  "grid": "--grid=FIELD=V1,V2,...",
  "zip": "--zip=FIELD=V1,V2,...",
  "batch_size": "--batch_size=B",
  "context_size": "--context_size=C",
  "law": "--law=FILE",
  "json": "--[no]json",
  "target": "--target=NAME",
  "cache_dir": "--cache_dir=DIR",
  "devices": "--devices=N",
  "devices_per_worker": "--devices_per_worker=D",
  "devices_per_host": "--devices_per_host=H",
  "flops_per_s": "--flops_per_s=F",
  "network": "--network=h100|v5e|v5p|none",
  "cell": "--cell=N",
  "step": "--step=S",
  "to": "--to=transformer_lens|hf",
  "out": "--out=PATH",
}


def _command_flags(key: str) -> dict[str, tuple[str, ...]]:
  """COMMAND_FLAGS of a command, or of each subcommand (``corpus``: fetch and prepare)."""
  return {k: v for k, v in COMMAND_FLAGS.items() if k == key or k.startswith(key + " ")}


def _flag_list(key: str) -> str:
  """The flags of a command (``run``) or subcommand (``corpus fetch``) as the user types them;
  ``corpus``: those of each subcommand."""
  return "; ".join(
    (k[len(key) + 1 :] + ": " if k != key else "") + ", ".join(FLAG_FORMS[name] for name in names)
    for k, names in _command_flags(key).items()
  )


def _split_args(args):
  """``(flags, positional)`` of the words after the command (``--flagfile`` expanded), read as
  absl reads them: flags as ``(name as typed, flag it sets, value or None)``, e.g.
  ``("noprogress", "progress", None)``, ``("config.train.lr", "config", "3e-4")``; a
  non-boolean flag without ``=`` takes the next word as its value (``--workdir DIR``)."""
  found, positional, i = [], [], 0
  while i < len(args):
    arg, i = args[i], i + 1
    if arg == "--":
      positional += args[i:]
      break
    m = re.fullmatch(r"--?([A-Za-z_][\w.-]*)(?:=(.*))?", arg, re.S)
    if not m:
      positional.append(arg)
      continue
    name, value = m.groups()
    flag = name.split(".", 1)[0]
    if (
      flag not in FLAGS
      and flag.startswith("no")
      and flag[2:] in FLAGS
      and (FLAGS[flag[2:]].boolean or "." in name)
    ):  # --noprogress, --noconfig.a.b
      flag = flag[2:]
    elif value is None and "." not in name and flag in FLAGS and not FLAGS[flag].boolean:
      value, i = (args[i], i + 1) if i < len(args) else (None, i)
    found.append((name, flag, value))
  return found, positional


def _check_flags(command: str, found, positional) -> str | None:
  """Why the flags ``found`` (``_split_args``) do not suit ``command``: the first flag it does
  not take, with its flags; a flag that takes one value given twice with different values
  (``--grid``/``--zip`` are repeatable, and a later ``--config.X`` overrides an earlier one, as
  in absl); or a --config file that does not exist. None when they suit."""
  key = (
    f"corpus {positional[0]}"
    if command == "corpus" and positional[:1] in (["fetch"], ["prepare"])
    else command
  )
  allowed = sum(_command_flags(key).values(), ())
  for name, flag, _ in found:
    if flag not in allowed:
      close = difflib.get_close_matches(flag, allowed, n=1)
      hint = f"did you mean --{close[0]}? " if close and close[0] != flag else ""
      return f"--{name} is not a flag of `ihsweep {key}`; {hint}its flags: {_flag_list(key)}"
  given = {}  # a one-value flag given twice with different values: absl keeps the last silently
  for name, flag, value in found:
    if flag in ("grid", "zip") or "." in name:  # repeatable; a later --config.X overrides
      continue
    typed = f"--{name}" + (f"={value}" if value is not None else "")
    if given.setdefault(flag, typed) != typed:
      return (
        f"--{flag} is given twice with different values ({given[flag]} and {typed}): give it once"
      )
  axis_flags = {}  # field → the --grid/--zip flag that sets it
  for name, flag, value in found:
    if flag in ("grid", "zip") and value and "=" in value:
      axis_flags.setdefault(value.split("=", 1)[0].strip(), (flag, f"--{flag}={value}"))
  for name, flag, value in found:
    parts = name.split(".", 3)
    if flag == "config" and len(parts) == 4 and parts[1:3] in (["sweep", "grid"], ["sweep", "zip"]):
      if parts[3] in axis_flags:
        axis_flag, typed = axis_flags[parts[3]]
        return (
          f"{typed} and --{name}" + (f"={value}" if value is not None else "") + " both set "
          f"the sweep axis {parts[3]}: give it once "
          f"(--{axis_flag} replaces the config file's axis; give all its values there)"
        )
  path = _config_arg(found).split(":", 1)[0]
  if path == "" and any(flag == "config" and "." not in name for name, flag, _ in found):
    return "--config= is empty: give a config file, e.g. --config=configs/default.py"
  if path and not os.path.exists(path):
    return f"cannot load the config: {path}: no such file"
  return None


def _config_arg(found) -> str:
  """The value of the last --config flag in ``found`` (``_split_args``); '' if none."""
  values = [value for name, flag, value in found if flag == "config" and "." not in name]
  return (values[-1] or "") if values else ""


def _bad_override(found) -> str | None:
  """The first ``--config.PATH`` override in ``found`` that names no field of the config file,
  and which fields there are; None if there is none (or the config file does not load)."""
  paths = [name.split(".", 1)[1] for name, flag, _ in found if flag == "config" and "." in name]
  if not paths or not _config_arg(found):
    return None
  try:
    cfg = FLAGS["config"].parser.parse(_config_arg(found))
    cfg.keys()
  except Exception:  # the config file itself fails: _config_load_failed says why
    return None
  for path in paths:
    node, done = cfg, []
    for part in path.split("."):
      here = ".".join(done) or "the config"
      if not hasattr(node, "keys"):
        return f"--config.{path}: {here} is a {type(node).__name__}, not a section"
      if part not in node:
        fields = sorted(node.keys())
        close = difflib.get_close_matches(part, fields, n=1)
        hint = f"; did you mean {'.'.join(done + close)}?" if close else ""
        has = f"{here} has: {', '.join(fields)}" if fields else f"{here} has no fields"
        axis = (
          " (an override --config.sweep.grid.X only changes an axis the config file "
          "defines; add an axis with --grid=FIELD=V1,V2,...)"
          if done[:2] in (["sweep", "grid"], ["sweep", "zip"])
          else ""
        )
        return (
          f"--config.{path}: the config has no field {'.'.join(done + [part])}{hint} ({has}){axis}"
        )
      node, done = node[part], done + [part]
  return None


def _load_config():
  """``(cfg, None)``, or ``(None, exit code)`` after printing why the config did not load."""
  try:  # a config file that failed to load raises on first use, not on parsing
    cfg = FLAGS.config
    if cfg is not None:
      cfg.keys()
    return cfg, None
  except CONFIG_LOAD_ERRORS as e:
    return None, _config_load_failed(e, _split_args(_ARGV[1:])[0])


def _config_and_workdir(command: str):
  """``(cfg, None)`` for a training command, or ``(None, exit code)`` after printing why the
  config or ``--workdir`` cannot be used."""
  cfg, failed = _load_config()
  if failed is not None:
    return None, failed
  if cfg is None or FLAGS.workdir is None:
    return None, _fail(f"{command} needs --config=FILE and --workdir=DIR")
  if not FLAGS.workdir:
    return None, _fail(f"--workdir= is empty: give {command} a run directory")
  if os.path.exists(FLAGS.workdir) and not os.path.isdir(FLAGS.workdir):
    return None, _fail(f"--workdir={FLAGS.workdir} exists and is not a directory")
  return cfg, None


def _bad_input(e: Exception) -> int:
  """One line for a ConfigError (WorkdirError included) or DataError (CheckpointError included)
  raised before or while training; exit code 2."""
  from ihsweep.checkpoint import CheckpointError
  from ihsweep.config import ConfigError, WorkdirError

  if isinstance(e, WorkdirError):  # a flag, not a config field: "--workdir=DIR ..."
    return _fail(str(e))
  kind = (
    "invalid config"
    if isinstance(e, ConfigError)
    else "checkpoint"
    if isinstance(e, CheckpointError)
    else "data"
  )
  return _fail(f"{kind}: {e}")


def _train(argv):
  del argv
  from ihsweep import config as config_lib
  from ihsweep import rundir
  from ihsweep.data.errors import DataError
  from ihsweep.runner import Interrupted, fit

  cfg, failed = _config_and_workdir("train")
  if failed is not None:
    return failed
  try:
    config_lib.validate(cfg)  # a bad field first: it leaves no directory behind
    rundir.check_workdir(FLAGS.workdir)  # before anything compiles, as `ihsweep run`
    out = fit(cfg, FLAGS.workdir, progress=FLAGS.progress)
  except Interrupted as e:
    print(f"interrupted: {e}", file=sys.stderr)
    return 143
  except (config_lib.ConfigError, DataError) as e:
    return _bad_input(e)
  if out["losses"] is None:
    print(f"done: nothing left to train in {FLAGS.workdir} (resumed at its last update)")
    return 0
  losses = ", ".join(f"{x:.4f}" for x in out["losses"])
  speed = out["tokens_per_s"]
  speed = "tokens/s not measured (one call)" if speed != speed else f"{speed:,.0f} tokens/s"
  print(f"done: final loss per model [{losses}]; {speed}; run directory {FLAGS.workdir}")
  return 0


def _run(argv):
  del argv
  import jax

  from ihsweep import plan as plan_lib
  from ihsweep import sweep
  from ihsweep.config import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.law import LawError

  cfg, failed = _config_and_workdir("run")
  if failed is not None:
    return failed
  try:
    plan_lib.add_axes(cfg, FLAGS.grid, "grid")
    plan_lib.add_axes(cfg, FLAGS.zip, "zip")
    result = sweep.run(cfg, FLAGS.workdir, progress=FLAGS.progress)
  except sweep.GroupFailed as e:
    _fail(
      f"{e} (process {jax.process_index()}); details in its status.json; rerun the command "
      f"to retry it"
    )
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # not jax.distributed's shutdown barrier: a peer may be gone
  except (ConfigError, DataError) as e:
    return _bad_input(e)
  except LawError as e:  # a cell's (B, C) outside the budget's law
    return _fail(f"sweep.budget = {cfg.sweep.budget!r}: {e}")
  failed_groups = [g for g, s in result.groups.items() if s["state"] == "failed"]
  if jax.process_index() == 0:
    print(sweep.format_summary(result.summary))
  if result.interrupted:
    print(
      f"interrupted: state saved; rerun the same command to resume ({FLAGS.workdir})",
      file=sys.stderr,
    )
    return 143
  if failed_groups:
    print(
      f"ihsweep: groups {', '.join(failed_groups)} failed (errors in their status.json; "
      f"`ihsweep status --workdir={FLAGS.workdir}`); rerun to retry them",
      file=sys.stderr,
    )
    return 1
  return 0


def _status(argv):
  del argv
  from ihsweep import rundir, sweep

  if not FLAGS.workdir:
    return _fail("status needs --workdir=DIR (a sweep's run directory)")
  try:
    print(sweep.format_status(FLAGS.workdir))
  except sweep.NotASweep as e:
    workdir = FLAGS.workdir
    try:
      kind, group = rundir.run_kind(workdir), rundir.sweep_group(workdir)
    except OSError:
      kind = group = None
    if group:
      return _fail(
        f"--workdir={workdir} is group {group[1]} of the sweep in {group[0]}: its "
        f"status is in `ihsweep status --workdir={group[0]}`"
      )
    if kind == "train":
      return _fail(
        f"--workdir={workdir} holds an ihsweep train run, not a sweep: its progress "
        f"is in train_log.jsonl and metrics.jsonl (python -m analysis report "
        f"{workdir} reads it)"
      )
    return _fail(str(e))
  return 0


def _predict(argv):
  """``ihsweep predict``: the law's updates and tokens at (B, C); with a fitted law that stores
  its uncertainty (``cov``, ``sigma``: ``python -m analysis fit-law``), the 95% interval of the
  median and the 95% prediction interval for one cell (``Law.interval``); a warning (stderr, and
  ``warnings`` in --json) for a B or C outside the law's fitted ``range``."""
  from ihsweep.law import Law, LawError

  if len(argv) > 1:
    return _fail(f"predict takes flags only, got {' '.join(argv[1:])!r}")
  if FLAGS.batch_size is None or FLAGS.context_size is None:
    return _fail("predict needs --batch_size=B and --context_size=C")
  if FLAGS.law == "":
    return _fail("--law= is empty: give a law JSON file, or leave --law out for the study's law")
  try:
    law = Law.from_json(FLAGS.law) if FLAGS.law else Law()
    b, c = FLAGS.batch_size, FLAGS.context_size
    updates, tokens = law.updates(b, c), law.tokens(b, c)
    median = law.interval(b, c) if law.cov is not None else None
    cell = law.interval(b, c, cell=True) if median and law.sigma is not None else None
  except LawError as e:
    return _fail(str(e))
  warnings = law.range_warnings(b, c)
  note = None
  if median is None:
    note = (
      "the study's law is published without intervals"
      if not FLAGS.law
      else f"{FLAGS.law} stores no coefficient covariance ('cov': laws written by `python -m "
      f"analysis fit-law` before intervals were stored, or with too few cells for them)"
    )
  for w in warnings:
    print(f"ihsweep: warning: {w}", file=sys.stderr)
  bc = float(b) * float(c)
  if FLAGS.json:

    def span(pair, **extra):
      return (
        None
        if pair is None
        else {"level": 0.95, "updates": list(pair), "tokens": [pair[0] * bc, pair[1] * bc], **extra}
      )

    out = {
      "batch_size": b,
      "context_size": c,
      "updates": updates,
      "tokens": tokens,
      "interval": span(median),
      "prediction_interval": span(cell, sigma=law.sigma),
      "warnings": warnings,
      "law": law.to_dict(),
    }
    if note:
      out["interval_note"] = note
    print(json.dumps(out))
    return 0
  print(
    f"B = {b:g}, C = {c:g}: induction heads predicted after {_count(updates)} updates "
    f"= {_count(tokens, 1e6, 'M')} tokens"
  )
  sigma = f"sigma = {law.sigma or 0:.2f}"
  for pair, words in (
    (median, "95% interval of the law's median"),
    (cell, f"95% prediction interval for one cell ({sigma})"),
  ):
    if pair is not None:
      print(
        f"  {words}: {_count(pair[0])}–{_count(pair[1])} updates = "
        f"{_count(pair[0] * bc, 1e6, 'M')}–{_count(pair[1] * bc, 1e6, 'M')} tokens"
      )
  if note:
    print(f"  no interval: {note}")
  print(
    f"law: UPT = T / (B^{law.alpha:g} · C^{law.beta:g}), ln T = {law.log_T:g} "
    f"(T = {_count(law.T)}); {law.source}"
  )
  return 0


def _plan_flags() -> str | None:
  """Why ``plan``'s numeric flags do not fit together (one line), or None."""
  from ihsweep import timing

  n, d, h, f = (FLAGS.devices, FLAGS.devices_per_worker, FLAGS.devices_per_host, FLAGS.flops_per_s)
  if n is None:
    return "plan needs --config=FILE and --devices=N (the devices the sweep runs on)"
  if n < 1:
    return f"--devices={n} is not allowed: an integer >= 1 (the devices the sweep runs on)"
  if f is not None and not (math.isfinite(f) and f > 0):
    return (
      f"--flops_per_s={f:g} is not allowed: a finite number > 0 (sustained FLOP/s per "
      f"device, e.g. 4e14), or leave it out to measure on this machine"
    )
  if FLAGS.network is not None and f is None:
    return (
      f"--network={FLAGS.network} is not allowed without --flops_per_s: measured times are "
      f"one process's, with no communication between processes to price"
    )
  if FLAGS.network is not None and FLAGS.network not in timing.NETWORKS:
    return f"--network={FLAGS.network} is not allowed: one of {', '.join(timing.NETWORKS)}"
  if h is not None and f is None:
    return (
      f"--devices_per_host={h} is not allowed without --flops_per_s: measured times are "
      f"this machine's, whose devices are its host's"
    )
  if h is not None and h < 1:
    return f"--devices_per_host={h} is not allowed: an integer >= 1"
  if h is not None and n > h and n % h:
    return (
      f"--devices_per_host={h} is not allowed with --devices={n}: a divisor of it (every host "
      f"holds as many devices), or at least N (one host)"
    )
  if d is not None:
    divisors = [k for k in range(1, n + 1) if n % k == 0]
    if d < 1 or n % d:
      return (
        f"--devices_per_worker={d} is not allowed: a divisor of --devices={n} "
        f"({', '.join(map(str, divisors))}): the workers share the devices equally"
      )
    host = h or DEFAULT_HOST
    if f is not None and d > host and d % host:
      return (
        f"--devices_per_worker={d} is not allowed: at most --devices_per_host={host} "
        f"(a worker of one process), or a multiple of it (a worker spanning hosts, "
        f"inside one jax.distributed job)"
      )
  return None


def _plan(argv):
  del argv
  import jax

  from ihsweep import placement, timing
  from ihsweep import plan as plan_lib
  from ihsweep.config import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.law import Law, LawError

  cfg, failed = _load_config()
  if failed is not None:
    return failed
  if FLAGS.target is not None:
    return _plan_target(cfg)
  if cfg is None:
    return _fail("plan needs --config=FILE and --devices=N (the devices the sweep runs on)")
  problem = _plan_flags()
  if problem:
    return _fail(problem)
  if FLAGS.law == "":
    return _fail("--law= is empty: give a law JSON file, or leave --law out for the sweep's law")
  if FLAGS.flops_per_s is None and FLAGS.devices_per_worker:
    local = len(jax.local_devices())
    if FLAGS.devices_per_worker > local:
      return _fail(
        f"--devices_per_worker={FLAGS.devices_per_worker} is not allowed without "
        f"--flops_per_s: at most this machine's {local} device(s), on which times "
        f"are measured"
      )
  try:
    law = Law.from_json(FLAGS.law) if FLAGS.law else None
    plan_lib.add_axes(cfg, FLAGS.grid, "grid")
    plan_lib.add_axes(cfg, FLAGS.zip, "zip")
    prediction = placement.predict(
      cfg,
      FLAGS.devices,
      devices_per_worker=FLAGS.devices_per_worker,
      devices_per_host=FLAGS.devices_per_host,
      flops_per_s=FLAGS.flops_per_s,
      network=timing.NETWORKS[FLAGS.network or "h100"],
      law=law,
      log=lambda line: print(line, file=sys.stderr, flush=True),
    )
  except (ConfigError, DataError) as e:
    return _bad_input(e)
  except LawError as e:
    return _fail(f"--law={FLAGS.law}: {e}" if FLAGS.law else str(e))
  except placement.LayoutError as e:  # the config's mesh.num_devices does not fit N
    return _fail(f"cannot plan: {e}")
  print(json.dumps(prediction.to_json()) if FLAGS.json else placement.format_text(prediction))
  return 0


def _plan_target(cfg) -> int:
  """``ihsweep plan --target=NAME``: every group compiled for the target (``ihsweep.targets``)."""
  from ihsweep import plan as plan_lib
  from ihsweep import targets
  from ihsweep.config import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.law import Law, LawError

  if cfg is None:
    return _fail(f"plan --target needs --config=FILE; --target: {targets.names()}")
  for name in ("devices_per_worker", "devices_per_host", "flops_per_s", "network"):
    if getattr(FLAGS, name) is not None:
      return _fail(
        f"--{name} is not allowed with --target: the target sets devices per host and "
        f"times come from its compiled programs"
      )
  if FLAGS.law == "":
    return _fail("--law= is empty: give a law JSON file, or leave --law out for the sweep's law")
  try:
    law = Law.from_json(FLAGS.law) if FLAGS.law else None
    plan_lib.add_axes(cfg, FLAGS.grid, "grid")
    plan_lib.add_axes(cfg, FLAGS.zip, "zip")
    target = targets.make_target(FLAGS.target, FLAGS.devices)
    result = targets.plan_for_target(
      cfg, target, law, log=lambda line: print(line, file=sys.stderr, flush=True)
    )
  except targets.TargetError as e:
    return _fail(str(e))
  except (ConfigError, DataError) as e:
    return _bad_input(e)
  except LawError as e:
    return _fail(f"--law={FLAGS.law}: {e}" if FLAGS.law else str(e))
  print(json.dumps(result) if FLAGS.json else targets.format_plan(result))
  return 0 if result["fits"] else 1


def _export(argv):
  """``ihsweep export``: one model of a run directory to TransformerLens or Hugging Face
  (``ihsweep.export.export_run``); each bad flag value is one line naming it."""
  del argv
  from ihsweep import export, notebook

  targets = "|".join(export.TARGETS)
  usage = f"export needs --workdir=DIR --cell=N --to={targets} (--step=S, --out=PATH optional)"
  missing = [f"--{name}" for name in ("workdir", "cell", "to") if getattr(FLAGS, name) is None]
  if missing:
    return _fail(f"{usage}; missing {', '.join(missing)}")
  if FLAGS.to not in export.TARGETS:
    return _fail(
      f"--to={FLAGS.to} is not allowed: transformer_lens (a TransformerLens HookedTransformer, "
      f"any ihsweep model) or hf (a Hugging Face GPT2LMHeadModel: learned positions with MLPs)"
    )
  logging.getLogger("datasets").setLevel(logging.WARNING)  # imported by transformer_lens
  workdir = FLAGS.workdir
  if not os.path.isdir(workdir):
    return _fail(f"--workdir={workdir}: no such directory (a run directory of ihsweep run/train)")
  try:
    run = notebook.load_run(workdir)
  except notebook.NotARun as e:
    return _fail(f"--workdir={workdir}: {e}")
  try:
    out, step = export.export_run(run, FLAGS.cell, FLAGS.step, FLAGS.to, FLAGS.out)
  except notebook.UnknownCell as e:
    return _fail(f"--cell={FLAGS.cell}: {e}")
  except notebook.StepNotSaved as e:
    return _fail(f"--step={FLAGS.step}: {e}")
  except notebook.CheckpointUnreadable as e:
    flag = "--step" if FLAGS.step is None else f"--step={FLAGS.step}"
    return _fail(f"{flag}: {e}{'; choose one with --step=S' if FLAGS.step is None else ''}")
  except export.ExportError as e:
    text = str(e)
    return _fail(text if text.startswith("--") else f"--to={FLAGS.to}: {text}")
  except ModuleNotFoundError as e:
    if export.INSTALL not in str(e):
      raise
    return _fail(str(e))
  finally:
    run.close()
  what = "HookedTransformer file" if FLAGS.to == "transformer_lens" else "save_pretrained directory"
  print(f"exported cell {FLAGS.cell} at step {step} of {workdir} to {out} ({what})")
  return 0


def _count(x: float, per: float = 1.0, unit: str = "") -> str:
  """``x / per`` with thousands separators and ``unit`` (``_count(2.5e7, 1e6, "M") ==
  "25.0M"``), or ``x`` in scientific notation where that would be long or round to 0
  (``_count(3.2e20) == "3.2e+20"``)."""
  if per <= x < 1e12 * per:
    return f"{x / per:,.{1 if per > 1 else 0}f}{unit}"
  return f"{x:.3g}"


def _corpus(argv):
  from ihsweep.data import natural
  from ihsweep.data.errors import DataError

  args = argv[1:]
  try:
    if args[:1] == ["fetch"] and len(args) == 2:
      path = natural.fetch_corpus(args[1], FLAGS.cache_dir)
      print(
        f"fetched {args[1]} into {path}; train on it with "
        f"--config.data.source=natural --config.data.corpus={args[1]}"
      )
      return 0
    if args == ["prepare"]:
      return _corpus_prepare()
  except DataError as e:
    return _fail(str(e))
  return _fail(
    "usage: ihsweep corpus fetch NAME [--cache_dir=DIR] | ihsweep corpus prepare "
    f"--config=FILE (corpora: {', '.join(natural.CORPORA)})"
  )


def _corpus_prepare():
  from ihsweep import config as config_lib
  from ihsweep.data import natural

  cfg, failed = _load_config()
  if failed is not None:
    return failed
  if cfg is None:
    return _fail("corpus prepare needs --config=FILE")
  from ihsweep.data import bigram_corpus_tokens

  if cfg.data.source == "natural":
    vocab, field = cfg.model.vocab_size, "model.vocab_size"
  elif cfg.data.source == "markov" and cfg.data.transitions == "bigram":
    vocab, field = bigram_corpus_tokens(cfg.data, cfg.model.vocab_size)
  else:
    return _fail(
      f"config.data.source = {cfg.data.source!r}: corpus prepare needs 'natural' "
      f"or 'markov' with data.transitions = 'bigram'"
    )
  try:
    config_lib.validate(cfg)
    corpus = natural.prepare_corpus(cfg.data, vocab, field)
  except config_lib.ConfigError as e:
    return _fail(f"invalid config: {e}")
  print(json.dumps({"path": corpus.path, "cache_hit": corpus.cache_hit, **corpus.meta}, indent=2))
  return 0


COMMAND_HELP = {
  "run": """usage: ihsweep run --config=FILE[:VARIANT] --workdir=DIR [--noprogress]
                   [--config.SECTION.FIELD=VALUE ...]

  Trains every cell of the config's sweep section (grid × zip × seeds; no section: one grid
  point with ensemble.size seeds), one compiled ensemble per group of cells with equal shapes,
  and writes DIR/cells.csv, DIR/groups/gNNN/ (each a run directory), DIR/sweep.json.
  Rerunning the same command skips finished groups and resumes the others. SIGTERM saves the
  running group's state and exits with status 143. Several processes on one run directory are
  workers that take groups side by side (launch/*.sh: independent processes, or the processes
  of one jax.distributed job, in phases of workers of sweep.processes_per_worker processes);
  --config.sweep.placement=global trains every group on one mesh of all devices.
  --grid=FIELD=V1,V2,...   a grid axis (repeatable), e.g. --grid=train.batch_size=8,16
  --zip=FIELD=V1,V2,...    an axis of values varied together with the other --zip axes
  --config.sweep.grid.train.batch_size="(8,16)"   change an axis the config file defines
  --config.sweep.budget=updates|tokens|law|emergence (fields: ihsweep/config.py default_sweep)""",
  "status": """usage: ihsweep status --workdir=DIR

  Reads a sweep's run directory (cells.csv, groups/*/status.json, train logs) and prints each
  group's state — done, running, pending, failed, interrupted — with its progress and diverged
  cells. Touches nothing.""",
  "train": """usage: ihsweep train --config=FILE[:VARIANT] --workdir=DIR [--noprogress]
                     [--config.SECTION.FIELD=VALUE ...]

  --config     an ml_collections config file with get_config(), e.g. configs/default.py;
               FILE:VARIANT passes VARIANT (configs/default.py: tiny, python_docs, or both
               comma-separated: configs/default.py:tiny,python_docs)
  --workdir    run directory (created if missing): config.json, metrics.jsonl
  --progress   progress bar (default on; --noprogress turns it off)
  --config.SECTION.FIELD=VALUE overrides any field; the fields are listed in
               docs/configuration.md, configs/default.py and ihsweep/data/__init__.py
               (default_config).""",
  "corpus": """usage: ihsweep corpus fetch NAME [--cache_dir=DIR]
       ihsweep corpus prepare --config=FILE[:VARIANT] [--config.data.FIELD=VALUE ...]

  fetch NAME   download an embedded corpus into the cache (NAME: python-docs, the Python
               documentation from Debian's python3-doc; needs apt-get and dpkg, no root)
  prepare      read, split, tokenize and cache the config's natural-text corpus (e.g. once
               before a sweep) and print its counts as JSON
  --cache_dir  fetch: the cache (default $IHSWEEP_CACHE or ~/.cache/ihsweep); training and
               prepare read config.data.cache_dir""",
  "predict": """usage: ihsweep predict --batch_size=B --context_size=C [--law=FILE] [--json]

  Updates (UPT = T / (B^alpha · C^beta)) and tokens (UPT · B · C) until induction heads form.
  --law        a law JSON {"log_T": ..., "alpha": ..., "beta": ...} (or "T" for log_T; other
               keys ignored, but a fitted "gamma" (model size) is refused); default: the
               study's ln T = 13.26, alpha = 0.37, beta = 0.62
  --json       one JSON object: batch_size, context_size, updates, tokens, law""",
  "plan": """usage: ihsweep plan --config=FILE[:VARIANT] --devices=N [--devices_per_worker=D]
                    [--flops_per_s=F [--devices_per_host=H] [--network=NAME]] [--law=FILE]
                    [--json]
                    [--grid=FIELD=V1,V2,...] [--zip=FIELD=V1,V2,...]
                    [--config.SECTION.FIELD=VALUE ...]
       ihsweep plan --config=FILE[:VARIANT] --target=NAME [--devices=N] [--law=FILE] [--json]

  --target=NAME compiles every group's train and evaluation programs for an accelerator this
  machine need not have — a TPU topology (v5e:8x8, v4:4x4x4, v5p:4x4x4, v6e:8x8: the TPU
  compiler, from libtpu: pip install 'ihsweep[tpu]') or a GPU (h100-80gb, h200-141gb,
  a100-80gb, with --devices=N: the XLA CPU compiler's memory analysis, an estimate) — and
  reports per group the mesh, gradient_accumulation_steps, vmap chunk, bytes per device
  against the device's memory, FLOPs and a roofline time (compiled on the fewest devices per
  worker at which every group fits), then the layout with the shortest roofline makespan
  (exit 1 if some group fits nowhere).

  Predicts, without training, how the config's sweep runs on N devices: each group's cost
  (FLOPs) and time, the schedule, the makespan and the device utilisation (busy share of
  device-time), under the new rule (sweep.placement=worker: in one or more phases, workers of
  one or several processes take the phase's groups most expensive first, each group on as many
  of its worker's devices as it can use; phases chosen as `ihsweep run` chooses them with
  sweep.processes_per_worker=0) and today's (sweep.placement=global: every group on one mesh
  of all N, or refused).
  --devices=N            the sweep's devices (any count: this machine need not have them)
  --devices_per_worker=D one phase of workers of D devices: a divisor of a host's devices (one
                         process each) or, with --flops_per_s, a multiple of them (workers
                         spanning hosts); default: the phases chosen from the groups' costs
                         (measured: this machine's devices, one worker)
  --flops_per_s=F        sustained FLOP/s per device (an H100 at 40% MFU in bf16: 4e14): time =
                         cost / (m · F) + updates × the gradient all-reduce over its data axis,
                         no start-up; without it a few groups are compiled and timed here
                         (about 20 s each on a CPU)
  --devices_per_host=H   with --flops_per_s: the devices of one process (a host; default 8)
  --network=NAME         with --flops_per_s: the interconnect, per device each way: h100
                         (default; NVLink 450 GB/s in a host, InfiniBand 50 GB/s across),
                         v5e (ICI 200 GB/s), v5p (ICI 600 GB/s), none (no communication);
                         60 s per phase switch (assumed) unless none
  --law=FILE             an emergence law JSON (log_T, alpha, beta; e.g. from analysis
                         fit-law): where an 'emergence' budget stops each group (default: the
                         sweep's law, which puts most stops at the cap)
  --json                 one JSON object: groups, phases, schedule, makespan_s, utilisation,
                         layouts, global (today's rule, with refused)
  --grid=FIELD=V1,V2,... / --zip=FIELD=V1,V2,...  axes, as for ihsweep run""",
  "export": """usage: ihsweep export --workdir=DIR --cell=N [--step=S] --to=transformer_lens|hf
                      [--out=PATH]

  Writes model N (a cell id of the run: a sweep's cells.csv, or 0 … E-1 of ihsweep train) after
  S updates (a saved params checkpoint; default: the last) to a new path (an existing one is
  refused): --out, default DIR/analysis/export/cellN_stepS.pt (hf: cellN_stepS_hf/); inside DIR
  only under DIR/analysis/export/. The exported model computes the same logits as ihsweep's own
  forward.
  --to=transformer_lens  one file (torch.save: cfg, state_dict); open it with
                         ihsweep.export.load_transformer_lens(PATH), or
                         HookedTransformer(blob["cfg"]).load_state_dict(blob["state_dict"]).
                         Every ihsweep architecture (learned or rotary positions, MLPs or
                         attention-only, tied or untied embeddings)
  --to=hf                a save_pretrained directory: GPT2LMHeadModel.from_pretrained(PATH);
                         learned positions with MLPs only (GPT-2 has no rotary positions and an
                         MLP in every block)
  Needs the interop extra: pip install 'ihsweep[interop]'.""",
}


CONFIG_LOAD_ERRORS = (AttributeError, KeyError, OSError, ValueError, TypeError, ImportError)


def _config_imports_siblings(config_arg: str) -> None:
  """Lets a config file (``--config`` value ``config_arg``) import its siblings as a package
  (``from configs import default``): appends the directory above the config file's directory to
  ``sys.path`` (appended, so it never shadows an installed module)."""
  if config_arg:
    root = os.path.dirname(os.path.dirname(os.path.abspath(config_arg.split(":", 1)[0])))
    if root not in sys.path:
      sys.path.append(root)


def _config_file_error(e: BaseException, config_arg: str) -> str | None:
  """``FILE line N: Type: message`` for the error that the config file (``--config`` value
  ``config_arg``) raised, found in ``e``'s chain (causes, contexts) by the innermost traceback
  frame — or, for a SyntaxError, the position — inside that file; None if the file raised
  nothing."""
  path = config_arg.split(":", 1)[0]
  if not path:
    return None
  here, found, seen = os.path.abspath(path), None, set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, SyntaxError) and e.filename and os.path.abspath(e.filename) == here:
      found = f"{path} line {e.lineno}: {type(e).__name__}: {e.msg}"
    else:
      lines = [
        f.lineno
        for f in traceback.extract_tb(e.__traceback__)
        if os.path.abspath(f.filename) == here
      ]
      if lines:
        found = f"{path} line {lines[-1]}: {type(e).__name__}: {_one_line(e)}"
    e = e.__cause__ or e.__context__
  return found


def _one_line(err: BaseException) -> str:
  """``err``'s message on one line (a KeyError's quotes around its key removed)."""
  text = " ".join(str(err).replace("\\n", " ").split()).replace("\\'", "'")
  return text[1:-1] if isinstance(err, KeyError) and text[:1] in "'\"" else text


def _config_load_failed(e: Exception, found=()) -> int:
  """One line for a config file that raises (where in the file, and what), has no
  get_config(), or an override of no field (``found``: the flags, ``_split_args``)."""
  bad = _bad_override(found)
  if bad is not None:
    return _fail(f"cannot load the config: {bad}")
  path = _config_arg(found).split(":", 1)[0]
  in_file = _config_file_error(e, path)
  if in_file:
    return _fail(f"cannot load the config: {in_file}")
  root = e
  while root.__cause__ is not None or root.__context__ is not None:
    root = root.__cause__ or root.__context__
  if isinstance(root, AttributeError) and getattr(root, "name", None) == "get_config":
    return _fail(
      f"{path} has no get_config() (a config file is Python defining get_config(), "
      f"e.g. configs/default.py)"
    )
  msg = (
    _one_line(root) if root is e else f"{_one_line(e)} ({type(root).__name__}: {_one_line(root)})"
  )
  return _fail(f"cannot load the config: {path + ': ' if path else ''}{msg}")


def _fail(message: str) -> int:
  print(f"ihsweep: {message}", file=sys.stderr)
  return 2


def _analysis(argv) -> int:
  """``ihsweep report|fit-law ...``: ``python -m analysis`` under its installed name, so from any
  directory. The training package never imports analysis; only this command does, lazily."""
  try:
    from ihsweep_analysis.__main__ import main as analysis_main
  except ModuleNotFoundError as e:
    if e.name != "ihsweep_analysis":
      raise
    return _fail(
      f"{argv[1]}: the analysis package (ihsweep_analysis) is not installed: "
      f"`pip install -e .` in the repository installs it, or run `python -m analysis "
      f"{argv[1]}` from the repository"
    )
  return analysis_main(argv[1:], prog="ihsweep")


def _usage() -> str:
  lines = ["usage: ihsweep COMMAND [flags]", "", "commands:"]
  lines += [f"  {name:8s} {doc}" for name, doc in {**COMMANDS, **ANALYSIS_COMMANDS}.items()]
  lines += ["", "ihsweep COMMAND --help lists the flags."]
  return "\n".join(lines)


def main(argv=None) -> int:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  command = argv[1]
  if command in ANALYSIS_COMMANDS:
    return _analysis(argv)
  if command not in COMMANDS:
    print(f"ihsweep: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
    return 2
  if any(a in ("-h", "--help", "--helpfull", "help") for a in argv[2:]):
    print(f"{COMMAND_HELP[command]}\n\n  flags: {_flag_list(command)}")
    return 0
  try:
    args = FLAGS.read_flags_from_files(argv[2:], force_gnu=False)
  except flags.Error as e:  # an unreadable --flagfile
    return _fail(" ".join(str(e).replace("ERROR::", "").split()))
  found, positional = _split_args(args)
  problem = _check_flags(command, found, positional)
  if problem is not None:
    return _fail(problem)
  from ihsweep.sharding import initialize_distributed, use_one_cpu_device_per_core

  use_one_cpu_device_per_core()  # only matters on CPU; before JAX picks its devices
  logging.basicConfig(
    level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
  )
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save progress lines
  handler = {
    "run": _run,
    "status": _status,
    "train": _train,
    "corpus": _corpus,
    "predict": _predict,
    "plan": _plan,
    "export": _export,
  }[command]
  _config_imports_siblings(_config_arg(found))
  try:  # parse here, not in app.run, so that a bad config file or override is one line
    _ARGV[:] = [f"{argv[0]} {command}"] + args
    rest = FLAGS(list(_ARGV))
  except flags.Error as e:  # ml_collections puts the config file's traceback in the message
    if _config_file_error(e, _config_arg(found)):
      return _config_load_failed(e, found)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return _fail(" ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines))
  except Exception as e:  # loading runs the config file: any error (SyntaxError, NameError, ...)
    return _config_load_failed(e, found)
  if FLAGS.workdir:  # `--workdir=~/runs/x`: the shell leaves a `~` after `=` alone
    FLAGS.workdir = os.path.expanduser(FLAGS.workdir)
  if command in ("run", "train", "status", "plan", "export") and len(rest) > 1:
    # e.g. a space inside an unquoted path: the tail would otherwise be dropped silently
    return _fail(
      f"{command} takes flags only, got {' '.join(rest[1:])!r} (quote values that contain spaces)"
    )
  if command in ("run", "train", "plan"):
    from ihsweep import compile_cache

    compile_cache.enable()  # a rerun or the next group of equal shapes compiles nothing again
  if command in ("run", "train"):
    from ihsweep.runner import install_stop_handlers

    initialize_distributed()
    install_stop_handlers()  # SIGTERM (preemption): checkpoint, then exit
  try:
    return int(handler(rest) or 0)
  except Exception as e:  # a full disk anywhere (checkpoints, logs, a sweep's tables): one line
    from ihsweep.checkpoint import DiskFull, disk_full_cause

    if disk_full_cause(e) is not None:
      print(
        f"ihsweep: {e if isinstance(e, DiskFull) else DiskFull(FLAGS.workdir)}", file=sys.stderr
      )
      return DiskFull.EXIT_CODE
    text = str(e)
    if "RESOURCE_EXHAUSTED" not in text or "memory" not in text.lower():
      raise
    # Device memory: the model, B × C or the evaluation's probes do not fit. Exit at once:
    # orbax's background threads would otherwise wait minutes for the save that failed.
    first = text.splitlines()[0][:200]
    print(
      f"ihsweep: out of device memory ({first}); lower train.batch_size, "
      f"train.context_size, the model size or eval.n_probes (the run directory keeps its last "
      f"complete checkpoint: rerun to resume)",
      file=sys.stderr,
      flush=True,
    )
    os._exit(1)


if __name__ == "__main__":
  sys.exit(main())
