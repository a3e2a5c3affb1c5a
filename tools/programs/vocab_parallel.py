"""Vocab parallelism (Megatron-style): the embedding table and the output logits split on vocab over "tp".

- Embedding lookup: ``table: [vocab, d]`` split on vocab over "tp", ``ids: [batch, seq]`` (int32) split on
  batch over "dp" and replicated over "tp". Each shard holds rows ``[offset, offset + v_local)`` with
  ``offset = axis_index("tp") * v_local``: it masks the ids outside its range (local index -> 0), looks up,
  zeroes the masked rows, and a psum over "tp" assembles the embeddings.
- Cross-entropy: ``logits: [tokens, vocab]`` split ``(dp, tp)``, int32 ``labels: [tokens]`` over "dp".
  ``loss = logsumexp(logits) - logits[label]`` per token: the max is pmax'd over "tp" (one common shift for
  every shard), the sum of exponentials psum'd, and the target logit picked on the shard that owns it
  (masked elsewhere) and psum'd.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

# ---------------------------------------------------------------------------------------------- embedding


def embed_reference(ids: jax.Array, table: jax.Array) -> jax.Array:
    return table[ids]


def embed_specs(dp: str = "dp", tp: str = "tp") -> tuple[tuple[P, P], P]:
    """(ids, table) -> [batch, seq, d]."""
    return (P(dp, None), P(tp, None)), P(dp, None, None)


def embed_init(batch: int, seq: int, vocab: int, d: int, rng: np.random.Generator) -> list[np.ndarray]:
    ids = rng.integers(0, vocab, size=(batch, seq)).astype(np.int32)
    table = rng.standard_normal((vocab, d)).astype(np.float32)
    return [ids, table]


def _local_embed(ids: jax.Array, table: jax.Array) -> jax.Array:
    v_local = table.shape[0]
    offset = jax.lax.axis_index("tp") * v_local
    local = ids - offset
    in_range = (local >= 0) & (local < v_local)
    rows = table[jnp.where(in_range, local, 0)]
    rows = jnp.where(in_range[..., None], rows, 0.0)
    return jax.lax.psum(rows, "tp")


def _local_embed_no_mask(ids: jax.Array, table: jax.Array) -> jax.Array:
    v_local = table.shape[0]
    offset = jax.lax.axis_index("tp") * v_local
    local = ids - offset
    rows = table[jnp.clip(local, 0, v_local - 1)]  # BUG: out-of-range ids not masked: every shard adds a row
    return jax.lax.psum(rows, "tp")


def _local_embed_wrong_offset(ids: jax.Array, table: jax.Array) -> jax.Array:
    v_local = table.shape[0]
    offset = jax.lax.axis_index("tp")  # BUG: shard offset not scaled by the shard size v_local
    local = ids - offset
    in_range = (local >= 0) & (local < v_local)
    rows = table[jnp.where(in_range, local, 0)]
    rows = jnp.where(in_range[..., None], rows, 0.0)
    return jax.lax.psum(rows, "tp")


EMBED_VARIANTS: dict[str, Callable[..., jax.Array]] = {
    "correct": _local_embed,
    "no_mask": _local_embed_no_mask,
    "wrong_offset": _local_embed_wrong_offset,
}


def shard_map_embed(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = embed_specs()
    return jax.shard_map(EMBED_VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=False)


# ---------------------------------------------------------------------------------------------- cross-entropy


def xent_reference(logits: jax.Array, labels: jax.Array) -> jax.Array:
    m = jnp.max(logits, axis=-1)
    sum_exp = jnp.sum(jnp.exp(logits - m[:, None]), axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return jnp.log(sum_exp) + m - picked


def xent_specs(dp: str = "dp", tp: str = "tp") -> tuple[tuple[P, P], P]:
    """(logits, labels) -> per-token loss [tokens]."""
    return (P(dp, tp), P(dp)), P(dp)


def xent_init(tokens: int, vocab: int, rng: np.random.Generator) -> list[np.ndarray]:
    # a different scale per vocab block, so the shards' maxima differ clearly
    scale = np.repeat(np.array([0.5, 1.5, 3.0, 6.0]), vocab // 4)[None, :]
    logits = (scale * rng.standard_normal((tokens, vocab))).astype(np.float32)
    labels = rng.integers(0, vocab, size=(tokens,)).astype(np.int32)
    return [logits, labels]


def _target_logit(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """The label's logit on the shard that owns it, 0 elsewhere (to be psum'd over "tp")."""
    v_local = logits.shape[-1]
    local = labels - jax.lax.axis_index("tp") * v_local
    in_range = (local >= 0) & (local < v_local)
    picked = jnp.take_along_axis(logits, jnp.where(in_range, local, 0)[:, None], axis=-1)[:, 0]
    return jnp.where(in_range, picked, 0.0)


def _local_xent(logits: jax.Array, labels: jax.Array) -> jax.Array:
    m = jax.lax.pmax(jnp.max(logits, axis=-1), "tp")
    sum_exp = jax.lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
    picked = jax.lax.psum(_target_logit(logits, labels), "tp")
    return jnp.log(sum_exp) + m - picked


def _local_xent_local_max(logits: jax.Array, labels: jax.Array) -> jax.Array:
    m = jnp.max(logits, axis=-1)  # BUG: local max: the shards' exponentials psum'd below use different shifts
    sum_exp = jax.lax.psum(jnp.sum(jnp.exp(logits - m[:, None]), axis=-1), "tp")
    picked = jax.lax.psum(_target_logit(logits, labels), "tp")
    return jnp.log(sum_exp) + m - picked


def _local_xent_local_sum_exp(logits: jax.Array, labels: jax.Array) -> jax.Array:
    m = jax.lax.pmax(jnp.max(logits, axis=-1), "tp")
    sum_exp = jnp.sum(jnp.exp(logits - m[:, None]), axis=-1)  # BUG: local sum of exponentials (needs psum over "tp")
    picked = jax.lax.psum(_target_logit(logits, labels), "tp")
    return jnp.log(sum_exp) + m - picked


XENT_VARIANTS: dict[str, Callable[..., jax.Array]] = {
    "correct": _local_xent,
    "local_max": _local_xent_local_max,
    "local_sum_exp": _local_xent_local_sum_exp,
}


def shard_map_xent(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = xent_specs()
    return jax.shard_map(XENT_VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=False)
