"""DeepSpeed-Ulysses sequence parallelism: attention whose sequence split is traded for a head split.

``q, k, v: [batch, seq, heads, head_dim]``, batch over "dp", seq over "sp". An ``all_to_all`` over "sp"
splits the heads and gathers the sequence (every device then holds the whole sequence for ``heads / |sp|``
heads), causal attention runs locally, and a second ``all_to_all`` gives the heads back and splits the
sequence again. The broken variant exchanges over "dp" instead of "sp": the shapes still fit (heads and
sequence are divisible by both), so it runs and attends over the wrong half of the sequence.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

from .ring_attention import reference

__all__ = ["init", "reference", "shard_map_ulysses", "specs"]


def specs(dp: str = "dp", sp: str = "sp") -> tuple[tuple[P, P, P], P]:
    act = P(dp, sp, None, None)
    return (act, act, act), act


def init(batch: int, seq: int, heads: int, head_dim: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((batch, seq, heads, head_dim)).astype(np.float32) for _ in range(3)]


def _seq_to_heads(x: jax.Array, axis: str) -> jax.Array:
    return jax.lax.all_to_all(x, axis, 2, 1, tiled=True)  # split heads, gather sequence


def _heads_to_seq(x: jax.Array, axis: str) -> jax.Array:
    return jax.lax.all_to_all(x, axis, 1, 2, tiled=True)  # split sequence, gather heads


def _ulysses(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    q, k, v = (_seq_to_heads(x, "sp") for x in (q, k, v))
    return _heads_to_seq(reference(q, k, v), "sp")


def _ulysses_wrong_axis(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    q, k, v = (jax.lax.all_to_all(x, "dp", 2, 1, tiled=True) for x in (q, k, v))  # BUG: exchanged over dp, not sp
    return _heads_to_seq(reference(q, k, v), "dp")


VARIANTS: dict[str, Callable[..., jax.Array]] = {"correct": _ulysses, "wrong_axis": _ulysses_wrong_axis}


def shard_map_ulysses(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
