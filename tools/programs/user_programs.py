"""Programs written the way a JAX engineer would, none shaped after a fixture: GSPMD/Shardy jits and
hand-written shard_maps on a 2 x 4 (dp, tp), 8-device or 2 x 2 x 2 mesh, each checked with
`scalify_hlo.jax.check` or `check_shard_map`. `EXPECTED` says the verdict each must keep (every one was
also run by JAX: the bug twins compute something else). `tests/test_user_programs_slow.py` runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from scalify_hlo.jax import check, check_shard_map
from scalify_hlo.report.verdicts import Report

f32, bf16, i32 = jnp.float32, jnp.bfloat16, jnp.int32
PROGRAMS: dict[str, Callable[[], Report]] = {}
EXPECTED: dict[str, str] = {}


def S(*shape_and_dtype: Any) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape_and_dtype[:-1], shape_and_dtype[-1])


def _meshes() -> tuple[jax.sharding.Mesh, jax.sharding.Mesh, jax.sharding.Mesh]:
    auto = AxisType.Auto
    return (jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(auto,) * 2),
            jax.make_mesh((8,), ("x",), axis_types=(auto,)),
            jax.make_mesh((2, 2, 2), ("dp", "fsdp", "tp"), axis_types=(auto,) * 3))


def program(expected: str = "equivalent") -> Callable[[Callable[..., Report]], Callable[..., Report]]:
    def register(fn: Callable[..., Report]) -> Callable[..., Report]:
        PROGRAMS[fn.__name__] = lambda: fn(*_meshes())
        EXPECTED[fn.__name__] = expected
        return fn
    return register


def _n(mesh: jax.sharding.Mesh, *spec: Any) -> NamedSharding:
    return NamedSharding(mesh, P(*spec))


@program()
def dot_product_attention_heads(m: Any, m8: Any, m3: Any) -> Report:
    def f(q: Any, k: Any, v: Any) -> Any:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    sh = _n(m, "dp", None, "tp", None)
    return check(f, *(S(2, 8, 4, 8, f32),) * 3, in_shardings=(sh, sh, sh), out_shardings=sh)


@program()
def cross_entropy_take_along_vocab_split(m: Any, m8: Any, m3: Any) -> Report:
    def f(logits: Any, labels: Any) -> Any:
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits, -1), labels[:, None], axis=-1))
    return check(f, S(8, 32, f32), S(8, i32), in_shardings=(_n(m, "dp", "tp"), _n(m, "dp")), out_shardings=_n(m))


@program()
def layernorm_hidden_split(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, g: Any) -> Any:
        return (x - x.mean(-1, keepdims=True)) / jnp.sqrt(x.var(-1, keepdims=True) + 1e-5) * g
    return check(f, S(8, 16, f32), S(16, f32), in_shardings=(_n(m, "dp", "tp"), _n(m, "tp")),
                 out_shardings=_n(m, "dp", "tp"))


@program()
def int8_matmul_per_channel_scales(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, wq: Any, scale: Any) -> Any:
        xs = jnp.max(jnp.abs(x), axis=-1, keepdims=True) / 127.0
        acc = jax.lax.dot(jnp.round(x / xs).astype(jnp.int8), wq, preferred_element_type=jnp.int32)
        return acc.astype(f32) * xs * scale
    return check(f, S(8, 16, f32), S(16, 32, jnp.int8), S(32, f32),
                 in_shardings=(_n(m, "dp"), _n(m, None, "tp"), _n(m, "tp")), out_shardings=_n(m, "dp", "tp"))


@program()
def t5_relative_position_bias(m: Any, m8: Any, m3: Any) -> Report:
    def f(q: Any, k: Any, table: Any) -> Any:
        s = q.shape[1]
        rel = jnp.clip(jnp.arange(s)[None, :] - jnp.arange(s)[:, None], -4, 4) + 4
        sc = jnp.einsum("bqhd,bkhd->bhqk", q, k) + table[rel].transpose(2, 0, 1)[None]
        return jax.nn.softmax(sc, -1)
    sh = _n(m, "dp", None, "tp")
    return check(f, S(2, 8, 4, 8, f32), S(2, 8, 4, 8, f32), S(9, 4, f32), in_shardings=(sh, sh, _n(m, None, "tp")),
                 out_shardings=_n(m, "dp", "tp"))


@program()
def remat_policy_grads(m: Any, m8: Any, m3: Any) -> Report:
    @partial(jax.checkpoint, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def layer(w: Any, x: Any) -> Any:
        return jax.nn.gelu(x @ w)

    def loss(ws: Any, x: Any) -> Any:
        for w in ws:
            x = layer(w, x)
        return jnp.sum(x ** 2)
    return check(jax.grad(loss), [S(16, 16, f32)] * 2, S(8, 16, f32),
                 in_shardings=([_n(m, None, "tp")] * 2, _n(m, "dp")), out_shardings=[_n(m, None, "tp")] * 2)


@program()
def fsdp_by_hand(m: Any, m8: Any, m3: Any) -> Report:
    def ref(w: Any, x: Any) -> Any:
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    def impl(w: Any, x: Any) -> Any:
        full = jax.lax.all_gather(w, "x", axis=0, tiled=True)
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(full)
        return jax.lax.psum_scatter(g, "x", scatter_dimension=0, tiled=True)
    return check_shard_map(ref, impl, S(16, 8, f32), S(16, 16, f32), mesh=m8, in_specs=(P("x"), P("x")),
                           out_specs=P("x"))


@program("discrepancy")
def fsdp_by_hand_without_reduce_scatter(m: Any, m8: Any, m3: Any) -> Report:
    def ref(w: Any, x: Any) -> Any:
        return jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)

    def impl(w: Any, x: Any) -> Any:
        full = jax.lax.all_gather(w, "x", axis=0, tiled=True)
        return jnp.split(jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(full), 8, axis=0)[0]
    return check_shard_map(ref, impl, S(16, 8, f32), S(16, 16, f32), mesh=m8, in_specs=(P("x"), P("x")),
                           out_specs=P("x"))


def _causal(q: Any, k: Any, v: Any) -> Any:
    m = jnp.arange(q.shape[0])[:, None] >= jnp.arange(k.shape[0])[None, :]
    return jax.nn.softmax(jnp.where(m, q @ k.T, -jnp.inf), -1) @ v


def _sp_attention(offset: bool) -> Callable[..., Any]:
    def impl(q: Any, k: Any, v: Any) -> Any:
        kf, vf = jax.lax.all_gather(k, "x", tiled=True), jax.lax.all_gather(v, "x", tiled=True)
        rows = jnp.arange(q.shape[0])[:, None] + (jax.lax.axis_index("x") * q.shape[0] if offset else 0)
        return jax.nn.softmax(jnp.where(rows >= jnp.arange(kf.shape[0])[None, :], q @ kf.T, -jnp.inf), -1) @ vf
    return impl


@program()
def sequence_parallel_attention(m: Any, m8: Any, m3: Any) -> Report:
    return check_shard_map(_causal, _sp_attention(True), *(S(32, 8, f32),) * 3, mesh=m8, in_specs=(P("x"),) * 3,
                           out_specs=P("x"))


@program("discrepancy")
def sequence_parallel_attention_without_offset(m: Any, m8: Any, m3: Any) -> Report:
    return check_shard_map(_causal, _sp_attention(False), *(S(32, 8, f32),) * 3, mesh=m8, in_specs=(P("x"),) * 3,
                           out_specs=P("x"))


def _rope(x: Any, pos: Any) -> Any:
    d = x.shape[-1] // 2
    ang = pos[:, None] / (10000 ** (jnp.arange(d) / d))[None, :]
    x1, x2 = x[..., :d], x[..., d:]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang), x1 * jnp.sin(ang) + x2 * jnp.cos(ang)], -1)


@program()
def rope_sequence_parallel(m: Any, m8: Any, m3: Any) -> Report:
    def impl(x: Any) -> Any:
        return _rope(x, (jnp.arange(x.shape[0]) + jax.lax.axis_index("x") * x.shape[0]).astype(f32))
    return check_shard_map(lambda x: _rope(x, jnp.arange(x.shape[0], dtype=f32)), impl, S(32, 8, f32), mesh=m8,
                           in_specs=(P("x"),), out_specs=P("x"))


@program()
def per_example_gradient_clipping(m: Any, m8: Any, m3: Any) -> Report:
    def f(w: Any, x: Any, y: Any) -> Any:
        g = jax.vmap(jax.grad(lambda w, x, y: jnp.sum((jnp.tanh(x @ w) - y) ** 2)), (None, 0, 0))(w, x, y)
        g = g / jnp.maximum(jnp.sqrt(jnp.sum(g ** 2, axis=(1, 2))), 1.0)[:, None, None]
        return w - 0.1 * g.mean(0)
    return check(f, S(8, 4, f32), S(16, 8, f32), S(16, 4, f32), in_shardings=(_n(m), _n(m, "dp"), _n(m, "dp")),
                 out_shardings=_n(m))


@program()
def explicit_axes_reshard(m: Any, m8: Any, m3: Any) -> Report:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Explicit,) * 2)

    def f(x: Any, w: Any) -> Any:
        return jax.sharding.reshard(jnp.tanh(jnp.dot(x, w, out_sharding=P("dp", "tp"))), P("dp", None))
    with jax.set_mesh(mesh):
        return check(f, jax.ShapeDtypeStruct((8, 16), f32, sharding=_n(mesh, "dp")),
                     jax.ShapeDtypeStruct((16, 8), f32, sharding=_n(mesh, None, "tp")))


@program()
def train_step_on_a_3d_mesh(m: Any, m8: Any, m3: Any) -> Report:
    def loss(p: Any, x: Any, y: Any) -> Any:
        return jnp.mean(((jax.nn.silu(x @ p["wg"]) * (x @ p["wu"])) @ p["wd"] - y) ** 2)

    def step(p: Any, x: Any, y: Any) -> Any:
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, jax.grad(loss)(p, x, y))
    params = {"wg": S(16, 32, f32), "wu": S(16, 32, f32), "wd": S(32, 16, f32)}
    psh = {"wg": _n(m3, "fsdp", "tp"), "wu": _n(m3, "fsdp", "tp"), "wd": _n(m3, "tp", "fsdp")}
    batch = _n(m3, ("dp", "fsdp"))
    return check(step, params, S(16, 16, f32), S(16, 16, f32), in_shardings=(psh, batch, batch), out_shardings=psh)


@program()
def context_parallel_attention(m: Any, m8: Any, m3: Any) -> Report:
    def f(q: Any, k: Any, v: Any) -> Any:
        s = q.shape[1]
        sc = jnp.where(jnp.tril(jnp.ones((s, s), bool)), jnp.einsum("bqd,bkd->bqk", q, k) / 4.0, -1e9)
        return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(sc, -1), v)
    sh = _n(m3, "dp", ("fsdp", "tp"))
    return check(f, *(S(2, 16, 8, f32),) * 3, in_shardings=(sh, sh, sh), out_shardings=sh)


@program("discrepancy")
def psum_over_one_of_two_contracted_axes(m: Any, m8: Any, m3: Any) -> Report:
    def impl(x: Any, w: Any) -> Any:
        return jax.lax.psum(x @ w, "tp")
    return check_shard_map(lambda x, w: x @ w, impl, S(8, 16, f32), S(16, 8, f32), mesh=m3,
                           in_specs=(P("dp", ("fsdp", "tp")), P(("fsdp", "tp"))), out_specs=P("dp"))


@program()
def dropout_with_a_key(m: Any, m8: Any, m3: Any) -> Report:
    def f(key: Any, x: Any, w: Any) -> Any:
        h = jax.nn.relu(x @ w)
        return jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h / 0.9, 0.0)
    return check(f, jax.ShapeDtypeStruct((), jax.random.key(0).dtype), S(8, 16, f32), S(16, 32, f32),
                 in_shardings=(_n(m), _n(m, "dp"), _n(m, None, "tp")), out_shardings=_n(m, "dp", "tp"))


@program()
def collective_matmul_by_hand(m: Any, m8: Any, m3: Any) -> Report:
    def impl(x: Any, w: Any) -> Any:
        idx, out, block = jax.lax.axis_index("x"), jnp.zeros((x.shape[0], 32), f32), w
        for i in range(8):
            out = jax.lax.dynamic_update_slice(out, x @ block, (0, ((idx - i) % 8) * 4))
            block = jax.lax.ppermute(block, "x", [(j, (j + 1) % 8) for j in range(8)])
        return out
    return check_shard_map(lambda x, w: x @ w, impl, S(64, 64, f32), S(64, 32, f32), mesh=m8,
                           in_specs=(P("x"), P(None, "x")), out_specs=P("x"))


def _optax_step(m: Any, tx: optax.GradientTransformation) -> Report:
    shapes = {"w1": (16, 32), "b1": (32,), "w2": (32, 8)}
    psh = {"w1": _n(m, "dp", "tp"), "b1": _n(m, "tp"), "w2": _n(m, "tp", "dp")}
    params = {k: jax.ShapeDtypeStruct(v, f32) for k, v in shapes.items()}
    state = jax.eval_shape(tx.init, params)

    def like_params(path: Any, a: Any) -> NamedSharding:
        keys = {getattr(q, "key", None) for q in path}
        return next((psh[k] for k, v in shapes.items() if a.shape == v and k in keys), _n(m))
    ssh = jax.tree_util.tree_map_with_path(like_params, state)

    def loss(p: Any, x: Any, y: Any) -> Any:
        return optax.softmax_cross_entropy_with_integer_labels(jax.nn.gelu(x @ p["w1"] + p["b1"]) @ p["w2"], y).mean()

    def step(p: Any, s: Any, x: Any, y: Any) -> Any:
        u, s = tx.update(jax.grad(loss)(p, x, y), s, p)
        return optax.apply_updates(p, u), s
    return check(step, params, state, S(16, 16, f32), S(16, i32), in_shardings=(psh, ssh, _n(m, "dp"), _n(m, "dp")),
                 out_shardings=(psh, ssh))


@program()
def optax_lamb(m: Any, m8: Any, m3: Any) -> Report:
    return _optax_step(m, optax.lamb(1e-3))


@program()
def optax_multisteps_adam(m: Any, m8: Any, m3: Any) -> Report:
    return _optax_step(m, optax.MultiSteps(optax.adam(1e-3), every_k_schedule=4))


@program()
def optax_clip_nadamw(m: Any, m8: Any, m3: Any) -> Report:
    return _optax_step(m, optax.chain(optax.clip(1.0), optax.nadamw(1e-3, weight_decay=0.01)))


@program()
def label_smoothing_and_z_loss(m: Any, m8: Any, m3: Any) -> Report:
    def f(logits: Any, y: Any) -> Any:
        smoothed = optax.smooth_labels(jax.nn.one_hot(y, 32), 0.1)
        return optax.softmax_cross_entropy(logits, smoothed).mean() + 1e-4 * jnp.mean(jax.nn.logsumexp(logits, -1) ** 2)
    return check(f, S(16, 32, f32), S(16, i32), in_shardings=(_n(m, "dp", "tp"), _n(m, "dp")), out_shardings=_n(m))


@program()
def flax_nnx_with_partitioning(m: Any, m8: Any, m3: Any) -> Report:
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.initializers.lecun_normal()
            self.up = nnx.Linear(16, 32, kernel_init=nnx.with_partitioning(init, (None, "tp")), rngs=rngs)
            self.down = nnx.Linear(32, 16, kernel_init=nnx.with_partitioning(init, ("tp", None)), rngs=rngs)
            self.norm = nnx.LayerNorm(16, rngs=rngs)

        def __call__(self, x: Any) -> Any:
            return self.norm(x + self.down(nnx.gelu(self.up(x))))
    with jax.set_mesh(m):
        graphdef, state = nnx.split(Block(nnx.Rngs(0)))
    shardings = jax.tree.map(lambda s: NamedSharding(m, s), nnx.get_partition_spec(state),
                             is_leaf=lambda s: isinstance(s, P))
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
    return check(lambda st, x: nnx.merge(graphdef, st)(x), abstract, S(8, 16, f32),
                 in_shardings=(shardings, _n(m, "dp")), out_shardings=_n(m, "dp"))


@program()
def flax_linen_logical_axis_rules(m: Any, m8: Any, m3: Any) -> Report:
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x: Any) -> Any:
            init = nn.initializers.lecun_normal()
            h = nn.Dense(32, kernel_init=nn.with_logical_partitioning(init, ("embed", "mlp")))(x)
            return nn.Dense(16, kernel_init=nn.with_logical_partitioning(init, ("mlp", "embed")))(jax.nn.silu(h))
    block = Block()
    abstract = jax.eval_shape(block.init, jax.random.key(0), jnp.ones((8, 16)))
    with nn.logical_axis_rules((("batch", "dp"), ("mlp", "tp"), ("embed", None))):
        specs = nn.logical_to_mesh(nn.get_partition_spec(abstract))
    shardings = jax.tree.map(lambda s: NamedSharding(m, s), specs, is_leaf=lambda s: isinstance(s, P))
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), nn.unbox(abstract))
    return check(block.apply, params, S(8, 16, f32), in_shardings=(shardings, _n(m, "dp")), out_shardings=_n(m, "dp"))


@program()
def split_fused_gate_up_projection(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, w_gu: Any, w_d: Any) -> Any:
        g, u = jnp.split(x @ w_gu, 2, axis=-1)
        return (jax.nn.silu(g) * u) @ w_d
    return check(f, S(8, 16, f32), S(16, 64, f32), S(32, 16, f32),
                 in_shardings=(_n(m, "dp"), _n(m, None, "tp"), _n(m, "tp")), out_shardings=_n(m, "dp"))


@program()
def causal_conv1d_by_pad_and_slices(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, w: Any) -> Any:
        xp = jnp.pad(x, ((0, 0), (4, 0), (0, 0)))
        return sum(xp[:, k:k + x.shape[1]] * w[k] for k in range(5))
    return check(f, S(2, 64, 8, f32), S(5, 8, f32), in_shardings=(_n(m8, None, "x"), _n(m8)),
                 out_shardings=_n(m8, None, "x"))


@program()
def flip_and_roll_both_ways(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any) -> Any:
        return jnp.flip(x, axis=1) + 0.5 * jnp.roll(x, 3, axis=1) - jnp.roll(x, -1, axis=0)
    return check(f, S(8, 32, f32), in_shardings=(_n(m, "dp", "tp"),), out_shardings=_n(m, "dp", "tp"))


def _ring(n: int, d: int = 1) -> list[tuple[int, int]]:
    return [(i, (i + d) % n) for i in range(n)]


def _stencil(left_perm: list[tuple[int, int]]) -> Callable[..., Any]:
    def impl(x: Any) -> Any:
        up = jnp.concatenate([jax.lax.ppermute(x[-1:], "dp", _ring(2)), x[:-1]], 0)
        down = jnp.concatenate([x[1:], jax.lax.ppermute(x[:1], "dp", _ring(2, -1))], 0)
        left = jnp.concatenate([jax.lax.ppermute(x[:, -1:], "tp", left_perm), x[:, :-1]], 1)
        right = jnp.concatenate([x[:, 1:], jax.lax.ppermute(x[:, :1], "tp", _ring(4, -1))], 1)
        return up + down + left + right - 4 * x
    return impl


def _stencil_ref(x: Any) -> Any:
    return jnp.roll(x, 1, 0) + jnp.roll(x, -1, 0) + jnp.roll(x, 1, 1) + jnp.roll(x, -1, 1) - 4 * x


@program()
def periodic_stencil_on_a_2x4_torus(m: Any, m8: Any, m3: Any) -> Report:
    return check_shard_map(_stencil_ref, _stencil(_ring(4)), S(16, 32, f32), mesh=m, in_specs=(P("dp", "tp"),),
                           out_specs=P("dp", "tp"))


@program("discrepancy")
def periodic_stencil_left_halo_from_the_right(m: Any, m8: Any, m3: Any) -> Report:
    return check_shard_map(_stencil_ref, _stencil(_ring(4, -1)), S(16, 32, f32), mesh=m, in_specs=(P("dp", "tp"),),
                           out_specs=P("dp", "tp"))


@program("discrepancy")
def summa_panels_from_the_wrong_owner(m: Any, m8: Any, m3: Any) -> Report:
    from programs import summa
    return check_shard_map(summa.reference, summa.VARIANTS["wrong_owner"], S(16, 32, f32), S(32, 16, f32), mesh=m,
                           in_specs=(P("dp", "tp"),) * 2, out_specs=P("dp", "tp"))


@program()
def dropout_of_a_3d_activation_split_two_ways(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, key: Any) -> Any:
        return jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x / 0.9, 0.0)
    return check(f, S(4, 8, 16, f32), S(2, jnp.uint32), in_shardings=(_n(m, "dp", "tp"), _n(m)),
                 out_shardings=_n(m, "dp", "tp"))


@program()
def batch_over_two_axes_returned_over_one(m: Any, m8: Any, m3: Any) -> Report:
    return check(lambda x: jnp.tanh(x) * 2.0, S(16, 8, f32), in_shardings=(_n(m, ("dp", "tp")),),
                 out_shardings=_n(m, "tp"))


def _dropout_ref(x: Any, key: Any) -> Any:
    return jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x / 0.9, 0.0)


@program()
def dropout_mask_sliced_per_shard(m: Any, m8: Any, m3: Any) -> Report:
    def impl(x: Any, key: Any) -> Any:
        keep = jax.random.bernoulli(key, 0.9, (4, 16, 8))  # the whole mask, each device's block sliced out
        i, j = jax.lax.axis_index("dp"), jax.lax.axis_index("tp")
        keep = jax.lax.dynamic_slice(keep, (i * 2, j * 4, 0), x.shape)
        return jnp.where(keep, x / 0.9, 0.0)
    return check_shard_map(_dropout_ref, impl, S(4, 16, 8, f32), jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
                           mesh=m, in_specs=(P("dp", "tp"), P()), out_specs=P("dp", "tp"), time_limit=60)


@program("discrepancy")
def dropout_mask_drawn_per_shard(m: Any, m8: Any, m3: Any) -> Report:
    # The blocks of eight threefry computations concatenated: a deep DAG whose normal form once took
    # exponential time (the run ignored its time limit).
    def impl(x: Any, key: Any) -> Any:
        k = jax.random.fold_in(jax.random.fold_in(key, jax.lax.axis_index("dp")), jax.lax.axis_index("tp"))
        return jnp.where(jax.random.bernoulli(k, 0.9, x.shape), x / 0.9, 0.0)  # not the reference's mask
    return check_shard_map(_dropout_ref, impl, S(4, 16, 8, f32), jax.ShapeDtypeStruct((), jax.random.key(0).dtype),
                           mesh=m, in_specs=(P("dp", "tp"), P()), out_specs=P("dp", "tp"), time_limit=60)


def _with_gspmd(run: Callable[[], Report]) -> Report:
    previous = jax.config.jax_use_shardy_partitioner  # type: ignore[attr-defined]
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        return run()
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


def _gelu_mlp_hidden30(m: Any) -> Callable[..., Any]:
    def f(x: Any, w1: Any, w2: Any) -> Any:
        h = jax.nn.gelu(jax.lax.with_sharding_constraint(x @ w1, _n(m, "dp", "tp")))  # 30 over tp = 4
        return h @ w2
    return f


@program()
def mlp_hidden_30_over_tp_4_gspmd(m: Any, m8: Any, m3: Any) -> Report:
    return _with_gspmd(lambda: check(_gelu_mlp_hidden30(m), S(8, 16, f32), S(16, 30, f32), S(30, 16, f32),
                                     in_shardings=(_n(m, "dp"), _n(m), _n(m)), out_shardings=_n(m, "dp")))


@program()
def mlp_hidden_30_grads(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, w1: Any, w2: Any) -> Any:
        return jax.grad(lambda w1, w2: (_gelu_mlp_hidden30(m)(x, w1, w2) ** 2).mean(), argnums=(0, 1))(w1, w2)
    return check(f, S(8, 16, f32), S(16, 30, f32), S(30, 16, f32), in_shardings=(_n(m, "dp"), _n(m), _n(m)),
                 out_shardings=(_n(m), _n(m)))


@program()
def layernorm_of_30_features_over_tp_4(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any) -> Any:
        x = jax.lax.with_sharding_constraint(x, _n(m, "dp", None, "tp"))
        mu = x.mean(-1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    return check(f, S(4, 6, 30, f32), in_shardings=(_n(m, "dp"),), out_shardings=_n(m, "dp"))


@program()
def rmsnorm_of_a_sequence_of_10_over_tp_4(m: Any, m8: Any, m3: Any) -> Report:
    def f(x: Any, g: Any) -> Any:
        x = jax.lax.with_sharding_constraint(x, _n(m, "dp", "tp"))
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g
    return check(f, S(4, 10, 16, f32), S(16, f32), in_shardings=(_n(m, "dp"), _n(m)), out_shardings=_n(m, "dp"))


@program()
def embedding_table_of_50_rows_over_tp_4_gspmd(m: Any, m8: Any, m3: Any) -> Report:
    def f(ids: Any, table: Any) -> Any:
        return jnp.take(jax.lax.with_sharding_constraint(table, _n(m, "tp")), ids, axis=0)
    return _with_gspmd(lambda: check(f, S(4, 6, i32), S(50, 16, f32), in_shardings=(_n(m, "dp"), _n(m)),
                                     out_shardings=_n(m, "dp")))


@program()
def cross_entropy_grad_over_a_vocab_of_50(m: Any, m8: Any, m3: Any) -> Report:
    def f(h: Any, w: Any, labels: Any) -> Any:
        def loss(w: Any) -> Any:
            logits = jax.lax.with_sharding_constraint(h @ w, _n(m, "dp", "tp"))
            target = jnp.take_along_axis(logits, labels[:, None], -1)[:, 0]
            return jnp.mean(jax.nn.logsumexp(logits, -1) - target)
        return jax.grad(loss)(w)
    return check(f, S(8, 16, f32), S(16, 50, f32), S(8, i32), in_shardings=(_n(m, "dp"), _n(m), _n(m, "dp")),
                 out_shardings=_n(m))


@program()
def adafactor_step_with_factored_moments_on_a_2x2x2_mesh(m: Any, m8: Any, m3: Any) -> Report:
    # The row factor of w_in's second moment is replicated, the column factor split like b_in: XLA lays
    # the row factor, broadcast along the columns, over other axes than the gradient it scales.
    params = {"w_in": S(32, 64, f32), "b_in": S(64, f32), "w_out": S(64, 32, f32), "b_out": S(32, f32)}
    shard = {"w_in": _n(m3, "fsdp", "tp"), "b_in": _n(m3, "tp"), "w_out": _n(m3, "tp", "fsdp"), "b_out": _n(m3)}
    opt = optax.adafactor(1e-2, min_dim_size_to_factor=16)
    state = jax.eval_shape(opt.init, params)
    like = {p.shape: shard[k] for k, p in params.items()}  # a moment shaped like a parameter is laid out like it
    state_shard = jax.tree.map(lambda a: like.get(a.shape, _n(m3)), state)

    def loss(p: Any, x: Any, y: Any) -> Any:
        h = jax.nn.gelu(x @ p["w_in"] + p["b_in"])
        return jnp.mean((h @ p["w_out"] + p["b_out"] - y) ** 2)

    def step(p: Any, st: Any, x: Any, y: Any) -> Any:
        value, g = jax.value_and_grad(loss)(p, x, y)
        upd, st = opt.update(g, st, p)
        return optax.apply_updates(p, upd), st, value
    batch = _n(m3, ("dp", "fsdp"))
    return check(step, params, state, S(16, 32, f32), S(16, 32, f32), in_shardings=(shard, state_shard, batch, batch),
                 out_shardings=(shard, state_shard, _n(m3)))
