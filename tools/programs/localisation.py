"""Bugs the term frontier once named at the wrong line: each is where the values first part ways, while the
prover followed the program only further down (a body derived device by device, a loop) or stopped early.

- a mask's constant changed (`% 3 == 1` for `== 0`): once named at the multiply using the masked value;
- a comparison flipped (`<` for `>`) before a gather over the mesh: once named at the all_gather;
- a scale inside a `fori_loop` body changed: once named at the add after the loop.

Found by the differential fuzzer (tools/fuzz.py, seed 31), written down as shard_map bodies over a mesh
("dp", "tp") of 2 x 4 devices. The bug lines carry ``# BUG:``; each has a correct body beside it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

MESH = (("dp", 2), ("tp", 4))

# ---------------------------------------------------------------------- a mask's constant

MASK_SHAPE = (8, 2)
MASK_SPECS = (P("tp", "dp"), P("tp", "dp")), P("tp", "dp")


def mask_ref(x: jax.Array, y: jax.Array) -> jax.Array:
    v = (x > 0.25).astype(jnp.int32) + 1
    v = jnp.where(lax.broadcasted_iota(jnp.int32, MASK_SHAPE, 1) % 3 == 0, v, -1)
    v = v * y
    return jnp.where(lax.broadcasted_iota(jnp.int32, MASK_SHAPE, 0) % 2 == 0, v, -1)


def _cols() -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, (2, 1), 1) + lax.axis_index("dp")


def _rows() -> jax.Array:
    return lax.broadcasted_iota(jnp.int32, (2, 1), 0) + lax.axis_index("tp") * 2


def mask_body(x: jax.Array, y: jax.Array) -> jax.Array:
    v = (x > 0.25).astype(jnp.int32) + 1
    v = jnp.where(_cols() % 3 == 0, v, -1)
    v = v * y
    return jnp.where(_rows() % 2 == 0, v, -1)


def mask_body_bug(x: jax.Array, y: jax.Array) -> jax.Array:
    v = (x > 0.25).astype(jnp.int32) + 1
    v = jnp.where(_cols() % 3 == 1, v, -1)  # BUG: the mask keeps column 1 where the reference keeps column 0
    v = v * y
    return jnp.where(_rows() % 2 == 0, v, -1)


# ---------------------------------------------------------------------- a comparison flipped

GATHER_SPECS = (P(None, "tp"), P(None, "tp")), P("dp", "tp")


def compare_ref(x: jax.Array, w: jax.Array) -> jax.Array:
    return (x > 0.5).astype(jnp.int32) @ w


def _gathered(hit: jax.Array) -> jax.Array:
    """This device's rows (by its "dp" index) of the whole `hit`, gathered over "tp"."""
    rows = lax.dynamic_slice_in_dim(hit, lax.axis_index("dp") * 2, 2, axis=0)
    return lax.all_gather(rows, "tp", axis=1, tiled=True)


def compare_body(x: jax.Array, w: jax.Array) -> jax.Array:
    hit = (x > 0.5).astype(jnp.int32)
    return _gathered(hit) @ w


def compare_body_bug(x: jax.Array, w: jax.Array) -> jax.Array:
    hit = (x < 0.5).astype(jnp.int32)  # BUG: `<` where the reference compares with `>`
    return _gathered(hit) @ w


# ---------------------------------------------------------------------- a scale in a loop body

LOOP_SPECS = (P(None, "tp"), P("tp")), P(None, "tp")


def loop_ref(x: jax.Array, b: jax.Array) -> jax.Array:
    y = lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * 0.5 + x, x)
    return y + b[None, :] + lax.broadcasted_iota(jnp.int32, x.shape, 1).astype(jnp.float32) * 3.0


def _offsets(shape: tuple[int, ...]) -> jax.Array:
    """This device's column indices (its block of an iota over "tp"), times 3."""
    return (lax.broadcasted_iota(jnp.int32, shape, 1) + lax.axis_index("tp") * shape[1]).astype(jnp.float32) * 3.0


def loop_body(x: jax.Array, b: jax.Array) -> jax.Array:
    y = lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * 0.5 + x, x)
    return y + b[None, :] + _offsets(x.shape)


def loop_body_bug(x: jax.Array, b: jax.Array) -> jax.Array:
    y = lax.fori_loop(0, 3, lambda i, c: jnp.tanh(c) * 0.25 + x, x)  # BUG: the carry is scaled by 0.25, not 0.5
    return y + b[None, :] + _offsets(x.shape)
