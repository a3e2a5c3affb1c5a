"""Data-parallel loss: softmax cross-entropy of a linear classifier, mean over a batch sharded on "dp".

Each device sees ``batch / |dp|`` examples; the global mean is the pmean of the per-shard means (equal shard
sizes). Labels are int32.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def per_example_loss(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
    logits = x @ w
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.sum(logits * jax.nn.one_hot(labels, w.shape[-1], dtype=logits.dtype), axis=-1)
    return logz - picked


def reference(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(per_example_loss(x, w, labels))


def specs(dp: str = "dp") -> tuple[tuple[P, P, P], P]:
    return (P(dp, None), P(None, None), P(dp)), P()


def init(batch: int, d: int, classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((batch, d)).astype(np.float32)
    w = rng.standard_normal((d, classes)).astype(np.float32)
    labels = rng.integers(0, classes, size=(batch,)).astype(np.int32)
    return [x, w, labels]


def _local_loss(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
    return jax.lax.pmean(jnp.mean(per_example_loss(x, w, labels)), "dp")


def _local_loss_no_pmean(x: jax.Array, w: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(per_example_loss(x, w, labels))  # BUG: per-shard mean, missing pmean over "dp"


VARIANTS = {"correct": _local_loss, "no_pmean": _local_loss_no_pmean}


def shard_map_loss(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
