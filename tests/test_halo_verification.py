"""Halo exchange (rules/halo.py): XLA's partitioned 3x3 conv of a height-split image, its partitioned
cumsum over a split dim, and edits of both.

The fixture `conv_spatial_halo_shardy` slices the edge rows of each block, shifts them one device along
"tp" with two collective-permutes, concatenates them around the block, masks the rows outside the image
and convolves VALID along the height. Every edit below changes one of those steps; the truth of each
edited program comes from running it beside the reference (the NumPy interpreter), and the prover must
never call a wrong one equivalent. Two edits keep the program right (a cyclic shift whose wrapped rows
the mask clears; a mask that clears nothing where the zeros from the image's edge are already there):
those must still be proven. XLA's cumsum over a dim split over 8 devices all-gathers it, pads 31 zero
rows in front and slices 35 rows at 4 × the device's index: a halo of 31 rows above each block.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scalify_hlo.parsers.hlo import parse_hlo
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.layout.groups import axis_shift
from scalify_hlo.layout.mesh import Mesh
from scalify_hlo.numeric.oracle import numeric_check
from scalify_hlo.prove.engine import prove

HALO = FIXTURES / "conv_spatial_halo_shardy"
BEFORE = parse_mlir((HALO / "before.mlir").read_text(), "before.mlir")
TEXT = (HALO / "after.hlo").read_text()
DOWN = "{{0,1},{1,2},{2,3},{4,5},{5,6},{6,7}}"  # each block's last row to the device below
UP = "{{1,0},{2,1},{3,2},{5,4},{6,5},{7,6}}"  # each block's first row to the device above
LOW, HIGH = "constant.9 = s32[] constant(1)", "constant.10 = s32[] constant(9)"  # the mask keeps [1, 9)

EDITS: dict[str, tuple[tuple[str, str], ...]] = {
    "pairs reversed": ((DOWN, UP),),
    "wrong edge row sent": (("slice={[0:2], [1:2], [0:4], [0:4]}", "slice={[0:2], [0:1], [0:4], [0:4]}"),),
    "a pair missing": ((DOWN, "{{0,1},{2,3},{4,5},{5,6},{6,7}}"),),
    "shift along dp": ((DOWN, "{{0,4},{1,5},{2,6},{3,7}}"),),
    "mask clears the first row": ((LOW, "constant.9 = s32[] constant(2)"),),
    "mask clears the last row": ((HIGH, "constant.10 = s32[] constant(8)"),),
    "offset table permuted": (("constant({0, 1, 2, 3, 0, 1, 2, 3})", "constant({0, 1, 2, 3, 0, 1, 3, 2})"),),
    "cyclic shift, wrapped rows kept": ((DOWN, "{{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}"),
                                        (LOW, "constant.9 = s32[] constant(0)"),
                                        (HIGH, "constant.10 = s32[] constant(10)")),
    # right programs
    "cyclic shift, wrapped rows masked": ((DOWN, "{{0,1},{1,2},{2,3},{3,0},{4,5},{5,6},{6,7},{7,4}}"),),
    "mask that clears nothing": ((LOW, "constant.9 = s32[] constant(0)"), (HIGH, "constant.10 = s32[] constant(10)")),
}
RIGHT = {"cyclic shift, wrapped rows masked", "mask that clears nothing"}


CUMSUM = FIXTURES / "fa_cumsum_sharded_dim_shardy"
CUMSUM_BEFORE = parse_mlir((CUMSUM / "before.mlir").read_text(), "before.mlir")
CUMSUM_EDITS: dict[str, tuple[str, str]] = {
    "offsets 3 × index": ("constant.10 = s32[] constant(4)", "constant.10 = s32[] constant(3)"),
    "offsets one block on": ("constant({0, 1, 2, 3, 4, 5, 6, 7})", "constant({1, 2, 3, 4, 5, 6, 7, 8})"),
    "offset table permuted": ("constant({0, 1, 2, 3, 4, 5, 6, 7})", "constant({0, 1, 2, 3, 4, 5, 7, 6})"),
    "one pad row moved behind": ("padding=31_0x0_0", "padding=30_1x0_0"),
    "the pad behind": ("padding=31_0x0_0", "padding=0_31x0_0"),
    "padded with ones": ("%constant.3.clone = f32[] constant(0)", "%constant.3.clone = f32[] constant(1)"),
}


def _edited(edits: tuple[tuple[str, str], ...], text: str = TEXT) -> str:
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("name", list(EDITS))
def test_edited_halo_exchange(name: str) -> None:
    after = parse_hlo(_edited(EDITS[name]), "edited.hlo")
    truth = numeric_check(BEFORE, after, seed=0)
    assert truth["ran"] and truth["ok"] == (name in RIGHT), truth["summary"]
    report = prove(BEFORE, after)
    assert report.name == ("equivalent" if name in RIGHT else "discrepancy"), report.render()


def test_partitioned_cumsum_is_proven() -> None:
    after = parse_hlo((CUMSUM / "after.hlo").read_text(), "after.hlo")
    assert prove(CUMSUM_BEFORE, after).name == "equivalent"


@pytest.mark.parametrize("name", list(CUMSUM_EDITS))
def test_edited_partitioned_cumsum(name: str) -> None:
    after = parse_hlo(_edited((CUMSUM_EDITS[name],), (CUMSUM / "after.hlo").read_text()), "edited.hlo")
    truth = numeric_check(CUMSUM_BEFORE, after, seed=0)
    assert truth["ran"] and not truth["ok"], truth["summary"]
    report = prove(CUMSUM_BEFORE, after)
    assert report.name == "discrepancy", report.render()


_PAIR = st.tuples(st.integers(0, 7), st.integers(0, 7))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(down=st.lists(_PAIR, min_size=1, max_size=8, unique_by=(lambda p: p[0], lambda p: p[1])),
       row=st.integers(0, 1), low=st.integers(0, 2), high=st.integers(8, 10))
def test_no_false_equivalent_over_random_exchanges(down: list[tuple[int, int]], row: int, low: int, high: int) -> None:
    """Any source-target pairs for the downward shift, either edge row, any mask bounds: `equivalent` only
    where running says the edited program is right."""
    pairs = "{" + ",".join(f"{{{a},{b}}}" for a, b in down) + "}"
    text = _edited(((DOWN, pairs), ("slice={[0:2], [1:2], [0:4], [0:4]}", f"slice={{[0:2], [{row}:{row + 1}], [0:4], [0:4]}}"),
                    (LOW, f"constant.9 = s32[] constant({low})"), (HIGH, f"constant.10 = s32[] constant({high})")))
    after = parse_hlo(text, "edited.hlo")
    report = prove(BEFORE, after)
    if report.name == "equivalent":
        truth = numeric_check(BEFORE, after, seed=1)
        assert truth["ran"] and truth["ok"], (pairs, row, low, high, truth["summary"])


def test_axis_shift_reads_linear_and_cyclic_shifts() -> None:
    mesh = Mesh((("dp", 2), ("tp", 4)))
    down = np.array([(0, 1), (1, 2), (2, 3), (4, 5), (5, 6), (6, 7)])
    assert axis_shift(down, mesh, ("tp",)) == (1, False)
    assert axis_shift(down[:, ::-1], mesh, ("tp",)) == (-1, False)
    ring = np.array([(i, (i // 4) * 4 + (i + 1) % 4) for i in range(8)])
    assert axis_shift(ring, mesh, ("tp",)) == (1, True)
    assert axis_shift(ring[:, ::-1], mesh, ("tp",)) == (-1, True)
    assert axis_shift(down[1:], mesh, ("tp",)) is None  # device 0 sends nothing: not a shift
    assert axis_shift(np.array([(0, 4), (1, 5), (2, 6), (3, 7)]), mesh, ("tp",)) is None  # moves along dp
    assert axis_shift(np.array([(0, 4), (1, 5), (2, 6), (3, 7)]), mesh, ("dp",)) == (1, False)
    assert axis_shift(np.array([(0, 2), (1, 3), (4, 6), (5, 7)]), mesh, ("tp",)) == (2, False)


GRADS = FIXTURES / "conv_net_grads_spatial_shardy"  # the strided conv's input gradient: dilated, over a halo


@pytest.mark.parametrize("old,new", [("pad=0_1x2_1 lhs_dilate=2x2", "pad=1_0x2_1 lhs_dilate=2x2")])
def test_edited_dilated_window_over_halo(old: str, new: str) -> None:
    text = (GRADS / "after.hlo").read_text()
    assert old in text
    before = parse_mlir((GRADS / "before.mlir").read_text(), "before.mlir")
    after = parse_hlo(text.replace(old, new), "edited.hlo")
    truth = numeric_check(before, after, seed=0)
    assert truth["ran"] and not truth["ok"], truth["summary"]
    assert prove(before, after).name == "discrepancy"


# XLA's jnp.roll of a split dim (fixture oc_roll_split_dim_gspmd): each block's last 3 rows sent cyclically to
# the next device and joined before its first row. Any source-target pairs, any sent rows: `equivalent`
# only where running agrees (the wrapped rows are the other end's: a halo filled by "wrap").
ROLL = FIXTURES / "oc_roll_split_dim_gspmd"
ROLL_BEFORE = parse_mlir((ROLL / "before.mlir").read_text(), "before.mlir")
ROLL_TEXT = (ROLL / "after.hlo").read_text()
ROLL_PAIRS = "{{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7},{7,0}}"


def test_partitioned_roll_is_proven() -> None:
    assert prove(ROLL_BEFORE, parse_hlo(ROLL_TEXT, "after.hlo")).name == "equivalent"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs=st.lists(_PAIR, min_size=1, max_size=8, unique_by=(lambda p: p[0], lambda p: p[1])),
       first=st.integers(0, 1))
def test_no_false_equivalent_over_edited_rolls(pairs: list[tuple[int, int]], first: int) -> None:
    text = _edited(((ROLL_PAIRS, "{" + ",".join(f"{{{a},{b}}}" for a, b in pairs) + "}"),
                    ("slice={[1:4], [0:6]}", f"slice={{[{first}:{first + 3}], [0:6]}}")), ROLL_TEXT)
    after = parse_hlo(text, "edited.hlo")
    report = prove(ROLL_BEFORE, after)
    if report.name == "equivalent":
        truth = numeric_check(ROLL_BEFORE, after, seed=1)
        assert truth["ran"] and truth["ok"], (pairs, first, truth["summary"])


def test_roll_edits_found() -> None:
    """A shift by two devices and a shift that does not wrap are both found, not proven."""
    for pairs in ("{{0,2},{1,3},{2,4},{3,5},{4,6},{5,7},{6,0},{7,1}}", "{{0,1},{1,2},{2,3},{3,4},{4,5},{5,6},{6,7}}"):
        after = parse_hlo(_edited(((ROLL_PAIRS, pairs),), ROLL_TEXT), "edited.hlo")
        assert prove(ROLL_BEFORE, after).name == "discrepancy", pairs
