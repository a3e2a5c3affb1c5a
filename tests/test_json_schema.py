"""The JSON report against its documentation (docs/json.md): every field a real report carries is in the
doc's field table, every documented top-level field turns up in some report, and the doc's example is
what the command prints."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from conftest import FIXTURES, REPO, run_cli

from scalify_hlo.report.verdicts import SCHEMA

DOC = (REPO / "docs" / "json.md").read_text()
DOCUMENTED = set(re.findall(r"^\| `([^`]+)` \|", DOC, re.M))
OPEN = {"stats", "assumptions"}  # maps whose keys are data (input names) or measurements, not fields
FINDINGS = ("discrepancies[]", "hints[]")
SITES = ("before", "after", "also[]")


def _paths(obj: Any, prefix: str = "") -> Iterator[str]:
    """Every field of a report as a documented path: findings as `finding.*`, sites as `site.*`."""
    if isinstance(obj, list):
        for item in obj:
            yield from _paths(item, prefix + "[]")
        return
    if not isinstance(obj, dict):
        return
    for key, value in obj.items():
        path = f"{prefix}.{key}" if prefix else key
        if prefix in FINDINGS:
            path = f"finding.{key}"
        elif prefix.startswith("finding.") and prefix.removeprefix("finding.") in SITES:
            path = f"site.{key}"
        yield path
        if path == "stats":  # measurements: only the stable ones are documented
            yield from (f"stats.{k}" for k in value if f"stats.{k}" in DOCUMENTED)
        elif path not in OPEN:
            yield from _paths(value, path)


def _report(name: str, *extra: str) -> dict[str, Any]:
    d = FIXTURES.relative_to(REPO) / name  # (run_cli runs in the repository: paths as a user types them)
    after = d / "after.hlo" if (REPO / d / "after.hlo").exists() else d / "after.mlir"
    proc = run_cli("diff", d / "before.mlir", after, "--json", "-", *extra)
    assert proc.returncode in (0, 1, 2), proc.stderr
    return json.loads(proc.stdout)


def test_reports_carry_only_documented_fields_and_every_field_is_seen() -> None:
    reports = [_report("llama_block_shardy"),  # equivalent, HLO sites
               _report("megatron_mlp_shard_map_missing_psum", "--numeric"),  # discrepancy, numeric check
               _report("mut_replica_groups_swapped"),  # discrepancy in HLO: instruction and ir
               _report("embed_vocab_shard_map")]  # unknown, with hints (--assume)
    seen: set[str] = set()
    for r in reports:
        assert r["schema"] == SCHEMA == 1
        paths = set(_paths(r))
        assert paths - DOCUMENTED == set(), f"{r['after']}: fields missing from docs/json.md"
        seen |= paths
    assert {p for p in DOCUMENTED if "." not in p} <= seen
    assert {"site.instruction", "site.ir", "site.source", "finding.counterexample", "numeric.ok",
            "outputs[].layout", "stats.seconds", "stats.mesh"} <= seen


def test_the_documented_example_is_what_the_command_prints() -> None:
    example = json.loads(re.search(r"```json\n(.*?)```", DOC, re.S).group(1))  # type: ignore[union-attr]
    real = _report("megatron_mlp_shard_map_missing_psum")
    stats, shown = real.pop("stats"), example.pop("stats")
    assert set(shown) == {"seconds", "ops", "mesh"} and isinstance(shown["seconds"], float)  # (a measurement)
    assert (shown["ops"], shown["mesh"]) == (stats["ops"], stats["mesh"])
    # Counterexample values are float32 sums NumPy evaluates; their last digits depend on its build (BLAS,
    # vector width), so floats are compared to a relative 1e-5.
    assert _close(example, real), (example, real)


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-5)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)
