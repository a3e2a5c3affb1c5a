"""Shardings as written in a module, their parsing, and their meaning as a `Layout` on a `Mesh`.

GSPMD strings go through XLA's own parser (`HloSharding.from_string`), Shardy attributes through the MLIR
sdy bindings; nothing here re-implements either grammar.

`HloSharding` accessors are a minefield: several abort the whole process with a C++ CHECK failure when
called on the wrong kind (probed one per subprocess on jaxlib 0.10.2: `tile_assignment_devices`,
`tile_assignment_dimensions`, `num_devices`, `num_dimensions` and `is_tile_assignment_iota` abort on
tuples; `get_axis_sizes` aborts on everything but iota tiles; `tile_assignment_*` abort on a tile whose iota
has the wrong element count, e.g. `{devices=[2,2]<=[3]}`, which `from_string` accepts; `is_tiled()` is true
for tuples and `is_maximal()` for `{replicated}`). `to_proto()` is safe on every parsed value, so we read
only the `OpSharding` proto fields, which are plain data, and validate them ourselves in NumPy.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, assert_never

import numpy as np

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ShardingError, Span, UnmodelledShardingError
from scalify_hlo.ir.tile_text import find_bad_tiles
from scalify_hlo.layout.inference import factor, mesh_axes_of
from scalify_hlo.layout.mesh import IntArray, Layout, Mesh, Reducer, preview_devices, sub_axis_name

SubgroupKind: TypeAlias = Literal["replicated", "manual", "unreduced"]
_SUBGROUP_KINDS = ("replicated", "manual", "unreduced")


# ---------------------------------------------------------------------------------------------- shardings

@dataclass(frozen=True, slots=True, eq=False)
class DeviceArray:
    """A read-only int64 device array that can be hashed and compared (by shape and contents)."""

    array: IntArray

    def __post_init__(self) -> None:
        a = np.array(self.array, dtype=np.int64, copy=True)
        a.setflags(write=False)
        object.__setattr__(self, "array", a)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, DeviceArray) and self.array.shape == other.array.shape
                and self.array.tobytes() == other.array.tobytes())

    def __hash__(self) -> int:
        return hash((self.array.shape, self.array.tobytes()))

    def __repr__(self) -> str:
        return f"DeviceArray({preview_devices(self.array)})"


@dataclass(frozen=True, slots=True)
class Replicated:
    """Every device holds the whole value."""


@dataclass(frozen=True, slots=True)
class Maximal:
    """One device holds the value (`device` is a logical id)."""

    device: int


@dataclass(frozen=True, slots=True)
class Manual:
    """Every mesh axis is manual: the program handles per-device values itself (shard_map)."""


@dataclass(frozen=True, slots=True)
class UnknownSharding:
    """XLA's `{unknown}`: the partitioner may still choose."""


@dataclass(frozen=True, slots=True)
class Tiled:
    """A tile assignment: leading dims are the data dims, the trailing ones subgroup dims of `subgroups`."""

    devices: DeviceArray
    subgroups: tuple[SubgroupKind, ...] = ()

    def __post_init__(self) -> None:
        ndim = self.devices.array.ndim
        if any(k not in _SUBGROUP_KINDS for k in self.subgroups) or len(self.subgroups) > ndim:
            raise ShardingError(None, f"tile assignment {self.devices} with subgroups {self.subgroups}: "
                                f"expected at most {ndim} of {', '.join(_SUBGROUP_KINDS)}")

    @property
    def rank(self) -> int:
        return self.devices.array.ndim - len(self.subgroups)


@dataclass(frozen=True, slots=True)
class TupleSharding:
    """One sharding per element of a tuple-shaped value."""

    elements: tuple[Sharding, ...]


@dataclass(frozen=True, slots=True)
class SdySharding:
    """A Shardy sharding; `mesh` is the symbol name (no '@') or an inline `#sdy.mesh<...>` text.
    Sub-axes are named as in `sub_axis_name`."""

    mesh: str
    dims: tuple[tuple[str, ...], ...]
    replicated: tuple[str, ...] = ()
    unreduced: tuple[str, ...] = ()
    open_dims: tuple[bool, ...] = ()


Sharding: TypeAlias = Replicated | Maximal | Manual | UnknownSharding | Tiled | TupleSharding | SdySharding


# --------------------------------------------------------------------------------------------- layouts

def layout_of(sharding: Sharding, mesh: Mesh, rank: int) -> Layout:
    """The layout a (non-tuple, non-maximal) sharding gives a tensor of `rank` on `mesh`. Manual axes
    (a `Manual` sharding or "manual" subgroup dims) come out replicated: the caller knows they are manual."""
    match sharding:
        case Replicated() | Manual():
            return Layout.replicated(rank)
        case Tiled(devices=devices, subgroups=subgroups):
            if sharding.rank != rank:
                raise ShardingError(None, f"tile assignment {devices} with {len(subgroups)} subgroup dims "
                                    f"is for rank {sharding.rank}, expected rank {rank}")
            axes = factor(devices.array, mesh)
            if axes is None:  # any order of the devices is a legal tile assignment: unmodelled, not bad
                raise UnmodelledShardingError(None, f"tile assignment {devices} does not factor through mesh "
                                              f"{mesh.describe()}; only its device grid with axes permuted "
                                              "is modelled")
            partial = tuple((a, Reducer.SUM) for kind, group in zip(subgroups, axes[rank:], strict=True)
                            if kind == "unreduced" for a in group)
            return Layout(axes[:rank], partial)
        case SdySharding(dims=dims, replicated=replicated, unreduced=unreduced):
            if len(dims) != rank:
                raise ShardingError(None, f"sharding with {len(dims)} dims, expected rank {rank}")
            for name in replicated:
                mesh_axes_of(name, mesh)  # only to reject names the mesh does not have
            return Layout(tuple(tuple(a for n in d for a in mesh_axes_of(n, mesh)) for d in dims),
                          tuple((a, Reducer.SUM) for n in unreduced for a in mesh_axes_of(n, mesh)))
        case Maximal() | UnknownSharding():  # legal on any tensor, but no layout over the mesh: unmodelled
            raise UnmodelledShardingError(None, f"{sharding} has no layout over mesh {mesh.describe()}; only "
                                          "replicated, tiled and Shardy shardings are modelled")
        case TupleSharding():
            raise ShardingError(None, f"{sharding} has no layout over mesh {mesh.describe()}; expected a "
                                "replicated, tiled or Shardy sharding of one tensor")
        case _:
            assert_never(sharding)


def tiled_of(layout: Layout, mesh: Mesh) -> Tiled:
    """The tile assignment of `layout` (the inverse of `layout_of`); partial axes must be SUM."""
    if any(r is not Reducer.SUM for _, r in layout.partial):
        raise ShardingError(None, f"layout {layout.describe(mesh)} has a non-sum partial axis; "
                            "a tile assignment can only express unreduced (sum)")
    partial = [a for a, _ in layout.partial]
    used = {*layout.split_axes(), *partial}
    rest = [n for n in mesh.names if n not in used]
    groups: list[list[str]] = [*[list(d) for d in layout.dims], partial, rest]
    kinds: list[SubgroupKind] = ["unreduced", "replicated"]
    order = [mesh.axis_index(a) for g in groups for a in g]
    sizes = [mesh.size_of(g) for g in groups]
    keep = [True] * layout.rank + [sizes[-2] > 1, sizes[-1] > 1]
    grid = mesh.device_array().transpose(order).reshape(sizes)
    grid = grid.reshape([s for s, k in zip(sizes, keep, strict=True) if k])
    return Tiled(DeviceArray(grid), tuple(k for k, kept in zip(kinds, keep[-2:], strict=True) if kept))


# ------------------------------------------------------------------------------------------------- GSPMD

_EXPECTED_GSPMD = ("expected an HLO sharding such as {replicated}, {maximal device=N}, {manual}, {unknown}, "
                   "{devices=[...]<=[...] ...}, {devices=[...]d0,d1,...} or a tuple {{...}, ...}")
_SUBGROUP_OF_TYPE: dict[str, SubgroupKind] = {"REPLICATED": "replicated", "MANUAL": "manual",
                                              "UNREDUCED": "unreduced"}


def parse_gspmd(text: str, span: Span | None = None) -> Sharding:
    """A GSPMD/HLO sharding string (`{devices=[2,1,4]<=[8] last_tile_dim_replicate}`, tuples, ...)."""
    try:
        return _parse_gspmd_cached(text.strip())
    except ShardingError as e:
        raise type(e)(span, e.message) from None  # (the same class: unmodelled stays unmodelled)


@functools.lru_cache(maxsize=4096)
def _parse_gspmd_cached(text: str) -> Sharding:
    bad = find_bad_tiles(text)
    if bad is not None:  # XLA would abort the process on it
        raise ShardingError(None, f"cannot read sharding {text!r} ({bad.message}); {_EXPECTED_GSPMD}")
    hlo_sharding = _jaxlib.hlo_sharding_class()
    try:
        parsed = hlo_sharding.from_string(text)
    except _jaxlib.XLA_ERRORS as e:
        reason = str(e).strip().splitlines()
        detail = "; ".join(line.strip() for line in reason[:2] if line.strip())
        raise ShardingError(None, f"cannot read sharding {text!r} ({detail}); {_EXPECTED_GSPMD}") from None
    return _from_proto(parsed.to_proto(), text)


def _from_proto(proto: Any, text: str) -> Sharding:
    kind = proto.type.name
    match kind:
        case "TUPLE":
            return TupleSharding(tuple(_from_proto(p, text) for p in proto.tuple_shardings))
        case "REPLICATED":
            return Replicated()
        case "MANUAL":
            return Manual()
        case "UNKNOWN":
            return UnknownSharding()
        case "MAXIMAL":
            devices = list(proto.tile_assignment_devices)
            if len(devices) != 1 or devices[0] < 0:
                raise ShardingError(None, f"sharding {text!r}: expected one non-negative maximal device")
            return Maximal(int(devices[0]))
        case "OTHER":
            return _tiled(proto, text)
        case _:
            # UNREDUCED (every device holds a partial sum of the whole value) has no member in our model:
            # its device count is not in the text. Said plainly rather than guessed.
            raise UnmodelledShardingError(None, f"sharding {text!r} of kind {kind.lower()} is not modelled; "
                                          "expected replicated, maximal, manual, unknown, tiled or a tuple of them")


def _tiled(proto: Any, text: str) -> Tiled:
    dims = [int(d) for d in proto.tile_assignment_dimensions]
    reshape = [int(d) for d in proto.iota_reshape_dims]
    perm = [int(p) for p in proto.iota_transpose_perm]
    count = math.prod(dims)
    if not dims or min(dims) < 1:
        raise ShardingError(None, f"sharding {text!r}: expected positive tile dimensions, got {dims}")
    if reshape:
        if min(reshape) < 1 or math.prod(reshape) != count or sorted(perm) != list(range(len(reshape))):
            raise ShardingError(None, f"sharding {text!r}: iota <={reshape} T{tuple(perm)} does not fill "
                                f"tile dimensions {dims}; expected {count} devices and a permutation")
        devices = np.arange(count, dtype=np.int64).reshape(reshape).transpose(perm).reshape(dims)
    else:
        flat = np.asarray(list(proto.tile_assignment_devices), dtype=np.int64)
        if flat.size != count or flat.min() < 0 or np.unique(flat).size != flat.size:
            raise ShardingError(None, f"sharding {text!r}: expected {count} distinct non-negative devices "
                                f"for tile dimensions {dims}, got {preview_devices(flat)}")
        devices = flat.reshape(dims)
    kinds: list[SubgroupKind] = []
    if proto.replicate_on_last_tile_dim:
        kinds.append("replicated")
    for t in proto.last_tile_dims:
        name = type(proto.type)(t).name
        if name not in _SUBGROUP_OF_TYPE:
            raise ShardingError(None, f"sharding {text!r}: subgroup kind {name.lower()}, expected one of "
                                f"{', '.join(_SUBGROUP_OF_TYPE.values())}")
        kinds.append(_SUBGROUP_OF_TYPE[name])
    return Tiled(DeviceArray(devices), tuple(kinds))


# ------------------------------------------------------------------------------------------------ Shardy

@functools.cache
def _context() -> Any:
    return _jaxlib.make_context()


def _attribute(source: str, what: str, prefix: str) -> Any:
    text = source.strip()
    if not text:  # MLIR's parser segfaults on an empty string (probed in a subprocess)
        raise ShardingError(None, f"empty {what}; expected {prefix}<...>")
    if text.startswith("<"):
        text = prefix + text  # the bare `<...>` spelling of `sdy.mesh @m = <...>` / `in_shardings=[<...>]`
    ir = _jaxlib.ir()
    with _context():
        try:
            return ir.Attribute.parse(text)
        except _jaxlib.mlir_errors() as e:
            detail = " ".join(str(e).split())[:200]
            raise ShardingError(None, f"cannot read {what} {source!r} ({detail})") from None


def _axis_ref_name(ref: Any) -> str:
    sdy = _jaxlib.dialects()["sdy"]
    axis = sdy.AxisRefAttr(ref)
    info = axis.sub_axis_info
    if info is None:
        return str(axis.name)
    sub = sdy.SubAxisInfoAttr(info)
    pre, size = int(sub.pre_size), int(sub.size)
    if pre < 1 or size < 2:
        raise ShardingError(None, f"sub-axis {axis}: expected pre-size >= 1 and size >= 2")
    return sub_axis_name(str(axis.name), pre, size)


def parse_sdy(attr_or_text: Any) -> SdySharding:
    """A Shardy `#sdy.sharding<@mesh, [{"dp"}, {?}], replicated={"z"}>` (text or `ir.Attribute`)."""
    key = attr_or_text if isinstance(attr_or_text, str) else str(attr_or_text)
    return _parse_sdy_cached(key)


@functools.lru_cache(maxsize=4096)
def _parse_sdy_cached(text: str) -> SdySharding:
    sdy = _jaxlib.dialects()["sdy"]
    attr = _attribute(text, "Shardy sharding", "#sdy.sharding")
    with _context():
        if not sdy.TensorShardingAttr.isinstance(attr):
            raise ShardingError(None, f"{text!r} is not a Shardy sharding; "
                                "expected #sdy.sharding<@mesh, [...]>")
        sharding = sdy.TensorShardingAttr(attr)
        ref = sharding.mesh_or_ref
        ir = _jaxlib.ir()
        # A symbol names a module-level `sdy.mesh`; an inline mesh is kept as its own `#sdy.mesh<...>` text.
        mesh = str(ref) if sdy.MeshAttr.isinstance(ref) else str(ir.FlatSymbolRefAttr(ref).value)
        dims = [sdy.DimensionShardingAttr(d) for d in sharding.dimension_shardings]
        return SdySharding(
            mesh=str(mesh),
            dims=tuple(tuple(_axis_ref_name(a) for a in d.axes) for d in dims),
            replicated=tuple(_axis_ref_name(a) for a in sharding.replicated_axes),
            unreduced=tuple(_axis_ref_name(a) for a in sharding.unreduced_axes),
            open_dims=tuple(not d.is_closed for d in dims),
        )


def mesh_from_sdy(attr_or_text: Any) -> Mesh:
    """A `Mesh` from `#sdy.mesh<["dp"=2, "tp"=4]>` (optionally `device_ids=[...]`), text or attribute."""
    key = attr_or_text if isinstance(attr_or_text, str) else str(attr_or_text)
    return _mesh_cached(key)


@functools.lru_cache(maxsize=256)
def _mesh_cached(text: str) -> Mesh:
    sdy = _jaxlib.dialects()["sdy"]
    attr = _attribute(text, "Shardy mesh", "#sdy.mesh")
    with _context():
        if not sdy.MeshAttr.isinstance(attr):
            raise ShardingError(None, f"{text!r} is not a Shardy mesh; "
                                "expected #sdy.mesh<[\"name\"=size, ...]>")
        mesh = sdy.MeshAttr(attr)
        axes = tuple((str(a.name), int(a.size)) for a in (sdy.MeshAxisAttr(x) for x in mesh.axes))
        ids = np.asarray(list(mesh.device_ids), dtype=np.int64)
    return Mesh(axes, tuple(ids.tolist()) if ids.size else None)
