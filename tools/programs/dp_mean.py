"""Data-parallel training steps as the textbook writes them: each device differentiates the *mean* loss of its
own batch shard, and the gradients (and the loss) are averaged over the data axis with ``pmean``.

With equal shard sizes the mean of the shards' means is the global mean, so ``pmean(grad(local mean))`` is
the gradient of the global mean loss (the reference: ``train.sgd_step``, and an optax AdamW step).

Model and loss: ``train.mlp`` and ``train.mse_loss`` (params replicated, the batch split over "dp" of a
``dp x tp`` mesh, "tp" unused). Steps:
- SGD (``SGD_VARIANTS``): correct; pmean'd over the wrong axis ("tp"); psum'd where pmean belongs (below);
- optax AdamW (``ADAMW_VARIANTS``): correct (the update takes sqrt of the second moment of the averaged
  gradient); and the local gradients fed to the optimizer without the pmean.
(psum of the shards' mean gradients, |dp| times too large, is `train.DP_VARIANTS["loss_local_batch"]`.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from programs import train

Params = dict[str, Any]
OPTIMIZER = optax.adamw(learning_rate=1e-2, weight_decay=0.1)


# ------------------------------------------------------------------------------------- reference steps


def sgd_step(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
    return train.sgd_step(params, x, y)


def adamw_step(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, grads = jax.value_and_grad(train.mse_loss)(params, x, y)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def init_adamw(rng: np.random.Generator) -> list[Any]:
    """[params, AdamW state after one step's worth of moments, x, y]: non-zero moments, count 2."""
    params, x, y = train.init_regression(train.TINY, rng)
    state = OPTIMIZER.init(params)
    _, grads = jax.value_and_grad(train.mse_loss)(params, x, y)
    _, state = OPTIMIZER.update(grads, state, params)
    _, state = OPTIMIZER.update(grads, state, params)
    return [params, jax.tree.map(np.asarray, state), x, y]


# ---------------------------------------------------------------- shard_map: the local mean, then pmean


def _sgd(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(train.mse_loss)(params, x, y)
    grads = jax.lax.pmean(g, "dp")
    return jax.lax.pmean(loss, "dp"), train.sgd_update(params, grads, train.TINY.lr)


def _sgd_pmean_wrong_axis(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
    loss, g = jax.value_and_grad(train.mse_loss)(params, x, y)
    grads = jax.lax.pmean(g, "tp")  # BUG: pmean over "tp" (params replicated there) where the batch is split over "dp"
    return jax.lax.pmean(loss, "dp"), train.sgd_update(params, grads, train.TINY.lr)


def _adamw(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(train.mse_loss)(params, x, y)
    grads = jax.lax.pmean(g, "dp")
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return jax.lax.pmean(loss, "dp"), optax.apply_updates(params, updates), opt_state


def _adamw_local_grads(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(train.mse_loss)(params, x, y)  # BUG: this shard's gradients, never pmean'd over "dp"
    updates, opt_state = OPTIMIZER.update(g, opt_state, params)
    return jax.lax.pmean(loss, "dp"), optax.apply_updates(params, updates), opt_state


def _sgd_psum_not_pmean(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params]:
    """A scaling bug: the factor |dp| enters at the collective. (Written after the other variants, so their
    marked lines stay where their fixtures say.)"""
    loss, g = jax.value_and_grad(train.mse_loss)(params, x, y)
    grads = jax.lax.psum(g, "dp")  # BUG: psum of the shards' mean gradients where pmean belongs (|dp| times too large)
    return jax.lax.pmean(loss, "dp"), train.sgd_update(params, grads, train.TINY.lr)


SGD_VARIANTS: dict[str, Callable[..., Any]] = {"correct": _sgd, "pmean_wrong_axis": _sgd_pmean_wrong_axis,
                                                  "psum_not_pmean": _sgd_psum_not_pmean}
ADAMW_VARIANTS: dict[str, Callable[..., Any]] = {"correct": _adamw, "local_grads": _adamw_local_grads}


def sgd_specs(dp: str = "dp") -> tuple[list[Any], Any]:
    """Params replicated, batch over dp."""
    ps = {"w1": P(), "b1": P(), "w2": P()}
    return [ps, P(dp, None), P(dp, None)], (P(), ps)


def adamw_specs(opt_state: Any, dp: str = "dp") -> tuple[list[Any], Any]:
    """Params and optimizer state replicated, batch over dp."""
    ps = {"w1": P(), "b1": P(), "w2": P()}
    state = jax.tree.map(lambda _: P(), opt_state)
    return [ps, state, P(dp, None), P(dp, None)], (P(), ps, state)


def shard_map_sgd(mesh: jax.sharding.Mesh, variant: str = "correct") -> Callable[..., Any]:
    in_specs, out_specs = sgd_specs()
    return jax.shard_map(SGD_VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                         check_vma=False)


def shard_map_adamw(mesh: jax.sharding.Mesh, opt_state: Any, variant: str = "correct") -> Callable[..., Any]:
    in_specs, out_specs = adamw_specs(opt_state)
    return jax.shard_map(ADAMW_VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                         check_vma=False)


# ------------------------------------------------- a relu MLP with optax Adam, lowered as a user lowers it
# relu's gradient is a select keeping the cotangent where the pre-activation is positive and 0 elsewhere: the
# mean's 1/n sits inside it as a constant (1/|local batch| on each device, 1/|batch| in the reference), so a
# pmean meets the reference only through the select. Adam's `count` is a scalar: `jax.jit(shard_map(...))`
# lowered from unsharded inputs lays it out on JAX's `@empty_mesh`, beside the mesh of the body.
ADAM = optax.adam(learning_rate=1e-2)


def relu_mse_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    err = h @ params["w2"] - y
    return jax.numpy.mean(jax.numpy.sum(err * err, axis=-1))


def relu_adam_step(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, grads = jax.value_and_grad(relu_mse_loss)(params, x, y)
    updates, opt_state = ADAM.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def _relu_adam(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(relu_mse_loss)(params, x, y)
    grads = jax.lax.pmean(g, "dp")
    updates, opt_state = ADAM.update(grads, opt_state, params)
    return jax.lax.pmean(loss, "dp"), optax.apply_updates(params, updates), opt_state


def _relu_adam_psum(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(relu_mse_loss)(params, x, y)
    grads = jax.lax.psum(g, "dp")  # BUG: psum of the shards' mean gradients where pmean belongs
    updates, opt_state = ADAM.update(grads, opt_state, params)
    return jax.lax.pmean(loss, "dp"), optax.apply_updates(params, updates), opt_state


RELU_ADAM_VARIANTS: dict[str, Callable[..., Any]] = {"correct": _relu_adam, "psum_not_pmean": _relu_adam_psum}


def init_relu_adam(rng: np.random.Generator) -> list[Any]:
    """[params, Adam state after two updates (count 2), x, y]."""
    params, x, y = train.init_regression(train.TINY, rng)
    state = ADAM.init(params)
    for _ in range(2):
        _, grads = jax.value_and_grad(relu_mse_loss)(params, x, y)
        _, state = ADAM.update(grads, state, params)
    return [params, jax.tree.map(np.asarray, state), x, y]


def shard_map_relu_adam(mesh: jax.sharding.Mesh, opt_state: Any, variant: str = "correct") -> Callable[..., Any]:
    in_specs, out_specs = adamw_specs(opt_state)
    return jax.shard_map(RELU_ADAM_VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                         check_vma=False)
