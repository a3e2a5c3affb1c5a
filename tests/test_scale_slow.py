"""Scale tests (marked slow; `.ci/run` runs them after `make test`): real Llama-3.1 stacks generated with JAX
on fake CPU devices and partitioned by XLA, proven equivalent, and a bug in one layer found in that layer.
The full matrix, with timings against the parse floor, is `tools/bench.py` (BENCH.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import REPO

from scalify_hlo.prove.engine import prove

sys.path.insert(0, str(REPO / "tools"))
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    import bench_programs as bp

    out = tmp_path_factory.mktemp("bench")
    return {
        "8b": bp.generate("8b", 32, 64, False, out),
        "405b-1": bp.generate("405b", 1, 64, False, out),
        "405b-scan": bp.generate("405b", 126, 64, True, out),
    }


@pytest.mark.parametrize("name", ["8b", "405b-1", "405b-scan"])
def test_llama_stacks_are_equivalent(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    before, after = pairs[name]
    report = prove(before, after)
    assert report.name == "equivalent", report.render()
    if name == "8b":  # 32 identical layers: at most a few distinct e-graph questions, however deep the stack
        distinct = report.stats["egraph_calls"] - report.stats["egraph_memo_hits"]
        assert report.stats["segments_unique"] <= 4 and distinct <= 4, report.stats


def test_bug_in_one_layer_is_found_in_that_layer(pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    import bench_programs as bp

    before, after = pairs["8b"]
    text, instruction = bp.inject_bug(after.read_text(), 21)
    broken = tmp_path / "after.hlo"
    broken.write_text(text)
    report = prove(before, broken)
    assert report.name == "discrepancy", report.render()
    assert report.findings[0].counterexample is not None  # too big to run: built at the all-reduce
    assert report.findings[0].after is not None
    assert report.findings[0].after.instruction == instruction.lstrip("%")
