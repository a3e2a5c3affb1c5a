"""A module made ready for verification: inlined entry, its form, its mesh, its entry layouts.

Forms: `global` (single-device semantics: the reference, or any pre-partitioning module), `spmd` (XLA's
per-device code after the SPMD partitioner: the entry is renamed `*_spmd`, parameters are local shards)
and `manual` (StableHLO of a jitted `shard_map`: global outside `sdy.manual_computation`, per-device
inside). The mesh is the one common mesh every device list of the module factors through (DESIGN §3),
named after the before module's `sdy.mesh` when there is one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ShardingError, Span, UnmodelledShardingError
from scalify_hlo.ir.inline import inline
from scalify_hlo.ir.nodes import Attrs, Func, Module, Op, TensorType, walk
from scalify_hlo.layout.groups import canonical_groups, has_channel, listed_groups
from scalify_hlo.layout.inference import infer_mesh, layout_on
from scalify_hlo.layout.mesh import Layout, Mesh, split_axis_name
from scalify_hlo.layout.sharding import (
    SdySharding,
    Sharding,
    Tiled,
    TupleSharding,
    layout_of,
    mesh_from_sdy,
    parse_gspmd,
    parse_sdy,
)
from scalify_hlo.layout.tables import offset_groups

COLLECTIVES = frozenset({
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
    "collective_broadcast", "cross-replica-sum",
})


@dataclass(frozen=True, slots=True, eq=False)
class Program:
    module: Module
    func: Func
    form: str  # "global" | "spmd" | "manual"
    mesh: Mesh
    in_layouts: tuple[Layout | None, ...]  # declared by annotations (None: none); spmd params default to replicated
    out_layouts: tuple[Layout | None, ...]

    @property
    def path(self) -> str:
        return self.module.path


def sharding_of(attrs: Attrs, where: Span | None = None) -> Sharding | None:
    """The sharding annotation in an attribute dictionary (GSPMD string or Shardy attribute), if any."""
    if "mhlo.sharding" in attrs:
        return parse_gspmd(str(attrs["mhlo.sharding"]), where)
    if "sdy.sharding" in attrs:
        return parse_sdy(str(attrs["sdy.sharding"]))
    return None


def per_value_shardings(text: str) -> tuple[SdySharding, ...]:
    """`#sdy.sharding_per_value<[<@mesh, [...]>, ...]>` → one Shardy sharding per value."""
    sdy = _jaxlib.dialects()["sdy"]
    ir = _jaxlib.ir()
    with _jaxlib.make_context():
        attr = sdy.TensorShardingPerValueAttr(ir.Attribute.parse(text))
        return tuple(parse_sdy(str(s)) for s in attr.shardings)


def manual_axes(text: str) -> tuple[str, ...]:
    sdy = _jaxlib.dialects()["sdy"]
    ir = _jaxlib.ir()
    with _jaxlib.make_context():
        attr = sdy.ManualAxesAttr(ir.Attribute.parse(text))
        return tuple(str(attr[i]) for i in range(len(attr)))


def form_of(module: Module, func: Func) -> str:
    if any(op.opcode == "manual_computation" for op in walk(func.body.ops)):
        return "manual"
    entry = str(module.extra.get("entry_computation", ""))
    if module.kind == "hlo" and (entry.endswith("_spmd") or _has_spmd_ops(func)):
        return "spmd"
    return "global"


def _has_spmd_ops(func: Func) -> bool:
    return any(op.opcode in COLLECTIVES or op.opcode == "partition_id" for op in walk(func.body.ops))


def _device_arrays(module: Module, func: Func,
                   hint: Mesh | None = None) -> Iterator[tuple[np.ndarray, str, bool]]:
    """Every device list of the module that a mesh should factor, with whether it may be left out: tile
    assignments (required) and replica groups (optional: any partition of the devices is legal, and the
    collective of groups the mesh cannot express is reported `unknown`), and the devices that share a
    dynamic-slice offset (optional, like replica groups: `tables.py`). Each list once, named by its first
    use: a model repeats a few shardings and groups on thousands of ops, each list as long as the mesh."""
    def from_sharding(s: Sharding | None, label: str) -> Iterator[tuple[np.ndarray, str, bool]]:
        if isinstance(s, Tiled):
            yield s.devices.array, label, False
        elif isinstance(s, TupleSharding):
            for i, e in enumerate(s.elements):
                yield from from_sharding(e, f"{label}[{i}]")

    where = Span(module.path)
    seen: set[object] = set()

    def shardings(attrs: Attrs, of: str | Op) -> Iterator[tuple[np.ndarray, str, bool]]:
        text = str(attrs["mhlo.sharding"]) if "mhlo.sharding" in attrs else None
        if text is not None and text not in seen:
            seen.add(text)
            yield from from_sharding(parse_gspmd(text, where), f"sharding of {of if isinstance(of, str) else of.describe()}")

    # With several replicas, group ids are replica or flattened ids, not partitions: no mesh of partitions
    # to read from them (the engine reports such programs unknown; they must not be bad input on the way).
    partitions_only = module.num_replicas == 1
    for i, attrs in enumerate(func.arg_attrs):
        yield from shardings(attrs, f"parameter {i}")
    for i, attrs in enumerate(func.result_attrs):
        yield from shardings(attrs, f"result {i}")
    for op in walk(func.body.ops):
        yield from shardings(op.attrs, op)
        listed = listed_groups(op)
        if partitions_only and listed is not None and has_channel(op):
            key = (listed.shape, listed.tobytes())
            if key not in seen:
                seen.add(key)
                yield canonical_groups(listed, hint), f"replica groups of {op.describe()}", True
    if partitions_only and module.num_partitions > 1:
        for groups in offset_groups(func, module.num_partitions):
            key = (groups.shape, groups.tobytes())
            if key not in seen:
                seen.add(key)
                yield canonical_groups(groups, hint), "devices sharing a dynamic-slice offset", True


def used_meshes(module: Module) -> tuple[tuple[str, str], ...]:
    """The module's `sdy.mesh`es less the empty one (no axes, no devices: JAX's `@empty_mesh` for a scalar
    argument of a jitted shard_map, whose sharding on it says only "replicated"), unless it is the only one."""
    kept = tuple((name, text) for name, text in module.meshes
                 if mesh_from_sdy(text).axes or mesh_from_sdy(text).device_ids is not None)
    return kept or module.meshes


def module_mesh(module: Module, func: Func, hint: Mesh | None = None) -> Mesh:
    """The module's own `sdy.mesh`, else one inferred from its device lists (refining `hint`)."""
    if module.meshes:
        meshes = used_meshes(module)
        if len(meshes) > 1:  # legal Shardy (JAX adds maximal meshes, for one): not modelled, so unknown
            names = ", ".join(sorted(m for m, _ in meshes))
            raise UnmodelledShardingError(Span(module.path), f"{len(meshes)} meshes ({names}); "
                                          "only modules with one sdy.mesh are modelled")
        return mesh_from_sdy(meshes[0][1])
    num = module.num_partitions
    arrays = list(_device_arrays(module, func, hint if hint is not None and hint.size == num else None))
    if hint is not None and hint.size == num:
        base: Mesh | None = hint
    else:
        base = None
    if not arrays:
        return base or Mesh((("axis_0", num),) if num > 1 else ())
    return infer_mesh([a for a, _, _ in arrays], num, base, labels=[label for _, label, _ in arrays],
                      span=Span(module.path), optional=[opt for _, _, opt in arrays])


def _layout(s: Sharding | None, mesh: Mesh, t: object, where: str, path: str) -> Layout | None:
    if s is None or not isinstance(t, TensorType):
        return None
    try:
        return layout_of(s, mesh, t.rank)
    except ShardingError as err:
        raise type(err)(Span(path), f"{where}: {err.message}") from None  # (unmodelled stays unmodelled)


def prepare(module: Module, hint: Mesh | None = None) -> Program:
    func = inline(module)
    form = form_of(module, func)
    mesh = module_mesh(module, func, hint)
    ins = tuple(
        _layout(sharding_of(a), mesh, p.type, f"sharding of parameter {i}", module.path)
        for i, (a, p) in enumerate(zip(func.arg_attrs, func.params, strict=True)))
    outs = tuple(
        _layout(sharding_of(a), mesh, v.type, f"sharding of result {i}", module.path)
        for i, (a, v) in enumerate(zip(func.result_attrs, func.outputs, strict=True)))
    return Program(module, func, form, mesh, ins, outs)


def prepare_against(module: Module, reference: Program) -> Program:
    """`module` (a partitioned program) prepared beside the one-device `reference` it was compiled from:
    the reference's mesh names its axes when the module has none, and a parameter without a sharding is
    laid out as the reference's in_sharding says. XLA of jax 0.11+ keeps no sharding on the partitioned
    module's parameters; jit handed it the reference's, like the outputs."""
    prog = prepare(module, hint=reference.mesh if reference.mesh.size == module.num_partitions else None)
    if prog.form != "spmd" or not _refines(prog.mesh, reference.mesh):
        return prog

    def filled(own: tuple[Layout | None, ...], theirs: tuple[Layout | None, ...]) -> tuple[Layout | None, ...]:
        if len(own) != len(theirs):
            return own
        return tuple(a if a is not None else layout_on(b, prog.mesh) if b is not None else None
                     for a, b in zip(own, theirs, strict=True))

    return dataclasses.replace(prog, in_layouts=filled(prog.in_layouts, reference.in_layouts),
                               out_layouts=filled(prog.out_layouts, reference.out_layouts))


def _refines(mesh: Mesh, reference: Mesh) -> bool:
    """Whether `mesh` is `reference` with some axes split into sub-axes in place (mesh inference refines
    the reference's mesh where the partitioner's device lists cut an axis): the same devices in the same
    order, its layouts readable on `mesh` (`layout_on`)."""
    if mesh == reference:
        return True
    bases = list(dict.fromkeys(split_axis_name(n)[0] for n in mesh.names))
    return (bases == list(reference.names) and mesh.base_sizes() == dict(reference.axes)
            and mesh.device_ids == reference.device_ids)


def manual_layouts(op: Op, mesh: Mesh) -> tuple[tuple[Layout, ...], tuple[Layout, ...], tuple[str, ...]]:
    """In/out layouts and manual axes of an `sdy.manual_computation` (a shard_map)."""
    ins = per_value_shardings(str(op.attrs["in_shardings"]))
    outs = per_value_shardings(str(op.attrs["out_shardings"]))
    axes = manual_axes(str(op.attrs["manual_axes"])) if "manual_axes" in op.attrs else mesh.names
    in_l = tuple(layout_of(s, mesh, v.tensor.rank) for s, v in zip(ins, op.operands, strict=True))
    out_l = tuple(layout_of(s, mesh, v.tensor.rank) for s, v in zip(outs, op.results, strict=True))
    return in_l, out_l, axes
