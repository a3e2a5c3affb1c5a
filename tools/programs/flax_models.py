"""Transformer code as Flax users write it, partitioned by jit with in/out shardings (Shardy).

- ``nnx_lm``: a Flax ``nnx`` language model: token embedding, 2 pre-norm blocks (``nnx.LayerNorm``,
  ``nnx.MultiHeadAttention`` with a causal mask, a GELU MLP), a final LayerNorm and logits from the *tied*
  embedding (``Embed.attend``). Heads, MLP hidden units and the vocabulary are split over "tp", the batch
  over "dp": the partitioner gathers embedding rows from a vocab-split table and all-reduces the attention
  and MLP outputs.
- ``linen_block``: one Flax ``linen`` block: ``nn.RMSNorm``, ``nn.MultiHeadDotProductAttention`` (causal),
  a SiLU MLP; the same specs.

The models are built from their graph definitions only (``nnx.eval_shape`` / ``linen`` apply on a plain
params dict); the weights are seeded NumPy arrays (``init_*``), so the fixtures do not depend on Flax's
initialisers. Dropout is off (none declared).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import PartitionSpec as P

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int = 32
    d_model: int = 16
    heads: int = 4
    ffn: int = 32
    layers: int = 2
    batch: int = 2
    seq: int = 8


TINY = Config()


# ------------------------------------------------------------------------------------------------- nnx


class NnxBlock(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs) -> None:
        d = cfg.d_model
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(num_heads=cfg.heads, in_features=d, qkv_features=d, decode=False,
                                           rngs=rngs)
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.up = nnx.Linear(d, cfg.ffn, rngs=rngs)
        self.down = nnx.Linear(cfg.ffn, d, rngs=rngs)

    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln1(x), mask=mask)
        return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class NnxLM(nnx.Module):
    def __init__(self, cfg: Config, *, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(cfg.vocab, cfg.d_model, rngs=rngs)
        self.blocks = nnx.List([NnxBlock(cfg, rngs=rngs) for _ in range(cfg.layers)])
        self.ln_f = nnx.LayerNorm(cfg.d_model, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.embed(ids)
        mask = nnx.make_causal_mask(ids)
        for block in self.blocks:
            x = block(x, mask)
        return self.embed.attend(self.ln_f(x))  # tied embedding: logits = x @ embedding.T


_GRAPH, _ABSTRACT = nnx.split(nnx.eval_shape(lambda: NnxLM(TINY, rngs=nnx.Rngs(0))))


def nnx_lm(params: Params, ids: jax.Array) -> jax.Array:
    state = jax.tree.map(lambda v: v, _ABSTRACT)  # a fresh copy of the abstract state, filled in place
    nnx.replace_by_pure_dict(state, params)
    return nnx.merge(_GRAPH, state)(ids)


# ----------------------------------------------------------------------------------------------- linen


class LinenBlock(nn.Module):
    cfg: Config

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        mask = nn.make_causal_mask(jnp.ones(x.shape[:2], jnp.int32))
        h = nn.RMSNorm(name="norm1")(x)
        x = x + nn.MultiHeadDotProductAttention(num_heads=cfg.heads, qkv_features=cfg.d_model, name="attn")(
            h, h, mask=mask)
        h = nn.RMSNorm(name="norm2")(x)
        return x + nn.Dense(cfg.d_model, name="down")(nn.silu(nn.Dense(cfg.ffn, name="up")(h)))


def linen_block(params: Params, x: jax.Array) -> jax.Array:
    return LinenBlock(TINY).apply({"params": params}, x)


# ---------------------------------------------------------------------------------- weights and specs


def _seeded(shapes: Any, rng: np.random.Generator) -> Any:
    """Seeded weights for a tree of shapes: norm scales near 1, biases and kernels small."""
    def leaf(path: Any, shape: tuple[int, ...]) -> np.ndarray:
        name = str(path[-1].key)
        noise = rng.standard_normal(shape).astype(np.float32)
        if name == "scale":
            return (1.0 + 0.1 * noise).astype(np.float32)
        fan_in = shape[0] if len(shape) > 1 else 1
        return (noise / np.sqrt(fan_in) * (0.1 if name == "bias" else 1.0)).astype(np.float32)

    return jax.tree_util.tree_map_with_path(leaf, shapes, is_leaf=lambda s: isinstance(s, tuple))


def init_nnx(cfg: Config, rng: np.random.Generator) -> list[Any]:
    """[params (a pure dict like nnx.to_pure_dict), int32 token ids]."""
    shapes = jax.tree.map(lambda a: tuple(a.shape), nnx.to_pure_dict(_ABSTRACT))
    ids = rng.integers(0, cfg.vocab, size=(cfg.batch, cfg.seq)).astype(np.int32)
    return [_seeded(shapes, rng), ids]


def init_linen(cfg: Config, rng: np.random.Generator) -> list[Any]:
    """[params, activations [batch, seq, d_model]]."""
    x = jnp.zeros((cfg.batch, cfg.seq, cfg.d_model), jnp.float32)
    abstract = jax.eval_shape(LinenBlock(cfg).init, jax.random.key(0), x)["params"]
    shapes = jax.tree.map(lambda a: tuple(a.shape), abstract)
    return [_seeded(shapes, rng), rng.standard_normal(x.shape).astype(np.float32)]


def _tp_spec(path: Any, leaf: Any, tp: str) -> P:
    """Megatron-style: q/k/v and the MLP's first layer split on heads / hidden units, the attention output and
    the MLP's second layer on their inputs, the embedding on vocab; norms replicated."""
    names = [str(k.key) for k in path]
    last, ndim = names[-1], len(np.shape(leaf))
    if "embed" in names or "embedding" in names:
        return P(tp, None)
    if any(n in names for n in ("query", "key", "value")):
        return P(None, tp, None) if last == "kernel" else P(tp, None)
    if "out" in names:
        return P(tp, None, None) if last == "kernel" else P()
    if "up" in names:
        return P(None, tp) if last == "kernel" else P(tp)
    if "down" in names:
        return P(tp, None) if last == "kernel" else P()
    assert last in ("scale", "bias") and ndim == 1, names
    return P()


def param_specs(params: Params, tp: str = "tp") -> Any:
    return jax.tree_util.tree_map_with_path(lambda p, a: _tp_spec(p, a, tp), params)


def nnx_specs(params: Params, dp: str = "dp", tp: str = "tp") -> tuple[list[Any], P]:
    """(params, ids [batch, seq]) -> logits [batch, seq, vocab] split (dp, -, tp)."""
    return [param_specs(params, tp), P(dp, None)], P(dp, None, tp)


def linen_specs(params: Params, dp: str = "dp", tp: str = "tp") -> tuple[list[Any], P]:
    return [param_specs(params, tp), P(dp, None, None)], P(dp, None, None)
