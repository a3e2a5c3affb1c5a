"""A Llama training step as users write it: `jax.grad` of a loss through decoder blocks, then optax AdamW,
with the optimizer state sharded like the params (FSDP x TP, MaxText-style specs).

XLA partitions the backward pass by all-reducing each weight gradient over the data (fsdp) axis and then
taking the device's FSDP shard with a dynamic-slice whose offsets are read from a table indexed by the
partition id: a layout the verifier must not mistake for a bug.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from programs import llama

Params = dict[str, Any]
CFG = llama.LlamaConfig(layers=1, d_model=16, n_heads=4, n_kv_heads=4, head_dim=4, ffn=32, seq=8)
OPTIMIZER = optax.adamw(learning_rate=1e-2, weight_decay=0.1)


def loss(params: Params, x: jax.Array) -> jax.Array:
    h = llama.blocks_unrolled(x, params["layers"], CFG)
    return jnp.mean(h * h)


def train_step(params: Params, opt_state: Any, x: jax.Array) -> tuple[jax.Array, Params, Any]:
    value, grads = jax.value_and_grad(loss)(params, x)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def init(rng: np.random.Generator) -> list[Any]:
    params = {"layers": [llama.init_layer(CFG, rng) for _ in range(CFG.layers)]}
    x = llama.init_activations(CFG, rng)
    return [params, OPTIMIZER.init(params), x]


def specs(args: list[Any], fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """(in_specs, out_specs): params and every optimizer moment by the layer specs (matched by the weight's
    name), scalars replicated, activations batch-split over fsdp."""
    layer = llama.layer_specs(fsdp, tp)
    params, opt_state, _ = args

    def like_param(path: Any, leaf: Any) -> P:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return layer[names[-1]] if names and names[-1] in layer and np.ndim(leaf) else P()

    param_specs = jax.tree_util.tree_map_with_path(like_param, params)
    state_specs = jax.tree_util.tree_map_with_path(like_param, opt_state)
    in_specs = [param_specs, state_specs, llama.activation_spec(fsdp)]
    return in_specs, (P(), param_specs, state_specs)
