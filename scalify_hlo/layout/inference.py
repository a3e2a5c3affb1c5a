"""Mesh inference: the mesh whose axes every device list of a module factors through.

A device array *factors through* a mesh when it is the mesh's device grid with its axes permuted and
consecutive axes merged into the array's dimensions. Working on mesh positions (not device ids), such an
array is `iota.reshape(r).transpose(p).reshape(shape)`; its "digits" (size, position stride) are recovered
with a few vectorised NumPy passes per array dimension, so the cost does not grow with the number of
devices beyond a linear NumPy scan. `infer_mesh` collects the strides at which arrays cut the position
space and refines mesh axes into Shardy-style sub-axes (`tp:(1)2`, `tp:(2)2`: pre-size, size; the
pre-size-1 part is the major one); `factor` reads a device array as mesh axes per dimension.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from scalify_hlo.ir.errors import ShardingError, Span, UnmodelledShardingError
from scalify_hlo.layout.mesh import (
    Digit,
    IntArray,
    Layout,
    Mesh,
    is_partition,
    preview_devices,
    split_axis_name,
    sub_axis_name,
)


def _digits(pos: IntArray) -> tuple[tuple[Digit, ...], ...] | None:
    """Per dim of `pos` (mesh positions), its digits (size, position stride), major first, if `pos` is
    `iota.reshape(r).transpose(p).reshape(pos.shape)`; else None. Digits adjacent in both the array and
    the position space are merged, so only real cut points are reported."""
    if pos.size == 0 or pos.flat[0] != 0:
        return None
    per_dim: list[tuple[Digit, ...]] = []
    for j, s in enumerate(pos.shape):  # loops over dims and digits (at most log2 N), never over devices
        line = pos[(0,) * j + (slice(None),) + (0,) * (pos.ndim - j - 1)]
        digits: list[Digit] = []
        block = 1
        while block < s:
            vals = line[::block]
            stride = int(vals[1])
            ok = vals == np.arange(vals.size, dtype=np.int64) * stride
            run = vals.size if ok.all() else int(np.argmin(ok))
            if stride <= 0 or (s // block) % run:
                return None
            digits.append((run, stride))
            block *= run
        per_dim.append(tuple(reversed(digits)))
    expect = 1
    for size, stride in sorted((d for dim in per_dim for d in dim), key=lambda d: d[1]):
        if stride != expect:
            return None
        expect *= size
    if expect != pos.size or not np.array_equal(_compose(pos.shape, per_dim), pos):
        return None
    return tuple(per_dim)


def _compose(shape: tuple[int, ...], per_dim: Sequence[Sequence[Digit]]) -> IntArray:
    out = np.zeros(shape, dtype=np.int64)
    for j, (s, digits) in enumerate(zip(shape, per_dim, strict=True)):
        idx = np.arange(s, dtype=np.int64)
        contrib = np.zeros(s, dtype=np.int64)
        block = 1
        for size, stride in reversed(digits):
            contrib += (idx // block) % size * stride
            block *= size
        out += contrib.reshape([s if k == j else 1 for k in range(len(shape))])
    return out


# Keyed by the array bytes (32 KiB at 4096 devices), so the bound also bounds memory.
@functools.lru_cache(maxsize=512)
def _digits_cached(shape: tuple[int, ...], data: bytes) -> tuple[tuple[Digit, ...], ...] | None:
    return _digits(np.frombuffer(data, dtype=np.int64).reshape(shape))


def _digits_of(pos: IntArray) -> tuple[tuple[Digit, ...], ...] | None:
    return _digits_cached(tuple(pos.shape), np.ascontiguousarray(pos, dtype=np.int64).tobytes())


def cuts_of(mesh: Mesh) -> frozenset[int]:
    """The mesh positions' strides at which axes start, plus the size: refinement adds to this set."""
    return frozenset((*mesh.strides, mesh.size))


def factor(devices: npt.ArrayLike, mesh: Mesh) -> tuple[tuple[str, ...], ...] | None:
    """Per dim of `devices`, the mesh axes varying along it (major → minor) when `devices` is the mesh's
    device grid with axes permuted and merged into its dims; None when it is not (or needs refinement)."""
    arr = np.ascontiguousarray(devices, dtype=np.int64)
    return _factor_cached(mesh, tuple(arr.shape), arr.tobytes())


@functools.lru_cache(maxsize=512)
def _factor_cached(mesh: Mesh, shape: tuple[int, ...], data: bytes) -> tuple[tuple[str, ...], ...] | None:
    arr = np.frombuffer(data, dtype=np.int64).reshape(shape)
    if arr.size != mesh.size:
        return None
    try:
        pos = mesh.positions(arr)
    except ShardingError:
        return None
    digits = _digits_of(pos)
    if digits is None:
        return None
    cuts = cuts_of(mesh)
    axes = [(n, st) for (n, s), st in zip(mesh.axes, mesh.strides, strict=True) if s > 1]
    out: list[tuple[str, ...]] = []
    for dim in digits:
        names: list[str] = []
        for size, stride in dim:
            if stride not in cuts or stride * size not in cuts:
                return None  # the digit covers part of a mesh axis: the mesh must be refined first
            names.extend(n for n, st in axes if stride <= st < stride * size)
        out.append(tuple(names))
    return tuple(out)


def refine(mesh: Mesh, cuts: Iterable[int]) -> Mesh:
    """`mesh` with every axis split at the `cuts` inside it (a divisor chain), parts named as sub-axes."""
    cut_list = sorted(set(cuts))
    new_axes: list[tuple[str, int]] = []
    for (name, size), stride in zip(mesh.axes, mesh.strides, strict=True):
        inner = [c for c in reversed(cut_list) if stride < c < stride * size]
        if not inner:
            new_axes.append((name, size))
            continue
        base, pre, _ = split_axis_name(name)
        bounds = [stride * size, *inner, stride]
        for hi, lo in itertools.pairwise(bounds):
            new_axes.append((sub_axis_name(base, pre, hi // lo), hi // lo))
            pre *= hi // lo
    return Mesh(tuple(new_axes), mesh.device_ids)


def is_chain(cuts: Iterable[int]) -> bool:
    c = sorted(set(cuts))
    return all(b % a == 0 for a, b in itertools.pairwise(c))


def infer_mesh(device_arrays: Sequence[npt.ArrayLike], num_devices: int, hint: Mesh | None = None, *,
               labels: Sequence[str] | None = None, span: Span | None = None,
               optional: Sequence[bool] | None = None) -> Mesh:
    """The coarsest refinement of `hint` (or, without one, of the order the device lists imply, axes named
    axis_0, axis_1, ...) through which every array factors. An array that only factors as a set of groups
    along its last dim (replica groups listed in another order) contributes those sets: whether their order
    is right is for `axes_of_groups` to judge, as a discrepancy rather than bad input. `labels` name the
    arrays in errors.

    `optional` marks arrays that may be left out: replica groups, for which any partition of the devices
    is a legal program. One that no refinement fits (not the fibres of any axes, or groups of different
    sizes) does not shape the mesh; its collective is then `unknown` (`axes_of_groups`), not bad input.
    Tile assignments that share no mesh are legal too, but nothing can be modelled without one:
    `UnmodelledShardingError`, which is `unknown` as well."""
    arrays = [np.asarray(a, dtype=np.int64) for a in device_arrays]
    names = list(labels) if labels is not None else [f"device list #{i}" for i in range(len(arrays))]
    skippable = list(optional) if optional is not None else [False] * len(arrays)
    iota = np.arange(num_devices, dtype=np.int64)
    present: list[tuple[IntArray, str, bool]] = []
    for a, label, opt in zip(arrays, names, skippable, strict=True):
        if not a.size:
            continue
        if opt and (a < 0).any() and is_partition(a, num_devices):
            continue  # uneven groups (legal for all-reduce): the fibres of no axes, so they shape nothing
        if a.size != num_devices or not np.array_equal(np.sort(a, axis=None), iota):
            raise ShardingError(span, f"{label} ({preview_devices(a)}) is not an ordering of all "
                                f"{num_devices} devices; expected every device exactly once")
        present.append((a, label, opt))
    if hint is not None:
        if hint.size != num_devices:
            raise ShardingError(span, f"mesh {hint.describe()} has {hint.size} devices, "
                                f"expected {num_devices}")
        return _refine_through(hint, present, span)
    by_id = Mesh((("axis_0", num_devices),) if num_devices > 1 else ())
    try:
        mesh = _refine_through(by_id, present, span)
    except ShardingError:
        if not present or _digits_of(present[0][0]) is not None:
            raise
        # Not in id order: then the first list itself says which device sits where.
        first = Mesh((("axis_0", num_devices),), tuple(present[0][0].ravel().tolist()))
        mesh = _refine_through(first, present, span)
    return Mesh(tuple((f"axis_{i}", s) for i, (_, s) in enumerate(mesh.axes)), mesh.device_ids)


def _refine_through(base: Mesh, arrays: Sequence[tuple[IntArray, str, bool]], span: Span | None) -> Mesh:
    try:
        return _refine_in_order(base, arrays, span)
    except ShardingError:
        if not any(opt for _, _, opt in arrays):
            raise
        # Optional groups met first may have cut the mesh where a later tile assignment does not: then
        # the tile assignments decide, and the groups fit in where they can.
        return _refine_in_order(base, sorted(arrays, key=lambda x: x[2]), span)


def _refine_in_order(base: Mesh, arrays: Sequence[tuple[IntArray, str, bool]], span: Span | None) -> Mesh:
    cuts = set(cuts_of(base))
    for a, label, opt in arrays:
        for form in position_forms(base.positions(a)):
            digits = _digits_of(form)
            new = cuts | {stride for dim in digits or () for _, stride in dim}
            if digits is not None and is_chain(new):
                cuts = new
                break
        else:
            if opt:
                continue  # legal groups no refinement fits: left to `axes_of_groups` (unknown)
            raise UnmodelledShardingError(
                span, f"{label} ({preview_devices(a)}) does not factor through mesh "
                f"{refine(base, cuts).describe()} nor any refinement of it: no common mesh for the device lists")
    return refine(base, cuts)


def position_forms(pos: IntArray) -> tuple[IntArray, IntArray]:
    """`pos` as given, then read as unordered groups along its last dim (rows and members sorted)."""
    rows = np.sort(pos.reshape(-1, pos.shape[-1] if pos.ndim else 1), axis=1)
    return pos, rows[np.argsort(rows[:, 0], kind="stable")]


def refine_for_axes(mesh: Mesh, axis_names: Iterable[str]) -> Mesh:
    """Refine `mesh` so that every (sub-)axis name in `axis_names` (e.g. Shardy's "tp:(1)2") is a run of
    mesh axes."""
    cuts = set(cuts_of(mesh))
    strides = dict(zip(mesh.names, mesh.strides, strict=True))
    for name in axis_names:
        base, pre, size = split_axis_name(name)
        pieces = mesh.pieces(base)
        if size is None or not pieces:
            continue
        full = math.prod(s for _, _, s in pieces)
        if full % (pre * size):
            raise ShardingError(None, f"sub-axis {name!r} does not divide axis {base!r} of size {full}")
        minor = strides[pieces[-1][0]]
        cuts |= {minor * full // pre, minor * full // (pre * size)}
    if not is_chain(cuts):
        raise ShardingError(None, f"sub-axes {sorted(set(axis_names))} overlap in mesh {mesh.describe()}")
    return refine(mesh, cuts)


def mesh_axes_of(name: str, mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes (major first) that make up axis or sub-axis `name` (e.g. "tp" or "tp:(2)2")."""
    if name in mesh.names:
        return (name,)
    base, pre, size = split_axis_name(name)
    pieces = mesh.pieces(base)
    if not pieces:
        raise ShardingError(None, f"axis {name!r} is not in mesh {mesh.describe()}; expected one of "
                            f"{', '.join(mesh.base_sizes())}")
    hi = pre * (size if size is not None else math.prod(s for _, _, s in pieces))
    inside = tuple(n for n, p, s in pieces if pre <= p and p * s <= hi)
    if math.prod(mesh.axis_size(n) for n in inside) != hi // pre:
        raise ShardingError(None, f"axis {name!r} is not a run of axes of mesh {mesh.describe()}; "
                            "expected the mesh to be refined for it (refine_for_axes)")
    return inside


def layout_on(layout: Layout, mesh: Mesh) -> Layout | None:
    """`layout`, written over the axes of a mesh that `mesh` refines ("tp" as "tp:(1)2", "tp:(2)2": the same
    devices in the same order), over `mesh`'s axes (`mesh_axes_of`; a sum over an axis is the sum over its
    pieces); None when an axis is not a run of `mesh`'s axes."""
    try:
        dims = tuple(tuple(a for n in d for a in mesh_axes_of(n, mesh)) for d in layout.dims)
        partial = tuple((a, r) for n, r in layout.partial for a in mesh_axes_of(n, mesh))
    except ShardingError:
        return None
    return Layout(dims, partial)
