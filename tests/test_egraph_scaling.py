"""Scalings meet in the e-graph: a mean taken in two steps is the mean taken at once, over the reals.

The terms are built raw (`Terms.mk`, no Python canonicalisation), so the proofs here come from the rules
(`rules/algebra.py`: division as multiplication by the exact reciprocal, constant factors out of × and +,
out of homogeneous ops, exact rational folding) — and the equalities that are false over the reals, or
that the guards exclude, stay unproven.
"""

from __future__ import annotations

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.prove.egraph import EGraph
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

M = TensorType((8, 4), "f32")
V = TensorType((4,), "f32")
INT = TensorType((8, 4), "i32")


def _scale(terms: Terms, op: str, x: Term, c: float) -> Term:
    s = terms.scalar(c, x.type.dtype)
    splat = terms.mk("broadcast_in_dim", (s,), (("broadcast_dimensions", ()),), x.type) if x.type.rank else s
    return terms.mk(op, (x, splat), (), x.type)


def _sum0(terms: Terms, x: Term, init: float = 0.0) -> Term:
    out = TensorType(x.type.shape[1:], x.type.dtype)
    return terms.mk("reduce", (x, terms.scalar(init, x.type.dtype)), (("dimensions", (0,)), ("reducer", "sum")), out)


def _equal(a: Term, b: Term) -> bool:
    return EGraph().equal([(a, b)], frozenset())[0]


def test_mean_of_shard_means_is_the_global_mean() -> None:
    """sum(x/4 + x/4)/4 (each shard's mean's cotangent, then pmean) = sum(x/16 + x/16) (the global mean's)."""
    terms = Terms()
    x = terms.param(0, M, "x")
    local = _scale(terms, "divide", x, 4.0)
    after = _scale(terms, "divide", _sum0(terms, terms.mk("add", (local, local), (), M)), 4.0)
    whole = _scale(terms, "divide", x, 16.0)
    before = _sum0(terms, terms.mk("add", (whole, whole), (), M))
    assert _equal(after, before)


def test_a_scaling_moves_out_of_a_dot_and_a_reshape() -> None:
    terms = Terms()
    x, w = terms.param(0, M, "x"), terms.param(1, TensorType((4, 2), "f32"), "w")
    dims = (("dot_dimension_numbers", "lhs_contract=(1,);rhs_contract=(0,)"),)
    out = TensorType((8, 2), "f32")
    flat = TensorType((16,), "f32")
    after = _scale(terms, "multiply",
                   terms.mk("reshape", (terms.mk("dot_general", (_scale(terms, "divide", x, 8.0), w), dims, out),),
                            (), flat), 0.5)
    before = _scale(terms, "divide", terms.mk("reshape", (terms.mk("dot_general", (x, w), dims, out),), (), flat), 16.0)
    assert _equal(after, before)


def test_division_is_not_multiplication_by_a_rounded_reciprocal() -> None:
    """x/10 is x·(1/10) over the reals; 0.1 in f32 is another real number."""
    terms = Terms()
    x = terms.param(0, M, "x")
    assert not _equal(_scale(terms, "divide", x, 10.0), _scale(terms, "multiply", x, 0.1))
    assert _equal(_scale(terms, "divide", x, 4.0), _scale(terms, "multiply", x, 0.25))


def test_a_sum_started_elsewhere_than_zero_keeps_its_scaling() -> None:
    terms = Terms()
    x = terms.param(0, M, "x")
    after = _scale(terms, "divide", _sum0(terms, x, init=1.0), 2.0)
    before = _sum0(terms, _scale(terms, "divide", x, 2.0), init=1.0)
    assert not _equal(after, before)
    assert _equal(_scale(terms, "divide", _sum0(terms, x), 2.0), _sum0(terms, _scale(terms, "divide", x, 2.0)))


def test_integer_division_stays_truncating() -> None:
    """x/2·2 = x is false on integers (odd x): no reciprocal there."""
    terms = Terms()
    x = terms.param(0, INT, "x")
    assert not _equal(_scale(terms, "multiply", _scale(terms, "divide", x, 2), 2), x)


def test_a_truncating_convert_keeps_its_scaling() -> None:
    terms = Terms()
    x = terms.param(0, M, "x")
    after = terms.mk("convert", (_scale(terms, "multiply", x, 2.0),), (), INT)  # trunc(2x)
    before = _scale(terms, "multiply", terms.mk("convert", (x,), (), INT), 2)  # 2·trunc(x)
    assert not _equal(after, before)
