"""A device's local reduction of its block, used per device; references written by cutting into blocks.

Each pair is a plain jnp reference and a shard_map body (one device's view). In a shard_map body the local
`sum`/`max`/`any` of a device's block is a legitimate per-device value: under the out_specs it stands for
the reference's *blockwise* reduction (reshape into blocks, reduce within each block), not for a partial
sum awaiting a psum. The correct ones must come out `equivalent`; their buggy twins (a ``# BUG:`` line)
`discrepancy`:

- ``lax.cond`` on the sign of the block's sum, per device (the reference: ``jnp.where`` on blockwise sums);
- a psum of a per-block flag (how many blocks hold a value above a threshold);
- a psum over two mesh axes against a reference that cuts the tensor into its blocks along both dims.

The mesh is 8 devices on "x" (or 2 x 4 with axes "x", "y").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

N = 8  # devices on "x"
MESH_XY = (2, 4)  # |x|, |y|


def cond_block_ref(x: jax.Array) -> jax.Array:
    blocks = x.reshape(N, -1, x.shape[1])
    positive = blocks.sum((1, 2), keepdims=True) > 0
    return jnp.where(positive, blocks * 2.0, blocks - 1.0).reshape(x.shape)


def cond_block_body(x: jax.Array) -> jax.Array:
    """Each device branches on its own block's sum (out_specs P("x"))."""
    return lax.cond(jnp.sum(x) > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


def cond_block_summed_body(x: jax.Array) -> jax.Array:
    total = lax.psum(jnp.sum(x), "x")  # BUG: the predicate sums every block where each block decides alone
    return lax.cond(total > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


def count_blocks_ref(x: jax.Array) -> jax.Array:
    return (x.reshape(N, -1).max(1) > 1.0).astype(jnp.float32).sum()


def count_blocks_body(x: jax.Array) -> jax.Array:
    """How many blocks hold a value above 1: a psum of a per-device flag (out_specs P())."""
    return lax.psum((jnp.max(x) > 1.0).astype(jnp.float32), "x")


def count_blocks_pmax_body(x: jax.Array) -> jax.Array:
    return lax.pmax((jnp.max(x) > 1.0).astype(jnp.float32), "x")  # BUG: pmax says whether any block does


def sum_blocks_xy_ref(x: jax.Array) -> jax.Array:
    nx, ny = MESH_XY
    r, c = x.shape[0] // nx, x.shape[1] // ny
    return jnp.tanh(x.reshape(nx, r, ny, c).sum((0, 2)))


def sum_blocks_xy_body(x: jax.Array) -> jax.Array:
    """x split P("x", "y"): the psum over both axes adds the blocks of the grid (out_specs P())."""
    return jnp.tanh(lax.psum(x, ("x", "y")))


def mean_blocks_xy_body(x: jax.Array) -> jax.Array:
    return jnp.tanh(lax.pmean(x, ("x", "y")))  # BUG: pmean divides by the 8 blocks: the reference sums them


# A fori_loop of pmean steps against the reference's unrolled Python loop: the after loop has no reference
# loop to follow, so it is derived iteration by iteration (a static trip count).
def pmean_steps_ref(x: jax.Array) -> jax.Array:
    xs = x.reshape(N, -1, x.shape[1])
    for _ in range(3):
        xs = xs * 0.5 + xs.mean(0)
    return xs.reshape(x.shape)


def pmean_steps_body(x: jax.Array) -> jax.Array:
    return lax.fori_loop(0, 3, lambda _, c: c * 0.5 + lax.pmean(c, "x"), x)


def pmean_steps_four_body(x: jax.Array) -> jax.Array:
    return lax.fori_loop(0, 4, lambda _, c: c * 0.5 + lax.pmean(c, "x"), x)  # BUG: one step more than the reference


# Each device returns its own block's sum (no psum) under out_specs that split over the axis: the output
# is the tensor of block sums, here after a scan that rotates the carried sums.
def block_sums_ref(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return y.reshape(N, -1).sum(1), x.reshape(N, -1).sum(1)


def block_sums_rotated_body(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    def step(c: tuple[jax.Array, jax.Array], _: None) -> tuple[tuple[jax.Array, jax.Array], None]:
        return (c[1], c[0]), None

    (a, b), _ = lax.scan(step, (x.sum(), y.sum()), None, length=3)
    return jnp.expand_dims(a, 0), jnp.expand_dims(b, 0)


def block_maxes_rotated_body(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    def step(c: tuple[jax.Array, jax.Array], _: None) -> tuple[tuple[jax.Array, jax.Array], None]:
        return (c[1], c[0]), None

    (a, b), _ = lax.scan(step, (x.sum(), y.max()), None, length=3)  # BUG: a block max where the reference sums
    return jnp.expand_dims(a, 0), jnp.expand_dims(b, 0)
