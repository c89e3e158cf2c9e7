"""The ``ihsweep`` command.

  ihsweep run --config=FILE --workdir=DIR [--grid=train.batch_size=8,16 ...]
  ihsweep status --workdir=DIR
  ihsweep train --config=configs/default.py --workdir=DIR [--config.train.lr=3e-4 ...]
  ihsweep corpus fetch python-docs [--cache_dir=DIR]
  ihsweep corpus prepare --config=FILE   (tokenize and cache the config's corpus; print counts)
  ihsweep predict --batch_size=B --context_size=C [--law=FILE] [--json]

Flags are parsed by absl; ``--config`` is an ml_collections config file with ``get_config()``
(``FILE:ARG`` passes ARG to it) and every field can be overridden as ``--config.a.b=value``.
"""

from __future__ import annotations

import json
import logging
import os
import sys

from absl import flags
from ml_collections import config_flags

COMMANDS = {
    "run": "run a sweep: the config's sweep.grid × seeds, one ensemble per group of equal shapes",
    "status": "per-group state of a sweep's run directory (done, running, pending, failed)",
    "train": "train one ensemble (config sections model/train/ensemble/data/mesh)",
    "corpus": "corpus fetch NAME (embedded corpora: python-docs) | corpus prepare --config=FILE",
    "predict": "updates and tokens until induction heads form, by the emergence law",
}

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "config file (configs/*.py), FILE[:ARG]",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "run directory (created if missing)")
flags.DEFINE_bool("progress", True, "show a progress bar")
flags.DEFINE_integer("batch_size", None, "predict: batch size B (sequences per update)")
flags.DEFINE_integer("context_size", None, "predict: context size C (tokens per sequence)")
flags.DEFINE_string("law", None, "predict: a law JSON with log_T (or T), alpha, beta; default: "
                    "the study's ln T = 13.26, alpha = 0.37, beta = 0.62")
flags.DEFINE_multi_string("grid", [], "run: a sweep axis FIELD=V1,V2,... (repeatable; adds to "
                          "or replaces the config's sweep.grid), e.g. --grid=train.batch_size=8,16")
flags.DEFINE_multi_string("zip", [], "run: a zipped sweep axis FIELD=V1,V2,... (zip axes vary "
                          "together)")
flags.DEFINE_bool("json", False, "predict: print one JSON object")
flags.DEFINE_string("cache_dir", None, "corpus fetch: cache directory (default: $IHSWEEP_CACHE "
                    "or ~/.cache/ihsweep; training reads config.data.cache_dir)")


def _load_config():
  """``(cfg, None)``, or ``(None, exit code)`` after printing why the config did not load."""
  try:  # a config file that failed to load raises on first use, not on parsing
    cfg = FLAGS.config
    if cfg is not None:
      cfg.keys()
    return cfg, None
  except CONFIG_LOAD_ERRORS as e:
    return None, _config_load_failed(e)


def _config_and_workdir(command: str):
  """``(cfg, None)`` for a training command, or ``(None, exit code)`` after printing why the
  config or ``--workdir`` cannot be used."""
  cfg, failed = _load_config()
  if failed is not None:
    return None, failed
  if cfg is None or FLAGS.workdir is None:
    return None, _fail(f"{command} needs --config=FILE and --workdir=DIR")
  if os.path.exists(FLAGS.workdir) and not os.path.isdir(FLAGS.workdir):
    return None, _fail(f"--workdir={FLAGS.workdir} exists and is not a directory")
  return cfg, None


def _bad_input(e: Exception) -> int:
  """One line for a ConfigError or DataError (CheckpointError included) raised before or while
  training; exit code 2."""
  from ihsweep.checkpoint import CheckpointError
  from ihsweep.config import ConfigError
  kind = ("invalid config" if isinstance(e, ConfigError)
          else "checkpoint" if isinstance(e, CheckpointError) else "data")
  return _fail(f"{kind}: {e}")


def _train(argv):
  del argv
  from ihsweep.config import ConfigError
  from ihsweep.data.errors import DataError
  from ihsweep.runner import Interrupted, fit
  cfg, failed = _config_and_workdir("train")
  if failed is not None:
    return failed
  try:
    out = fit(cfg, FLAGS.workdir, progress=FLAGS.progress)
  except Interrupted as e:
    print(f"interrupted: {e}", file=sys.stderr)
    return 143
  except (ConfigError, DataError) as e:
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
  from ihsweep import sweep
  from ihsweep.config import ConfigError
  from ihsweep.data.errors import DataError
  cfg, failed = _config_and_workdir("run")
  if failed is not None:
    return failed
  try:
    sweep.add_axes(cfg, FLAGS.grid, "grid")
    sweep.add_axes(cfg, FLAGS.zip, "zip")
    result = sweep.run(cfg, FLAGS.workdir, progress=FLAGS.progress)
  except sweep.GroupFailed as e:
    _fail(f"{e} (process {jax.process_index()}); details in its status.json; rerun the command "
          f"to retry it")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)  # not jax.distributed's shutdown barrier: a peer may be gone
  except (ConfigError, DataError) as e:
    return _bad_input(e)
  failed_groups = [g for g, s in result.groups.items() if s["state"] == "failed"]
  if jax.process_index() == 0:
    print(sweep.format_summary(result.summary))
  if result.interrupted:
    print(f"interrupted: state saved; rerun the same command to resume ({FLAGS.workdir})",
          file=sys.stderr)
    return 143
  if failed_groups:
    print(f"ihsweep: groups {', '.join(failed_groups)} failed (errors in their status.json; "
          f"`ihsweep status --workdir={FLAGS.workdir}`); rerun to retry them", file=sys.stderr)
    return 1
  return 0


def _status(argv):
  del argv
  from ihsweep import sweep
  if FLAGS.workdir is None:
    return _fail("status needs --workdir=DIR")
  try:
    print(sweep.format_status(FLAGS.workdir))
  except sweep.NotASweep as e:
    return _fail(str(e))
  return 0


def _predict(argv):
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
  except LawError as e:
    return _fail(str(e))
  if FLAGS.json:
    print(json.dumps({"batch_size": b, "context_size": c, "updates": updates, "tokens": tokens,
                      "law": law.to_dict()}))
    return 0
  print(f"B = {b:g}, C = {c:g}: induction heads predicted after {updates:,.0f} updates "
        f"= {tokens / 1e6:,.1f}M tokens")
  print(f"law: UPT = T / (B^{law.alpha:g} · C^{law.beta:g}), ln T = {law.log_T:g} "
        f"(T = {law.T:,.0f}); {law.source}")
  return 0


def _corpus(argv):
  from ihsweep.data import natural
  from ihsweep.data.errors import DataError
  args = argv[1:]
  try:
    if args[:1] == ["fetch"] and len(args) == 2:
      path = natural.fetch_corpus(args[1], FLAGS.cache_dir)
      print(f"fetched {args[1]} into {path}; train on it with "
            f"--config.data.source=natural --config.data.corpus={args[1]}")
      return 0
    if args == ["prepare"]:
      return _corpus_prepare()
  except DataError as e:
    return _fail(str(e))
  return _fail("usage: ihsweep corpus fetch NAME [--cache_dir=DIR] | ihsweep corpus prepare "
               f"--config=FILE (corpora: {', '.join(natural.CORPORA)})")


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
    return _fail(f"config.data.source = {cfg.data.source!r}: corpus prepare needs 'natural' "
                 f"or 'markov' with data.transitions = 'bigram'")
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
  running group's state and exits with status 143. Several processes (launch/*.sh) train each
  group together on one global mesh.
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
  --config.SECTION.FIELD=VALUE overrides any field; the fields are listed in the README and in
               configs/default.py and ihsweep/data/__init__.py (default_config).""",
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
               keys ignored); default: the study's ln T = 13.26, alpha = 0.37, beta = 0.62
  --json       one JSON object: batch_size, context_size, updates, tokens, law""",
}


CONFIG_LOAD_ERRORS = (AttributeError, KeyError, OSError, ValueError, TypeError, ImportError)


def _config_imports_siblings(argv) -> None:
  """Lets a config file import its siblings as a package (``from configs import default``):
  appends the directory above the config file's directory to ``sys.path`` (appended, so it
  never shadows an installed module)."""
  for arg in argv:
    if arg.startswith("--config="):
      path = arg.split("=", 1)[1].split(":", 1)[0]
      root = os.path.dirname(os.path.dirname(os.path.abspath(path)))
      if root not in sys.path:
        sys.path.append(root)


def _config_load_failed(e: Exception) -> int:
  """One line for a config file that is missing or raises, or an override of no field."""
  if any(a.startswith(("--config.sweep.grid.", "--config.sweep.zip.")) for a in sys.argv):
    _fail("(an override --config.sweep.grid.X only changes an axis the config file defines; "
          "add an axis with --grid=FIELD=V1,V2,...)")
  def text(err):
    return " ".join(str(err).replace("\\n", " ").split()).replace("\\'", "'").strip("'\"")

  root = e
  while root.__cause__ is not None or root.__context__ is not None:
    root = root.__cause__ or root.__context__
  msg = text(root) if root is e else f"{text(e)} ({type(root).__name__}: {text(root)})"
  return _fail(f"cannot load the config: {msg}")


def _fail(message: str) -> int:
  print(f"ihsweep: {message}", file=sys.stderr)
  return 2


def _usage() -> str:
  lines = ["usage: ihsweep COMMAND [flags]", "", "commands:"]
  lines += [f"  {name:8s} {doc}" for name, doc in COMMANDS.items()]
  lines += ["", "ihsweep COMMAND --help lists the flags."]
  return "\n".join(lines)


def main(argv=None) -> int:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  command = argv[1]
  if command not in COMMANDS:
    print(f"ihsweep: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
    return 2
  if any(a in ("-h", "--help", "--helpfull", "help") for a in argv[2:]):
    print(COMMAND_HELP[command])
    return 0
  from ihsweep.sharding import initialize_distributed, use_one_cpu_device_per_core
  use_one_cpu_device_per_core()  # only matters on CPU; before JAX picks its devices
  logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                      datefmt="%H:%M:%S")
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter
  logging.getLogger("absl").setLevel(logging.WARNING)  # orbax's per-save progress lines
  handler = {"run": _run, "status": _status, "train": _train, "corpus": _corpus,
             "predict": _predict}[command]
  _config_imports_siblings(argv[2:])
  try:  # parse here, not in app.run, so that a bad config file or override is one line
    rest = FLAGS([f"{argv[0]} {command}"] + argv[2:])
  except flags.Error as e:  # ml_collections puts the config file's traceback in the message
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return _fail(" ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines))
  except CONFIG_LOAD_ERRORS as e:
    return _config_load_failed(e)
  if command in ("run", "train", "status") and len(rest) > 1:
    # e.g. a space inside an unquoted path: the tail would otherwise be dropped silently
    return _fail(f"{command} takes flags only, got {' '.join(rest[1:])!r} (quote values that "
                 f"contain spaces)")
  if command in ("run", "train"):
    from ihsweep.runner import install_stop_handlers
    initialize_distributed()
    install_stop_handlers()  # SIGTERM (preemption): checkpoint, then exit
  try:
    return int(handler(rest) or 0)
  except Exception as e:  # a full disk anywhere (checkpoints, logs, a sweep's tables): one line
    from ihsweep.checkpoint import DiskFull, disk_full_cause
    if disk_full_cause(e) is None:
      raise
    print(f"ihsweep: {e if isinstance(e, DiskFull) else DiskFull(FLAGS.workdir)}", file=sys.stderr)
    return DiskFull.EXIT_CODE

if __name__ == "__main__":
  sys.exit(main())
