"""Linear algebra and random bits (issue 14, every op JAX emits): Cholesky solves and rbg dropout.

- A batch of small SPD systems (a Gaussian-process or whitening step): `S = X X^T + n I`, its Cholesky
  factor `L` (`jnp.linalg.cholesky`), then `L^{-1} B` (`jax.scipy.linalg.solve_triangular`). On CPU JAX
  lowers both to LAPACK custom calls (`lapack_spotrf_ffi`, `lapack_strsm_ffi`); with the batch split over
  "x" every device factors and solves its own matrices. The buggy twin solves with the wrong triangle.
- Dropout with the `rbg` PRNG (`jax.random.bernoulli` on a key whose data is passed in, replicated):
  `stablehlo.rng_bit_generator` draws the mask. XLA's partitioner draws the whole global mask on every
  device and slices each device's rows; a shard_map body can do the same by hand. The buggy twin draws a
  mask of the local shape on every device: every device gets the same mask, not its rows of the global one.

The mesh is 8 devices on "x".
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.scipy.linalg import solve_triangular

N = 8
KEEP = 0.75


# ------------------------------------------------------------------------------------- Cholesky solves


def chol_solve_ref(x: jax.Array, b: jax.Array) -> jax.Array:
    """x: [batch, n, k], b: [batch, n, m] -> L^{-1} b with L L^T = x x^T + n I."""
    n = x.shape[-2]
    s = x @ jnp.swapaxes(x, -1, -2) + n * jnp.eye(n, dtype=x.dtype)
    factor = jnp.linalg.cholesky(s)
    return solve_triangular(factor, b, lower=True)


def chol_solve_body(x: jax.Array, b: jax.Array) -> jax.Array:
    """Batch split over "x": each device's matrices are whole, so the reference runs shard by shard."""
    n = x.shape[-2]
    s = x @ jnp.swapaxes(x, -1, -2) + n * jnp.eye(n, dtype=x.dtype)
    factor = jnp.linalg.cholesky(s)
    return solve_triangular(factor, b, lower=True)


def chol_solve_upper_body(x: jax.Array, b: jax.Array) -> jax.Array:
    n = x.shape[-2]
    s = x @ jnp.swapaxes(x, -1, -2) + n * jnp.eye(n, dtype=x.dtype)
    factor = jnp.linalg.cholesky(s)
    return solve_triangular(factor, b, lower=False)  # BUG: reads the upper triangle of a lower factor


# ------------------------------------------------------------------------------------------ rbg dropout


def _key(k: jax.Array) -> jax.Array:
    return jax.random.wrap_key_data(k, impl="rbg")


def dropout_ref(k: jax.Array, x: jax.Array) -> jax.Array:
    """k: uint32[4], the rbg key's data; x: [rows, cols]."""
    keep = jax.random.bernoulli(_key(k), KEEP, x.shape)
    return jnp.where(keep, x / KEEP, 0.0)


def dropout_body(k: jax.Array, x: jax.Array) -> jax.Array:
    """Rows split over "x", the key replicated: draw the global mask, keep this device's rows of it."""
    rows = x.shape[0]
    keep = jax.random.bernoulli(_key(k), KEEP, (rows * N, x.shape[1]))
    keep = lax.dynamic_slice_in_dim(keep, lax.axis_index("x") * rows, rows)
    return jnp.where(keep, x / KEEP, 0.0)


def dropout_local_mask_body(k: jax.Array, x: jax.Array) -> jax.Array:
    keep = jax.random.bernoulli(_key(k), KEEP, x.shape)  # BUG: the same local mask on every device
    return jnp.where(keep, x / KEEP, 0.0)


# ------------------------------------------------------------------------------------------- LU solves
# `jnp.linalg.solve` of a batch of general systems: on CPU an LU factorisation with partial pivoting
# (`lapack_sgetrf_ffi`), the pivots turned into a permutation, then two triangular solves.


def lu_solve_ref(a: jax.Array, b: jax.Array) -> jax.Array:
    """a: [batch, n, n] (diagonally dominant), b: [batch, n, m] -> a^{-1} b."""
    return jnp.linalg.solve(a, b)


def lu_solve_body(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.linalg.solve(a, b)


def lu_solve_transposed_body(a: jax.Array, b: jax.Array) -> jax.Array:
    return jnp.linalg.solve(jnp.swapaxes(a, -1, -2), b)  # BUG: solves a^T x = b
