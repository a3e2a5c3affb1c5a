"""RoPE under sequence parallelism: ``x: [batch, seq, heads, head_dim]`` with seq sharded over "sp".

Each device holds seq positions ``[i * s_local, (i + 1) * s_local)`` for its index i on "sp": the rotary
positions must include that shard offset.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from programs.llama import rope

THETA = 10000.0


def reference(x: jax.Array) -> jax.Array:
    positions = jnp.arange(x.shape[1])
    return rope(x, positions, THETA)


def specs(dp: str = "dp", sp: str = "sp") -> tuple[tuple[P], P]:
    return (P(dp, sp, None, None),), P(dp, sp, None, None)


def init(batch: int, seq: int, heads: int, head_dim: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((batch, seq, heads, head_dim)).astype(np.float32)]


def _local_rope(x: jax.Array) -> jax.Array:
    s_local = x.shape[1]
    positions = jnp.arange(s_local) + jax.lax.axis_index("sp") * s_local
    return rope(x, positions, THETA)


def _local_rope_no_offset(x: jax.Array) -> jax.Array:
    positions = jnp.arange(x.shape[1])  # BUG: positions without the shard offset axis_index("sp") * s_local
    return rope(x, positions, THETA)


VARIANTS = {"correct": _local_rope, "no_offset": _local_rope_no_offset}


def shard_map_rope(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
