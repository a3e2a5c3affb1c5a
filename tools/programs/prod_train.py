"""A train step shaped like a production framework's, small: token embedding looked up by integer ids, a
`lax.scan` over decoder layers (RMSNorm, causal attention, GELU MLP on the residual), logits against the tied embedding,
optax's integer-label softmax cross-entropy, `jax.value_and_grad`, optax AdamW.

Sharded as large jobs are (`specs`): fsdp x tp; the embedding's vocab over tp and its width over fsdp (the
lookup is a vocab-parallel masked gather, its gradient a scatter-add into the vocab shards); layer weights
column-/row-parallel; ZeRO-1 optimizer state: the moments of the replicated norm scales split over fsdp
where their parameters are not; the batch over fsdp. XLA's partitioner moves the scan's saved activations
between layouts with collective-permutes.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]
VOCAB, WIDTH, HIDDEN, LAYERS, BATCH, SEQ = 32, 8, 16, 2, 4, 4
OPT = optax.adamw(1e-3, weight_decay=0.1)


def rms_norm(x: jax.Array, scale: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * scale


def block(h: jax.Array, p: Params) -> tuple[jax.Array, None]:
    a = rms_norm(h, p["n1"])
    q, k, v = a @ p["wq"], a @ p["wk"], a @ p["wv"]
    scores = jnp.einsum("bsd,btd->bst", q, k) / np.sqrt(WIDTH)
    causal = jnp.arange(SEQ)[:, None] >= jnp.arange(SEQ)[None, :]
    scores = jnp.where(causal, scores, -1e9)
    h = h + jax.nn.softmax(scores, -1) @ v @ p["wo"]
    return h + jax.nn.gelu(h @ p["w1"]) @ p["w2"], None


def loss(params: Params, ids: jax.Array, labels: jax.Array) -> jax.Array:
    h = params["embed"][ids]
    h, _ = jax.lax.scan(block, h, params["layers"])
    logits = rms_norm(h, params["final_norm"]) @ params["embed"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def step(params: Params, opt_state: Any, ids: jax.Array, labels: jax.Array) -> tuple[jax.Array, Params, Any]:
    value, grads = jax.value_and_grad(loss)(params, ids, labels)
    updates, opt_state = OPT.update(grads, opt_state, params)
    return value, optax.apply_updates(params, updates), opt_state


def init(rng: np.random.Generator) -> list[Any]:
    """[params, AdamW state after three steps' worth of moments, int32 ids, int32 labels]."""
    def f(*shape: int) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape).astype(np.float32) * 0.1)

    params = {"embed": f(VOCAB, WIDTH), "final_norm": f(WIDTH) + 1,
              "layers": {"n1": f(LAYERS, WIDTH) + 1, "wq": f(LAYERS, WIDTH, WIDTH),
                         "wk": f(LAYERS, WIDTH, WIDTH), "wv": f(LAYERS, WIDTH, WIDTH), "wo": f(LAYERS, WIDTH, WIDTH),
                         "w1": f(LAYERS, WIDTH, HIDDEN), "w2": f(LAYERS, HIDDEN, WIDTH)}}
    state = OPT.init(params)
    adam = state[0]
    moments = adam._replace(count=jnp.asarray(3, jnp.int32), mu=jax.tree.map(lambda p: p * 0.01, params),
                            nu=jax.tree.map(lambda p: p * p * 0.01, params))
    ids = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, VOCAB, (BATCH, SEQ)), jnp.int32)
    return [params, (moments, *state[1:]), ids, labels]


def _param_specs(fsdp: str, tp: str) -> Params:
    col, row = P(None, fsdp, tp), P(None, tp, fsdp)
    return {"embed": P(tp, fsdp), "final_norm": P(),
            "layers": {"n1": P(), "wq": col, "wk": col, "wv": col, "wo": row, "w1": col, "w2": row}}


def specs(opt_state: Any, fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """(in_specs, out_specs): params fsdp x tp; moments like them except ZeRO-1's split of the replicated
    norm scales over fsdp; the step count replicated; batch over fsdp."""
    params = _param_specs(fsdp, tp)
    zero1 = {**params, "final_norm": P(fsdp), "layers": {**params["layers"], "n1": P(None, fsdp)}}
    adam = opt_state[0]._replace(count=P(), mu=zero1, nu=zero1)
    state = (adam, *opt_state[1:])
    batch = P(fsdp)
    return [params, state, batch, batch], (P(), params, state)


def lookup_loss(embed: jax.Array, ids: jax.Array, labels: jax.Array) -> jax.Array:
    """A tied-embedding language model with no layers: logits = embed[ids] @ embed.T."""
    return optax.softmax_cross_entropy_with_integer_labels(embed[ids] @ embed.T, labels).mean()


def lookup_step(embed: jax.Array, ids: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """SGD on `lookup_loss`: the embedding's gradient is a scatter-add of the batch's rows into zeros, each
    device adding its own batch shard's (partial sums over the batch axis)."""
    value, grad = jax.value_and_grad(lookup_loss)(embed, ids, labels)
    return value, embed - 0.1 * grad


def lookup_specs(fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    """The embedding's width over tp, its vocab whole; the batch over fsdp."""
    embed = P(None, tp)
    return [embed, P(fsdp), P(fsdp)], (P(), embed)


def fused_glu_mlp(x: jax.Array, w13: jax.Array, w2: jax.Array) -> jax.Array:
    """A SwiGLU MLP with the gate and up projections fused in one weight, split after the matmul (as many
    Llama implementations write it): under tensor parallelism the split cuts a tp-split dim in halves."""
    gate, up = jnp.split(x @ w13, 2, axis=-1)
    return (jax.nn.silu(gate) * up) @ w2


def fused_glu_specs(fsdp: str = "fsdp", tp: str = "tp") -> tuple[list[Any], Any]:
    return [P(fsdp, None), P(None, tp), P(tp, None)], P(fsdp, None)
