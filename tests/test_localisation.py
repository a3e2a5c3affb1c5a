"""Localisation of every bug fixture: a discrepancy names a site, and a mutated partitioner output names the
instruction that was changed first.

Each bug fixture (expected.json verdict `discrepancy`) records the line that is wrong (`bug`; that the first
finding names it is `test_verify_fixtures.py`'s check) and, for a mutated partitioner output, the
instruction that was changed. A report names its first finding's after-side site first: that is what a user
reads. The proofs are the ones `test_verify_fixtures.py` made (one per fixture and process: `proof_of`).
Where the changed instruction is not named first, NOT_FIRST lists the fixture; such an entry fails as soon as it is
named first (then the entry goes).
"""

from __future__ import annotations

import pytest
from conftest import Fixture, fixture_params, fixtures, proof_of

from scalify_hlo.report.verdicts import Report, Site

BUGS = [f for f in fixtures() if f.expected["verdict"] == "discrepancy"]
MUTATED = [f for f in BUGS if f.expected["bug"].get("instruction")]

# The line is exact; the first site is an op beside the changed instruction.
NOT_FIRST = frozenset({
    "mut_gqa_kv_head_offsets_swapped",  # a constant table: named is the dynamic-slice that reads it, at its line
    "oc_argmax_split_dim_local_index_mutated",
    "sort_split_dim_descending_mutated",
    "top_k_split_dim_rows_swapped_mutated",
    "mut_uneven_vocab_mask_inverted",  # a mask computed from no input: named is the sum that reads it, at its line
})


def _sites(report: Report) -> list[Site]:
    return [s for f in report.findings for s in (f.after, *f.also, f.before) if s is not None]


@pytest.mark.parametrize("fx", fixture_params(BUGS))
def test_a_discrepancy_names_a_site(fx: Fixture) -> None:
    report = proof_of(fx)
    if report.name != "discrepancy":
        return  # (the verdict is test_verify_fixtures.py's to check)
    assert any(s.source or s.instruction for s in _sites(report)), report.render()


@pytest.mark.parametrize("fx", fixture_params(MUTATED))
def test_the_changed_instruction_is_named_first(fx: Fixture) -> None:
    report = proof_of(fx)
    changed = fx.expected["bug"]["instruction"].lstrip("%")
    first = report.findings[0].after if report.findings else None
    named_first = first is not None and first.instruction == changed
    if fx.name in NOT_FIRST:
        assert not named_first, f"{fx.name} now names the changed instruction first: drop it from NOT_FIRST"
        return
    assert named_first, f"changed instruction %{changed} not named first:\n{report.render()}"
