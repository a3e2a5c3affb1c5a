"""Which devices a collective combines, read in one place for the interpreter, the prover and the audit.

Which devices form a group follows XLA's collective group modes (`CollectiveOpGroupMode`), devices
numbered `replica * partitions + partition`:
- no `channel_handle`: cross-replica; groups list replica ids and every partition runs its own copy.
  With one replica each partition is alone and the collective does nothing across partitions.
- `channel_handle` and `use_global_device_ids`: flattened ids; groups list device ids.
- `channel_handle` on all_to_all / collective_permute / collective_broadcast (no such attribute):
  cross-partition; groups list partition ids, within each replica.
- `channel_handle` without `use_global_device_ids` on all_reduce / all_gather / reduce_scatter:
  cross-replica-and-partition; a group is its replicas times all partitions. With one replica, ids beyond
  replica 0 cannot be replica ids and are read as partition ids.
Empty replica groups mean one group of all participants.

Then the device algebra of groups and pairs on a mesh: the axes a group array spans (`axes_of_groups`),
cyclic shifts along axes (`cyclic_shift`), permutes that hand each device its block under another layout
(`relaid_by_pairs`), partition-id tables read as axis indices (`match_axis_index`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np
import numpy.typing as npt

from scalify_hlo.ir.errors import ShardingError, UnmodelledShardingError
from scalify_hlo.ir.nodes import ChannelHandle, Literal, Op
from scalify_hlo.layout.inference import factor, position_forms
from scalify_hlo.layout.mesh import (
    IntArray,
    Layout,
    Mesh,
    is_partition,
    preview_devices,
    preview_groups,
    split_axis_name,
)

# Ops without `use_global_device_ids`: with a channel their groups list partition ids.
_NO_GLOBAL_IDS_ATTR = frozenset({"all_to_all", "collective_permute", "collective_broadcast"})


def has_channel(op: Op) -> bool:
    """Whether `op` has a channel: a channel handle > 0 (XLA reads a zero channel id as none)."""
    ch = op.attrs.get("channel_handle")
    return isinstance(ch, ChannelHandle) and ch.handle > 0


def keeps_without_channel(op: Op) -> bool | None:
    """A collective-permute without a channel is cross-replica: with one replica only the pair (0, 0) names
    one, so each device keeps its own value (True) or receives nothing, zeros (False). None with a channel."""
    if has_channel(op):
        return None
    pairs = op.attrs.get("source_target_pairs")
    if not isinstance(pairs, Literal):
        return False
    return any(int(s) == 0 and int(t) == 0 for s, t in np.asarray(pairs.array, dtype=np.int64).reshape(-1, 2))


def listed_groups(op: Op) -> IntArray | None:
    """The op's `replica_groups` as a [G, S] array, None when it lists none (one group of all)."""
    v = op.attrs.get("replica_groups")
    if isinstance(v, Literal) and v.array.size:
        return np.asarray(v.array, dtype=np.int64).reshape(v.array.shape[0], -1)
    return None


def device_groups(op: Op, devices: int, replicas: int = 1) -> IntArray:
    """`[G, S]` device ids (`replica * partitions + partition`): the groups of `op`, each in the order its
    members' data is combined, by XLA's group modes (module docstring)."""
    parts = devices // replicas
    listed = listed_groups(op)
    if not has_channel(op):
        if replicas == 1:
            return np.arange(devices, dtype=np.int64)[:, None]
        g = listed if listed is not None else np.arange(replicas, dtype=np.int64)[None]
        return (g[None] * parts + np.arange(parts)[:, None, None]).reshape(-1, g.shape[1])
    if bool(op.attrs.get("use_global_device_ids", False)):
        return listed if listed is not None else np.arange(devices, dtype=np.int64)[None]
    if op.opcode in _NO_GLOBAL_IDS_ATTR or (replicas == 1 and listed is not None and listed.max() >= 1):
        g = listed if listed is not None else np.arange(parts, dtype=np.int64)[None]
        return (np.arange(replicas)[:, None, None] * parts + g[None]).reshape(-1, g.shape[1])
    g = listed if listed is not None else np.arange(replicas, dtype=np.int64)[None]
    return (g[:, :, None] * parts + np.arange(parts)).reshape(g.shape[0], -1)


def canonical_groups(groups: npt.ArrayLike, mesh: Mesh | None = None) -> IntArray:
    """Replica groups with their rows in a canonical order (by the mesh position of their first member,
    or by device id without a mesh): the order of the groups carries no meaning, so mesh inference must
    not read structure into it."""
    g = np.asarray(groups, dtype=np.int64)
    if g.ndim != 2 or g.size == 0:
        return g
    try:
        key = mesh.positions(g[:, 0]) if mesh is not None else g[:, 0]
    except ShardingError:
        key = g[:, 0]
    return g[np.argsort(key, kind="stable")]


def axes_of_groups(groups: npt.ArrayLike, mesh: Mesh, num_devices: int, *, ordered: bool = True) -> tuple[str, ...]:
    """The mesh axes (major first) a [G, S] replica/device group array spans; empty = all devices in id
    order. Groups must be the fibres of those axes, each listed in their mixed-radix order; with
    `ordered=False` (a reduction, where the order of a group's members means nothing) in any order.

    Raises `UnmodelledShardingError` for a legal partition of the devices that is not such fibres (or has
    groups of different sizes), and a plain `ShardingError` for a list that is no partition of the devices
    or for fibres listed out of shard order."""
    g = np.asarray(groups, dtype=np.int64)
    if g.size == 0:
        g = np.arange(num_devices, dtype=np.int64).reshape(1, -1)
    if g.ndim == 2 and mesh.size == num_devices and (g < 0).any() and is_partition(g, num_devices):
        raise UnmodelledShardingError(None, f"replica groups {preview_groups(g)} are of different sizes: a legal "
                                      "partition of the devices (all-reduce) but not the fibres of any mesh "
                                      "axes, which is all this tool models")
    if g.ndim != 2 or mesh.size != num_devices or g.size != num_devices or \
            not np.array_equal(np.sort(g, axis=None), np.arange(num_devices)):
        raise ShardingError(None, f"replica groups {preview_devices(g)}: expected a [groups, size] array "
                            f"using each of the {num_devices} devices of mesh {mesh.describe()} once")
    if g.shape[1] == 1:
        return ()
    pos = mesh.positions(g)
    members = g
    if not ordered:  # each group as a set: its members in mesh order
        members = np.take_along_axis(g, np.argsort(pos, axis=1, kind="stable"), axis=1)
        pos = np.sort(pos, axis=1)
    # The order of the groups themselves carries no meaning; only the order inside a group does.
    rows = members[np.argsort(pos[:, 0], kind="stable")]
    found = factor(rows, mesh)
    if found is not None:
        return found[1]
    as_set = factor(mesh.device_array().ravel()[position_forms(pos)[1]], mesh)
    if as_set is not None:
        raise ShardingError(None, f"replica groups {preview_devices(g)} hold the devices of mesh axes "
                            f"{list(as_set[1])} but not in the mixed-radix order of any ordering of them: "
                            "group order does not match the shard order")
    # A legal partition of the devices all the same: not bad input, and no evidence of a bug either.
    raise UnmodelledShardingError(None, f"replica groups {preview_groups(g)} are not the fibres of any set of "
                                  f"axes of mesh {mesh.describe()} (every group the devices differing only in "
                                  "some axes): a legal partition of the devices this tool does not model")


def pairs_are_complete_permutation(pairs: npt.ArrayLike, num_devices: int) -> bool:
    """Whether source→target pairs send from every device exactly once and to every device exactly once."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    iota = np.arange(num_devices)
    return p.shape[0] == num_devices and all(np.array_equal(np.sort(p[:, k]), iota) for k in (0, 1))


def _indices_along(pairs: npt.ArrayLike, mesh: Mesh,
                   axes: Sequence[str]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The (source, target) indices (mixed radix over `axes`) of source→target pairs in which every device
    sends and receives at most once and every other mesh coordinate is kept; else None."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if not len(p) or any(len(np.unique(p[:, k])) != len(p) for k in (0, 1)):
        return None
    try:
        src, dst = mesh.coords(p[:, 0]), mesh.coords(p[:, 1])
    except ShardingError:
        return None
    others = [i for i, name in enumerate(mesh.names) if name not in axes]
    if (src[:, others] != dst[:, others]).any():
        return None
    return mesh.linear_index(src, axes), mesh.linear_index(dst, axes)


def block_sources(pairs: npt.ArrayLike, mesh: Mesh, axes: Sequence[str]) -> npt.NDArray[np.int64] | None:
    """`src` with `src[j]` the index (mixed radix over `axes`) whose data the device at index `j` receives
    (-1: none, it receives zeros), when the indices over `axes` move alike in every fibre (see
    `_indices_along`); else None."""
    moved = _indices_along(pairs, mesh, axes)
    if moved is None:
        return None
    n = mesh.size_of(axes)
    out = np.full(n, -1, dtype=np.int64)
    for s, t in zip(*moved, strict=True):
        if out[t] not in (-1, s):
            return None  # another permutation in another fibre
        out[t] = s
    return out if len(moved[0]) == mesh.size // n * int((out >= 0).sum()) else None


def axis_shift(pairs: npt.ArrayLike, mesh: Mesh, axes: Sequence[str]) -> tuple[int, bool] | None:
    """(k, cyclic) when the pairs send every device to the one k places later along the mixed-radix index
    of `axes` (other coordinates equal): all such pairs (`cyclic`: modulo the axes' size, otherwise only
    those that stay in range, the ends receiving nothing); else None. For a cyclic shift, k is the one of
    the two equivalent shifts of least magnitude."""
    moved = _indices_along(pairs, mesh, axes)
    n = mesh.size_of(axes)
    if moved is None or n < 2:
        return None
    step = moved[1] - moved[0]
    k = int(step[0])
    if k != 0 and (step == k).all() and len(step) == mesh.size // n * (n - abs(k)):
        return k, False
    wrapped = step % n
    if len(step) == mesh.size and wrapped[0] != 0 and (wrapped == wrapped[0]).all():
        k = int(wrapped[0])
        return (k if 2 * k <= n else k - n), True
    return None


def axes_of_pairs(pairs: npt.ArrayLike, mesh: Mesh) -> tuple[str, ...] | None:
    """The mesh axes along which source→target pairs move data (those where some pair's coordinates
    differ), in mesh order; None when a pair names a device outside the mesh."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    try:
        src, dst = mesh.coords(p[:, 0]), mesh.coords(p[:, 1])
    except ShardingError:
        return None
    return tuple(mesh.names[i] for i in np.flatnonzero((src != dst).any(axis=0)).tolist())


def shift_of_pairs(pairs: npt.ArrayLike, mesh: Mesh) -> tuple[str, int] | None:
    """(axis, k) when the pairs are the cyclic shift by k (0 < k < size) along one mesh axis; else None
    (also for the identity, and for a shift along an axis that refinement split: see `cyclic_shift`)."""
    shift = cyclic_shift(pairs, mesh)
    if shift is None or len(shift[0]) != 1:
        return None
    return shift[0][0], shift[1]


def cyclic_shift(pairs: npt.ArrayLike, mesh: Mesh) -> tuple[tuple[str, ...], int] | None:
    """(axes, k) when the pairs shift cyclically by k along the mixed-radix index of `axes`, a run of
    consecutive mesh axes that are parts of one original axis (e.g. ("tp:(1)2", "tp:(2)2") for a shift
    along "tp" after refinement); else None (also for the identity)."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if not pairs_are_complete_permutation(p, mesh.size):
        return None
    try:
        src, dst = mesh.coords(p[:, 0]), mesh.coords(p[:, 1])
    except ShardingError:  # device ids the mesh does not have: not a shift on this mesh
        return None
    moving = np.flatnonzero((src != dst).any(axis=0)).tolist()
    if not moving or moving != list(range(moving[0], moving[-1] + 1)):
        return None
    run = tuple(mesh.names[i] for i in moving)
    if len({split_axis_name(n)[0] for n in run}) != 1:
        return None  # a shift carrying from one axis into another is not a shift along either
    k = (mesh.linear_index(dst, run) - mesh.linear_index(src, run)) % mesh.size_of(run)
    return (run, int(k[0])) if (k == k[0]).all() else None


def match_axis_index(values: npt.ArrayLike, mesh: Mesh) -> tuple[tuple[str, ...], int] | None:
    """(axes, scale) when `values[device] == scale * linear_index(coords(device), axes)`; ((), 0) when
    all values are zero; else None."""
    v = np.asarray(values, dtype=np.int64).ravel()
    grid_ids = mesh.device_array()
    if v.size != mesh.size or (grid_ids.size and int(grid_ids.max()) >= v.size):
        return None
    grid = v[grid_ids]
    if not grid.any():
        return (), 0
    if grid.flat[0] != 0:
        return None
    terms: list[tuple[int, int, int]] = []  # (coefficient, axis index, size)
    for i, (_, s) in enumerate(mesh.axes):
        if s > 1:
            unit = tuple(1 if k == i else 0 for k in range(len(mesh.axes)))
            if (coef := int(grid[unit])) != 0:
                terms.append((coef, i, s))
    terms.sort()
    for (c0, _, s0), (c1, _, _) in itertools.pairwise(terms):
        if c1 != c0 * s0:
            return None
    if not terms or terms[0][0] < 1:
        return None
    expected = np.zeros(mesh.shape, dtype=np.int64)
    for coef, i, s in terms:
        shape = [s if k == i else 1 for k in range(grid.ndim)]
        expected += (np.arange(s, dtype=np.int64) * coef).reshape(shape)
    if not np.array_equal(expected, grid):
        return None
    return tuple(mesh.names[i] for _, i, _ in reversed(terms)), terms[0][0]



def varying_axes(values: npt.ArrayLike, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes along which per-device values (leading dim: device id, any shape per device) change,
    in mesh order."""
    v = np.asarray(values)
    grid = v[mesh.device_array().reshape(-1)].reshape((*mesh.shape, *v.shape[1:]))
    return tuple(name for i, name in enumerate(mesh.names) if not np.all(grid == np.take(grid, [0], axis=i)))


def block_table(values: npt.ArrayLike, mesh: Mesh, scale: int) -> tuple[tuple[str, ...], npt.NDArray[np.int64]] | None:
    """(axes, blocks) when a partition-id table of offsets reads `values[device] == scale · blocks[i]`, `i` the
    device's index (mixed radix) over `axes`, the axes along which the values change (in mesh order; any other
    order only renames `blocks`); None when some value is not a multiple of `scale` or none changes."""
    v = np.asarray(values, dtype=np.int64).ravel()
    grid_ids = mesh.device_array()
    if scale < 1 or v.size != mesh.size or (grid_ids.size and int(grid_ids.max()) >= v.size) or (v % scale).any():
        return None
    axes = varying_axes(v, mesh)
    if not axes:
        return None
    # Constant along every other axis: the table read at coordinate 0 of those.
    fibre = (v[grid_ids] // scale)[tuple(slice(None) if n in axes else 0 for n in mesh.names)]
    return axes, fibre.reshape(-1).astype(np.int64)


def match_axis_permutation(values: npt.ArrayLike, mesh: Mesh,
                           scale: int) -> tuple[tuple[str, ...], npt.NDArray[np.int64]] | None:
    """(axes, perm) when `values[device] == scale * perm[linear_index(coords(device), axes)]` with `perm` a
    permutation of range(size of `axes`) (`block_table`): a partition-id table naming a block per device that
    is not the device's own (the tutorial's collective matmuls read block `(i + k) mod n`); else None."""
    table = block_table(values, mesh, scale)
    if table is None or not np.array_equal(np.sort(table[1]), np.arange(table[1].size)):
        return None
    return table


_RELAYOUTS_TRIED = 4096  # candidate layouts at most: a mesh has a handful of axes, so this is never reached


def relaid_by_pairs(pairs: npt.ArrayLike, mesh: Mesh, layout: Layout) -> Layout | None:
    """The layout, other than `layout`, under which every device holds exactly the block it receives when
    each device sends its block under `layout` along the source→target pairs; None when there is none.

    Such a permute changes no value, only where its blocks live: XLA's partitioner writes one to move a
    value from one order of mesh axes on a dim to another (`[fsdp, tp]` → `[tp, fsdp]`), or between dims,
    where each device keeps its shape. Candidates split every dim into as many blocks as `layout` does,
    over any distinct mesh axes; the pairs must be a permutation of all devices (each device is checked, so
    no block goes unreceived). A partial value is not taken (its summands would have to stay in groups)."""
    p = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    if layout.partial or not pairs_are_complete_permutation(p, mesh.size):
        return None
    try:
        src_coords, dst_coords = mesh.coords(p[:, 0]), mesh.coords(p[:, 1])
    except ShardingError:
        return None

    def blocks(lay: Layout, coords: IntArray) -> IntArray:
        return np.stack([mesh.linear_index(coords, axes) if axes else np.zeros(len(coords), dtype=np.int64)
                         for axes in lay.dims], axis=-1) if lay.dims else np.zeros((len(coords), 0), np.int64)

    want = blocks(layout, src_coords)
    counts = [mesh.size_of(axes) for axes in layout.dims]
    for n, dims in enumerate(_splits(mesh, counts)):
        if n >= _RELAYOUTS_TRIED:
            return None
        candidate = Layout(dims)
        if candidate != layout and np.array_equal(blocks(candidate, dst_coords), want):
            return candidate
    return None


def _splits(mesh: Mesh, counts: Sequence[int]) -> Iterator[tuple[tuple[str, ...], ...]]:
    """Every assignment of ordered tuples of distinct mesh axes to dims with the given block counts."""
    sizes = dict(mesh.axes)

    def fill(i: int, free: frozenset[str]) -> Iterator[tuple[tuple[str, ...], ...]]:
        if i == len(counts):
            yield ()
            return
        for k in range(len(free) + 1):
            for axes in itertools.permutations(sorted(free), k):
                if math.prod(sizes[a] for a in axes) == counts[i]:
                    for rest in fill(i + 1, free - set(axes)):
                        yield (axes, *rest)

    return fill(0, frozenset(sizes))
