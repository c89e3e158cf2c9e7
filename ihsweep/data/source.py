"""The data-source interface: every member the trainer, the evaluator and the probes read from a
source, with its default. One base class, ``Source``; the built-in sources (``builtin.py``,
``markov.py``, ``natural.py``) subclass it, and callers read the members directly (no
``hasattr`` probes).

Writing a source: subclass ``Source`` and give it ``vocab_size``, ``batch_size`` and
``context_size`` (dataclass fields or properties) and the three core methods — ``sample`` (the
one abstract method), ``data_params`` and ``arrays`` (whose defaults, "no per-model values" and
"no shared arrays", suit a source drawn from its key alone). Everything else has a default that
is right for a source generated inside the jitted step::

  @dataclasses.dataclass(frozen=True)
  class Constant(Source):
    vocab_size: int
    batch_size: int
    context_size: int

    def sample(self, key, data_params, arrays):
      return jnp.zeros((self.batch_size, self.context_size + 1), jnp.int32)

The defaults are class attributes and methods, not dataclass fields: they change neither a
subclass's ``__init__`` nor its equality or hash. A dataclass subclass that makes one of the
attribute defaults (``on_device``, ``special_ids``, ``tokenizer``, ``has_held_out_windows``) a
field must give that field its own default or ``dataclasses.field()`` — a bare annotation would
take the base's value as its default (``NaturalTextSource.on_device`` does the latter).
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import numpy as np


class Source(abc.ABC):
  """A data source, written for one model and jit/vmap-safe.

  The trainer vmaps ``sample`` over the ensemble with per-model keys and per-model
  ``data_params`` (leading axis E), while ``arrays`` is shared by all models: placed once on
  every device and passed to the step as an argument, never baked into the program as a
  constant.

  Required attributes (fields or properties): ``vocab_size`` V (token ids lie in [0, V)),
  ``batch_size`` B (sequences per model per update) and ``context_size`` C (input positions;
  ``sample`` returns C + 1 tokens per sequence, inputs and targets).
  """

  vocab_size: int
  batch_size: int
  context_size: int

  on_device: bool = True
  """Whether ``sample`` runs inside the jitted step with ``arrays()`` on every device. False (a
  corpus over the device-memory budget): the runner feeds ``host_batches`` instead and never
  calls ``sample`` in the step."""

  special_ids: tuple[int, ...] = ()
  """Token ids that are not text (a corpus's end-of-text separator, a tokenizer's ``<pad>``),
  ascending ints; repeated-token probes never use them. Default: none."""

  tokenizer: Any = None
  """The HF ``tokenizers.Tokenizer`` that maps text to this source's ids, or None (the default)
  when the ids are not text."""

  has_held_out_windows: bool = False
  """True when ``held_out_windows`` returns windows of stored data (a corpus's validation
  split); False (the default): held-out sequences are fresh draws of ``sample`` with a key no
  update uses (``probes.held_out_sequences``), which compiles the sampler once more."""

  @abc.abstractmethod
  def sample(self, key: jax.Array, data_params: Any, arrays: Any) -> jax.Array:
    """Tokens of one model's batch, int32 ``[B, C + 1]`` in [0, V).

    Args:
      key: the update's PRNG key (``keys.step_keys``), uint32 ``[2]``.
      data_params: this model's slice of ``data_params(E)`` (leading axis removed).
      arrays: ``arrays()`` as device arrays (or numpy, outside the step).
    """

  def data_params(self, n_models: int) -> Any:
    """Per-model data values: a pytree whose leaves have leading axis E = ``n_models`` (e.g. a
    Markov source's knobs, float32 ``[E]``). Default: none, ``{}``.

    Raises:
      DataError: values that do not match ``n_models`` (naming the config field).
    """
    del n_models
    return {}

  def arrays(self) -> Any:
    """Arrays shared by every model: a pytree of numpy arrays (e.g. a corpus's tokens, a
    transition table) that the trainer places once on every device. Default: none, ``{}``."""
    return {}

  def host_batches(self, data_keys_Ex2: np.ndarray, first_step: int, n_steps: int) -> np.ndarray:
    """Batches of updates ``first_step … first_step + n_steps − 1`` drawn on the host, integer
    ``[E, U, B, C + 1]`` (U = ``n_steps``) from the models' data keys uint32 ``[E, 2]``; the same
    tokens ``sample`` would draw from ``keys.step_keys``. Needed only when ``on_device`` is
    False.

    Raises:
      NotImplementedError: the default, for a source generated on device.
    """
    raise NotImplementedError(
      f"{type(self).__name__} has on_device = False but no host_batches: a host-fed source "
      f"must draw its batches on the host"
    )

  def host_rows(
    self, data_keys_Ex2: np.ndarray, first_step: int, n_steps: int, rows: slice
  ) -> np.ndarray:
    """Rows ``rows`` of the batches ``host_batches`` draws, ``[E, U, len(rows), C + 1]``: what
    one device holds when a batch's B sequences are split over the mesh's 'data' axis (each
    process loads only its devices' rows). Models are chosen by passing their keys alone.
    Default: all rows drawn, then sliced; a source that can draw a part cheaply overrides it."""
    return np.asarray(self.host_batches(data_keys_Ex2, first_step, n_steps))[:, :, rows]

  def held_out_windows(self, key: jax.Array, n: int) -> np.ndarray | None:
    """``n`` held-out sequences of stored data, integer ``[n, C + 1]`` drawn with ``key`` (the
    same for every model), when ``has_held_out_windows``; else None (the default), meaning
    "draw fresh sequences from ``sample``"."""
    del key, n
    return None

  def train_token_counts(self) -> np.ndarray | None:
    """Occurrences of each id in the training data, int64 ``[V]``, or None (the default) when
    the source has no stored training data to count (probes then count the held-out
    sequences)."""
    return None

  def describe(self) -> str:
    """One line for the run log: what the data is and where it is drawn. Default: the class
    name, V, B, C and the placement."""
    where = "generated in-graph" if self.on_device else "host-fed"
    return (
      f"{type(self).__name__} V={self.vocab_size}, B={self.batch_size}, "
      f"C={self.context_size}, {where}"
    )


def host_batch_array(
  source: Source, data_keys_Ex2: np.ndarray, first_step: int, n_steps: int, sharding
) -> jax.Array:
  """A call's host-fed batches ``[E, U, B, C + 1]`` (U = ``n_steps``) as one global array with
  ``sharding`` (E over 'ensemble', B over 'data'), built by this process from the parts its own
  devices hold: each device's models (their keys alone) and rows (``source.host_rows``). On a
  mesh over several processes no process reads another's rows and nothing is exchanged —
  unlike ``jax.device_put`` of a whole batch, which checks that every process passed equal
  values (an all-gather) — so it is safe to call from a loader thread while the training's
  collectives run (``jax.make_array_from_callback``, the per-device form of maxtext's
  ``make_array_from_process_local_data``)."""
  keys = np.asarray(data_keys_Ex2)
  shape = (len(keys), n_steps, source.batch_size, source.context_size + 1)
  parts: dict = {}

  def part(index):
    models, _, rows, _ = index  # the sharding splits E and B only
    at = (models.indices(shape[0]), rows.indices(shape[2]))
    if at not in parts:  # devices that hold the same part (replicas) share one read
      parts[at] = np.asarray(source.host_rows(keys[models], first_step, n_steps, rows))
    return parts[at]

  return jax.make_array_from_callback(shape, sharding, part)
