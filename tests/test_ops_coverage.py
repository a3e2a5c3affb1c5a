"""Negative tests for the op-coverage rules (issue 14): sort/top_k shard by shard, argmax term evaluation,
XLA's TopK custom call and its comparator.

A sort along a dim that is split is a sort of each block, not of the row: it must not come out
`equivalent` (the rule reads it as the sort of the blocks, another term). The mutants are text edits of fixture `oc_sort_cols_shard_map`.
"""

from __future__ import annotations

import re

import numpy as np
from conftest import FIXTURES
from scalify_hlo.parsers.hlo import parse_hlo
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir.inline import inline
from scalify_hlo.ir.nodes import Op, TensorType, walk
from scalify_hlo.ops.reducers import ARG_REDUCERS, top_k_largest
from scalify_hlo.prove.engine import prove
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms

SORT = FIXTURES / "oc_sort_cols_shard_map"


def test_sort_along_the_split_dim_is_not_equivalent() -> None:
    text = (SORT / "after.mlir").read_text()
    split_cols = text.replace('[{"x"}, {}]', '[{}, {"x"}]').replace("2x32xf32", "16x4xf32")
    assert split_cols != text
    report = prove(SORT / "before.mlir", parse_mlir(split_cols, "mutant.mlir"))
    assert report.name != "equivalent", report.render()


def test_argmax_terms_evaluate_like_numpy() -> None:
    terms = Terms()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    x[2, 3] = x[2, 5] = 9.0  # a tie: the smaller index wins
    values = terms.param(0, TensorType((5, 7), "f32"), "x")
    ids = terms.apply("iota", (), (("iota_dimension", 1),), TensorType((5, 7), "i32"))
    inits = (terms.scalar(float("-inf"), "f32"), terms.scalar(0.0, "i32"))
    for kind, want in zip(ARG_REDUCERS, (np.argmax(x, axis=1), np.argmin(x, axis=1)), strict=True):
        t = terms.mk("reduce", (values, ids, *inits), (("dimensions", (1,)), ("computation", kind), ("index", 1)),
                     TensorType((5,), "i32"))
        if kind == "argmin":
            t = terms.mk("reduce", (values, ids, terms.scalar(float("inf"), "f32"), inits[1]),
                         (("dimensions", (1,)), ("computation", kind), ("index", 1)), TensorType((5,), "i32"))
        np.testing.assert_array_equal(evaluate(t, {values.id: x}), want)


TOPK = FIXTURES / "top_k_split_dim_compiled_shardy"  # compiled.as_text(): XLA's TopK custom call


def _top_k_call(text: str) -> Op:
    func = inline(parse_hlo(text, "after.hlo"))
    return next(op for op in walk(func.body.ops) if op.opcode == "custom_call")


def test_top_k_custom_call_comparator_is_read_as_its_order() -> None:
    """The comparator XLA writes (total-order keys of the values, `GT`) is largest first; the same keys
    compared `LT`, or with the operands swapped, smallest first; keys without the sign flip are no total
    order of floats: not recognised (unknown)."""
    text = (TOPK / "after.hlo").read_text()
    root = re.search(r"ROOT %(\S+) = pred\[\] compare\(%(\S+), %(\S+)\), direction=GT", text)
    assert root is not None
    a, b = root.group(2), root.group(3)
    op = _top_k_call(text)
    assert top_k_largest(op.regions[0]) is True
    assert top_k_largest(_top_k_call(text.replace(f"compare(%{a}, %{b}), direction=GT",
                                                  f"compare(%{a}, %{b}), direction=LT")).regions[0]) is False
    assert top_k_largest(_top_k_call(text.replace(f"compare(%{a}, %{b})", f"compare(%{b}, %{a})")).regions[0]) is False
    key = re.search(rf"%{a} = s32\[\] select\(%(\S+), %(\S+), %(\S+)\)", text)
    assert key is not None
    unflipped = text.replace(key.group(0), f"%{a} = s32[] select(%{key.group(1)}, %{key.group(3)}, %{key.group(3)})")
    assert top_k_largest(_top_k_call(unflipped).regions[0]) is None


def test_top_k_custom_call_smallest_first_is_not_equivalent() -> None:
    text = (TOPK / "after.hlo").read_text()
    flipped = re.sub(r"(ROOT %\S+ = pred\[\] compare\(%\S+, %\S+\)), direction=GT", r"\1, direction=LT", text)
    assert flipped != text
    report = prove(TOPK / "before.mlir", parse_hlo(flipped, "flipped.hlo"))
    assert report.name == "discrepancy", report.render()
