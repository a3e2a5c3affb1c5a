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


def _rendered(name: str) -> str:
    d = FIXTURES / name
    after = d / "after.hlo" if (d / "after.hlo").exists() else d / "after.mlir"
    return run_cli("diff", d / "before.mlir", after).stdout


def test_a_diagnostic_shared_by_several_values_is_printed_once() -> None:
    # the missing gradient psum shows in the three gradients it feeds: one diagnostic, three sites
    out = _rendered("train_sgd_shard_map_no_grad_psum")
    assert out.count("error: subtract is applied to a value that is still partial") == 1, out
    assert out.count("# BUG:") == 1 and "[3/3]" in out


def test_many_findings_with_one_reason_are_summarised() -> None:
    from scalify_hlo.report.verdicts import Finding, Report, Site, Unknown

    site = Site("gather", "gather.7", "model.py:12")
    report = Report(Unknown("not proven: gather", tuple(
        Finding("gather: not modelled", after=Site("gather", f"gather.{i}", "model.py:12")) for i in range(105))),
        "b.mlir", "a.hlo", notes=tuple(f"output {i}: not proven, but equal on random inputs" for i in range(105)))
    text = report.render()
    assert text.count("gather: not modelled") == 1 and "and 102 more values" in text, text
    assert text.count("not proven, but equal on random inputs") == 1 and "outputs 0-104:" in text
    assert report.to_json()["notes"] == ["outputs 0-104: not proven, but equal on random inputs"]
    assert site.label() == "gather.7 = gather"


def test_no_value_numbering_of_the_tool_in_reports() -> None:
    # StableHLO values have no names of their own: sites are named by op, JAX op_name and source line.
    import re

    for name in ("train_sgd_shard_map_no_grad_psum", "megatron_mlp_shard_map_missing_psum",
                 "ring_attention_shard_map_wrong_direction", "rmsnorm_shard_map_local_stats"):
        out = _rendered(name)
        assert not re.search(r"%(arg)?\d", out), out
        d = FIXTURES / name
        report = json.loads(run_cli("diff", d / "before.mlir", d / "after.mlir", "--json", "-").stdout)
        assert all("instruction" not in site for f in report["discrepancies"]
                   for site in (f.get("before", {}), f.get("after", {}), *f.get("also", []))), report
    # HLO instruction names are the user's: kept
    assert "all-reduce" in _rendered("mut_replica_groups_swapped")


def test_unknown_is_worded_as_not_proven() -> None:
    from scalify_hlo.report.verdicts import Finding, Report, Unknown

    out = _rendered("embed_vocab_shard_map")
    assert "verdict: unknown — not proven: " in out and "differ" not in out
    report = Report(Unknown("output 0 differs from the reference: the values part ways at mul",
                            (Finding("output 0 differs from the reference: the values part ways at mul"),)), "b", "a")
    text = report.render()
    assert "differs" not in text and "verdict: unknown — output 0 is not proven equal to the reference" in text
    assert Report(Unknown("a gather of windows"), "b", "a").reason == "not proven: a gather of windows"
    assert report.to_json()["hints"][0]["reason"].startswith("output 0 is not proven equal to the reference")


def test_proof_notes_only_for_the_machinery_used() -> None:
    # blockwise proofs: online softmax named where exp/rescaling was compared (ring attention, tested in
    # test_online_softmax_verification.py), not for an all-to-all MoE; none for exact integer maxima;
    # none on a verdict the proof does not stand behind.
    assert "online softmax" not in _rendered("moe_all_to_all_shard_map")
    assert "note:" not in _rendered("int_pmax_of_shards_shard_map")
    assert "block by block" not in _rendered("ring_attention_shard_map_no_rescale")


def test_progress_bar_is_rich_and_only_on_a_terminal() -> None:
    import io

    from rich.console import Console

    from scalify_hlo.cli import _Progress

    assert not _Progress(enabled=True).enabled  # tests: stderr is not a terminal
    terminal = io.StringIO()
    bar = _Progress(enabled=True, console=Console(file=terminal, force_terminal=True, width=100), delay=0.0)
    bar.update("deriving facts", 5, 10)
    bar.close()
    assert "deriving facts" in terminal.getvalue() and "5/10 ops" in terminal.getvalue()
    quiet = io.StringIO()
    off = _Progress(enabled=False, console=Console(file=quiet, force_terminal=True), delay=0.0)
    off.update("deriving facts", 5, 10)
    off.close()
    assert quiet.getvalue() == ""
