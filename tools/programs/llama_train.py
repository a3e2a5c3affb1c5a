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


# ------------------------------------------------------------------- the same step at any size (tools/bench.py)


def keep_dtype(dtype: Any) -> llama.Constrain:
    """Mixed precision at block boundaries: the residual stream is cast back to ``dtype`` (bf16 params) after
    each block (RoPE computes in float32 and promotes q/k, so without it a bf16 scan carry changes type)."""

    def constrain(x: jax.Array, name: str) -> jax.Array:
        return x.astype(dtype) if name == "act" else x

    return constrain


def make_train_step(cfg: llama.LlamaConfig, *, scanned: bool) -> Any:
    """``train_step`` of ``cfg``: the blocks unrolled (params ``{"layers": [per-layer dict]}``) or under
    ``lax.scan`` (``{"layers": stacked dict}``), params in ``cfg.dtype``, the loss accumulated in float32."""
    constrain = keep_dtype(cfg.dtype)

    def step_loss(params: Params, x: jax.Array) -> jax.Array:
        blocks = llama.blocks_scan if scanned else llama.blocks_unrolled
        h = blocks(x, params["layers"], cfg, constrain).astype(jnp.float32)
        return jnp.mean(h * h)

    def step(params: Params, opt_state: Any, x: jax.Array) -> tuple[jax.Array, Params, Any]:
        value, grads = jax.value_and_grad(step_loss)(params, x)
        updates, opt_state = OPTIMIZER.update(grads, opt_state, params)
        return value, optax.apply_updates(params, updates), opt_state

    return step


def abstract_args(cfg: llama.LlamaConfig, *, scanned: bool) -> list[Any]:
    """(params, opt_state, x) as ShapeDtypeStructs: nothing is allocated, AdamW's state by ``jax.eval_shape``."""
    shapes = llama.layer_shapes(cfg)
    if scanned:
        layers: Any = {k: jax.ShapeDtypeStruct((cfg.layers, *s), cfg.dtype) for k, s in shapes.items()}
    else:
        layers = [{k: jax.ShapeDtypeStruct(s, cfg.dtype) for k, s in shapes.items()} for _ in range(cfg.layers)]
    params = {"layers": layers}
    x = jax.ShapeDtypeStruct((cfg.batch, cfg.seq, cfg.d_model), cfg.dtype)
    return [params, jax.eval_shape(OPTIMIZER.init, params), x]


def abstract_specs(args: list[Any], *, scanned: bool, fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """``specs`` for abstract arguments (ranks from ``.shape``), the layer-stacked specs under scan."""
    layer = llama.stacked_specs(fsdp, tp) if scanned else llama.layer_specs(fsdp, tp)
    params, opt_state, _ = args

    def like_param(path: Any, leaf: Any) -> P:
        names = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        return layer[names[-1]] if names and names[-1] in layer and len(leaf.shape) else P()

    param_specs = jax.tree_util.tree_map_with_path(like_param, params)
    state_specs = jax.tree_util.tree_map_with_path(like_param, opt_state)
    return [param_specs, state_specs, llama.activation_spec(fsdp)], (P(), param_specs, state_specs)


# ------------------------------------------------------- a scanned training step at fixture size (tests/fixtures)

# Llama's full block under `lax.scan` makes a fixture too large to keep, so the scanned training step keeps
# what the partitioner does to the loops, at a fraction of the text: single-head causal attention blocks
# (q/k/v/o over fsdp x tp) with RoPE-like rotation, under `lax.scan` over layer-stacked weights, plain SGD.
# The forward loop stacks batch-split residuals into buffers of zeros (a dynamic-update-slice at the loop
# counter), the causal mask broadcast to the scores enters the loop whole, and the backward loop stacks each
# layer's weight gradients, all-reduced over fsdp.
SCAN = {"layers": 2, "batch": 2, "seq": 4, "d": 8, "f": 8}
SCAN_LR = 0.1


def scan_block(h: jax.Array, p: Params) -> tuple[jax.Array, None]:
    s, f = SCAN["seq"], SCAN["f"]
    rot = jnp.cos(jnp.arange(s, dtype=jnp.float32)[:, None] * (1.0 + jnp.arange(f, dtype=jnp.float32)))
    q, k, v = (h @ p["wq"]) * rot, (h @ p["wk"]) * rot, h @ p["wv"]
    scores = jnp.einsum("bsf,btf->bst", q, k)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    return h + jnp.einsum("bst,btf->bsf", probs, v) @ p["wo"], None


def scan_loss(params: Params, x: jax.Array) -> jax.Array:
    h, _ = jax.lax.scan(scan_block, x, params)
    return jnp.mean(h * h)


def scan_train_step(params: Params, x: jax.Array) -> tuple[jax.Array, Params]:
    value, grads = jax.value_and_grad(scan_loss)(params, x)
    return value, jax.tree.map(lambda w, g: w - SCAN_LR * g, params, grads)


def init_scanned(rng: np.random.Generator) -> list[Any]:
    n, d, f = SCAN["layers"], SCAN["d"], SCAN["f"]
    params = {k: (rng.standard_normal((n, d, f) if k != "wo" else (n, f, d)) / np.sqrt(d)).astype(np.float32)
              for k in ("wq", "wk", "wv", "wo")}
    return [params, rng.standard_normal((SCAN["batch"], SCAN["seq"], d)).astype(np.float32)]


def scanned_specs(fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """Weights P(None, fsdp, tp) (wo: P(None, tp, fsdp)), the batch over fsdp; (loss, params) out."""
    params = {k: P(None, fsdp, tp) if k != "wo" else P(None, tp, fsdp) for k in ("wq", "wk", "wv", "wo")}
    return [params, P(fsdp, None, None)], (P(), params)
