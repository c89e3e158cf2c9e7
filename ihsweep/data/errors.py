"""The error every data source raises for input it cannot use."""

from ihsweep.base.errors import IhsweepError


class DataError(IhsweepError, ValueError):
  """Data that cannot be read, built or sampled as configured. ``field`` names the config field
  to change ("" when the fix lies outside the config)."""

  def __init__(self, message: str, field: str = ""):
    self.field = field
    super().__init__(message)


class CorpusError(DataError):
  """The corpus cannot be read, tokenized or sampled as configured."""
