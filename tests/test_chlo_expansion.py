"""chlo ops XLA has no opcode for are expanded in the reference as XLA expands them (parsers/chlo.py).

`oc_special_functions_shardy` computes erf_inv, lgamma and digamma (which XLA's HLO holds as their
polynomial expansions) beside erf and tan (HLO opcodes of their own). The reference meets the dump only
once its chlo ops are expanded the same way; a changed coefficient of an expansion in the dump is then a
different program, and must not be called equivalent.
"""

from __future__ import annotations

import re

import pytest
from conftest import FIXTURES
from scalify_hlo.parsers.chlo import expand_for_hlo
from scalify_hlo.parsers.hlo import parse_hlo
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir.nodes import walk
from scalify_hlo.numeric.oracle import numeric_check
from scalify_hlo.prove.engine import prove

SPECIAL = FIXTURES / "oc_special_functions_shardy"


def test_expanded_ops_become_calls_and_kept_ops_stay() -> None:
    before = parse_mlir((SPECIAL / "before.mlir").read_text(), "before.mlir")
    expanded = expand_for_hlo(before)
    opcodes = {op.opcode for op in walk(expanded.main.body.ops)}
    assert {"erf_inv", "lgamma", "digamma"}.isdisjoint(opcodes)
    assert {"erf", "tan", "call"} <= opcodes
    callees = {str(op.attrs["callee"]) for op in walk(expanded.main.body.ops) if op.opcode == "call"}
    assert len(callees) == 3 and all(c in expanded.funcs for c in callees)
    assert expand_for_hlo(expanded).funcs.keys() == expanded.funcs.keys()  # nothing left to expand


def test_reference_without_chlo_is_returned_as_is() -> None:
    before = parse_mlir((FIXTURES / "megatron_mlp_shardy" / "before.mlir").read_text(), "before.mlir")
    assert expand_for_hlo(before) is before


@pytest.mark.parametrize("coefficient", ["3.43273939e-07", "2.5"])
def test_a_changed_expansion_coefficient_is_not_equivalent(coefficient: str) -> None:
    text = (SPECIAL / "after.hlo").read_text()
    changed = re.sub(rf"constant\({re.escape(coefficient)}\)", "constant(1.25)", text, count=1)
    assert changed != text
    after = parse_hlo(changed, "changed.hlo")
    before = parse_mlir((SPECIAL / "before.mlir").read_text(), "before.mlir")
    truth = numeric_check(expand_for_hlo(before), after, seed=0)
    assert truth["ran"] and not truth["ok"], truth["summary"]
    assert prove(SPECIAL / "before.mlir", after).name != "equivalent"
