"""Single tokens and shifts of a sequence split across devices.

- ``token_shift``: RWKV's token shift, each token mixed with the previous one, `shift(x) = pad(x, 1 at the
  start)[:-1]` (the first token with zeros), and a cyclic `jnp.roll` of the sequence. XLA's partitioner moves
  each device's last rows to its neighbour with a collective-permute and masks the rows that came from
  outside the tensor with a select, where the pad already holds zeros.
- ``pooled_tokens``: the first token (BERT's and ViT's CLS pooling) and the last one (a language model's
  next-token logits). XLA keeps the row on the device that holds it, zeroes it on the others
  (`select(axis_index == k, row, 0)`) and all-reduces; the last row first moves to device 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def token_shift(x: jax.Array, mu: jax.Array) -> jax.Array:
    """x [batch, seq, d], mu [d]."""
    previous = jnp.pad(x, ((0, 0), (1, 0), (0, 0)))[:, :-1]
    return mu * x + (1 - mu) * previous + 0.5 * jnp.roll(x, 3, axis=1)


def init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((2, 32, 8)).astype(np.float32), rng.uniform(0, 1, 8).astype(np.float32)]


def specs(dp: str = "dp", sp: str = "tp") -> tuple[list[P], P]:
    return [P(dp, sp), P()], P(dp, sp)


def pooled_tokens(x: jax.Array, w_cls: jax.Array, w_out: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [batch, seq, d]: (tanh(x[:, 0] @ w_cls), x[:, -1] @ w_out)."""
    return jnp.tanh(x[:, 0] @ w_cls), x[:, -1] @ w_out


def pooled_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((4, 16, 8)).astype(np.float32), (rng.standard_normal((8, 8)) / 3).astype(np.float32),
            (rng.standard_normal((8, 16)) / 3).astype(np.float32)]


def pooled_specs(dp: str = "dp", sp: str = "tp") -> tuple[list[P], tuple[P, P]]:
    return [P(dp, sp), P(), P()], (P(dp), P(dp))
