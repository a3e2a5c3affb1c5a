"""The numeric interpreter's kernels against JAX itself, op family by op family, on one device.

Each case is a small jitted function: lowered to StableHLO, read with `parsers.loads`, run with
`numeric.run_before` and compared with what XLA computes for the same inputs. Then the XLA integer/float
edge semantics on crafted values, the collectives on hand-written per-device programs, and the
shard/assemble round trip as a property.
"""

from __future__ import annotations

from conftest import numeric_xla_flags

numeric_xla_flags()  # before jax is imported

import functools  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from jax import lax  # noqa: E402

from scalify_hlo import parsers  # noqa: E402
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer  # noqa: E402
from scalify_hlo.numeric import machine as N  # noqa: E402
from scalify_hlo.numeric import trials  # noqa: E402

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _i32(lo: int, hi: int, *shape: int) -> np.ndarray:
    return RNG.integers(lo, hi, size=shape).astype(np.int32)


def _maxpool_grad(x: jax.Array) -> jax.Array:
    pool = lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (2, 2), (2, 2), "VALID")  # noqa: E731
    return jax.grad(lambda v: jnp.sum(pool(v) ** 2))(x)


def _while_count(x: jax.Array) -> Any:
    return lax.while_loop(lambda c: c[1] < 100.0, lambda c: (c[0] + 1, c[1] * 2 + 1), (0, jnp.abs(x[0, 0])))


# name → (function, inputs, rtol). Each exercises one family of kernels the way JAX lowers it.
CASES: dict[str, tuple[Callable[..., Any], list[np.ndarray], float]] = {
    "elementwise": (lambda x, y: (jnp.sin(x) * jnp.cos(y) + jnp.exp(-x * x) - jnp.tanh(y) / (1 + jnp.abs(x)),
                                  jnp.sqrt(jnp.abs(x)), lax.rsqrt(jnp.abs(y) + 1), jnp.log1p(jnp.abs(x)),
                                  jnp.expm1(y), jnp.arctan2(x, y), jnp.cbrt(x), jnp.floor(x), jnp.ceil(y),
                                  jnp.round(x * 3), lax.round(x * 3, lax.RoundingMethod.AWAY_FROM_ZERO),
                                  jnp.sign(x), jnp.maximum(x, y), jnp.minimum(x, y), jnp.tan(x / 2),
                                  jax.nn.sigmoid(x), x ** 3, jnp.power(jnp.abs(x), y), jnp.fmod(x, y),
                                  jnp.clip(x, -0.5, 0.5), jnp.where(x > y, x, y), jnp.isfinite(x / 0),
                                  jax.nn.gelu(x, approximate=False), lax.erf_inv(jnp.tanh(x) * 0.9)),
                    [_f32(4, 8), _f32(4, 8)], 2e-5),
    "integer": (lambda a, b: (a // b, a % b, lax.div(a, b), lax.rem(a, b), a * b, a - b, -a, jnp.abs(a),
                              a << (b & 7), lax.shift_right_logical(a, b & 7), a >> (b & 7),
                              lax.population_count(a), lax.clz(a), a & b, a | b, a ^ b, ~a,
                              jnp.maximum(a, b), a ** 3, jnp.sign(a), a == b, a < b, a >= b),
                [_i32(-50, 50, 16), _i32(1, 9, 16) * np.where(_i32(0, 2, 16) > 0, 1, -1).astype(np.int32)], 0),
    "convert": (lambda x: (x.astype(jnp.bfloat16), x.astype(jnp.float16), (x * 1e3).astype(jnp.int32),
                           (x * 1e3).astype(jnp.uint8), x.astype(bool), (x > 0).astype(jnp.float32),
                           lax.bitcast_convert_type(x, jnp.int32),
                           lax.reduce_precision(x, exponent_bits=5, mantissa_bits=2)),
                [_f32(4, 8) * 100], 1e-6),
    "dot_general": (lambda a, b, c: (jnp.einsum("bij,bjk->bik", a, b), a @ b[0], jnp.einsum("bij,kj->bki", a, c),
                                     jnp.einsum("bij,bij->b", a, a)),
                    [_f32(3, 4, 5), _f32(3, 5, 6), _f32(7, 5)], 1e-5),
    "reductions": (lambda x: (jnp.sum(x, axis=0), jnp.max(x, axis=1), jnp.min(x), jnp.prod(x[:2], axis=2),
                              jnp.argmax(x, axis=1), jnp.argmin(x, axis=2), jnp.any(x > 1, axis=0),
                              jnp.all(x > -3), jnp.mean(x, axis=(0, 2)), jax.nn.logsumexp(x, axis=-1)),
                   [_f32(3, 4, 5)], 1e-5),
    "gather": (lambda x, i, j: (jnp.take(x, i, axis=0), jnp.take(x, i, axis=1), jnp.take_along_axis(x, j, axis=1),
                                x[i, j[:4, 0]], jnp.take(x, i - 3, axis=0, mode="clip")),
               [_f32(6, 5), _i32(0, 5, 4), _i32(0, 5, 6, 2)], 0),
    "scatter": (lambda x, i, u: (x.at[i].add(u), x.at[i].set(u), x.at[i].max(u), x.at[i].mul(u),
                                 jnp.zeros(6).at[i].add(1.0), x.at[i, 1].add(u[:, 0]), x.at[i - 2].add(u)),
                [_f32(6, 3), np.array([0, 2, 2, 5, 0, 2], np.int32), _f32(6, 3)], 1e-6),
    "sort": (lambda x, k: (jnp.sort(x, axis=0), jnp.sort(x, axis=1), jnp.argsort(x, axis=1), jnp.sort(k),
                           lax.sort((k, x[0, :7]), num_keys=1), lax.top_k(x, 3)),
             [np.concatenate([_f32(5, 7), np.array([[np.nan, -0.0, 0.0, -np.inf, 1, 1, 1]], np.float32)]),
              _i32(-3, 3, 7)], 0),
    "reduce_window": (lambda x: (jnp.cumsum(x, axis=1), jnp.cumprod(x[:, :4], axis=0), lax.cummax(x, axis=0),
                                 lax.reduce_window(x, 0.0, lax.add, (2, 3), (1, 2), "SAME"),
                                 lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), ((1, 0), (0, 2)),
                                                   base_dilation=(2, 1), window_dilation=(1, 2)),
                                 _maxpool_grad(x)),
                      [_f32(6, 8)], 1e-5),
    "control_flow": (lambda x: (lax.fori_loop(0, 5, lambda k, v: v * 0.5 + k, x),
                                lax.cond(x[0, 0] > 0, lambda v: v + 1, lambda v: v * 2, x),
                                lax.switch(jnp.argmax(x[0]) % 3, [jnp.sin, jnp.cos, jnp.exp], x),
                                *_while_count(x),
                                lax.scan(lambda c, r: (c + r, c * r), jnp.zeros(4), x)[1]),
                     [_f32(3, 4)], 1e-5),
    "dynamic_slice": (lambda x, i: (lax.dynamic_slice(x, (i[0], i[1]), (2, 3)),
                                    lax.dynamic_update_slice(x, jnp.ones((2, 3)), (i[1], i[0])),
                                    lax.dynamic_slice(x, (i[2], -i[2]), (3, 2)),
                                    lax.dynamic_update_index_in_dim(x, x[0] * 2, i[0], axis=0)),
                      [_f32(5, 6), np.array([3, 1, 100], np.int32)], 0),
    "pad_iota_shape": (lambda x: (jnp.pad(x, ((1, 2), (0, 3))), lax.pad(x, 0.5, ((1, -1, 1), (-2, 1, 2))),
                                  lax.iota(jnp.int32, 5), lax.broadcasted_iota(jnp.float32, (3, 4), 1),
                                  x.T, x.reshape(4, 6)[::-1], jnp.concatenate([x, x * 2], axis=1), x[1:, ::2],
                                  jnp.broadcast_to(x[:, None, :], (4, 2, 6)), jnp.flip(x, 1)),
                       [_f32(4, 6)], 0),
    "random": (lambda k, x: (jax.random.normal(jax.random.wrap_key_data(k), (4, 8)),
                             jax.random.bernoulli(jax.random.wrap_key_data(k), 0.3, (5,)),
                             jax.nn.dot_product_attention(x, x, x)),
               [np.array([0, 3], np.uint32), _f32(2, 5, 2, 4)], 1e-5),  # the data of key(3)
    # XLA may skip the rounding of a bf16 intermediate (excess precision); we round after every op.
    "bf16_math": (lambda a, b: (a * b + a, (a * 3).astype(jnp.float32), jnp.exp(a) / (b + 3), (a @ b.T).astype(jnp.float32), jnp.sum(a, axis=1)),
                  [_f32(4, 8).astype(ml_dtypes.bfloat16), _f32(4, 8).astype(ml_dtypes.bfloat16)], 2e-2),
}


@functools.cache
def _case(name: str) -> tuple[Any, list[np.ndarray], list[np.ndarray]]:
    fn, inputs, _ = CASES[name]
    jitted = jax.jit(fn)
    module = parsers.loads(jitted.lower(*inputs).as_text())
    expected = [np.asarray(o) for o in jax.tree.leaves(jitted(*inputs))]
    return module, inputs, expected


@pytest.mark.parametrize("name", list(CASES))
def test_kernels_match_xla(name: str) -> None:
    module, inputs, expected = _case(name)
    got = N.run_before(module, inputs)
    assert len(got) == len(expected)
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == e.shape and g.dtype == e.dtype, (k, g.shape, g.dtype, e.shape, e.dtype)
    c = trials.compare(expected, got, rtol=CASES[name][2], atol=CASES[name][2] or 0)
    assert c.ok, f"{name}: {c.reason}"


def test_every_kernel_is_registered_alphabetically() -> None:
    from scalify_hlo.numeric.kernels import KERNELS
    from scalify_hlo.ops.elementwise import ELEMENTWISE
    from scalify_hlo.ops.registry import OPS

    written = list(OPS)[len([e for e in ELEMENTWISE.values() if e.fn is not None]):]
    for table in (written, list(ELEMENTWISE)):
        assert table == sorted(table)
    assert {name for name, e in ELEMENTWISE.items() if e.fn is not None} <= set(KERNELS)
    assert {"add", "dot_general", "all_reduce", "while", "scatter", "manual_computation"} <= set(KERNELS)


# ------------------------------------------------------------------------------------- XLA edge semantics

def _run_text(text: str, inputs: list[np.ndarray], devices: int = 1) -> list[np.ndarray]:
    return N.run(parsers.loads(text), inputs, devices)


def test_integer_division_and_remainder_edges() -> None:
    text = """func.func @main(%a: tensor<6xi32>, %b: tensor<6xi32>) -> (tensor<6xi32>, tensor<6xi32>) {
      %q = stablehlo.divide %a, %b : tensor<6xi32>
      %r = stablehlo.remainder %a, %b : tensor<6xi32>
      return %q, %r : tensor<6xi32>, tensor<6xi32>
    }"""
    a = np.array([[7, -7, 7, -7, -2147483648, 5]], np.int32)
    b = np.array([[2, 2, -2, 0, -1, 0]], np.int32)
    q, r = _run_text(text, [a, b])
    assert q.tolist() == [[3, -3, -3, -1, -2147483648, -1]]
    assert r.tolist() == [[1, -1, 1, -7, 0, 5]]


def test_convert_saturates_and_shifts_overflow() -> None:
    text = """func.func @main(%x: tensor<5xf32>, %s: tensor<5xi32>) -> (tensor<5xi32>, tensor<5xui8>, tensor<5xi32>, tensor<5xi32>) {
      %i = stablehlo.convert %x : (tensor<5xf32>) -> tensor<5xi32>
      %u = stablehlo.convert %x : (tensor<5xf32>) -> tensor<5xui8>
      %c = stablehlo.constant dense<-8> : tensor<5xi32>
      %l = stablehlo.shift_left %c, %s : tensor<5xi32>
      %r = stablehlo.shift_right_arithmetic %c, %s : tensor<5xi32>
      return %i, %u, %l, %r : tensor<5xi32>, tensor<5xui8>, tensor<5xi32>, tensor<5xi32>
    }"""
    x = np.array([[np.nan, 3e9, -3e9, -2.7, 300.5]], np.float32)
    s = np.array([[0, 1, 31, 32, 40]], np.int32)
    i, u, left, right = _run_text(text, [x, s])
    assert i.tolist() == [[0, 2147483647, -2147483648, -2, 300]]
    assert u.tolist() == [[0, 255, 0, 0, 255]]
    assert left.tolist() == [[-8, -16, 0, 0, 0]]
    assert right.tolist() == [[-8, -4, -1, -1, -1]]


def test_hlo_copy_and_bitcast_follow_physical_layouts() -> None:
    text = """HloModule m, entry_computation_layout={(f32[4,2]{1,0})->f32[2,4]{1,0}}

ENTRY %main (p: f32[4,2]) -> f32[2,4] {
  %p = f32[4,2]{1,0} parameter(0)
  %c = f32[4,2]{0,1} copy(%p)
  ROOT %b = f32[2,4]{1,0} bitcast(%c)
}
"""
    x = np.arange(8, dtype=np.float32).reshape(1, 4, 2)
    (b,) = _run_text(text, [x])
    np.testing.assert_array_equal(b[0], x[0].T)  # the column-major buffer of x, read row-major


def test_unsupported_op_names_opcode() -> None:
    text = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
      %0 = stablehlo.custom_call @SomethingOpaque(%x) : (tensor<4xf32>) -> tensor<4xf32>
      return %0 : tensor<4xf32>
    }"""
    with pytest.raises(N.NumericUnsupported, match="custom_call"):
        _run_text(text, [np.zeros((1, 4), np.float32)])


# --------------------------------------------------------------------------------------------- collectives

_COLLECTIVES = """func.func @main(%x: tensor<2x4xf32>) -> (tensor<2x4xf32>, tensor<2x16xf32>, tensor<2x1xf32>,
                                                 tensor<2x4xf32>, tensor<8x1xf32>, tensor<2x4xf32>, tensor<ui32>) {
  %sum = "stablehlo.all_reduce"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>,
      replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
  }) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %gat = "stablehlo.all_gather"(%x) <{all_gather_dim = 1 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>,
      replica_groups = dense<[[0, 2, 4, 6], [1, 3, 5, 7]]> : tensor<2x4xi64>, use_global_device_ids}> : (tensor<2x4xf32>) -> tensor<2x16xf32>
  %rs = "stablehlo.reduce_scatter"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>,
      replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, scatter_dimension = 1 : i64, use_global_device_ids}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %m = stablehlo.maximum %a, %b : tensor<f32>
      stablehlo.return %m : tensor<f32>
  }) : (tensor<2x4xf32>) -> tensor<2x1xf32>
  %perm = "stablehlo.collective_permute"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>,
      source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>}> : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %a2a = "stablehlo.all_to_all"(%x) <{channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, concat_dimension = 0 : i64,
      replica_groups = dense<[[0, 1, 2, 3], [4, 5, 6, 7]]> : tensor<2x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64}> : (tensor<2x4xf32>) -> tensor<8x1xf32>
  %local = "stablehlo.all_reduce"(%x) <{replica_groups = dense<[[0, 1, 2, 3, 4, 5, 6, 7]]> : tensor<1x8xi64>}> ({
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
  }) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %pid = stablehlo.partition_id : tensor<ui32>
  return %sum, %gat, %rs, %perm, %a2a, %local, %pid : tensor<2x4xf32>, tensor<2x16xf32>, tensor<2x1xf32>, tensor<2x4xf32>, tensor<8x1xf32>, tensor<2x4xf32>, tensor<ui32>
}"""


def test_collectives_exchange_along_the_device_axis() -> None:
    x = RNG.standard_normal((8, 2, 4)).astype(np.float32)
    total, gathered, scattered, permuted, a2a, local, pid = _run_text(_COLLECTIVES, [x], devices=8)
    for d in range(8):
        group = [0, 1, 2, 3] if d < 4 else [4, 5, 6, 7]
        np.testing.assert_allclose(total[d], x[group].sum(0), rtol=1e-6)
        np.testing.assert_array_equal(gathered[d], np.concatenate([x[g] for g in range(d % 2, 8, 2)], axis=1))
        k = group.index(d)
        np.testing.assert_array_equal(scattered[d], x[group].max(0)[:, k:k + 1])
        np.testing.assert_array_equal(a2a[d], np.concatenate([x[g][:, k:k + 1] for g in group], axis=0))
    np.testing.assert_array_equal(permuted[[1, 2, 3, 0]], x[[0, 1, 2, 3]])
    np.testing.assert_array_equal(permuted[4:], 0)  # no source: zeros, as XLA
    np.testing.assert_array_equal(local, x)  # no channel, one replica: every partition is alone
    assert pid.tolist() == list(range(8)) and pid.dtype == np.uint32


_PER_DEVICE = """func.func @main(%x: tensor<8x3xf32>, %idx: tensor<2x1xi32>) -> (tensor<2x3xf32>, tensor<8x3xf32>,
                                                                     tensor<i32>, tensor<f32>, tensor<2x3xf32>) {
  %pid = stablehlo.partition_id : tensor<ui32>
  %p = stablehlo.convert %pid : (tensor<ui32>) -> tensor<i32>
  %c0 = stablehlo.constant dense<0> : tensor<i32>
  %ds = stablehlo.dynamic_slice %x, %p, %c0, sizes = [2, 3] : (tensor<8x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
  %upd = stablehlo.constant dense<1.0> : tensor<2x3xf32>
  %dus = stablehlo.dynamic_update_slice %x, %upd, %p, %c0 : (tensor<8x3xf32>, tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<8x3xf32>
  %trips:2 = stablehlo.while(%i = %c0, %acc = %c0) : tensor<i32>, tensor<i32>
   cond {
    %lt = stablehlo.compare LT, %i, %p, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
    stablehlo.return %lt : tensor<i1>
  } do {
    %one = stablehlo.constant dense<1> : tensor<i32>
    %next = stablehlo.add %i, %one : tensor<i32>
    %ten = stablehlo.constant dense<10> : tensor<i32>
    %acc2 = stablehlo.add %acc, %ten : tensor<i32>
    stablehlo.return %next, %acc2 : tensor<i32>, tensor<i32>
  }
  %three = stablehlo.constant dense<3> : tensor<i32>
  %b = stablehlo.remainder %p, %three : tensor<i32>
  %case = "stablehlo.case"(%b) ({
    %r = stablehlo.constant dense<-1.0> : tensor<f32>
    stablehlo.return %r : tensor<f32>
  }, {
    %r = stablehlo.constant dense<2.0> : tensor<f32>
    stablehlo.return %r : tensor<f32>
  }) : (tensor<i32>) -> tensor<f32>
  %g = "stablehlo.gather"(%x, %idx) <{dimension_numbers = #stablehlo.gather<offset_dims = [1],
      collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false,
      slice_sizes = array<i64: 1, 3>}> : (tensor<8x3xf32>, tensor<2x1xi32>) -> tensor<2x3xf32>
  return %ds, %dus, %trips#1, %case, %g : tensor<2x3xf32>, tensor<8x3xf32>, tensor<i32>, tensor<f32>, tensor<2x3xf32>
}"""


def test_device_dependent_indices_trips_and_branches() -> None:
    """What only SPMD code does: start indices, loop trip counts, branches and gather indices that differ
    from device to device, all in one vectorised step."""
    x = RNG.standard_normal((8, 8, 3)).astype(np.float32)
    idx = RNG.integers(0, 8, size=(8, 2, 1)).astype(np.int32)
    ds, dus, trips, case, g = _run_text(_PER_DEVICE, [x, idx], devices=8)
    for d in range(8):
        start = min(d, 6)  # clamped so the window fits
        np.testing.assert_array_equal(ds[d], x[d, start:start + 2])
        want = x[d].copy()
        want[start:start + 2] = 1.0
        np.testing.assert_array_equal(dus[d], want)
        assert trips[d] == 10 * d
        assert case[d] == (-1.0 if d % 3 == 0 else 2.0)  # index 2 is out of range: the last branch
        np.testing.assert_array_equal(g[d], x[d, idx[d, :, 0]])


def test_random_inputs_keep_indices_in_range() -> None:
    module, _, _ = _case("gather")
    x, i, j = trials.random_inputs(module, seed=3)
    assert x.dtype == np.float32 and i.dtype == np.int32
    assert i.min() >= 0 and i.max() < 5 and j.min() >= 0 and j.max() < 5  # they index dims of size 6 and 5
    np.testing.assert_array_equal(trials.random_inputs(module, seed=3)[0], x)


_ASYNC = """HloModule m, num_partitions=4

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %c = f32[] add(%a, %b)
}

%gather (p: f32[2]) -> f32[8] {
  %p = f32[2] parameter(0)
  ROOT %g = f32[8] all-gather(%p), channel_id=1, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
}

ENTRY %main (x: f32[2]) -> (f32[8], f32[8], f32[2]) {
  %x = f32[2] parameter(0)
  %s = ((f32[2]), f32[8]) async-start(%x), calls=%gather
  %d = f32[8] async-done(%s)
  %gs = (f32[2], f32[8]) all-gather-start(%x), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, use_global_device_ids=true
  %gd = f32[8] all-gather-done(%gs)
  %rs = f32[2] all-reduce-start(%x), channel_id=3, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%add
  %rd = f32[2] all-reduce-done(%rs)
  ROOT %t = (f32[8], f32[8], f32[2]) tuple(%d, %gd, %rd)
}
"""


def test_async_collectives_in_hlo() -> None:
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    wrapped, gathered, summed = _run_text(_ASYNC, [x], devices=4)
    np.testing.assert_array_equal(wrapped, np.broadcast_to(x.reshape(-1), (4, 8)))
    np.testing.assert_array_equal(gathered, wrapped)
    np.testing.assert_array_equal(summed, np.broadcast_to(x.sum(0), (4, 2)))


# ----------------------------------------------------------------------------------------- shard/assemble

MESH = Mesh((("dp", 2), ("tp", 4)))


@st.composite
def _layouts(draw: st.DrawFn) -> tuple[Layout, tuple[int, ...]]:
    rank = draw(st.integers(1, 3))
    axes = draw(st.permutations(["dp", "tp"]))
    used = draw(st.integers(0, 2))
    dims: list[list[str]] = [[] for _ in range(rank)]
    for a in axes[:used]:
        dims[draw(st.integers(0, rank - 1))].append(a)
    shape = tuple(draw(st.integers(1, 9)) for _ in range(rank))
    return Layout(tuple(tuple(d) for d in dims)), shape


@settings(max_examples=60, deadline=None)
@given(_layouts(), st.integers(0, 2**31))
def test_shard_assemble_round_trip(case: tuple[Layout, tuple[int, ...]], seed: int) -> None:
    layout, shape = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    stacked = N.shard(x, layout, MESH)
    assert stacked.shape == (8, *layout.local_shape(shape, MESH))
    np.testing.assert_array_equal(N.assemble(stacked, layout, MESH, shape), x)


def test_assemble_combines_partial_axes_and_reads_replica_zero() -> None:
    stacked = np.arange(8, dtype=np.float32).reshape(8, 1)
    partial = Layout(((),), (("tp", Reducer.SUM),))
    assert N.assemble(stacked, partial, MESH).tolist() == [0 + 1 + 2 + 3]  # dp coordinate 0
    assert N.assemble(stacked, Layout(((),)), MESH).tolist() == [0]
    assert N.assemble(stacked, Layout((("tp", "dp"),)), MESH).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    x = np.array([5.0], np.float32)
    np.testing.assert_array_equal(N.assemble(N.shard(x, partial, MESH), partial, MESH), x)


def test_compare_reports_first_counterexample() -> None:
    b = [np.array([1.0, np.nan, 3.0]), np.array([[1, 2], [3, 4]])]
    a = [np.array([1.0, np.nan, 3.0 + 1e-7]), np.array([[1, 2], [3, 5]])]
    c = trials.compare(b, a)
    assert not c.ok and c.counterexample == trials.DifferingElement(1, (1, 1), 4, 5)
    assert not trials.compare([np.array([100000])], [np.array([100001])]).ok  # integers compare exactly
    assert c.max_abs[0] < 1e-6 and c.max_abs[1] == 1.0
    assert trials.compare(b[:1], a[:1]).ok
    assert not trials.compare([np.zeros(3)], [np.zeros(4)]).ok


def test_widened_runs_compute_floats_in_float64() -> None:
    """`values.widened`: every float held as float64 (what evidence checks a float32 difference against);
    integers keep their type; reinterpreting a float's bits refuses."""
    import jax
    import jax.numpy as jnp

    from scalify_hlo import parsers
    from scalify_hlo.numeric import machine
    from scalify_hlo.numeric.values import NumericUnsupported, widened

    def f(x: jax.Array, i: jax.Array) -> tuple[jax.Array, jax.Array]:
        return (x + 1e8) - 1e8, i * 3

    m = parsers.loads(jax.jit(f).lower(jnp.zeros(4, jnp.float32), jnp.zeros(4, jnp.int32)).as_text(), "f.mlir")
    x, i = np.array([[0.25, 1.5, -3.0, 7.0]], np.float32), np.arange(4, dtype=np.int32)[None]
    narrow = machine.run(m, [x, i])
    with widened():
        wide = machine.run(m, [x, i])
    assert narrow[0].dtype == np.float32 and not np.array_equal(narrow[0], x)  # 1e8 + 0.25 rounds in float32
    assert wide[0].dtype == np.float64 and np.array_equal(wide[0], x)
    assert wide[1].dtype == np.int32 and np.array_equal(wide[1], i * 3)

    bits = parsers.loads(jax.jit(lambda x: jax.lax.bitcast_convert_type(x, jnp.int32)).lower(
        jnp.zeros(4, jnp.float32)).as_text(), "g.mlir")
    machine.run(bits, [x])
    with widened(), pytest.raises(NumericUnsupported, match="reinterprets"):
        machine.run(bits, [x])
