"""ihsweep: train many small transformers at once and measure when induction heads form.

``ihsweep.load_run(DIR)`` opens a run directory from a notebook (``ihsweep.runs.notebook``); it is
imported on first use, so ``import ihsweep`` stays cheap (no JAX, no pandas).
"""

__version__ = "0.1.0"


def __getattr__(name):
  if name == "load_run":
    from ihsweep.runs.notebook import load_run

    return load_run
  raise AttributeError(f"module 'ihsweep' has no attribute {name!r}")
