"""Budgets: the whole run's time limit (`--time-limit`, `Options.time_limit`): past it no op is read and no
e-graph is built, and the verdict is `unknown` naming the first value left unread; never `equivalent`, never a
discrepancy without a counterexample; the limit is checked where the work happens, so a run ends soon after.
A question that runs out of its e-graph budget makes the verdict `unknown` naming the op it was asked for.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from conftest import FIXTURES, run_cli

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.prove import egraph
from scalify_hlo.prove.egraph import Budget, Deadline, EGraph
from scalify_hlo.prove.engine import Options, prove
from scalify_hlo.terms.table import Terms

DEEP = FIXTURES / "llama_unrolled_deep_shardy"  # 5 blocks, proven in about a second
DEEP_BUG = FIXTURES / "mut_llama_unrolled_deep_layer3_allreduce_wrong_axis"


def test_a_passed_deadline_builds_no_egraph() -> None:
    terms = Terms()
    m = TensorType((8, 4), "f32")
    x, y = terms.param(0, m, "x"), terms.param(1, m, "y")
    regrouped = (terms.mk("add", (x, y), (), m), terms.mk("add", (y, x), (), m))
    assert EGraph().equal([regrouped], frozenset()) == (True,)  # what the rules prove, given time
    late = EGraph(deadline=Deadline(time.perf_counter() - 1.0, 1.0))
    assert late.equal([regrouped], frozenset()) == (False,)
    assert (late.stats.egraph_calls, late.stats.exhausted) == (0, 1)


@pytest.mark.parametrize("fixture", [DEEP, DEEP_BUG], ids=["correct", "bug"])
def test_out_of_time_before_reading_is_unknown(fixture: Path) -> None:
    report = prove(fixture / "before.mlir", fixture / "after.hlo", Options(time_limit=1e-6))
    assert report.name == "unknown", report.render()
    assert "time limit (1e-06 s) ran out" in report.render()
    assert report.stats["time_limit_reached"] is True


def _clock(monkeypatch: pytest.MonkeyPatch, runs_out_at: float) -> list[int]:
    """`Deadline.passed` made to say yes from its `runs_out_at`-th check on; the checks made are counted."""
    checks = [0]

    def passed(self: Deadline) -> bool:
        checks[0] += 1
        return checks[0] > runs_out_at

    monkeypatch.setattr(egraph.Deadline, "passed", passed)
    return checks


@pytest.mark.parametrize(("fixture", "share"), [(DEEP, 0.3), (DEEP, 0.8), (DEEP_BUG, 0.5)],
                         ids=["correct-reference", "correct-partitioned", "bug"])
def test_out_of_time_midway_is_unknown_naming_the_first_op_left_unread(monkeypatch: pytest.MonkeyPatch,
                                                                      fixture: Path, share: float) -> None:
    """The clock runs out after a share of the checks a whole proof makes (one per op read, one per e-graph
    question): in the reference or in the partitioned program."""
    checks = _clock(monkeypatch, math.inf)
    prove(fixture / "before.mlir", fixture / "after.hlo", Options(time_limit=600.0))
    _clock(monkeypatch, int(checks[0] * share))
    report = prove(fixture / "before.mlir", fixture / "after.hlo", Options(time_limit=600.0))
    assert report.name != "equivalent", report.render()
    if report.name == "discrepancy":  # only with evidence: a value read and found to differ
        assert all(f.counterexample is not None for f in report.findings), report.render()
    else:
        assert "time limit (600 s) ran out" in report.render(), report.render()
        first = report.findings[0]
        assert "not read" in first.reason and (first.after or first.before), report.render()


def test_cli_time_limit() -> None:
    run = run_cli("diff", DEEP / "before.mlir", DEEP / "after.hlo", "--time-limit", "0.000001", "-q")
    assert run.returncode == 2 and "time limit" in run.stdout, run.stdout
    bad = run_cli("diff", DEEP / "before.mlir", DEEP / "after.hlo", "--time-limit", "0")
    assert bad.returncode == 3 and "not a positive number of seconds" in bad.stderr + bad.stdout


def test_an_exhausted_egraph_budget_names_the_op_it_was_asked_for() -> None:
    """A data-parallel SGD step whose gradient mean is proven by saturation, with a budget too small for it."""
    fx = FIXTURES / "dp_mean_sgd_shard_map"
    report = prove(fx / "before.mlir", fx / "after.mlir", Options(budget=Budget(iterations=1, nodes=10, seconds=0.01)))
    assert report.name == "unknown", report.render()
    reason = report.verdict.reason
    assert "an e-graph budget ran out" in reason and "first at multiply" in reason, reason
    assert "(tools/programs/train.py:59)" in reason and "e-nodes" in reason, reason
    assert prove(fx / "before.mlir", fx / "after.mlir").name == "equivalent"  # with the default budget
