"""Megatron-style tensor-parallel MLP ``relu(x @ w1) @ w2``.

w1 is column-parallel ``P(None, "tp")``, w2 row-parallel ``P("tp", None)``, x batch-sharded ``P("dp", None)``.
``mlp`` is the single-device reference (also what jit + shardings partitions); ``shard_map_mlp(mesh, variant)``
builds the hand-parallel version, correct or with one of three classic collective bugs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import numpy as np
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    batch: int = 8
    d_model: int = 16
    d_ff: int = 32


TINY = MLPConfig()


def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    return h @ w2


def specs(dp: str = "dp", tp: str = "tp") -> tuple[tuple[P, P, P], P]:
    """(in_specs, out_spec) for (x, w1, w2) -> y."""
    return (P(dp, None), P(None, tp), P(tp, None)), P(dp, None)


def init(cfg: MLPConfig, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((cfg.batch, cfg.d_model)).astype(np.float32)
    w1 = (rng.standard_normal((cfg.d_model, cfg.d_ff)) / np.sqrt(cfg.d_model)).astype(np.float32)
    w2 = (rng.standard_normal((cfg.d_ff, cfg.d_model)) / np.sqrt(cfg.d_ff)).astype(np.float32)
    return [x, w1, w2]


# ------------------------------------------------------------------ shard_map bodies (one device's view)


def _local_mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    return jax.lax.psum(h @ w2, "tp")


def _local_mlp_missing_psum(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    return h @ w2  # BUG: missing psum over "tp": the row-parallel matmul leaves partial sums


def _local_mlp_psum_wrong_axis(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    return jax.lax.psum(h @ w2, "dp")  # BUG: psum over "dp" where the partial sums live on "tp"


def _local_mlp_pmean(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ w1)
    return jax.lax.pmean(h @ w2, "tp")  # BUG: pmean where psum belongs (result scaled by 1/|tp|)


VARIANTS: dict[str, Callable[..., jax.Array]] = {
    "correct": _local_mlp,
    "missing_psum": _local_mlp_missing_psum,
    "psum_wrong_axis": _local_mlp_psum_wrong_axis,
    "pmean": _local_mlp_pmean,
}


def shard_map_mlp(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)


def mlp_bf16(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    """The MLP computed in bfloat16 from float32 inputs (the result widened to float32)."""
    bf16 = jax.numpy.bfloat16
    return mlp(x.astype(bf16), w1.astype(bf16), w2.astype(bf16)).astype(jax.numpy.float32)
