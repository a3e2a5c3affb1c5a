"""Ring attention (sequence / context parallelism): causal attention with q, k, v split on seq over "sp".

``q, k, v: [batch, seq, heads, head_dim]``, batch over "dp", seq over "sp". Each device keeps its query block
and, for ``n = |sp|`` steps, attends to the K/V block it currently holds, then passes that block on with
``ppermute`` (device i -> i + 1, so at step t device i holds the block of device ``i - t``). The softmax is
accumulated online (flash-attention style): running max ``m``, denominator ``den`` and output ``o``, rescaled by
``exp(m_old - m_new)`` whenever the max grows. The causal mask compares global positions, so the block index
``(i - t) mod n`` must match the direction in which the blocks travel. The loop is a Python loop (unrolled),
or a ``lax.fori_loop`` (variant "fori", correct).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

NEG = float(np.finfo(np.float32).min)


def reference(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    s = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (q.shape[-1] ** -0.5)
    causal = jnp.arange(s)[None, :] <= jnp.arange(s)[:, None]
    scores = jnp.where(causal, scores, NEG)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", probs, v)


def specs(dp: str = "dp", sp: str = "sp") -> tuple[tuple[P, P, P], P]:
    act = P(dp, sp, None, None)
    return (act, act, act), act


def init(batch: int, seq: int, heads: int, head_dim: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((batch, seq, heads, head_dim)).astype(np.float32) for _ in range(3)]


def _block_scores(q: jax.Array, k: jax.Array, q_block: jax.Array, kv_block: jax.Array) -> jax.Array:
    """Masked scores [b, h, q, k] of this device's queries against one K block (global causal positions)."""
    s_local = q.shape[1]
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (q.shape[-1] ** -0.5)
    q_pos = q_block * s_local + jnp.arange(s_local)
    k_pos = kv_block * s_local + jnp.arange(s_local)
    return jnp.where(k_pos[None, :] <= q_pos[:, None], scores, NEG)


def _finish(o: jax.Array, den: jax.Array) -> jax.Array:
    return jnp.transpose(o / den[..., None], (0, 2, 1, 3))  # [b, h, q, d] -> [b, q, h, d]


def _ring(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    n = jax.lax.axis_size("sp")
    me = jax.lax.axis_index("sp")
    b, s_local, h, d = q.shape
    m = jnp.full((b, h, s_local), NEG, q.dtype)
    den = jnp.zeros((b, h, s_local), q.dtype)
    o = jnp.zeros((b, h, s_local, d), q.dtype)
    for t in range(n):
        scores = _block_scores(q, k, me, (me - t) % n)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(scores - m_new[..., None])
        den = den * corr + jnp.sum(p, axis=-1)
        o = o * corr[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p, v)
        m = m_new
        if t + 1 < n:
            k, v = jax.lax.ppermute((k, v), "sp", [(i, (i + 1) % n) for i in range(n)])
    return _finish(o, den)


def _ring_no_rescale(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    n = jax.lax.axis_size("sp")
    me = jax.lax.axis_index("sp")
    b, s_local, h, d = q.shape
    m = jnp.full((b, h, s_local), NEG, q.dtype)
    den = jnp.zeros((b, h, s_local), q.dtype)
    o = jnp.zeros((b, h, s_local, d), q.dtype)
    for t in range(n):
        scores = _block_scores(q, k, me, (me - t) % n)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(scores - m_new[..., None])
        den = den * corr + jnp.sum(p, axis=-1)
        o = o + jnp.einsum("bhqk,bkhd->bhqd", p, v)  # BUG: accumulated output not rescaled by exp(m_old - m_new)
        m = m_new
        if t + 1 < n:
            k, v = jax.lax.ppermute((k, v), "sp", [(i, (i + 1) % n) for i in range(n)])
    return _finish(o, den)


def _ring_wrong_direction(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    n = jax.lax.axis_size("sp")
    me = jax.lax.axis_index("sp")
    b, s_local, h, d = q.shape
    m = jnp.full((b, h, s_local), NEG, q.dtype)
    den = jnp.zeros((b, h, s_local), q.dtype)
    o = jnp.zeros((b, h, s_local, d), q.dtype)
    for t in range(n):
        scores = _block_scores(q, k, me, (me - t) % n)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(scores - m_new[..., None])
        den = den * corr + jnp.sum(p, axis=-1)
        o = o * corr[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p, v)
        m = m_new
        if t + 1 < n:
            k, v = jax.lax.ppermute((k, v), "sp", [(i, (i - 1) % n) for i in range(n)])  # BUG: i -> i-1, mask assumes i -> i+1
    return _finish(o, den)


def _ring_fori(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """The same ring as a ``lax.fori_loop`` (a while loop whose carry holds the travelling K/V blocks)."""
    n = jax.lax.axis_size("sp")
    me = jax.lax.axis_index("sp")
    b, s_local, h, d = q.shape

    def step(t: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        k, v, m, den, o = carry
        scores = _block_scores(q, k, me, (me - t) % n)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        corr = jnp.exp(m - m_new)
        p = jnp.exp(scores - m_new[..., None])
        den = den * corr + jnp.sum(p, axis=-1)
        o = o * corr[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p, v)
        k, v = jax.lax.ppermute((k, v), "sp", [(i, (i + 1) % n) for i in range(n)])
        return k, v, m_new, den, o

    init = (k, v, jnp.full((b, h, s_local), NEG, q.dtype), jnp.zeros((b, h, s_local), q.dtype),
            jnp.zeros((b, h, s_local, d), q.dtype))
    _, _, _, den, o = jax.lax.fori_loop(0, n, step, init)
    return _finish(o, den)


def _ring_inverted_rescale(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    n = jax.lax.axis_size("sp")
    me = jax.lax.axis_index("sp")
    b, s_local, h, d = q.shape
    m = jnp.full((b, h, s_local), NEG, q.dtype)
    den = jnp.zeros((b, h, s_local), q.dtype)
    o = jnp.zeros((b, h, s_local, d), q.dtype)
    for t in range(n):
        scores = _block_scores(q, k, me, (me - t) % n)
        m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
        corr = jnp.exp(m_new - m)  # BUG: exponent inverted (exp(m_new - m_old) overflows on the first step)
        p = jnp.exp(scores - m_new[..., None])
        den = den * corr + jnp.sum(p, axis=-1)
        o = o * corr[..., None] + jnp.einsum("bhqk,bkhd->bhqd", p, v)
        m = m_new
        if t + 1 < n:
            k, v = jax.lax.ppermute((k, v), "sp", [(i, (i + 1) % n) for i in range(n)])
    return _finish(o, den)


VARIANTS: dict[str, Callable[..., jax.Array]] = {
    "correct": _ring,
    "fori": _ring_fori,
    "inverted_rescale": _ring_inverted_rescale,
    "no_rescale": _ring_no_rescale,
    "wrong_direction": _ring_wrong_direction,
}


def shard_map_ring_attention(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
