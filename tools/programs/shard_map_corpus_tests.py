"""shard_map corpus, part 2: the computations JAX's tests/shard_map_test.py checks, as reference pairs.

Each test's shard_map computation is re-expressed as a plain jnp reference of what the test asserts (or,
for "doesn't crash" tests, of what the body computes block by block) and the body; meshes are the test's
2x2x2 `create_inputs` mesh or 1-D/2-D meshes of the 8 fake devices. Covered: identity and all_gather over
one and two axes, psum_scatter of a matmul over one and two axes, axis_index_groups (all_gather,
psum_scatter, all_to_all), ppermute over one and several axes, all_to_all (one axis, two axes, round trip),
axis_index (one and two axes), pmin/pmax, repeated psum, scan/while/cond/switch replication tests,
in_specs None, a static argument, conv as a dot, cumsum, jit(relu) and erf inside the body, a constant
dynamic_slice, argmax, histogram, lax.map(inv), and cases of the systematic test's FunSpecs (transpose,
ravel, flip, dot, sin_dot_sin, relu) under various specs.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from programs.shard_map_corpus_spec import M8, M8X, M24, M42, M42XY, M222, P, Program, b8, f32, i32

PROGRAMS: list[Program] = []
add = PROGRAMS.append


def identity(x: jax.Array) -> jax.Array:
    return x


def _ring(n: int, d: int) -> list[tuple[int, int]]:
    return [(k, (k + d) % n) for k in range(n)]


# ----------------------------------------------------------------------- create_inputs (2x2x2) tests

add(Program("smt_identity", identity, identity, M222, (P("z", ("x", "y")),), P("z", ("x", "y")), (f32(8, 8),),
            "shard_map_test: test_identity"))


def all_gather_body(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    return lax.all_gather(a, "z", axis=0, tiled=True), lax.all_gather(a, ("x", "y"), axis=-1, tiled=True)


add(Program("smt_all_gather", lambda a: (jnp.tile(a, (2, 1)), jnp.tile(a, (1, 4))), all_gather_body, M222,
            (P("z", ("x", "y")),), P("z", ("x", "y")), (f32(8, 8),), "shard_map_test: test_all_gather"))


def matmul_rs_ref(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = a @ b
    return c, c[:4] + c[4:]


def matmul_rs_body(a: jax.Array, b: jax.Array) -> tuple[jax.Array, jax.Array]:
    c = jnp.matmul(a, b)  # rows split over "z", partial over "y"
    return (lax.psum_scatter(c, "y", scatter_dimension=0, tiled=True),
            lax.psum_scatter(c, ("z", "y"), scatter_dimension=0, tiled=True))


add(Program("smt_matmul_reduce_scatter", matmul_rs_ref, matmul_rs_body, M222, (P("z", "y"), P("y", None)),
            P(("z", "y"), None), (f32(8, 8), f32(8, 8)), "shard_map_test: test_matmul_reduce_scatter"))


def rs_groups_ref(a: jax.Array) -> jax.Array:
    parity = (a[:, 0::2].sum(1), a[:, 1::2].sum(1))  # the groups sum the even and the odd columns
    return jnp.stack([parity[d % 2].reshape(4, 2)[d // 2] for d in range(8)], axis=1)


def rs_groups_body(a: jax.Array) -> jax.Array:
    return lax.psum_scatter(a, ("x", "y", "z"), scatter_dimension=0, tiled=True,
                            axis_index_groups=((0, 2, 4, 6), (1, 3, 5, 7)))


add(Program("smt_reduce_scatter_groups", rs_groups_ref, rs_groups_body, M222, (P(None, ("x", "y", "z")),),
            P(None, ("x", "y", "z")), (f32(8, 8),), "shard_map_test: test_reduce_scatter_with_axis_index_groups"))


def ag_groups_ref(a: jax.Array) -> jax.Array:
    return jnp.repeat(a.reshape(8, 2, 4), 2, axis=1).reshape(8, 16)


def ag_groups_body(a: jax.Array) -> jax.Array:
    return lax.all_gather(a, ("y", "z"), axis_index_groups=((0, 1), (2, 3)), axis=-1, tiled=True)


add(Program("smt_all_gather_groups", ag_groups_ref, ag_groups_body, M222, (P("x", ("y", "z")),),
            P("x", ("y", "z")), (f32(8, 8),), "shard_map_test: test_all_gather_with_axis_index_groups"))

# ---------------------------------------------------------------------------------------- ppermute


def permute_ref(a: jax.Array) -> jax.Array:
    return jnp.roll(a.reshape(8, 1, 8), 1, axis=0).reshape(8, 8)


add(Program("smt_collective_permute_int", permute_ref, lambda a: lax.ppermute(a, "x", _ring(8, 1)), M8X,
            (P("x", None),), P("x", None), (i32(8, 8),), "shard_map_test: test_collective_permute"))


def _unblock(t: jax.Array) -> jax.Array:
    return t.transpose(0, 3, 1, 2, 4).reshape(4, 16)


def permute_multi_ref(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    blocks = a.reshape(2, 2, 2, 2, 4).transpose(0, 2, 3, 1, 4)  # [x, y, z, row, col]
    c = jnp.roll(blocks.reshape(4, 2, 2, 4), 1, axis=0).reshape(2, 2, 2, 2, 4)  # over (x, y) jointly
    d = jnp.roll(blocks.reshape(2, 4, 2, 4), 1, axis=1).reshape(2, 2, 2, 2, 4)  # over (y, z) jointly
    return _unblock(c), _unblock(d)


def permute_multi_body(a: jax.Array) -> tuple[jax.Array, jax.Array]:
    return lax.ppermute(a, ("x", "y"), _ring(4, 1)), lax.ppermute(a, ("y", "z"), _ring(4, 1))


add(Program("smt_permute_multi_axis", permute_multi_ref, permute_multi_body, M222, (P("x", ("y", "z")),),
            P("x", ("y", "z")), (f32(4, 16),), "shard_map_test: test_collective_permute_with_multiple_axis_names"))

# -------------------------------------------------------------------------------------- all_to_all


def a2a_body(axes: Any) -> Any:
    return lambda a: lax.all_to_all(a, axes, split_axis=1, concat_axis=1, tiled=True)


add(Program("smt_all_to_all", lambda a: a.T.reshape(1, 64), a2a_body("x"), M8X, (P("x", None),), P(None, "x"),
            (f32(8, 8),), "shard_map_test: test_all_to_all (one axis)"))
add(Program("smt_all_to_all_two_axes", lambda a: a.T.reshape(1, 64), a2a_body(("x", "y")), M42XY,
            (P(("x", "y"), None),), P(None, ("x", "y")), (f32(8, 8),), "shard_map_test: test_all_to_all (two axes)"))
add(Program("smt_all_to_all_roundtrip", identity, lambda a: lax.all_to_all(a, "x", 1, 0, tiled=True), M8X,
            (P("x", None),), P(None, "x"), (f32(16, 8),), "shard_map_test: test_all_to_all_grad"))


def a2a_groups_ref(a: jax.Array) -> jax.Array:
    return a.reshape(4, 2, 2, 4).transpose(1, 0, 2, 3).reshape(2, 32)


def a2a_groups_body(a: jax.Array) -> jax.Array:
    return lax.all_to_all(a, "x", split_axis=1, concat_axis=0, tiled=True,
                          axis_index_groups=((0, 1), (2, 3), (4, 5), (6, 7)))


add(Program("smt_all_to_all_groups", a2a_groups_ref, a2a_groups_body, M8X, (P("x", None),), P(None, "x"),
            (f32(8, 8),), "shard_map_test: test_all_to_all_with_axis_index_groups"))

# ----------------------------------------------------------------------------------- axis_index


add(Program("smt_axis_index", lambda: jnp.arange(8, dtype=jnp.int32), lambda: lax.axis_index("i")[None], M8, (),
            P("i"), (), "shard_map_test: test_axis_index_basic"))


def axis_index_two_ref() -> tuple[jax.Array, jax.Array, jax.Array]:
    return (jnp.broadcast_to(jnp.arange(4, dtype=jnp.int32)[:, None], (4, 2)),
            jnp.broadcast_to(jnp.arange(2, dtype=jnp.int32)[None, :], (4, 2)),
            jnp.arange(8, dtype=jnp.int32).reshape(4, 2))


def axis_index_two_body() -> tuple[jax.Array, jax.Array, jax.Array]:
    return (lax.axis_index("i")[None, None], lax.axis_index("j")[None, None],
            lax.axis_index(("i", "j"))[None, None])


add(Program("smt_axis_index_two_axes", axis_index_two_ref, axis_index_two_body, M42, (), P("i", "j"), (),
            "shard_map_test: test_axis_index_twoaxes"))

# ---------------------------------------------------------------------------- reductions over devices

add(Program("smt_pmin", lambda x: x.reshape(8, 2).min(0), lambda x: lax.pmin(x, "i"), M8, (P("i"),), P(),
            (f32(16),), "shard_map_test: test_pmin"))
add(Program("smt_pmax", lambda x: x.reshape(8, 2).max(0), lambda x: lax.pmax(x, "i"), M8, (P("i"),), P(),
            (f32(16),), "shard_map_test: test_pmax"))
add(Program("smt_repeated_psum", lambda x: 8 * x.reshape(8, 2).sum(0), lambda x: lax.psum(lax.psum(x, "i"), "i"),
            M8, (P("i"),), P(), (f32(16),), "shard_map_test: test_repeated_psum_allowed"))

# ----------------------------------------------------------------- control flow replication tests


def _sums(x: jax.Array, y: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per block: x replicated, y split over "x", z split over ("x", "y"); as 8 values in (x, y) order."""
    return jnp.full(8, x.sum()), jnp.repeat(y.reshape(2, -1).sum(1), 4), z.reshape(8, -1).sum(1)


def scan_rotate_ref(x: jax.Array, y: jax.Array, z: jax.Array) -> tuple[jax.Array, ...]:
    a, b, c = _sums(x, y, z)
    return b, c, a  # four rotations of a 3-tuple are one


def scan_rotate_body(x: jax.Array, y: jax.Array, z: jax.Array) -> list[jax.Array]:
    def step(c: tuple[jax.Array, ...], _: Any) -> tuple[tuple[jax.Array, ...], None]:
        first, *rest = c
        return (*rest, first), None

    out, _ = lax.scan(step, (x.sum(), y.sum(), z.sum()), None, length=4)
    return [jnp.expand_dims(a, 0) for a in out]


def while_rotate_ref(x: jax.Array, y: jax.Array, z: jax.Array) -> tuple[jax.Array, ...]:
    a, b, c = _sums(x, y, z)
    return c, a, b  # five rotations are two


def while_rotate_body(x: jax.Array, y: jax.Array, z: jax.Array) -> list[jax.Array]:
    def body(c: tuple[Any, ...]) -> tuple[Any, ...]:
        i, first, *rest = c
        return (i + 1, *rest, first)

    _, *out = lax.while_loop(lambda c: c[0] < 5, body, (0, x.sum(), y.sum(), z.sum()))
    return [jnp.expand_dims(a, 0) for a in out]


ROT = dict(mesh=M24, in_specs=(P(None), P("x"), P(("x", "y"))), out_specs=P(("x", "y")),
           inputs=(f32(8), f32(8), f32(8)))
add(Program("smt_scan_rotate_carry", scan_rotate_ref, scan_rotate_body, origin="shard_map_test: test_scan_rep_rule",
            **ROT))
add(Program("smt_while_rotate_carry", while_rotate_ref, while_rotate_body,
            origin="shard_map_test: test_while_rep_rule", **ROT))


def cond_block_ref(x: jax.Array, y: jax.Array) -> jax.Array:
    xb = x.reshape(2, 2)
    return jnp.where(jnp.any(xb > 0, axis=1, keepdims=True), xb, xb + 1).reshape(4)


def cond_block_body(x: jax.Array, y: jax.Array) -> jax.Array:
    return lax.cond(jnp.any(x > 0), lambda a, _: a, lambda a, _: a + 1, x, y)


def cond_other_ref(x: jax.Array, y: jax.Array) -> jax.Array:
    xb = x.reshape(2, 1, 2)
    pred = jnp.any(y.reshape(4, 2) > 0, axis=1)[None, :, None]
    return jnp.where(pred, xb, xb + 1).reshape(16)


def cond_other_body(x: jax.Array, y: jax.Array) -> jax.Array:
    return lax.cond(jnp.any(y > 0), lambda a, _: a, lambda a, _: a + 1, x, y)


add(Program("smt_cond_on_block", cond_block_ref, cond_block_body, M24, (P("x"), P("y")), P("x"), (i32(4), i32(8)),
            "shard_map_test: test_cond_rep_rule (predicate of the block)"))
add(Program("smt_cond_on_other_input", cond_other_ref, cond_other_body, M24, (P("x"), P("y")), P(("x", "y")),
            (i32(4), i32(8)), "shard_map_test: test_cond_rep_rule (predicate of another input)"))


def cond_any_bool_ref(a: jax.Array) -> jax.Array:
    return jnp.repeat(a.reshape(8, 2).any(1).astype(jnp.int32), 2)


def cond_any_bool_body(a: jax.Array) -> jax.Array:
    c = lax.cond(jnp.any(a), lambda: jnp.int32(1), lambda: jnp.int32(0))
    return jnp.broadcast_to(c, a.shape)


add(Program("smt_cond_any_bool", cond_any_bool_ref, cond_any_bool_body, M8X, (P("x"),), P("x"), (b8(16),),
            "shard_map_test: test_cond_rep_rule (issue 24418)"))

BRANCHES = [lambda a, _: a, lambda a, _: a + 1, lambda a, _: a + 2]
add(Program("smt_switch", lambda n, x, y: lax.switch(n, BRANCHES, x, y), lambda n, x, y: lax.switch(n, BRANCHES, x, y),
            M24, (P(), P("x"), P("y")), P("x"), (i32(), f32(8), f32(8)), "shard_map_test: test_switch_rep_rule"))

# ------------------------------------------------------------------------------------ odds and ends

add(Program("smt_in_spec_none_sin", jnp.sin, jnp.sin, M42, (P("i"),), P("i"), (f32(8, 2),),
            "shard_map_test: test_in_spec_none"))
add(Program("smt_static_arg_add_ones", lambda x: x + 1, lambda x: x + jnp.ones(x.shape, x.dtype), M24,
            (P("x", "y"),), P("x", "y"), (f32(8, 8),), "shard_map_test: test_with_static_arg"))


def matmul_ref(x: jax.Array, y: jax.Array) -> jax.Array:
    return x @ y


def conv_dot(x: jax.Array, y: jax.Array) -> jax.Array:
    return lax.conv_general_dilated(x, y, window_strides=(), padding="VALID", dimension_numbers=("NC", "IO", "NC"))


add(Program("smt_conv_as_dot", matmul_ref, lambda x, y: lax.psum(conv_dot(x, y), "i"), M8,
            (P(None, "i"), P("i", None)), P(None, None), (f32(16, 32), f32(32, 8)),
            "shard_map_test: test_conv_general_dilated"))
add(Program("smt_cumsum_blockwise", lambda x: jnp.cumsum(x.reshape(8, -1), axis=1).reshape(-1), jnp.cumsum, M8,
            (P("i"),), P("i"), (f32(32),), "shard_map_test: test_cumsum"))
add(Program("smt_jit_relu", jax.nn.relu, jax.jit(jax.nn.relu), M8, (P("i"),), P("i"), (f32(16),),
            "shard_map_test: test_custom_jvp_inside_jit"))
add(Program("smt_erf", lax.erf, lax.erf, M8, (P("i"),), P("i"), (f32(16),), "shard_map_test: test_erf_rules"))
add(Program("smt_dynamic_slice_const", lambda x: x.reshape(8, 4)[:, 1:3].reshape(-1),
            lambda x: lax.dynamic_slice_in_dim(x, jnp.array(1, dtype=jnp.int32), 2), M8X, (P("x"),), P("x"),
            (f32(32),), "shard_map_test: test_dynamic_slice_transpose"))
add(Program("smt_argmax_blockwise", lambda x: x.reshape(8, 4, 4).argmax(-1).astype(jnp.int32),
            lambda x: x.argmax(axis=-1, keepdims=True).astype(jnp.int32), M24, (P("x", "y"),), P("x", "y"),
            (f32(8, 16),), "shard_map_test: test_argmax_pvary"))


def histogram(x: jax.Array, edges: jax.Array) -> jax.Array:
    hist, _ = jax.vmap(lambda q: jnp.histogram(q, bins=jnp.sort(edges)))(x)
    return hist


add(Program("smt_histogram", histogram, histogram, M8, (P("i"), P()), P("i"), (f32(8, 4, 2), f32(11)),
            "shard_map_test: test_jnp_histogram"))


def inv_map(x: jax.Array) -> jax.Array:
    return lax.map(jnp.linalg.inv, x + 4.0 * jnp.eye(x.shape[-1]))  # well conditioned


add(Program("smt_linalg_inv_map", inv_map, inv_map, M8X, (P("x"),), P("x"), (f32(8, 5, 5),),
            "shard_map_test: test_linalg_inv"))

# ----------------------------------------------------- ShardMapSystematicTest's FunSpecs, chosen specs

add(Program("sys_transpose", lambda x: x.T, lambda x: x.T, M42, (P("i", "j"),), P("j", "i"), (f32(8, 4),),
            "shard_map_test: FunSpec transpose"))
add(Program("sys_ravel", lambda x: x.ravel(), lambda x: x.ravel(), M42, (P("i", None),), P("i"), (f32(8, 4),),
            "shard_map_test: FunSpec ravel"))
add(Program("sys_flip", lambda x, y: (y, x), lambda x, y: (y, x), M42, (P("i"), P(None, "j")),
            (P(None, "j"), P("i")), (f32(8), f32(3, 4)), "shard_map_test: FunSpec flip"))
add(Program("sys_dot", matmul_ref, jnp.dot, M42, (P("i", None), P(None, "j")), P("i", "j"), (f32(8, 6), f32(6, 4)),
            "shard_map_test: FunSpec dot"))
add(Program("sys_sin_dot_sin", lambda a, b: jnp.sin(jnp.dot(jnp.sin(a), b)),
            lambda a, b: jnp.sin(jnp.dot(jnp.sin(a), b)), M42, (P("j", None), P(None, "i")), P("j", "i"),
            (f32(4, 6), f32(6, 8)), "shard_map_test: FunSpec sin_dot_sin"))
add(Program("sys_relu", lambda x: jax.nn.relu(x + 1) - 1, lambda x: jax.nn.relu(x + 1) - 1, M42,
            (P(None, ("i", "j")),), P(None, ("i", "j")), (f32(4, 8),), "shard_map_test: FunSpec relu"))
add(Program("sys_id_replicated_tiled_out", lambda x: jnp.tile(x, 4), identity, M42, (P(),), P("i"), (f32(3),),
            "shard_map_test: FunSpec id (replicated in, tiled out)"))
add(Program("sys_id_block_transpose", lambda x: x.reshape(4, 2, 2).transpose(1, 0, 2).reshape(-1), identity, M42,
            (P(("i", "j")),), P(("j", "i")), (f32(16),), "shard_map_test: FunSpec id (axes reordered in out_specs)"))
