"""A CLIP-style contrastive loss: image and text embeddings normalised, every pair's similarity scaled, and
the cross-entropy of each row and each column against the diagonal (`arange` labels, optax's integer-label
softmax cross-entropy).

With the batch split over the devices, the column loss reads the diagonal of the transposed similarity
matrix, whose columns are split: XLA's partitioner turns that `take_along_axis` into a masked lookup with
constant indices, shifted per device by the first column the device holds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P


def clip_loss(img: jax.Array, txt: jax.Array, wi: jax.Array, wt: jax.Array, logit_scale: jax.Array) -> jax.Array:
    ie = img @ wi
    te = txt @ wt
    ie = ie / jnp.linalg.norm(ie, axis=-1, keepdims=True)
    te = te / jnp.linalg.norm(te, axis=-1, keepdims=True)
    logits = jnp.exp(logit_scale) * ie @ te.T
    labels = jnp.arange(logits.shape[0])
    rows = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    cols = optax.softmax_cross_entropy_with_integer_labels(logits.T, labels)
    return (rows.mean() + cols.mean()) / 2


def clip_specs(axis: str = "x") -> tuple[list[P], P]:
    return [P(axis), P(axis), P(), P(), P()], P()


def clip_init(rng: np.random.Generator) -> list[np.ndarray]:
    shapes = [(32, 24), (32, 20), (24, 16), (20, 16)]
    return [*(rng.standard_normal(s).astype(np.float32) for s in shapes), np.array(0.5, np.float32)]
