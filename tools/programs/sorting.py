"""Sort and top-k along a split dim (issue 14): XLA's partitioning of them, and distributed top-k by hand.

- XLA's partitioner (Shardy or GSPMD) given `jnp.sort` / `jnp.argsort` / `lax.top_k` of a tensor whose
  sorted dim is split: a sort is resharded by an all-to-all that moves the split onto the rows, sorted,
  and moved back; a top-k all-gathers the operand and takes the top-k of the whole rows.
- Vocab-parallel sampling by hand in a shard_map: each device takes the top k of its block of the vocab,
  adds its block offset to the indices, all-gathers values and indices, takes the top k of the candidates
  and reads the indices at the chosen positions. That equals the global `lax.top_k` (values and indices,
  ties included: on equal values the lower index first) because the candidates lie in block order; the
  buggy twins forget the offset or keep too few candidates per device.

The mesh is 8 devices on "x" (shard_map) or 2 x 4 with axes "dp", "tp" (partitioned).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

N = 8
MESH_2D = (2, 4)
K = 4


# ------------------------------------------------------------------------------ partitioned by XLA


def sort_ref(x: jax.Array) -> jax.Array:
    return jnp.sort(x, axis=1)


def argsort_ref(x: jax.Array) -> jax.Array:
    return jnp.argsort(x, axis=1)


def sort_pairs_ref(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """lax.sort of (values, positions) by the values: the multi-operand sort argsort is made of."""
    ids = lax.broadcasted_iota(jnp.int32, x.shape, 1)
    values, order = lax.sort((x, ids), dimension=1, num_keys=1)
    return values, order


def top_k_ref(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    values, ids = lax.top_k(x, K)
    return values, ids


# ------------------------------------------------------------------------------ shard_map by hand


def top_k_merged_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x: this device's block of the last dim. The block's top k with global indices, gathered (tiled,
    in device order), and the top k of the candidates."""
    values, ids = lax.top_k(x, K)
    ids = ids + lax.axis_index("x") * x.shape[-1]
    cand_values = lax.all_gather(values, "x", axis=1, tiled=True)
    cand_ids = lax.all_gather(ids, "x", axis=1, tiled=True)
    top, pos = lax.top_k(cand_values, K)
    return top, jnp.take_along_axis(cand_ids, pos, axis=1)


def top_k_merged_stacked_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The same with untiled all-gathers ([rows, devices, k]) flattened into the candidates."""
    values, ids = lax.top_k(x, K)
    ids = ids + lax.axis_index("x") * x.shape[-1]
    cand_values = lax.all_gather(values, "x", axis=1).reshape(x.shape[0], -1)
    cand_ids = lax.all_gather(ids, "x", axis=1).reshape(x.shape[0], -1)
    top, pos = lax.top_k(cand_values, K)
    return top, jnp.take_along_axis(cand_ids, pos, axis=1)


def top_k_local_ids_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    values, ids = lax.top_k(x, K)  # BUG: indices within the block: the shard offset is never added
    cand_values = lax.all_gather(values, "x", axis=1, tiled=True)
    cand_ids = lax.all_gather(ids, "x", axis=1, tiled=True)
    top, pos = lax.top_k(cand_values, K)
    return top, jnp.take_along_axis(cand_ids, pos, axis=1)


def top_k_too_few_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    values, ids = lax.top_k(x, 1)  # BUG: one candidate per device: the global top k may hold several of a block
    ids = ids + lax.axis_index("x") * x.shape[-1]
    cand_values = lax.all_gather(values, "x", axis=1, tiled=True)
    cand_ids = lax.all_gather(ids, "x", axis=1, tiled=True)
    top, pos = lax.top_k(cand_values, K)
    return top, jnp.take_along_axis(cand_ids, pos, axis=1)
