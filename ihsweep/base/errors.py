"""The one base class of every error ihsweep raises on purpose.

``except IhsweepError`` catches what the tool refuses or cannot do (a bad config field, a run
directory that is not a run, a checkpoint that cannot be read, a full disk, a stop on request)
and nothing else: a bug still surfaces as its own exception. Each subclass also derives from the
built-in class callers caught before (``ValueError``, ``RuntimeError``), so existing ``except``
clauses keep working. A leaf module: importing it imports nothing of JAX.
"""


class IhsweepError(Exception):
  """Base of every error ihsweep raises on purpose; its message is one line for the user."""
