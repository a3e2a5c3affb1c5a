"""Negative tests for the op-coverage rules (issue 14): sort/top_k shard by shard, argmax term evaluation.

A sort along a dim that is split is a sort of each block, not of the row: it must not come out
`equivalent` (the rule reads it as the sort of the blocks, another term). The mutants are text edits of fixture `oc_sort_cols_shard_map`.
"""

from __future__ import annotations

import numpy as np
from conftest import FIXTURES
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.reducers import ARG_REDUCERS
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
