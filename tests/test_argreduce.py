"""argmax/argmin over a split dim (rules/argreduce.py): the combine of block results, and its negatives.

Each mutation of XLA's partitioned argmax (fixture `oc_argmax_split_dim_shardy`) that changes what the
program computes must not come out `equivalent`: the block results left uncombined, combined with another
comparator or init, or with a comparator that is not JAX's. A mutation that keeps the meaning (the blocks
gathered in another order) is no `discrepancy`.
"""

from __future__ import annotations

import re

import pytest
from conftest import FIXTURES
from scalify_hlo.parsers.hlo import parse_hlo

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import Module
from scalify_hlo.ops.reducers import arg_reducer_of
from scalify_hlo.prove.engine import prove

BASE = FIXTURES / "oc_argmax_split_dim_shardy"
COMBINE = "%reduce.18"


def _after() -> str:
    return (BASE / "after.hlo").read_text()


def _verdict(text: str) -> str:
    return prove(BASE / "before.mlir", parse_hlo(text, "mutant.hlo")).name


def _clone_body(text: str, edit: tuple[str, str]) -> str:
    """`text` with the combine reduce reading a copy of its body with `edit` applied."""
    m = re.search(r"^%region_0\.0 \(.*?^\}\n", text, re.S | re.M)
    assert m is not None
    body = m.group(0)
    assert edit[0] in body
    clone = body.replace("%region_0.0 (", "%region_0.1 (", 1).replace(*edit)
    text = text.replace(body, body + clone, 1)
    line = next(ln for ln in text.split("\n") if ln.lstrip().startswith(f"{COMBINE} ="))
    return text.replace(line, line.replace("to_apply=%region_0.0", "to_apply=%region_0.1"))


def test_base_is_equivalent() -> None:
    assert _verdict(_after()) == "equivalent"


def test_blocks_gathered_in_another_order_are_no_discrepancy() -> None:
    # Groups listed against the mesh order are not read as mesh axes (unknown); the program is correct.
    text = _after().replace("replica_groups=[2,4]<=[8]", "replica_groups={{3,2,1,0},{7,6,5,4}}")
    assert _verdict(text) != "discrepancy"


def test_uncombined_block_result_is_not_equivalent() -> None:
    text = _after().replace(f"get-tuple-element({COMBINE}), index=1", "get-tuple-element(%reduce.17), index=1")
    assert _verdict(text) != "equivalent"


def test_combine_by_argmin_is_a_discrepancy() -> None:
    text = _clone_body(_after(), ("direction=GT", "direction=LT"))
    assert _verdict(text) == "discrepancy"


def test_combine_with_a_total_order_comparator_is_not_equivalent() -> None:
    # TOTALORDER orders NaNs and -0 otherwise: not JAX's comparator (the same values on random inputs).
    text = _clone_body(_after(), ("direction=GT", "direction=GT, type=TOTALORDER"))
    assert _verdict(text) != "equivalent"


def test_combine_with_another_init_is_not_equivalent() -> None:
    text = _after()
    line = next(ln for ln in text.split("\n") if ln.lstrip().startswith(f"{COMBINE} ="))
    new = line.replace("%constant.5.clone)", "%constant.99)")
    text = text.replace(line, "  %constant.99 = s32[] constant(99)\n" + new)
    assert _verdict(text) != "equivalent"


@pytest.mark.parametrize("name, kind", [("oc_argmax_split_dim_shardy", "argmax"),
                                        ("oc_argmin_split_dim_shardy", "argmin"),
                                        ("oc_argmax_split_dim_shard_map", "argmax")])
def test_jax_comparators_are_recognised_in_both_dialects(name: str, kind: str) -> None:
    d = FIXTURES / name
    after = d / "after.hlo" if (d / "after.hlo").exists() else d / "after.mlir"
    for path in (d / "before.mlir", after):
        kinds = {arg_reducer_of(op.regions[0]) for op in _variadic_reduces(parsers.load(path))}
        assert kinds == {kind}, path


def _variadic_reduces(m: Module) -> list:  # type: ignore[type-arg]
    out = []
    stack = [f.body for f in m.funcs.values()]
    while stack:
        region = stack.pop()
        for op in region.ops:
            if op.opcode == "reduce" and len(op.results) == 2:
                out.append(op)
            stack.extend(op.regions)
    return out
