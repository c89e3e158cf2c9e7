"""The ``ihsweep`` commands, one module each (``ihsweep/cli.py`` dispatches over them).

Each command module declares ``NAME``, ``DESCRIPTION`` (its line in ``ihsweep --help``),
``USAGE`` and ``ABOUT`` (the start of its ``--help``), the flags it takes (``FLAG_NAMES``, or
``SUBCOMMAND_FLAGS`` per subcommand; each flag is defined once, with its help string, in
``flags.py``), what it needs before it starts (``FLAGS_ONLY``: no positional words;
``COMPILES``: the persistent compilation cache; ``TRAINS``: jax.distributed and the SIGTERM
handlers; ``USES_DEVICES``, True where not declared: one JAX CPU device per core, so False
for a command that never imports JAX) and ``main(argv)``, its exit code. ``common.py`` holds
what they share.
"""
