"""The ``python -m analysis`` commands (``ihsweep report`` / ``ihsweep fit-law``), one module
each: ``NAME``, ``HELP`` (its line in the usage), ``DESCRIPTION`` (its ``--help``),
``add_arguments(parser)`` (its flags; those two commands share are defined once, in
``common.ARGUMENTS``) and ``main(args)``, its exit code. ``analysis/__main__.py`` dispatches
over them."""
