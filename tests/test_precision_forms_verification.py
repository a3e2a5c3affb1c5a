"""Float widths (`terms.precision`): an op XLA computes in a wider float and rounds back is read as the op in
the narrower float, and the form keeps values; rounding that is not undone is not normalised away.

- Every row of `ops.elementwise.NARROWS`, at every width pair the rule accepts: the canonical form of
  `convert_N(op_W(convert_W(x), ...))` is `op_N(x, ...)`, equal bit for bit where the row says `exact`,
  close where it says `reals` (evaluated by the terms interpreter).
- The `exact` rows rest on double rounding being innocuous through a format of at least 2p + 2 bits:
  checked numerically for bf16 and f16 through f32 against one rounding of the float64 result.
- Dots, reduces, comparisons of widened operands; and what must stay apart: an operand rounded before
  the op, a convert through a type that does not hold the narrow one's values.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.ops.elementwise import EXACT, NARROWS
from scalify_hlo.ops.reducers import Reducer
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

_ARITY = {"add": 2, "subtract": 2, "multiply": 2, "divide": 2, "maximum": 2, "minimum": 2, "atan2": 2,
          "power": 2, "remainder": 2, "polygamma": 2, "zeta": 2, "clamp": 3, "select": 3, "fma": 3}
_PAIRS = [("bf16", "f32"), ("f16", "f32"), ("f32", "f64")]
SHAPE = (64,)


def _values(dtype: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(SHAPE) * np.exp2(rng.integers(-6, 7, SHAPE))
    return x.astype(numpy_dtype(dtype)).astype(np.float32 if dtype in ("bf16", "f16") else numpy_dtype(dtype))


def _same(a: np.ndarray, b: np.ndarray, exact: bool) -> bool:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    both_nan = np.isnan(a64) & np.isnan(b64)
    if exact:
        return bool(np.all((a64 == b64) | both_nan))
    with np.errstate(all="ignore"):
        return bool(np.all(np.isclose(a64, b64, rtol=2e-2, atol=1e-3) | both_nan | (a64 == b64)))


def _widened_op(terms: Terms, op: str, narrow: str, wide: str, *, canonical: bool,
                direct: bool = False) -> tuple[Term, dict[int, Any]]:
    """convert_narrow(op_wide(convert_wide(x_i) ...)) over fresh narrow parameters, and their values
    (`direct`: op_narrow(x_i ...), canonical)."""
    make = terms.apply if canonical else terms.mk
    nt, wt = TensorType(SHAPE, narrow), TensorType(SHAPE, wide)
    env: dict[int, Any] = {}
    args: list[Term] = []
    for i in range(_ARITY.get(op, 1)):
        if op == "select" and i == 0:
            p = terms.param(i, TensorType(SHAPE, "i1"), "p")
            env[p.id] = np.random.default_rng(i).standard_normal(SHAPE) > 0
            args.append(p)
            continue
        x = terms.param(i, nt, f"x{i}")
        env[x.id] = _values(narrow, 10 + i)
        args.append(x if direct else make("convert", (x,), (), wt))
    if direct:
        return terms.apply(op, tuple(args), (), nt), env
    return make("convert", (make(op, tuple(args), (), wt),), (), nt), env


@pytest.mark.parametrize(("narrow", "wide"), _PAIRS)
@pytest.mark.parametrize("op", sorted(NARROWS))
def test_an_op_computed_wider_and_rounded_back_is_the_narrow_op(op: str, narrow: str, wide: str) -> None:
    terms = Terms()
    canon, env = _widened_op(terms, op, narrow, wide, canonical=True)
    plain, _ = _widened_op(terms, op, narrow, wide, canonical=False)
    if op != "fma":  # (fma's own normal form, x*y + z, narrows op by op: its product is not rounded back)
        direct, _ = _widened_op(terms, op, narrow, wide, canonical=True, direct=True)
        assert canon is direct, f"{op}: {canon} is not {direct}"
    with np.errstate(all="ignore"):
        got, want = evaluate(canon, env), evaluate(plain, env)
    assert _same(got, want, NARROWS[op] == EXACT), f"{op} {narrow}<-{wide}: narrow {got[:4]} vs widened {want[:4]}"


@pytest.mark.parametrize("narrow", ["bf16", "f16"])
@pytest.mark.parametrize("op", ["add", "subtract", "multiply", "divide", "sqrt"])
def test_double_rounding_through_float32_is_innocuous(op: str, narrow: str) -> None:
    """Why the `exact` rows are exact: rounding to float32 and then to the narrow type gives the narrow type's
    one rounding of the exact result (float64 holds the exact sum and product of two narrow values, and
    its own rounding of a quotient or a root is innocuous in turn)."""
    nd = ml_dtypes.bfloat16 if narrow == "bf16" else np.float16
    rng = np.random.default_rng(3)
    n = 200_000
    x = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(nd).astype(np.float64)
    y = (rng.standard_normal(n) * np.exp2(rng.integers(-12, 12, n))).astype(nd).astype(np.float64)
    fn = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
          "sqrt": lambda a, b: np.sqrt(np.abs(a))}[op]
    with np.errstate(all="ignore"):
        exact = fn(x, y)
        once = exact.astype(nd).astype(np.float64)
        twice = exact.astype(np.float32).astype(nd).astype(np.float64)
    assert _same(once, twice, exact=True)


def test_a_dot_of_widened_operands_is_the_mixed_precision_dot_and_narrows() -> None:
    terms = Terms()
    a = terms.param(0, TensorType((4, 8), "bf16"), "a")
    b = terms.param(1, TensorType((8, 3), "bf16"), "b")
    dims = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)
    wa = terms.apply("convert", (a,), (), TensorType((4, 8), "f32"))
    wb = terms.apply("convert", (b,), (), TensorType((8, 3), "f32"))
    wide = terms.apply("dot_general", (wa, wb), dims, TensorType((4, 3), "f32"))
    assert wide is terms.apply("dot_general", (a, b), dims, TensorType((4, 3), "f32"))  # exact: no note
    assert not terms.notes
    narrow = terms.apply("convert", (wide,), (), TensorType((4, 3), "bf16"))
    assert narrow is terms.apply("dot_general", (a, b), dims, TensorType((4, 3), "bf16"))
    assert terms.notes  # the accumulation's rounding: over the reals, and the proof says so


def test_a_sum_computed_wider_is_the_narrow_sum() -> None:
    terms = Terms()
    x = terms.param(0, TensorType((4, 8), "bf16"), "x")
    attrs = (("dimensions", (1,)), ("computation", Reducer.SUM.value))
    wx = terms.apply("convert", (x,), (), TensorType((4, 8), "f32"))
    total = terms.apply("reduce", (wx, terms.scalar(0.0, "f32")), attrs, TensorType((4,), "f32"))
    narrow = terms.apply("convert", (total,), (), TensorType((4,), "bf16"))
    assert narrow is terms.apply("reduce", (x, terms.scalar(0.0, "bf16")), attrs, TensorType((4,), "bf16"))


def test_a_comparison_of_widened_operands_is_the_comparison() -> None:
    terms = Terms()
    t = TensorType((4,), "bf16")
    x, y = terms.param(0, t, "x"), terms.param(1, t, "y")
    w = TensorType((4,), "f32")
    attrs = (("comparison_direction", "GT"), ("compare_type", "FLOAT"))
    wide = terms.apply("compare", (terms.apply("convert", (x,), (), w), terms.apply("convert", (y,), (), w)),
                       attrs, TensorType((4,), "i1"))
    assert wide is terms.apply("compare", (x, y), attrs, TensorType((4,), "i1"))
    # widened and rounded back is the value itself
    assert terms.apply("convert", (terms.apply("convert", (x,), (), w),), (), t) is x


def test_rounding_that_is_not_undone_stays() -> None:
    terms = Terms()
    w, n = TensorType((4,), "f32"), TensorType((4,), "bf16")
    u = terms.param(0, w, "u")  # a float32 input
    x = terms.param(1, n, "x")
    # u + x computed in float32, rounded: u is not a bf16 value, the add is not a bf16 add
    mixed = terms.apply("add", (u, terms.apply("convert", (x,), (), w)), (), w)
    assert terms.apply("convert", (mixed,), (), n).op == "convert"
    # rounded to bf16 and widened again: a rounding of u, not u
    assert terms.apply("convert", (terms.apply("convert", (u,), (), n),), (), w).op == "convert"
    # a splat the narrow type cannot hold keeps the op wide
    third = terms.splat(1 / 3, w)
    scaled = terms.apply("multiply", (terms.apply("convert", (x,), (), w), third), (), w)
    assert terms.apply("convert", (scaled,), (), n).op == "convert"
    # f16 does not hold every bf16 value: no narrowing through it
    h = TensorType((4,), "f16")
    via = terms.apply("add", (terms.apply("convert", (x,), (), h), terms.apply("convert", (x,), (), h)), (), h)
    assert terms.apply("convert", (via,), (), n).op == "convert"


def test_data_movement_computed_wider_is_the_narrow_movement() -> None:
    """XLA's bf16 normalization widens broadcasts, reshapes and transposes too; they round nothing."""
    terms = Terms()
    x = terms.param(0, TensorType((2, 3), "bf16"), "x")
    cases = [("broadcast_in_dim", (("broadcast_dimensions", (0, 2)),), (2, 4, 3)),
             ("reshape", (), (3, 2)), ("transpose", (("permutation", (1, 0)),), (3, 2)),
             ("slice", (("start_indices", (0, 1)), ("limit_indices", (2, 3)), ("strides", (1, 1))), (2, 2))]
    for op, attrs, shape in cases:
        wide = terms.apply(op, (terms.apply("convert", (x,), (), TensorType((2, 3), "f32")),), attrs,
                           TensorType(shape, "f32"))
        narrow = terms.apply("convert", (wide,), (), TensorType(shape, "bf16"))
        assert narrow is terms.apply(op, (x,), attrs, TensorType(shape, "bf16")), op


# ------------------------------------------------------------------------------------------ excess precision


def test_with_excess_precision_a_dropped_rounding_is_no_difference() -> None:
    """XLA computes `convert_f32(mul_bf16(x, x))` as `mul_f32(x, x)` (xla_allow_excess_precision): the same
    under `excess_precision`, two values without it (the rounding to bf16 is real)."""
    for excess in (True, False):
        terms = Terms(excess_precision=excess)
        x = terms.param(0, TensorType((4,), "bf16"), "x")
        n, w = TensorType((4,), "bf16"), TensorType((4,), "f32")
        rounded = terms.apply("convert", (terms.apply("multiply", (x, x), (), n),), (), w)
        wx = terms.apply("convert", (x,), (), w)
        unrounded = terms.apply("multiply", (wx, wx), (), w)
        assert (rounded is unrounded) == excess
        # either way, an op computed in f32 and rounded back is the bf16 op
        assert terms.apply("convert", (unrounded,), (), n) is terms.apply("multiply", (x, x), (), n)


def test_excess_precision_keeps_values_over_the_reals() -> None:
    terms = Terms(excess_precision=True)
    t = TensorType(SHAPE, "bf16")
    x, y = terms.param(0, t, "x"), terms.param(1, t, "y")
    env = {x.id: _values("bf16", 1), y.id: _values("bf16", 2)}
    w = TensorType(SHAPE, "f32")
    canon = terms.apply("convert", (terms.apply("tanh", (terms.apply("add", (x, y), (), t),), (), t),), (), w)
    plain = terms.mk("convert", (terms.mk("tanh", (terms.mk("add", (x, y), (), t),), (), t),), (), w)
    assert canon is not plain and canon.op == "tanh"  # computed in f32 throughout
    with np.errstate(all="ignore"):
        assert _same(evaluate(canon, env), evaluate(plain, env), exact=False)


def test_the_compiled_bf16_rmsnorm_needs_excess_precision() -> None:
    """The fixture verified with --excess-precision is not proven without it: the flag is what proves it."""
    from pathlib import Path

    from scalify_hlo.prove.engine import Options, prove

    d = Path(__file__).parent / "fixtures" / "rmsnorm_bf16_excess_precision_compiled"
    assert prove(d / "before.mlir", d / "after.hlo", Options(excess_precision=True)).name == "equivalent"
    assert prove(d / "before.mlir", d / "after.hlo", Options()).name == "unknown"


def test_diff_takes_excess_precision_as_a_flag() -> None:
    from pathlib import Path

    from conftest import run_cli

    d = Path(__file__).parent / "fixtures" / "rmsnorm_bf16_excess_precision_compiled"
    assert run_cli("diff", d / "before.mlir", d / "after.hlo", "-q").returncode == 2  # unknown: exact by default
    run = run_cli("diff", d / "before.mlir", d / "after.hlo", "--excess-precision")
    assert run.returncode == 0 and "excess-precision" in run.stdout, run.stdout
