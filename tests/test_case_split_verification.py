"""Case analysis along a mesh axis (pipeline stages, ring loops) and the slice normal form it relies on.

The pipeline's shard_map body picks its input with `where(axis_index("pp") == 0, ...)` and hands stage
outputs on with a non-cyclic ppermute: proven by deriving the body once per "pp" coordinate. The unrolled
microbatch loop is `f(x[m])` stacked, which the slice normal form turns into `f(x)`. A `fori_loop` whose
body permutes along the case axis is run iteration by iteration (its trip count is static).
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import fixtures
from mutations import SWEEP, every_mutant_checked

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import DotDims, Literal, TensorType
from scalify_hlo.prove.engine import prove
from scalify_hlo.terms.table import Terms

BY_NAME = {f.name: f for f in fixtures()}


def test_pipeline_mutants_are_never_false_equivalent() -> None:
    fx = BY_NAME["pipeline_ppermute_shard_map"]
    seen = every_mutant_checked(parsers.load(fx.before), parsers.load(fx.after), lambda b, a: prove(b, a).name)
    assert sum(seen.values()) >= 20 and seen.get("discrepancy", 0) >= 10, seen


@pytest.mark.parametrize("stride", SWEEP)
def test_fori_ring_is_unrolled_and_its_mutants_are_never_false_equivalent(stride: int) -> None:
    fx = BY_NAME["ring_attention_shard_map_fori"]
    assert prove(fx.before, fx.after).name == "equivalent"
    seen = every_mutant_checked(parsers.load(fx.before), parsers.load(fx.after), lambda b, a: prove(b, a).name,
                                seeds=(0,), stride=stride)
    assert seen.get("discrepancy", 0) >= 10 // stride, seen


def test_wrong_pairs_blames_the_permute_that_sends_nothing_forward() -> None:
    fx = BY_NAME["pipeline_ppermute_shard_map_wrong_pairs"]
    report = prove(fx.before, fx.after)
    assert report.name == "discrepancy"
    first = report.findings[0]
    assert first.after is not None and first.after.opcode == "collective_permute", report.render()
    assert first.counterexample is not None


def _slice(terms: Terms, x, lo: tuple[int, ...], hi: tuple[int, ...]):  # type: ignore[no-untyped-def]
    from scalify_hlo.terms.slicing import slice_of

    return slice_of(terms, x, lo, hi)


def test_microbatches_stacked_are_the_whole_batch() -> None:
    """concat_m(tanh(x[m] @ w)) == tanh(x @ w) as terms, without the e-graph."""
    terms = Terms()
    x = terms.param(0, TensorType((2, 4, 8), "f32"), "x")
    w = terms.param(1, TensorType((8, 3), "f32"), "w")
    dims = (("dot_dimension_numbers", DotDims((), (), (2,), (0,))),)
    whole = terms.apply("tanh", (terms.apply("dot_general", (x, w), dims, TensorType((2, 4, 3), "f32")),), (),
                        TensorType((2, 4, 3), "f32"))
    parts = []
    for m in range(2):
        xm = terms.apply("reshape", (_slice(terms, x, (m, 0, 0), (m + 1, 4, 8)),), (), TensorType((4, 8), "f32"))
        mm = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)
        y = terms.apply("tanh", (terms.apply("dot_general", (xm, w), mm, TensorType((4, 3), "f32")),), (),
                        TensorType((4, 3), "f32"))
        parts.append(terms.apply("reshape", (y,), (), TensorType((1, 4, 3), "f32")))
    stacked = terms.apply("concatenate", tuple(parts), (("dimension", 0),), TensorType((2, 4, 3), "f32"))
    assert stacked is whole


@pytest.mark.parametrize("cut", [(1, 2), (0, 1)])
def test_slicing_a_contracted_dim_is_not_pulled_out(cut: tuple[int, int]) -> None:
    """dot(x[:, a:b], w[a:b]) is a partial contraction, not a slice of dot(x, w)."""
    terms = Terms()
    x = terms.param(0, TensorType((4, 2), "f32"), "x")
    w = terms.param(1, TensorType((2, 3), "f32"), "w")
    lo, hi = cut
    xs = _slice(terms, x, (0, lo), (4, hi))
    ws = _slice(terms, w, (lo, 0), (hi, 3))
    dims = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)
    out = terms.apply("dot_general", (xs, ws), dims, TensorType((4, 3), "f32"))
    assert out.op == "dot_general" and out.args == (xs, ws)


def test_gapped_slices_are_not_joined() -> None:
    terms = Terms()
    x = terms.param(0, TensorType((6,), "f32"), "x")
    parts = (_slice(terms, x, (0,), (2,)), _slice(terms, x, (3,), (5,)))
    out = terms.apply("concatenate", parts, (("dimension", 0),), TensorType((4,), "f32"))
    assert out.op == "concatenate"
    ones = terms.constant(Literal(np.ones(2, np.float32), "f32"), TensorType((2,), "f32"))
    y = terms.apply("add", (parts[0], ones), (), TensorType((2,), "f32"))
    assert y.op == "slice" and y.args[0].op == "add"  # the slice went outward, the splat came along
