"""`tools/bench.py`'s `passes` case (issue 15: `passes` over the full XLA dump of an 8-layer train step, timed
with 1 and 2 jobs): selection, the cached dump and its absence, the table and target, BENCH.md's section.
Hand-made results only: nothing is compiled or proven here."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

import bench
import bench_programs as bp
import bench_report

NAME = "passes-8l-train"


def _run(jobs: int, wall: float, sequence: str = "eeeu") -> dict[str, Any]:
    verdicts = {"equivalent": sequence.count("e"), "unknown": sequence.count("u")}
    if "d" in sequence:
        verdicts["discrepancy"] = sequence.count("d")
    return {"jobs": jobs, "wall": wall, "pairs": len(sequence), "verdicts": verdicts, "sequence": sequence,
            "peak_rss_mib": 300.0, "not_equivalent": [
                {"verdict": "unknown", "module": "0000.jit_step", "passes": "layout/dot_decomposer",
                 "after": "module_0000.jit_step.0012.x.txt", "reason": "not proven", "mode": "plain"}]}


def _passes_result(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    return {"name": NAME, "what": "passes", "kind": "passes", "key": bp.PassDumpSpec().key,
            "spec": {}, "mesh": {"fsdp": 2, "tp": 4}, "generation": {"cached": True, "seconds": 9.3, "files": 4,
                                                                     "bytes": 3 << 20},
            "runs": [one, two], "speedup": round(one["wall"] / two["wall"], 2),
            "same_verdicts": one["sequence"] == two["sequence"]}


def test_the_case_is_selected_by_name_and_listed(capsys: pytest.CaptureFixture[str]) -> None:
    ns = bench.argparse.Namespace(only=[NAME], quick=False, check=False)
    (case,) = bench.select(ns)
    assert isinstance(case, bench.PassesCase) and case.spec.layers == 8 and case.jobs == (1, 2)
    assert case.spec.mesh == {"fsdp": 2, "tp": 4}
    assert NAME in bench.CHECK and case in bench.ALL  # part of the default matrix and of the targets
    assert bench.main(["--list"]) == 0
    assert NAME in capsys.readouterr().out


def test_no_generate_without_a_cached_dump_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "OUT", tmp_path)
    r = bench.run_passes_case(bench.BY_NAME[NAME], generate=False, timeout=1)  # type: ignore[arg-type]
    assert "FileNotFoundError" in r["generation"]["error"] and "--no-generate" in r["generation"]["error"]
    assert "not run" in bench._passes_progress(r, 0.0)
    assert bench_report.passes_targets([r])[0][1] is None


def test_a_cached_dump_is_reused(tmp_path: Path) -> None:
    spec = bp.PassDumpSpec()
    (tmp_path / spec.key / "dump").mkdir(parents=True)
    (tmp_path / spec.key / "stamp.json").write_text(json.dumps({"version": bp.PASS_DUMP_VERSION,
                                                                "generation": {"files": 4}}))
    d = bp.generate_pass_dump(spec, tmp_path, cache_only=True)
    assert d.cached and d.stats == {"files": 4} and d.dump == tmp_path / spec.key / "dump"


def test_table_and_target() -> None:
    r = _passes_result(_run(1, 30.0), _run(2, 20.0))
    table = bench_report.passes_table([r])
    row = table.splitlines()[2]
    assert row.startswith(f"| {NAME} | 4 (3) | 4 | 3 | 1 | 0 | 30.00 | 20.00 | 1.50 | yes |")
    (_, ok, measured), = bench_report.passes_targets([r])
    assert ok and "speedup 1.50" in measured
    broken = _passes_result(_run(1, 30.0, "eedu"), _run(2, 20.0, "eedu"))
    assert bench_report.passes_targets([broken])[0][1] is False
    differ = _passes_result(_run(1, 30.0), _run(2, 20.0, "eeee"))
    assert bench_report.passes_targets([differ])[0][1] is False
    assert "| NO |" in bench_report.passes_table([differ])


def test_bench_md_keeps_the_passes_case_out_of_the_verify_tables(tmp_path: Path) -> None:
    verify = {"name": "8b-64", "what": "forward", "key": "8b_L32_unrolled_d64", "mesh": {"fsdp": 8, "tp": 8},
              "spec": {"train": False}, "generation": {"cached": True}, "verify": {"verdict": "equivalent",
                                                                                   "wall": 1.0}}
    results = [verify, _passes_result(_run(1, 30.0), _run(2, 20.0))]
    machine = {"command": "python tools/bench.py", "generator": "g", "cores": 2, "cpu": "c", "ram_gib": 1,
               "python": "3", "jax": "j", "jaxlib": "j", "egglog": "e", "date": "d", "commit": "c",
               "load_average": [0, 0, 0]}
    text = bench_report.write_reports(results, 600, 1, {"machine": machine}, md_path=tmp_path / "B.md",
                                      results_path=tmp_path / "B.json")
    verify_part, passes_part = text.split("## Passes over an XLA dump")
    assert f"| {NAME} |" not in verify_part and "| 8b-64 | equivalent |" in verify_part
    assert f"| {NAME} | 4 (3) |" in passes_part and "layout/dot_decomposer" in passes_part
    assert "`passes` over the full XLA dump of an 8-layer train step" in verify_part  # the target line
