"""Ops real programs contain beyond matmuls and collectives (issue 14, op coverage): argmax, pooling, cumsum.

Each pair is a plain jnp reference and either a shard_map body (one device's view) or the same function
partitioned by XLA (``jax.jit`` with shardings). The correct ones must come out `equivalent`; their buggy
twins (a ``# BUG:`` line) `discrepancy` at that line:

- ``jnp.argmax`` lowers to a variadic ``reduce`` of the values and an iota of indices with a comparator
  body. Along a dim whole on every device it runs shard by shard; along a split dim XLA reduces each
  device's block (with global indices) and combines the gathered block results with the same body;
- ``reduce_window``: average and max pooling of a batch-split NHWC tensor, ``jnp.cumsum`` along a dim whole
  on every device (a window as long as the dim, padded in front), and XLA's cumsum / cummax of a split dim.

The mesh is 8 devices on "x" (or 2 x 4 with axes "dp", "tp").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

N = 8
MESH_2D = (2, 4)


# ------------------------------------------------------------------------------------- argmax / argmin


def argmax_rows_ref(x: jax.Array) -> jax.Array:
    return jnp.argmax(x, axis=1)


def argmin_rows_ref(x: jax.Array) -> jax.Array:
    return jnp.argmin(x, axis=1)


def argmax_rows_body(x: jax.Array) -> jax.Array:
    """Rows split, the reduced dim whole on every device: the local argmax is the global one."""
    return jnp.argmax(x, axis=1)


def argmax_rows_argmin_body(x: jax.Array) -> jax.Array:
    return jnp.argmin(x, axis=1)  # BUG: argmin where the reference takes argmax


def argmax_cols_ref(x: jax.Array) -> jax.Array:
    """Top-1 over a vocab-like dim; partitioned by XLA with that dim split over "tp"."""
    return jnp.argmax(x, axis=1)


def argmin_cols_ref(x: jax.Array) -> jax.Array:
    return jnp.argmin(x, axis=1)


def _argmax_pick(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """JAX's argmax comparator: the larger value (NaN first), on ties the smaller index."""
    (av, ai), (bv, bi) = a, b
    pick = (av > bv) | (av != av)
    pick_index = pick | ((av == bv) & (ai < bi))
    return lax.select(pick, av, bv), lax.select(pick_index, ai, bi)


def _best(values: jax.Array, ids: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    inits = (jnp.array(-jnp.inf, values.dtype), jnp.array(0, ids.dtype))
    return lax.reduce((values, ids), inits, _argmax_pick, (axis,))  # type: ignore[no-any-return]


def argmax_split_body(x: jax.Array) -> jax.Array:
    """The reduced dim split over "x": each device's best (value, global index), gathered and reduced again
    (the partitioner's scheme, by hand)."""
    ids = lax.broadcasted_iota(jnp.int32, x.shape, 1) + lax.axis_index("x") * x.shape[1]
    v, i = _best(x, ids, 1)
    return _best(lax.all_gather(v, "x", axis=1), lax.all_gather(i, "x", axis=1), 1)[1]


def argmax_split_local_ids_body(x: jax.Array) -> jax.Array:
    ids = lax.broadcasted_iota(jnp.int32, x.shape, 1)  # BUG: local indices, the shard offset is missing
    v, i = _best(x, ids, 1)
    return _best(lax.all_gather(v, "x", axis=1), lax.all_gather(i, "x", axis=1), 1)[1]


# ----------------------------------------------------------------------------- reduce_window: pooling


def avg_pool_ref(x: jax.Array) -> jax.Array:
    """2 x 2 average pooling, stride 2, over H and W of NHWC."""
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def avg_pool_body(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0


def avg_pool_max_body(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0  # BUG: max, not add


def max_pool_ref(x: jax.Array) -> jax.Array:
    """3 x 3 max pooling, stride 1, 'SAME' padding (one row/column each side)."""
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))


def max_pool_body(x: jax.Array) -> jax.Array:
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))


def max_pool_shifted_body(x: jax.Array) -> jax.Array:
    pads = ((0, 0), (0, 2), (0, 2), (0, 0))
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 1, 1, 1), pads)  # BUG: window not centred


# ------------------------------------------------------------------------------ reduce_window: cumsum


def cumsum_cols_ref(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x, axis=1)


def cumsum_cols_body(x: jax.Array) -> jax.Array:
    """Rows split, the summed dim whole on every device."""
    return jnp.cumsum(x, axis=1)


def cumsum_cols_reversed_body(x: jax.Array) -> jax.Array:
    return lax.cumsum(x, axis=1, reverse=True)  # BUG: a suffix sum where the reference takes prefix sums


# --------------------------------------------------------------------------------------- sort / top_k


def sort_cols_ref(x: jax.Array) -> jax.Array:
    return jnp.sort(x, axis=1)


def sort_cols_body(x: jax.Array) -> jax.Array:
    """Rows split, each row sorted whole on its device."""
    return jnp.sort(x, axis=1)


def sort_cols_descending_body(x: jax.Array) -> jax.Array:
    return -jnp.sort(-x, axis=1)  # BUG: descending where the reference sorts ascending


def top_k_ref(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    values, ids = lax.top_k(x, 4)
    return values, ids


def top_k_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Rows split, the top 4 of each whole row (indices are positions in the row)."""
    values, ids = lax.top_k(x, 4)
    return values, ids


def top_k_smallest_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    values, ids = lax.top_k(-x, 4)  # BUG: the 4 smallest, not the 4 largest
    return -values, ids


# ------------------------------------------------------- prefix scans over a split dim, as XLA partitions them
# XLA gathers the dim, pads it in front and slices each device a window ending at its block's last row
# (rules/halo.py reads that as a halo above the block).


def cumsum_rows_ref(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x, axis=0)


def cummax_rows_ref(x: jax.Array) -> jax.Array:
    return lax.cummax(x, axis=0)


# ------------------------------------------------------------------- special functions, precision, barriers


def special_functions_ref(x: jax.Array) -> jax.Array:
    """erf, erf_inv, lgamma, digamma and tan of a sharded value (chlo ops), its bf16 rounding
    (reduce_precision) and an optimization barrier between two uses."""
    a, b = lax.optimization_barrier((jnp.abs(x) + 0.5, jnp.tanh(x) * 0.9))
    smooth = jax.scipy.special.erf(x) + jax.scipy.special.erfinv(b) + jnp.tan(x * 0.5)
    gammas = jax.scipy.special.gammaln(a) - jax.scipy.special.digamma(a)
    return lax.reduce_precision(smooth * gammas, exponent_bits=8, mantissa_bits=7)


def fp8_matmuls_ref(x: jax.Array, w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """An fp8 (e4m3) matmul accumulating in float32, and an e5m2 round trip of the activations before a
    float32 matmul: the converts of fp8 training recipes."""
    q = jnp.dot(x.astype(jnp.float8_e4m3fn), w.astype(jnp.float8_e4m3fn), preferred_element_type=jnp.float32)
    return q, x.astype(jnp.float8_e5m2).astype(jnp.float32) @ w


# ------------------------------------------------------------------------- roll and flip of a split dim


def roll_rows_ref(x: jax.Array) -> jax.Array:
    """XLA: the last 3 rows of each block sent cyclically to the next device, joined before the rest."""
    return jnp.roll(x, 3, axis=0)


def flip_rows_ref(x: jax.Array) -> jax.Array:
    """XLA: the blocks' order reversed by a collective-permute, each block reversed on its device."""
    return jnp.flip(x, axis=0) * 2.0


# --------------------------------------------------------------------------- scatter into a split dim


def scatter_add_rows_ref(x: jax.Array, idx: jax.Array, v: jax.Array) -> jax.Array:
    """XLA: each device scatters into its own block of rows, the indices shifted by minus the block's start
    (updates whose row is elsewhere fall out of bounds and are skipped)."""
    return x.at[idx].add(v)


# ------------------------------------------------------------------ argmax of each device's own block


def group_argmax_ref(x: jax.Array) -> jax.Array:
    """Top-1 inside each group of 4 columns (a router per expert group): the index inside the group."""
    return x.reshape(x.shape[0], -1, 4).argmax(-1).astype(jnp.int32)


def group_argmax_body(x: jax.Array) -> jax.Array:
    """Columns split over "x", one group per device: its argmax is its group's, returned per device."""
    return x.argmax(axis=-1, keepdims=True).astype(jnp.int32)


def group_argmax_global_body(x: jax.Array) -> jax.Array:
    i = x.argmax(axis=-1, keepdims=True).astype(jnp.int32)
    return i + lax.axis_index("x") * x.shape[1]  # BUG: the global column, not the index inside the group


# ------------------------------------------------------------------------- a strided slice of a split dim


def odd_cols_ref(x: jax.Array) -> jax.Array:
    """Every other column from column 1 (a downsampling): XLA slices each device's block the same way."""
    return x[:, 1::2] * 2.0


def odd_cols_body(x: jax.Array) -> jax.Array:
    """Columns split over "x" in blocks of an even width: each block's odd columns are the tensor's."""
    return x[:, 1::2] * 2.0


def odd_cols_even_body(x: jax.Array) -> jax.Array:
    return x[:, ::2] * 2.0  # BUG: the even columns, where the reference takes the odd ones


# ----------------------------------------------------- argmax over a split vocabulary by pmax and pmin


def greedy_ref(logits: jax.Array) -> jax.Array:
    """The greedy token of one position's logits."""
    return jnp.argmax(logits).astype(jnp.int32)


def greedy_body(logits: jax.Array) -> jax.Array:
    """Vocab split over "x": the block's max and argmax, the global max by pmax, the smallest global index
    among the blocks reaching it by pmin (the others offer a sentinel past the vocabulary)."""
    local = jnp.max(logits)
    best = lax.pmax(local, "x")
    pos = lax.axis_index("x") * logits.shape[0] + jnp.argmax(logits).astype(jnp.int32)
    return lax.pmin(jnp.where(local == best, pos, jnp.int32(2**30)), "x")



# ------------------------------------------------- a cumsum along a split dim, block by block, and by scan


def prefix_sum_ref(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x, axis=1)


def prefix_sum_body(x: jax.Array) -> jax.Array:
    """Columns split over "x": each block's own cumsum plus the totals of the blocks before it (the
    blocks' totals gathered, masked by the device's index)."""
    totals = lax.all_gather(x.sum(axis=1), "x", axis=1)  # [rows, devices]
    before = jnp.where(jnp.arange(N) < lax.axis_index("x"), totals, 0.0).sum(axis=1, keepdims=True)
    return jnp.cumsum(x, axis=1) + before


def prefix_sum_inclusive_body(x: jax.Array) -> jax.Array:
    totals = lax.all_gather(x.sum(axis=1), "x", axis=1)
    before = jnp.where(jnp.arange(N) <= lax.axis_index("x"), totals, 0.0).sum(axis=1, keepdims=True)  # BUG: own block
    return jnp.cumsum(x, axis=1) + before


def scan_cumsum_body(x: jax.Array) -> jax.Array:
    """Columns split over "x", cumsum down the rows (a dim every device holds whole) by a scan."""
    def step(c: jax.Array, row: jax.Array) -> tuple[jax.Array, jax.Array]:
        return c + row, c + row

    return lax.scan(step, jnp.zeros_like(x[0]), x)[1]


def rows_cumsum_ref(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x, axis=0)


# ------------------------------------------------------------------ lax.map over a split batch dim


def map_rows(x: jax.Array) -> jax.Array:
    """A per-row function by `lax.map` (a while loop writing each row into a buffer): rows split over "x",
    each device maps over its own rows."""
    return lax.map(lambda r: jnp.tanh(r) * 2.0 + r.sum(), x)


def map_rows_body_shifted(x: jax.Array) -> jax.Array:
    return lax.map(lambda r: jnp.tanh(r) * 2.0 + r.max(), x)  # BUG: max where the reference sums the row


# Found by the differential fuzzer (tools/fuzz.py): a ppermute by an arbitrary permutation against a take
# of the blocks, and a ring of ppermutes in a fori_loop against a roll by a traced shift.
BLOCK_SOURCES = [3, 0, 6, 1, 7, 2, 5, 4]  # device j receives the block of device BLOCK_SOURCES[j]


def permuted_blocks_ref(x: jax.Array) -> jax.Array:
    return jnp.take(x.reshape(N, -1, x.shape[1]), jnp.array(BLOCK_SOURCES), axis=0).reshape(x.shape) * 2.0


def permuted_blocks_body(x: jax.Array) -> jax.Array:
    return lax.ppermute(x, "x", perm=[(s, d) for d, s in enumerate(BLOCK_SOURCES)]) * 2.0


def permuted_blocks_inverse(x: jax.Array) -> jax.Array:
    return lax.ppermute(x, "x", perm=[(d, s) for d, s in enumerate(BLOCK_SOURCES)]) * 2.0  # BUG: the inverse


def ring_decay_ref(x: jax.Array) -> jax.Array:
    block = x.shape[0] // N
    return lax.fori_loop(0, 3, lambda i, c: c * 0.5 + jnp.roll(x, i * block, axis=0), jnp.zeros_like(x))


def ring_decay_body(x: jax.Array) -> jax.Array:
    ring = [(i, (i + 1) % N) for i in range(N)]

    def step(i: jax.Array, c: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        acc, blk = c
        return acc * 0.5 + blk, lax.ppermute(blk, "x", perm=ring)

    return lax.fori_loop(0, 3, step, (jnp.zeros_like(x), x))[0]


def onehot_gather_ref(x: jax.Array) -> jax.Array:
    return jnp.tanh(x)


def onehot_gather_body(x: jax.Array) -> jax.Array:
    """An all-gather spelt as the psum of buffers of zeros, each device's block written at its place."""
    whole = jnp.zeros((x.shape[0] * N, x.shape[1]), x.dtype)
    placed = lax.dynamic_update_slice_in_dim(whole, jnp.tanh(x), lax.axis_index("x") * x.shape[0], axis=0)
    return lax.psum(placed, "x")


def onehot_gather_pmax(x: jax.Array) -> jax.Array:
    whole = jnp.zeros((x.shape[0] * N, x.shape[1]), x.dtype)
    placed = lax.dynamic_update_slice_in_dim(whole, jnp.tanh(x), lax.axis_index("x") * x.shape[0], axis=0)
    return lax.pmax(placed, "x")  # BUG: a max over buffers of zeros drops the negative entries


def onehot_gather_shifted(x: jax.Array) -> jax.Array:
    whole = jnp.zeros((x.shape[0] * N, x.shape[1]), x.dtype)
    at = (lax.axis_index("x") + 1) % N * x.shape[0]
    placed = lax.dynamic_update_slice_in_dim(whole, jnp.tanh(x), at, axis=0)  # BUG: at the next device's place
    return lax.psum(placed, "x")
