"""Programs whose partitioned form cuts a mesh axis or a dim finer than any sharding says.

- ``gqa_attention``: grouped-query attention (Llama-3's GQA) with fewer key/value heads than the tensor-
  parallel axis has devices: 8 query heads over ``tp`` = 4, 2 KV heads repeated 4 times. XLA's partitioner
  gives each pair of devices one KV head, looked up from the partition id through constant tables: the block
  index along the major half of ``tp`` (Shardy's sub-axis ``tp:(1)2``), which no sharding names. With the k/v
  projections split over ``tp`` too, each device computes half a KV head, all-gathers the other half over the
  minor half of ``tp`` and broadcasts only the repeats its own query heads need.
- ``rope_kv_half_heads``: RoPE on the keys of 2 KV heads whose fused projection `[d, 2·8]` is split over
  ``tp`` = 4: each device holds half a head, and RoPE's `rotate_half` needs the other half. XLA exchanges half
  heads between device pairs (collective-permutes, a window of its own per device) with the heads kept as a
  unit dim and the fused dim split.
- ``dense_dispatch``: a dense mixture of experts (routing mask einsum'd with every expert's weights) with the
  expert dim split one expert per device: ``one_hot(argmax)`` is computed per device as ``top == axis_index``,
  a mask whose class dim has one element on each device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

Q_HEADS, KV_HEADS, HEAD_DIM = 8, 2, 4


def gqa_attention(x: jax.Array, wq: jax.Array, wk: jax.Array, wv: jax.Array, wo: jax.Array) -> jax.Array:
    """Causal GQA over x [batch, seq, d]: q [d, 8·4] split on heads, k/v [d, 2·4] replicated, wo [8·4, d]."""
    b, s, _ = x.shape
    q = (x @ wq).reshape(b, s, Q_HEADS, HEAD_DIM)
    k = (x @ wk).reshape(b, s, KV_HEADS, HEAD_DIM)
    v = (x @ wv).reshape(b, s, KV_HEADS, HEAD_DIM)
    k = jnp.repeat(k, Q_HEADS // KV_HEADS, axis=2)
    v = jnp.repeat(v, Q_HEADS // KV_HEADS, axis=2)
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HEAD_DIM).astype(np.float32)
    scores = jnp.where(jnp.tril(jnp.ones((s, s), bool)), scores, -1e9)
    out = jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, s, Q_HEADS * HEAD_DIM) @ wo


def gqa_init(rng: np.random.Generator) -> list[np.ndarray]:
    d = 16
    shapes = [(4, 8, d), (d, Q_HEADS * HEAD_DIM), (d, KV_HEADS * HEAD_DIM), (d, KV_HEADS * HEAD_DIM),
              (Q_HEADS * HEAD_DIM, d)]
    return [(rng.standard_normal(s) / np.sqrt(s[-2] if len(s) == 2 else 1)).astype(np.float32) for s in shapes]


def gqa_specs(dp: str = "dp", tp: str = "tp", *, kv_split: bool = False) -> tuple[list[P], P]:
    """k/v projections replicated, or (`kv_split`) split over tp like q's: then each device holds half a KV head
    and XLA all-gathers it over the minor half of tp before repeating it for its query heads."""
    kv = P(None, tp) if kv_split else P()
    return [P(dp), P(None, tp), kv, kv, P(tp, None)], P(dp)


EXPERTS = 4


def rope_kv_half_heads(x: jax.Array, wk: jax.Array) -> jax.Array:
    """RoPE'd keys [batch, seq, 2, 8] of x [batch, seq, d] with wk [d, 2·8]."""
    b, s, _ = x.shape
    k = (x @ wk).reshape(b, s, KV_HEADS, 2 * HEAD_DIM)
    half = HEAD_DIM
    angle = jnp.arange(s, dtype=jnp.float32)[:, None] / (10000.0 ** (jnp.arange(half) / half))[None, :]
    cos, sin = jnp.cos(angle)[None, :, None, :], jnp.sin(angle)[None, :, None, :]
    k1, k2 = k[..., :half], k[..., half:]
    return jnp.concatenate([k1 * cos - k2 * sin, k2 * cos + k1 * sin], -1)


def rope_kv_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((2, 8, 16)).astype(np.float32),
            (rng.standard_normal((16, KV_HEADS * 2 * HEAD_DIM)) / 4).astype(np.float32)]


def dense_dispatch(x: jax.Array, wr: jax.Array, w: jax.Array) -> jax.Array:
    """Top-1 routing as a dense mask: each token times its expert's weights, scaled by the gate."""
    gates = jax.nn.softmax(x @ wr, axis=-1)
    mask = jax.nn.one_hot(jnp.argmax(gates, axis=-1), EXPERTS) * jnp.max(gates, axis=-1, keepdims=True)
    return jnp.einsum("te,td,edf->tf", mask, x, w)


def dense_dispatch_init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((16, 8)).astype(np.float32), rng.standard_normal((8, EXPERTS)).astype(np.float32),
            (rng.standard_normal((EXPERTS, 8, 8)) / np.sqrt(8)).astype(np.float32)]


def dense_dispatch_specs(dp: str = "dp", ep: str = "tp") -> tuple[list[P], P]:
    return [P(dp), P(), P(ep)], P(dp)
