"""`scalify-hlo audit`: bytes per device checked against hand computation, and the flags."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import FIXTURES, run_cli

from scalify_hlo import parsers
from scalify_hlo.audit import audit


def test_megatron_mlp_bytes_by_hand() -> None:
    # One all-reduce of f32[4,16] (256 bytes) over tp (n=4): a ring moves 2·(4-1)/4·256 = 384 bytes.
    a = audit(parsers.load(FIXTURES / "megatron_mlp_shardy" / "after.hlo"))
    assert [(c.kind, c.group_size, c.bytes) for c in a.collectives] == [("all_reduce", 4, 384)]
    assert a.total_bytes == 384


def test_llama_block_bytes_by_hand() -> None:
    # all-gathers over fsdp (n=2) receive the other shard: 64·4, 64·4, 128·4, 128·4, 256·4 ×3 bytes;
    # two all-reduces of f32[1,16,32] (2048 bytes) over tp (n=4): 2·3/4·2048 = 3072 each.
    a = audit(parsers.load(FIXTURES / "llama_block_shardy" / "after.hlo"))
    assert [c.bytes for c in a.collectives] == [256, 256, 512, 512, 3072, 1024, 1024, 1024, 3072]
    assert a.total_bytes == 10_752
    kinds = a.by_kind_and_axes()
    assert sum(v for k, v in kinds.items() if k.startswith("all_gather")) == 4608
    assert sum(v for k, v in kinds.items() if k.startswith("all_reduce")) == 6144
    assert not a.flags


def test_reduction_of_a_value_that_is_not_partial_is_flagged() -> None:
    a = audit(parsers.load(FIXTURES / "mut_replica_groups_swapped" / "after.hlo"))
    assert [f["kind"] for f in a.flags] == ["reduction of a non-partial value"]


HLO = """HloModule m, num_partitions=4

ENTRY %main.1_spmd (p: f32[4,8], q: f32[512,1024]) -> (f32[4,8], f32[512,1024]) {{
  %p = f32[4,8]{{1,0}} parameter(0), sharding={{devices=[4,1]<=[4]}}
  %q = f32[512,1024]{{1,0}} parameter(1), sharding={{replicated}}
  %ag = f32[16,8]{{1,0}} all-gather(%p), channel_id=1, replica_groups={{{{0,1,2,3}}}}, dimensions={{0}}, use_global_device_ids=true
  %s = f32[4,8]{{1,0}} slice(%ag), slice={{[4:8], [0:8]}}
  %one = f32[4,8]{{1,0}} all-gather(%s), channel_id=2, replica_groups={groups}, dimensions={{0}}, use_global_device_ids=true
  ROOT %t = (f32[4,8]{{1,0}}, f32[512,1024]{{1,0}}) tuple(%one, %q)
}}
"""


def test_ping_pong_size_one_groups_and_replicated_inputs_are_flagged() -> None:
    a = audit(parsers.loads(HLO.format(groups="{{0},{1},{2},{3}}"), "flags.hlo"))
    kinds = sorted(f["kind"] for f in a.flags)
    assert kinds == ["replicated", "resharding ping-pong", "size-1 group"]


def test_cli_audit_json(tmp_path: Path) -> None:
    out = tmp_path / "audit.json"
    proc = run_cli("audit", FIXTURES / "llama_block_shardy" / "after.hlo", "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert "10,752 bytes" in proc.stdout
    assert json.loads(out.read_text())["total_bytes_per_device"] == 10_752
