"""Vocab-parallel softmax: logits ``[tokens, vocab]`` with vocab sharded over "tp" (tokens over "dp").

The max (for stability) and the normaliser are over the *global* vocab: pmax of the local max, psum of the
local sum of exponentials.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def reference(logits: jax.Array) -> jax.Array:
    m = jnp.max(logits, axis=-1, keepdims=True)
    e = jnp.exp(logits - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)


def specs(dp: str = "dp", tp: str = "tp") -> tuple[tuple[P], P]:
    return (P(dp, tp),), P(dp, tp)


def init(tokens: int, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [(2.0 * rng.standard_normal((tokens, vocab))).astype(np.float32)]


def _local_softmax(logits: jax.Array) -> jax.Array:
    m = jax.lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "tp")
    e = jnp.exp(logits - m)
    return e / jax.lax.psum(jnp.sum(e, axis=-1, keepdims=True), "tp")


def _local_softmax_local_norm(logits: jax.Array) -> jax.Array:
    m = jax.lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "tp")
    e = jnp.exp(logits - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)  # BUG: normalised over the local vocab shard (needs psum over "tp")


VARIANTS = {"correct": _local_softmax, "local": _local_softmax_local_norm}


def shard_map_softmax(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
