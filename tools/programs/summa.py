"""SUMMA on a 2 x 4 grid written with shard_map: `a @ b` with both operands split in blocks over (dp, tp).

Step k broadcasts the k-th column panel of `a` along tp and the k-th row panel of `b` along dp, each as a
psum of a value kept on the owner and zeroed elsewhere (`where(axis_index == owner, panel, 0)`, a scalar
predicate), and accumulates the product of the panels. The twin takes the row panels of `b` from the
wrong owner.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

PANELS = 4  # panels of 8 along K = 32: 2 per row block of b (dp), 1 per column block of a (tp)


def reference(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def _panels(a: jax.Array, b: jax.Array, panel_of: Callable[[int], tuple[int, int]]) -> jax.Array:
    """The SUMMA loop; `panel_of(k)` is the (dp owner, half) of b's k-th row panel."""
    row, col = lax.axis_index("dp"), lax.axis_index("tp")
    width = b.shape[0] // 2
    out = jnp.zeros((a.shape[0], b.shape[1]), a.dtype)
    for k in range(PANELS):
        a_k = lax.psum(jnp.where(col == k, a, 0.0), "tp")
        owner, half = panel_of(k)
        b_k = lax.psum(jnp.where(row == owner, b[half * width:(half + 1) * width], 0.0), "dp")
        out = out + a_k @ b_k
    return out


def _summa(a: jax.Array, b: jax.Array) -> jax.Array:
    return _panels(a, b, lambda k: (k // 2, k % 2))


def _summa_wrong_owner(a: jax.Array, b: jax.Array) -> jax.Array:
    return _panels(a, b, lambda k: (k % 2, k // 2))  # BUG: the owner and half of b's row panel swapped


VARIANTS: dict[str, Callable[..., jax.Array]] = {"correct": _summa, "wrong_owner": _summa_wrong_owner}


def specs() -> tuple[list[P], P]:
    return [P("dp", "tp"), P("dp", "tp")], P("dp", "tp")


def shard_map_summa(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec, check_vma=False)


def init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((16, 32)).astype(np.float32), rng.standard_normal((32, 16)).astype(np.float32)]
