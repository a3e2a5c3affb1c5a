"""A 2-stage pipeline (GPipe-style toy): stage s applies ``tanh(h @ w[s])``; microbatches flow 0 -> 1.

``x: [microbatches, batch, d]`` with batch over "dp" (replicated over "pp"), ``w: [stages, d, d]`` split on the
stage dim over "pp": each pipeline device holds its stage's weight. At step t stage 0 takes microbatch t,
stage 1 takes what stage 0 produced at step t - 1, handed over with ``ppermute`` over "pp" (pairs ``(0, 1)``).
After ``microbatches + 1`` steps (unrolled Python loop) the last stage's outputs are broadcast over "pp" by a
masked psum.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


def stage(h: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.tanh(h @ w)


def reference(x: jax.Array, w: jax.Array) -> jax.Array:
    h = x
    for s in range(w.shape[0]):
        h = stage(h, w[s])
    return h


def specs(dp: str = "dp", pp: str = "pp") -> tuple[tuple[P, P], P]:
    return (P(None, dp, None), P(pp, None, None)), P(None, dp, None)


def init(microbatches: int, batch: int, d: int, stages: int, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((microbatches, batch, d)).astype(np.float32)
    w = (1.5 * rng.standard_normal((stages, d, d)) / np.sqrt(d)).astype(np.float32)
    return [x, w]


def _run(x: jax.Array, w: jax.Array, send: Callable[[jax.Array], jax.Array]) -> jax.Array:
    me = jax.lax.axis_index("pp")
    last = jax.lax.axis_size("pp") - 1
    carry = jnp.zeros_like(x[0])  # what this stage received from the previous one
    outs = []
    for t in range(x.shape[0] + 1):
        inp = jnp.where(me == 0, x[min(t, x.shape[0] - 1)], carry)
        out = stage(inp, w[0])
        if t >= 1:
            outs.append(out)  # on the last stage: microbatch t - 1
        if t < x.shape[0]:
            carry = send(out)
    y = jnp.stack(outs)
    return jax.lax.psum(jnp.where(me == last, y, 0.0), "pp")


def _pipeline(x: jax.Array, w: jax.Array) -> jax.Array:
    def send(h: jax.Array) -> jax.Array:
        return jax.lax.ppermute(h, "pp", [(0, 1)])

    return _run(x, w, send)


def _pipeline_wrong_pairs(x: jax.Array, w: jax.Array) -> jax.Array:
    def send(h: jax.Array) -> jax.Array:
        return jax.lax.ppermute(h, "pp", [(1, 0)])  # BUG: stage outputs sent backwards (1 -> 0), stage 1 gets zeros

    return _run(x, w, send)


VARIANTS: dict[str, Callable[..., jax.Array]] = {"correct": _pipeline, "wrong_pairs": _pipeline_wrong_pairs}


def shard_map_pipeline(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(VARIANTS[variant], mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
