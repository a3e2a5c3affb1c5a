"""Masks and per-device shifted indices through collectives and scatters (rules/masking.py `_regrouped`,
`_scatter`): a mask of indices whose per-device window is
the same along the gathered axes is the mask of the gathered indices; one whose window changes along them
is not read that way (each device's rows would keep another device's window)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES
from scalify_hlo.parsers.hlo import parse_hlo
from scalify_hlo.parsers.stablehlo import parse_mlir
from scalify_hlo.rules import masking
from scalify_hlo.rules.facts import Ctx, Holds, InWindow, Shifted, Varying, Window

from scalify_hlo.ir.nodes import Attrs, ChannelHandle, GatherDims, Literal, Op, TensorType, Value
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.oracle import numeric_check
from scalify_hlo.prove.engine import prove
from scalify_hlo.terms.table import Terms

MESH = Mesh((("dp", 2), ("tp", 4)))


def _ctx(terms: Terms) -> Ctx:
    return Ctx(terms, MESH, fold=lambda t: None, lift=lambda v: v, varying=lambda o, f: None)


def _gather_over_dp() -> Op:
    groups = Literal(np.array([[0, 4], [1, 5], [2, 6], [3, 7]]), "i64")
    attrs = Attrs.of({"all_gather_dim": 0, "replica_groups": groups, "channel_handle": ChannelHandle(1, 1),
                      "use_global_device_ids": True})
    return Op("all_gather", (Value(TensorType((4,), "i1")),), (Value(TensorType((8,), "i1")),), attrs)


def _mask(lo: np.ndarray) -> tuple[Terms, InWindow]:
    terms = Terms()
    ids = terms.param(0, TensorType((8,), "i32"), "ids")
    return terms, InWindow(Holds(ids, Layout((("dp",),))), Window(lo, lo + 8))


def test_window_set_by_the_other_axis_moves_with_the_gather() -> None:
    tp = np.array([0, 1, 2, 3, 0, 1, 2, 3]) * 8  # device d = dp·4 + tp: the window follows tp only
    terms, mask = _mask(tp)
    (out,) = masking.transfer(_ctx(terms), _gather_over_dp(), (mask,)) or (None,)
    assert isinstance(out, InWindow) and out.base.layout == Layout(((),))
    np.testing.assert_array_equal(out.window.lo, tp)


def test_window_changing_along_the_gathered_axis_is_not_moved() -> None:
    by_dp = np.array([0, 0, 0, 0, 8, 8, 8, 8])
    terms, mask = _mask(by_dp)
    assert masking.transfer(_ctx(terms), _gather_over_dp(), (mask,)) is None


# XLA's scatter into rows split over 8 devices (fixture oc_scatter_add_split_rows_gspmd): each device scatters
# into its block with the indices shifted by minus the block's start. Edited offset tables: `equivalent` only
# where running agrees.
SCATTER = FIXTURES / "oc_scatter_add_split_rows_gspmd"
TABLE = "constant({0, 4, 8, 12, 16, 20, 24, 28})"


@pytest.mark.parametrize("table", [TABLE, "constant({0, 4, 8, 12, 16, 20, 28, 24})", "constant({0, 3, 6, 9, 12, 15, 18, 21})",
                                   "constant({4, 8, 12, 16, 20, 24, 28, 32})", "constant({0, 0, 8, 8, 16, 16, 24, 24})"])
def test_scatter_into_split_rows_edits(table: str) -> None:
    before = parse_mlir((SCATTER / "before.mlir").read_text(), "before.mlir")
    text = (SCATTER / "after.hlo").read_text()
    assert TABLE in text
    after = parse_hlo(text.replace(TABLE, table), "edited.hlo")
    verdict = prove(before, after).name
    truth = numeric_check(before, after, seed=0)
    assert truth["ran"] and truth["ok"] == (table == TABLE), truth["summary"]
    assert verdict == ("equivalent" if table == TABLE else "discrepancy")


def _shifted_constant(values: np.ndarray) -> object:
    """`masking._shifted_constant` of per-device indices into a table [32, 4] split over tp (8 rows each)."""
    terms = Terms()
    table = Holds(terms.param(0, TensorType((32, 4), "f32"), "table"), Layout((("tp",), ())))
    dims = GatherDims((1,), (0,), (), (), (0,), 1)
    return masking._shifted_constant(_ctx(terms), table, dims, Varying(values, TensorType((3, 1), "i32")))


def test_constant_indices_shifted_per_device_are_read_only_where_every_device_agrees() -> None:
    # device (dp, tp) reads rows `labels - 8 * tp`: the labels of both dp rows are the same constant
    labels = np.array([[3], [17], [30]])
    tp = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    same = (labels[None] - 8 * tp[:, None, None]).astype(np.int32)
    fact = _shifted_constant(same)
    assert isinstance(fact, Shifted) and np.array_equal(fact.shift, -8 * tp)
    # the dp = 1 devices hold other indices (padding, -1) at the rows the dp = 0 devices look up: the base of
    # dp = 0 would be claimed on them too, so no fact
    other = same.copy()
    other[4:] = -1
    assert _shifted_constant(other) is None
