"""`scalify-hlo audit`: bytes per device checked against hand computation, and the flags."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def test_scanned_layers_count_the_loop_body_times_its_trip_count() -> None:
    # llama_scan_shardy: the 2 blocks of llama_block_shardy under lax.scan (a while of 2 trips): the body's
    # 9 collectives (10,752 bytes, as in the unrolled block above) run twice per step.
    d = FIXTURES / "llama_scan_shardy"
    a = audit(parsers.load(d / "after.hlo"))
    assert [c.executions for c in a.collectives] == [2] * 9
    assert [c.bytes for c in a.collectives] == [256, 256, 512, 512, 3072, 1024, 1024, 1024, 3072]
    assert a.total_bytes == 2 * 10_752
    assert a.layers == 2 and a.bytes_per_layer() == [10_752, 10_752]
    assert [(loop["trips"], loop["collectives"]) for loop in a.loops] == [(2, 9)]


def test_mesh_axes_by_the_users_names() -> None:
    d = FIXTURES / "llama_scan_shardy"
    unnamed = audit(parsers.load(d / "after.hlo"))  # partitioned HLO keeps axis positions only
    assert unnamed.axis_names == "positions" and "--reference" in unnamed.render()
    named = audit(parsers.load(d / "after.hlo"), parsers.load(d / "before.mlir"))
    assert named.axis_names == "reference" and named.mesh == '["fsdp"=2, "tp"=4]'
    assert set(named.by_kind_and_axes()) == {'all_gather over {"fsdp"}', 'all_reduce over {"tp"}'}
    assert "axis_" not in named.render()
    # a shard_map module carries its sdy.mesh: its own names
    own = audit(parsers.load(FIXTURES / "megatron_mlp_shard_map" / "after.mlir"))
    assert own.axis_names == "module" and {c.axes for c in own.collectives} == {("tp",)}


def test_byte_model_is_stated() -> None:
    a = audit(parsers.load(FIXTURES / "llama_block_shardy" / "after.hlo"))
    text = a.render()
    assert "byte model (ring" in text and "2·(n-1)/n·S" in text and "(n-1)/n·S_out" in text
    assert set(a.to_json()["byte_model"]["kinds"]) == {"all_reduce", "all_gather"}


COUNTDOWN = """HloModule m, num_partitions=4

%sum (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %add = f32[] add(%a, %b)
}

%cond (c: (s32[], f32[8])) -> pred[] {
  %c = (s32[], f32[8]) parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %zero = s32[] constant(0)
  ROOT %gt = pred[] compare(%i, %zero), direction=GT
}

%body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]) parameter(0)
  %j = s32[] get-tuple-element(%t), index=0
  %x = f32[8] get-tuple-element(%t), index=1
  %ar = f32[8] all-reduce(%x), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=%sum
  %two = s32[] constant(2)
  %next = s32[] subtract(%j, %two)
  ROOT %out = (s32[], f32[8]) tuple(%next, %ar)
}

ENTRY %main.1_spmd (p: f32[8]) -> f32[8] {
  %p = f32[8] parameter(0), sharding={replicated}
  %seven = s32[] constant(7)
  %init = (s32[], f32[8]) tuple(%seven, %p)
  %w = (s32[], f32[8]) while(%init), condition=%cond, body=%body
  ROOT %r = f32[8] get-tuple-element(%w), index=1
}
"""


def test_static_trip_counts_counting_down_and_loop_collectives_by_dependence() -> None:
    # a counter from 7 while > 0, minus 2: 4 trips; the all-reduce of f32[8] (32 bytes, n=4) moves 48 each.
    a = audit(parsers.loads(COUNTDOWN, "countdown.hlo"))
    assert [(c.bytes, c.executions) for c in a.collectives] == [(48, 4)] and a.total_bytes == 192
    # two ppermutes of one call in a ring loop (4 trips) do not read each other: no "repeated collectives"
    ring = audit(parsers.load(FIXTURES / "ring_attention_shard_map_fori" / "after.mlir"))
    assert [c.executions for c in ring.collectives] == [4, 4] and ring.layers_from != "repeated collectives"


def test_cli_audit_reference_names_axes() -> None:
    d = FIXTURES / "llama_scan_shardy"
    proc = run_cli("audit", d / "after.hlo", "--reference", d / "before.mlir", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["mesh"] == '["fsdp"=2, "tp"=4]' and data["total_bytes_per_device"] == 21_504
    assert all(c["bytes_per_step"] == 2 * c["bytes"] for c in data["collectives"])


def test_collective_permutes_are_listed_with_their_axes() -> None:
    # ring attention: each ppermute shifts the key/value blocks one step along "sp" (4 devices)
    a = audit(parsers.load(FIXTURES / "ring_attention_shard_map" / "after.mlir"))
    permutes = [c for c in a.collectives if c.kind == "collective_permute"]
    assert permutes and {(c.axes, c.group_size) for c in permutes} == {(("sp",), 4)}
    assert all(c.source and "ring_attention.py" in c.source for c in permutes)
    assert 'collective_permute over {"sp"}' in a.by_kind_and_axes()


def _mesh() -> Any:
    import jax
    import numpy as np
    from jax.sharding import Mesh

    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))


def test_state_not_split_like_its_parameter_is_flagged_and_output_shardings_shown() -> None:
    # A momentum step whose state `mu` is left replicated while the weight it updates is FSDP-sharded.
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from scalify_hlo.jax import partitioned

    mesh = _mesh()

    def step(w: Any, mu: Any, x: Any) -> Any:
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(w)
        mu = 0.9 * mu + g
        return w - 0.1 * mu, mu

    def s(*spec: Any) -> NamedSharding:
        return NamedSharding(mesh, P(*spec))

    w, x = jnp.ones((64, 64)), jnp.ones((16, 64))
    before, after = partitioned(step, w, w, x, in_shardings=(s("fsdp"), s(), s("fsdp")),
                                out_shardings=(s("fsdp"), s()))
    a = audit(parsers.loads(after, "step.hlo"), parsers.loads(before, "step.mlir"))
    flags = [f for f in a.flags if f["kind"] == "not split like its peers"]
    assert len(flags) == 1 and "input 1 (mu" in flags[0]["message"] and "input 0 (w)" in flags[0]["message"]
    assert [o["sharding"].split(" (")[0] for o in a.outputs] == ['[{"fsdp"}, {}]', "[{}, {}]"]
    assert "outputs (sharding on the mesh" in a.render()
    # sharded like the weight, nothing to flag
    before, after = partitioned(step, w, w, x, in_shardings=(s("fsdp"), s("fsdp"), s("fsdp")),
                                out_shardings=(s("fsdp"), s("fsdp")))
    a = audit(parsers.loads(after, "step.hlo"), parsers.loads(before, "step.mlir"))
    assert not [f for f in a.flags if f["kind"] == "not split like its peers"]


def test_the_same_weight_gathered_twice_is_flagged() -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    def body(w: Any, x: Any) -> Any:
        h = jnp.tanh(x @ jax.lax.all_gather(w, "fsdp", tiled=True))
        return jnp.tanh(h @ jax.lax.all_gather(w, "fsdp", tiled=True))  # the same gather again

    def body_once(w: Any, x: Any) -> Any:
        full = jax.lax.all_gather(w, "fsdp", tiled=True)
        return jnp.tanh(jnp.tanh(x @ full) @ full)

    verdicts = []
    for fn in (body, body_once):
        mapped = jax.jit(jax.shard_map(fn, mesh=_mesh(), in_specs=(P("fsdp"), P()), out_specs=P(), check_vma=False))
        text = mapped.lower(jnp.ones((64, 64)), jnp.ones((16, 64))).as_text(debug_info=True)
        verdicts.append([f["message"] for f in audit(parsers.loads(text, "f.mlir")).flags if f["kind"] == "gathered twice"])
    assert len(verdicts[0]) == 1 and "test_audit.py" in verdicts[0][0]
    assert verdicts[1] == []


def test_plot_is_a_png_of_bytes_per_layer_by_axes(tmp_path: Path) -> None:
    from matplotlib import image

    from scalify_hlo.audit import plot

    d = FIXTURES / "llama_scan_shardy"
    a = audit(parsers.load(d / "after.hlo"), parsers.load(d / "before.mlir"))
    assert a.bytes_per_layer_by_axes() == {'all_gather over {"fsdp"}': [4608, 4608],
                                           'all_reduce over {"tp"}': [6144, 6144]}
    path = tmp_path / "layers.png"
    plot(a, str(path))
    pixels = image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert len({tuple(p) for p in pixels.reshape(-1, pixels.shape[2])[::97]}) > 3  # bars, not a blank canvas
