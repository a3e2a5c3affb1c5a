"""A step with dynamic loss scaling: the loss scaled by 1024, the gradient unscaled and applied only where
every element is finite (`all(isfinite(g))`, as the loss scalers of mixed-precision training check).

The loss is a calibration loss, the squared gap between the mean prediction and a target mean, so its
gradient with respect to the predictions is one scalar broadcast: XLA's simplifier computes the weight
gradient at the width of one column per device and tiles it, and checks the finiteness of the narrow one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

SCALE = 1024.0


def step(w: jax.Array, x: jax.Array, y: jax.Array) -> jax.Array:
    def scaled_loss(w: jax.Array) -> jax.Array:
        pred = x @ w
        return (jnp.mean(pred) - jnp.mean(y)) ** 2 * SCALE

    g = jax.grad(scaled_loss)(w) / SCALE
    finite = jnp.all(jnp.isfinite(g))
    return jnp.where(finite, w - 0.1 * g, w)


def init(rng: np.random.Generator) -> list[np.ndarray]:
    # Quarters: every sum of their products is exact in f32, so the order in which devices add partial sums
    # does not change a result.
    w, x, y = (np.round(rng.standard_normal(shape) * 4) / 4 for shape in ((16, 8), (32, 16), (32, 8)))
    return [w.astype(np.float32), x.astype(np.float32), y.astype(np.float32)]


def specs(dp: str = "dp", tp: str = "tp") -> tuple[list[P], P]:
    return [P(None, tp), P(dp), P(dp, tp)], P(None, tp)
