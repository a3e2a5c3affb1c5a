"""A decode step's KV-cache write by hand, the cache split over the sequence (flash decoding's layout).

Each device holds `block` positions of the cache; the new token's key goes to position `pos`. The body
shifts the index to its block (`pos - axis_index * block`), writes there with `dynamic_update_slice`, which
clamps an index outside the block back into it, and keeps the write only where the index lies in the block
(`where(mine, written, cache)`). The twin counts the blocks one position short: two devices write some
positions, and the wrong rows.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


def reference(cache: jax.Array, k: jax.Array, pos: jax.Array) -> jax.Array:
    """cache [seq, heads·dim], k [1, heads·dim], pos a scalar in [0, seq)."""
    return lax.dynamic_update_slice(cache, k, (pos, 0))


def _write(cache: jax.Array, k: jax.Array, pos: jax.Array) -> jax.Array:
    block = cache.shape[0]
    local = pos - lax.axis_index("x") * block
    mine = (local >= 0) & (local < block)
    return jnp.where(mine, lax.dynamic_update_slice(cache, k, (local, 0)), cache)


def _write_short_blocks(cache: jax.Array, k: jax.Array, pos: jax.Array) -> jax.Array:
    block = cache.shape[0]
    local = pos - lax.axis_index("x") * (block - 1)  # BUG: blocks counted one position short
    mine = (local >= 0) & (local < block)
    return jnp.where(mine, lax.dynamic_update_slice(cache, k, (local, 0)), cache)


VARIANTS: dict[str, Callable[..., jax.Array]] = {"correct": _write, "short_blocks": _write_short_blocks}


def specs() -> tuple[list[P], P]:
    return [P("x"), P(), P()], P("x")


def shard_map_write(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec, check_vma=False)


def init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((32, 8)).astype(np.float32), rng.standard_normal((1, 8)).astype(np.float32),
            np.asarray(13, dtype=np.int32)]
