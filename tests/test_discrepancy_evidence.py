"""`discrepancy` is evidence: every one carries a counterexample, also where the programs are too big to run.

With running disabled (`numeric_limit=0`, what a 405B-sized program gets), a value left partial is still
shown wrong by a case built at the op; every other unproven layout becomes `unknown`, never a discrepancy
without a counterexample.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import REPO, fixtures

from scalify_hlo import parsers
from scalify_hlo.layout.program import Program, prepare
from scalify_hlo.prove.engine import Options, prove
from scalify_hlo.prove.evidence import computes_in_low_precision, runnable

BUGS = {f.name: f for f in fixtures() if f.expected["verdict"] == "discrepancy"}
# Bugs that leave a value partial where a whole one is needed: found without running anything.
PARTIAL = ["megatron_mlp_shard_map_missing_psum", "megatron_mlp_shard_map_psum_wrong_axis", "mut_allreduce_reducer",
           "rmsnorm_shard_map_local_stats", "train_sgd_shard_map_no_grad_psum", "xent_vocab_shard_map_local_max"]
# Bugs shown by running (or evaluating) the programs: without that, `unknown`.
BY_RUNNING = ["embed_vocab_shard_map_wrong_offset", "ulysses_attention_shard_map_wrong_axis",
              "int_div_reassociated_shard_map", "mut_subtract_swapped"]


@pytest.mark.parametrize("name", PARTIAL + BY_RUNNING)
def test_too_big_to_run(name: str) -> None:
    fx = BUGS[name]
    report = prove(fx.before, fx.after, Options(assume=fx.assume, numeric_limit=0))
    if name in BY_RUNNING:
        assert report.name == "unknown", report.render()
        return
    assert report.name == "discrepancy", report.render()
    assert report.findings[0].counterexample is not None and "built at the op" in report.render()
    if fx.bug_site is not None:
        assert report.findings[0].after is not None
        assert report.findings[0].after.source == fx.bug_site, report.render()


# -- what is run for evidence: programs whose run is bounded, in float32 or wider ------------------------

def _lowered(f: object, *args: object) -> Program:
    import jax

    return prepare(parsers.loads(jax.jit(f).lower(*args).as_text(), "f.mlir"))  # type: ignore[arg-type]


def test_loops_count_once_per_trip() -> None:
    """A nest of `fori_loop`s runs 2 ** depth bodies: too long to run at depth 30, fine at depth 2. A loop
    whose trip count was not read (its condition not yet seen) counted once, and the proof hung running
    the depth-30 nest."""
    sys.path.insert(0, str(REPO / "tools"))
    from programs import nested_loops

    for depth, runs in ((2, True), (30, False)):
        before, after = nested_loops.lower(depth, "trips")
        bp, ap = prepare(parsers.loads(before, "b.mlir")), prepare(parsers.loads(after, "a.mlir"))
        assert runnable(bp, ap, 1 << 24) is runs, depth


def test_low_precision_programs_are_not_run_for_evidence() -> None:
    """bf16 sums in another order drift past the float32 tolerance: no counterexample from them."""
    import jax.numpy as jnp

    def f(x: Any) -> Any:
        return x.sum(0) * 2

    assert computes_in_low_precision(_lowered(f, jnp.ones((8, 4), jnp.bfloat16)))
    assert not computes_in_low_precision(_lowered(f, jnp.ones((8, 4), jnp.float32)))


# -- a float32 difference is evidence only if it survives float64 -----------------------------------------

def _amplified(inner: Any) -> Any:
    import jax.numpy as jnp

    # sin of a large multiple: float32's relative rounding (6e-8) of `inner` becomes ~1e-2 here
    return lambda x: jnp.sin(1e5 * inner(x))


def test_rounding_amplified_is_not_a_counterexample() -> None:
    """tanh(x) = 2·sigmoid(2x) - 1 in the reals, which the rules do not know. Amplified, the two roundings
    differ by 1e-2 in float32 (a deep network on random inputs does the same to a reassociated sum) but
    agree in float64: `unknown`, saying so, never a discrepancy. The same program with a wrong constant
    still differs in float64: a discrepancy."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((64,), jnp.float32)
    before = _lowered(_amplified(jnp.tanh), x).module
    same = _lowered(_amplified(lambda x: 2 * jax.nn.sigmoid(2 * x) - 1), x).module
    wrong = _lowered(_amplified(lambda x: 1.0001 * jnp.tanh(x)), x).module
    report = prove(before, same)
    assert report.name == "unknown", report.render()
    assert "agrees computed in float64" in report.render()
    report = prove(before, wrong)
    assert report.name == "discrepancy", report.render()
