"""Every fixture pair gets its expected verdict; every bug pair names its source line first."""

from __future__ import annotations

import pytest
from conftest import Fixture, fixtures

from scalify_hlo.engine import verify

FIXTURES = fixtures()


@pytest.mark.parametrize("fx", FIXTURES, ids=[f.name for f in FIXTURES])
def test_fixture_verdict(fx: Fixture) -> None:
    report = verify(fx.before, fx.after)
    assert report.name == fx.expected["verdict"], report.render()
    if fx.bug_site is not None:
        first = report.findings[0]
        assert first.after is not None, report.render()
        assert first.after.source == fx.bug_site, report.render()


@pytest.mark.parametrize("fx", [f for f in FIXTURES if f.expected["verdict"] == "equivalent"],
                         ids=lambda f: f.name)
def test_equivalent_reports_every_output(fx: Fixture) -> None:
    report = verify(fx.before, fx.after)
    data = report.to_json()
    assert data["verdict"] == "equivalent"
    assert len(data["outputs"]) >= 1 and not data["discrepancies"]
