"""What the ``ihsweep`` commands share: the one-line failure (``fail``), loading the config
(``load_config``, with one line for a config file that fails or an override of no field), the
run directory of a training command (``config_and_workdir``) and one line for bad input
(``bad_input``).

No JAX at module level: ``ihsweep --help`` imports this module.
"""

from __future__ import annotations

import difflib
import logging
import os
import sys
import traceback

from absl import flags

from ihsweep.base.errors import StorageFault
from ihsweep.commands.flags import ARGV, FLAGS, config_arg, split_args

CONFIG_LOAD_ERRORS = (AttributeError, KeyError, OSError, ValueError, TypeError, ImportError)


def fail(message: str) -> int:
  """Prints ``ihsweep: message`` on stderr; exit code 2."""
  print(f"ihsweep: {message}", file=sys.stderr)
  return 2


def empty_law(default: str) -> int | None:
  """Exit code 2 after one line when --law is given empty (it would read as not given);
  ``default``: whose law applies without --law ("study's", "sweep's")."""
  if FLAGS.law == "":
    return fail(f"--law= is empty: give a law JSON file, or leave --law out for the {default} law")
  return None


def load_config():
  """``(cfg, None)``, or ``(None, exit code)`` after printing why the config did not load
  (or why an override would be ignored: ``overridden_axis``)."""
  found = split_args(ARGV[1:])[0]
  try:  # a config file that failed to load raises on first use, not on parsing
    cfg = FLAGS.config
    if hasattr(cfg, "keys"):  # anything else get_config() returned is named below
      cfg.keys()
  except CONFIG_LOAD_ERRORS as e:
    return None, config_load_failed(e, found)
  if config_arg(found) and not hasattr(cfg, "keys"):
    return None, fail(
      f"cannot load the config: {config_arg(found).split(':', 1)[0]}: get_config() returned "
      f"{repr(cfg)[:60]} (it must return the config, a ml_collections.ConfigDict)"
    )
  problem = overridden_axis(cfg, found) if cfg is not None else None
  if problem:
    return None, fail(problem)
  return cfg, None


def _axis_values(cfg, path: str):
  """The values the config's ``sweep.grid`` or ``sweep.zip`` gives the field ``path``
  (``train.batch_size``), with the section's name; None if no axis sets it."""
  sweep = cfg.get("sweep") if hasattr(cfg, "get") else None
  for section in ("grid", "zip"):
    node = sweep.get(section) if sweep is not None and hasattr(sweep, "get") else None
    for part in path.split("."):
      if node is None or not hasattr(node, "keys") or part not in node:
        node = None
        break
      node = node[part]
    if node is not None and not hasattr(node, "keys"):
      return section, node
  return None


def overridden_axis(cfg, found) -> str | None:
  """Why an override ``--config.PATH=V`` (``found``: the flags) would be ignored: a field that
  an axis of the sweep (``sweep.grid`` / ``sweep.zip``) sets for every cell, so ``V`` would
  never be used; None if no override is."""
  for name, flag, value in found:
    if flag != "config" or "." not in name:
      continue
    path = name.split(".", 1)[1]
    if path.startswith("sweep."):
      continue
    axis = _axis_values(cfg, path)
    if axis is None:
      continue
    section, values = axis
    values = tuple(values) if isinstance(values, (list, tuple)) else values
    return (
      f"--config.{path}={value} would be ignored: the sweep's axis sweep.{section}.{path} "
      f"= {values!r} sets it for every cell; change the axis instead "
      f"(--config.sweep.{section}.{path}='(V1, V2)', or --{section}={path}=V1,V2)"
    )
  return None


def add_axis_flags(cfg) -> str | None:
  """Adds the ``--grid`` and ``--zip`` axes to ``cfg`` (``axes.add_axes``; ConfigError for a
  malformed one); then, as ``load_config`` for the config file's axes, why a ``--config.X=V``
  override would be ignored because an axis now sets ``X`` (``overridden_axis``), or None."""
  from ihsweep.configuration import axes as axes_lib

  axes_lib.add_axes(cfg, FLAGS.grid, "grid")
  axes_lib.add_axes(cfg, FLAGS.zip, "zip")
  if not FLAGS.grid and not FLAGS.zip:
    return None
  return overridden_axis(cfg, split_args(ARGV[1:])[0])


def config_and_workdir(command: str):
  """``(cfg, None)`` for a training command, or ``(None, exit code)`` after printing why the
  config or ``--workdir`` cannot be used."""
  cfg, failed = load_config()
  if failed is not None:
    return None, failed
  if cfg is None or FLAGS.workdir is None:
    return None, fail(f"{command} needs --config=FILE and --workdir=DIR")
  if not FLAGS.workdir:
    return None, fail(f"--workdir= is empty: give {command} a run directory")
  if os.path.exists(FLAGS.workdir) and not os.path.isdir(FLAGS.workdir):
    return None, fail(f"--workdir={FLAGS.workdir} exists and is not a directory")
  return cfg, None


def bad_input(e: Exception) -> int:
  """One line for a ConfigError (WorkdirError included) or DataError (CheckpointError included)
  raised before or while training; exit code 2."""
  from ihsweep.configuration.fields import ConfigError, WorkdirError
  from ihsweep.runs.checkpoint import CheckpointError

  if isinstance(e, WorkdirError):  # a flag, not a config field: "--workdir=DIR ..."
    return fail(str(e))
  kind = (
    "invalid config"
    if isinstance(e, ConfigError)
    else "checkpoint"
    if isinstance(e, CheckpointError)
    else "data"
  )
  return fail(f"{kind}: {e}")


def bad_override(found) -> str | None:
  """The first ``--config.PATH`` override in ``found`` that names no field of the config file,
  and which fields there are; None if there is none (or the config file does not load)."""
  paths = [name.split(".", 1)[1] for name, flag, _ in found if flag == "config" and "." in name]
  if not paths or not config_arg(found):
    return None
  try:
    cfg = FLAGS["config"].parser.parse(config_arg(found))
    cfg.keys()
  except Exception:  # the config file itself fails: config_load_failed says why
    return None
  for path in paths:
    problem = _no_field(cfg, path)
    if problem:
      return problem
  return None


def _optional_field(path: str) -> str | None:
  """Why an optional field the config does not set (``schema.Field.in_defaults`` False, e.g.
  model.ln_eps) cannot be given as ``--config.PATH``, or None for any other path."""
  from ihsweep.base import schema

  try:
    f = schema.field(path)
  except KeyError:
    return None
  if f.in_defaults:
    return None
  return (
    f"{path} is an optional field (default {f.default!r}) that this config file does not set, "
    f"and --config.X can only override a field the file sets: set it in the config file "
    f"(config.{path} = ... in its get_config)"
  )


def _no_field(cfg, path: str) -> str | None:
  """Why ``--config.PATH`` names no field of ``cfg`` (with the fields there are), or None."""
  node, done = cfg, []
  for part in path.split("."):
    here = ".".join(done) or "the config"
    if not hasattr(node, "keys"):
      return f"--config.{path}: {here} is a {type(node).__name__}, not a section"
    if part not in node:
      optional = _optional_field(".".join(done + [part]))
      if optional:
        return f"--config.{path}: {optional}"
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


# The checkout ihsweep runs from (an editable install): its configs/ are importable by any config
# file (``from configs import default``), wherever that file lies.
CHECKOUT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config_imports_siblings(config_arg: str) -> None:
  """Lets a config file (``--config`` value ``config_arg``) import its siblings as a package
  (``from configs import default``) and the checkout's ``configs`` package: appends the
  directory above the config file's directory, then ihsweep's checkout (when it has
  ``configs/``), to ``sys.path`` (appended, so they never shadow an installed module)."""
  if config_arg:
    root = os.path.dirname(os.path.dirname(os.path.abspath(config_arg.split(":", 1)[0])))
    for path in (root, CHECKOUT):
      if path not in sys.path and (path == root or os.path.isdir(os.path.join(path, "configs"))):
        sys.path.append(path)


def config_file_error(e: BaseException, config_arg: str) -> str | None:
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


def config_load_failed(e: Exception, found=()) -> int:
  """One line for a config file that raises (where in the file, and what), has no
  get_config(), or an override of no field (``found``: the flags, ``split_args``)."""
  bad = bad_override(found)
  if bad is not None:
    return fail(f"cannot load the config: {bad}")
  path = config_arg(found).split(":", 1)[0]
  in_file = config_file_error(e, path)
  if in_file:
    return fail(f"cannot load the config: {in_file}")
  root = e
  while root.__cause__ is not None or root.__context__ is not None:
    root = root.__cause__ or root.__context__
  if isinstance(root, AttributeError) and getattr(root, "name", None) == "get_config":
    return fail(
      f"{path} has no get_config() (a config file is Python defining get_config(), "
      f"e.g. configs/default.py)"
    )
  msg = (
    _one_line(root) if root is e else f"{_one_line(e)} ({type(root).__name__}: {_one_line(root)})"
  )
  return fail(f"cannot load the config: {path + ': ' if path else ''}{msg}")


def parse(command: str, argv: list[str], args: list[str], found) -> tuple[list[str], int | None]:
  """``(positional words, None)`` after absl parsed ``args`` (the words after ``command``,
  ``--flagfile`` expanded) into ``FLAGS``; or ``([], exit code)`` after one line saying why the
  flags or the config file they name cannot be used."""
  config_imports_siblings(config_arg(found))
  try:  # parse here, not in app.run, so that a bad config file or override is one line
    ARGV[:] = [f"{argv[0]} {command}"] + args
    rest = FLAGS(list(ARGV))
  except flags.Error as e:  # ml_collections puts the config file's traceback in the message
    if config_file_error(e, config_arg(found)):
      return [], config_load_failed(e, found)
    overrides = [n for n, flag, _ in found if flag == "config" and "." in n]
    if overrides and not config_arg(found):  # absl knows --config.X only once --config is given
      return [], fail(
        f"--{overrides[0]} needs --config=FILE[:VARIANT]: an override changes a field of the "
        f"config file's config, and no --config was given (e.g. --config=configs/default.py)"
      )
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return [], fail(" ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines))
  except Exception as e:  # loading runs the config file: any error (SyntaxError, NameError, ...)
    return [], config_load_failed(e, found)
  except SystemExit as e:  # a config file that exits would end the command, status 0 included
    path = config_arg(found).split(":", 1)[0]
    return [], fail(f"cannot load the config: {path} called sys.exit({e.code!r}) while loading")
  if FLAGS.workdir:  # `--workdir=~/runs/x`: the shell leaves a `~` after `=` alone
    FLAGS.workdir = os.path.expanduser(FLAGS.workdir)
  return rest, None


def run_guarded(handler, rest: list[str]) -> int:
  """``handler(rest)``'s exit code; a storage fault anywhere (a full disk, a file-size limit,
  ...: ``errors.STORAGE_ERRNOS``; in checkpoints, logs, a sweep's tables) is one line and its
  exit code, device memory exhausted one line and exit 1 at once."""
  try:
    return int(handler(rest) or 0)
  except Exception as e:
    fault = StorageFault.of(e, FLAGS.workdir)
    if fault is not None:
      print(f"ihsweep: {fault}", file=sys.stderr)
      return StorageFault.EXIT_CODE
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


def start_logging(devices: bool = True) -> None:
  """The log format and, with ``devices`` (a command that uses JAX), one CPU device per core
  (before JAX picks its devices). Without ``devices`` JAX is not imported: ``status`` and
  ``predict`` read files and start in a fraction of the time."""
  if devices:
    from ihsweep.base.sharding import use_one_cpu_device_per_core

    use_one_cpu_device_per_core()  # only matters on CPU; before JAX picks its devices
  logging.basicConfig(
    level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
  )
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter
  absl = logging.getLogger("absl")
  absl.setLevel(logging.WARNING)  # orbax's per-save progress lines
  # ml_collections' warning for a get_config() returning None: load_config says it in its line
  absl.addFilter(lambda record: "did you forget a return statement" not in record.getMessage())
