"""Rows of a split dim held by table (rules/rows.py): tables read over the tensor their base is a window of.

A hand-written case pins one rule beside the real programs (the causal-conv, fused gate/up and RoPE fixtures):
reading a table over the tensor its base slices or pads keeps every row's meaning, a row of unknown values
included (it must never come to stand for the fill, which would let a table settle into a tensor it is not).
"""

from __future__ import annotations

import numpy as np
from scalify_hlo.rules.facts import JUNK_ROW, OUT_ROW, Holds, Rows
from scalify_hlo.rules.rows import _peeled

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.terms.slicing import slice_along
from scalify_hlo.terms.table import Terms


def test_a_row_of_unknown_values_stays_unknown_read_over_the_sliced_tensor() -> None:
    terms = Terms()
    x = terms.fresh("x", TensorType((8, 3), "f32"))
    window = slice_along(terms, x, 0, 2, 6)  # rows [2, 6) of x
    table = np.array([[0, JUNK_ROW, 2, 3], [OUT_ROW, 1, 2, 3]], dtype=np.int64)
    rows = Rows(Holds(window, Layout(((), ()))), 0, table, 0.0, None)
    peeled = _peeled(rows)
    assert peeled.base.term is x
    np.testing.assert_array_equal(peeled.table, [[2, JUNK_ROW, 4, 5], [OUT_ROW, 3, 4, 5]])
