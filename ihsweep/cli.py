"""The ``ihsweep`` command: ``ihsweep COMMAND [flags]``, dispatched over the command modules in
``ihsweep/commands/`` (one per command: its flags, help and ``main``; ``ihsweep --help`` lists
them). Flags are parsed by absl and defined once, with their help, in ``commands/flags.py``;
each command takes only its own flags (``COMMAND_FLAGS``, also listed by its ``--help``), and
any other flag is refused with exit status 2 before anything is parsed or loaded. ``report``
and ``fit-law`` are the analysis package's commands (``commands/analysis.py``).
"""

from __future__ import annotations

import sys

from absl import flags

from ihsweep.base import environment, schema
from ihsweep.base.errors import quiet_on_closed_pipe
from ihsweep.commands import analysis, corpus, export, plan, predict, run, status, train
from ihsweep.commands.common import fail, load_config, parse, run_guarded, start_logging
from ihsweep.commands.flags import FLAGS, FORMS, check, config_arg, flag_list, help_text
from ihsweep.commands.flags import split_args as _split_args

MODULES = {m.NAME: m for m in (run, status, train, corpus, predict, plan, export)}
COMMANDS = {name: m.DESCRIPTION for name, m in MODULES.items()}
ANALYSIS_COMMANDS = analysis.COMMANDS
FLAG_FORMS = FORMS
# The flags each command takes (corpus: per subcommand); anything else is refused before parsing.
COMMAND_FLAGS = {
  key: names
  for m in MODULES.values()
  for key, names in (
    {f"{m.NAME} {sub}": v for sub, v in m.SUBCOMMAND_FLAGS.items()}
    if hasattr(m, "SUBCOMMAND_FLAGS")
    else {m.NAME: m.FLAG_NAMES}
  ).items()
}
COMMAND_HELP = {  # each flag once, in the order its command (or subcommands) name it
  name: help_text(
    m.USAGE,
    m.ABOUT,
    dict.fromkeys(f for k, v in COMMAND_FLAGS.items() if k.split()[0] == name for f in v),
  )
  for name, m in MODULES.items()
}


CONFIG_FIELDS_HEADER = (
  "config fields (--config.SECTION.FIELD=VALUE overrides the config file's value; the default "
  "is shown; the same table: docs/configuration.md):"
)


HELP_WORDS = ("-h", "--help", "--helpfull", "help")


def _help(command: str, argv: list[str]) -> int:
  """``ihsweep COMMAND --help``: the command's flags and, for a command that takes a config,
  every config field — with ``--config=FILE`` (and overrides) that config's values beside the
  defaults, loaded as the command would load it (a config that fails to load: its one line)."""
  print(f"{COMMAND_HELP[command]}\n\n  flags: {flag_list(COMMAND_FLAGS, command)}")
  if "config" not in COMMAND_FLAGS.get(command, ()):
    return 0
  header, config = CONFIG_FIELDS_HEADER, None
  args = [a for a in argv[2:] if a not in HELP_WORDS]
  found, _ = _split_args(args)
  if config_arg(found):
    _, failed = parse(command, argv, args, found)
    config, failed = (None, failed) if failed is not None else load_config()
    if failed is not None:
      return failed
    header = CONFIG_FIELDS_HEADER.replace(
      "the default is shown",
      f"the value of --config={config_arg(found)} is shown, the default in [] where it differs",
    )
  print(f"\n{header}\n{schema.help_text(config=config)}")
  return 0


def _check_flags(command: str, found, positional) -> str | None:
  """Why the flags ``found`` (``split_args``) do not suit ``command`` (``flags.check``)."""
  return check(command, found, positional, COMMAND_FLAGS)


def _usage() -> str:
  lines = ["usage: ihsweep COMMAND [flags]", "", "commands:"]
  lines += [f"  {name:8s} {doc}" for name, doc in {**COMMANDS, **ANALYSIS_COMMANDS}.items()]
  lines += ["", "ihsweep COMMAND --help lists the flags."]
  return "\n".join(lines)


def main(argv=None) -> int:
  """Every command's exit code; a closed pipe on stdout (``ihsweep status | head``) exits 141
  without a traceback (``errors.quiet_on_closed_pipe``)."""
  return quiet_on_closed_pipe(_main, argv)


def _main(argv=None) -> int:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
    print(_usage())
    return 0
  command = argv[1]
  if command in ANALYSIS_COMMANDS:
    return analysis.main(argv)
  if command not in COMMANDS:
    print(f"ihsweep: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
    return 2
  if any(a in HELP_WORDS for a in argv[2:]):
    return _help(command, argv)
  try:
    args = FLAGS.read_flags_from_files(argv[2:], force_gnu=False)
  except flags.Error as e:  # an unreadable --flagfile
    return fail(" ".join(str(e).replace("ERROR::", "").split()))
  found, positional = _split_args(args)
  problem = _check_flags(command, found, positional)
  if problem is not None:
    return fail(problem)
  module = MODULES[command]
  try:  # every variable the tool reads, before anything is created or compiled
    environment.check(distributed=module.TRAINS)
  except environment.EnvironmentVariableError as e:
    return fail(str(e))
  start_logging(devices=getattr(module, "USES_DEVICES", True))
  rest, failed = parse(command, argv, args, found)
  if failed is not None:
    return failed
  if module.FLAGS_ONLY and len(rest) > 1:
    # e.g. a space inside an unquoted path: the tail would otherwise be dropped silently
    return fail(
      f"{command} takes flags only, got {' '.join(rest[1:])!r} (quote values that contain spaces)"
    )
  if module.COMPILES:
    from ihsweep.workers import compile_cache

    compile_cache.enable()  # a rerun or the next group of equal shapes compiles nothing again
  if module.TRAINS:
    from ihsweep.base.sharding import initialize_distributed

    # Nothing is imported ahead of the join: the command imports the training stack (orbax,
    # flax, the runner) when it needs it. An earlier session imported the runner first, having
    # once seen JAX's abort beat the peer watchdog with the other order; that was load: with the
    # stack imported after the join the watchdog ended the stopped peer's partner in 4 of 4
    # runs (issue 44) and 6 of 6 beside a full test suite (issue 46), in 5.5-7.1 s. If JAX's
    # abort does come first, it is still one line (ihsweep.base.runtime_abort).
    from ihsweep.training.stopping import install_stop_handlers

    initialize_distributed()
    install_stop_handlers()  # SIGTERM (preemption): checkpoint, then exit
  code = run_guarded(module.main, rest)
  if module.TRAINS:  # a stop or an error never waits for a compile ahead in flight
    from ihsweep.workers.compile_ahead import end_process_if_compiling

    end_process_if_compiling(code)
  return code


if __name__ == "__main__":
  sys.exit(main())
