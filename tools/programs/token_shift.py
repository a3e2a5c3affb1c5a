"""Single tokens and shifts of a sequence split across devices.

- ``token_shift``: RWKV's token shift, each token mixed with the previous one, `shift(x) = pad(x, 1 at the
  start)[:-1]` (the first token with zeros), and a cyclic `jnp.roll` of the sequence. XLA's partitioner moves
  each device's last rows to its neighbour with a collective-permute and masks the rows that came from
  outside the tensor with a select, where the pad already holds zeros.
- ``causal_conv1d``: a depthwise causal convolution over the sequence written with `jnp.pad` and slices (Mamba's
  and Hyena's short convolution): `sum_k pad(x, K-1 at the start)[:, k:k+L] * w[k]`. The padded sequence's
  blocks are longer than the input's, so XLA pads each device's rows widened by a halo, takes a window of its
  own per device, clears the rows past the tensor, and moves windows of that again for each slice.
- ``roll_both_ways``: `jnp.roll` by +1 and by -1 of a sequence split over a ring of two devices, where the
  next device is also the previous one: XLA's cyclic collective-permutes read the same either way round.
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


def causal_conv1d(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [batch, seq, d], w [K, d]."""
    k, seq = w.shape[0], x.shape[1]
    padded = jnp.pad(x, ((0, 0), (k - 1, 0), (0, 0)))
    return sum(padded[:, i:i + seq] * w[i] for i in range(k))


def conv_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((2, 32, 8)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)]


def roll_both_ways(x: jax.Array) -> jax.Array:
    """x [seq, d]."""
    return x - 0.5 * jnp.roll(x, -1, axis=0) + 0.25 * jnp.roll(x, 1, axis=0)


def pooled_tokens(x: jax.Array, w_cls: jax.Array, w_out: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [batch, seq, d]: (tanh(x[:, 0] @ w_cls), x[:, -1] @ w_out)."""
    return jnp.tanh(x[:, 0] @ w_cls), x[:, -1] @ w_out


def pooled_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((4, 16, 8)).astype(np.float32), (rng.standard_normal((8, 8)) / 3).astype(np.float32),
            (rng.standard_normal((8, 16)) / 3).astype(np.float32)]


def pooled_specs(dp: str = "dp", sp: str = "tp") -> tuple[list[P], tuple[P, P]]:
    return [P(dp, sp), P(), P()], (P(dp), P(dp))
