"""`discrepancy` is evidence: every one carries a counterexample, also where the programs are too big to run.

With running disabled (`numeric_limit=0`, what a 405B-sized program gets), a value left partial is still
shown wrong by a case built at the op; every other unproven layout becomes `unknown`, never a discrepancy
without a counterexample.
"""

from __future__ import annotations

import pytest
from conftest import fixtures

from scalify_hlo.prove.engine import Options, prove

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
