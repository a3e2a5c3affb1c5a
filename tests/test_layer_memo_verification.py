"""Layer memoization (`prove/layers.py`): alike layers derived once, with the verdicts of reading every op.

The programs are fixtures: five Llama blocks unrolled (`llama_unrolled_deep_shardy`, long enough for the
memo) and its twin whose layer 3 all-reduces over the wrong axis. Mutants of the deep program (the
mutation test's kinds) keep the property that matters most: never `equivalent` where the programs differ.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import pytest
from conftest import FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mutations import KINDS, mutate, sites

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import Module
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric import trials
from scalify_hlo.prove import layers
from scalify_hlo.prove.engine import Options, prove

DEEP = "llama_unrolled_deep_shardy"
BROKEN = "mut_llama_unrolled_deep_layer3_allreduce_wrong_axis"
pytestmark = pytest.mark.xdist_group("layer_memo")


@functools.cache
def pair(name: str) -> tuple[Module, Module]:
    d = FIXTURES / name
    return parsers.load(d / "before.mlir"), parsers.load(d / "after.hlo")


def test_alike_layers_are_found_in_both_programs() -> None:
    before, after = pair(DEEP)
    for module in (before, after):
        ops = module.main.body.ops
        found = layers.plan(ops, lambda op: True)
        assert found.runs, f"no run of alike segments in {len(ops)} ops"
        run = max(found.runs, key=lambda r: r.count * r.period)
        assert run.count >= 3 and run.count * run.period >= len(ops) // 2, found.runs


def test_one_broken_layer_splits_the_run() -> None:
    """The mutated all-reduce differs from its fellows (its replica groups): no run of the after program
    holds it, so it is derived op by op."""
    _, after = pair(BROKEN)
    ops = after.main.body.ops
    mutated = next(i for i, op in enumerate(ops) if op.loc.name == "all-reduce.6")
    for run in layers.plan(ops, lambda op: True).runs:
        assert not run.start <= mutated < run.start + run.count * run.period, run


def test_deep_stack_proven_with_layers_substituted() -> None:
    before, after = pair(DEEP)
    memo = prove(before, after)
    plain = prove(before, after, Options(layers=False))
    assert memo.name == plain.name == "equivalent", memo.render()
    used = memo.stats["layers"]
    assert used["templates"] == 2 and used["instances"] >= 6 and not used["retried"], used
    assert plain.stats["layers"]["instances"] == 0


def test_broken_layer_named_with_layers_substituted() -> None:
    before, after = pair(BROKEN)
    report = prove(before, after)
    assert report.name == "discrepancy", report.render()
    assert report.stats["layers"]["instances"] > 0  # the reference's layers were substituted
    first = report.findings[0]
    assert first.after is not None and first.after.instruction == "all-reduce.6", report.render()
    assert first.counterexample is not None


def test_a_template_is_not_taken_where_an_input_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment whose inputs are laid out otherwise than the template's is read op by op: seen here by
    changing the layout every segment's inputs are checked against (the template is then dropped at its
    own segment, which no longer reads as it does)."""
    before, after = pair(DEEP)
    original = layers.Segments._template

    def skewed(self: layers.Segments, *args: Any, **kwargs: Any) -> Any:
        t = original(self, *args, **kwargs)
        if t is not None:  # no real fact is laid out as nothing
            t.inputs = [dataclasses.replace(r, layout=Layout(())) if r.leaf is not None else r for r in t.inputs]
        return t

    monkeypatch.setattr(layers.Segments, "_template", skewed)
    report = prove(before, after)
    assert report.name == "equivalent", report.render()
    used = report.stats["layers"]
    assert used["instances"] == 0 and used["unfaithful"] == used["templates"] == 2, used


@st.composite
def mutants(draw: st.DrawFn) -> tuple[str, int, int]:
    kind = draw(st.sampled_from([k for k in KINDS if sites(pair(DEEP)[1], k)]))
    return kind, draw(st.integers(0, 10_000)), draw(st.integers(0, 2**16))


@settings(max_examples=5, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(mutants())
def test_mutants_of_the_deep_stack_never_false_equivalent(case: tuple[str, int, int]) -> None:
    kind, index, seed = case
    before, after = pair(DEEP)
    mutant = mutate(after, kind, index, np.random.default_rng(seed))
    assert mutant is not None
    report = prove(before, mutant.module)
    if report.name != "equivalent":
        return
    inputs = trials.random_inputs(before, seed)
    ref, out = numeric.run_pair(before, mutant.module, inputs)
    cmp = trials.compare(ref, out, rtol=2e-2, atol=2e-3)
    assert cmp.ok, f"FALSE EQUIVALENT: {mutant.describe()}: {cmp.reason}"
