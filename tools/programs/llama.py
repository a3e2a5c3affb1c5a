"""A Llama-style decoder block (RMSNorm, RoPE, GQA attention with a causal mask, SwiGLU FFN, residuals).

Builders:
- ``block(x, p, cfg)``            one block on the residual stream ``x: [batch, seq, d_model]``;
- ``blocks_unrolled(x, layers, cfg)`` L blocks, a Python loop over a list of per-layer params;
- ``blocks_scan(x, stacked, cfg)`` L blocks under ``lax.scan`` over layer-stacked params;
- ``model(tokens, params, cfg)``   embedding, L blocks (scan), final norm, logits;
- ``block_tp_local(x, p, cfg)``    the body of a hand-parallel (shard_map) block, heads and FFN split over
                                   ``tp``, one psum after attention-out and one after FFN-down.
Sharding specs are MaxText-style (FSDP over d_model, TP over heads / ffn; activations batch-sharded on fsdp);
the sequence-parallel variant shards the residual stream on seq over ``tp`` between blocks.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]
Constrain = Callable[[jax.Array, str], jax.Array]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    layers: int = 2
    d_model: int = 32
    n_heads: int = 8
    n_kv_heads: int = 4
    head_dim: int = 4
    ffn: int = 64
    vocab: int = 128
    seq: int = 16
    batch: int = 2
    eps: float = 1e-5
    rope_theta: float = 10000.0
    dtype: Any = jnp.float32


# Fixture size: every weight fits a 2 (fsdp) x 4 (tp) mesh, one layer's params are ~37 KB of float32.
TINY = LlamaConfig()


def _no_constraint(x: jax.Array, name: str) -> jax.Array:
    return x


# ---------------------------------------------------------------------------------------------- layers


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    ms = jnp.mean(x * x, axis=-1, keepdims=True)
    return x * jax.lax.rsqrt(ms + eps) * scale


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
    """Rotary embedding of ``x: [batch, seq, heads, head_dim]`` at integer ``positions: [seq]``."""
    half = x.shape[-1] // 2
    freqs = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2.0 / x.shape[-1])
    angles = positions.astype(jnp.float32)[:, None] * freqs[None, :]
    sin = jnp.sin(angles)[None, :, None, :]
    cos = jnp.cos(angles)[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def attention(x: jax.Array, p: Params, cfg: LlamaConfig, constrain: Constrain = _no_constraint) -> jax.Array:
    """Causal GQA attention; head counts come from the weight shapes, so a TP shard runs the same code."""
    b, s, _ = x.shape
    n_heads, n_kv, hd = p["wq"].shape[1], p["wk"].shape[1], p["wq"].shape[2]
    positions = jnp.arange(s)
    q = jnp.einsum("bsd,dhk->bshk", x, p["wq"])
    k = jnp.einsum("bsd,dhk->bshk", x, p["wk"])
    v = jnp.einsum("bsd,dhk->bshk", x, p["wv"])
    q = constrain(rope(q, positions, cfg.rope_theta), "heads")
    k = constrain(rope(k, positions, cfg.rope_theta), "kv_heads")
    v = constrain(v, "kv_heads")
    q = q.reshape(b, s, n_kv, n_heads // n_kv, hd)
    scores = jnp.einsum("bskgh,btkh->bkgst", q, k) * (hd**-0.5)
    causal = jnp.tril(jnp.ones((s, s), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("bkgst,btkh->bskgh", probs, v).reshape(b, s, n_heads, hd)
    return jnp.einsum("bshk,hkd->bsd", out, p["wo"])


def ffn(x: jax.Array, p: Params) -> jax.Array:
    gate = x @ p["w_gate"]
    up = x @ p["w_up"]
    return (jax.nn.silu(gate) * up) @ p["w_down"]


def block(x: jax.Array, p: Params, cfg: LlamaConfig, constrain: Constrain = _no_constraint) -> jax.Array:
    x = constrain(x, "act")
    h = x + attention(rms_norm(x, p["attn_norm"], cfg.eps), p, cfg, constrain)
    h = constrain(h, "act")
    out = h + ffn(rms_norm(h, p["ffn_norm"], cfg.eps), p)
    return constrain(out, "act")


def blocks_unrolled(x: jax.Array, layers: list[Params], cfg: LlamaConfig,
                    constrain: Constrain = _no_constraint) -> jax.Array:
    for p in layers:
        x = block(x, p, cfg, constrain)
    return x


def blocks_scan(x: jax.Array, stacked: Params, cfg: LlamaConfig,
                constrain: Constrain = _no_constraint) -> jax.Array:
    def body(h: jax.Array, p: Params) -> tuple[jax.Array, None]:
        return block(h, p, cfg, constrain), None

    out, _ = jax.lax.scan(body, x, stacked)
    return out


def model(tokens: jax.Array, params: Params, cfg: LlamaConfig,
          constrain: Constrain = _no_constraint) -> jax.Array:
    x = params["embed"][tokens]
    x = blocks_scan(x, params["layers"], cfg, constrain)
    x = rms_norm(x, params["final_norm"], cfg.eps)
    return x @ params["unembed"]


def block_tp_local(x: jax.Array, p: Params, cfg: LlamaConfig, axis: str = "tp") -> jax.Array:
    """shard_map body: this device holds heads/ffn columns 1/|axis| of the block; x is replicated on axis."""
    attn = attention(rms_norm(x, p["attn_norm"], cfg.eps), p, cfg)
    h = x + jax.lax.psum(attn, axis)
    down = ffn(rms_norm(h, p["ffn_norm"], cfg.eps), p)
    return h + jax.lax.psum(down, axis)


# ---------------------------------------------------------------------------------------------- params


def layer_shapes(cfg: LlamaConfig) -> dict[str, tuple[int, ...]]:
    d, h, kv, hd, f = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffn
    return {
        "attn_norm": (d,),
        "wq": (d, h, hd),
        "wk": (d, kv, hd),
        "wv": (d, kv, hd),
        "wo": (h, hd, d),
        "ffn_norm": (d,),
        "w_gate": (d, f),
        "w_up": (d, f),
        "w_down": (f, d),
    }


def init_layer(cfg: LlamaConfig, rng: np.random.Generator) -> Params:
    """Random layer params as NumPy float32; matrices scaled by 1/sqrt(fan_in) so activations stay O(1)."""
    out: Params = {}
    for name, shape in layer_shapes(cfg).items():
        if name.endswith("norm"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = shape[0] if name != "wo" else shape[0] * shape[1]
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def init_stacked(cfg: LlamaConfig, rng: np.random.Generator) -> Params:
    layers = [init_layer(cfg, rng) for _ in range(cfg.layers)]
    return {k: np.stack([lp[k] for lp in layers]) for k in layers[0]}


def init_model(cfg: LlamaConfig, rng: np.random.Generator) -> Params:
    """Params of ``model``: embedding, layer-stacked blocks, final norm, unembedding."""
    return {
        "embed": rng.standard_normal((cfg.vocab, cfg.d_model)).astype(np.float32),
        "layers": init_stacked(cfg, rng),
        "final_norm": np.ones((cfg.d_model,), np.float32),
        "unembed": (rng.standard_normal((cfg.d_model, cfg.vocab)) / np.sqrt(cfg.d_model)).astype(np.float32),
    }


def init_tokens(cfg: LlamaConfig, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.seq)).astype(np.int32)


def init_activations(cfg: LlamaConfig, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((cfg.batch, cfg.seq, cfg.d_model)).astype(np.float32)


# ---------------------------------------------------------------------------------------------- shardings


def layer_specs(fsdp: str | None = "fsdp", tp: str | None = "tp") -> dict[str, P]:
    """MaxText-style weight specs: d_model over fsdp, heads / ffn over tp; norm scales replicated."""
    return {
        "attn_norm": P(None),
        "wq": P(fsdp, tp, None),
        "wk": P(fsdp, tp, None),
        "wv": P(fsdp, tp, None),
        "wo": P(tp, None, fsdp),
        "ffn_norm": P(None),
        "w_gate": P(fsdp, tp),
        "w_up": P(fsdp, tp),
        "w_down": P(tp, fsdp),
    }


def stacked_specs(fsdp: str | None = "fsdp", tp: str | None = "tp") -> dict[str, P]:
    return {k: P(None, *spec) for k, spec in layer_specs(fsdp, tp).items()}


def model_specs(fsdp: str | None = "fsdp", tp: str | None = "tp") -> dict[str, Any]:
    return {
        "embed": P(tp, fsdp),
        "layers": stacked_specs(fsdp, tp),
        "final_norm": P(None),
        "unembed": P(fsdp, tp),
    }


def activation_spec(fsdp: str | None = "fsdp", seq: str | None = None) -> P:
    """The residual stream: batch over fsdp; with sequence parallelism also seq over ``seq`` (e.g. "tp")."""
    return P(fsdp, seq, None)


def sequence_parallel_constraint(mesh: jax.sharding.Mesh, fsdp: str = "fsdp", tp: str = "tp") -> Constrain:
    """Sequence parallelism: the residual stream is seq-sharded over tp; q/k/v are head-sharded over tp."""
    specs = {
        "act": P(fsdp, tp, None),
        "heads": P(fsdp, None, tp, None),
        "kv_heads": P(fsdp, None, tp, None),
    }

    def constrain(x: jax.Array, name: str) -> jax.Array:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, specs[name]))

    return constrain


def tp_block_specs(tp: str = "tp") -> dict[str, P]:
    """shard_map (Megatron) block: heads and ffn columns over tp, d_model unsplit, norm scales replicated."""
    return {
        "attn_norm": P(None),
        "wq": P(None, tp, None),
        "wk": P(None, tp, None),
        "wv": P(None, tp, None),
        "wo": P(tp, None, None),
        "ffn_norm": P(None),
        "w_gate": P(None, tp),
        "w_up": P(None, tp),
        "w_down": P(tp, None),
    }


def shard_map_block_tp(mesh: jax.sharding.Mesh, cfg: LlamaConfig, dp: str = "dp",
                       tp: str = "tp") -> Callable[..., jax.Array]:
    local = functools.partial(block_tp_local, cfg=cfg, axis=tp)
    act = P(dp, None, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(act, tp_block_specs(tp)), out_specs=act, check_vma=False)
