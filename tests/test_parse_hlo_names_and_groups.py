"""HLO text through XLA's parser and converter: instruction names kept, every replica-group spelling read
as the groups XLA means (explicit, iota, and mesh with or without device_ids and sub-axes)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import FIXTURES

from scalify_hlo import parsers
from scalify_hlo.ir.nodes import walk

HLO = """HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {{
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}}

ENTRY %main.1_spmd (p: f32[4,8]) -> f32[4,8] {{
  %p = f32[4,8]{{1,0}} parameter(0)
  ROOT %ar = f32[4,8]{{1,0}} all-reduce(%p), channel_id=1, replica_groups={groups}, use_global_device_ids=true, to_apply=%add
}}
"""

CASES = [
    ("{{0,1,2,3},{4,5,6,7}}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("[2,4]<=[8]", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("[2,4]<=[4,2]T(1,0)", [[0, 2, 4, 6], [1, 3, 5, 7]]),
    ("mesh['a'=2,'b'=4] {'a'}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("mesh['a'=4,'b'=2] {'a':(1)2}", [[0, 4], [1, 5], [2, 6], [3, 7]]),
    ("mesh['a'=4,'b'=2] {'a':(2)2, 'b'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    # The converter drops device_ids; without the repair these read as {0,2,4,6},{1,3,5,7}.
    ("mesh['axis_0'=1,'axis_1'=4,'axis_2'=2], device_ids=([2,4]T(1,0)) {'axis_1'}", [[0, 1, 2, 3], [4, 5, 6, 7]]),
    ("mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'b'}", [[7, 6, 5, 4], [3, 2, 1, 0]]),
]


@pytest.mark.parametrize(("spelling", "groups"), CASES, ids=[c[0] for c in CASES])
def test_replica_group_spellings(spelling: str, groups: list[list[int]]) -> None:
    module = parsers.loads(HLO.format(groups=spelling), "t.hlo")
    (op,) = [o for o in walk(module.main.body.ops) if o.opcode == "all_reduce"]
    assert op.attrs["replica_groups"].array.tolist() == groups
    assert op.loc.name == "ar"


def test_instruction_names_and_dump_lines() -> None:
    path = FIXTURES / "megatron_mlp_shardy" / "after.hlo"
    text = path.read_text().splitlines()
    module = parsers.load(path)
    ops = list(walk(module.main.body.ops))
    assert any(op.opcode == "all_reduce" and op.loc.name == "all-reduce" for op in ops)
    for op in ops:
        if op.loc.ir_line is not None:
            assert f"%{op.loc.name} = " in text[op.loc.ir_line - 1]


def test_async_collectives_are_inlined() -> None:
    from scalify_hlo.ir.inline import inline

    hlo = HLO.replace("ROOT %ar = f32[4,8]{{1,0}} all-reduce(%p)", "%ars = f32[4,8]{{1,0}} all-reduce-start(%p)")
    hlo = hlo.replace("to_apply=%add\n}}", "to_apply=%add\n  ROOT %ard = f32[4,8]{{1,0}} all-reduce-done(%ars)\n}}")
    module = parsers.loads(hlo.format(groups="{{0,1,2,3},{4,5,6,7}}"), "async.hlo")
    f = inline(module)
    assert [op.opcode for op in f.body.ops] == ["all_reduce"]
    assert f.outputs == f.body.ops[0].results


@pytest.mark.parametrize("name", sorted(d.name for d in FIXTURES.iterdir() if d.is_dir()))
def test_every_fixture_parses(name: str) -> None:
    d = FIXTURES / name
    for f in ("before.mlir", "after.hlo", "after.mlir"):
        if (d / f).exists():
            m = parsers.load(d / f)
            assert m.main.params and m.main.outputs
            assert np.all([op.opcode for op in walk(m.main.body.ops)])
