"""Parsing GSPMD and Shardy shardings into the mesh model, and printing meshes and layouts.

The strings are what XLA/JAX 0.10.2 emit: copied from `compiled.as_text()` and spmd-partitioning dumps of
small jitted programs on 8 fake CPU devices, and produced live in a subprocess by one test below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.layout.inference import infer_mesh
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer
from scalify_hlo.layout.sharding import (
    DeviceArray,
    Manual,
    Maximal,
    Replicated,
    SdySharding,
    Tiled,
    TupleSharding,
    UnknownSharding,
    layout_of,
    mesh_from_sdy,
    parse_gspmd,
    parse_sdy,
)

# Every tiled sharding seen in compiled.as_text() / spmd-partitioning dumps of the fixture programs.
REAL_TILED = [
    "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
    "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[1,2,4]<=[8] last_tile_dim_replicate}",
    "{devices=[1,2,2,2]<=[2,2,2]T(1,0,2) last_tile_dim_replicate}",
    "{devices=[2,1,2,2]<=[4,2]T(1,0) last_tile_dim_replicate}",
    "{devices=[2,1,4]<=[8] last_tile_dims={manual}}",
    "{devices=[2,2,2]<=[2,2,2]T(2,1,0)}",
    "{devices=[2,4,1]<=[4,2]T(1,0)}",
    "{devices=[2,4]<=[8]}",
    "{devices=[4,2]<=[2,4]T(1,0)}",
    "{devices=[8,1]<=[2,4]T(1,0)}",
    "{devices=[2,2]0,2,1,3}",
    "{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}",
    "{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}",
]

DP_TP = Mesh((("dp", 2), ("tp", 4)))


@pytest.mark.parametrize("text", REAL_TILED)
def test_tiled_device_order_matches_xla_tile_assignment_devices(text: str) -> None:
    sharding = parse_gspmd(text)
    assert isinstance(sharding, Tiled)
    xla = _jaxlib.hlo_sharding_class().from_string(text)  # a valid non-tuple tile: these accessors are safe
    assert sharding.devices.array.ravel().tolist() == list(xla.tile_assignment_devices())
    assert list(sharding.devices.shape) == list(xla.tile_assignment_dimensions())


@pytest.mark.parametrize(("text", "kinds"), [
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", ("replicated",)),
    ("{devices=[2,1,4]<=[8] last_tile_dims={replicated}}", ("replicated",)),
    ("{devices=[2,1,2,2]<=[8] last_tile_dims={manual, replicated}}", ("manual", "replicated")),
    ("{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}", ("unreduced",)),
    ("{devices=[2,4]<=[8]}", ()),
])
def test_subgroup_kinds_follow_last_tile_dims(text: str, kinds: tuple[str, ...]) -> None:
    sharding = parse_gspmd(text)
    assert isinstance(sharding, Tiled) and sharding.subgroups == kinds


def test_non_tiled_kinds() -> None:
    assert parse_gspmd("{replicated}") == Replicated()  # is_maximal() is also true for it in XLA
    assert parse_gspmd("{maximal device=3}") == Maximal(3)
    assert parse_gspmd("{manual}") == Manual()
    assert parse_gspmd("{unknown}") == UnknownSharding()
    assert parse_gspmd("{maximal device=3 metadata={op_name=\"x\"}}") == Maximal(3)


def test_tuple_shardings_parse_elementwise() -> None:
    t = parse_gspmd("{{replicated}, {devices=[2,1]0,1}}")
    assert t == TupleSharding((Replicated(), Tiled(DeviceArray(np.array([[0], [1]])))))
    real = parse_gspmd("{{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}, "
                       "{devices=[1,2,4]<=[8] last_tile_dim_replicate}}")
    assert isinstance(real, TupleSharding) and len(real.elements) == 2
    assert parse_gspmd("{{maximal device=0}}") == TupleSharding((Maximal(0),))


def test_parse_is_cached_and_values_are_hashable() -> None:
    a = parse_gspmd("{devices=[2,4]<=[8]}")
    b = parse_gspmd("{devices=[2,4]<=[8]}")
    assert a == b and hash(a) == hash(b)
    assert {a: 1}[Tiled(DeviceArray(np.arange(8).reshape(2, 4)))] == 1


def test_device_array_is_read_only() -> None:
    arr = parse_gspmd("{devices=[2,4]<=[8]}").devices.array  # type: ignore[union-attr]
    with pytest.raises(ValueError):
        arr[0, 0] = 5


GARBAGE = [
    "", "{garbage", "replicated", "{replicated} trailing", "{devices=[0]}",
    "{devices=[2,2]<=[3]}",          # XLA parses it, then CHECK-fails in tile_assignment_devices()
    "{devices=[99999999999]<=[4]}",  # likewise
    "{devices=[2,2]<=[-4]}",         # XLA raises MemoryError
    "{devices=[2,2]<=[2,2]T(0,0)}",  # XLA accepts a non-permutation
    "{devices=[2,2]0,0,1,1}", "{devices=[2,2]-1,0,1,2}", "{devices=[2,2]0,1}",
    "{devices=[-2,-2]<=[4]}", "{maximal device=-1}",
    "{devices=[2,2]<=[4] last_tile_dims={bogus}}",
    "{unreduced}",                   # no device count in the text: reported, not guessed
    "{devices=[2,2]<=[4]} {devices=[2]0,0}",  # the second one XLA aborts on
]


def test_garbage_raises_sharding_error_never_aborts() -> None:
    # In a child process: a jaxlib that aborts on one of them ends that process, not this test's worker.
    script = textwrap.dedent("""
        import json, sys
        from scalify_hlo.ir.errors import ShardingError
        from scalify_hlo.layout.sharding import parse_gspmd
        for text in json.loads(sys.argv[1]):
            print(json.dumps(text), end=" ", flush=True)
            try:
                parse_gspmd(text)
                print("parsed", flush=True)
            except ShardingError as e:
                print("expected" in e.message, flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(GARBAGE)], capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, f"aborted on {lines[-1] if lines else GARBAGE[0]}: {proc.stderr[-2000:]}"
    assert lines == [f"{json.dumps(t)} True" for t in GARBAGE]


def test_error_carries_span() -> None:
    from scalify_hlo.ir.errors import Span
    span = Span("after.hlo", 12, 40, "%p = f32[8] parameter(0), sharding={garbage")
    with pytest.raises(ShardingError) as info:
        parse_gspmd("{garbage", span)
    assert info.value.span == span
    assert "after.hlo:12:40" in info.value.render()


# ---------------------------------------------------------------------------------------------- Shardy

def test_parse_sdy_from_text() -> None:
    assert parse_sdy('#sdy.sharding<@mesh, [{"dp"}, {}]>') == \
        SdySharding("mesh", (("dp",), ()), open_dims=(False, False))
    s = parse_sdy('#sdy.sharding<@mesh, [{"x", "y"}, {?}], replicated={"z"}>')
    assert s.dims == (("x", "y"), ()) and s.replicated == ("z",) and s.open_dims == (False, True)
    assert parse_sdy('#sdy.sharding<@mesh, [{"tp":(1)2}, {"tp":(2)2}]>').dims == (("tp:(1)2",), ("tp:(2)2",))
    assert parse_sdy('#sdy.sharding<@mesh, [{}], unreduced={"tp"}>').unreduced == ("tp",)
    # the bare spelling used in `in_shardings=[<@mesh, ...>]` of sdy.manual_computation
    assert parse_sdy('<@mesh, [{?}, {"tp", ?}]>').dims == ((), ("tp",))
    assert parse_sdy('#sdy.sharding<mesh<["a"=2]>, [{"a"}]>').mesh == '#sdy.mesh<["a"=2]>'


def test_parse_sdy_from_attribute() -> None:
    ir = _jaxlib.ir()
    with _jaxlib.make_context():
        attr = ir.Attribute.parse('#sdy.sharding<@mesh, [{"c"}, {"a", "b"}, {}]>')
        assert parse_sdy(attr).dims == (("c",), ("a", "b"), ())
        mesh_attr = ir.Attribute.parse('#sdy.mesh<["a"=2, "b"=2, "c"=2]>')
        assert mesh_from_sdy(mesh_attr) == Mesh((("a", 2), ("b", 2), ("c", 2)))


def test_mesh_from_sdy() -> None:
    assert mesh_from_sdy('#sdy.mesh<["dp"=2, "tp"=4]>') == DP_TP
    assert mesh_from_sdy('<["dp"=2, "tp"=4]>') == DP_TP  # as in `sdy.mesh @mesh = <[...]>`
    rev = mesh_from_sdy('#sdy.mesh<["dp"=2, "tp"=4], device_ids=[7,6,5,4,3,2,1,0]>')
    assert rev.device_ids == (7, 6, 5, 4, 3, 2, 1, 0)
    assert mesh_from_sdy('#sdy.mesh<["x"=4], device_ids=[0,1,2,3]>').device_ids is None  # iota normalised
    assert mesh_from_sdy("#sdy.mesh<[], device_ids=[3]>") == Mesh((), (3,))


@pytest.mark.parametrize("text", ["", "garbage", '#sdy.sharding<@mesh, [{"x"}', '#sdy.mesh<["a"=2]>',
                                  '#sdy.sharding<@mesh, [{"x":(0)2}]>', "1"])
def test_bad_sdy_sharding_raises(text: str) -> None:
    with pytest.raises(ShardingError):
        parse_sdy(text)


@pytest.mark.parametrize("text", ["", '#sdy.sharding<@mesh, [{"x"}]>', '#sdy.mesh<["a"=0]>'])
def test_bad_sdy_mesh_raises(text: str) -> None:
    with pytest.raises(ShardingError):
        mesh_from_sdy(text)


# --------------------------------------------------------------------------------------------- printing

def test_mesh_describe() -> None:
    assert DP_TP.describe() == '["dp"=2, "tp"=4]'
    assert Mesh((("x", 2),), (1, 0)).describe() == '["x"=2], device_ids=[1, 0]'


def test_layout_describe() -> None:
    assert Layout((("dp",), ())).describe() == '[{"dp"}, {}]'
    assert Layout(((), ("dp", "tp")), (("tp2", Reducer.MAX), ("a", Reducer.SUM))).describe() == \
        '[{}, {"dp", "tp"}] partial{"a":sum, "tp2":max}'


def test_layout_describe_merges_sub_axes_back_with_a_mesh() -> None:
    mesh = Mesh((("dp", 2), ("tp:(1)2", 2), ("tp:(2)2", 2)))
    whole = Layout((("tp:(1)2", "tp:(2)2"), ()))
    assert whole.describe(mesh) == '[{"tp"}, {}]'
    assert whole.describe() == '[{"tp":(1)2, "tp":(2)2}, {}]'
    assert Layout((("tp:(2)2",), ("dp",))).describe(mesh) == '[{"tp":(2)2}, {"dp"}]'
    # out of order parts are not one axis
    assert Layout((("tp:(2)2", "tp:(1)2"),)).describe(mesh) == '[{"tp":(2)2, "tp":(1)2}]'


# ---------------------------------------------------------------------------------------- live oracle

_LIVE = textwrap.dedent("""
    import json, os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    devs = np.array(jax.devices())
    cases = [((2, 4), ("dp", "tp"), [0, 1, 2, 3, 4, 5, 6, 7], [("dp", None), (None, "tp"),
              (("tp", "dp"), None), ("tp", "dp"), (None, None), (("dp", "tp"), None), ("tp", None)]),
             ((2, 2, 2), ("a", "b", "c"), [0, 1, 2, 3, 4, 5, 6, 7], [("c", ("a", "b")), (("c", "a"), None),
              ("b", "c")]),
             ((4, 2), ("x", "y"), [3, 1, 0, 2, 7, 6, 4, 5], [("x", "y"), ("y", None), (("y", "x"), None)])]
    out = []
    for shape, names, order, specs in cases:
        mesh = Mesh(devs[order].reshape(shape), names)
        for spec in specs:
            ns = NamedSharding(mesh, P(*spec))
            out.append({"mesh": list(zip(names, shape)), "spec": [s if s is None or
                        isinstance(s, str) else list(s) for s in spec],
                        "hlo": str(ns._to_xla_hlo_sharding(2))})
    x = jax.ShapeDtypeStruct((16, 32), jnp.float32,
                             sharding=NamedSharding(Mesh(devs.reshape(2, 4), ("dp", "tp")), P("dp", "tp")))
    lowered = jax.jit(lambda x: jnp.sin(x) * 2).lower(x)
    print(json.dumps({"cases": out, "mlir": lowered.as_text(),
                      "compiled": lowered.compile().as_text()}))
""")


@pytest.fixture(scope="module")
def live() -> dict[str, object]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    proc = subprocess.run([sys.executable, "-c", _LIVE], capture_output=True, text=True, env=env, check=True,
                          timeout=120)
    return json.loads(proc.stdout)


def test_live_named_shardings_map_back_to_their_partition_spec(live: dict[str, object]) -> None:
    cases = live["cases"]
    assert isinstance(cases, list) and cases
    for case in cases:
        # HLO device ids are logical: positions in the executable's device assignment, which JAX takes
        # from the mesh's device list. So even the permuted-device mesh is in iota order here.
        mesh = Mesh(tuple((n, s) for n, s in case["mesh"]))
        sharding = parse_gspmd(case["hlo"])
        expected = tuple(() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in case["spec"])
        if all(not d for d in expected):
            assert sharding == Replicated()
            continue
        assert isinstance(sharding, Tiled)
        xla = _jaxlib.hlo_sharding_class().from_string(case["hlo"])
        assert sharding.devices.array.ravel().tolist() == list(xla.tile_assignment_devices())
        refined = infer_mesh([sharding.devices.array], mesh.size, hint=mesh)
        assert layout_of(sharding, refined, 2) == Layout(expected), case


def test_live_sdy_module_attributes_parse(live: dict[str, object]) -> None:
    ir = _jaxlib.ir()
    with _jaxlib.make_context():
        module = ir.Module.parse(str(live["mlir"]))
        ops = list(module.body.operations)
        mesh_op = next(op for op in ops if op.operation.name == "sdy.mesh")
        mesh = mesh_from_sdy(mesh_op.attributes["mesh"])
        func = next(op for op in ops if op.operation.name == "func.func")
        arg_attrs = ir.DictAttr(ir.ArrayAttr(func.attributes["arg_attrs"])[0])
        sharding = parse_sdy(arg_attrs["sdy.sharding"])
    assert mesh == DP_TP
    assert sharding.dims == (("dp",), ("tp",))
    assert layout_of(sharding, mesh, 2) == Layout((("dp",), ("tp",)))
    assert layout_of(parse_gspmd("{devices=[2,4]<=[8]}"), mesh, 2) == layout_of(sharding, mesh, 2)


def test_live_compiled_module_spells_the_same_sharding(live: dict[str, object]) -> None:
    compiled = str(live["compiled"])
    if "sharding=" not in compiled:
        pytest.skip(f"jax {_jaxlib.jax_version()}: XLA (jax 0.11+) keeps no sharding on the compiled module; "
                    "the parameter's GSPMD spelling is checked on jax 0.10")
    assert "sharding={devices=[2,4]<=[8]}" in compiled


def test_partial_parts_of_one_axis_print_as_that_axis() -> None:
    mesh = Mesh((("dp", 2), ("tp:(1)2", 2), ("tp:(2)2", 2)))
    layout = Layout((("dp",),), (("tp:(2)2", Reducer.SUM), ("tp:(1)2", Reducer.SUM)))
    assert layout.describe(mesh) == '[{"dp"}] partial{"tp":sum}'
    assert Layout(((),), (("tp:(2)2", Reducer.MAX),)).describe(mesh) == '[{}] partial{"tp":(2)2:max}'
