"""A small language-model train step whose tensor-parallel dims the mesh axis does not divide: a vocabulary
of 50 and an MLP hidden width of 30, both split over tp = 4.

XLA pads such a dim to the next multiple (50 as 4 blocks of 13, 30 as 4 blocks of 8), works on the padded
blocks, masks the padding where it would change a result (the max and the sum of the softmax, the
contraction after the activation), and cuts it off at the end. The embedding lookup gathers from the padded
block of the table, and the gradient of the label lookup scatters into a padded block of logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

VOCAB, HIDDEN, WIDTH = 50, 30, 16


def lm_loss(ids: jax.Array, labels: jax.Array, emb: jax.Array, w1: jax.Array, w2: jax.Array,
            out: jax.Array, mesh: jax.sharding.Mesh) -> jax.Array:
    def tp(x: jax.Array, spec: P) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, jax.sharding.NamedSharding(mesh, spec))

    x = jnp.take(tp(emb, P("tp")), ids, axis=0)  # [batch, seq, width] from a table split by rows
    h = jax.nn.gelu(tp(x @ w1, P("dp", None, "tp")))
    x = x + h @ w2
    mu = x.mean(-1, keepdims=True)
    x = (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    logits = tp(x @ out, P("dp", None, "tp"))
    lse = jax.nn.logsumexp(logits, -1)
    target = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
    return jnp.mean(lse - target)


def grads(ids: jax.Array, labels: jax.Array, emb: jax.Array, w1: jax.Array, w2: jax.Array, out: jax.Array,
          mesh: jax.sharding.Mesh) -> tuple[jax.Array, ...]:
    loss, g = jax.value_and_grad(lm_loss, argnums=(2, 3, 4, 5))(ids, labels, emb, w1, w2, out, mesh)
    return (loss, *g)


def specs() -> tuple[list[P], tuple[P, ...]]:
    return [P("dp"), P("dp"), P(), P(), P(), P()], (P(), P(), P(), P(), P())


def init(rng: np.random.Generator, batch: int = 4, seq: int = 6) -> list[np.ndarray]:
    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32)

    ids = rng.integers(0, VOCAB, (batch, seq)).astype(np.int32)
    labels = rng.integers(0, VOCAB, (batch, seq)).astype(np.int32)
    return [ids, labels, normal(VOCAB, WIDTH), normal(WIDTH, HIDDEN), normal(HIDDEN, WIDTH), normal(WIDTH, VOCAB)]
