"""Windows of a flat token array: each model draws B start offsets from its own key and reads
``tokens[s : s + C + 1]`` (GPT-2/nanoGPT-style packing: windows may span document boundaries,
which the end-of-text token marks). The in-graph path (``window_starts`` inside the jitted step)
and the host loader (``host_window_starts``, then a numpy gather) draw the same offsets from the
same keys (``keys.step_keys``), so they read identical windows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ihsweep.data.keys import step_keys


def window_starts(key: jax.Array, n_tokens: int, batch_size: int, context_size: int) -> jax.Array:
  """B start offsets, int32 ``[B]`` uniform in [0, n_tokens − C − 1], so that the window
  ``[s, s + C]`` (C + 1 tokens) lies inside the array. The device and host paths both call
  this, so they read identical windows."""
  return jax.random.randint(key, (batch_size,), 0, n_tokens - context_size, dtype=jnp.int32)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def host_window_starts(data_keys_Ex2, first_step, n_steps, n_tokens, batch_size, context_size):
  """Window starts ``[E, U, B]`` for updates first_step … first_step + U − 1 of every model,
  from the keys ``keys.step_keys`` gives the in-graph path."""

  def one_model(data_key):
    return jax.vmap(lambda key: window_starts(key, n_tokens, batch_size, context_size))(
      step_keys(data_key, first_step, n_steps)
    )

  return jax.vmap(one_model)(data_keys_Ex2)
