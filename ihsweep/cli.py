"""The ``ihsweep`` command.

  ihsweep train --config=configs/default.py --workdir=DIR [--config.train.lr=3e-4 ...]

Flags are parsed by absl; ``--config`` is an ml_collections config file with ``get_config()``
(``FILE:ARG`` passes ARG to it) and every field can be overridden as ``--config.a.b=value``.
"""

from __future__ import annotations

import logging
import sys

from absl import app, flags
from ml_collections import config_flags

COMMANDS = {
    "train": "train one ensemble (config sections model/train/ensemble/data/mesh)",
}

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "config file (configs/*.py), FILE[:ARG]",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "run directory (created if missing)")
flags.DEFINE_bool("progress", True, "show a progress bar")


def _train(argv):
  del argv
  from ihsweep.config import ConfigError
  from ihsweep.runner import fit
  if FLAGS.config is None or FLAGS.workdir is None:
    raise app.UsageError("ihsweep train needs --config=FILE and --workdir=DIR")
  try:
    out = fit(FLAGS.config, FLAGS.workdir, progress=FLAGS.progress)
  except ConfigError as e:
    print(f"ihsweep: invalid config: {e}", file=sys.stderr)
    return 2
  losses = ", ".join(f"{x:.4f}" for x in out["losses"])
  print(f"done: final loss per model [{losses}]; {out['tokens_per_s']:,.0f} tokens/s; "
        f"run directory {FLAGS.workdir}")
  return 0


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
  from ihsweep.sharding import use_one_cpu_device_per_core
  use_one_cpu_device_per_core()  # only matters on CPU; before JAX picks its devices
  logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
  logging.getLogger("jax").setLevel(logging.WARNING)  # backend-probing chatter
  handler = {"train": _train}[command]
  try:
    app.run(handler, argv=[f"{argv[0]} {command}"] + argv[2:])
  except SystemExit as e:
    return int(e.code or 0)
  return 0


if __name__ == "__main__":
  sys.exit(main())
