"""shard_map corpus, part 1: the computations of JAX's shard_map tutorial (docs/notebooks/shard_map.md).

Each program is re-expressed as a pair: a plain jnp reference on global arrays and a shard_map body, on a
mesh of the 8 fake CPU devices (the tutorial's 1-D meshes of 4 become 8). Sections: the opening block
matmul; in_specs that leave a mesh axis out (tiling); out_specs that leave axes out (psum then untile);
varying/invariant values (pvary, scan carries); the collectives tutorial (psum, all_gather tiled and not,
psum_scatter, ppermute, psum_scatter written with ppermute, all_to_all); the collective matmuls (all-gather
and reduce-scatter, one-shot, ring unrolled, ring as fori_loop, bidirectional); the neural-network
examples (data parallel, FSDP with and without remat, tensor parallel, FSDP+TP) and the SPMD pipeline.
Deliberately wrong twins (`bug=True`) carry a ``# BUG:`` line.
"""

from __future__ import annotations

import itertools
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from programs.shard_map_corpus_spec import M8, M8B, M42, M42XY, P, Program, f32

Params = list[tuple[jax.Array, jax.Array]]
PROGRAMS: list[Program] = []
add = PROGRAMS.append


def _ring(n: int, d: int) -> list[tuple[int, int]]:
    return [(k, (k + d) % n) for k in range(n)]


# ------------------------------------------------------------------------------------- opening example


def matmul_ref(a: jax.Array, b: jax.Array) -> jax.Array:
    return a @ b


def matmul_basic_body(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.psum(jnp.dot(a, b), "y")  # contraction dim split over "y": sum the partial products


def matmul_basic_wrong_axis_body(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.psum(jnp.dot(a, b), "x")  # BUG: the contraction is split over "y", not "x"


add(Program("tut_matmul_basic", matmul_ref, matmul_basic_body, M42XY, (P("x", "y"), P("y", None)), P("x", None),
            (f32(8, 16), f32(16, 4)), "tutorial: matmul_basic"))
add(Program("tut_matmul_basic_BUG_axis", matmul_ref, matmul_basic_wrong_axis_body, M42XY,
            (P("x", "y"), P("y", None)), P("x", None), (f32(8, 16), f32(16, 4)), "tutorial: matmul_basic", bug=True))

# ------------------------------------------------------------------------ in_specs / out_specs sections


def identity(x: jax.Array) -> jax.Array:
    return x


add(Program("tut_in_spec_tiles", lambda x: jnp.tile(x, (1, 2)), identity, M42, (P("i", None),), P("i", "j"),
            (f32(8, 12),), "tutorial: f1 (in_specs omit 'j': out_specs tile)"))
add(Program("tut_psum_untile_j", lambda x: x.reshape(8, 2, 4).sum(1), lambda x: lax.psum(x, "j"), M42,
            (P("i", "j"),), P("i", None), (f32(8, 8),), "tutorial: f3 (psum 'j', out_specs untile 'j')"))
add(Program("tut_psum_untile_i", lambda x: x.reshape(4, 2, 8).sum(0), lambda x: lax.psum(x, "i"), M42,
            (P("i", "j"),), P(None, "j"), (f32(8, 8),), "tutorial: f4 (psum 'i', out_specs untile 'i')"))
add(Program("tut_psum_untile_ij", lambda x: x.reshape(4, 2, 2, 4).sum((0, 2)), lambda x: lax.psum(x, ("i", "j")),
            M42, (P("i", "j"),), P(None, None), (f32(8, 8),), "tutorial: f5 (psum both axes)"))
add(Program("tut_double_varying", lambda x: 2 * x, lambda x: 2 * x, M8, (P("i"),), P("i"), (f32(16),),
            "tutorial: varying value"))
add(Program("tut_double_invariant", lambda x: 2 * x, lambda x: 2 * x, M8, (P(),), P(), (f32(6),),
            "tutorial: invariant value"))
add(Program("tut_psum_invariant_out", lambda x: x.reshape(8, 2).sum(0), lambda x: lax.psum(x, "i"), M8, (P("i"),),
            P(), (f32(16),), "tutorial: psum makes an invariant value"))
add(Program("tut_implicit_pvary_mul", lambda x, y: (x.reshape(8, 2) * y).reshape(-1), lambda x, y: x * y, M8,
            (P("i"), P()), P("i"), (f32(16), f32(2)), "tutorial: binary op of varying and invariant"))


def scan_swap_ref(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    return jnp.tile(y, 8), x  # three swaps of the carry: the blocks of x and the copy of y change places


def scan_swap_body(x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    def step(carry: tuple[jax.Array, jax.Array], _: Any) -> tuple[tuple[jax.Array, jax.Array], None]:
        c1, c2 = carry
        return (c2, c1), None

    (x_, y_), _ = lax.scan(step, (x, y), None, length=3)
    return x_, y_


add(Program("tut_scan_swap_carry", scan_swap_ref, scan_swap_body, M8, (P("i"), P()), (P("i"), P("i")),
            (f32(16), f32(2)), "tutorial: scan swapping a varying and an invariant carry"))

# ----------------------------------------------------------------------------------- collectives tutorial

add(Program("tut_psum_rows", lambda x: x.sum(0, keepdims=True), lambda x: lax.psum(x, "i"), M8, (P("i", None),),
            P(None, None), (f32(8, 4),), "tutorial: psum"))
add(Program("tut_all_gather_tiled", lambda x: jnp.tile(x, 8), lambda x: lax.all_gather(x, "i", tiled=True), M8,
            (P("i"),), P("i"), (f32(16),), "tutorial: all_gather tiled"))
add(Program("tut_all_gather_untiled", lambda x: jnp.tile(x.reshape(8, 2), (8, 1)),
            lambda x: lax.all_gather(x, "i", tiled=False), M8, (P("i"),), P("i"), (f32(16),),
            "tutorial: all_gather untiled"))
add(Program("tut_psum_scatter_tiled", lambda x: x.reshape(8, 8).sum(0),
            lambda x: lax.psum_scatter(x, "i", tiled=True), M8, (P("i"),), P("i"), (f32(64),),
            "tutorial: psum_scatter"))


def shift_ref(x: jax.Array) -> jax.Array:
    return jnp.roll(x.reshape(8, -1), 1, axis=0).reshape(-1)


add(Program("tut_ppermute_shift", shift_ref, lambda x: lax.ppermute(x, "i", _ring(8, 1)), M8, (P("i"),), P("i"),
            (f32(16),), "tutorial: ppermute"))


def psum_scatter_by_ppermute_body(x: jax.Array) -> jax.Array:
    """The tutorial's psum_scatter built from ppermutes and local adds, indexed by axis_index."""
    size = 8
    idx = lax.axis_index("i")
    x = x.reshape(size, -1, *x.shape[1:])
    for k in range(1, size):
        update = lax.ppermute(x[(idx + k) % size], "i", _ring(size, -1))
        x = x.at[(idx + k + 1) % size].add(update)
    return x[idx]


add(Program("tut_psum_scatter_by_ppermute", lambda x: x.reshape(8, 8).sum(0), psum_scatter_by_ppermute_body, M8,
            (P("i"),), P("i"), (f32(64),), "tutorial: psum_scatter written with ppermute"))
add(Program("tut_all_to_all", lambda x: x.reshape(8, 8).T.reshape(-1),
            lambda x: lax.all_to_all(x, "i", 0, 0, tiled=True), M8, (P("i"),), P("i"), (f32(64),),
            "tutorial: all_to_all"))

# ---------------------------------------------------------------------------------- collective matmuls


def ag_matmul_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return lhs @ lax.all_gather(rhs, "i", tiled=True)


def ag_matmul_ring_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    b = lhs.shape[1] // size
    out = lax.dynamic_slice_in_dim(lhs, idx * b, b, 1) @ rhs
    for k in range(1, size):
        rhs = lax.ppermute(rhs, "i", _ring(size, 1))
        out += lax.dynamic_slice_in_dim(lhs, ((idx - k) % size) * b, b, 1) @ rhs
    return out


def ag_matmul_ring_wrong_block_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    b = lhs.shape[1] // size
    out = lax.dynamic_slice_in_dim(lhs, idx * b, b, 1) @ rhs
    for k in range(1, size):
        rhs = lax.ppermute(rhs, "i", _ring(size, 1))
        out += lax.dynamic_slice_in_dim(lhs, ((idx + k) % size) * b, b, 1) @ rhs  # BUG: the block came from idx - k
    return out


def ag_matmul_ring_fori_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    b = lhs.shape[1] // size

    def step(k: jax.Array, carry: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        out, r = carry
        r = lax.ppermute(r, "i", _ring(size, 1))
        return out + lax.dynamic_slice_in_dim(lhs, ((idx - k) % size) * b, b, 1) @ r, r

    out = lax.dynamic_slice_in_dim(lhs, idx * b, b, 1) @ rhs
    return lax.fori_loop(1, size, step, (out, rhs))[0]


def ag_matmul_bidi_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    b = lhs.shape[1] // size // 2  # half blocks: one half travels up the ring, the other down

    def lhs_block(k: jax.Array, hi: int) -> jax.Array:
        return lax.dynamic_slice_in_dim(lhs, (2 * k + hi) * b, b, 1)

    def block_matmul(lo: jax.Array, hi: jax.Array, k_lo: jax.Array, k_hi: jax.Array) -> jax.Array:
        lhs_lo = jnp.pad(lhs_block(k_lo, 0), [(0, 0), (0, b)])
        lhs_hi = jnp.pad(lhs_block(k_hi, 1), [(0, 0), (b, 0)])
        return (lhs_lo + lhs_hi) @ (jnp.pad(lo, [(0, b), (0, 0)]) + jnp.pad(hi, [(b, 0), (0, 0)]))

    lo, hi = jnp.split(rhs, 2, axis=0)
    out = block_matmul(lo, hi, idx, idx)
    for k in range(1, size):
        lo = lax.ppermute(lo, "i", _ring(size, 1))
        hi = lax.ppermute(hi, "i", _ring(size, -1))
        out += block_matmul(lo, hi, (idx - k) % size, (idx + k) % size)
    return out


AG = dict(mesh=M8, in_specs=(P("i", None), P("i", None)), out_specs=P("i", None), inputs=(f32(16, 32), f32(32, 8)))
add(Program("tut_allgather_matmul", matmul_ref, ag_matmul_body, origin="tutorial: matmul_allgather", **AG))
add(Program("tut_allgather_matmul_ring", matmul_ref, ag_matmul_ring_body,
            origin="tutorial: matmul_allgather_overlapped", **AG))
add(Program("tut_allgather_matmul_ring_BUG_block", matmul_ref, ag_matmul_ring_wrong_block_body,
            origin="tutorial: matmul_allgather_overlapped", bug=True, **AG))
add(Program("tut_allgather_matmul_ring_fori", matmul_ref, ag_matmul_ring_fori_body,
            origin="tutorial: matmul_allgather_overlapped as fori_loop", **AG))
add(Program("tut_allgather_matmul_bidi", matmul_ref, ag_matmul_bidi_body,
            origin="tutorial: matmul_allgather_overlapped_bidi", **AG))


def rs_matmul_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    return lax.psum_scatter(lhs @ rhs, "i", tiled=True)


def rs_matmul_ring_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    blocks = lhs.reshape(size, -1, lhs.shape[1])
    acc = blocks[(idx + 1) % size] @ rhs
    for k in range(1, size):
        acc = lax.ppermute(acc, "i", _ring(size, -1))
        acc += blocks[(idx + k + 1) % size] @ rhs
    return acc


def rs_matmul_ring_fori_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    blocks = lhs.reshape(size, -1, lhs.shape[1])

    def step(k: jax.Array, acc: jax.Array) -> jax.Array:
        return lax.ppermute(acc, "i", _ring(size, -1)) + blocks[(idx + k + 1) % size] @ rhs

    return lax.fori_loop(1, size, step, blocks[(idx + 1) % size] @ rhs)


def rs_matmul_bidi_body(lhs: jax.Array, rhs: jax.Array) -> jax.Array:
    size, idx = 8, lax.axis_index("i")
    b = lhs.shape[0] // size // 2

    def lhs_block(k: jax.Array, hi: int) -> jax.Array:
        return lax.dynamic_slice_in_dim(lhs, (2 * k + hi) * b, b, 0)

    lo = lhs_block((idx - 1) % size, 0) @ rhs
    hi = lhs_block((idx + 1) % size, 1) @ rhs
    for k in range(1, size):
        lo = lax.ppermute(lo, "i", _ring(size, 1))
        hi = lax.ppermute(hi, "i", _ring(size, -1))
        lo += lhs_block((idx - k - 1) % size, 0) @ rhs
        hi += lhs_block((idx + k + 1) % size, 1) @ rhs
    return jnp.concatenate([lo, hi])


RS = dict(mesh=M8, in_specs=(P(None, "i"), P("i", None)), out_specs=P("i", None), inputs=(f32(16, 32), f32(32, 8)))
add(Program("tut_psumscatter_matmul", matmul_ref, rs_matmul_body, origin="tutorial: matmul_psumscatter", **RS))
add(Program("tut_psumscatter_matmul_ring", matmul_ref, rs_matmul_ring_body,
            origin="tutorial: matmul_psumscatter_overlapped", **RS))
add(Program("tut_psumscatter_matmul_ring_fori", matmul_ref, rs_matmul_ring_fori_body,
            origin="tutorial: matmul_psumscatter_overlapped as fori_loop", **RS))
add(Program("tut_psumscatter_matmul_bidi", matmul_ref, rs_matmul_bidi_body,
            origin="tutorial: matmul_psumscatter_overlapped_bidi", **RS))

# ------------------------------------------------------------------------------------- neural networks


def predict(params: Params, x: jax.Array) -> jax.Array:
    for w, b in params:
        out = jnp.dot(x, w) + b
        x = jax.nn.relu(out)
    return out


def loss_ref(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, targets = batch
    return jnp.mean(jnp.sum((predict(params, inputs) - targets) ** 2, axis=-1))


def loss_dp_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    return lax.pmean(loss_ref(params, batch), "batch")


def loss_dp_psum_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    return lax.psum(loss_ref(params, batch), "batch")  # BUG: the mean of the local means is pmean, not psum


def _mlp(sizes: list[int]) -> list[tuple[Any, Any]]:
    return [(f32(m, n), f32(n)) for m, n in itertools.pairwise(sizes)]


DP_INPUTS = (_mlp([8, 16, 16, 4]), (f32(16, 8), f32(16, 4)))
add(Program("tut_loss_dp", loss_ref, loss_dp_body, M8B, (P(), P("batch")), P(), DP_INPUTS,
            "tutorial: 8-way data parallelism"))
add(Program("tut_loss_dp_BUG_psum", loss_ref, loss_dp_psum_body, M8B, (P(), P("batch")), P(), DP_INPUTS,
            "tutorial: 8-way data parallelism", bug=True))


def predict_fsdp(params: Params, x: jax.Array) -> jax.Array:
    for w_frag, b_frag in params:
        w = lax.all_gather(w_frag, "batch", tiled=True)
        b = lax.all_gather(b_frag, "batch", tiled=True)
        out = jnp.dot(x, w) + b
        x = jax.nn.relu(out)
    return out


def loss_fsdp_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, targets = batch
    local = jnp.mean(jnp.sum((predict_fsdp(params, inputs) - targets) ** 2, axis=-1))
    return lax.pmean(local, "batch")


def loss_fsdp_remat_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, targets = batch
    remat_predict = jax.remat(predict_fsdp, policy=lambda prim, *_, **__: str(prim) != "all_gather")
    local = jnp.mean(jnp.sum((remat_predict(params, inputs) - targets) ** 2, axis=-1))
    return lax.pmean(local, "batch")


FSDP_INPUTS = (_mlp([8, 16, 8]), (f32(16, 8), f32(16, 8)))
add(Program("tut_loss_fsdp", loss_ref, loss_fsdp_body, M8B, (P("batch"), P("batch")), P(), FSDP_INPUTS,
            "tutorial: FSDP"))
add(Program("tut_loss_fsdp_remat", loss_ref, loss_fsdp_remat_body, M8B, (P("batch"), P("batch")), P(),
            FSDP_INPUTS, "tutorial: FSDP with jax.remat policy"))

M8F = (("feats", 8),)


def gemm_tp_ref(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return x @ w + b


def gemm_tp_body(x: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    return lax.psum_scatter(jnp.dot(x, w), "feats", scatter_dimension=1, tiled=True) + b


add(Program("tut_gemm_tp", gemm_tp_ref, gemm_tp_body, M8F, (P(None, "feats"), P("feats", None), P("feats")),
            P(None, "feats"), (f32(4, 32), f32(32, 16), f32(16)), "tutorial: gemm_tp"))


def loss_tp_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, targets = batch
    for w, b in params:
        out = gemm_tp_body(inputs, w, b)
        inputs = jax.nn.relu(out)
    sq = lax.psum(jnp.sum((out - targets) ** 2, axis=-1), "feats")  # features are split: sum them up
    return jnp.mean(sq)


add(Program("tut_loss_tp", loss_ref, loss_tp_body, M8F, ([(P("feats", None), P("feats"))] * 2,
                                                         (P(None, "feats"), P(None, "feats"))),
            P(), (_mlp([16, 16, 8]), (f32(4, 16), f32(4, 8))), "tutorial: tensor parallelism (loss_tp)"))


def loss_fsdp_tp_body(params: Params, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    inputs, targets = batch
    for w_frag, b_frag in params:
        w = lax.all_gather(w_frag, "batch", tiled=True)
        b = lax.all_gather(b_frag, "batch", tiled=True)
        out = lax.psum_scatter(jnp.dot(inputs, w), "feats", scatter_dimension=1, tiled=True) + b
        inputs = jax.nn.relu(out)
    sq = lax.psum(jnp.sum((out - targets) ** 2, axis=-1), "feats")
    return lax.pmean(jnp.mean(sq), "batch")


M42BF = (("batch", 4), ("feats", 2))
add(Program("tut_loss_fsdp_tp", loss_ref, loss_fsdp_tp_body, M42BF, (P(("feats", "batch")), P("batch", "feats")),
            P(), (_mlp([8, 16, 8]), (f32(8, 8), f32(8, 8))), "tutorial: FSDP + TP"))

# -------------------------------------------------------------------------------------- SPMD pipeline

S, L, MB, F = 8, 8, 2, 4  # stages, inner layers, microbatch size, features; batch 16 = 8 microbatches
K = 16 // MB // S  # microbatches per stage


def _layer(wb: tuple[jax.Array, jax.Array], x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ wb[0] + wb[1])


def pipeline_ref(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    (w0, b0), (ws, bs), (wl, bl) = params
    inputs, targets = batch
    x = jax.nn.relu(inputs @ w0 + b0)
    for k in range(L):
        x = _layer((ws[k], bs[k]), x)
    pred = x @ wl + bl
    return jnp.mean(jnp.sum((pred - targets) ** 2, axis=-1))


def _pipeline(stage_params: tuple[jax.Array, jax.Array], inputs: jax.Array) -> jax.Array:
    stage = lax.axis_index("stages")
    sh = partial(lax.ppermute, axis_name="stages", perm=_ring(S, 1))
    outputs = jnp.zeros_like(inputs) * jnp.nan
    state = jnp.zeros((L // S, MB, F)) * jnp.nan
    for i in range(K * S + L - 1):
        state = state.at[0].set(jnp.where(stage == 0, inputs[i % K], state[0]))
        state = jax.vmap(_layer)(stage_params, state)
        outputs = outputs.at[(i - L + 1) % K].set(jnp.where(stage == S - 1, state[-1], outputs[(i - L + 1) % K]))
        state = jnp.roll(state, +1, axis=0).at[0].set(sh(state[-1]))
        if i % K == (-1 % K):
            inputs = sh(inputs)
        if (i - L + 1) % K == (-1 % K):
            outputs = sh(outputs)
    return sh(outputs)


def pipeline_body(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    (w0, b0), inner, (wl, bl) = params
    inputs, targets = batch
    x = jax.nn.relu(inputs.reshape(K, MB, -1) @ w0 + b0)
    pred = (_pipeline(inner, x) @ wl + bl).reshape(K * MB, -1)
    return lax.pmean(jnp.mean(jnp.sum((pred - targets) ** 2, axis=-1)), "stages")


M8S = (("stages", S),)
add(Program("tut_spmd_pipeline", pipeline_ref, pipeline_body, M8S, ((P(), P("stages"), P()), P("stages")), P(),
            (((f32(8, F), f32(F)), (f32(L, F, F), f32(L, F)), (f32(F, 4), f32(4))), (f32(16, 8), f32(16, 4))),
            "tutorial: SPMD pipeline (GPipe)"))
