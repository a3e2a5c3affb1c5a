"""Correct programs the verifier once called a `discrepancy`: each computes the same values as its reference.

A `discrepancy` must come with a counterexample, so every pair here must come out `equivalent` or
`unknown`; the fixtures made from them (``fa_*`` in ``tools/gen_fixtures.py``) keep the false alarms from
coming back. Each construct is legal and value-preserving but unusual enough to trip a layout check:

- ``all_gather`` / ``psum_scatter`` with ``tiled=False`` (a new, or a dropped, leading dim of size |x|),
  followed by a reshape that merges it back into the split dim;
- a transpose that swaps two size-1 dims (a no-op on values: only the shape's spelling changes);
- an all-reduce built by hand from ``n - 1`` ppermutes and adds (a ring), returned with ``out_specs=P()``;
- ``sum(all_gather(x), 0)``: a psum written as a gather followed by a reduction;
- a flag from a per-shard ``any()`` made global with psum, then branched on with ``lax.cond``;
- the shard_map tutorial's collective matmul: the rhs blocks travel round the ring with ppermute while
  each device multiplies the lhs column block that matches the rhs block it holds;
- ``out_specs=P(('y', 'x'))`` with ``in_specs=P(('x', 'y'))``: the body does nothing to the layout, the
  specs transpose the device order of the blocks, and the reference transposes the blocks itself;
- logsumexp shifted by the global *minimum* (pmin of the local minima) instead of the maximum: any shift
  gives the same value while ``exp`` does not overflow;
- for partitioned programs (``jax.jit`` with shardings, XLA's partitioner does the work): a cumsum over the
  sharded dim, and a replicated input sliced to an output sharded on one mesh axis (whose offset table the
  generator edits without changing its meaning).

Each pair is a plain jnp reference and a shard_map body (one device's view) over the mesh axis "x" (or the
axes "x", "y" of a 2 x 4 mesh where the construct needs two axes).
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import lax

N = 8  # devices on the mesh axis "x" of the one-axis pairs

# -------------------------------------------------------- all_gather / psum_scatter with tiled=False


def gather_untiled_ref(x: jax.Array) -> jax.Array:
    return jnp.tanh(x) * 2.0


def gather_untiled_body(x: jax.Array) -> jax.Array:
    """x: [rows / n, d] -> every device gets the whole [rows, d]: [n, rows / n, d] merged by a reshape."""
    whole = lax.all_gather(x, "x", tiled=False)  # a new leading dim of size n, in device order
    return jnp.tanh(whole.reshape(-1, x.shape[1])) * 2.0


def scatter_untiled_ref(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def scatter_untiled_body(a: jax.Array, b: jax.Array) -> jax.Array:
    """a: [n, k / n], b: [k / n, d] (contracting dim split): partial [n, d]; row i of the sum goes to device i,
    which drops the scattered dim (tiled=False) and puts it back as a leading dim of size 1."""
    partial_sums = a @ b
    row = lax.psum_scatter(partial_sums, "x", scatter_dimension=0, tiled=False)  # [d]
    return row.reshape(1, -1)


# ---------------------------------------------------------------- a transpose of two size-1 dims


def swap_unit_dims_ref(x: jax.Array) -> jax.Array:
    """x: [n, 1, d] -> [1, n, d]."""
    return jnp.swapaxes(x, 0, 1) + 1.0


def swap_unit_dims_body(x: jax.Array) -> jax.Array:
    """The local block is [1, 1, d]: the same transpose swaps two dims of size 1 (values untouched)."""
    return jnp.swapaxes(x, 0, 1) + 1.0


# --------------------------------------------------------------- a ring all-reduce from ppermutes


def block_sum_ref(x: jax.Array) -> jax.Array:
    """The sum of the n row blocks of x: [rows, d] -> [rows / n, d]."""
    return jnp.sum(x.reshape(N, -1, x.shape[1]), axis=0)


def ring_allreduce_body(x: jax.Array) -> jax.Array:
    """n - 1 steps: pass the block received last to the next device and add it; after them every device
    has added every other device's block once (in its own order), i.e. holds the psum."""
    n = lax.axis_size("x")
    ring = [(i, (i + 1) % n) for i in range(n)]
    acc, passing = x, x
    for _ in range(n - 1):
        passing = lax.ppermute(passing, "x", ring)
        acc = acc + passing
    return acc


# --------------------------------------------------------------------- sum(all_gather(x), 0)


def sum_all_gather_body(x: jax.Array) -> jax.Array:
    """A psum spelled as a gather of every device's block (a new leading dim) summed away."""
    return jnp.sum(lax.all_gather(x, "x"), axis=0)


# ----------------------------------------------------------------- per-shard any() under lax.cond


def cond_any_ref(x: jax.Array) -> jax.Array:
    return lax.cond(jnp.any(x > 0), lambda v: v * 2.0, lambda v: v - 1.0, x)


def cond_any_body(x: jax.Array) -> jax.Array:
    """any() over the whole array = (some shard has one) = psum of the local any()s > 0."""
    hits = lax.psum(jnp.any(x > 0).astype(jnp.int32), "x")
    return lax.cond(hits > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


# ------------------------------------------------------------------------- collective matmul
# Adapted from the shard_map tutorial in jax-ml/jax, docs/notebooks/shard_map.md ("Example 1: all-gather on
# one side", matmul_allgather_overlapped): lhs split on rows, rhs on its contracting dim, and the rhs blocks
# go round the ring with ppermute, one local matmul per step, instead of one all_gather before the matmul.


def matmul_ref(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return lhs @ rhs


def _collective_matmul(lhs_block: jax.Array, rhs_block: jax.Array, step: int) -> jax.Array:
    """``step = +1``: send i -> i + 1, so at step k device i holds rhs block ``(i - k) mod n`` (the tutorial
    as written); ``step = -1``: send i -> i - 1, and the block is ``(i + k) mod n``."""
    size = lax.axis_size("x")
    idx = lax.axis_index("x")
    shift = partial(lax.ppermute, axis_name="x", perm=[(i, (i + step) % size) for i in range(size)])
    b = lhs_block.shape[1] // size

    def lhs_blocks(i: jax.Array) -> jax.Array:
        return lax.dynamic_slice_in_dim(lhs_block, i * b, b, 1)

    out_block = lhs_blocks(idx) @ rhs_block
    for k in range(1, size):
        rhs_block = shift(rhs_block)
        out_block += lhs_blocks((idx - step * k) % size) @ rhs_block
    return out_block


def collective_matmul_body(lhs_block: jax.Array, rhs_block: jax.Array) -> jax.Array:
    return _collective_matmul(lhs_block, rhs_block, step=+1)


def collective_matmul_plus_body(lhs_block: jax.Array, rhs_block: jax.Array) -> jax.Array:
    return _collective_matmul(lhs_block, rhs_block, step=-1)


# ------------------------------------------------------ out_specs P(('y', 'x')), in_specs P(('x', 'y'))

MESH_XY = (2, 4)  # |x|, |y|


def blocks_transposed_ref(x: jax.Array) -> jax.Array:
    """Row block ``i * |y| + j`` of x lands at ``j * |x| + i``: the (x, y) block grid read in (y, x) order."""
    nx, ny = MESH_XY
    grid = x.reshape(nx, ny, -1, x.shape[1])
    return jnp.sin(jnp.swapaxes(grid, 0, 1).reshape(x.shape))


def blocks_transposed_body(x: jax.Array) -> jax.Array:
    """Elementwise: device (i, j) holds block i*|y| + j in, and (out_specs P(('y', 'x'))) block j*|x| + i out."""
    return jnp.sin(x)


# ----------------------------------------------------------------------- logsumexp, min shift


def logsumexp_ref(x: jax.Array) -> jax.Array:
    return jax.nn.logsumexp(x, axis=-1)


def logsumexp_min_shift_body(x: jax.Array) -> jax.Array:
    """x: [b, v / n] (vocab split). log sum exp(x) = m + log sum exp(x - m) for any m; here m is the global
    minimum (so every exp is >= 1; fine while the spread of a row stays well below log(f32 max))."""
    m = lax.pmin(jnp.min(x, axis=-1), "x")
    s = lax.psum(jnp.sum(jnp.exp(x - m[:, None]), axis=-1), "x")
    return m + jnp.log(s)


# ------------------------------------------------------------------ partitioned programs (jax.jit)


def cumsum_rows(x: jax.Array) -> jax.Array:
    return jnp.cumsum(x, axis=0)


def scale_rows(x: jax.Array) -> jax.Array:
    return x * 2.0


def ring_allreduce_short_body(x: jax.Array) -> jax.Array:
    n = lax.axis_size("x")
    ring = [(i, (i + 1) % n) for i in range(n)]
    acc, passing = x, x
    for _ in range(n - 2):
        passing = lax.ppermute(passing, "x", ring)
        acc = acc + passing  # BUG: n - 2 steps, one short: the block n - 1 places back never reaches acc
    return acc
