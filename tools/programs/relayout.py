"""Values moved between layouts of the same axes, and per-device counters of a random key.

- ``resplit``: a batch split over ``("dp", "tp")`` returned split over ``"tp"`` alone (and one split over
  ``("tp", "dp")`` returned over ``"dp"``). XLA first permutes the blocks so that the axis to drop is the minor
  one of the split (the same value, its blocks relaid), then all-gathers over it.
- ``attention_dropout``: dropout on attention probabilities ``[batch, heads, q, k]`` with the batch over dp and
  the heads over tp, the mask drawn from a raw threefry key. Each device computes the counters of its own
  rows (`iota_2x32_shape`: the linear index of every element) from its block offsets along both split dims.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def resplit(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return 2.0 * x + 1.0, jnp.tanh(y)


def resplit_specs() -> tuple[list[P], tuple[P, P]]:
    return [P(("dp", "tp")), P(("tp", "dp"))], (P("tp"), P("dp"))


def resplit_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)]


def attention_dropout(p: jax.Array, key: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(key, 0.9, p.shape)
    return jnp.where(keep, p / 0.9, 0.0)


def dropout_specs() -> tuple[list[P], P]:
    return [P("dp", "tp"), P()], P("dp", "tp")


def dropout_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.uniform(0, 1, (2, 8, 4, 4)).astype(np.float32), np.asarray(jax.random.PRNGKey(7))]
