"""RMSNorm with the hidden dim sharded over "tp" (rows over "dp"), hand-parallel with shard_map.

The statistic is a mean over the *global* hidden dim: the local sum of squares must be psum'd over "tp"
and divided by the global d.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from programs.llama import rms_norm

EPS = 1e-5


def reference(x: jax.Array, scale: jax.Array) -> jax.Array:
    return rms_norm(x, scale, EPS)


def specs(dp: str = "dp", tp: str = "tp") -> tuple[tuple[P, P], P]:
    return (P(dp, tp), P(tp)), P(dp, tp)


def init(rows: int, d: int, rng: np.random.Generator) -> list[np.ndarray]:
    # rows with different scales per column block, so local and global statistics differ clearly
    x = rng.standard_normal((rows, d)) * np.linspace(0.25, 2.0, d)[None, :]
    scale = 1.0 + 0.1 * rng.standard_normal((d,))
    return [x.astype(np.float32), scale.astype(np.float32)]


def _local_rmsnorm(x: jax.Array, scale: jax.Array, *, d: int, axis: str) -> jax.Array:
    sum_sq = jax.lax.psum(jnp.sum(x * x, axis=-1, keepdims=True), axis)
    return x * jax.lax.rsqrt(sum_sq / d + EPS) * scale


def _local_rmsnorm_local_stats(x: jax.Array, scale: jax.Array, *, d: int, axis: str) -> jax.Array:
    ms = jnp.mean(x * x, axis=-1, keepdims=True)  # BUG: mean of squares over the local shard only (needs psum over "tp")
    return x * jax.lax.rsqrt(ms + EPS) * scale


VARIANTS = {"correct": _local_rmsnorm, "local_stats": _local_rmsnorm_local_stats}


def shard_map_rmsnorm(mesh: jax.sharding.Mesh, d: int, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    body = VARIANTS[variant]

    def local(x: jax.Array, scale: jax.Array) -> jax.Array:
        return body(x, scale, d=d, axis="tp")

    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
