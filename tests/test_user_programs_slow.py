"""Programs a JAX engineer would write, none shaped after a fixture (`tools/programs/user_programs.py`), keep
their verdicts: correct ones `equivalent`, bug twins `discrepancy`. Marked slow: each is compiled by XLA."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
from programs.user_programs import EXPECTED, PROGRAMS

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_user_program_keeps_its_verdict(name: str) -> None:
    report = PROGRAMS[name]()
    assert report.name == EXPECTED[name], report.render()
