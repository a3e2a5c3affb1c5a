"""shard_map corpus, part 3: what a new user writes after the tutorial and the tests, as reference pairs.

axis_index arithmetic (global positions, masks, offsets), rings and halos written with ppermute (reversal,
shifts without wrap-around, a ring all-reduce and all-gather in fori_loops, a 1-D stencil), loops and
branches inside bodies (fori_loop around a pmean, scan along an unsplit dim, switch/cond on the device's
index, a prefix sum across devices), jnp ops over split dims (softmax, layer norm, attention with heads
split, Megatron MLP, an RNN over a split batch), nested pytrees of parameters, partial replication, out_specs
naming the axes in another order, several outputs, and integer and bool dtypes. Deliberately wrong twins
(`bug=True`) carry a ``# BUG:`` line.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from programs.shard_map_corpus_spec import M8, M24, M42, P, Program, b8, f32, i32

PROGRAMS: list[Program] = []
add = PROGRAMS.append
N = 8  # devices along "i"


def _ring(n: int, d: int) -> list[tuple[int, int]]:
    return [(k, (k + d) % n) for k in range(n)]


# ---------------------------------------------------------------------------- axis_index arithmetic


def iota_body(x: jax.Array) -> jax.Array:
    return x + (lax.axis_index("i") * x.shape[0] + jnp.arange(x.shape[0])).astype(x.dtype)


def iota_wrong_offset_body(x: jax.Array) -> jax.Array:
    return x + (lax.axis_index("i") * 3 + jnp.arange(x.shape[0])).astype(x.dtype)  # BUG: the block size is 2, not 3


add(Program("pat_global_iota", lambda x: x + jnp.arange(16, dtype=x.dtype), iota_body, M8, (P("i"),), P("i"),
            (f32(16),), "pattern: global index from axis_index"))
add(Program("pat_global_iota_BUG_offset", lambda x: x + jnp.arange(16, dtype=x.dtype), iota_wrong_offset_body, M8,
            (P("i"),), P("i"), (f32(16),), "pattern: global index from axis_index", bug=True))


def tril_body(x: jax.Array) -> jax.Array:
    rows = lax.axis_index("i") * x.shape[0] + jnp.arange(x.shape[0])[:, None]
    return jnp.where(rows >= jnp.arange(x.shape[1])[None, :], x, 0.0)


add(Program("pat_tril_row_split", jnp.tril, tril_body, M8, (P("i", None),), P("i", None), (f32(16, 16),),
            "pattern: causal mask with the rows split"))


def even_mask_body(x: jax.Array) -> jax.Array:
    g = lax.axis_index("i") * x.shape[0] + jnp.arange(x.shape[0])
    return jnp.where(g % 2 == 0, x, -x)


add(Program("pat_even_index_mask", lambda x: jnp.where(jnp.arange(32) % 2 == 0, x, -x), even_mask_body, M8,
            (P("i"),), P("i"), (f32(32),), "pattern: mask on the global index"))
add(Program("pat_int_axis_offset", lambda x: x + jnp.repeat(jnp.arange(8, dtype=jnp.int32) * 100, 2),
            lambda x: x + lax.axis_index("i") * 100, M8, (P("i"),), P("i"), (i32(16),),
            "pattern: integer offset by device"))
add(Program("pat_int_axis_offset_BUG_scale", lambda x: x + jnp.repeat(jnp.arange(8, dtype=jnp.int32) * 100, 2),
            lambda x: x + lax.axis_index("i") * 10, M8, (P("i"),), P("i"), (i32(16),),  # BUG: the offset is 100 per device
            "pattern: integer offset by device", bug=True))
add(Program("pat_psum_axis_index", lambda x: 28.0 * x, lambda x: x * lax.psum(lax.axis_index("i"), "i"), M8,
            (P("i"),), P("i"), (f32(16),), "pattern: psum of axis_index"))


def first_block_body(x: jax.Array) -> jax.Array:
    return lax.psum(jnp.where(lax.axis_index("i") == 0, x, jnp.zeros_like(x)), "i")


add(Program("pat_broadcast_from_device0", lambda x: x[:2], first_block_body, M8, (P("i"),), P(), (f32(16),),
            "pattern: broadcast device 0's block (pbroadcast by psum)"))

# --------------------------------------------------------------------------------- rings and halos


def reverse_body(x: jax.Array) -> jax.Array:
    return jnp.flip(lax.ppermute(x, "i", [(k, N - 1 - k) for k in range(N)]))


add(Program("pat_reverse_by_ppermute", jnp.flip, reverse_body, M8, (P("i"),), P("i"), (f32(16),),
            "pattern: reversal (ppermute k -> n-1-k, flip the block)"))


def shift_no_wrap_ref(x: jax.Array) -> jax.Array:
    return jnp.concatenate([x[2:], jnp.zeros(2, x.dtype)])


def shift_no_wrap_body(x: jax.Array) -> jax.Array:
    return lax.ppermute(x, "i", [(k, k - 1) for k in range(1, N)])  # the last device receives zeros


add(Program("pat_shift_no_wrap", shift_no_wrap_ref, shift_no_wrap_body, M8, (P("i"),), P("i"), (f32(16),),
            "pattern: shift left without wrap-around"))


def shift_wrong_direction_body(x: jax.Array) -> jax.Array:
    return lax.ppermute(x, "i", [(k, k + 1) for k in range(N - 1)])  # BUG: shifted right, the reference shifts left


add(Program("pat_shift_no_wrap_BUG_direction", shift_no_wrap_ref, shift_wrong_direction_body, M8, (P("i"),),
            P("i"), (f32(16),), "pattern: shift left without wrap-around", bug=True))


def ring_allreduce_body(x: jax.Array) -> jax.Array:
    def step(_: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        acc, buf = carry
        buf = lax.ppermute(buf, "i", _ring(N, 1))
        return acc + buf, buf

    return lax.fori_loop(0, N - 1, step, (x, x))[0]


add(Program("pat_ring_allreduce_fori", lambda x: x.reshape(N, -1).sum(0), ring_allreduce_body, M8, (P("i"),), P(),
            (f32(16),), "pattern: ring all-reduce in a fori_loop"))


def ring_allgather_body(x: jax.Array) -> jax.Array:
    idx, b = lax.axis_index("i"), x.shape[0]

    def step(k: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        out, buf = carry
        buf = lax.ppermute(buf, "i", _ring(N, 1))
        return lax.dynamic_update_slice_in_dim(out, buf, ((idx - k) % N) * b, 0), buf

    out = lax.dynamic_update_slice_in_dim(jnp.zeros((N * b,), x.dtype), x, idx * b, 0)
    return lax.fori_loop(1, N, step, (out, x))[0]


add(Program("pat_ring_allgather_fori", lambda x: x, ring_allgather_body, M8, (P("i"),), P(), (f32(16),),
            "pattern: ring all-gather into a buffer"))


def stencil_ref(x: jax.Array) -> jax.Array:
    p = jnp.pad(x, 1)
    return p[:-2] + p[1:-1] + p[2:]


def stencil_body(x: jax.Array) -> jax.Array:
    left = lax.ppermute(x[-1:], "i", [(k, k + 1) for k in range(N - 1)])  # neighbours' edge values, 0 at the ends
    right = lax.ppermute(x[:1], "i", [(k, k - 1) for k in range(1, N)])
    p = jnp.concatenate([left, x, right])
    return p[:-2] + p[1:-1] + p[2:]


add(Program("pat_halo_stencil", stencil_ref, stencil_body, M8, (P("i"),), P("i"), (f32(32),),
            "pattern: 3-point stencil with halo exchange"))

# ------------------------------------------------------------------------------- loops and branches


def pmean_loop_ref(x: jax.Array) -> jax.Array:
    xs = x.reshape(N, -1)
    for _ in range(3):
        xs = xs * 0.5 + xs.mean(0)
    return xs.reshape(-1)


def pmean_loop_body(x: jax.Array) -> jax.Array:
    return lax.fori_loop(0, 3, lambda _, c: c * 0.5 + lax.pmean(c, "i"), x)


add(Program("pat_fori_pmean", pmean_loop_ref, pmean_loop_body, M8, (P("i"),), P("i"), (f32(16),),
            "pattern: pmean inside a fori_loop"))


def scan_cumsum_body(x: jax.Array) -> jax.Array:
    def step(c: jax.Array, row: jax.Array) -> tuple[jax.Array, jax.Array]:
        return c + row, c + row

    return lax.scan(step, jnp.zeros_like(x[0]), x)[1]


add(Program("pat_scan_cumsum_unsplit_dim", lambda x: jnp.cumsum(x, axis=0), scan_cumsum_body, M8, (P(None, "i"),),
            P(None, "i"), (f32(8, 16),), "pattern: scan along an unsplit dim"))


def prefix_sum_body(x: jax.Array) -> jax.Array:
    totals = lax.all_gather(x.sum(), "i")
    before = jnp.sum(jnp.where(jnp.arange(N) < lax.axis_index("i"), totals, 0.0))
    return jnp.cumsum(x) + before


def prefix_sum_inclusive_body(x: jax.Array) -> jax.Array:
    totals = lax.all_gather(x.sum(), "i")
    before = jnp.sum(jnp.where(jnp.arange(N) <= lax.axis_index("i"), totals, 0.0))  # BUG: counts its own block too
    return jnp.cumsum(x) + before


add(Program("pat_prefix_sum_across_devices", jnp.cumsum, prefix_sum_body, M8, (P("i"),), P("i"), (f32(32),),
            "pattern: cumsum along the split dim"))
add(Program("pat_prefix_sum_BUG_inclusive", jnp.cumsum, prefix_sum_inclusive_body, M8, (P("i"),), P("i"),
            (f32(32),), "pattern: cumsum along the split dim", bug=True))

FNS = [jnp.sin, jnp.cos, jnp.tanh]


def switch_ref(x: jax.Array) -> jax.Array:
    xb = x.reshape(N, -1)
    return jnp.stack([FNS[k % 3](xb[k]) for k in range(N)]).reshape(-1)


add(Program("pat_switch_on_axis_index", switch_ref, lambda x: lax.switch(lax.axis_index("i") % 3, FNS, x), M8,
            (P("i"),), P("i"), (f32(16),), "pattern: switch on the device index"))
add(Program("pat_cond_first_device", lambda x: x.at[:2].add(1.0),
            lambda x: lax.cond(lax.axis_index("i") == 0, lambda a: a + 1.0, lambda a: a, x), M8, (P("i"),), P("i"),
            (f32(16),), "pattern: cond on the device index"))


def rnn(x: jax.Array, w: jax.Array) -> jax.Array:
    def step(h: jax.Array, xt: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(h @ w + xt), None

    return lax.scan(step, jnp.zeros((x.shape[0], w.shape[1])), jnp.swapaxes(x, 0, 1))[0]


add(Program("pat_rnn_scan_batch_split", rnn, rnn, M8, (P("i"), P()), P("i"), (f32(16, 5, 4), f32(4, 4)),
            "pattern: RNN scan over time, batch split"))

# ------------------------------------------------------------------------------ jnp ops on split dims


def softmax_body(x: jax.Array) -> jax.Array:
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), "i")
    e = jnp.exp(x - m)
    return e / lax.psum(jnp.sum(e, axis=-1, keepdims=True), "i")


def softmax_local_sum_body(x: jax.Array) -> jax.Array:
    m = lax.pmax(jnp.max(x, axis=-1, keepdims=True), "i")
    e = jnp.exp(x - m)
    return e / jnp.sum(e, axis=-1, keepdims=True)  # BUG: the denominator must sum over every device's features


SOFTMAX = dict(mesh=M8, in_specs=(P(None, "i"),), out_specs=P(None, "i"), inputs=(f32(4, 32),))
add(Program("pat_softmax_split_features", lambda x: jax.nn.softmax(x, axis=-1), softmax_body,
            origin="pattern: softmax over split features", **SOFTMAX))
add(Program("pat_softmax_BUG_local_sum", lambda x: jax.nn.softmax(x, axis=-1), softmax_local_sum_body,
            origin="pattern: softmax over split features", bug=True, **SOFTMAX))


def layernorm_ref(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def layernorm_body(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    n = x.shape[-1] * N
    mu = lax.psum(x.sum(-1, keepdims=True), "i") / n
    var = lax.psum(((x - mu) ** 2).sum(-1, keepdims=True), "i") / n
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def layernorm_local_mean_body(x: jax.Array, g: jax.Array, b: jax.Array) -> jax.Array:
    n = x.shape[-1] * N
    mu = x.mean(-1, keepdims=True)  # BUG: the mean of the local features only
    var = lax.psum(((x - mu) ** 2).sum(-1, keepdims=True), "i") / n
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


LN = dict(mesh=M8, in_specs=(P(None, "i"), P("i"), P("i")), out_specs=P(None, "i"),
          inputs=(f32(4, 32), f32(32), f32(32)))
add(Program("pat_layernorm_split_features", layernorm_ref, layernorm_body,
            origin="pattern: layer norm over split features", **LN))
add(Program("pat_layernorm_BUG_local_mean", layernorm_ref, layernorm_local_mean_body,
            origin="pattern: layer norm over split features", bug=True, **LN))


def attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    s = jnp.einsum("htd,hsd->hts", q, k) / 2.0
    return jnp.einsum("hts,hsd->htd", jax.nn.softmax(s, axis=-1), v)


add(Program("pat_attention_heads_split", attention, attention, M8, (P("i"),) * 3, P("i"), (f32(8, 4, 4),) * 3,
            "pattern: attention with heads split"))


def mlp_ref(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2


def mlp_body(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return lax.psum(jax.nn.gelu(x @ w1) @ w2, "i")


def mlp_missing_psum_body(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ w1) @ w2  # BUG: the row-parallel matmul leaves partial sums: psum over "i" is missing


MLP = dict(mesh=M8, in_specs=(P(), P(None, "i"), P("i", None)), out_specs=P(), inputs=(f32(4, 16), f32(16, 32),
                                                                                      f32(32, 16)))
add(Program("pat_megatron_mlp", mlp_ref, mlp_body, origin="pattern: Megatron MLP", **MLP))
add(Program("pat_megatron_mlp_BUG_no_psum", mlp_ref, mlp_missing_psum_body, origin="pattern: Megatron MLP", bug=True,
            **MLP))


def chain_ref(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ w1) @ w2


def chain_body(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.relu(lax.psum(x @ w1, "y")) @ w2


add(Program("pat_matmul_chain_2d", chain_ref, chain_body, M24, (P("x", "y"), P("y", None), P()), P("x", None),
            (f32(8, 16), f32(16, 8), f32(8, 8)), "pattern: matmul chain on a 2-D mesh"))
add(Program("pat_reduce_scatter_matmul_2d", lambda a, b: a @ b,
            lambda a, b: lax.psum_scatter(a @ b, "y", scatter_dimension=1, tiled=True), M24, (P("x", "y"),
                                                                                            P("y", None)),
            P("x", "y"), (f32(8, 16), f32(16, 8)), "pattern: reduce-scatter matmul on a 2-D mesh"))


def ulysses_body(x: jax.Array) -> jax.Array:
    heads = lax.all_to_all(x, "i", split_axis=1, concat_axis=0, tiled=True)  # rows whole, columns split
    return lax.all_to_all(jax.nn.softmax(heads, axis=0), "i", split_axis=0, concat_axis=1, tiled=True)


add(Program("pat_all_to_all_softmax_roundtrip", lambda x: jax.nn.softmax(x, axis=0), ulysses_body, M8,
            (P("i", None),), P("i", None), (f32(16, 16),), "pattern: all_to_all to the other dim and back"))

# --------------------------------------------------------------------- pytrees, specs, several outputs


def dense_ref(params: dict[str, Any], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["dense"]["w"] + params["dense"]["b"])
    return h @ params["out"]["w"] + params["out"]["b"]


def dense_body(params: dict[str, Any], x: jax.Array) -> jax.Array:
    h = jnp.tanh(x @ params["dense"]["w"] + params["dense"]["b"])
    return lax.psum(h @ params["out"]["w"], "i") + params["out"]["b"]


add(Program("pat_nested_params_dict", dense_ref, dense_body, M8,
            ({"dense": {"w": P(None, "i"), "b": P("i")}, "out": {"w": P("i", None), "b": P()}}, P()), P(),
            ({"dense": {"w": f32(8, 16), "b": f32(16)}, "out": {"w": f32(16, 4), "b": f32(4)}}, f32(4, 8)),
            "pattern: nested dict of parameters"))


def sgd_loss(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    w, b = params
    return jnp.mean((x @ w + b - y) ** 2)


def sgd_ref(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    g = jax.grad(sgd_loss)(params, x, y)
    return jax.tree.map(lambda p, d: p - 0.1 * d, params, g)


def sgd_body(params: tuple[jax.Array, jax.Array], x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    g = lax.pmean(jax.grad(sgd_loss)(params, x, y), "i")
    return jax.tree.map(lambda p, d: p - 0.1 * d, params, g)


add(Program("pat_dp_sgd_step", sgd_ref, sgd_body, M8, (P(), P("i"), P("i")), P(),
            ((f32(8, 4), f32(4)), f32(16, 8), f32(16, 4)), "pattern: data-parallel SGD step (grad in the body)"))
add(Program("pat_partial_replication", lambda x, w: x @ w, jnp.dot, M24, (P("x", None), P(None, "y")), P("x", "y"),
            (f32(8, 8), f32(8, 8)), "pattern: inputs replicated over one axis each"))


def swapped_ref(x: jax.Array) -> jax.Array:
    return x.reshape(2, 4, 4, 2).transpose(2, 1, 0, 3).reshape(16, 4)


add(Program("pat_out_specs_axes_swapped", swapped_ref, lambda x: x, M24, (P("x", "y"),), P("y", "x"), (f32(8, 8),),
            "pattern: out_specs naming the axes in the other order"))


def multi_ref(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return x.reshape(8, 4, 2).sum(1), 2 * x, x.reshape(2, 4, 4, 2).sum((0, 2))


def multi_body(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    return lax.psum(x, "y"), 2 * x, lax.psum(x, ("x", "y"))


add(Program("pat_multiple_outputs", multi_ref, multi_body, M24, (P("x", "y"),), (P("x", None), P("x", "y"), P()),
            (f32(8, 8),), "pattern: several outputs with different specs"))
add(Program("pat_gather_y_untiled_axis1", lambda x: x.reshape(8, 4, 2),
            lambda x: lax.all_gather(x, "y", axis=1, tiled=False), M24, (P("x", "y"),), P("x", None, None),
            (f32(8, 8),), "pattern: untiled all_gather into dim 1"))

# ------------------------------------------------------------------------------ integer and bool dtypes

add(Program("pat_int_psum", lambda x: x.reshape(N, -1).sum(0), lambda x: lax.psum(x, "i"), M8, (P("i"),), P(),
            (i32(16),), "pattern: integer psum"))


def argmax_body(x: jax.Array) -> jax.Array:
    local = jnp.max(x)
    best = lax.pmax(local, "i")
    pos = lax.axis_index("i") * x.shape[0] + jnp.argmax(x).astype(jnp.int32)
    return lax.pmin(jnp.where(local == best, pos, jnp.int32(2**30)), "i")


add(Program("pat_global_argmax", lambda x: jnp.argmax(x).astype(jnp.int32), argmax_body, M8, (P("i"),), P(),
            (f32(32),), "pattern: global argmax from pmax, pmin and axis_index"))


def _first_best(logits: jax.Array, local: jax.Array, best: jax.Array) -> jax.Array:
    pos = jnp.argmax(logits, -1).astype(jnp.int32) + lax.axis_index("i") * logits.shape[1]
    return lax.pmin(jnp.where(local == best, pos, jnp.int32(2**30)), "i")


def greedy_tokens(logits: jax.Array) -> jax.Array:
    local = jnp.max(logits, -1)
    return _first_best(logits, local, lax.pmax(local, "i"))


def greedy_tokens_pmax_axis(logits: jax.Array) -> jax.Array:
    local = jnp.max(logits, -1)
    best = lax.pmax(local, "j")  # BUG: the best logit over the batch axis, not over the vocab's
    return _first_best(logits, local, best)


add(Program("pat_greedy_tokens_vocab_split", lambda x: jnp.argmax(x, -1).astype(jnp.int32), greedy_tokens,
            M42, (P("j", "i"),), P("j"), (f32(8, 32),),
            "pattern: greedy decoding over a vocab split over i: each row's argmax from pmax, pmin and axis_index"))
add(Program("pat_greedy_tokens_vocab_split_BUG_pmax_axis", lambda x: jnp.argmax(x, -1).astype(jnp.int32),
            greedy_tokens_pmax_axis, M42, (P("j", "i"),), P("j"), (f32(8, 32),),
            "pattern: greedy decoding, the best logit taken over the batch axis", bug=True))


def _scale_by_position(x: jax.Array, table: jax.Array) -> jax.Array:
    return x * table[:, None]


def after_bos_ref(x: jax.Array, table: jax.Array) -> jax.Array:
    return _scale_by_position(x, table[jnp.arange(1, x.shape[0] + 1)])  # position 0 is the BOS slot


def after_bos(x: jax.Array, table: jax.Array) -> jax.Array:
    n = x.shape[0]
    return _scale_by_position(x, lax.dynamic_slice_in_dim(table, lax.axis_index("i") * n + 1, n))


def after_bos_from_zero(x: jax.Array, table: jax.Array) -> jax.Array:
    n = x.shape[0]
    rows = lax.dynamic_slice_in_dim(table, lax.axis_index("i") * n, n)  # BUG: reads the BOS slot's row too
    return _scale_by_position(x, rows)


add(Program("pat_position_table_after_bos", after_bos_ref, after_bos, M8, (P("i"), P()), P("i"),
            (f32(32, 4), f32(40)), "pattern: a position table read per device at axis_index · n + 1"))
add(Program("pat_position_table_after_bos_BUG_from_zero", after_bos_ref, after_bos_from_zero, M8, (P("i"), P()),
            P("i"), (f32(32, 4), f32(40)), "pattern: a position table read per device, the BOS offset left out",
            bug=True))


def bool_ref(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.any(x), x


def bool_body(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    return lax.psum(jnp.any(x).astype(jnp.int32), "i") > 0, lax.all_gather(x, "i", tiled=True)


add(Program("pat_bool_any_and_gather", bool_ref, bool_body, M8, (P("i"),), (P(), P()), (b8(16),),
            "pattern: bool any across devices, bool all_gather"))


def lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
    return table[ids]


add(Program("pat_lookup_ids_split", lookup, lookup, M8, (P(), P("i")), P("i", None), (f32(10, 4), i32(16)),
            "pattern: embedding lookup, ids split, table replicated"))


def stages_ref(x: jax.Array, ws: jax.Array) -> jax.Array:
    for k in range(N):
        x = jnp.tanh(x @ ws[k])
    return x


def stages_body(x: jax.Array, ws: jax.Array) -> jax.Array:
    stage = lax.axis_index("i")

    def step(k: jax.Array, h: jax.Array) -> jax.Array:
        h = jnp.where(stage == k, jnp.tanh(h @ ws[0]), h)  # only stage k applies its layer in step k
        return lax.ppermute(h, "i", _ring(N, 1))

    h = lax.fori_loop(0, N, step, x)  # after N steps the result is back on stage 0
    return lax.psum(jnp.where(stage == 0, h, jnp.zeros_like(h)), "i")


add(Program("pat_pipeline_stages_fori", stages_ref, stages_body, M8, (P(), P("i")), P(), (f32(4, 4), f32(N, 4, 4)),
            "pattern: one layer per stage, activations passed along the ring"))

# ------------------------------------------------------------------ blocks named by a permuted axis_index


def next_block_body(x: jax.Array) -> jax.Array:
    """Each device takes the block after its own (wrapping) out of a replicated value: block (i + 1) mod n."""
    b = x.shape[0] // N
    return lax.dynamic_slice_in_dim(x, ((lax.axis_index("i") + 1) % N) * b, b)


def next_block_wrong_body(x: jax.Array) -> jax.Array:
    b = x.shape[0] // N
    return lax.dynamic_slice_in_dim(x, ((lax.axis_index("i") + 2) % N) * b, b)  # BUG: the block after is + 1, not + 2


def mirrored_block_body(x: jax.Array) -> jax.Array:
    """Device i takes block n - 1 - i of its rows (a table read by partition-id, reversed), then negates it."""
    b = x.shape[0] // N
    return -lax.dynamic_slice_in_dim(x, (N - 1 - lax.axis_index("i")) * b, b)


def _next_block_ref(x: jax.Array) -> jax.Array:
    return jnp.roll(x.reshape(N, -1, *x.shape[1:]), -1, axis=0).reshape(x.shape)


add(Program("pat_next_block_axis_index", _next_block_ref, next_block_body, M8, (P(),), P("i"), (f32(16, 3),),
            "pattern: block (i + 1) mod n of a replicated value"))
add(Program("pat_next_block_axis_index_BUG_plus2", _next_block_ref, next_block_wrong_body, M8, (P(),), P("i"),
            (f32(16, 3),), "pattern: block (i + 1) mod n of a replicated value", bug=True))
add(Program("pat_mirrored_block_axis_index", lambda x: -jnp.flip(x.reshape(N, -1), 0).reshape(-1),
            mirrored_block_body, M8, (P(),), P("i"), (f32(32),), "pattern: block n - 1 - i, reversed blocks"))
