"""Mixture of experts with expert parallelism: top-1 routing, fixed capacity, all_to_all dispatch and combine.

``x: [tokens, d]`` is split over all devices (``P(("dp", "ep"))``); the router ``wr: [d, experts]`` is
replicated; the experts' weights ``w_in: [experts, d, f]``, ``w_out: [experts, f, d]`` are split on the expert
dim over "ep" (``e_local = experts / |ep|`` experts per device, expert ``e = owner * e_local + j``).

Routing is per *group* (GShard): a group is one device's tokens. In a group each token goes to its argmax
expert, scaled by that expert's softmax probability; it takes the next free slot of the expert's ``capacity``
slots and is dropped (output 0) when they are full. The single-device reference does the same per group.

shard_map body (one device): dispatch buffer ``[|ep|, e_local, capacity, d]`` (by owner) -> ``all_to_all`` over
"ep" (split 0, concat 0: now by source) -> the local experts -> ``all_to_all`` back (by owner again) -> combine
with the gates. Untiled all_to_all keeps shapes, so the buggy variants run and silently compute the wrong thing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


@dataclasses.dataclass(frozen=True)
class MoEConfig:
    tokens: int = 64
    d_model: int = 8
    d_ff: int = 8
    experts: int = 16  # 4 per device on |ep| = 4 (e_local == |ep|: the swapped-axes combine is shape-correct)
    capacity: int = 2
    groups: int = 8  # one group per device


TINY = MoEConfig()


def route(x: jax.Array, wr: jax.Array, capacity: int) -> tuple[jax.Array, jax.Array]:
    """Top-1 routing of one group ``x: [t, d]``: (dispatch, combine) weights, both ``[t, experts, capacity]``."""
    logits = x @ wr
    probs = jax.nn.softmax(logits, axis=-1)
    expert = jnp.argmax(logits, axis=-1)
    gate = jnp.max(probs, axis=-1)
    onehot = jax.nn.one_hot(expert, wr.shape[-1], dtype=x.dtype)  # [t, E]
    slot = jnp.sum((jnp.cumsum(onehot, axis=0) - 1.0) * onehot, axis=-1).astype(jnp.int32)  # [t]
    dispatch = onehot[:, :, None] * jax.nn.one_hot(slot, capacity, dtype=x.dtype)[:, None, :]  # full -> dropped
    return dispatch, dispatch * gate[:, None, None]


def experts_ffn(buf: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
    """``buf: [..., experts, capacity, d]`` through each expert's relu MLP."""
    h = jax.nn.relu(jnp.einsum("...ecd,edf->...ecf", buf, w_in))
    return jnp.einsum("...ecf,efd->...ecd", h, w_out)


def reference(x: jax.Array, wr: jax.Array, w_in: jax.Array, w_out: jax.Array, *, cfg: MoEConfig = TINY) -> jax.Array:
    xg = x.reshape(cfg.groups, -1, x.shape[-1])
    dispatch, combine = jax.vmap(lambda g: route(g, wr, cfg.capacity))(xg)
    buf = jnp.einsum("gtec,gtd->gecd", dispatch, xg)
    out = experts_ffn(buf, w_in, w_out)
    return jnp.einsum("gtec,gecd->gtd", combine, out).reshape(x.shape)


def specs(dp: str = "dp", ep: str = "ep") -> tuple[tuple[P, P, P, P], P]:
    return (P((dp, ep), None), P(None, None), P(ep, None, None), P(ep, None, None)), P((dp, ep), None)


def init(cfg: MoEConfig, rng: np.random.Generator) -> list[np.ndarray]:
    x = rng.standard_normal((cfg.tokens, cfg.d_model)).astype(np.float32)
    wr = (2.0 * rng.standard_normal((cfg.d_model, cfg.experts))).astype(np.float32)
    w_in = (rng.standard_normal((cfg.experts, cfg.d_model, cfg.d_ff)) / np.sqrt(cfg.d_model)).astype(np.float32)
    w_out = (rng.standard_normal((cfg.experts, cfg.d_ff, cfg.d_model)) / np.sqrt(cfg.d_ff)).astype(np.float32)
    return [x, wr, w_in, w_out]


def _dispatch(x: jax.Array, wr: jax.Array, e_local: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """(the tokens' slots grouped by owner ``[|ep|, e_local, capacity, d]``, the combine weights)."""
    dispatch, combine = route(x, wr, capacity)
    buf = jnp.einsum("tec,td->ecd", dispatch, x)
    return buf.reshape(-1, e_local, capacity, x.shape[-1]), combine


def _moe(x: jax.Array, wr: jax.Array, w_in: jax.Array, w_out: jax.Array, *, capacity: int) -> jax.Array:
    buf, combine = _dispatch(x, wr, w_in.shape[0], capacity)
    recv = jax.lax.all_to_all(buf, "ep", 0, 0)  # [source, e_local, capacity, d]
    out = experts_ffn(recv, w_in, w_out)
    back = jax.lax.all_to_all(out, "ep", 0, 0)  # [owner, e_local, capacity, d]
    return jnp.einsum("tec,ecd->td", combine, back.reshape(-1, capacity, x.shape[-1]))


def _moe_no_combine(x: jax.Array, wr: jax.Array, w_in: jax.Array, w_out: jax.Array, *, capacity: int) -> jax.Array:
    buf, combine = _dispatch(x, wr, w_in.shape[0], capacity)
    recv = jax.lax.all_to_all(buf, "ep", 0, 0)
    out = experts_ffn(recv, w_in, w_out)
    return jnp.einsum("tec,ecd->td", combine, out.reshape(-1, capacity, x.shape[-1]))  # BUG: combine all_to_all missing


def _moe_combine_axes_swapped(x: jax.Array, wr: jax.Array, w_in: jax.Array, w_out: jax.Array, *,
                              capacity: int) -> jax.Array:
    buf, combine = _dispatch(x, wr, w_in.shape[0], capacity)
    recv = jax.lax.all_to_all(buf, "ep", 0, 0)
    out = experts_ffn(recv, w_in, w_out)
    back = jax.lax.all_to_all(out, "ep", 0, 1)  # BUG: concat_axis 1: result is [e_local, owner, ...], not [owner, ...]
    return jnp.einsum("tec,ecd->td", combine, back.reshape(-1, capacity, x.shape[-1]))


VARIANTS: dict[str, Callable[..., jax.Array]] = {
    "correct": _moe,
    "no_combine": _moe_no_combine,
    "combine_axes_swapped": _moe_combine_axes_swapped,
}


def shard_map_moe(mesh: jax.sharding.Mesh, variant: str = "correct", cfg: MoEConfig = TINY) -> Callable[..., jax.Array]:
    body = VARIANTS[variant]

    def local(x: jax.Array, wr: jax.Array, w_in: jax.Array, w_out: jax.Array) -> jax.Array:
        return body(x, wr, w_in, w_out, capacity=cfg.capacity)

    in_specs, out_spec = specs()
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=out_spec, check_vma=False)
