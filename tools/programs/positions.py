"""Sinusoidal positions of a sequence split over two mesh axes in the order other than the mesh's.

`P(("tp", "dp"))` on a (dp, tp) mesh gives device (dp, tp) the block `tp * |dp| + dp`; a shard_map body
computes its positions from that index. The twin computes the index in the mesh's order, `dp * |tp| + tp`:
each device adds the positions of another block.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P


def sinusoid(pos: jax.Array, d: int) -> jax.Array:
    freq = 1.0 / (10000.0 ** (jnp.arange(d // 2) / (d // 2)))
    angle = pos[:, None].astype(jnp.float32) * freq[None, :]
    return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], -1)


def reference(x: jax.Array) -> jax.Array:
    return x + sinusoid(jnp.arange(x.shape[0]), x.shape[1])


def _tp_major(x: jax.Array) -> jax.Array:
    block = lax.axis_index("tp") * lax.axis_size("dp") + lax.axis_index("dp")
    return x + sinusoid(block * x.shape[0] + jnp.arange(x.shape[0]), x.shape[1])


def _mesh_order(x: jax.Array) -> jax.Array:
    n = x.shape[0]
    return x + sinusoid((lax.axis_index("dp") * lax.axis_size("tp") + lax.axis_index("tp")) * n + jnp.arange(n), x.shape[1])  # BUG: the block index in the mesh's order, not the spec's


VARIANTS: dict[str, Callable[..., jax.Array]] = {"correct": _tp_major, "mesh_order": _mesh_order}


def specs() -> tuple[list[P], P]:
    return [P(("tp", "dp"))], P(("tp", "dp"))


def shard_map_positions(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec, check_vma=False)


def init(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((32, 16)).astype(np.float32)]
