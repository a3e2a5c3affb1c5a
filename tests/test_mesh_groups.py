"""Replica groups, collective-permute pairs and partition-id tables read as mesh axes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.layout.groups import (
    axes_of_groups,
    canonical_groups,
    cyclic_shift,
    match_axis_index,
    pairs_are_complete_permutation,
    relaid_by_pairs,
    shift_of_pairs,
)
from scalify_hlo.layout.inference import infer_mesh
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer

DP_TP = Mesh((("dp", 2), ("tp", 4)))


# ---------------------------------------------------------------------------------------- replica groups

@pytest.mark.parametrize(("groups", "axes"), [
    ([[0, 1, 2, 3], [4, 5, 6, 7]], ("tp",)),
    ([[0, 4], [1, 5], [2, 6], [3, 7]], ("dp",)),
    ([[0, 1, 2, 3, 4, 5, 6, 7]], ("dp", "tp")),
    ([[0, 4, 1, 5, 2, 6, 3, 7]], ("tp", "dp")),
    ([[4, 5, 6, 7], [0, 1, 2, 3]], ("tp",)),          # the order of the groups themselves is free
    ([[3, 7], [0, 4], [2, 6], [1, 5]], ("dp",)),
    ([[0], [1], [2], [3], [4], [5], [6], [7]], ()),
])
def test_groups_to_axes(groups: list[list[int]], axes: tuple[str, ...]) -> None:
    assert axes_of_groups(np.array(groups), DP_TP, 8) == axes


def test_empty_groups_mean_all_devices_in_id_order() -> None:
    assert axes_of_groups(np.zeros((0,), dtype=np.int64), DP_TP, 8) == ("dp", "tp")
    # on a mesh whose device order is not the id order, "all devices by id" is another axis order...
    interleaved = Mesh((("dp", 2), ("tp", 4)), (0, 2, 4, 6, 1, 3, 5, 7))
    assert axes_of_groups(np.zeros((0,), dtype=np.int64), interleaved, 8) == ("tp", "dp")
    # ...or none at all
    other = Mesh((("dp", 2), ("tp", 4)), (0, 4, 1, 5, 2, 6, 3, 7))
    with pytest.raises(ShardingError, match="shard order"):
        axes_of_groups(np.zeros((0,), dtype=np.int64), other, 8)


def test_permuted_group_is_an_order_mismatch() -> None:
    with pytest.raises(ShardingError, match="group order does not match the shard order"):
        axes_of_groups(np.array([[1, 0, 2, 3], [5, 4, 6, 7]]), DP_TP, 8)
    # each group in a different order
    with pytest.raises(ShardingError, match="group order does not match the shard order"):
        axes_of_groups(np.array([[0, 1, 2, 3], [4, 6, 5, 7]]), DP_TP, 8)


@pytest.mark.parametrize("groups", [
    [[0, 1, 4, 5], [2, 3, 6, 7]],  # part of tp with dp: needs the refined mesh
    [[0, 5], [1, 4], [2, 7], [3, 6]],  # not fibres of anything
    [[0, 1, 2], [3, 4, 5]],  # not all devices
])
def test_non_fibres_are_rejected(groups: list[list[int]]) -> None:
    with pytest.raises(ShardingError):
        axes_of_groups(np.array(groups), DP_TP, 8)


def test_member_order_over_sub_axes_is_an_order_not_a_mismatch() -> None:
    groups = np.array([[0, 2, 1, 3], [4, 6, 5, 7]])
    with pytest.raises(ShardingError, match="shard order"):
        axes_of_groups(groups, DP_TP, 8)  # on the unrefined mesh no order of its axes fits
    mesh = infer_mesh([groups], 8, hint=DP_TP)
    assert axes_of_groups(groups, mesh, 8) == ("tp:(2)2", "tp:(1)2")


def test_groups_over_a_sub_axis_after_inference() -> None:
    groups = np.array([[0, 2], [1, 3], [4, 6], [5, 7]])  # the major half of tp
    mesh = infer_mesh([groups], 8, hint=DP_TP)
    assert axes_of_groups(groups, mesh, 8) == ("tp:(1)2",)
    both = np.array([[0, 1, 4, 5], [2, 3, 6, 7]])
    mesh = infer_mesh([groups, both], 8, hint=DP_TP)
    assert axes_of_groups(both, mesh, 8) == ("dp", "tp:(2)2")


def test_4096_device_groups() -> None:
    mesh = Mesh((("dp", 16), ("fsdp", 16), ("tp", 16)))
    across_dp = np.arange(4096).reshape(16, 256).T  # [256, 16]: every group spans dp
    assert axes_of_groups(across_dp, mesh, 4096) == ("dp",)
    tp_fsdp = np.arange(4096).reshape(16, 16, 16).transpose(0, 2, 1).reshape(16, 256)
    assert axes_of_groups(tp_fsdp, mesh, 4096) == ("tp", "fsdp")
    broken = tp_fsdp.copy()
    broken[3, [0, 1]] = broken[3, [1, 0]]
    with pytest.raises(ShardingError, match="shard order"):
        axes_of_groups(broken, mesh, 4096)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_fibres_in_any_axis_order_and_any_group_order(data: st.DataObject) -> None:
    sizes = data.draw(st.lists(st.sampled_from([2, 3, 4]), min_size=1, max_size=4))
    names = tuple(f"a{i}" for i in range(len(sizes)))
    ids = data.draw(st.sampled_from([None, "shuffled"]))
    n = int(np.prod(sizes))
    mesh = Mesh(tuple(zip(names, sizes, strict=True)),
                tuple(data.draw(st.permutations(range(n)))) if ids else None)
    chosen = tuple(data.draw(st.permutations(names))[: data.draw(st.integers(1, len(names)))])
    rest = [a for a in names if a not in chosen]
    grid = mesh.device_array().transpose([mesh.axis_index(a) for a in (*rest, *chosen)])
    groups = grid.reshape(-1, mesh.size_of(chosen))
    groups = groups[data.draw(st.permutations(range(groups.shape[0])))]
    assert axes_of_groups(groups, mesh, n) == chosen
    assert infer_mesh([canonical_groups(groups, mesh)], n, hint=mesh) == mesh  # whole axes: nothing to refine
    if groups.shape[1] > 2:
        swapped = groups.copy()
        swapped[:, [0, 1]] = swapped[:, [1, 0]]  # first two members swapped: no mixed-radix order
        with pytest.raises(ShardingError, match="shard order"):
            axes_of_groups(swapped, mesh, n)


# ---------------------------------------------------------------------------------- collective-permute

def test_cyclic_shift_along_one_axis() -> None:
    # from compiled.as_text() of a shard_map ppermute over "tp"
    pairs = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]])
    assert shift_of_pairs(pairs, DP_TP) == ("tp", 1)
    back = pairs[:, ::-1]
    assert shift_of_pairs(back, DP_TP) == ("tp", 3)
    assert shift_of_pairs(np.array([[i, (i + 4) % 8] for i in range(8)]), DP_TP) == ("dp", 1)


def test_not_a_shift() -> None:
    # from compiled.as_text(): a transpose of a 2x2 block, not a shift along one axis
    swap = np.array([[0, 0], [2, 4], [4, 2], [6, 6], [1, 1], [3, 5], [5, 3], [7, 7]])
    assert shift_of_pairs(swap, DP_TP) is None
    assert shift_of_pairs(np.array([[i, i] for i in range(8)]), DP_TP) is None  # identity
    no_wrap = np.array([[0, 1], [1, 2], [2, 3], [4, 5], [5, 6], [6, 7]])
    assert shift_of_pairs(no_wrap, DP_TP) is None
    mixed = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 6], [5, 7], [6, 4], [7, 5]])
    assert shift_of_pairs(mixed, DP_TP) is None  # k differs between dp rows
    diagonal = np.array([[i, (i + 5) % 8] for i in range(8)])
    assert shift_of_pairs(diagonal, DP_TP) is None


def test_complete_permutation_helper() -> None:
    assert pairs_are_complete_permutation(np.array([[0, 1], [1, 0]]), 2)
    assert not pairs_are_complete_permutation(np.array([[0, 1], [1, 1]]), 2)
    assert not pairs_are_complete_permutation(np.array([[0, 1]]), 2)


def test_shift_on_4096_devices() -> None:
    mesh = Mesh((("dp", 16), ("fsdp", 16), ("tp", 16)))
    coords = mesh.coords(np.arange(4096))
    target = coords.copy()
    target[:, 1] = (target[:, 1] + 5) % 16
    pairs = np.stack([np.arange(4096), mesh.linear_index(target, ("dp", "fsdp", "tp"))], axis=1)
    assert shift_of_pairs(pairs, mesh) == ("fsdp", 5)


# ------------------------------------------------------------------------------------ partition-id tables

def test_axis_index_tables() -> None:
    ids = np.arange(8)
    assert match_axis_index(ids % 4, DP_TP) == (("tp",), 1)
    assert match_axis_index(ids % 4 * 16, DP_TP) == (("tp",), 16)  # a shard offset table: tp index * 16
    assert match_axis_index(ids // 4 * 3, DP_TP) == (("dp",), 3)
    assert match_axis_index(ids * 2, DP_TP) == (("dp", "tp"), 2)
    assert match_axis_index(ids % 4 * 2 + ids // 4, DP_TP) == (("tp", "dp"), 1)
    assert match_axis_index(np.zeros(8), DP_TP) == ((), 0)


def test_tables_that_are_not_an_axis_index() -> None:
    ids = np.arange(8)
    assert match_axis_index(ids % 2, DP_TP) is None  # part of tp: the mesh would need refining
    assert match_axis_index(7 - ids, DP_TP) is None
    assert match_axis_index(ids % 4 + ids // 4, DP_TP) is None  # both with the same weight
    assert match_axis_index(ids + 1, DP_TP) is None
    assert match_axis_index(np.arange(4), DP_TP) is None


def test_axis_index_follows_device_ids() -> None:
    mesh = Mesh((("dp", 2), ("tp", 2)), (3, 2, 1, 0))  # device 3 at (0, 0)
    values = np.array([1, 0, 1, 0])  # value per device id: device 2 (tp=1) → 1, device 3 → 0
    assert match_axis_index(values, mesh) == (("tp",), 1)


def test_axis_index_on_4096_devices() -> None:
    mesh = Mesh((("dp", 16), ("fsdp", 16), ("tp", 16)))
    values = mesh.linear_index(np.arange(4096), ("tp", "dp"), devices=True) * 128
    assert match_axis_index(values, mesh) == (("tp", "dp"), 128)


def test_shift_along_an_axis_that_refinement_split() -> None:
    refined = Mesh((("dp", 2), ("tp:(1)2", 2), ("tp:(2)2", 2)))
    pairs = np.array([[0, 1], [1, 2], [2, 3], [3, 0], [4, 5], [5, 6], [6, 7], [7, 4]])
    assert cyclic_shift(pairs, refined) == (("tp:(1)2", "tp:(2)2"), 1)
    assert shift_of_pairs(pairs, refined) is None  # not along one mesh axis: the caller must not guess
    assert cyclic_shift(pairs[:, ::-1], refined) == (("tp:(1)2", "tp:(2)2"), 3)
    minor_only = np.array([[i, i ^ 1] for i in range(8)])
    assert shift_of_pairs(minor_only, refined) == ("tp:(2)2", 1)
    assert cyclic_shift(minor_only, refined) == (("tp:(2)2",), 1)
    carry_into_dp = np.array([[i, (i + 2) % 8] for i in range(8)])  # tp:(1)2 then dp: crosses axes
    assert cyclic_shift(carry_into_dp, refined) is None
    wide = Mesh((("x:(1)2", 2), ("x:(2)2", 2), ("x:(4)4", 4)))
    middle = np.array([[i, (i // 8) * 8 + (i + 3) % 8] for i in range(16)])  # x:(2)2 and x:(4)4 together
    assert cyclic_shift(middle, wide) == (("x:(2)2", "x:(4)4"), 3)
    one_part = np.array([[i, (i // 8) * 8 + (i + 4) % 8] for i in range(16)])  # a step of x:(2)2 alone
    assert shift_of_pairs(one_part, wide) == ("x:(2)2", 1)


# ---------------------------------------------------------------------------------------- relayout permutes

A2B2C2 = Mesh((("a", 2), ("b", 2), ("c", 2)))


def _block(mesh: Mesh, layout: Layout, device: int) -> tuple[int, ...]:
    """The block index (per dim) device `device` holds under `layout`, from its mesh coordinates."""
    coords = dict(zip(mesh.names, mesh.coords(np.array([device]))[0].tolist(), strict=True))
    out = []
    for axes in layout.dims:
        k = 0
        for a in axes:
            k = k * mesh.axis_size(a) + coords[a]
        out.append(k)
    return tuple(out)


def test_a_permute_swapping_two_axes_moves_the_split_from_one_to_the_other() -> None:
    # device (a, b, c) sends to (b, a, c): a block split over "a" lands where "b" has it
    pairs = [(d, int(np.ravel_multi_index((b, a, c), (2, 2, 2))))
             for d, (a, b, c) in enumerate(np.ndindex(2, 2, 2))]
    assert relaid_by_pairs(pairs, A2B2C2, Layout((("a",), ()))) == Layout((("b",), ()))
    assert relaid_by_pairs(pairs, A2B2C2, Layout((("a", "c"), ("b",)))) == Layout((("b", "c"), ("a",)))
    assert relaid_by_pairs(pairs, A2B2C2, Layout((("a",), ()), (("c", Reducer.SUM),))) is None  # partial: not taken
    assert relaid_by_pairs(pairs[:-1], A2B2C2, Layout((("a",), ()))) is None  # a device receives nothing


def _axis_moves(order: list[int], flips: list[bool]) -> list[int]:
    """The device permutation sending coordinates x to y with y[order[i]] = x[i] xor flips[i]."""
    out = []
    for x in np.ndindex(2, 2, 2):
        y = [0, 0, 0]
        for i, o in enumerate(order):
            y[o] = x[i] ^ int(flips[i])
        out.append(int(np.ravel_multi_index(tuple(y), (2, 2, 2))))
    return out


# Any permutation, and the ones a partitioner writes (axes exchanged, coordinates mirrored), which relayouts are.
PERMUTATIONS = st.one_of(st.permutations(range(8)), st.builds(_axis_moves, st.permutations(range(3)),
                                                              st.lists(st.booleans(), min_size=3, max_size=3)))


@settings(max_examples=150)
@given(PERMUTATIONS, st.sampled_from([(("a",), ()), (("a", "b"), ()), (("c",), ("a",)), ((), ("b", "c")),
                                                   (("b",), ()), ((), ())]))
def test_a_relaid_value_is_where_the_permute_put_each_block(perm: list[int], dims: tuple[tuple[str, ...], ...]) -> None:
    """Whatever layout is returned, every device holds under it exactly the block it was sent."""
    layout = Layout(dims)
    pairs = list(enumerate(perm))
    relaid = relaid_by_pairs(pairs, A2B2C2, layout)
    if relaid is None:
        return
    assert relaid != layout
    for src, dst in pairs:
        assert _block(A2B2C2, relaid, dst) == _block(A2B2C2, layout, src), (pairs, layout, relaid)
