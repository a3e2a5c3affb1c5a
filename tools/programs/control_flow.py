"""Control flow inside shard_map: `lax.switch` on an index every device shares, `lax.cond` on a psum'd
predicate (both lower to `stablehlo.case`), hand-parallel over one 8-device axis "x".

Rows of `x` are split over "x". Each branch of the switch is a different reduction of `x` done by hand
(the global sum of squares as a psum of local ones, the global max as a pmax): every device takes the
same branch, so each branch's collectives run on all devices alike. Under GSPMD (Shardy off) the same
shard_map lowers to `SPMDFullToShardShape`/`SPMDShardToFullShape` custom calls around a plain call.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

N = 8
ROWS, COLS = 64, 4


def init(rng: np.random.Generator) -> list[np.ndarray]:
    """The branch index (a step counter: 2, the last branch, which also takes every index past the end)
    and the rows."""
    return [np.asarray(2, dtype=np.int32), rng.standard_normal((ROWS, COLS)).astype(np.float32)]


def switch_specs() -> tuple[tuple[P, P], P]:
    return (P(), P("x", None)), P("x", None)


# ------------------------------------------------------------------------------- lax.switch on an index

def switch_ref(step: jax.Array, x: jax.Array) -> jax.Array:
    def double(v: jax.Array) -> jax.Array:
        return v * 2.0

    def normalise(v: jax.Array) -> jax.Array:
        return v / jnp.sum(v * v)

    def centre(v: jax.Array) -> jax.Array:
        return v - jnp.max(v)

    return lax.switch(step, [double, normalise, centre], x)


def switch_body(step: jax.Array, x: jax.Array) -> jax.Array:
    def double(v: jax.Array) -> jax.Array:
        return v * 2.0

    def normalise(v: jax.Array) -> jax.Array:
        return v / lax.psum(jnp.sum(v * v), "x")

    def centre(v: jax.Array) -> jax.Array:
        return v - lax.pmax(jnp.max(v), "x")

    return lax.switch(step, [double, normalise, centre], x)


def switch_body_pmin(step: jax.Array, x: jax.Array) -> jax.Array:
    def double(v: jax.Array) -> jax.Array:
        return v * 2.0

    def normalise(v: jax.Array) -> jax.Array:
        return v / lax.psum(jnp.sum(v * v), "x")

    def centre(v: jax.Array) -> jax.Array:
        return v - lax.pmin(jnp.max(v), "x")  # BUG: pmin of the local maxima where pmax belongs

    return lax.switch(step, [double, normalise, centre], x)


def switch_body_swapped(step: jax.Array, x: jax.Array) -> jax.Array:
    """The branches of `switch_body` in another order: the same ops and collectives, another program."""
    def double(v: jax.Array) -> jax.Array:
        return v * 2.0

    def normalise(v: jax.Array) -> jax.Array:
        return v / lax.psum(jnp.sum(v * v), "x")

    def centre(v: jax.Array) -> jax.Array:
        return v - lax.pmax(jnp.max(v), "x")

    return lax.switch(step, [double, centre, normalise], x)  # BUG: branches 1 and 2 swapped


SWITCH_VARIANTS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "correct": switch_body, "pmin": switch_body_pmin, "swapped": switch_body_swapped}


# ---------------------------------------------------------------------------- lax.cond on a psum'd sum

def cond_ref(x: jax.Array) -> jax.Array:
    return lax.cond(jnp.sum(x) > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


def cond_body(x: jax.Array) -> jax.Array:
    total = lax.psum(jnp.sum(x), "x")
    return lax.cond(total > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


def cond_body_local(x: jax.Array) -> jax.Array:
    total = jnp.sum(x)  # BUG: the predicate reads the local sum (a psum over "x" is missing)
    return lax.cond(total > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)


COND_VARIANTS: dict[str, Callable[[jax.Array], jax.Array]] = {"correct": cond_body, "local": cond_body_local}
