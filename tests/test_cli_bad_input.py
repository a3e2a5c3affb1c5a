"""Bad input: one clear message naming the file (and line where there is one), exit code 3, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURES

MLP = FIXTURES / "megatron_mlp_shardy"


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, SCALIFY_DEBUG="")
    return subprocess.run([sys.executable, "-m", "scalify_hlo", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def assert_bad_input(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "Traceback" not in out, out
    for n in needles:
        assert n in out, out


def test_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.mlir"
    empty.write_text("")
    assert_bad_input(run_cli("diff", empty, MLP / "after.hlo"), str(empty), "empty")


def test_binary_garbage(tmp_path: Path) -> None:
    junk = tmp_path / "junk.hlo"
    junk.write_bytes(bytes(range(256)) * 4)
    assert_bad_input(run_cli("diff", MLP / "before.mlir", junk), str(junk), "binary")


def test_truncated_mlir_names_the_line(tmp_path: Path) -> None:
    text = (MLP / "before.mlir").read_text().splitlines()
    cut = tmp_path / "cut.mlir"
    cut.write_text("\n".join(text[: len(text) // 3]) + "\n")
    proc = run_cli("diff", cut, MLP / "after.hlo")
    assert_bad_input(proc, f"{cut}:", "StableHLO")


def test_truncated_hlo_names_the_line(tmp_path: Path) -> None:
    text = (MLP / "after.hlo").read_text().splitlines()
    cut = tmp_path / "cut.hlo"
    cut.write_text("\n".join(text[: len(text) - 3]) + "\n")
    assert_bad_input(run_cli("diff", MLP / "before.mlir", cut), f"{cut}:", "HLO")


def test_wrong_dialect(tmp_path: Path) -> None:
    other = tmp_path / "arith.mlir"
    other.write_text("module {\n  func.func @main(%a: i32) -> i32 {\n    %0 = arith.addi %a, %a : i32\n"
                     "    return %0 : i32\n  }\n}\n")
    assert_bad_input(run_cli("show", other), str(other), "arith.addi")


def test_unknown_content(tmp_path: Path) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("these are not the programs you are looking for\n")
    assert_bad_input(run_cli("show", prose), f"{prose}:1", "expected")


def test_missing_file() -> None:
    assert_bad_input(run_cli("diff", MLP / "before.mlir", "no/such/file.hlo"), "no/such/file.hlo")


def test_mismatched_pair_different_inputs() -> None:
    proc = run_cli("diff", MLP / "before.mlir", FIXTURES / "llama_block_shardy" / "after.hlo")
    assert_bad_input(proc, "parameters")


def test_mismatched_pair_different_shapes() -> None:
    from scalify_hlo import parsers

    refs = {}
    for d in sorted(FIXTURES.iterdir()):
        f = parsers.load(d / "before.mlir").main
        refs[d.name] = (len(f.params), len(f.outputs), [str(p.type) for p in f.params])
    pair = next((a, b) for a in refs for b in refs
                if refs[a][:2] == refs[b][:2] and refs[a][2] != refs[b][2] and (FIXTURES / b / "after.mlir").exists())
    proc = run_cli("diff", FIXTURES / pair[0] / "before.mlir", FIXTURES / pair[1] / "after.mlir")
    assert_bad_input(proc, "parameter", "expected")


@pytest.mark.parametrize("args", [("diff",), ("diff", "--bogus", "a", "b"), ("frobnicate",)])
def test_usage_errors(args: tuple[str, ...]) -> None:
    assert_bad_input(run_cli(*args))


EMBED = FIXTURES / "embed_vocab_shard_map"


@pytest.mark.parametrize("assume,needles", [
    ("idz=0:32", ("--assume names `idz`", "expected one of: ids, table")),
    ("ids=0", ("NAME=LO:HI",)),
    ("ids=9:3", ("empty",)),
    ("table=0:4", ("`table` is tensor<32x8xf32>", "integer input")),
    ("ids=0:99999999999", ("within [-2147483648, 2147483648)",)),
])
def test_bad_assumption(assume: str, needles: tuple[str, ...]) -> None:
    assert_bad_input(run_cli("diff", EMBED / "before.mlir", EMBED / "after.mlir", "--assume", assume), *needles)
