"""Conditionals (`case`/`if`, `prove/branches.py`) and the GSPMD shard_map boundary (`rules/boundary.py`).

The programs are the fixtures of tools/programs/control_flow.py: lax.switch on an index every device
shares, lax.cond on a psum'd predicate, and the same shard_map lowered with Shardy off.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import Literal, TensorType
from scalify_hlo.numeric import machine
from scalify_hlo.prove.engine import prove
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms


def _pair(name: str) -> tuple[str, str]:
    return str(FIXTURES / name / "before.mlir"), str(FIXTURES / name / "after.mlir")


def test_swapped_branches_are_not_equivalent() -> None:
    """The same branches (the same ops, the same collectives) in another order: a `case` term is keyed by
    its branches in order, so the programs are not proven equal; running them shows where they differ."""
    before, _ = _pair("switch_replicated_index_shard_map")
    _, swapped = _pair("switch_branches_swapped_shard_map")
    report = prove(before, swapped)
    assert report.name == "discrepancy", report.render()
    assert report.findings[0].counterexample is not None


@pytest.mark.parametrize("name", ["switch_replicated_index_shard_map", "switch_replicated_index_gspmd_shard_map",
                                  "cond_psum_predicate_shard_map"])
def test_correct_conditionals_are_equivalent(name: str) -> None:
    report = prove(*_pair(name))
    assert report.name == "equivalent", report.render()


def test_case_term_takes_the_indexed_branch_and_the_last_out_of_range() -> None:
    terms = Terms()
    t = TensorType((2,), "f32")
    branches = [terms.constant(Literal(np.array([k, -k], dtype=np.float32), "f32"), t) for k in (1.0, 2.0, 3.0)]
    index = terms.param(0, TensorType((), "i32"), "i")
    case = terms.mk("case", (index, *branches), (), t)
    for i, want in ((0, 1.0), (1, 2.0), (2, 3.0), (7, 3.0), (-1, 3.0)):
        got = evaluate(case, {index.id: np.array(i, dtype=np.int32)})
        assert np.array_equal(got, [want, -want]), (i, got)


def test_gspmd_shard_map_runs_like_xla() -> None:
    """The numeric interpreter runs a shard_map lowered with Shardy off (its body between the boundary
    custom calls, on every device) and agrees with XLA's outputs stored with the fixture."""
    name = "switch_replicated_index_gspmd_shard_map"
    after = parsers.load(FIXTURES / name / "after.mlir")
    with np.load(FIXTURES / name / "oracle.npz") as z:
        inputs = [z["in_0"], z["in_1"]]
        want = z["after_out_0"]
    (got,) = machine.run_after(after, inputs)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-5)
