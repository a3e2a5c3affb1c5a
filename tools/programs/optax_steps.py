"""Training steps with optax optimizers, as users write them: ``jax.value_and_grad`` of a loss of a small MLP,
``opt.update``, ``optax.apply_updates``; each step returns ``(loss, new params, new optimizer state)``.

Model: ``mlp(params, x) = tanh(x @ w1 + b1) @ w2 + b2``, mean squared error against ``y``. Optimizers
(``OPTIMIZERS``): SGD with momentum under a cosine learning-rate schedule, Adam, AdamW with weight decay
masked to the kernels, AdamW behind global-norm clipping (``optax.chain``), Lion, Adafactor (factored second
moments). ``mixed_step``: bf16 compute with f32 master weights (dots accumulate in f32, an RMSNorm in f32),
AdamW on the masters.

Partitioned by jit (``fsdp x tp`` specs: w1 P(fsdp, tp), b1 P(tp), w2 P(tp, fsdp), b2 replicated; every
optimizer moment like its parameter, batch over fsdp). By hand with shard_map (``shard_map_lion``): data
parallel (params replicated, batch over "dp"), each device's loss the sum of its per-example losses over
the *global* batch, gradients and loss psum'd over "dp"; its twin forgets the gradient psum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Config:
    batch: int = 16
    d_in: int = 8
    d_hidden: int = 16
    d_out: int = 4


TINY = Config()


def _kernels_only(params: Params) -> Params:
    return {k: v.ndim > 1 for k, v in params.items()}


OPTIMIZERS: dict[str, optax.GradientTransformation] = {
    "sgd_momentum_schedule": optax.sgd(optax.cosine_decay_schedule(0.1, decay_steps=10), momentum=0.9),
    "adam": optax.adam(1e-2),
    "adamw_masked": optax.adamw(1e-2, weight_decay=0.1, mask=_kernels_only),
    "clip_adamw": optax.chain(optax.clip_by_global_norm(0.5), optax.adamw(1e-2, weight_decay=0.1)),
    "lion": optax.lion(1e-3, weight_decay=0.1),
    "adafactor": optax.adafactor(1e-2, min_dim_size_to_factor=4),
}


# ---------------------------------------------------------------------------------------------- model


def mlp(params: Params, x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["w1"] + params["b1"])
    return h @ params["w2"] + params["b2"]


def per_example(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    err = mlp(params, x) - y
    return jnp.sum(err * err, axis=-1)


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean(per_example(params, x, y))


def step(opt: optax.GradientTransformation, params: Params, opt_state: Any, x: jax.Array,
         y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, opt_state = opt.update(grads, opt_state, params)
    return loss, optax.apply_updates(params, updates), opt_state


def step_of(name: str) -> Callable[..., Any]:
    opt = OPTIMIZERS[name]

    def fn(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
        return step(opt, params, opt_state, x, y)

    return fn


# ----------------------------------------------------------------- mixed precision: bf16 compute, f32 masters

MIXED_OPT = optax.adamw(1e-2, weight_decay=0.1)


def mixed_loss(master: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    p = jax.tree.map(lambda w: w.astype(jnp.bfloat16), master)  # bf16 copies of the f32 master weights
    h = jnp.dot(x.astype(jnp.bfloat16), p["w1"], preferred_element_type=jnp.float32) + master["b1"]
    h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * master["scale"]  # RMSNorm in f32
    out = jnp.dot(jnp.tanh(h).astype(jnp.bfloat16), p["w2"], preferred_element_type=jnp.float32) + master["b2"]
    err = out - y
    return jnp.mean(jnp.sum(err * err, axis=-1))


def mixed_step(master: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, grads = jax.value_and_grad(mixed_loss)(master, x, y)
    updates, opt_state = MIXED_OPT.update(grads, opt_state, master)
    return loss, optax.apply_updates(master, updates), opt_state


# ------------------------------------------------------------------------------------- inputs and specs


def init_params(cfg: Config, rng: np.random.Generator, norm: bool = False) -> Params:
    def normal(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    params = {"w1": normal(cfg.d_in, cfg.d_hidden, scale=cfg.d_in ** -0.5),
              "b1": normal(cfg.d_hidden, scale=0.1),
              "w2": normal(cfg.d_hidden, cfg.d_out, scale=cfg.d_hidden ** -0.5),
              "b2": normal(cfg.d_out, scale=0.1)}
    if norm:
        params["scale"] = (1.0 + 0.1 * rng.standard_normal(cfg.d_hidden)).astype(np.float32)
    return params


def _warm_state(opt: optax.GradientTransformation, loss: Callable[..., jax.Array], params: Params,
                x: np.ndarray, y: np.ndarray) -> Any:
    """The optimizer state after two updates (non-zero moments, step count 2), as NumPy arrays."""
    state = opt.init(params)
    _, grads = jax.value_and_grad(loss)(params, x, y)
    for _ in range(2):
        _, state = opt.update(grads, state, params)
    return jax.tree.map(np.asarray, state)


def init(name: str, rng: np.random.Generator, cfg: Config = TINY) -> list[Any]:
    """[params, optimizer state, x, y] for ``step_of(name)`` (or ``mixed_step`` when name is "mixed")."""
    params = init_params(cfg, rng, norm=name == "mixed")
    x = rng.standard_normal((cfg.batch, cfg.d_in)).astype(np.float32)
    y = rng.standard_normal((cfg.batch, cfg.d_out)).astype(np.float32)
    opt, loss = (MIXED_OPT, mixed_loss) if name == "mixed" else (OPTIMIZERS[name], loss_fn)
    return [params, _warm_state(opt, loss, params, x, y), x, y]


def param_specs(params: Params, fsdp: str = "fsdp", tp: str = "tp") -> Params:
    table = {"w1": P(fsdp, tp), "b1": P(tp), "w2": P(tp, fsdp), "b2": P(), "scale": P(tp)}
    return {k: table[k] for k in params}


def state_specs(opt_state: Any, params: Params, pspecs: Params) -> Any:
    """Each moment like its parameter (matched by name and shape); counts, factored rows/columns replicated."""
    def spec(path: Any, leaf: Any) -> P:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        hit = [n for n in names if n in params]
        if hit and np.shape(leaf) == np.shape(params[hit[-1]]):
            return pspecs[hit[-1]]
        return P()

    return jax.tree_util.tree_map_with_path(spec, opt_state)


def specs(args: list[Any], fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    params, opt_state, _, _ = args
    ps = param_specs(params, fsdp, tp)
    st = state_specs(opt_state, params, ps)
    return [ps, st, P(fsdp, None), P(fsdp, None)], (P(), ps, st)


# -------------------------------------------------------------------- shard_map: data-parallel Lion step

LION = OPTIMIZERS["lion"]


def _local_loss(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """This shard's share of the global mean: its per-example losses summed, over the global batch."""
    return jnp.sum(per_example(params, x, y)) / TINY.batch


def _dp_lion(params: Params, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)
    grads = jax.lax.psum(g, "dp")
    updates, opt_state = LION.update(grads, opt_state, params)
    return jax.lax.psum(loss, "dp"), optax.apply_updates(params, updates), opt_state


def _dp_lion_no_grad_psum(params: Params, opt_state: Any, x: jax.Array,
                          y: jax.Array) -> tuple[jax.Array, Params, Any]:
    loss, g = jax.value_and_grad(_local_loss)(params, x, y)  # BUG: this shard's gradients, never psum'd over "dp"
    updates, opt_state = LION.update(g, opt_state, params)
    return jax.lax.psum(loss, "dp"), optax.apply_updates(params, updates), opt_state


LION_VARIANTS: dict[str, Callable[..., Any]] = {"correct": _dp_lion, "no_grad_psum": _dp_lion_no_grad_psum}


def dp_specs(opt_state: Any, dp: str = "dp") -> tuple[list[Any], Any]:
    """Params and optimizer state replicated, batch over dp."""
    ps = {k: P() for k in ("w1", "b1", "w2", "b2")}
    st = jax.tree.map(lambda _: P(), opt_state)
    return [ps, st, P(dp, None), P(dp, None)], (P(), ps, st)


def shard_map_lion(mesh: jax.sharding.Mesh, opt_state: Any, variant: str = "correct") -> Callable[..., Any]:
    in_specs, out_specs = dp_specs(opt_state)
    return jax.shard_map(LION_VARIANTS[variant], mesh=mesh, in_specs=tuple(in_specs), out_specs=out_specs,
                         check_vma=False)
