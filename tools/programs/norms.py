"""Norms written with `jnp.square` (lowered to `chlo.square`, which XLA expands to a multiply): RMSNorm over
a hidden dim split across devices, so the partitioner all-reduces the sum of squares."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P


def rms_norm_square(x: jax.Array, scale: jax.Array) -> jax.Array:
    ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + 1e-6) * scale


def specs(dp: str = "dp", tp: str = "tp") -> tuple[list[P], P]:
    """x batch over dp and hidden over tp; the scale over tp: the mean is a cross-device reduction."""
    return [P(dp, tp), P(tp)], P(dp, tp)
