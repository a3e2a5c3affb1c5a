"""Shared test setup: 8 fake CPU devices for anything that runs JAX, and the fixture catalogue."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Set
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import Version

if TYPE_CHECKING:
    from scalify_hlo.report.verdicts import Report

# XLA reads this once, when jax is first imported; every test module sees the same 8 devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import scalify_hlo.ops.registry  # noqa: F401  (registers the numeric kernels, as importing the prover does)


def numeric_xla_flags() -> None:
    """The XLA flags of the numeric tests: XLA reads its flags once per process, before the first compile,
    so every numeric test module asks for the same ones, whichever pytest imports first. Modules named
    *numeric_probe* are dumped after SPMD partitioning (`test_numeric_vs_xla.py` reads them); if XLA was
    set up before these flags (so no dump), that file runs itself as a script in a fresh process."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags += " --xla_force_host_platform_device_count=8"
    if "xla_dump_to" not in flags:
        dump = os.path.join(tempfile.gettempdir(), f"scalify_numeric_dump_{os.getpid()}")
        flags += (f" --xla_dump_to={dump} --xla_dump_hlo_pass_re=spmd-partitioning"
                  " --xla_dump_hlo_module_re=.*numeric_probe.*")
        atexit.register(shutil.rmtree, dump, True)  # (JAX also writes every module it compiles there)
    os.environ["XLA_FLAGS"] = flags.strip()


REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
FIXTURES_NEWEST = REPO / "tests" / "fixtures_newest"  # the same pairs as a newer jax writes them


@dataclass(frozen=True)
class Fixture:
    name: str
    dir: Path
    expected: dict

    @property
    def before(self) -> Path:
        return self.dir / "before.mlir"

    @property
    def after(self) -> Path:
        hlo = self.dir / "after.hlo"
        return hlo if hlo.exists() else self.dir / "after.mlir"

    @property
    def assume(self) -> dict[str, tuple[int, int]]:
        """Input ranges the verdict is stated under (`--assume NAME=LO:HI`)."""
        return {k: (lo, hi) for k, (lo, hi) in self.expected.get("assume", {}).items()}

    @property
    def excess_precision(self) -> bool:
        """Verified with `--excess-precision` (XLA's compiled bf16 code drops roundings)."""
        return bool(self.expected.get("excess_precision", False))

    @property
    def bug_site(self) -> str | None:
        bug = self.expected.get("bug")
        return f"{bug['file']}:{bug['line']}" if bug else None


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str | Path) -> CliRun:
    """`scalify-hlo ARGS` in this process, from the repository root (typer's CliRunner: the command group
    gives the exit codes, so this sees what the script returns; seconds instead of a Python start-up)."""
    from typer.testing import CliRunner

    from scalify_hlo import cli

    here = os.getcwd()
    os.chdir(REPO)
    try:
        result = CliRunner().invoke(cli.app, [str(a) for a in args])
    finally:
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return CliRun(result.exit_code, result.stdout, result.stderr)


def fixtures() -> list[Fixture]:
    """Every fixture pair; where a newer jax wrote one again because its text differs (a dump and a
    reference expanded by another XLA: `tools/gen_fixtures.py --out tests/fixtures_newest`), that one for
    that jax and later ones (a later jax may no longer lower the program the pair was written for)."""
    out = []
    jax = Version(version("jax"))
    for d in sorted(FIXTURES.iterdir()):
        if (d / "expected.json").exists():
            newer = FIXTURES_NEWEST / d.name / "expected.json"
            if newer.exists() and Version(json.loads(newer.read_text())["jax"]) <= jax:
                d = newer.parent
            out.append(Fixture(d.name, d, json.loads((d / "expected.json").read_text())))
    return out


# Fixtures whose proof takes about ten seconds (the counterexample of a bug inside nested fori loops is
# found by interpreting thousands of iterations): every test reading their proof runs in `make test-slow`.
SLOW_PROOFS = frozenset({"nested_fori_shard_map_inner_constant"})
# Fixtures whose numeric run (the interpreter against XLA's stored outputs) takes seconds for the same reason.
SLOW_RUNS = frozenset({"nested_fori_shard_map", "nested_fori_shard_map_inner_constant"})


def slow_if(name: str, slow: Set[str]) -> list[object]:
    """The marks of a test parameter named `name`: `slow` (run by `make test-slow`) when it is in `slow`."""
    import pytest

    return [pytest.mark.slow] if name in slow else []


def fixture_params(fxs: list[Fixture], slow: Set[str] = frozenset()) -> list[object]:
    """Fixtures as pytest parameters, each in its own xdist group: every test of one fixture runs in one
    process, so `proof_of` proves it once for all of them."""
    import pytest

    return [pytest.param(f, id=f.name, marks=[pytest.mark.xdist_group(f.name),
                                              *([pytest.mark.slow] if f.name in slow | SLOW_PROOFS else [])])
            for f in fxs]


def proof_of(fx: Fixture) -> Report:
    """The report of one fixture pair under its assumptions, proven once per test process."""
    return _proof(fx.before, fx.after, tuple(sorted(fx.assume.items())), fx.excess_precision)


@functools.cache
def _proof(before: Path, after: Path, assume: tuple[tuple[str, tuple[int, int]], ...],
           excess_precision: bool = False) -> Report:
    from scalify_hlo.prove.engine import Options, prove

    return prove(before, after, Options(assume=dict(assume), excess_precision=excess_precision))


def _hypothesis_profile() -> None:
    # CI must be reproducible: a property test explores the same examples on every run.
    from hypothesis import settings

    settings.register_profile("repro", derandomize=True, database=None, deadline=None)
    settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "repro"))


_hypothesis_profile()
