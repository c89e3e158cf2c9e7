"""ihsweep: train many small transformers at once and measure when induction heads form."""

__version__ = "0.1.0"
