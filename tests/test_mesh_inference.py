"""Mesh inference, refinement into sub-axes, and the layouts shardings give on a mesh."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.layout.inference import factor, infer_mesh, layout_on, mesh_axes_of, refine_for_axes
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer, split_axis_name, sub_axis_name
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
    parse_gspmd,
    parse_sdy,
    tiled_of,
)

DP_TP = Mesh((("dp", 2), ("tp", 4)))
DP_TP_REFINED = Mesh((("dp", 2), ("tp:(1)2", 2), ("tp:(2)2", 2)))


def tiled(text: str) -> Tiled:
    s = parse_gspmd(text)
    assert isinstance(s, Tiled)
    return s


# ------------------------------------------------------------------------------------------------- Mesh

def test_mesh_basic_queries() -> None:
    assert DP_TP.size == 8 and DP_TP.names == ("dp", "tp") and DP_TP.shape == (2, 4)
    assert DP_TP.axis_size("tp") == 4 and DP_TP.size_of(["dp", "tp"]) == 8 and DP_TP.size_of([]) == 1
    with pytest.raises(ShardingError, match="expected one of dp, tp"):
        DP_TP.axis_size("pp")


def test_mesh_validates_and_normalises_device_ids() -> None:
    assert Mesh((("x", 4),), (0, 1, 2, 3)) == Mesh((("x", 4),))
    with pytest.raises(ShardingError):
        Mesh((("x", 4),), (0, 1, 1, 3))
    with pytest.raises(ShardingError):
        Mesh((("x", 2), ("x", 2)))
    with pytest.raises(ShardingError):
        Mesh((("x", 0),))


def test_coords_and_linear_index_are_vectorised() -> None:
    devices = np.array([[0, 5], [7, 2]])
    coords = DP_TP.coords(devices)
    assert coords.shape == (2, 2, 2)
    assert coords[0, 1].tolist() == [1, 1] and coords[1, 0].tolist() == [1, 3]
    assert DP_TP.linear_index(coords, ("tp", "dp")).tolist() == [[0, 3], [7, 4]]
    assert DP_TP.linear_index(devices, ("dp", "tp"), devices=True).tolist() == devices.tolist()


def test_coords_follow_device_ids() -> None:
    mesh = Mesh((("dp", 2), ("tp", 2)), (3, 2, 1, 0))
    assert mesh.coords(np.array([3, 0, 1])).tolist() == [[0, 0], [1, 1], [1, 0]]
    assert mesh.device_array().tolist() == [[3, 2], [1, 0]]
    with pytest.raises(ShardingError):
        mesh.coords(np.array([4]))


def test_sub_axis_names() -> None:
    assert sub_axis_name("tp", 1, 2) == "tp:(1)2"
    assert split_axis_name("tp:(2)4") == ("tp", 2, 4)
    assert split_axis_name("tp") == ("tp", 1, None)


# -------------------------------------------------------------------------------------------- inference

def test_infer_without_hint_uses_the_first_iota_factorisation() -> None:
    mesh = infer_mesh([tiled("{devices=[2,1,4]<=[8] last_tile_dim_replicate}").devices.array], 8)
    assert mesh == Mesh((("axis_0", 2), ("axis_1", 4)))
    # XLA's own mesh spelling for the same module: mesh['axis_0'=2,'axis_1'=4]
    transposed = infer_mesh([tiled("{devices=[2,4]<=[4,2]T(1,0)}").devices.array], 8)
    assert transposed == Mesh((("axis_0", 4), ("axis_1", 2)))


def test_infer_refines_an_axis_used_in_part() -> None:
    # tp=4 but one tile dim of size 2 over the major half of tp, the minor half replicated
    arr = tiled("{devices=[2,2,2]<=[8] last_tile_dims={manual}}").devices.array
    assert factor(arr, DP_TP) is None
    mesh = infer_mesh([arr], 8, hint=DP_TP)
    assert mesh == DP_TP_REFINED
    assert factor(arr, mesh) == (("dp",), ("tp:(1)2",), ("tp:(2)2",))


def test_infer_refines_for_replica_groups_and_keeps_earlier_arrays_factoring() -> None:
    groups = np.array([[0, 1], [2, 3], [4, 5], [6, 7]])  # minor half of tp
    tile = tiled("{devices=[2,4]<=[8]}").devices.array
    mesh = infer_mesh([tile, groups], 8, hint=DP_TP)
    assert mesh == DP_TP_REFINED
    assert factor(tile, mesh) == (("dp",), ("tp:(1)2", "tp:(2)2"))
    assert layout_of(Tiled(DeviceArray(tile)), mesh, 2).describe(mesh) == '[{"dp"}, {"tp"}]'


def test_infer_refines_sub_axes_of_sub_axes() -> None:
    mesh = Mesh((("x", 8),))
    first = infer_mesh([np.arange(8).reshape(2, 4)], 8, hint=mesh)
    assert first.names == ("x:(1)2", "x:(2)4")
    second = infer_mesh([np.arange(8).reshape(2, 4), np.arange(8).reshape(4, 2)], 8, hint=mesh)
    assert second.axes == (("x:(1)2", 2), ("x:(2)2", 2), ("x:(4)2", 2))
    assert refine_for_axes(first, ["x:(1)4"]) == second


def test_infer_with_hint_device_ids() -> None:
    hint = Mesh((("dp", 2), ("tp", 2)), (0, 2, 1, 3))
    arr = np.array([[0, 2], [1, 3]])
    assert infer_mesh([arr, arr.T], 4, hint=hint) == hint
    assert factor(arr.T, hint) == (("tp",), ("dp",))


def test_infer_from_a_non_iota_first_list_keeps_its_order() -> None:
    mesh = infer_mesh([np.array([[0, 3], [1, 2]]), np.array([[0, 1], [3, 2]])], 4)
    assert mesh == Mesh((("axis_0", 2), ("axis_1", 2)), (0, 3, 1, 2))


def test_replica_groups_in_any_order_still_infer_the_mesh() -> None:
    # Group order and member order are judged later by axes_of_groups (a discrepancy, not bad input).
    tile = np.arange(8).reshape(2, 4)
    shuffled_rows = np.array([[4, 5, 6, 7], [0, 1, 2, 3]])
    permuted_members = np.array([[1, 0, 2, 3], [5, 4, 6, 7]])
    assert infer_mesh([shuffled_rows, tile], 8) == Mesh((("axis_0", 2), ("axis_1", 4)))
    assert infer_mesh([tile, permuted_members], 8, hint=DP_TP) == DP_TP
    # a member order that is a real order of sub-axes refines the mesh for it
    swapped_halves = np.array([[0, 2, 1, 3], [4, 6, 5, 7]])
    refined = infer_mesh([swapped_halves], 8, hint=DP_TP)
    assert refined == DP_TP_REFINED


def test_no_common_mesh_names_the_array() -> None:
    a = np.arange(6).reshape(2, 3)
    b = np.arange(6).reshape(3, 2).T  # the [3,2] order of 6 devices
    with pytest.raises(ShardingError, match=r"sharding of %p1.*no common mesh"):
        infer_mesh([a, b], 6, labels=["sharding of %p0", "sharding of %p1"])
    with pytest.raises(ShardingError, match="device list #1"):
        infer_mesh([np.arange(4), np.array([[0, 3], [1, 2]])], 4)


def test_infer_rejects_lists_that_are_not_orderings_of_all_devices() -> None:
    with pytest.raises(ShardingError, match="every device exactly once"):
        infer_mesh([np.array([0, 1, 2])], 4)
    with pytest.raises(ShardingError, match="has 8 devices, expected 4"):
        infer_mesh([], 4, hint=DP_TP)


def test_infer_ignores_empty_groups_and_handles_one_device() -> None:
    assert infer_mesh([np.zeros((0,), dtype=np.int64)], 8, hint=DP_TP) == DP_TP
    assert infer_mesh([], 1) == Mesh(())
    assert infer_mesh([], 8) == Mesh((("axis_0", 8),))


def test_4096_devices() -> None:
    hint = Mesh((("dp", 16), ("fsdp", 16), ("tp", 16)))
    tile = np.arange(4096).reshape(16, 16, 16).transpose(2, 0, 1).reshape(16, 256, 1)
    groups = np.arange(4096).reshape(-1, 4)  # a quarter of tp: refinement at scale
    mesh = infer_mesh([tile, groups], 4096, hint=hint)
    assert mesh.names == ("dp", "fsdp", "tp:(1)4", "tp:(4)4")
    layout = layout_of(parse_gspmd("{devices=[16,256,1]<=[256,16]T(1,0)}"), mesh, 3)
    assert layout.describe(mesh) == '[{"tp"}, {"dp", "fsdp"}, {}]'
    assert layout.local_shape((64, 1024, 3), mesh) == (4, 4, 3)


# ---------------------------------------------------------------------------------------------- layouts

@pytest.mark.parametrize(("text", "expected"), [
    ("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", '[{"dp"}, {}]'),
    ("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}", '[{}, {"tp"}]'),
    ("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", '[{"tp"}, {}]'),
    ("{devices=[8,1]<=[2,4]T(1,0)}", '[{"tp", "dp"}, {}]'),
    ("{devices=[2,4]<=[8]}", '[{"dp"}, {"tp"}]'),
    ("{devices=[8,1]<=[8]}", '[{"dp", "tp"}, {}]'),
    ("{devices=[2,1,4]<=[8] last_tile_dims={manual}}", '[{"dp"}, {}]'),
    ("{devices=[1,1,2,4]<=[8] last_tile_dims={unreduced, replicated}}", '[{}, {}] partial{"dp":sum}'),
])
def test_layout_of_real_tiles_on_dp_tp(text: str, expected: str) -> None:
    assert layout_of(parse_gspmd(text), DP_TP, 2).describe(DP_TP) == expected


def test_layout_of_sub_axis_tiles_and_unreduced() -> None:
    layout = layout_of(parse_gspmd("{devices=[2,2,2]<=[8] last_tile_dims={unreduced}}"), DP_TP_REFINED, 2)
    assert layout == Layout((("dp",), ("tp:(1)2",)), (("tp:(2)2", Reducer.SUM),))
    assert not layout.is_resolved and layout.split_axes() == {"dp", "tp:(1)2"}


def test_layout_of_replicated_manual_and_rejections() -> None:
    assert layout_of(Replicated(), DP_TP, 3) == Layout.replicated(3)
    assert layout_of(Manual(), DP_TP, 1) == Layout(((),))
    for s in (Maximal(0), UnknownSharding(), TupleSharding((Replicated(),))):
        with pytest.raises(ShardingError):
            layout_of(s, DP_TP, 2)
    with pytest.raises(ShardingError, match="expected rank 3"):
        layout_of(parse_gspmd("{devices=[2,4]<=[8]}"), DP_TP, 3)
    with pytest.raises(ShardingError, match="does not factor"):
        layout_of(parse_gspmd("{devices=[2,2,2]<=[8] last_tile_dims={manual}}"), DP_TP, 2)  # not refined
    with pytest.raises(ShardingError, match="does not factor"):
        layout_of(parse_gspmd("{devices=[4,2]0,1,2,3,4,5,7,6}"), DP_TP, 2)


def test_layout_of_sdy_with_sub_axes() -> None:
    s = parse_sdy('#sdy.sharding<@mesh, [{"tp":(1)2}, {"dp", "tp":(2)2}]>')
    with pytest.raises(ShardingError, match="refined"):
        layout_of(s, DP_TP, 2)
    mesh = refine_for_axes(DP_TP, [a for d in s.dims for a in d])
    assert mesh == DP_TP_REFINED
    layout = layout_of(s, mesh, 2)
    assert layout == Layout((("tp:(1)2",), ("dp", "tp:(2)2")))
    # the same placement XLA derives for it
    assert factor(tiled_of(layout, mesh).devices.array, mesh) == (("tp:(1)2",), ("dp", "tp:(2)2"))
    assert layout_of(SdySharding("mesh", (("tp",), ()), unreduced=("dp",)), mesh, 2) == \
        Layout((("tp:(1)2", "tp:(2)2"), ()), (("dp", Reducer.SUM),))
    with pytest.raises(ShardingError, match="not in mesh"):
        layout_of(SdySharding("mesh", (("pp",),)), mesh, 1)


def test_mesh_axes_of_maps_whole_and_sub_axes() -> None:
    assert mesh_axes_of("tp", DP_TP_REFINED) == ("tp:(1)2", "tp:(2)2")
    assert mesh_axes_of("tp:(1)4", DP_TP_REFINED) == ("tp:(1)2", "tp:(2)2")
    assert mesh_axes_of("tp:(1)4", DP_TP) == ("tp",)
    assert mesh_axes_of("dp", DP_TP_REFINED) == ("dp",)


def test_uneven_local_shapes_round_up() -> None:
    layout = Layout((("dp",), ("tp",), ()))
    assert layout.local_shape((5, 7, 3), DP_TP) == (3, 2, 3)
    assert layout.local_shape((2, 4, 1), DP_TP) == (1, 1, 1)
    with pytest.raises(ShardingError):
        layout.local_shape((5, 7), DP_TP)


def test_layout_partial_bookkeeping() -> None:
    layout = Layout((("dp",), ())).with_partial(["tp"], Reducer.SUM)
    assert layout.partial == (("tp", Reducer.SUM),) and layout.partial_axes() == {"tp"}
    assert layout.with_partial(["tp"], Reducer.SUM) == layout
    with pytest.raises(ShardingError):
        layout.with_partial(["tp"], Reducer.MAX)
    with pytest.raises(ShardingError):
        layout.with_partial(["dp"], Reducer.SUM)  # already split
    assert layout.without_partial(["tp"]) == Layout((("dp",), ()))
    assert Layout(((),), (("b", Reducer.MAX), ("a", Reducer.SUM))).partial[0][0] == "a"  # sorted by name


def test_tiled_of_round_trips_real_tiles() -> None:
    for text in ["{devices=[2,1,4]<=[8] last_tile_dim_replicate}", "{devices=[8,1]<=[2,4]T(1,0)}",
                 "{devices=[1,1,2,4]<=[8] last_tile_dims={unreduced, replicated}}"]:
        layout = layout_of(parse_gspmd(text), DP_TP, 2)
        assert layout_of(tiled_of(layout, DP_TP), DP_TP, 2) == layout
    assert tiled_of(Layout((("dp",), ())), DP_TP) == \
        parse_gspmd("{devices=[2,1,4]<=[8] last_tile_dim_replicate}")


# ------------------------------------------------------------------------------------ property: refining

@st.composite
def placements(draw: st.DrawFn) -> tuple[Mesh, Mesh, np.ndarray, tuple[str, ...], list[list[str]], int]:
    """A mesh, a random refinement of it, and a tile assignment built from its parts in random order."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4, 6, 8]), min_size=1, max_size=3))
    names = [f"a{i}" for i in range(len(sizes))]
    n = math.prod(sizes)
    ids = draw(st.sampled_from([None, "shuffled"]))
    device_ids = tuple(draw(st.permutations(range(n)))) if ids else None
    mesh = Mesh(tuple(zip(names, sizes, strict=True)), device_ids)
    parts: list[tuple[str, int]] = []
    for name, size in zip(names, sizes, strict=True):
        factors, left = [], size
        while left > 1:
            f = draw(st.sampled_from([d for d in range(2, left + 1) if left % d == 0]))
            factors.append(f)
            left //= f
        pre = 1
        for f in factors:
            parts.append((sub_axis_name(name, pre, f) if len(factors) > 1 else name, f))
            pre *= f
    refined = Mesh(tuple(parts), device_ids)
    order = draw(st.permutations([p for p, _ in parts]))
    rank = draw(st.integers(1, 3))
    kinds = draw(st.sampled_from([(), ("replicated",), ("unreduced",), ("unreduced", "replicated")]))
    slot = [draw(st.integers(0, rank + len(kinds) - 1)) for _ in order]
    groups: list[list[str]] = [[a for a, k in zip(order, slot, strict=True) if k == g]
                               for g in range(rank + len(kinds))]
    grid = refined.device_array().transpose([refined.axis_index(a) for g in groups for a in g])
    arr = grid.reshape([refined.size_of(g) for g in groups])
    return mesh, refined, arr, tuple(kinds), groups, rank


@settings(max_examples=150, deadline=None)
@given(placements())
def test_layout_of_round_trips_random_refinements(case: tuple[Mesh, Mesh, np.ndarray, tuple[str, ...],
                                                              list[list[str]], int]) -> None:
    mesh, refined, arr, kinds, groups, rank = case
    inferred = infer_mesh([arr], mesh.size, hint=mesh)
    layout = layout_of(Tiled(DeviceArray(arr), kinds), inferred, rank)  # type: ignore[arg-type]

    # Compare in the generated (finest) parts: every inferred axis is a run of them.
    def parts(names: tuple[str, ...]) -> list[str]:
        return [p for a in names for p in mesh_axes_of(a, refined)]

    assert [parts(d) for d in layout.dims] == groups[:rank]
    unreduced = [a for k, g in zip(kinds, groups[rank:], strict=True) if k == "unreduced" for a in g]
    assert sorted(parts(tuple(a for a, _ in layout.partial))) == sorted(unreduced)
    assert all(r is Reducer.SUM for _, r in layout.partial)
    assert layout_of(tiled_of(layout, inferred), inferred, rank) == layout
    expected_dims = Layout(tuple(tuple(g) for g in groups[:rank]))
    assert Layout(layout.dims).describe(inferred) == expected_dims.describe(refined)


def test_a_layout_over_whole_axes_read_on_a_mesh_that_splits_them() -> None:
    """The reference's output layout over "tp", on the partitioned program's mesh where its device lists cut
    "tp" in two (`prepare_against` fills the outputs the partitioned module leaves unannotated so)."""
    refined = Mesh((("fsdp", 2), ("tp:(1)2", 2), ("tp:(2)2", 2)))
    layout = Layout((("tp",), ("fsdp",)))
    assert layout_on(layout, refined) == Layout((("tp:(1)2", "tp:(2)2"), ("fsdp",)))
    summed = Layout(((), ("fsdp",)), (("tp", Reducer.SUM),))
    assert layout_on(summed, refined) == Layout(((), ("fsdp",)), (("tp:(1)2", Reducer.SUM), ("tp:(2)2", Reducer.SUM)))
    assert layout_on(Layout((("dp",),)), refined) is None  # an axis the mesh does not have
    assert layout_on(Layout((("tp:(1)2",),)), refined) == Layout((("tp:(1)2",),))


def test_devices_sharing_a_partition_id_table_offset_refine_the_mesh() -> None:
    """GQA's 2 KV heads over tp = 4: XLA looks each device's KV head up from the partition id through constant
    tables (no sharding names the half of tp), and the devices sharing an offset cut tp into tp:(1)2 x tp:(2)2;
    the reference's dp x tp mesh alone does not."""
    import scalify_hlo.parsers as parsers
    from conftest import FIXTURES

    from scalify_hlo.layout.program import prepare, prepare_against
    from scalify_hlo.layout.tables import offset_groups

    d = FIXTURES / "gqa_kv_heads_sub_axis_shardy"
    before, after = parsers.load(d / "before.mlir"), parsers.load(d / "after.hlo")
    ref = prepare(before)
    assert ref.mesh.names == ("dp", "tp")
    assert prepare_against(after, ref).mesh.names == ("dp", "tp:(1)2", "tp:(2)2")
    groups = [g.tolist() for g in offset_groups(after.main, 8)]
    assert [[0, 1, 4, 5], [2, 3, 6, 7]] in groups
