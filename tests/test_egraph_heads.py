"""Questions saturation could never settle are answered before it (`egraph.Heads`): the two sides differ in
an opaque leaf or in a generic op no rewrite makes or removes. The answers are the ones saturation gives;
what the rules prove (scalings through homogeneous ops, arithmetic regrouped) is still asked and proven."""

from __future__ import annotations

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.prove.egraph import EGraph
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

M = TensorType((8, 4), "f32")
T = TensorType((4, 8), "f32")
F = TensorType((32,), "f32")


def _scaled(terms: Terms, x: Term, c: float) -> Term:
    splat = terms.mk("broadcast_in_dim", (terms.scalar(c, "f32"),), (("broadcast_dimensions", ()),), x.type)
    return terms.mk("multiply", (x, splat), (), x.type)


def test_a_generic_op_on_one_side_only_is_ruled_out_unasked() -> None:
    terms = Terms()
    x = terms.param(0, M, "x")
    flat = terms.mk("reshape", (x,), (), F)
    turned = terms.mk("reshape", (terms.mk("transpose", (x,), (("permutation", (1, 0)),), T),), (), F)
    egraph = EGraph()
    assert egraph.equal([(flat, turned)], frozenset()) == (False,)
    assert (egraph.stats.ruled_out, egraph.stats.egraph_calls) == (1, 0)


def test_different_leaves_are_ruled_out_unasked() -> None:
    terms = Terms()
    x, y = terms.param(0, M, "x"), terms.param(1, M, "y")
    egraph = EGraph()
    assert egraph.equal([(_scaled(terms, x, 2.0), _scaled(terms, y, 2.0))], frozenset({x.id, y.id})) == (False,)
    assert egraph.stats.ruled_out == 1


def test_what_the_rules_prove_is_still_asked_and_proven() -> None:
    """reshape(x·4)·0.5 = reshape(x)·2: the constants differ, the leaves and the generic heads do not."""
    terms = Terms()
    x = terms.param(0, M, "x")
    after = _scaled(terms, terms.mk("reshape", (_scaled(terms, x, 4.0),), (), F), 0.5)
    before = _scaled(terms, terms.mk("reshape", (x,), (), F), 2.0)
    egraph = EGraph()
    assert egraph.equal([(after, before)], frozenset({x.id})) == (True,)
    assert (egraph.stats.ruled_out, egraph.stats.egraph_calls) == (0, 1)


def test_only_the_candidates_that_can_meet_are_fed() -> None:
    """Of several candidates for one value, the impossible ones are dropped and the possible one proven."""
    terms = Terms()
    x = terms.param(0, M, "x")
    after = _scaled(terms, _scaled(terms, x, 4.0), 0.5)
    wrong = terms.mk("negate", (terms.mk("exponential", (x,), (), M),), (), M)
    egraph = EGraph()
    assert egraph.equal([(after, wrong), (after, _scaled(terms, x, 2.0))], frozenset({x.id}), first=True) == (False, True)
    assert egraph.stats.nodes_fed < 10
