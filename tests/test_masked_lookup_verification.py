"""Vocab-parallel lookups: what is proven with and without an input-range assumption, and that no
mutant of a masked lookup is proven equivalent where the numeric oracle disagrees.

A shard_map lookup (`ids - axis_index * v_local`, masked, psum) equals `table[ids]` only for ids in
`[0, vocab)`: without `--assume` it must be `unknown` and say what to assume. GSPMD's partitioned gather
clamps the index first, so it is proven with no assumption at all.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Fixture, fixtures
from mutations import SWEEP, every_mutant_checked

from scalify_hlo import cli, parsers
from scalify_hlo.prove.engine import Options, prove
from scalify_hlo.terms import ranges
from scalify_hlo.terms.table import Terms

BY_NAME = {f.name: f for f in fixtures()}


def run(name: str, **assume: tuple[int, int]) -> tuple[Fixture, str, str]:
    fx = BY_NAME[name]
    report = prove(fx.before, fx.after, Options(assume=assume))
    return fx, report.name, report.render()


@pytest.mark.parametrize("name,input_name", [("embed_vocab_shard_map", "ids"), ("xent_vocab_shard_map", "labels")])
def test_shard_map_lookup_needs_the_assumption(name: str, input_name: str) -> None:
    _, verdict, text = run(name)
    assert verdict == "unknown", text
    assert f"--assume {input_name}=0:32" in text, text
    _, verdict, text = run(name, **{input_name: (0, 32)})
    assert verdict == "equivalent", text
    assert f"assuming: {input_name} in [0, 32)" in text, text


def test_assumption_wider_than_the_table_is_a_discrepancy_under_it() -> None:
    # ids in [32, 40) are clamped to row 31 by the reference and summed to 0 by the shards: never proven,
    # and running both programs on ids drawn from the assumed range shows the difference
    fx, verdict, text = run("embed_vocab_shard_map", ids=(0, 40))
    assert verdict == "discrepancy", text
    assert "assuming: ids in [0, 40)" in text, text
    report = prove(fx.before, fx.after, Options(assume={"ids": (0, 40)}))
    assert report.findings[0].counterexample is not None, text


@pytest.mark.parametrize("name", ["embed_vocab_shard_map_no_mask", "embed_vocab_shard_map_wrong_offset"])
def test_lookup_bugs_are_found_with_or_without_the_assumption(name: str) -> None:
    for assume in ({}, {"ids": (0, 32)}):
        fx, verdict, text = run(name, **assume)
        assert verdict == "discrepancy", text
        assert f"{fx.bug_site}:" in text, text


@pytest.mark.parametrize("name", ["embed_vocab_shardy", "xent_vocab_shardy"])
def test_partitioned_gather_is_proven_without_assumptions(name: str) -> None:
    _, verdict, text = run(name)
    assert verdict == "equivalent", text
    assert "assuming" not in text


def test_json_report_states_the_assumption() -> None:
    fx = BY_NAME["embed_vocab_shard_map"]
    data = prove(fx.before, fx.after, Options(assume={"ids": (0, 32)})).to_json()
    assert data["verdict"] == "equivalent" and data["assumptions"] == {"ids": [0, 32]}


def test_interval_decides_the_index_wrap() -> None:
    """`where(ids < 0, ids + n, ids)` is `ids` once ids are known non-negative; not before."""
    from scalify_hlo.ir.nodes import Literal, TensorType

    t = TensorType((4,), "i32")
    for assume, folded in (({}, False), ({"ids": (0, 31)}, True)):
        terms = Terms(assume)
        ids = terms.param(0, t, "ids")
        zero = terms.constant(Literal(np.zeros(4, np.int32), "i32"), t)
        neg = terms.apply("compare", (ids, zero), (("comparison_direction", "LT"),), TensorType((4,), "i1"))
        n = terms.constant(Literal(np.full(4, 32, np.int32), "i32"), t)
        wrapped = terms.apply("select", (neg, terms.apply("add", (ids, n), (), t), ids), (), t)
        assert (wrapped is ids) == folded


@pytest.mark.parametrize("direction,a,b,want", [
    ("LT", (0, 3), (4, 9), True), ("LT", (4, 9), (0, 4), False), ("LT", (0, 5), (3, 4), None),
    ("GE", (0, 3), (0, 0), True), ("LE", (0, 3), (3, 3), True), ("GT", (0, 3), (3, 9), False),
    ("EQ", (2, 2), (2, 2), True), ("EQ", (0, 1), (2, 3), False), ("NE", (0, 1), (1, 2), None),
])
def test_decide(direction: str, a: tuple[int, int], b: tuple[int, int], want: bool | None) -> None:
    assert ranges.decide(direction, a, b) is want


@pytest.mark.parametrize("text", ["ids", "ids=3", "=0:3", "ids=a:b", "ids=4:4"])
def test_parse_assumption_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        cli.parse_assumption(text)


@pytest.mark.parametrize("name", ["embed_vocab_shard_map", "embed_vocab_shardy", "xent_vocab_shard_map",
                                  "xent_vocab_shardy"])
@pytest.mark.parametrize("stride", SWEEP)
def test_no_false_equivalent_among_lookup_mutants(name: str, stride: int) -> None:
    """Every single-op mutation of a lookup's after program, verified under the fixture's assumption:
    whatever is `equivalent` agrees with the oracle on in-range inputs."""
    fx = BY_NAME[name]
    seen = every_mutant_checked(parsers.load(fx.before), parsers.load(fx.after),
                                lambda b, a: prove(b, a, Options(assume=fx.assume)).name, stride=stride)
    assert sum(seen.values()) >= 15 // stride and seen.get("discrepancy", 0) > 0, seen


@pytest.mark.parametrize(("lo", "unit", "settles"), [
    ([0, 1, 2, 3], True, True),  # top == axis_index, one class per device: a block of one_hot(top)
    ([2, 2, 2, 2], False, True),  # the same window on every device (a case split's case): a plain test
    ([0, 1, 2, 3], False, False),  # per device, with no dim to hold the blocks: stays a mask
    ([0, 2, 1, 3], True, False),  # not a block index of the devices
])
def test_a_mask_no_rule_reads_settles_into_the_tensor_it_is(lo: list[int], unit: bool, settles: bool) -> None:
    """masked_moves.settled_mask: each device's test of its window is the block of one tensor, evaluated."""
    from scalify_hlo.rules.facts import Holds, InWindow, Window
    from scalify_hlo.rules.masked_moves import settled_mask

    import scalify_hlo.ops.registry  # noqa: F401  (the kernels the term evaluation runs)
    from scalify_hlo.ir.nodes import TensorType
    from scalify_hlo.layout.mesh import Layout, Mesh
    from scalify_hlo.numeric.machine import shard
    from scalify_hlo.prove.derive import Deriver
    from scalify_hlo.terms.evaluate import evaluate

    mesh = Mesh((("tp", 4),))
    terms = Terms()
    ctx = Deriver(terms, mesh).ctx
    shape = (16, 1) if unit else (16, 8)
    top = terms.param(0, TensorType(shape, "i32"), "top")
    window = Window(np.array(lo), np.array(lo) + 1)
    settled = settled_mask(ctx, InWindow(Holds(top, Layout.replicated(2)), window))
    if not settles:
        assert isinstance(settled, InWindow)
        return
    assert isinstance(settled, Holds)
    tops = np.random.default_rng(0).integers(0, 4, shape).astype(np.int32)
    blocks = shard(np.asarray(evaluate(settled.term, {top.id: tops})), settled.layout, mesh)
    for device in range(4):
        np.testing.assert_array_equal(blocks[device], tops == lo[device])
