"""A fixed-point iteration with a tolerance, partitioned by XLA: `lax.while_loop` until the update is small
or a step budget runs out, the batch split over dp and the weight over tp. The condition reads a maximum
over the whole split value (an all-reduce in the partitioned loop) and a counter; JAX writes the counter's
test as `(i < 5) != False` in the reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def iterate(x: jax.Array, w: jax.Array) -> jax.Array:
    def cond(carry: tuple[jax.Array, jax.Array]) -> jax.Array:
        h, i = carry
        return (i < 5) & (jnp.max(jnp.abs(h)) > 1e-3)

    def body(carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        h, i = carry
        return jnp.tanh(h @ w) * 0.5, i + 1

    return jax.lax.while_loop(cond, body, (x, 0))[0]


def init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((8, 16)).astype(np.float32), (rng.standard_normal((16, 16)) / 4).astype(np.float32)]


def specs() -> tuple[list[P], P]:
    return [P("dp"), P(None, "tp")], P("dp")
