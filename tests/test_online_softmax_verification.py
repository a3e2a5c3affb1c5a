"""Ring attention's online softmax: blockwise reductions in one normal form (`scalify_hlo.terms.blockwise`).

The unrolled ring (K/V blocks rotated with ppermute, running max, rescaled denominator and output) is
proven equal to one softmax over all keys; no single-op mutant is proven equivalent where the numeric
oracle disagrees. Small term-level cases pin each identity, and the look-alikes it must not accept.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fixtures
from mutations import SWEEP, every_mutant_checked

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import DotDims, Literal, TensorType
from scalify_hlo.prove.engine import prove
from scalify_hlo.terms.block_equality import equal
from scalify_hlo.terms.blockwise import Normaliser
from scalify_hlo.terms.pushing import push_slice
from scalify_hlo.terms.slicing import slice_of
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

BY_NAME = {f.name: f for f in fixtures()}
F32 = "f32"
NEG = float(np.finfo(np.float32).min)


def test_ring_attention_is_proven_blockwise() -> None:
    fx = BY_NAME["ring_attention_shard_map"]
    report = prove(fx.before, fx.after)
    assert report.name == "equivalent", report.render()
    assert any("online softmax" in n for n in report.notes), report.notes


@pytest.mark.parametrize("stride", SWEEP)
def test_ring_attention_mutants_are_never_false_equivalent(stride: int) -> None:
    fx = BY_NAME["ring_attention_shard_map"]
    seen = every_mutant_checked(parsers.load(fx.before), parsers.load(fx.after), lambda b, a: prove(b, a).name,
                                seeds=(0,), stride=stride)
    assert seen.get("discrepancy", 0) >= 30 // stride and seen.get("equivalent", 0) >= 10 // stride, seen


# -- term-level cases: rows [4, 8] of scores, two key blocks of 4 -----------------------------------------

def same(terms: Terms, a: Term, b: Term) -> bool:
    """`equal` without its safety net: a negative case must fail by comparison, not by an exception."""
    norm = Normaliser(terms)
    return norm(a) is norm(b)


def _t(*shape: int) -> TensorType:
    return TensorType(shape, F32)


def _reduce(terms: Terms, x: Term, how: str) -> Term:
    init = terms.scalar(-np.inf if how == "max" else 0.0, F32)
    return terms.apply("reduce", (x, init), (("dimensions", (1,)), ("reducer", how)), _t(x.type.shape[0]))


def _bcast(terms: Terms, m: Term, shape: tuple[int, ...]) -> Term:
    return terms.apply("broadcast_in_dim", (m,), (("broadcast_dimensions", (0,)),), _t(*shape))


def _op(terms: Terms, op: str, *args: Term) -> Term:
    return terms.apply(op, args, (), args[0].type)


def _blocks(terms: Terms) -> tuple[Term, Term, Term]:
    s = terms.param(0, _t(4, 8), "s")
    return s, slice_of(terms, s, (0, 0), (4, 4)), slice_of(terms, s, (0, 4), (4, 8))


def _online(terms: Terms, first: Term, second: Term, rescale: bool = True) -> tuple[Term, Term]:
    """(running max, denominator) after the two blocks, the way a flash-attention loop computes them."""
    m1 = _reduce(terms, first, "max")
    d1 = _reduce(terms, _op(terms, "exponential", _op(terms, "subtract", first, _bcast(terms, m1, (4, 4)))), "sum")
    m2 = _op(terms, "maximum", m1, _reduce(terms, second, "max"))
    corr = _op(terms, "exponential", _op(terms, "subtract", m1, m2))
    p2 = _op(terms, "exponential", _op(terms, "subtract", second, _bcast(terms, m2, (4, 4))))
    d2 = _op(terms, "add", _op(terms, "multiply", d1, corr) if rescale else d1, _reduce(terms, p2, "sum"))
    return m2, d2


def _whole(terms: Terms, s: Term) -> tuple[Term, Term]:
    m = _reduce(terms, s, "max")
    return m, _reduce(terms, _op(terms, "exponential", _op(terms, "subtract", s, _bcast(terms, m, (4, 8)))), "sum")


def test_online_max_and_denominator_are_the_whole_rows() -> None:
    terms = Terms()
    s, a, b = _blocks(terms)
    m, d = _online(terms, a, b)
    wm, wd = _whole(terms, s)
    assert equal(terms, m, wm) and equal(terms, d, wd)


def test_blocks_in_either_order_are_the_same_reduction() -> None:
    terms = Terms()
    s, a, b = _blocks(terms)
    _, d = _online(terms, b, a)  # the ring visits its own block first, then the earlier ones
    assert equal(terms, d, _whole(terms, s)[1])


def test_denominator_without_rescaling_is_not_the_whole() -> None:
    terms = Terms()
    s, a, b = _blocks(terms)
    _, d = _online(terms, a, b, rescale=False)
    assert not same(terms, d, _whole(terms, s)[1])


def test_overlapping_or_gapped_blocks_are_not_the_whole() -> None:
    terms = Terms()
    s, a, _ = _blocks(terms)
    _, d = _online(terms, a, a)  # the same block twice
    assert not same(terms, d, _whole(terms, s)[1])
    g = terms.param(1, _t(4, 12), "g")
    _, d = _online(terms, slice_of(terms, g, (0, 0), (4, 4)), slice_of(terms, g, (0, 8), (4, 12)))
    assert not same(terms, d, _whole(terms, slice_of(terms, g, (0, 0), (4, 8)))[1])


def test_rescaling_from_the_lowest_float_may_drop_a_zero_but_not_an_overflow() -> None:
    """0·exp(NEG - m) = 0 (the first step of the ring: nothing accumulated yet); 0·exp(m - NEG) is 0·inf
    in floats, NaN: not zero."""
    terms = Terms()
    _, a, _ = _blocks(terms)
    m = _reduce(terms, a, "max")
    neg = terms.splat(NEG, _t(4))
    zero = terms.splat(0.0, _t(4))
    norm = Normaliser(terms)
    safe = _op(terms, "multiply", zero, _op(terms, "exponential", _op(terms, "subtract", neg, m)))
    risky = _op(terms, "multiply", zero, _op(terms, "exponential", _op(terms, "subtract", m, neg)))
    assert norm(safe) is norm(zero)
    assert norm(risky) is not norm(zero)


def test_mismatched_value_blocks_are_not_merged_into_one_product() -> None:
    """dot(p[:, :4], v[4:]) + dot(p[:, 4:], v[:4]) is not dot(p, v)."""
    terms = Terms()
    p = terms.param(0, _t(4, 8), "p")
    v = terms.param(1, _t(8, 3), "v")
    dims = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)

    def dot(x: Term, y: Term) -> Term:
        return terms.apply("dot_general", (x, y), dims, _t(4, 3))

    left, right = slice_of(terms, p, (0, 0), (4, 4)), slice_of(terms, p, (0, 4), (4, 8))
    top, bottom = slice_of(terms, v, (0, 0), (4, 3)), slice_of(terms, v, (4, 0), (8, 3))
    whole = dot(p, v)
    assert equal(terms, _op(terms, "add", dot(right, bottom), dot(left, top)), whole)
    assert not same(terms, _op(terms, "add", dot(left, bottom), dot(right, top)), whole)


def test_masked_blocks_merge_only_with_their_own_mask() -> None:
    terms = Terms()
    s, _, b = _blocks(terms)
    causal = np.tril(np.ones((4, 8), bool), 4)
    mask = terms.constant(Literal(causal, "i1"), TensorType((4, 8), "i1"))
    fill = terms.splat(NEG, _t(4, 8))
    whole = terms.apply("select", (mask, s, fill), (), _t(4, 8))
    first = push_slice(terms, whole, (0, 0), (4, 4))
    second = push_slice(terms, whole, (0, 4), (4, 8))
    both = terms.apply("concatenate", (first, second), (("dimension", 1),), _t(4, 8))
    assert equal(terms, both, whole)
    unmasked = terms.apply("concatenate", (first, b), (("dimension", 1),), _t(4, 8))
    assert not same(terms, unmasked, whole)


def test_missing_rescale_is_named_where_unscaled_blocks_are_added() -> None:
    report = prove(BY_NAME["ring_attention_shard_map_no_rescale"].before,
                    BY_NAME["ring_attention_shard_map_no_rescale"].after)
    first = report.findings[0]
    assert report.name == "discrepancy" and "not on a common scale" in first.reason, report.render()
    assert first.after is not None and first.after.opcode == "add"


def test_blocks_from_the_wrong_neighbour_blame_the_permute() -> None:
    report = prove(BY_NAME["ring_attention_shard_map_wrong_direction"].before,
                    BY_NAME["ring_attention_shard_map_wrong_direction"].after)
    first = report.findings[0]
    assert report.name == "discrepancy" and "not its consecutive blocks" in first.reason, report.render()
    assert first.after is not None and first.after.opcode == "collective_permute"
    assert first.also and first.also[0].source != first.after.source  # where the misplaced blocks meet
