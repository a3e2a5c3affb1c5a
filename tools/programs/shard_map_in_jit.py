"""A jitted block that calls a shard_map: the reference itself holds a manual region, and XLA partitions the
rest (what a model does that hand-writes one layer, as MaxText does its MoE and attention kernels).

``block``: RMSNorm and the residual left to the partitioner (batch over dp), the Megatron MLP written by hand
in a shard_map, either manual over every axis (``mesh`` given, ``axis_names`` not) or over "tp" only
(``axis_names={"tp"}``: the batch stays with the partitioner inside too).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P


def _mlp_body(h: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "tp")


def block(mesh: Mesh, partial_manual: bool) -> Callable[..., jax.Array]:
    if partial_manual:
        mlp = jax.shard_map(_mlp_body, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(),
                            axis_names={"tp"})
    else:
        mlp = jax.shard_map(_mlp_body, mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp", None)),
                            out_specs=P("dp"))

    @functools.wraps(_mlp_body)
    def fn(x: jax.Array, w1: jax.Array, w2: jax.Array, g: jax.Array) -> jax.Array:
        h = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g
        return x + mlp(h, w1, w2)

    return fn


def init(rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((8, 16))
    w1, w2 = rng.standard_normal((16, 32)) / 4, rng.standard_normal((32, 16)) / 6
    g = 1 + 0.1 * rng.standard_normal(16)
    return [a.astype(np.float32) for a in (x, w1, w2, g)]


def specs() -> tuple[list[P], P]:
    return [P("dp"), P(None, "tp"), P("tp", None), P()], P("dp")
