"""The shard_map corpus of issue 12 (tools/shard_map_corpus.py): a handful of its programs, in process.

Each program pairs a jnp reference with a shard_map body written after JAX's shard_map tutorial and
tests/shard_map_test.py; the tool runs both with JAX to know the truth, lowers both and verifies. Here: no
false equivalent, no false discrepancy, and the verdicts of a few chosen programs (a symbolic proof, a
proof by case split over a ring, a collective with axis_index_groups, a wrong twin caught at its `# BUG:`
line). The whole corpus (about two minutes) is marked slow: `python tools/shard_map_corpus.py` prints its
table.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))

# name -> expected outcome (see tools/shard_map_corpus.py: proven / caught / ...)
FEW = {
    "tut_matmul_basic": "proven",
    "tut_matmul_basic_BUG_axis": "caught",
    "tut_allgather_matmul_ring": "proven",
    "smt_all_to_all": "proven",
    "pat_megatron_mlp_BUG_no_psum": "caught",
    "pat_switch_on_axis_index": "proven",
    "pat_next_block_axis_index": "proven",
    "pat_next_block_axis_index_BUG_plus2": "caught",
    "pat_halo_stencil": "proven",
    "tut_ppermute_shift": "proven",
    "tut_psumscatter_matmul_ring": "proven",
    "pat_int_axis_offset": "proven",
    "pat_int_axis_offset_BUG_scale": "caught",
    "pat_reverse_by_ppermute": "proven",
    "pat_mirrored_block_axis_index": "proven",
    "pat_cond_first_device": "proven",
    "pat_fori_pmean": "proven",
    "smt_while_rotate_carry": "proven",
    "tut_psum_scatter_by_ppermute": "proven",  # sums of every 8th element, case split
    "smt_dynamic_slice_const": "proven",  # rows left unsettled in the body: the per-device split still runs
    "pat_greedy_tokens_vocab_split": "proven",  # argmax per row by pmax, pmin and axis_index
    "pat_greedy_tokens_vocab_split_BUG_pmax_axis": "caught",
    "pat_position_table_after_bos": "proven",  # offsets c + n · axis_index: blocks of a window
    "pat_position_table_after_bos_BUG_from_zero": "caught",
}


@pytest.fixture(scope="module")
def corpus() -> Any:
    import jax

    if jax.device_count() < 8:
        pytest.skip("jax was initialised with fewer than 8 devices")
    import shard_map_corpus as tool

    return tool


def _sound(rows: list[Any]) -> None:
    for r in rows:
        assert r.outcome not in ("false_equivalent", "false_discrepancy", "corpus_error", "exception"), \
            f"{r.name}: {r.outcome} (truth {r.truth}, verdict {r.verdict}): {r.reason}\n{r.error or ''}"


def test_few_programs(corpus: Any) -> None:
    rows = corpus.run(list(FEW), log=lambda _: None)
    _sound(rows)
    assert {r.name: r.outcome for r in rows} == FEW
    assert all(r.how.startswith("case split") for r in rows if r.name in ("tut_allgather_matmul_ring",
                                                                         "pat_switch_on_axis_index"))
    assert all(r.how == "symbolic" for r in rows if r.name in ("tut_matmul_basic", "pat_next_block_axis_index",
                                                                "pat_halo_stencil", "tut_ppermute_shift",
                                                                "pat_fori_pmean", "smt_while_rotate_carry"))
    table = corpus.table(rows)
    assert table.count("\n") == len(rows) + 1 and "| tut_matmul_basic | SAME | equivalent |" in table


def test_registry_is_well_formed(corpus: Any) -> None:
    """Every wrong twin has one `# BUG:` line; names are unique (the registry asserts it on import)."""
    for prog in corpus.REGISTRY.values():
        assert (corpus.bug_line(prog) is not None) == prog.bug, prog.name


@pytest.mark.slow
def test_whole_corpus(corpus: Any) -> None:
    rows = corpus.run(list(corpus.REGISTRY), log=lambda _: None)
    _sound(rows)
    summary = corpus.totals(rows)
    print(corpus.table(rows))
    assert summary["false_equivalent"] == 0 and summary["false_discrepancy"] == 0, summary
