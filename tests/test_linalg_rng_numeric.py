"""The linear-algebra and random-bit kernels against XLA CPU.

- `jnp.linalg.cholesky`, `jax.lax.linalg.lu` and `jax.lax.linalg.triangular_solve` (every option), lowered
  by JAX to LAPACK custom calls, run from StableHLO and from XLA's compiled HLO text (a tuple-typed custom call), on
  positive definite and indefinite (NaN) matrices;
- `stablehlo.cholesky` and `stablehlo.triangular_solve` (what JAX emits for accelerators), written as
  StableHLO and compiled by XLA CPU (its expanders);
- `rng_bit_generator`: the exact bits and output state of DEFAULT, THREE_FRY and PHILOX for u64[2] (and
  Philox's u64[3]) states, many shapes and unsigned widths; an algorithm without a kernel is
  NumericUnsupported.
"""

from __future__ import annotations

from conftest import numeric_xla_flags

numeric_xla_flags()  # before jax is imported

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax._src.lib import xla_client as xc  # noqa: E402

from scalify_hlo import parsers  # noqa: E402
from scalify_hlo.ir.nodes import Attrs, Op, TensorType, Value  # noqa: E402
from scalify_hlo.numeric import kernels_rng as NR  # noqa: E402
from scalify_hlo.numeric import machine as N  # noqa: E402
from scalify_hlo.numeric.values import NumericUnsupported  # noqa: E402
from scalify_hlo.ops import registry  # noqa: E402, F401  (registers the kernels)

RNG = np.random.default_rng(0)


def _spd(batch: int, n: int, dtype: Any = np.float32) -> np.ndarray:
    x = RNG.standard_normal((batch, n, n))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * RNG.standard_normal((batch, n, n))
    return (x @ np.conj(np.swapaxes(x, -1, -2)) + n * np.eye(n)).astype(dtype)


def _general(*shape: int, dtype: Any = np.float32) -> np.ndarray:
    x = RNG.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * RNG.standard_normal(shape)
    return x.astype(dtype)


def _compare(fn: Callable[..., Any], inputs: list[np.ndarray], *, hlo: bool = False) -> None:
    lowered = jax.jit(fn).lower(*inputs)
    text = lowered.compile().as_text() if hlo else lowered.as_text()
    assert "lapack_" in text
    got = N.run_before(parsers.loads(text), inputs)
    want = [np.asarray(o) for o in jax.tree.leaves(jax.jit(fn)(*inputs))]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4)  # NaN where XLA has NaN


def _tri(lower: bool, left: bool, transpose: bool, conjugate: bool, unit: bool) -> Callable[..., Any]:
    def f(a: jax.Array, b: jax.Array) -> jax.Array:
        return jax.lax.linalg.triangular_solve(a, b, left_side=left, lower=lower, transpose_a=transpose,
                                               conjugate_a=conjugate, unit_diagonal=unit)
    return f


@pytest.mark.parametrize("hlo", [False, True], ids=["stablehlo", "hlo"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])  # (complex: the reader has no complex constants)
def test_cholesky_lapack(dtype: Any, hlo: bool) -> None:
    with jax.enable_x64(dtype == np.float64):
        _compare(jnp.linalg.cholesky, [_spd(3, 5, dtype)], hlo=hlo)
        _compare(lambda a: jnp.linalg.cholesky(a, upper=True), [_spd(2, 4, dtype)], hlo=hlo)


@pytest.mark.parametrize("hlo", [False, True], ids=["stablehlo", "hlo"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lu_lapack_getrf(dtype: Any, hlo: bool) -> None:
    """`jax.lax.linalg.lu` (getrf, then the pivots as a permutation) on square, wide and tall matrices, one
    with a zero column (a zero pivot: LAPACK leaves its column unscaled), and `jnp.linalg.solve`."""
    singular = _general(2, 4, 4, dtype=dtype)
    singular[1, :, 1] = 0
    with jax.enable_x64(dtype == np.float64):
        for a in (_general(3, 5, 5, dtype=dtype), _general(2, 4, 6, dtype=dtype), _general(2, 6, 3, dtype=dtype),
                  singular):
            _compare(jax.lax.linalg.lu, [a], hlo=hlo)
        _compare(jnp.linalg.solve, [_general(3, 4, 4, dtype=dtype) + 4 * np.eye(4, dtype=dtype),
                                    _general(3, 4, 2, dtype=dtype)], hlo=hlo)


def test_cholesky_lapack_indefinite_is_nan_and_info_matches() -> None:
    a = _spd(4, 5)
    a[1, 3, 3] = -50.0  # the 4th leading minor is not positive definite
    a[2, 0, 0] = np.nan
    _compare(jnp.linalg.cholesky, [a])
    got = N.run_before(parsers.loads(jax.jit(jnp.linalg.cholesky).lower(a).as_text()), [a])[0]
    low = np.tril(np.ones((5, 5), dtype=bool))
    assert np.isnan(got[1][low]).all() and np.isnan(got[2][low]).all() and np.isfinite(got[[0, 3]]).all()
    # The info output itself, through the raw primitive (JAX masks the factor with it).
    from scalify_hlo.numeric.kernels_linalg import cholesky_lower
    _, info = cholesky_lower(a.astype(np.float64))
    assert info.tolist() == [0, 4, 1, 0]


OPTIONS = [(lower, left, transpose, conjugate, unit)
           for lower in (True, False) for left in (True, False) for transpose, conjugate in
           ((False, False), (True, False), (True, True)) for unit in (False, True)]


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(str(int(v)) for v in o))
def test_triangular_solve_lapack(opts: tuple[bool, ...]) -> None:
    left = opts[1]
    dtype = np.float32  # complex: see test_stablehlo_triangular_solve
    a = _general(2, 4, 4, dtype=dtype) + 4 * np.eye(4, dtype=dtype)
    b = _general(2, 4, 3, dtype=dtype) if left else _general(2, 3, 4, dtype=dtype)
    _compare(_tri(*opts), [a, b])


def test_triangular_solve_lapack_hlo_and_solve_triangular() -> None:
    a = _general(3, 4, 4) + 4 * np.eye(4, dtype=np.float32)
    b = _general(3, 4, 2)
    _compare(_tri(True, True, True, False, False), [a, b], hlo=True)
    _compare(lambda a, b: jax.scipy.linalg.solve_triangular(a, b, lower=False, trans=1), [a, b])


# ------------------------------------------------------------------ stablehlo ops, compiled by XLA CPU


def _run_mlir(text: str, *inputs: np.ndarray) -> list[np.ndarray]:
    dev = jax.devices()[0]
    exe = dev.client.compile_and_load(text, xc.DeviceList((dev,)), xc.CompileOptions())
    outs = exe.execute_sharded([jax.device_put(x, dev) for x in inputs]).disassemble_into_single_device_arrays()
    return [np.asarray(o[0]) for o in outs]


def _both(text: str, *inputs: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return N.run_before(parsers.loads(text), list(inputs)), _run_mlir(text, *inputs)


@pytest.mark.parametrize("lower", [True, False])
def test_stablehlo_cholesky(lower: bool) -> None:
    a = _spd(3, 6)
    a[2, 4, 4] = -100.0  # indefinite: XLA's expander makes that whole matrix NaN
    text = f"""func.func @main(%a: tensor<3x6x6xf32>) -> tensor<3x6x6xf32> {{
      %0 = stablehlo.cholesky %a, lower = {str(lower).lower()} : tensor<3x6x6xf32>
      return %0 : tensor<3x6x6xf32>
    }}"""
    (got,), (want,) = _both(text, a)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("opts", OPTIONS, ids=lambda o: "-".join(str(int(v)) for v in o))
def test_stablehlo_triangular_solve(opts: tuple[bool, ...]) -> None:
    lower, left, transpose, conjugate, unit = opts
    t = "ADJOINT" if conjugate else "TRANSPOSE" if transpose else "NO_TRANSPOSE"
    a = _general(2, 4, 4) + 4 * np.eye(4, dtype=np.float32)
    b = _general(2, 4, 3) if left else _general(2, 3, 4)
    bt = "x".join(map(str, b.shape))
    text = f"""func.func @main(%a: tensor<2x4x4xf32>, %b: tensor<{bt}xf32>) -> tensor<{bt}xf32> {{
      %0 = "stablehlo.triangular_solve"(%a, %b) {{left_side = {str(left).lower()}, lower = {str(lower).lower()},
        unit_diagonal = {str(unit).lower()}, transpose_a = #stablehlo<transpose {t}>}}
        : (tensor<2x4x4xf32>, tensor<{bt}xf32>) -> tensor<{bt}xf32>
      return %0 : tensor<{bt}xf32>
    }}"""
    (got,), (want,) = _both(text, a, b)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------------------------------------------ rng_bit_generator

# The halving of prng.cc's 32-bit ThreeFry: scalars, no even dim (the largest is halved, first of ties),
# an even dim first or later, unit dims.
SHAPES = [(), (5,), (3, 5), (9, 4), (7, 3, 5), (2, 1, 3)]


def _rng_text(algorithm: str, words: int, shapes: list[tuple[int, ...]], dtype: str) -> str:
    """One module drawing bits of every shape from the same state (one compilation for all of them)."""
    st = f"tensor<{words}xui64>"
    bts = [f"tensor<{''.join(f'{n}x' for n in shape)}{dtype}>" for shape in shapes]
    lines = [f"%s{i}, %b{i} = stablehlo.rng_bit_generator %s, algorithm = {algorithm} : ({st}) -> ({st}, {bt})"
             for i, bt in enumerate(bts)]
    names = ", ".join(f"%s{i}, %b{i}" for i in range(len(bts)))
    types = ", ".join(f"{st}, {bt}" for bt in bts)
    body = "\n".join(lines)
    return f"func.func @main(%s: {st}) -> ({types}) {{\n{body}\nreturn {names} : {types}\n}}"


@pytest.mark.parametrize(("algorithm", "dtype"), [
    ("THREE_FRY", "ui32"), ("THREE_FRY", "ui64"), ("THREE_FRY", "ui8"), ("PHILOX", "ui32"), ("PHILOX", "ui64"),
    ("PHILOX", "ui16"), ("DEFAULT", "ui32")])
def test_rng_bit_generator_exact_bits(algorithm: str, dtype: str) -> None:
    states = [np.array([1, 2], np.uint64), np.array([0xDEADBEEF12345678, 2**64 - 3], np.uint64)]
    text = _rng_text(algorithm, 2, SHAPES, dtype)
    with jax.enable_x64(True):
        for state in states:
            got, want = _both(text, state)
            assert len(got) == len(want) == 2 * len(SHAPES)
            for i, (g, w) in enumerate(zip(got, want, strict=True)):
                assert g.dtype == w.dtype and g.shape == w.shape
                assert np.array_equal(g, w), (algorithm, dtype, SHAPES[i // 2], state)


def test_rng_bit_generator_philox_three_word_state() -> None:
    state = np.array([7, 2**64 - 2, 2**64 - 1], np.uint64)  # the counter wraps into its high word
    with jax.enable_x64(True):
        for shape, dtype in [((3, 5), "ui32"), ((4,), "ui64"), ((), "ui8")]:
            got, want = _both(_rng_text("PHILOX", 3, [shape], dtype), state)
            for g, w in zip(got, want, strict=True):
                assert np.array_equal(g, w), (shape, dtype)


def test_rng_bit_generator_from_jax_rbg_keys() -> None:
    """`jax.random.bits`/`normal` with the rbg implementation: the program JAX writes, key to floats."""
    def f(k: jax.Array) -> tuple[jax.Array, jax.Array]:
        key = jax.random.wrap_key_data(k, impl="rbg")
        return jax.random.bits(key, (6, 5)), jax.random.normal(key, (4, 3))
    k = np.array([3, 1, 4, 1], np.uint32)
    text = jax.jit(f).lower(k).as_text()
    assert "stablehlo.rng_bit_generator" in text
    got = N.run_before(parsers.loads(text), [k])
    want = [np.asarray(o) for o in jax.jit(f)(k)]
    assert np.array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_rng_bit_generator_without_a_kernel() -> None:
    state, bits = Value(TensorType((2,), "ui64")), Value(TensorType((4,), "ui32"))
    op = Op("rng_bit_generator", (Value(TensorType((2,), "ui64")),), (state, bits),
            Attrs.of({"rng_algorithm": "THREE_FRY"}))
    with pytest.raises(NumericUnsupported):
        NR.rng_bit_generator(None, op, [np.zeros((1, 3), np.uint64)])  # type: ignore[arg-type]  # u64[3]
    with pytest.raises(NumericUnsupported):
        NR.rng_bit_generator(None, op, [np.zeros((1, 2), np.uint32)])  # type: ignore[arg-type]
