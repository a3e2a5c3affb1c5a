"""Nested `fori_loop`s are proven by induction one level at a time, in time linear in the depth.

Each after loop is proven against the reference loop it starts like; the reference loops inside a body
are read once (their terms bind their own variables), so a nest of depth d costs d body readings: the
term table grows by the same number of terms per level. A nest whose body or trip count differs is never
`equivalent`: the after loop is then a term of its own body, and evaluating both sides on random inputs
gives the counterexample. Programs: tools/programs/nested_loops.py (also the committed fixtures
`nested_fori_shard_map*`, depth 12). Time is measured by the benchmarks, not asserted here.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import REPO
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from mutations import every_mutant_checked

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import Module
from scalify_hlo.prove.engine import prove
from scalify_hlo.report.verdicts import Report

sys.path.insert(0, str(REPO / "tools"))
from programs import nested_loops

PROGRAM = Path(nested_loops.__file__).resolve()


def _bug_line(marker: str) -> int:
    lines = PROGRAM.read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if "# BUG:" in line and marker in line)


@functools.cache
def _pair(depth: int, variant: str = "correct") -> tuple[Module, Module]:
    before, after = nested_loops.lower(depth, variant)
    return parsers.loads(before, f"before_{depth}.mlir"), parsers.loads(after, f"after_{depth}_{variant}.mlir")


def _verify(depth: int, variant: str = "correct") -> Report:
    return prove(*_pair(depth, variant))


def test_depth_30_nest_is_equivalent() -> None:
    report = _verify(30)
    assert report.name == "equivalent", report.render()


def test_each_level_costs_the_same() -> None:
    """Linear in the depth: every further level of the nest adds the same number of terms."""
    terms = {d: _verify(d).stats["terms"] for d in (10, 20, 30)}
    assert terms[30] - terms[20] == terms[20] - terms[10], terms


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_innermost_constant_changed_is_found_at_its_line(depth: int) -> None:
    report = _verify(depth, "constant")
    assert report.name == "discrepancy", report.render()
    first = report.findings[0]
    assert first.counterexample is not None, report.render()
    source = first.after.source if first.after is not None else None
    assert source is not None and source.endswith(f"tools/programs/nested_loops.py:{_bug_line('adds 2.0')}"), \
        report.render()


@pytest.mark.parametrize("depth", [1, 2, 8])
def test_innermost_trip_count_changed_is_a_discrepancy(depth: int) -> None:
    report = _verify(depth, "trips")
    assert report.name == "discrepancy", report.render()
    assert report.findings[0].counterexample is not None, report.render()


def test_depth_30_nest_with_another_trip_count_is_not_equivalent() -> None:
    """Too long to evaluate (2 ** 30 steps): no counterexample, so `unknown`, but never `equivalent`."""
    assert _verify(30, "trips").name != "equivalent"


def test_depth_30_nest_matching_no_reference_loop_is_not_equivalent() -> None:
    """The outermost counter starts elsewhere: no induction applies, and the case split that then runs
    the loops iteration by iteration stops within its budget for the whole nest (not 2 ** 30 steps)."""
    assert _verify(30, "late_start").name != "equivalent"
    report = _verify(2, "late_start")
    assert report.name == "discrepancy" and report.findings[0].counterexample is not None, report.render()


# -- two loops from the same initial values: each after loop is proven against the one it computes ------

def _halve(_: jax.Array, y: jax.Array) -> jax.Array:
    return y * 0.5


def _shift(_: jax.Array, y: jax.Array) -> jax.Array:
    return y + 1.0


def _siblings(x: jax.Array, swapped: bool = False) -> jax.Array:
    a = jax.lax.fori_loop(0, 3, _halve, x)
    b = jax.lax.fori_loop(0, 3, _shift, x)
    return b - a if swapped else a - b


def _sibling_pair(swapped: bool) -> tuple[Module, Module]:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    impl = jax.shard_map(functools.partial(_siblings, swapped=swapped), mesh=mesh, in_specs=(P("dp", "tp"),),
                         out_specs=P("dp", "tp"))
    before = jax.jit(_siblings).lower(x).as_text(debug_info=True)
    after = jax.jit(impl).lower(jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(
        mesh, P("dp", "tp")))).as_text(debug_info=True)
    return parsers.loads(before, "siblings_before.mlir"), parsers.loads(after, f"siblings_after_{swapped}.mlir")


def test_sibling_loops_from_the_same_values_are_told_apart() -> None:
    assert prove(*_sibling_pair(False)).name == "equivalent"
    report = prove(*_sibling_pair(True))
    assert report.name == "discrepancy", report.render()


def test_nest_mutants_are_never_false_equivalent() -> None:
    """Every constant of the nest (trip counts, counter steps, the update's scale and shift) perturbed in
    turn: whatever comes out `equivalent` must agree with the numeric oracle."""
    seen = every_mutant_checked(*_pair(3), lambda b, a: prove(b, a).name, seeds=(0,))
    assert seen.get("discrepancy", 0) >= 5 and "equivalent" not in seen, seen
