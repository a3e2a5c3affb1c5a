"""Training steps: ``jax.value_and_grad`` of a loss of a small MLP, then an optimizer update in jax.numpy.

Model: ``mlp(params, x) = tanh(x @ w1 + b1) @ w2``. Losses: mean squared error against ``y`` (SGD steps) and
softmax cross-entropy against int32 labels (the Adam step). Every step returns ``(loss, new params[, new opt
state])``.

Single-device references (also what jit + shardings partitions, FSDPxTP): ``sgd_step``, ``adam_step``,
``clip_sgd_step`` (SGD with global-norm gradient clipping).

Hand-written shard_map versions (mesh ``dp x tp``, the batch split over "dp", "tp" unused):
- data parallel (params replicated): each device's loss is the sum of its per-example losses divided by the
  *global* batch; the gradient of the global mean is then the psum over "dp" of the local gradients
  (``DP_VARIANTS``: correct and four classic bugs);
- FSDP with clipping (params split on dim 0 over "dp"): all_gather the params, local value_and_grad,
  psum_scatter the gradients back to shards, global norm = sqrt(psum over "dp" of the shards' squared norms)
  (``CLIP_VARIANTS``: correct, and the norm of the local shard only).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    batch: int = 16
    d_in: int = 8
    d_hidden: int = 16
    d_out: int = 4
    lr: float = 0.1
    b1: float = 0.9
    b2: float = 0.99
    eps: float = 1e-8
    max_norm: float = 1.0  # clipping is active: the global norm (~4.7) and each shard's norm exceed it


TINY = TrainConfig()


# ---------------------------------------------------------------------------------------------- model


def mlp(params: Params, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"]


def mse_per_example(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    err = mlp(params, x) - y
    return jnp.sum(err * err, axis=-1)


def xent_per_example(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    logits = mlp(params, x)
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
    return logz - picked


def mse_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(mse_per_example(params, x, y))


def xent_loss(params: Params, x: jax.Array, labels: jax.Array) -> jax.Array:
    return jnp.mean(xent_per_example(params, x, labels))


# ------------------------------------------------------------------------------------------ optimizers


def sgd_update(params: Params, grads: Params, lr: float) -> Params:
    return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def adam_update(params: Params, grads: Params, state: Params, cfg: TrainConfig) -> tuple[Params, Params]:
    """Adam with bias correction; ``state = {"count": int32[], "m": params-like, "v": params-like}``."""
    count = state["count"] + 1
    t = count.astype(jnp.float32)
    m = jax.tree.map(lambda m, g: cfg.b1 * m + (1.0 - cfg.b1) * g, state["m"], grads)
    v = jax.tree.map(lambda v, g: cfg.b2 * v + (1.0 - cfg.b2) * g * g, state["v"], grads)
    m_corr = 1.0 / (1.0 - cfg.b1**t)
    v_corr = 1.0 / (1.0 - cfg.b2**t)
    new = jax.tree.map(lambda p, m, v: p - cfg.lr * (m * m_corr) / (jnp.sqrt(v * v_corr) + cfg.eps), params, m, v)
    return new, {"count": count, "m": m, "v": v}


def global_norm(tree: Params) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(tree)))


def clip_scale(norm: jax.Array, max_norm: float) -> jax.Array:
    return jnp.minimum(1.0, max_norm / norm)


# ------------------------------------------------------------------------------------- reference steps


def sgd_step(params: Params, x: jax.Array, y: jax.Array, cfg: TrainConfig = TINY) -> tuple[jax.Array, Params]:
    loss, grads = jax.value_and_grad(mse_loss)(params, x, y)
    return loss, sgd_update(params, grads, cfg.lr)


def adam_step(params: Params, state: Params, x: jax.Array, labels: jax.Array,
              cfg: TrainConfig = TINY) -> tuple[jax.Array, Params, Params]:
    loss, grads = jax.value_and_grad(xent_loss)(params, x, labels)
    new_params, new_state = adam_update(params, grads, state, cfg)
    return loss, new_params, new_state


def clip_sgd_step(params: Params, x: jax.Array, y: jax.Array, cfg: TrainConfig = TINY) -> tuple[jax.Array, Params]:
    loss, grads = jax.value_and_grad(mse_loss)(params, x, y)
    scale = clip_scale(global_norm(grads), cfg.max_norm)
    return loss, sgd_update(params, jax.tree.map(lambda g: g * scale, grads), cfg.lr)


# ------------------------------------------------------------------------------------- init and specs


def init_params(cfg: TrainConfig, rng: np.random.Generator) -> Params:
    return {
        "w1": (rng.standard_normal((cfg.d_in, cfg.d_hidden)) / np.sqrt(cfg.d_in)).astype(np.float32),
        "b1": (0.1 * rng.standard_normal((cfg.d_hidden,))).astype(np.float32),
        "w2": (rng.standard_normal((cfg.d_hidden, cfg.d_out)) / np.sqrt(cfg.d_hidden)).astype(np.float32),
    }


def init_regression(cfg: TrainConfig, rng: np.random.Generator) -> list[Any]:
    """[params, x, y] for the MSE steps."""
    params = init_params(cfg, rng)
    x = rng.standard_normal((cfg.batch, cfg.d_in)).astype(np.float32)
    y = rng.standard_normal((cfg.batch, cfg.d_out)).astype(np.float32)
    return [params, x, y]


def init_classification_adam(cfg: TrainConfig, rng: np.random.Generator) -> list[Any]:
    """[params, adam state (count 3, non-zero moments), x, int32 labels] for the Adam step."""
    params = init_params(cfg, rng)
    state = {
        "count": np.asarray(3, np.int32),
        "m": {k: (0.01 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in params.items()},
        "v": {k: (1e-4 * rng.standard_normal(v.shape) ** 2).astype(np.float32) for k, v in params.items()},
    }
    x = rng.standard_normal((cfg.batch, cfg.d_in)).astype(np.float32)
    labels = rng.integers(0, cfg.d_out, size=(cfg.batch,)).astype(np.int32)
    return [params, state, x, labels]


def fsdp_tp_param_specs(fsdp: str = "fsdp", tp: str = "tp") -> Params:
    """GSPMD/Shardy specs: w1 column-parallel over tp, w2 row-parallel over tp, the other dim over fsdp."""
    return {"w1": P(fsdp, tp), "b1": P(tp), "w2": P(tp, fsdp)}


def sgd_specs(fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """(in_specs, out_specs) of ``sgd_step`` partitioned FSDPxTP; the batch over fsdp."""
    ps = fsdp_tp_param_specs(fsdp, tp)
    return [ps, P(fsdp, None), P(fsdp, None)], (P(), ps)


def adam_specs(fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    ps = fsdp_tp_param_specs(fsdp, tp)
    state = {"count": P(), "m": ps, "v": ps}
    return [ps, state, P(fsdp, None), P(fsdp)], (P(), ps, state)


# ---------------------------------------------------------------- shard_map: data parallel (params replicated)


def _local_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """This shard's share of the global mean: sum of its per-example losses over the *global* batch."""
    global_batch = x.shape[0] * jax.lax.axis_size("dp")
    return jnp.sum(mse_per_example(params, x, y)) / global_batch


def _dp_sgd(params: Params, x: jax.Array, y: jax.Array, *, lr: float) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)
    grads = jax.lax.psum(g, "dp")
    return jax.lax.psum(loss, "dp"), sgd_update(params, grads, lr)


def _dp_sgd_no_grad_psum(params: Params, x: jax.Array, y: jax.Array, *, lr: float) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)  # BUG: local gradients, applied without a psum over "dp"
    return jax.lax.psum(loss, "dp"), sgd_update(params, g, lr)


def _dp_sgd_grad_psum_wrong_axis(params: Params, x: jax.Array, y: jax.Array, *,
                                 lr: float) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)
    grads = jax.lax.psum(g, "tp")  # BUG: gradient psum over "tp" where the batch is split over "dp"
    return jax.lax.psum(loss, "dp"), sgd_update(params, grads, lr)


def _dp_sgd_grad_averaged_twice(params: Params, x: jax.Array, y: jax.Array, *,
                                lr: float) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)
    grads = jax.lax.pmean(g, "dp")  # BUG: pmean, but the loss is already divided by the global batch
    return jax.lax.psum(loss, "dp"), sgd_update(params, grads, lr)


def _local_loss_local_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(mse_per_example(params, x, y))  # BUG: divides by the local batch, not the global one


def _dp_sgd_loss_local_batch(params: Params, x: jax.Array, y: jax.Array, *,
                             lr: float) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(_local_loss_local_batch)(params, x, y)
    grads = jax.lax.psum(g, "dp")
    return jax.lax.psum(loss, "dp"), sgd_update(params, grads, lr)


DP_VARIANTS: dict[str, Callable[..., Any]] = {
    "correct": _dp_sgd,
    "no_grad_psum": _dp_sgd_no_grad_psum,
    "grad_psum_wrong_axis": _dp_sgd_grad_psum_wrong_axis,
    "grad_averaged_twice": _dp_sgd_grad_averaged_twice,
    "loss_local_batch": _dp_sgd_loss_local_batch,
}
# the function holding each buggy variant's marker line (the step itself, or the loss it differentiates)
DP_BUG_SITES: dict[str, Callable[..., Any]] = {
    "no_grad_psum": _dp_sgd_no_grad_psum,
    "grad_psum_wrong_axis": _dp_sgd_grad_psum_wrong_axis,
    "grad_averaged_twice": _dp_sgd_grad_averaged_twice,
    "loss_local_batch": _local_loss_local_batch,
}


def dp_specs(dp: str = "dp") -> tuple[list[Any], Any]:
    """shard_map / reference specs of the DP step: params replicated, batch over dp."""
    ps = {"w1": P(), "b1": P(), "w2": P()}
    return [ps, P(dp, None), P(dp, None)], (P(), ps)


def shard_map_dp_sgd(mesh: jax.sharding.Mesh, variant: str = "correct",
                     cfg: TrainConfig = TINY) -> Callable[..., Any]:
    body = DP_VARIANTS[variant]

    def local(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
        return body(params, x, y, lr=cfg.lr)

    in_specs, out_specs = dp_specs()
    return jax.shard_map(local, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs, check_vma=False)


# ---------------------------------------------------------------- shard_map: FSDP with global-norm clipping


def _fsdp_grads(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
    """all_gather the dim-0 param shards, local value_and_grad, psum_scatter the gradients back to shards."""
    full = jax.tree.map(lambda p: jax.lax.all_gather(p, "dp", axis=0, tiled=True), params)
    loss, g = jax.value_and_grad(_local_loss)(full, x, y)
    g = jax.tree.map(lambda t: jax.lax.psum_scatter(t, "dp", scatter_dimension=0, tiled=True), g)
    return jax.lax.psum(loss, "dp"), g


def _fsdp_clip_sgd(params: Params, x: jax.Array, y: jax.Array, *, cfg: TrainConfig) -> tuple[jax.Array, Params]:
    loss, g = _fsdp_grads(params, x, y)
    sq = sum(jnp.sum(t * t) for t in jax.tree.leaves(g))
    norm = jnp.sqrt(jax.lax.psum(sq, "dp"))
    scale = clip_scale(norm, cfg.max_norm)
    return loss, sgd_update(params, jax.tree.map(lambda t: t * scale, g), cfg.lr)


def _fsdp_clip_sgd_local_norm(params: Params, x: jax.Array, y: jax.Array, *,
                              cfg: TrainConfig) -> tuple[jax.Array, Params]:
    loss, g = _fsdp_grads(params, x, y)
    sq = sum(jnp.sum(t * t) for t in jax.tree.leaves(g))  # BUG: this device's gradient shard only (needs psum over "dp")
    norm = jnp.sqrt(sq)
    scale = clip_scale(norm, cfg.max_norm)
    return loss, sgd_update(params, jax.tree.map(lambda t: t * scale, g), cfg.lr)


CLIP_VARIANTS: dict[str, Callable[..., Any]] = {"correct": _fsdp_clip_sgd, "local_norm": _fsdp_clip_sgd_local_norm}


def fsdp_specs(dp: str = "dp") -> tuple[list[Any], Any]:
    """params split on dim 0 over dp (b1 too), batch over dp."""
    ps = {"w1": P(dp, None), "b1": P(dp), "w2": P(dp, None)}
    return [ps, P(dp, None), P(dp, None)], (P(), ps)


def shard_map_clip_sgd(mesh: jax.sharding.Mesh, variant: str = "correct",
                       cfg: TrainConfig = TINY) -> Callable[..., Any]:
    body = CLIP_VARIANTS[variant]

    def local(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
        return body(params, x, y, cfg=cfg)

    in_specs, out_specs = fsdp_specs()
    return jax.shard_map(local, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs, check_vma=False)
