"""Device meshes and layouts: one model for every device list a module mentions.

A `Mesh` names the axes of the device grid and fixes which device sits at each mesh position. Every device
list of a module (tile assignments, replica groups, permute pairs, partition-id tables) is read as a
function of mesh coordinates, so the prover reasons about axes, never about individual devices.

The one idea behind all of it: a device array *factors through* a mesh when it is the mesh's device grid
with its axes permuted and consecutive axes merged into the array's dimensions. Working on mesh positions
(not device ids), such an array is `iota.reshape(r).transpose(p).reshape(shape)`; its "digits" (size,
position stride) are recovered with a few vectorised NumPy passes per array dimension, so the cost does
not grow with the number of devices beyond a linear NumPy scan. Inference (`infer_mesh`) collects the
strides at which arrays cut the position space and refines mesh axes into Shardy-style sub-axes
(`tp:(1)2`, `tp:(2)2`: pre-size, size; the pre-size-1 part is the major one).

Sharding values, their parsing and `layout_of` live in `sharding.py`; mesh inference and the factoring
of device arrays in `inference.py`; this module holds meshes, layouts and Shardy sub-axis names.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
import numpy.typing as npt

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ops.reducers import Reducer

IntArray: TypeAlias = npt.NDArray[np.int64]
Digit: TypeAlias = tuple[int, int]  # (size, stride in mesh positions)


def sub_axis_name(base: str, pre_size: int, size: int) -> str:
    """Shardy's name for the part of axis `base` of `size` whose more-major parts multiply to `pre_size`."""
    return f"{base}:({pre_size}){size}"


def split_axis_name(name: str) -> tuple[str, int, int | None]:
    """(base, pre-size, size) of an axis name; size is None for a whole axis (its size is the mesh's)."""
    base, sep, rest = name.rpartition(":(")
    pre, close, size = rest.partition(")")
    if sep and close and pre.isdigit() and size.isdigit():
        return base, int(pre), int(size)
    return name, 1, None


def preview_devices(arr: npt.ArrayLike, limit: int = 12) -> str:
    """A short rendering of a device array for messages: shape and the first ids."""
    a = np.asarray(arr)
    flat = a.ravel()[:limit].tolist()
    more = ", ..." if a.size > limit else ""
    return f"shape {list(a.shape)} [{', '.join(map(str, flat))}{more}]"


def preview_groups(groups: npt.ArrayLike, limit: int = 4, members: int = 16) -> str:
    """Replica groups as HLO prints them, `{{0,1},{2,3}}` (the -1 padding of uneven groups dropped), the
    first `limit` groups of at most `members` ids each: what the user finds in the file."""
    g = np.asarray(groups, dtype=np.int64)
    rows = g.reshape(g.shape[0], -1) if g.ndim >= 1 and g.size else np.zeros((0, 0), dtype=np.int64)
    out = []
    for row in rows[:limit]:
        ids = [int(x) for x in row if x >= 0]
        out.append("{" + ",".join(map(str, ids[:members])) + (",..." if len(ids) > members else "") + "}")
    return "{" + ",".join(out) + (",..." if len(rows) > limit else "") + "}"


def is_partition(groups: npt.ArrayLike, num_devices: int) -> bool:
    """Whether the ids of `groups` (-1 entries are the padding of uneven groups) name every device of
    0..num_devices-1 exactly once: what XLA's verifier requires of replica groups."""
    g = np.asarray(groups, dtype=np.int64).ravel()
    ids = g[g >= 0]
    return ids.size == num_devices and bool(np.array_equal(np.sort(ids), np.arange(num_devices)))


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named axes (major → minor) and the device id at each row-major mesh position (None = iota)."""

    axes: tuple[tuple[str, int], ...]
    device_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        axes = tuple((str(n), int(s)) for n, s in self.axes)
        object.__setattr__(self, "axes", axes)
        names = [n for n, _ in axes]
        if len(set(names)) != len(names) or any(s < 1 for _, s in axes):
            raise ShardingError(None, f"mesh {self.describe()}: expected distinct axis names and sizes >= 1")
        if self.device_ids is None:
            return
        ids = np.asarray(self.device_ids, dtype=np.int64).ravel()
        if ids.size != self.size or (ids.size and (ids.min() < 0 or np.unique(ids).size != ids.size)):
            raise ShardingError(
                None, f"mesh {self.describe()}: expected {self.size} distinct non-negative device ids, "
                f"got {preview_devices(ids)}")
        # Normalise so that equal meshes compare equal whichever way the iota order was spelled.
        object.__setattr__(self, "device_ids", None if np.array_equal(ids, np.arange(ids.size)) else
                           tuple(ids.tolist()))

    @property
    def size(self) -> int:
        return math.prod(s for _, s in self.axes)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def strides(self) -> tuple[int, ...]:
        """Per axis, the step in mesh position (row-major) between neighbours along it."""
        return tuple(math.prod(self.shape[i + 1:]) for i in range(len(self.axes)))

    def axis_index(self, name: str) -> int:
        for i, (n, _) in enumerate(self.axes):
            if n == name:
                return i
        raise ShardingError(None, f"axis {name!r} is not in mesh {self.describe()}; expected one of "
                            f"{', '.join(self.names) or '(no axes)'}")

    def axis_size(self, name: str) -> int:
        return self.axes[self.axis_index(name)][1]

    def size_of(self, axes: Iterable[str]) -> int:
        return math.prod(self.axis_size(a) for a in axes)

    def device_array(self) -> IntArray:
        """The device id at every mesh position, shaped like the mesh (read-only)."""
        return _device_grid(self)

    def positions(self, devices: npt.ArrayLike) -> IntArray:
        """Row-major mesh position of each device id (same shape as `devices`)."""
        d = np.asarray(devices, dtype=np.int64)
        inv = _inverse(self)
        bad = (d < 0) | (d >= inv.size)
        pos = inv[np.where(bad, 0, d)]
        if bad.any() or (pos < 0).any():
            raise ShardingError(None, f"device list {preview_devices(d)} names devices outside mesh "
                                f"{self.describe()}")
        return pos

    def coords(self, devices: npt.ArrayLike) -> IntArray:
        """Mesh coordinates of each device: shape `devices.shape + (len(axes),)`."""
        pos = self.positions(devices)
        if not self.axes:
            return np.zeros((*pos.shape, 0), dtype=np.int64)
        return np.stack(np.unravel_index(pos, self.shape), axis=-1).astype(np.int64)

    def linear_index(self, coords_or_devices: npt.ArrayLike, axes: Sequence[str], *,
                     devices: bool = False) -> IntArray:
        """Mixed-radix index over `axes` (first = major). Input is coords (last dim = mesh axes) unless
        `devices=True`, in which case it is device ids (an int array cannot say which it is)."""
        c = self.coords(coords_or_devices) if devices else np.asarray(coords_or_devices, dtype=np.int64)
        if c.ndim == 0 or c.shape[-1] != len(self.axes):
            raise ShardingError(None, f"coordinates of shape {list(c.shape)}: expected a last dim of "
                                f"{len(self.axes)} for mesh {self.describe()} (devices=True for device ids)")
        out = np.zeros(c.shape[:-1], dtype=np.int64)
        for a in axes:
            out = out * self.axis_size(a) + c[..., self.axis_index(a)]
        return out

    def block_indices(self, axes: Sequence[str]) -> IntArray:
        """For each device id, which block it holds of a dim split over `axes` (its index along them)."""
        return self.linear_index(np.arange(self.size), axes, devices=True)

    def describe(self) -> str:
        text = "[" + ", ".join(f'"{n}"={s}' for n, s in self.axes) + "]"
        if self.device_ids is not None:
            ids = ", ".join(map(str, self.device_ids[:16])) + (", ..." if len(self.device_ids) > 16 else "")
            text += f", device_ids=[{ids}]"
        return text

    def base_sizes(self) -> dict[str, int]:
        """Full size of every original axis, sub-axes multiplied back together."""
        out: dict[str, int] = {}
        for n, s in self.axes:
            base = split_axis_name(n)[0]
            out[base] = out.get(base, 1) * s
        return out

    def pieces(self, base: str) -> list[tuple[str, int, int]]:
        """(name, pre-size, size) of the mesh axes that make up original axis `base`, major first."""
        return [(n, split_axis_name(n)[1], s) for n, s in self.axes if split_axis_name(n)[0] == base]


@functools.lru_cache(maxsize=256)
def _inverse(mesh: Mesh) -> IntArray:
    if mesh.device_ids is None:
        inv = np.arange(mesh.size, dtype=np.int64)
    else:
        ids = np.asarray(mesh.device_ids, dtype=np.int64)
        inv = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        inv[ids] = np.arange(ids.size)
    inv.setflags(write=False)
    return inv


@functools.lru_cache(maxsize=256)
def _device_grid(mesh: Mesh) -> IntArray:
    ids = np.arange(mesh.size) if mesh.device_ids is None else np.asarray(mesh.device_ids)
    grid = ids.astype(np.int64).reshape(mesh.shape)
    grid.setflags(write=False)
    return grid


def _render_axes(names: Sequence[str], mesh: Mesh | None) -> list[str]:
    parts: list[tuple[str, int, int | None]] = []
    for n in names:
        base, pre, size = split_axis_name(n)
        if mesh is not None and size is None and n in mesh.names:
            size = mesh.axis_size(n)
        prev = parts[-1] if parts else None
        # Consecutive parts of one axis read as one (sub-)axis: what the user wrote, not how it was refined.
        if mesh is not None and prev and prev[0] == base and prev[2] and size and prev[1] * prev[2] == pre:
            parts[-1] = (base, prev[1], prev[2] * size)
        else:
            parts.append((base, pre, size))
    full = mesh.base_sizes() if mesh is not None else {}
    return [f'"{b}"' if s is None or (p == 1 and s == full.get(b)) else f'"{b}":({p}){s}'
            for b, p, s in parts]


_NORMAL_LAYOUTS: set[tuple[object, object]] = set()  # (dims, partial) of layouts built normal and valid


@dataclass(frozen=True, slots=True)
class Layout:
    """How a global tensor lives on devices: per dim the mesh axes splitting it (major → minor), the axes
    still to be combined with a reducer (sorted by name); every other mesh axis is replicated."""

    dims: tuple[tuple[str, ...], ...]
    partial: tuple[tuple[str, Reducer], ...] = ()

    def __post_init__(self) -> None:
        # (Built tens of thousands of times per program, from a few hundred distinct values: those seen
        # normal and valid are known by their hash; only the others are normalised and checked.)
        try:
            if (self.dims, self.partial) in _NORMAL_LAYOUTS:
                return
        except TypeError:  # lists: not normal yet
            pass
        dims = self.dims
        if type(dims) is not tuple or any(type(d) is not tuple for d in dims):
            object.__setattr__(self, "dims", dims := tuple(tuple(d) for d in dims))
        partial = self.partial
        if type(partial) is not tuple or len(partial) > 1:
            object.__setattr__(self, "partial", partial := tuple(sorted(partial, key=lambda p: p[0])))
        used = [a for d in dims for a in d]
        used += [a for a, _ in partial]
        if len(used) > 1 and len(set(used)) != len(used):
            raise ShardingError(None, f"layout {self.describe()} uses a mesh axis twice; expected each axis "
                                "at most once across the dims and the partial set")
        _NORMAL_LAYOUTS.add((dims, partial))

    @staticmethod
    def replicated(rank: int) -> Layout:
        return Layout(((),) * rank)

    @property
    def rank(self) -> int:
        return len(self.dims)

    @property
    def is_resolved(self) -> bool:
        return not self.partial

    def split_axes(self) -> frozenset[str]:
        return frozenset(a for d in self.dims for a in d)

    def partial_axes(self) -> frozenset[str]:
        return frozenset(a for a, _ in self.partial)

    def local_shape(self, global_shape: Sequence[int], mesh: Mesh) -> tuple[int, ...]:
        """Per-device shape; uneven splits round up (the last shards carry padding)."""
        if len(global_shape) != self.rank:
            raise ShardingError(None, f"layout {self.describe(mesh)} has rank {self.rank}, "
                                f"expected a shape of that rank, got {list(global_shape)}")
        return tuple(-(-int(n) // mesh.size_of(d)) for n, d in zip(global_shape, self.dims, strict=True))

    def with_partial(self, axes: Iterable[str], reducer: Reducer) -> Layout:
        current = dict(self.partial)
        for a in axes:
            if current.get(a, reducer) is not reducer:
                raise ShardingError(None, f"layout {self.describe()}: axis {a!r} is already partial "
                                    f"({current[a].value}), expected no reducer or {reducer.value}")
            current[a] = reducer
        return Layout(self.dims, tuple(current.items()))

    def without_partial(self, axes: Iterable[str]) -> Layout:
        drop = set(axes)
        return Layout(self.dims, tuple(p for p in self.partial if p[0] not in drop))

    def describe(self, mesh: Mesh | None = None) -> str:
        text = "[" + ", ".join("{" + ", ".join(_render_axes(d, mesh)) + "}" for d in self.dims) + "]"
        if not self.partial:
            return text
        rendered: list[str] = []
        for reducer in dict.fromkeys(r for _, r in self.partial):
            axes = [a for a, r in self.partial if r is reducer]
            if mesh is not None:  # in mesh order, so that the parts of one axis merge back into it
                axes.sort(key=lambda a: mesh.axis_index(a) if a in mesh.names else len(mesh.axes))
            rendered += [f"{a}:{reducer.value}" for a in _render_axes(axes, mesh)]
        return text + " partial{" + ", ".join(rendered) + "}"
