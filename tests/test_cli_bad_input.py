"""Bad input: one clear message naming the file (and line where there is one), exit code 3, no traceback.

And what is not bad input: a legal program the tool does not model is `unknown` (exit 2), never exit 3.
Most tests run the CLI in-process (`CliRunner`: the command group gives the exit codes, so it sees the same
ones as the script); a subprocess only where the script itself is under test.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import FIXTURES
from typer.testing import CliRunner, Result

from scalify_hlo import cli, parsers
from scalify_hlo.ir.errors import InputFileError

MLP = FIXTURES / "megatron_mlp_shardy"
TP_GROUPS = "replica_groups={{0,1,2,3},{4,5,6,7}}"  # the all-reduce of MLP/after.hlo
X_SHARDING = "sharding={devices=[2,1,4]<=[8] last_tile_dim_replicate}"  # its parameter 0


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """`python -m scalify_hlo ARGS` in a subprocess: for inputs on which XLA would abort its process."""
    env = dict(os.environ, SCALIFY_DEBUG="")
    return subprocess.run([sys.executable, "-m", "scalify_hlo", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=env)


def run_here(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The same in this process (`CliRunner`): an exception other than the exit would be a traceback."""
    result = invoke(*args, env={"SCALIFY_DEBUG": ""})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess([str(a) for a in args], result.exit_code, result.stdout, result.stderr)


def assert_bad_input(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 3, out
    assert "Traceback" not in out, out
    for n in needles:
        assert n in out, out


def test_empty_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.mlir"
    empty.write_text("")
    assert_bad_input(run_here("diff", empty, MLP / "after.hlo"), str(empty), "empty")


def test_binary_garbage(tmp_path: Path) -> None:
    # a subprocess: the script itself, on bytes that reach no parser
    junk = tmp_path / "junk.hlo"
    junk.write_bytes(bytes(range(256)) * 4)
    assert_bad_input(run_cli("diff", MLP / "before.mlir", junk), str(junk), "binary")


def test_truncated_mlir_names_the_line(tmp_path: Path) -> None:
    text = (MLP / "before.mlir").read_text().splitlines()
    cut = tmp_path / "cut.mlir"
    cut.write_text("\n".join(text[: len(text) // 3]) + "\n")
    proc = run_here("diff", cut, MLP / "after.hlo")
    assert_bad_input(proc, f"{cut}:", "StableHLO")


def test_truncated_hlo_names_the_line(tmp_path: Path) -> None:
    text = (MLP / "after.hlo").read_text().splitlines()
    cut = tmp_path / "cut.hlo"
    cut.write_text("\n".join(text[: len(text) - 3]) + "\n")
    assert_bad_input(run_here("diff", MLP / "before.mlir", cut), f"{cut}:", "HLO")


def test_elided_constant_is_refused(tmp_path: Path) -> None:
    """XLA's printer writes a large constant as `constant({...})` unless the dump asks for large constants;
    XLA's parser then makes up its values. A real offset table, printed the way XLA elides it:"""
    fx = Path(__file__).parent / "fixtures" / "mut_offset_table_permuted"
    text = (fx / "after.hlo").read_text()
    elided = re.sub(r"constant\(\{1, 2, 3, 0, 1, 2, 3, 0\}\)", "constant({...})", text, count=1)
    assert elided != text
    path = tmp_path / "after.hlo"
    path.write_text(elided)
    line = elided[: elided.index("constant({...})")].count("\n") + 1
    assert_bad_input(run_here("diff", fx / "before.mlir", path), f"{path}:{line}", "--xla_dump_large_constants")


@pytest.mark.parametrize(("old", "new", "needle"), [
    # XLA's parser CHECK-fails (aborts the process) on these: read first, so they are errors with a line
    (X_SHARDING, "sharding={devices=[2,1,4]0,0,1,1,2,2,3,3 last_tile_dim_replicate}", "distinct non-negative"),
    (X_SHARDING, "sharding={devices=[2,1,4]<=[2,4]T(0,0) last_tile_dim_replicate}", "not a permutation"),
    (X_SHARDING, "sharding={devices=[-2,1,-4]<=[8] last_tile_dim_replicate}", "positive tile dimensions"),
    (TP_GROUPS, "replica_groups=[2,4]<=[2,4]T(1,1)", "not a permutation"),
])
def test_a_tile_assignment_xla_would_abort_on(tmp_path: Path, old: str, new: str, needle: str) -> None:
    text = (MLP / "after.hlo").read_text()
    assert old in text
    after = tmp_path / "after.hlo"
    after.write_text(text.replace(old, new, 1))
    line = text[: text.index(old)].count("\n") + 1
    # a subprocess: were XLA to see it, the abort would end the test's own process
    assert_bad_input(run_cli("diff", MLP / "before.mlir", after), f"{after}:{line}", needle)


def test_wrong_dialect(tmp_path: Path) -> None:
    other = tmp_path / "arith.mlir"
    other.write_text("module {\n  func.func @main(%a: i32) -> i32 {\n    %0 = arith.addi %a, %a : i32\n"
                     "    return %0 : i32\n  }\n}\n")
    assert_bad_input(run_here("show", other), str(other), "arith.addi")


def test_unknown_content(tmp_path: Path) -> None:
    prose = tmp_path / "notes.txt"
    prose.write_text("these are not the programs you are looking for\n")
    assert_bad_input(run_here("show", prose), f"{prose}:1", "expected")


def test_missing_file() -> None:
    assert_bad_input(run_here("diff", MLP / "before.mlir", "no/such/file.hlo"), "no/such/file.hlo")


def test_mismatched_pair_different_inputs() -> None:
    proc = run_here("diff", MLP / "before.mlir", FIXTURES / "llama_block_shardy" / "after.hlo")
    assert_bad_input(proc, "parameters")


def test_mismatched_pair_different_shapes() -> None:
    from scalify_hlo import parsers

    refs = {}
    for d in sorted(FIXTURES.iterdir()):
        f = parsers.load(d / "before.mlir").main
        refs[d.name] = (len(f.params), len(f.outputs), [str(p.type) for p in f.params])
    pair = next((a, b) for a in refs for b in refs
                if refs[a][:2] == refs[b][:2] and refs[a][2] != refs[b][2] and (FIXTURES / b / "after.mlir").exists())
    proc = run_here("diff", FIXTURES / pair[0] / "before.mlir", FIXTURES / pair[1] / "after.mlir")
    assert_bad_input(proc, "parameter", "expected")


@pytest.mark.parametrize("args", [("diff",), ("diff", "--bogus", "a", "b"), ("frobnicate",)])
def test_usage_errors(args: tuple[str, ...]) -> None:
    assert_bad_input(run_here(*args))


EMBED = FIXTURES / "embed_vocab_shard_map"


@pytest.mark.parametrize("assume,needles", [
    ("idz=0:32", ("--assume names `idz`", "expected one of: ids, table")),
    ("ids=0", ("NAME=LO:HI",)),
    ("ids=9:3", ("empty",)),
    ("table=0:4", ("`table` is tensor<32x8xf32>", "integer input")),
    ("ids=0:99999999999", ("within [-2147483648, 2147483648)",)),
])
def test_bad_assumption(assume: str, needles: tuple[str, ...]) -> None:
    assert_bad_input(run_here("diff", EMBED / "before.mlir", EMBED / "after.mlir", "--assume", assume), *needles)


# ------------------------------------------------------------------------------ in-process: CliRunner

def invoke(*args: str | Path, stdin: bytes | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli.app, [str(a) for a in args], input=stdin, env=env)


def assert_exit(result: Result, code: int, *needles: str) -> None:
    out = result.output
    assert result.exit_code == code, f"{out}\n{result.exception!r}"
    assert "Traceback" not in out, out
    for n in needles:
        assert n in out, out


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="no /dev/zero")
def test_a_device_is_not_read() -> None:
    assert_exit(invoke("diff", "/dev/zero", MLP / "after.hlo"), 3, "/dev/zero", "not a regular file",
                "character device")


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A named pipe nobody writes to. Should the CLI open it for reading, it would block until a writer
    comes: a thread keeps trying to be that writer, so a regression fails the test instead of hanging it."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    path = tmp_path / "program.hlo"
    os.mkfifo(path)
    done = threading.Event()

    def writer() -> None:
        while not done.wait(2.0):
            with contextlib.suppress(OSError):  # (ENXIO while no reader waits)
                os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    yield path
    done.set()
    thread.join()


def test_a_fifo_is_not_opened(fifo: Path) -> None:
    assert_exit(invoke("diff", MLP / "before.mlir", fifo), 3, str(fifo), "not a regular file", "named pipe")
    with pytest.raises(InputFileError, match="not a regular file"):  # the Python API reads through load too
        parsers.load(fifo)


class EndlessZeros(io.RawIOBase):
    """/dev/zero as standard input, counting what was taken (bounded, so a regression cannot eat memory)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        self.taken = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        n = min(len(buffer), self.bound - self.taken)
        buffer[:n] = bytes(n)
        self.taken += n
        return n


def test_an_endless_stdin_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # CliRunner only takes bytes for stdin, so the app runs on the real (patched) sys.stdin here
    limit = 1 << 20
    zeros = EndlessZeros(bound=64 << 20)
    monkeypatch.setenv(parsers.LIMIT_VARIABLE, str(limit))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BufferedReader(zeros)))
    with pytest.raises(SystemExit) as exited:
        cli.app(["diff", "-", str(MLP / "after.hlo")])
    err = capsys.readouterr().err
    assert exited.value.code == 3, err
    assert "<stdin>" in err and "larger than the 1 MiB input limit" in err and parsers.LIMIT_VARIABLE in err, err
    assert zeros.taken <= limit + (1 << 16)  # counted while reading: it stopped right after the limit


def test_a_file_over_the_limit(tmp_path: Path) -> None:
    big = MLP / "before.mlir"
    assert_exit(invoke("show", big, env={parsers.LIMIT_VARIABLE: "100"}), 3, str(big), "larger than the 100 bytes")
    with pytest.raises(InputFileError, match="larger than"):
        parsers.load(big, limit=100)


def test_stdin_is_one_input_read_once() -> None:
    # --numeric runs the programs again after the proof: standard input must not be read a second time
    result = invoke("diff", "-", MLP / "after.hlo", "--numeric", stdin=(MLP / "before.mlir").read_bytes())
    assert_exit(result, 0, "verdict: equivalent", "outputs agree")


def test_stdin_for_both_inputs() -> None:
    assert_exit(invoke("diff", "-", "-", stdin=b""), 3, "standard input")


def test_a_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    bom = b"\xef\xbb\xbf"
    before, after = tmp_path / "before.mlir", tmp_path / "after.hlo"
    before.write_bytes(bom + (MLP / "before.mlir").read_bytes())  # StableHLO
    after.write_bytes(bom + (MLP / "after.hlo").read_bytes())  # HLO text
    assert_exit(invoke("diff", before, after), 0, "verdict: equivalent")


@pytest.mark.parametrize("target,needle", [
    ("", "is a directory"),
    ("no/such/folder/report.json", "does not exist"),
    ("a_file/report.json", "is not a directory"),
])
def test_json_target_is_checked_before_verifying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str,
                                                  needle: str) -> None:
    import scalify_hlo.api

    def must_not_run(*_: object) -> None:
        raise AssertionError("verification ran before --json was checked")

    monkeypatch.setattr(scalify_hlo.api, "verify", must_not_run)
    (tmp_path / "a_file").write_text("")
    out = tmp_path / target
    assert_exit(invoke("diff", MLP / "before.mlir", MLP / "after.hlo", "--json", out), 3, "--json", str(out), needle)


@pytest.mark.parametrize("option,value", [("--iterations", "-5"), ("--iterations", "0"), ("--timeout", "-1"),
                                          ("--timeout", "0"), ("--timeout", "nan"), ("--nodes", "0")])
def test_budgets_must_be_positive(option: str, value: str) -> None:
    # a usage error is bad input: exit 3 (click's own code for it, 2, means unknown here)
    assert_exit(invoke("diff", MLP / "before.mlir", MLP / "after.hlo", option, value), 3, option)


# A legal program the tool does not model is `unknown`, never bad input. Each case is a small hand edit
# of a real compiler output (MLP/after.hlo: XLA after SPMD partitioning).
@pytest.mark.parametrize("old,new,needles", [
    # replica groups that are no mesh axes' fibres: legal, not modelled
    (TP_GROUPS, "replica_groups={{0,5,6,7},{4,1,2,3}}", ("replica groups {{0,5,6,7},{4,1,2,3}}", "not the fibres")),
    (TP_GROUPS, "replica_groups={{0,5},{1,4},{2,7},{3,6}}", ("replica groups {{0,5},{1,4},{2,7},{3,6}}",)),
    # groups of different sizes: legal for an all-reduce
    (TP_GROUPS, "replica_groups={{0,1,2},{3,4,5,6,7}}", ("replica groups {{0,1,2},{3,4,5,6,7}}", "different sizes")),
    # a tile assignment sharing no mesh with the others
    (X_SHARDING, "sharding={devices=[2,1,4]0,5,6,7,4,1,2,3 last_tile_dim_replicate}",
     ("sharding of parameter 0", "no common mesh")),
    (X_SHARDING, "sharding={maximal device=0}", ("sharding of parameter 0", "no layout")),
])
def test_unmodelled_devices_are_unknown_not_bad_input(tmp_path: Path, old: str, new: str,
                                                      needles: tuple[str, ...]) -> None:
    text = (MLP / "after.hlo").read_text()
    assert old in text
    after = tmp_path / "after.hlo"
    after.write_text(text.replace(old, new))
    result = invoke("diff", MLP / "before.mlir", after)
    assert result.exit_code in (1, 2), result.output  # never 3
    assert_exit(result, result.exit_code, *needles)
    assert invoke("show", after).exit_code in (0, 2)


def test_all_reduce_member_order_is_free(tmp_path: Path) -> None:
    # a sum does not care who comes first in a group: the same all-reduce, not a discrepancy
    after = tmp_path / "after.hlo"
    after.write_text((MLP / "after.hlo").read_text().replace(TP_GROUPS, "replica_groups={{1,0,2,3},{5,4,7,6}}"))
    assert_exit(invoke("diff", MLP / "before.mlir", after), 0, "verdict: equivalent")
