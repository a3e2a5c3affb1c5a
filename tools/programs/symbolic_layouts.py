"""Values whose blocks sit on the devices in an order other than "dim k split over axes A": issue 12.

Each pair is a plain jnp reference and a shard_map body (one device's view). The correct ones must come out
`equivalent`; their buggy twins (a ``# BUG:`` line: the wrong axis order, the wrong dim, out_specs that
keep blocks the reference moves) must come out `discrepancy`, never `equivalent`:

- ``all_gather(tiled=False)`` over several axes adds a leading dim whose index is the device's position in
  the gather group (mixed-radix over the axes *in the order named*): merged back by a reshape it is the
  whole tensor only when that order is the order the blocks were split in;
- an untiled gather over the minor axis only: the other axis keeps its split;
- ``out_specs`` listing a dim's axes in another order than the value's blocks (``P(('y', 'x'))`` over
  ``P(('x', 'y'))``), and over a value replicated over one of them: the specs reorder (and repeat) blocks.

The mesh is 2 x 4 with axes "x", "y" (or 8 devices on "x" for the one-axis pairs).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

MESH_XY = (2, 4)  # |x|, |y|
N = 8  # devices of the one-axis pairs


def tanh2_ref(x: jax.Array) -> jax.Array:
    return jnp.tanh(x) * 2.0


# ------------------------------------------------------------- untiled all_gather over two axes


def gather_xy_untiled_body(x: jax.Array) -> jax.Array:
    """x split over ("x", "y"): the group (x, y) lists the blocks in their order, [8, rows/8, d]."""
    whole = lax.all_gather(x, ("x", "y"), tiled=False)
    return jnp.tanh(whole.reshape(-1, x.shape[1])) * 2.0


def gather_yx_untiled_body(x: jax.Array) -> jax.Array:
    """The same gather with the axes named (y, x): member j*|x| + i is device (i, j), holding block i*|y| + j."""
    whole = lax.all_gather(x, ("y", "x"), tiled=False)  # BUG: group order (y, x) is not the block order (x, y)
    return jnp.tanh(whole.reshape(-1, x.shape[1])) * 2.0


def gather_yx_untiled_reordered_body(x: jax.Array) -> jax.Array:
    """The (y, x) gather, its leading dim put back in (x, y) order before the merge: correct."""
    nx, ny = MESH_XY
    whole = lax.all_gather(x, ("y", "x"), tiled=False)
    blocks = whole.reshape(ny, nx, *x.shape).swapaxes(0, 1)
    return jnp.tanh(blocks.reshape(-1, x.shape[1])) * 2.0


def gather_y_untiled_body(x: jax.Array) -> jax.Array:
    """Gather over the minor axis "y" only: device (i, .) gets the |y| blocks i*|y| + j, i.e. x's rows split
    over "x" alone (out_specs P("x"))."""
    whole = lax.all_gather(x, "y", tiled=False)
    return jnp.tanh(whole.reshape(-1, x.shape[1])) * 2.0


def gather_untiled_swapped_body(x: jax.Array) -> jax.Array:
    """One axis: the gathered [n, rows/n, d] merged with its two leading dims swapped (rows interleaved)."""
    whole = jnp.swapaxes(lax.all_gather(x, "x", tiled=False), 0, 1)  # BUG: the device dim must stay major
    return jnp.tanh(whole.reshape(-1, x.shape[1])) * 2.0


# ------------------------------------------------------------------ sum over an untiled gather


def block_sum_ref(x: jax.Array) -> jax.Array:
    """The sum of the N row blocks of x: [rows, d] -> [rows / N, d]."""
    return jnp.sum(x.reshape(N, -1, x.shape[1]), axis=0)


def sum_gather_wrong_dim_body(x: jax.Array) -> jax.Array:
    """x: [N, d] per device (rows = N * N): summing dim 1 sums inside each device's block instead."""
    return jnp.sum(lax.all_gather(x, "x"), axis=1)  # BUG: the gathered (device) dim is 0, not 1


# ----------------------------------------------------------- out_specs axes in another order


def blocks_transposed_sin_ref(x: jax.Array) -> jax.Array:
    """Row block ``i * |y| + j`` of x lands at ``j * |x| + i``."""
    nx, ny = MESH_XY
    return jnp.sin(jnp.swapaxes(x.reshape(nx, ny, -1, x.shape[1]), 0, 1).reshape(x.shape))


def sin_blocks_kept_body(x: jax.Array) -> jax.Array:
    """Used with out_specs P(('x', 'y')): the blocks stay where they were, the reference transposes them."""
    return jnp.sin(x)  # BUG: out_specs P(('x', 'y')) keep the block order; P(('y', 'x')) transposes it


def repeat_y_blocks_ref(x: jax.Array) -> jax.Array:
    """x: [rows, d] split over "y" alone (replicated over "x"); out_specs P(('y', 'x')) make block j*|x| + i
    the y-block j: each y-block twice in a row."""
    nx, ny = MESH_XY
    return jnp.repeat(x.reshape(ny, -1, x.shape[1]), nx, axis=0).reshape(-1, x.shape[1]) + 1.0


def plus_one_body(x: jax.Array) -> jax.Array:
    return x + 1.0


def plus_one_tiled_body(x: jax.Array) -> jax.Array:
    """Used with out_specs P(('x', 'y')) against `repeat_y_blocks_ref`: the whole x twice, not each block."""
    return x + 1.0  # BUG: out_specs P(('x', 'y')) tile x; P(('y', 'x')) repeat each block


# ------------------------------------------------------------------ collective matmul, broken
# The shard_map tutorial's collective matmul (tools/programs/false_alarms.py, from jax-ml/jax
# docs/notebooks/shard_map.md): lhs [m, k] split on rows, rhs [k, n] split on rows; the rhs blocks go round
# the ring i -> i + 1, so at step k device i holds rhs block (i - k) mod n and must multiply the lhs column
# block (i - k) mod n. Eight devices on "x".


def matmul_ref(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return lhs @ rhs


def collective_matmul_wrong_direction_body(lhs_block: jax.Array, rhs_block: jax.Array) -> jax.Array:
    """The ring sends i -> i - 1 (device i then holds rhs block (i + k) mod n) but the lhs column blocks are
    taken for the ring i -> i + 1."""
    size = lax.axis_size("x")
    idx = lax.axis_index("x")
    b = lhs_block.shape[1] // size
    out = lax.dynamic_slice_in_dim(lhs_block, idx * b, b, 1) @ rhs_block
    for k in range(1, size):
        rhs_block = lax.ppermute(rhs_block, "x", [(i, (i - 1) % size) for i in range(size)])  # BUG: i -> i+1
        out += lax.dynamic_slice_in_dim(lhs_block, ((idx - k) % size) * b, b, 1) @ rhs_block
    return out


def collective_matmul_step_two_body(lhs_block: jax.Array, rhs_block: jax.Array) -> jax.Array:
    """The ring sends i -> i + 2: after k steps device i holds rhs block (i - 2k) mod n, not (i - k) mod n
    (and with n even, only every other block ever arrives)."""
    size = lax.axis_size("x")
    idx = lax.axis_index("x")
    b = lhs_block.shape[1] // size
    out = lax.dynamic_slice_in_dim(lhs_block, idx * b, b, 1) @ rhs_block
    for k in range(1, size):
        rhs_block = lax.ppermute(rhs_block, "x", [(i, (i + 2) % size) for i in range(size)])  # BUG: i -> i+1
        out += lax.dynamic_slice_in_dim(lhs_block, ((idx - k) % size) * b, b, 1) @ rhs_block
    return out


def collective_matmul_off_by_one_body(lhs_block: jax.Array, rhs_block: jax.Array) -> jax.Array:
    """The lhs column block one step late, (i - k + 1) mod n, against rhs block (i - k) mod n. Not a fixture:
    the prover names the ppermute the misplaced block arrived through, not this line (it is `discrepancy`)."""
    size = lax.axis_size("x")
    idx = lax.axis_index("x")
    b = lhs_block.shape[1] // size
    out = lax.dynamic_slice_in_dim(lhs_block, idx * b, b, 1) @ rhs_block
    for k in range(1, size):
        rhs_block = lax.ppermute(rhs_block, "x", [(i, (i + 1) % size) for i in range(size)])
        out += lax.dynamic_slice_in_dim(lhs_block, ((idx - k + 1) % size) * b, b, 1) @ rhs_block  # BUG: 1 late
    return out


# ------------------------------------------- out_specs that tile a value held the same on many devices
# shard_map assembles an output from every device's value, each at the block its coordinates name under
# out_specs: over an axis the value does not vary along, those blocks are copies (a tiling, or a repeat
# of each block when the axis is minor to the one the value is split over).


def tile_rows_ref(x: jax.Array) -> jax.Array:
    """x: [rows, d] split over "x" (replicated over "y"); out_specs P(('y', 'x')): block j*|x| + i is x's
    block i, so the whole of tanh(x) |y| times."""
    return jnp.tile(jnp.tanh(x), (MESH_XY[1], 1))


def tanh_body(x: jax.Array) -> jax.Array:
    return jnp.tanh(x)


def tanh_blocks_repeated_body(x: jax.Array) -> jax.Array:
    """Used with out_specs P(('x', 'y')) against `tile_rows_ref`: each block |y| times in a row."""
    return jnp.tanh(x)  # BUG: out_specs P(('x', 'y')) repeat each block; P(('y', 'x')) tile the whole


def concat_columns_ref(x: jax.Array) -> jax.Array:
    """x: [rows, cols] split P("y", "x"); gathered over "y" it is split over "x" on the columns; out_specs
    P(None, ('y', 'x')) make column block j*|x| + i x's column block i: x |y| times side by side."""
    return jnp.concatenate([x] * MESH_XY[1], axis=1)


def gather_rows_body(x: jax.Array) -> jax.Array:
    return lax.all_gather(x, "y", axis=0, tiled=True)


def gather_rows_repeated_body(x: jax.Array) -> jax.Array:
    """Used with out_specs P(None, ('x', 'y')) against `concat_columns_ref`: each column block repeated."""
    return lax.all_gather(x, "y", axis=0, tiled=True)  # BUG: out_specs P(None, ('x', 'y')) repeat the blocks


# ---------------------------------------------- out_specs naming the axes on other dims than the value
# A value split P("x", "y") returned with out_specs P("y", "x") is not x: device (i, j)'s block lands at
# block (j, i) of a tensor of another shape, [|y| * rows/|x|, |x| * cols/|y|].


def sin_transposed_ref(x: jax.Array) -> jax.Array:
    return jnp.sin(x).T


def sin_transposed_body(x: jax.Array) -> jax.Array:
    """Each block transposed, returned with out_specs P("y", "x"): block (j, i) of the result is the
    transpose of block (i, j), the whole transpose."""
    return jnp.sin(x).T


def sin_reshaped_body(x: jax.Array) -> jax.Array:
    """As above with each block reshaped to the transposed shape instead of transposed."""
    return jnp.sin(x).reshape(x.shape[::-1])  # BUG: a reshape to the transposed shape is not a transpose


def block_grid_swapped_ref(x: jax.Array) -> jax.Array:
    """x [8, 8] split P("x", "y") into [4, 2] blocks, returned with out_specs P("y", "x"): [16, 4]."""
    nx, ny = MESH_XY
    r, c = x.shape[0] // nx, x.shape[1] // ny
    return jnp.cos(x).reshape(nx, r, ny, c).transpose(2, 1, 0, 3).reshape(ny * r, nx * c)


def cos_body(x: jax.Array) -> jax.Array:
    return jnp.cos(x)


def cos_rows_swapped_body(x: jax.Array) -> jax.Array:
    """As `cos_body`, with each block's rows reversed."""
    return jnp.cos(x)[::-1]  # BUG: the rows of each block reversed


# ------------------------------------------------------- a psum over the major axis of a dim split over two


def fold_major_ref(x: jax.Array) -> jax.Array:
    """Rows in blocks over (x, y), x major: summed over x, each y block's rows with the other x half's."""
    nx, _ = MESH_XY
    return x.reshape(nx, -1, *x.shape[1:]).sum(0)


def fold_major_body(x: jax.Array) -> jax.Array:
    return lax.psum(x, "x")


def fold_minor_body(x: jax.Array) -> jax.Array:
    return lax.psum(x, "y")  # BUG: sums over y, the minor axis of the rows' split, where the reference sums x
