"""The committed fixtures (made by tools/gen_fixtures.py) are complete, well-formed, small and path-free.

Fast: reads files and compares stored arrays with NumPy; never runs JAX.
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
GENERATOR = "tools/gen_fixtures.py"
# An absolute path (a slash that starts `/dir/...`), wherever the generating machine kept its files; and
# library frames, which only a machine's install has.
ABSOLUTE_PATH = re.compile(r"(?<![\w.)\]>/])/(?:[\w.+-]+/)+")
LIBRARY_FRAME = "site-packages"
MAX_FILE_BYTES = 200_000
MAX_TOTAL_BYTES = 8_500_000  # grows by a correct/buggy pair per capability (7.55 MB at 246 pairs, 8.05 MB at 269, 8.40 MB at 273); keep clones small
RTOL, ATOL = 1e-4, 1e-5

AFTER_FILE = {
    "spmd_hlo": "after.hlo",
    "compiled_hlo": "after.hlo",
    "mutated_hlo": "after.hlo",
    "shard_map_mlir": "after.mlir",
    "gspmd_shard_map_mlir": "after.mlir",  # a shard_map lowered with Shardy off (SPMDFullToShardShape)
}

REQUIRED = {
    "megatron_mlp_shardy", "megatron_mlp_gspmd", "megatron_mlp_compiled",
    "megatron_mlp_shard_map", "megatron_mlp_shard_map_missing_psum", "megatron_mlp_shard_map_psum_wrong_axis",
    "megatron_mlp_shard_map_pmean", "rmsnorm_shard_map", "rmsnorm_shard_map_local_stats", "rope_sp_shard_map",
    "rope_sp_shard_map_no_offset", "loss_dp_shard_map", "loss_dp_shard_map_no_pmean", "vocab_softmax_shard_map",
    "vocab_softmax_shard_map_local", "llama_block_shard_map", "llama_block_shardy", "llama_block_gspmd",
    "llama_scan_shardy", "llama_sp_shardy", "mut_replica_groups_swapped", "mut_allreduce_reducer",
    "mut_offset_table_permuted", "mut_subtract_swapped", "mut_constant_changed",
}

FIXTURE_DIRS = sorted(p for p in FIXTURES.iterdir() if p.is_dir()) if FIXTURES.is_dir() else []


def _expected(d: Path) -> dict:
    return json.loads((d / "expected.json").read_text())


def _oracle(d: Path) -> dict[str, np.ndarray]:
    with np.load(d / "oracle.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _indexed(arrays: dict[str, np.ndarray], prefix: str) -> list[np.ndarray]:
    idx = sorted(int(k[len(prefix):]) for k in arrays if re.fullmatch(re.escape(prefix) + r"\d+", k))
    assert idx == list(range(len(idx))), f"{prefix}* not numbered 0..n-1: {idx}"
    return [arrays[f"{prefix}{i}"] for i in idx]


def test_all_required_fixtures_present() -> None:
    names = {d.name for d in FIXTURE_DIRS}
    assert names >= REQUIRED, f"missing fixtures: {sorted(REQUIRED - names)}"


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_files_present(d: Path) -> None:
    e = _expected(d)
    after = AFTER_FILE[e["after_kind"]]
    present = {p.name for p in d.iterdir()}
    assert present == {"before.mlir", after, "expected.json", "oracle.npz"}, present


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_expected_json(d: Path) -> None:
    e = _expected(d)
    assert e["name"] == d.name
    assert isinstance(e["description"], str) and e["description"].strip()
    assert e["verdict"] in ("equivalent", "discrepancy")
    assert e["after_kind"] in AFTER_FILE
    assert e["generator"] == GENERATOR
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", e["jax"]), e["jax"]
    mesh = e["mesh"]
    assert isinstance(mesh, dict) and mesh
    assert all(isinstance(k, str) and isinstance(v, int) and v > 0 for k, v in mesh.items())
    assert int(np.prod(list(mesh.values()))) == 8
    if e["after_kind"] == "mutated_hlo":
        # An edit breaks the program (a bug pair), or keeps its meaning, shown by running it with XLA (a guard
        # against false alarms, fa_*): then the notes say so.
        assert e["verdict"] == "discrepancy" or any("meaning-preserving" in n for n in e.get("notes", []))
    if e["verdict"] == "equivalent":
        assert e["bug"] is None
        return
    bug = e["bug"]
    assert isinstance(bug, dict)
    assert isinstance(bug["file"], str) and isinstance(bug["line"], int) and isinstance(bug["what"], str)
    assert bug["what"].strip()
    assert not Path(bug["file"]).is_absolute() and bug["file"].startswith("tools/programs/"), bug["file"]


@pytest.mark.parametrize("d", [d for d in FIXTURE_DIRS if _expected(d)["bug"]], ids=lambda d: d.name)
def test_bug_line_exists(d: Path) -> None:
    e = _expected(d)
    bug = e["bug"]
    src = REPO / bug["file"]
    assert src.is_file(), f"{bug['file']} does not exist"
    lines = src.read_text().split("\n")
    assert 1 <= bug["line"] <= len(lines), f"{bug['file']}:{bug['line']} out of range"
    line = lines[bug["line"] - 1]
    assert line.strip(), f"{bug['file']}:{bug['line']} is blank"
    if e["after_kind"] != "mutated_hlo":
        assert "# BUG:" in line, f"{bug['file']}:{bug['line']} has no '# BUG:' marker: {line!r}"


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_headers(d: Path) -> None:
    e = _expected(d)
    for name in ("before.mlir", AFTER_FILE[e["after_kind"]]):
        first = (d / name).read_text().split("\n", 1)[0]
        assert first.startswith(f"// generated by {GENERATOR} (jax {e['jax']}): "), f"{name}: {first[:100]!r}"


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_ir_shape(d: Path) -> None:
    """Cheap textual sanity: the right kind of IR is in each file."""
    e = _expected(d)
    before = (d / "before.mlir").read_text()
    assert "func.func public @main" in before
    after = (d / AFTER_FILE[e["after_kind"]]).read_text()
    if e["after_kind"] == "shard_map_mlir":
        assert "sdy.manual_computation" in after
        # the reference is unsharded (a custom call's `sdy.sharding_rule` is not a sharding)
        assert "#sdy.sharding<" not in before and "mhlo.sharding" not in before
    elif e["after_kind"] == "gspmd_shard_map_mlir":
        assert "SPMDFullToShardShape" in after and "sdy." not in after
        assert "sdy.sharding" not in before and "mhlo.sharding" not in before
    else:
        assert re.search(r"^HloModule ", after, re.M)
        assert "num_partitions=8" in after
        assert ("sdy.sharding" in before) or ("mhlo.sharding" in before)


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_no_machine_paths(d: Path) -> None:
    for p in d.iterdir():
        if p.suffix == ".npz":
            with zipfile.ZipFile(p) as z:
                text = "\n".join(z.namelist())
        else:
            text = p.read_text()
        bad = ABSOLUTE_PATH.findall(text) + [LIBRARY_FRAME] * (LIBRARY_FRAME in text)
        assert not bad, f"{p.name}: machine path(s) {sorted(set(bad))[:5]}"


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_sizes(d: Path) -> None:
    for p in d.iterdir():
        assert p.stat().st_size < MAX_FILE_BYTES, f"{p.name}: {p.stat().st_size} bytes"


def test_total_size() -> None:
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < MAX_TOTAL_BYTES, f"tests/fixtures is {total} bytes"


@pytest.mark.parametrize("d", FIXTURE_DIRS, ids=lambda d: d.name)
def test_oracle(d: Path) -> None:
    e = _expected(d)
    arrays = _oracle(d)
    ins = _indexed(arrays, "in_")
    before = _indexed(arrays, "before_out_")
    after = _indexed(arrays, "after_out_")
    assert set(arrays) == {f"in_{i}" for i in range(len(ins))} | {f"before_out_{i}" for i in range(len(before))} \
        | {f"after_out_{i}" for i in range(len(after))}
    assert ins and before
    assert len(ins) == len(e["inputs"])
    for x in ins:
        assert x.dtype in (np.float32, np.int32, np.int64, np.uint32, np.uint64), x.dtype
    if e["after_kind"] != "mutated_hlo":
        assert after, "a runnable after program must come with after_out_*"
    if not after:
        return
    assert len(after) == len(before)
    for a, b in zip(after, before, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
    close = all(np.array_equal(a, b) if a.dtype.kind in "iub" else np.allclose(a, b, rtol=RTOL, atol=ATOL)
                for a, b in zip(after, before, strict=True))  # integers exactly: 2**53 + 1 is not 2**53
    if e["verdict"] == "equivalent":
        assert close, "equivalent fixture whose XLA outputs differ"
    else:
        assert not close, "discrepancy fixture whose XLA outputs agree"


@pytest.mark.parametrize("d", [d for d in FIXTURE_DIRS if (d / "after.hlo").exists()], ids=lambda d: d.name)
def test_hlo_parses_with_header(d: Path) -> None:
    """XLA's own HLO parser accepts the file as committed (header comment included). Parsing only."""
    _hlo = pytest.importorskip("jaxlib._hlo")
    _hlo.hlo_module_from_text((d / "after.hlo").read_text())
