"""Pairs that once fooled the prover into a false `equivalent`: each body computes something else than
its reference on some inputs, in a way that is easy to miss when algebra is done over the wrong domain.

- integer division reassociated as if it were real division: ``(a * b) // c`` is not ``a * (b // c)``;
- 64-bit integer constants that collide when compared as float64 (``2**53`` and ``2**53 + 1``;
  ``2**64 - 1`` and ``2**64 - 2``);
- a masked vocab-parallel lookup of a *window* of two rows: windows that cross a shard edge are clamped
  inside the local shard, so the psum of the masked pieces is not the reference's window.

Each body is a shard_map body (one device's view) over the mesh axis "x"; the bug line carries
``# BUG:``. The references are plain jnp programs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

# ---------------------------------------------------------------------- integer division is not real


def int_div_ref(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    return lax.div(a * b, c)


def int_div_body(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    return a * lax.div(b, c)  # BUG: integer division reassociated: (a*b)/c is not a*(b/c) on integers


def int_div_body_correct(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
    return lax.div(a * b, c)


# ---------------------------------------------------------------------- 64-bit constants, exactly

BIG = 2**53


def int64_const_ref(x: jax.Array) -> jax.Array:
    return x + jnp.int64(BIG)


def int64_const_body(x: jax.Array) -> jax.Array:
    return x + jnp.int64(BIG + 1)  # BUG: 2**53 + 1 is not 2**53 (equal only when compared as float64)


U64_MAX = 2**64 - 1


def uint64_const_ref(x: jax.Array) -> jax.Array:
    return x * jnp.uint64(2) + jnp.uint64(U64_MAX)


def uint64_const_body(x: jax.Array) -> jax.Array:
    return jnp.uint64(U64_MAX - 1) + x * jnp.uint64(2)  # BUG: 2**64 - 2 is not 2**64 - 1


# ---------------------------------------------------------------------- a masked lookup of windows

VOCAB, DIM, WINDOW = 32, 4, 2


def _windows(table: jax.Array, starts: jax.Array) -> jax.Array:
    """Rows ``[s, s + WINDOW)`` of `table` for each start `s` (one gather with ``slice_sizes=(WINDOW, DIM)``;
    a start past ``rows - WINDOW`` is clamped back, as XLA's gather does)."""
    dims = lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0,))
    return lax.gather(table, starts[:, None], dims, slice_sizes=(WINDOW, table.shape[1]),
                      mode=lax.GatherScatterMode.CLIP)


def window_lookup_ref(table: jax.Array, ids: jax.Array) -> jax.Array:
    return _windows(table, ids)


def window_lookup_body(table: jax.Array, ids: jax.Array) -> jax.Array:
    """Vocab-parallel: each device holds rows [k·v, (k+1)·v) and looks up the windows that start there."""
    local = table.shape[0]
    shifted = ids - lax.axis_index("x") * local
    inside = (shifted >= 0) & (shifted < local)
    rows = _windows(table, jnp.where(inside, shifted, 0))  # BUG: windows crossing a shard edge are clamped
    return lax.psum(jnp.where(inside[:, None, None], rows, 0.0), "x")


# ---------------------------------------------------------------------- an integer max over shards

def int_pmax_ref(x: jax.Array) -> jax.Array:
    return jnp.max(x.reshape(8, -1), axis=0)


def int_pmax_body(x: jax.Array) -> jax.Array:
    """pmax of a value split over the axis folds the shards (its identity is the type's least value)."""
    return lax.pmax(x, "x")


# ------------------------------------------------------ a scatter window over part of each split block


def _set_column(x: jax.Array, v: jax.Array) -> jax.Array:
    """Column 3 of the first `len(v)` rows of `x` set to `v` (one scatter whose window runs down dim 0)."""
    dims = lax.ScatterDimensionNumbers(update_window_dims=(0,), inserted_window_dims=(1,),
                                       scatter_dims_to_operand_dims=(1,))
    return lax.scatter(x, jnp.array([3], jnp.int32), v, dims)


def set_column_ref(x: jax.Array, v: jax.Array) -> jax.Array:
    """x: [32, 8], v: [16]: the first 16 rows."""
    return _set_column(x, v)


def set_column_body(x: jax.Array, v: jax.Array) -> jax.Array:
    """Rows of x split over "x" (4 per device), v too (2 per device)."""
    return _set_column(x, v)  # BUG: the first 2 rows of every block, not the first 16 of the tensor
