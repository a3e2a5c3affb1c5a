"""The numeric oracle agrees with XLA on every correct fixture's pair and disagrees on every bug pair."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import SLOW_RUNS, Fixture, fixtures, slow_if

from scalify_hlo import parsers
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric import trials

FIXTURES = fixtures()


def _inputs(fx: Fixture) -> tuple[list[np.ndarray], np.lib.npyio.NpzFile]:
    data = np.load(fx.dir / "oracle.npz")
    n = len([k for k in data.files if k.startswith("in_")])
    return [data[f"in_{i}"] for i in range(n)], data


@pytest.mark.parametrize("fx", [pytest.param(f, id=f.name, marks=slow_if(f.name, SLOW_RUNS)) for f in FIXTURES])
def test_oracle_agrees_exactly_when_correct(fx: Fixture) -> None:
    inputs, data = _inputs(fx)
    before, after = parsers.load(fx.before), parsers.load(fx.after)
    ref, out = numeric.run_pair(before, after, inputs)
    xla_ref = data["before_out_0"].reshape(ref[0].shape)
    # (with excess precision XLA drops roundings to bf16 the interpreter keeps: agreement to a bf16 ulp)
    rtol = 2.0**-7 if fx.excess_precision else 1e-3
    assert trials.compare([xla_ref], ref[:1], rtol=rtol, atol=1e-4).ok, "the reference disagrees with XLA"
    same = trials.compare(ref, out, rtol=rtol, atol=1e-4).ok
    assert same == (fx.expected["verdict"] == "equivalent")
