"""Every fixture pair gets its expected verdict; every bug pair names its source line first.

Patterns the prover does not model yet are listed in LIMITS with the reason. Their correct programs must
come out `unknown`, never `equivalent` or `discrepancy`; their broken programs `unknown`, or `discrepancy`
backed by a numeric counterexample (the outputs really differ; the line named is then where the prover
stopped following the program, not necessarily the bug). The test fails as soon as one of them gets a
definite verdict otherwise (then the entry goes, and the fixture is checked like the others).
"""

from __future__ import annotations

import pytest
from conftest import Fixture, fixture_params, fixtures, proof_of

from scalify_hlo.ir.nodes import PARSER_NUMBERING

FIXTURES = fixtures()

LIMITS: dict[str, str] = {
    "conv_halo_ppermute_wrong_way_shard_map": "found (a counterexample), but named in the ppermute helper both "
                                              "halo rows go through (line 128), not at the call passing the wrong "
                                              "shift (142)",
    # correct programs that once got a false `discrepancy` (tools/programs/false_alarms.py)
    "fa_offset_table_clamped_mutated": "a dynamic-slice offset table entry past the end, clamped back by XLA",
    "fa_logsumexp_min_shift_shard_map": "logsumexp shifted by pmin (min, not max): the shift is not proven irrelevant",
    # corpus (issue 13): optax_adamw_masked_shardy/after.hlo with a gradient all-reduce moved to the tp groups
    "mut_optax_adamw_bias_grad_allreduce_wrong_axis": "discrepancy with a counterexample, named at the "
                                                      "value_and_grad line (75, the frame where the gradient meets "
                                                      "the optimizer's add), not the bias gradient's reduce (60)",
}


# Fixtures whose proof takes tens of seconds on this machine: checked by `make test-slow`.
SLOW: set[str] = set()


@pytest.mark.parametrize("fx", fixture_params(FIXTURES, SLOW))
def test_fixture_verdict(fx: Fixture) -> None:
    report = proof_of(fx)
    if fx.name in LIMITS:
        found_by_numbers = (report.name == "discrepancy" and fx.expected["verdict"] == "discrepancy"
                            and report.findings[0].counterexample is not None)
        assert report.name == "unknown" or found_by_numbers, \
            f"{fx.name} ({LIMITS[fx.name]}) now gets {report.name}:\n{report.render()}"
        return
    assert report.name == fx.expected["verdict"], report.render()
    # messages name values as the user can find them, never by the StableHLO parser's numbering
    assert not PARSER_NUMBERING.search(report.render()), report.render()
    if report.name == "discrepancy":  # evidence, never a layout the rules merely failed to recognise
        assert any(f.counterexample is not None for f in report.findings), report.render()
    if fx.bug_site is not None:
        first = report.findings[0]
        assert first.after is not None, report.render()
        assert first.after.source == fx.bug_site, report.render()


@pytest.mark.parametrize("fx", fixture_params([f for f in FIXTURES
                                              if f.expected["verdict"] == "equivalent" and f.name not in LIMITS]))
def test_equivalent_reports_every_output(fx: Fixture) -> None:
    report = proof_of(fx)
    data = report.to_json()
    assert data["verdict"] == "equivalent"
    assert len(data["outputs"]) >= 1 and not data["discrepancies"]
