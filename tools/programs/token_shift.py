"""RWKV's token shift over a sequence split across devices: each token mixed with the previous one,
`shift(x) = pad(x, 1 at the start)[:-1]` (the first token with zeros), and a cyclic `jnp.roll` of the
sequence. XLA's partitioner moves each device's last rows to its neighbour with a collective-permute and
masks the rows that came from outside the tensor with a select, where the pad already holds zeros.
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
