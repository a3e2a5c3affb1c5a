"""Soundness fuzzing (marked slow; `make test-slow`): a short budget of tools/fuzz.py.

Random shard_map programs (a correct and a perturbed pair each) and text mutants of the small partitioned
fixtures are run with JAX/XLA on 8 fake CPU devices to know whether they really agree with the
reference; the verifier must then never call a different pair `equivalent`, never call an agreeing pair a
`discrepancy`, never raise and never take longer than 30 s. A failure prints each offending program's
source (save it and run `python tools/fuzz.py --replay FILE`) or mutant diff. The full soak is
`python tools/fuzz.py --programs 500 --mutants 1000 --json fuzz.json`.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
pytestmark = pytest.mark.slow

SEED = 20240607
PROGRAMS = 25
EXACT_AT_LEAST = 0.7  # share of the fuzzer's found bugs named at the perturbed line (measured: 0.81)
MUTANTS = 30
# Small fixtures (each is rebuilt once to recover its shardings): the budget goes to mutants, not loading.
MUTANT_FIXTURES = ["megatron_mlp_shardy", "megatron_mlp_gspmd", "embed_vocab_shardy", "xent_vocab_shardy",
                   "train_sgd_shardy"]


def _show(failures: list[Any], limit: int = 4) -> str:
    out = []
    for f in failures[:limit]:
        body = getattr(f, "source", None) or getattr(f, "diff", None) or ""
        head = getattr(f, "id", None) or f"{f.fixture}: {f.what}"
        out.append(f"--- {head}: {f.outcome} (truth {f.truth}, verdict {f.verdict}): {f.reason}\n{body}")
    return "\n".join(out) + (f"\n... and {len(failures) - limit} more" if len(failures) > limit else "")


@pytest.fixture(scope="module")
def fuzz() -> Any:
    """tools/fuzz.py as a module (it needs 8 devices: conftest asks for them before jax starts)."""
    import jax

    if jax.device_count() < 8:
        pytest.skip("jax was initialised with fewer than 8 devices")
    import fuzz as tool

    return tool


def test_random_programs(fuzz: Any) -> None:
    summary = fuzz.run_programs(SEED, PROGRAMS, seconds=150.0, budget=10.0, hard_limit=60.0, log=lambda _: None)
    counts = summary.counts()
    print(fuzz.table("programs", counts))
    assert counts["programs"] >= 10, counts  # the time budget was not eaten by something else
    assert counts["generator_errors"] == 0, _show([r for r in summary.results if r.outcome == "generator_error"])
    for outcome in ("false_equivalent", "false_discrepancy", "exception", "timeout"):
        bad = [r for r in summary.results if r.outcome == outcome]
        assert not bad, f"{len(bad)} {outcome}:\n{_show(bad)}"
    # Every bug found names a line (issue 16); the share at the perturbed line itself is reported and held
    # to the floor measured (seed 7, 120 programs: 83 exact / 18 another line / 1 none before every
    # finding named a line).
    found = [r for r in summary.results if r.localised is not None]
    unnamed = [r for r in found if r.localised == "none"]
    assert not unnamed, f"{len(unnamed)} bugs found without a line:\n{_show(unnamed)}"
    exact = sum(r.localised == "exact" for r in found)
    print(f"fuzzer bugs localised at the perturbed line: {exact}/{len(found)}")
    assert exact >= EXACT_AT_LEAST * len(found), f"{exact}/{len(found)} at the perturbed line"


def test_mutants_of_partitioned_fixtures(fuzz: Any) -> None:
    summary = fuzz.run_mutants(SEED, MUTANTS, fixtures=MUTANT_FIXTURES, seconds=120.0, budget=10.0,
                               hard_limit=60.0, log=lambda _: None)
    counts = summary.counts()
    print(fuzz.table("mutants", counts))
    assert not summary.skipped_fixtures, summary.skipped_fixtures
    assert counts["confirmed_different"] >= MUTANTS * 2 // 3, counts
    for outcome in ("false_equivalent", "exception", "timeout"):
        bad = [r for r in summary.results if r.outcome == outcome]
        assert not bad, f"{len(bad)} {outcome}:\n{_show(bad)}"
