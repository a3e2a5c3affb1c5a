"""The CLI's reports: compiler-style text with the source line, JSON with the documented fields, `show`."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import FIXTURES, run_cli


def test_diff_equivalent_exit_0_and_json(tmp_path: Path) -> None:
    d = FIXTURES / "llama_block_shardy"
    out = tmp_path / "report.json"
    proc = run_cli("diff", d / "before.mlir", d / "after.hlo", "--json", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict: equivalent" in proc.stdout
    report = json.loads(out.read_text())
    assert report["verdict"] == "equivalent" and report["discrepancies"] == []
    assert {"seconds", "ops", "mesh"} <= set(report["stats"])
    assert report["outputs"][0]["layout"] == '[{"fsdp"}, {}, {}]'


def test_diff_discrepancy_names_the_line_with_a_caret() -> None:
    d = FIXTURES / "rmsnorm_shard_map_local_stats"
    proc = run_cli("diff", d / "before.mlir", d / "after.mlir")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("tools/programs/rmsnorm.py:42: error:")
    assert "psum" in first
    assert "^" in proc.stdout.splitlines()[2]  # the source line, then the caret under it


def test_json_discrepancy_fields() -> None:
    d = FIXTURES / "mut_replica_groups_swapped"
    proc = run_cli("diff", d / "before.mlir", d / "after.hlo", "--json", "-")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["verdict"] == "discrepancy" and report["reason"]
    (first, *_) = report["discrepancies"]
    assert first["after"]["source"] == "tools/programs/megatron.py:30"
    assert first["after"]["instruction"]
    assert first["before"]["source"].startswith("tools/programs/megatron.py:")
    assert first["reason"]


def test_numeric_adds_a_counterexample() -> None:
    d = FIXTURES / "megatron_mlp_shard_map_pmean"
    proc = run_cli("diff", d / "before.mlir", d / "after.mlir", "--numeric", "--json", "-")
    report = json.loads(proc.stdout)
    assert report["verdict"] == "discrepancy"
    assert report["numeric"]["ran"] and not report["numeric"]["ok"]
    assert "counterexample" in report["discrepancies"][0]


def test_show_prints_mesh_and_layouts() -> None:
    proc = run_cli("show", FIXTURES / "megatron_mlp_shardy" / "before.mlir")
    assert proc.returncode == 0, proc.stderr
    assert 'mesh: ["dp"=2, "tp"=4] (8 devices)' in proc.stdout
    assert 'input 1 (w1): tensor<16x32xf32> [{}, {"tp"}]' in proc.stdout
    proc = run_cli("show", FIXTURES / "llama_block_shardy" / "after.hlo")
    assert "spmd program" in proc.stdout and "all_reduce over" in proc.stdout


def test_json_report_is_strict_json_when_a_counterexample_is_nan() -> None:
    """A NaN/inf in a counterexample (a pass that produces NaN) must not make the JSON unparsable."""
    from scalify_hlo.report.verdicts import Counterexample, Discrepancy, Finding, Report

    cex = Counterexample(0, (0, 1), 30.9, float("nan"), float("inf"))
    report = Report(Discrepancy((Finding("differs", counterexample=cex),)), "b.mlir", "a.hlo")

    def strict(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    data = json.loads(report.dumps(), parse_constant=strict)
    assert data["discrepancies"][0]["counterexample"]["after"] == "nan"
    assert data["discrepancies"][0]["counterexample"]["max_abs_error"] == "inf"
