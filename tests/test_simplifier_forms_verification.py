"""What XLA's algebraic simplifier writes meets what it was written from: each pair of spellings below is
one term of the table, and that term evaluates to NumPy's value of the original. (Found on the `algsimp`
pass pair of a train step's dump, whose unproven outputs differed in float32 by rounding alone.)

- a transpose that moves only unit dims, then a reshape of a join, is the reshape of the join;
- max(x, -inf) and min(x, inf) are x, also where x is NaN; max(x, x) is x;
- x / broadcast(s) is x · broadcast(1 / s) over the reals (floats only);
- a reduce, from its identity, over unit dims a reshape added is that reshape (a unit block of a blocked
  reduction stays a reduce: the blockwise normaliser merges those);
- dots (`terms/dots.py`): a transposed operand folds into the dimension numbers; a matrix product between
  reshapes that merge free dims, or contracted dims alike on both sides, is the dot it was decomposed from;
  a unit batch dim is a free dim.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import scalify_hlo.ops.registry  # noqa: F401  (registers the kernels the term evaluation runs)
from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


def _t(*shape: int, dtype: str = "f32") -> TensorType:
    return TensorType(shape, dtype)


def _bcast(terms: Terms, x: Term, dims: tuple[int, ...], out: TensorType) -> Term:
    return terms.apply("broadcast_in_dim", (x,), (("broadcast_dimensions", dims),), out)


def test_transpose_of_unit_dims_then_reshape_of_a_join_is_the_reshape() -> None:
    terms = Terms()
    a, b = terms.param(0, _t(1, 16, 1, 2), "a"), terms.param(1, _t(1, 16, 1, 2), "b")
    joined = terms.apply("concatenate", (a, b), (("dimension", 3),), _t(1, 16, 1, 4))
    moved = terms.apply("transpose", (joined,), (("permutation", (0, 2, 1, 3)),), _t(1, 1, 16, 4))
    via_transpose = terms.apply("reshape", (moved,), (), _t(16, 4))
    direct = terms.apply("reshape", (joined,), (), _t(16, 4))
    assert via_transpose is direct
    rng = np.random.default_rng(0)
    xa, xb = rng.standard_normal((2, 1, 16, 1, 2)).astype(np.float32)
    want = np.concatenate([xa, xb], axis=3).transpose(0, 2, 1, 3).reshape(16, 4)
    np.testing.assert_array_equal(evaluate(direct, {a.id: xa, b.id: xb}), want)


@pytest.mark.parametrize(("op", "unit"), [("maximum", -math.inf), ("minimum", math.inf)])
def test_max_and_min_with_their_unit_are_the_value(op: str, unit: float) -> None:
    terms = Terms()
    x = terms.param(0, _t(4, 3), "x")
    assert terms.apply(op, (x, terms.splat(unit, x.type)), (), x.type) is x
    assert terms.apply(op, (terms.splat(unit, x.type), x), (), x.type) is x
    assert terms.apply(op, (x, x), (), x.type) is x
    assert terms.apply(op, (x, terms.splat(0.0, x.type)), (), x.type) is not x
    values = np.array([np.nan, -np.inf, np.inf, 1.5], np.float32)
    fn = np.maximum if op == "maximum" else np.minimum
    np.testing.assert_array_equal(fn(values, np.float32(unit)), values)  # NaN too: XLA's max propagates it


def test_product_with_a_broadcast_reciprocal_is_the_division() -> None:
    terms = Terms()
    x, s = terms.param(0, _t(2, 16, 16), "x"), terms.param(1, _t(2, 16), "s")
    recip = terms.apply("divide", (terms.splat(1.0, s.type), s), (), s.type)
    product = terms.apply("multiply", (x, _bcast(terms, recip, (0, 1), x.type)), (), x.type)
    quotient = terms.apply("divide", (x, _bcast(terms, s, (0, 1), x.type)), (), x.type)
    assert product is quotient
    assert any("x · (1/y)" in n for n in terms.notes)  # a proof that used it says so
    rng = np.random.default_rng(1)
    xs, ss = rng.standard_normal((2, 16, 16)), rng.standard_normal((2, 16)) + 3
    np.testing.assert_allclose(evaluate(product, {x.id: xs, s.id: ss}), xs / ss[:, :, None], rtol=1e-6)
    # integers: 1/s truncates, so the product is not the division
    terms = Terms()
    xi, si = terms.param(0, _t(4, dtype="i32"), "x"), terms.param(1, _t(4, dtype="i32"), "s")
    recip_i = terms.apply("divide", (terms.splat(1, si.type), si), (), si.type)
    assert terms.apply("multiply", (xi, recip_i), (), xi.type).op == "multiply"


def _reduce(terms: Terms, x: Term, dims: tuple[int, ...], init: float, out: TensorType, reducer: str = "sum") -> Term:
    return terms.apply("reduce", (x, terms.scalar(init, out.dtype)),
                       (("dimensions", dims), ("reducer", reducer)), out)


def test_reduce_over_unit_dims_a_reshape_added_is_the_reshape() -> None:
    terms = Terms()
    x = terms.param(0, _t(1, 16), "x")
    widened = terms.apply("reshape", (x,), (), _t(1, 16, 1))
    assert _reduce(terms, widened, (2,), 0.0, _t(1, 16)) is x
    assert _reduce(terms, widened, (2,), -math.inf, _t(1, 16), "max") is x
    assert _reduce(terms, widened, (2,), 1.0, _t(1, 16)).op == "reduce"  # 1 + x is not x
    # a unit dim of the operand itself (a block of one row) stays a reduction
    block = terms.param(1, _t(3, 1), "block")
    assert _reduce(terms, block, (1,), 0.0, _t(3)).op == "reduce"
    xs = np.random.default_rng(2).standard_normal((1, 16)).astype(np.float32)
    np.testing.assert_array_equal(evaluate(_reduce(terms, widened, (2,), 0.0, _t(1, 16)), {x.id: xs}), xs)


# -- dots (`terms/dots.py`) ---------------------------------------------------------------------------------

def _dot(terms: Terms, x: Term, y: Term, dims: tuple[tuple[int, ...], ...], out: TensorType) -> Term:
    from scalify_hlo.ir.nodes import DotDims

    return terms.apply("dot_general", (x, y), (("dot_dimension_numbers", DotDims(*dims)),), out)


def test_transposed_operand_folds_into_the_dimension_numbers() -> None:
    terms = Terms()
    x, w = terms.param(0, _t(16, 32), "x"), terms.param(1, _t(16, 32), "w")
    wt = terms.apply("transpose", (w,), (("permutation", (1, 0)),), _t(32, 16))
    folded = _dot(terms, x, wt, ((), (), (1,), (0,)), _t(16, 16))
    assert folded is _dot(terms, x, w, ((), (), (1,), (1,)), _t(16, 16))
    rng = np.random.default_rng(3)
    xs, ws = rng.standard_normal((2, 16, 32))
    np.testing.assert_allclose(evaluate(folded, {x.id: xs, w.id: ws}), xs @ ws.T, rtol=1e-5)


def test_dot_decomposer_meets_the_dot_it_came_from_in_plain_equivalence() -> None:
    """[1, 16, 2, 4] · [2, 4, 32] contracting (2, 3) with (0, 1), and the same as a [16, 8] · [8, 32]
    matrix product between reshapes (XLA's dot decomposer): one term where no layout is read off the
    terms (pass pairs); kept apart under a layout derivation (`dots._dot_views`)."""
    for views in (True, False):
        terms = Terms(dot_views=views)
        x, w = terms.param(0, _t(1, 16, 2, 4), "x"), terms.param(1, _t(2, 4, 32), "w")
        direct = _dot(terms, x, w, ((), (), (2, 3), (0, 1)), _t(1, 16, 32))
        xm = terms.apply("reshape", (x,), (), _t(16, 8))
        wm = terms.apply("reshape", (w,), (), _t(8, 32))
        matrix = terms.apply("reshape", (_dot(terms, xm, wm, ((), (), (1,), (0,)), _t(16, 32)),), (),
                             _t(1, 16, 32))
        assert (matrix is direct) == views
        rng = np.random.default_rng(4)
        xs, ws = rng.standard_normal((1, 16, 2, 4)), rng.standard_normal((2, 4, 32))
        np.testing.assert_allclose(evaluate(matrix, {x.id: xs, w.id: ws}), np.einsum("bsij,ijk->bsk", xs, ws),
                                   rtol=1e-5)
        # merging a contracted dim on one side only is not the same contraction: no rewrite
        w8 = terms.param(4, _t(8, 32), "w8")
        assert _dot(terms, xm, w8, ((), (), (1,), (0,)), _t(16, 32)).args[0] is xm


def test_unit_batch_dims_are_free_dims() -> None:
    """A batch dim of size 1 and the dot without it are one term."""
    terms = Terms()
    q, k = terms.param(2, _t(1, 16, 4), "q"), terms.param(3, _t(1, 16, 4), "k")
    batched = _dot(terms, q, k, ((0,), (0,), (2,), (2,)), _t(1, 16, 16))
    unbatched = terms.apply("reshape", (_dot(terms, q, k, ((), (), (2,), (2,)), _t(1, 16, 1, 16)),), (),
                            _t(1, 16, 16))
    assert batched is unbatched


def test_a_transpose_of_free_dims_folds_into_a_transposed_result() -> None:
    terms = Terms()
    x, y = terms.param(0, _t(16, 2, 4), "x"), terms.param(1, _t(5, 4), "y")
    xt = terms.apply("transpose", (x,), (("permutation", (1, 0, 2)),), _t(2, 16, 4))
    folded = _dot(terms, xt, y, ((), (), (2,), (1,)), _t(2, 16, 5))
    assert folded.op == "transpose" and folded.args[0].op == "dot_general" and folded.args[0].args[0] is x
    rng = np.random.default_rng(5)
    xs, ys = rng.standard_normal((16, 2, 4)), rng.standard_normal((5, 4))
    np.testing.assert_allclose(evaluate(folded, {x.id: xs, y.id: ys}), np.einsum("sjk,nk->jsn", xs, ys), rtol=1e-5)


# -- reduction bodies after XLA's float normalization ----------------------------------------------------------

_BODIES = """HloModule bodies, entry_computation_layout={(bf16[8]{0}, f32[8]{0})->(bf16[], f32[], f32[])}

%wide (a: bf16[], b: bf16[]) -> bf16[] {
  %a = bf16[] parameter(0)
  %b = bf16[] parameter(1)
  %ca = f32[] convert(%a)
  %cb = f32[] convert(%b)
  %s = f32[] add(%ca, %cb)
  ROOT %r = bf16[] convert(%s)
}

%rounded (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  %m = f32[] maximum(%x, %y)
  %n = bf16[] convert(%m)
  ROOT %w = f32[] convert(%n)
}

%other (p: f32[], q: f32[]) -> f32[] {
  %p = f32[] parameter(0)
  %q = f32[] parameter(1)
  %s = f32[] add(%p, %q)
  ROOT %t = f32[] multiply(%s, %s)
}

ENTRY %main (v: bf16[8], u: f32[8]) -> (bf16[], f32[], f32[]) {
  %v = bf16[8]{0} parameter(0)
  %u = f32[8]{0} parameter(1)
  %zb = bf16[] constant(0)
  %zf = f32[] constant(0)
  %r0 = bf16[] reduce(%v, %zb), dimensions={0}, to_apply=%wide
  %r1 = f32[] reduce(%u, %zf), dimensions={0}, to_apply=%rounded
  %r2 = f32[] reduce(%u, %zf), dimensions={0}, to_apply=%other
  ROOT %t = (bf16[], f32[], f32[]) tuple(%r0, %r1, %r2)
}
"""


def test_reduction_bodies_between_float_converts_are_their_reducer() -> None:
    """A bf16 sum computed in f32 is a sum; an f32 max rounded to bf16 at each step (what float normalization
    writes) is a max only where roundings are read away (`--excess-precision`, as `passes` does), another
    computation otherwise; a body doing more than one op is no reducer. (Hand-written HLO pinning the body
    forms; `tests/test_passes.py` has XLA's own.)"""
    from scalify_hlo import parsers
    from scalify_hlo.ir.nodes import walk
    from scalify_hlo.ops.reducers import Reducer, reducer_of, rounding_reducers

    module = parsers.loads(_BODIES, "bodies.hlo")
    bodies = [op.regions[0] for op in walk(module.main.body.ops) if op.opcode == "reduce"]
    assert [reducer_of(b) for b in bodies] == [Reducer.SUM, None, None]
    with rounding_reducers(True):
        assert [reducer_of(b) for b in bodies] == [Reducer.SUM, Reducer.MAX, None]


def test_a_broadcast_free_dim_moves_out_of_the_dot() -> None:
    """dot(x, broadcast(s)) with the broadcast along a free dim: the narrow dot broadcast (XLA computes the
    gradient of a mean-reduced loss at width one, then tiles it)."""
    terms = Terms()
    x, s = terms.param(0, _t(32, 16), "x"), terms.param(1, _t(32), "s")
    for width in (8, 2):
        wide = _bcast(terms, s, (0,), _t(32, width))
        out = _dot(terms, x, wide, ((), (), (0,), (0,)), _t(16, width))
        assert out.op == "broadcast_in_dim" and out.attr("broadcast_dimensions") == (0,), out
        rng = np.random.default_rng(4)
        xs, ss = rng.standard_normal((32, 16)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
        want = xs.T @ np.broadcast_to(ss[:, None], (32, width))
        np.testing.assert_allclose(evaluate(out, {x.id: xs, s.id: ss}), want, rtol=1e-5)
    # a broadcast along a contracted dim is a sum of equal products: not moved
    y = terms.param(2, _t(16), "y")
    along = _bcast(terms, y, (1,), _t(32, 16))
    assert _dot(terms, x, along, ((), (), (0,), (0,)), _t(16, 16)).op == "dot_general"


@pytest.mark.parametrize(("reducer", "init", "dtype"), [("and", 1.0, "i1"), ("or", 0.0, "i1")])
def test_a_logical_reduce_over_broadcast_dims_drops_them(reducer: str, init: float, dtype: str) -> None:
    terms = Terms()
    g = terms.param(0, _t(16, dtype=dtype), "g")
    tiled = _bcast(terms, g, (0,), _t(16, 4, dtype=dtype))
    assert _reduce(terms, tiled, (1,), init, _t(16, dtype=dtype), reducer) is g
    whole = _reduce(terms, tiled, (0, 1), init, _t(dtype=dtype), reducer)
    assert whole is _reduce(terms, g, (0,), init, _t(dtype=dtype), reducer)
    rng = np.random.default_rng(5)
    gs = (rng.standard_normal(16) > 0) if dtype == "i1" else rng.standard_normal(16).astype(np.float32)
    plain = terms.mk("reduce", (tiled, terms.scalar(init, dtype)), (("dimensions", (0, 1)), ("reducer", reducer)),
                     _t(dtype=dtype))
    np.testing.assert_array_equal(evaluate(whole, {g.id: gs}), evaluate(plain, {g.id: gs}))
    # a sum over copies is not idempotent, and a maximum is left to the blockwise normaliser: reduces stay
    h = _bcast(terms, terms.param(1, _t(16), "h"), (0,), _t(16, 4))
    assert _reduce(terms, h, (1,), 0.0, _t(16)).op == "reduce"
    assert _reduce(terms, h, (1,), -math.inf, _t(16), "max").op == "reduce"


@pytest.mark.parametrize(("direction", "flag", "negated"), [("NE", 0.0, False), ("EQ", 1.0, False),
                                                            ("EQ", 0.0, True), ("NE", 1.0, True)])
def test_a_boolean_compared_with_a_constant_is_itself_or_its_negation(direction: str, flag: float,
                                                                      negated: bool) -> None:
    """JAX writes a while loop's `i < 5` as `(i < 5) != False`; XLA's simplifier drops the comparison."""
    terms = Terms()
    p = terms.param(0, _t(8, dtype="i1"), "p")
    attrs = (("comparison_direction", direction),)
    canon = terms.apply("compare", (p, terms.splat(flag, _t(8, dtype="i1"))), attrs, _t(8, dtype="i1"))
    assert canon is (terms.apply("not", (p,), (), _t(8, dtype="i1")) if negated else p), canon
    plain = terms.mk("compare", (p, terms.splat(flag, _t(8, dtype="i1"))), attrs, _t(8, dtype="i1"))
    ps = np.array([True, False] * 4)
    np.testing.assert_array_equal(evaluate(canon, {p.id: ps}), evaluate(plain, {p.id: ps}))
