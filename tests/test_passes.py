"""`scalify-hlo passes` over a real XLA pipeline dump of the Llama block: every pass pair proven or
`unknown` with a reason (never a discrepancy), a hand-broken pass output found at its pass and op, and
the simplifier pass of a train step proven; the same pairs as tasks of a local Ray cluster."""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import REPO

from scalify_hlo.ir.errors import UsageError
from scalify_hlo.passes import check_dump, render

DUMPS = REPO / "tests" / "pass_dumps"


def _unpack(name: str, dest: Path) -> Path:
    with tarfile.open(DUMPS / name) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> list:  # type: ignore[type-arg]
    return check_dump(_unpack("llama_block.tar.gz", tmp_path_factory.mktemp("clean")))


def test_every_pass_pair_is_proven_or_unknown_with_a_reason(clean: list) -> None:  # type: ignore[type-arg]
    verdicts = [r.verdict for r in clean]
    assert "discrepancy" not in verdicts, render(clean)
    assert len(clean) >= 50
    assert verdicts.count("equivalent") >= 40, render(clean)
    assert all(r.reason for r in clean if r.verdict == "unknown")


def test_the_partitioner_pair_gets_the_distributed_check(clean: list) -> None:  # type: ignore[type-arg]
    distributed = [r for r in clean if r.mode == "distributed"]
    assert len(distributed) == 1 and distributed[0].verdict == "equivalent"
    # named for the partitioner, whose nested spmd-cleanup pipeline dumped the first per-device module
    assert distributed[0].passes == "spmd-partitioner/spmd-partitioning (to the start of its nested spmd-cleanup)"


def test_pass_pairs_are_labelled_by_what_ran_between_them() -> None:
    from scalify_hlo.passes import Stage, label

    def stage(index: int, pipeline: str, after: str, before: str | None) -> Stage:
        return Stage("m", index, pipeline, after, Path(f"{index}.txt"), before)

    one = stage(6, "spmd-cleanup", "dce", "tuple-simplifier")
    assert label(stage(5, "spmd-cleanup", "pipeline-start", "dce"), one) == "spmd-cleanup/dce"
    several = stage(11, "layout", "dot_decomposer", "operand_upcaster")
    assert label(stage(10, "layout", "pipeline-start", "normalizer"), several) == "layout/normalizer … dot_decomposer"
    nested_end = stage(40, "after_layout", "fusion", "fusion-wrapper")
    assert label(stage(39, "inner", "pipeline-start", "pipeline-end"), nested_end) == "after_layout/fusion"


@pytest.mark.slow  # (about ten seconds: two worker processes each import the prover)
def test_broken_pass_is_named_with_its_op(tmp_path: Path) -> None:
    expected = json.loads((DUMPS / "llama_block_broken.json").read_text())
    # in 2 worker processes: the first breaking pass in pipeline order, as a serial run finds it
    results = check_dump(_unpack("llama_block_broken.tar.gz", tmp_path), stop_at_first=True, jobs=2)
    assert [r.verdict for r in results].count("discrepancy") == 1 and results[-1].verdict == "discrepancy"
    first = next(r for r in results if r.verdict == "discrepancy")
    assert first.passes == expected["pass"]
    assert first.after.name == expected["file"]
    assert first.report is not None
    finding = first.report.findings[0]
    assert finding.after is not None and finding.after.instruction == expected["instruction"]


def test_the_simplifier_pass_of_a_train_step_is_proven(tmp_path: Path) -> None:
    """XLA's `algsimp` on a one-layer train step (AdamW, fsdp x tp; `tools/gen_pass_dump.py`) rewrites a
    softmax's division into a product with the broadcast reciprocal, drops `max(x, -inf)` and a reduce over
    unit dims a reshape added, and merges Adam's two divisions; all proven. (On the 8-layer step, that
    pair was a false discrepancy: float32 rounding amplified through the layers.)"""
    (result,) = check_dump(_unpack("train_step_algsimp.tar.gz", tmp_path))
    assert result.passes.endswith("algsimp"), result.passes
    assert result.verdict == "equivalent", render([result])


@pytest.mark.slow
def test_pass_pairs_as_tasks_of_a_local_ray_cluster(tmp_path: Path) -> None:
    """`--ray local`: a Ray instance on this machine; the files travel as bytes through its object store.
    The first breaking pass and every verdict are those of a serial run."""
    expected = json.loads((DUMPS / "llama_block_broken.json").read_text())
    dump = _unpack("llama_block_broken.tar.gz", tmp_path)
    serial = check_dump(dump)
    on_ray = check_dump(dump, ray="local")
    assert [(r.passes, r.verdict) for r in on_ray] == [(r.passes, r.verdict) for r in serial]
    first = next(r for r in on_ray if r.verdict == "discrepancy")
    assert (first.passes, first.after.name) == (expected["pass"], expected["file"])
    assert first.report is not None and first.report.findings[0].after is not None
    assert first.report.findings[0].after.instruction == expected["instruction"]


def test_ray_not_installed_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dump = _unpack("train_step_algsimp.tar.gz", tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(UsageError, match=r"scalify-hlo\[ray\]"):
        check_dump(dump, ray="auto")
