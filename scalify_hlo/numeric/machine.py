"""The numeric oracle: a NumPy interpreter of the common IR with every device simulated at once.

Every value carries a LEADING DEVICE AXIS: `[D, *tensor shape]`, D = 1 for a single-device program and
D = number of devices for SPMD code, so one NumPy call runs an op on all devices (elementwise ops
broadcast, `dot_general` takes the device axis as a batch dim, collectives exchange data along it with
fancy indexing). Values equal on all devices may be `np.broadcast_to` views: kernels never write into
their operands. Device index `d` along that axis is the logical device id, `replica * partitions +
partition`.

Entry points: `run` (stacked per-device inputs and outputs), `run_before` (the single-device reference),
`run_after` (a partitioned module or a jitted `shard_map`, global inputs in and global outputs out),
`shard`/`assemble` (global value ↔ per-device stack under a `Layout`); random inputs and the comparison of
outputs are in `trials.py`.
The kernels live in `kernels.py` (the table the op registry fills, and the elementwise ops),
`kernels_shape.py`, `kernels_index.py`, `kernels_collective.py`, `kernels_conv.py`, `kernels_linalg.py`
and `kernels_rng.py`; which opcode runs which is written in `ops/registry.py`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from typing import Any, Protocol

import numpy as np

from scalify_hlo.ir.errors import MismatchError, ShardingError
from scalify_hlo.ir.nodes import Func, Module, Op, Region, TensorType, Value, walk
from scalify_hlo.layout import boundary
from scalify_hlo.layout.inference import infer_mesh, mesh_axes_of
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer
from scalify_hlo.layout.program import manual_layouts, module_mesh, sharding_of, used_meshes
from scalify_hlo.layout.sharding import Tiled, layout_of, mesh_from_sdy
from scalify_hlo.numeric.kernels import kernel_of
from scalify_hlo.numeric.values import NumericUnsupported, Val, as_array, dtype_of, np_dtype
from scalify_hlo.ops.reducers import identity

# ---------------------------------------------------------------------------------------- interpreter

class Trace(Protocol):
    """Watches an execution (localisation, `prove/origin.py`): every op run and every region entered, with
    the values, on every machine of the run (a shard_map body's too; not a reducer's scalar body)."""

    def began(self, machine: Machine, op: Op) -> None: ...

    def ran(self, machine: Machine, op: Op, args: Sequence[Val], outs: Sequence[Val]) -> None: ...

    def entered(self, machine: Machine, region: Region, args: Sequence[Val]) -> None: ...


TRACE: ContextVar[Trace | None] = ContextVar("scalify_numeric_trace", default=None)


class Machine:
    """One simulated execution: `devices` instances of a program run in lock step along axis 0."""

    __slots__ = ("cache", "devices", "env", "module", "replicas", "trace")

    def __init__(self, module: Module | None, devices: int, replicas: int = 1,
                 cache: dict[int, tuple[Op, np.ndarray]] | None = None) -> None:
        if devices < 0 or replicas < 1 or devices % replicas:
            raise ValueError(f"{devices} devices do not split into {replicas} replicas")
        self.module = module
        self.devices = devices
        self.replicas = replicas
        # id(constant op) → (op, array); holding the op keeps its id from being reused by another op.
        self.cache: dict[int, tuple[Op, np.ndarray]] = {} if cache is None else cache
        self.env: dict[Value, Val] = {}
        self.trace = TRACE.get()

    @property
    def partitions(self) -> int:
        return self.devices // self.replicas

    def run_func(self, func: Func, args: Sequence[Val]) -> list[Val]:
        saved, self.env = self.env, {}
        try:
            return self.region(func.body, args)
        finally:
            self.env = saved

    def call(self, name: str, args: Sequence[Val], op: Op) -> list[Val]:
        if self.module is None or name not in self.module.funcs:
            raise NumericUnsupported(op, f"callee @{name} is not a function of the module")
        return self.run_func(self.module.funcs[name], args)

    def region(self, region: Region, args: Sequence[Val]) -> list[Val]:
        """Evaluate `region` in the current scope (nested regions may use values defined outside)."""
        if len(args) != len(region.args):
            raise ValueError(f"region takes {len(region.args)} arguments, got {len(args)}")
        env = self.env
        env.update(zip(region.args, args, strict=True))
        if self.trace is not None:
            self.trace.entered(self, region, args)
        for op in region.ops:
            self._exec(op)
        return [env[v] for v in region.results]

    def scalar_region(self, region: Region, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Apply a region over scalars (a reducer, comparator, update computation) to whole arrays at once:
        the broadcast elements of `args` become the device axis of a sub-machine."""
        shape = np.broadcast_shapes(*(a.shape for a in args))
        n = math.prod(shape)
        if n == 0:
            return [np.zeros(shape, dtype_of(v)) for v in region.results]
        flat = [np.broadcast_to(a, shape).reshape(n) for a in args]
        sub = Machine(self.module, n, 1, self.cache)
        sub.trace = None  # (elements of one op, not values of the program)
        return [as_array(o).reshape(shape) for o in sub.region(region, flat)]

    def manual(self, op: Op, args: Sequence[Val]) -> list[Val]:
        """`sdy.manual_computation` (a shard_map) run from a global (D = 1) context: operands are sliced
        by `in_shardings`, the body runs on every device of the mesh, results are assembled."""
        if self.devices != 1:
            raise NumericUnsupported(op, "a manual computation inside per-device code")
        mesh = _sdy_mesh(self.module, op)
        ins, outs, axes = manual_layouts(op, mesh)
        manual = {a for name in axes for a in _axes_named(name, mesh)}
        sub = Machine(self.module, mesh.size, 1, self.cache)
        local: list[Val] = []
        for x, layout, arg in zip(args, ins, op.regions[0].args, strict=True):
            stacked = shard(as_array(x)[0], _restrict(layout, manual), mesh)
            if stacked.shape[1:] != arg.tensor.shape:
                raise NumericUnsupported(op, f"operand shards have shape {list(stacked.shape[1:])}, the body "
                                         f"expects {list(arg.tensor.shape)}")
            local.append(stacked)
        results = sub.region(op.regions[0], local)
        return [assemble(as_array(r), _restrict(layout, manual), mesh, res.tensor.shape)[None]
                for r, layout, res in zip(results, outs, op.results, strict=True)]

    def boundary(self, op: Op, args: Sequence[Val], entering: bool) -> list[Val]:
        """A GSPMD shard_map's boundary (`layout/boundary.py`), the module running on every device of its
        mesh with global values replicated (`run_after`): entering, each device takes its shard of its
        (identical) copy; leaving, the shards are assembled and every device holds the whole."""
        if self.module is None or len(args) != 1:
            raise NumericUnsupported(op, "a shard_map boundary outside a module")
        mesh = module_mesh(self.module, self.module.main)
        if mesh.size != self.devices:
            raise NumericUnsupported(op, f"a shard_map boundary run on {self.devices} devices; its mesh has "
                                     f"{mesh.size}")
        x = as_array(args[0])
        try:
            if entering:
                layout = boundary.entering(op, boundary.annotated_values(self.module).get(op.operands[0]), mesh)
                return [shard(x[0], layout, mesh)]
            whole = assemble(x, boundary.leaving(op, mesh), mesh, op.results[0].tensor.shape)
        except ShardingError as err:
            raise NumericUnsupported(op, err.message) from None
        return [np.broadcast_to(whole, (self.devices, *whole.shape))]

    def _exec(self, op: Op) -> None:
        kernel = kernel_of(op.opcode)
        if kernel is None:
            raise NumericUnsupported(op, "no numeric kernel for this opcode")
        try:
            args = [self.env[v] for v in op.operands]
        except KeyError:
            raise NumericUnsupported(op, "an operand is not defined in the evaluated scope") from None
        if self.trace is not None:
            self.trace.began(self, op)
        try:
            outs = kernel(self, op, args)
        except (NumericUnsupported, ShardingError):
            raise
        except (ValueError, IndexError, TypeError, KeyError, AttributeError, OverflowError, AssertionError,
                ZeroDivisionError) as err:
            raise NumericUnsupported(op, f"its kernel failed ({type(err).__name__}: {err})") from err
        if len(outs) != len(op.results):
            raise NumericUnsupported(op, f"its kernel returned {len(outs)} values for {len(op.results)} "
                                     "results")
        for v, out in zip(op.results, outs, strict=True):
            if isinstance(v.type, TensorType):
                a = as_array(out)
                if a.shape != (self.devices, *v.type.shape) or a.dtype != np_dtype(v.type.dtype):
                    raise NumericUnsupported(op, f"its kernel produced {a.dtype}{list(a.shape)} for "
                                             f"{v.type} on {self.devices} devices")
            self.env[v] = out
        if self.trace is not None:
            self.trace.ran(self, op, args, outs)


def _sdy_mesh(module: Module | None, op: Op) -> Mesh:
    meshes = dict(module.meshes) if module is not None else {}
    text = str(op.attrs.get("in_shardings", "")) + str(op.attrs.get("out_shardings", ""))
    used = [name for name in meshes if f"@{name}," in text or f"@{name}>" in text]
    if len(used) != 1 and len(meshes) != 1:
        raise NumericUnsupported(op, f"its shardings name {len(used)} of the module's meshes "
                                 f"({', '.join(meshes) or 'none'}); expected exactly one")
    return mesh_from_sdy(meshes[used[0] if len(used) == 1 else next(iter(meshes))])


def _axes_named(name: str, mesh: Mesh) -> tuple[str, ...]:
    return mesh_axes_of(name, mesh)


def _restrict(layout: Layout, axes: set[str]) -> Layout:
    """Only the manual axes split a shard_map operand; the others stay global inside the body."""
    return Layout(tuple(tuple(a for a in d if a in axes) for d in layout.dims),
                  tuple(p for p in layout.partial if p[0] in axes))


def run(func_or_module: Func | Module, inputs: Sequence[np.ndarray], devices: int = 1, *,
        module: Module | None = None, replicas: int = 1) -> list[np.ndarray]:
    """Run a function on `devices` simulated devices. Inputs and outputs are per-device stacks
    `[devices, *shape]`; `call`s resolve through `module` (or the module given as first argument)."""
    if isinstance(func_or_module, Module):
        module, func = func_or_module, func_or_module.main
    else:
        func = func_or_module
    if len(inputs) != len(func.params):
        raise MismatchError(None, f"@{func.name} takes {len(func.params)} inputs, got {len(inputs)}")
    args: list[Val] = []
    for i, (x, p) in enumerate(zip(inputs, func.params, strict=True)):
        a = np.asarray(x)
        if a.shape != (devices, *p.tensor.shape):
            raise MismatchError(None, f"input {i} of @{func.name} has shape {list(a.shape)}, expected "
                                f"{[devices, *p.tensor.shape]} ({p.type} on {devices} devices)")
        args.append(a.astype(dtype_of(p), copy=False))
    machine = Machine(module, devices, replicas)
    with np.errstate(all="ignore"):  # XLA semantics: overflow wraps, 0/0 is NaN; no warnings
        outs = machine.run_func(func, args)
    return [np.ascontiguousarray(as_array(o)) for o in outs]


# ------------------------------------------------------------------------------------ shard / assemble

_REDUCE: dict[Reducer, Callable[..., np.ndarray]] = {
    Reducer.SUM: np.sum, Reducer.PROD: np.prod, Reducer.MAX: np.max, Reducer.MIN: np.min,
    Reducer.AND: np.all, Reducer.OR: np.any,
}


def shard(global_array: np.ndarray, layout: Layout, mesh: Mesh) -> np.ndarray:
    """`[mesh.size, *local]`: device d's shard of a global value (uneven splits padded with zeros; a value
    partial over axes sits at coordinate 0 of them, the reducer's identity elsewhere)."""
    x = np.asarray(global_array)
    n = mesh.size
    if not layout.split_axes() and not layout.partial:
        return np.broadcast_to(x[None], (n, *x.shape))
    local = layout.local_shape(x.shape, mesh)
    parts = [mesh.size_of(d) for d in layout.dims]
    pad = [(0, loc * p - s) for loc, p, s in zip(local, parts, x.shape, strict=True)]
    if any(hi for _, hi in pad):
        x = np.pad(x, pad)
    coords = mesh.coords(np.arange(n))
    index: list[np.ndarray] = []
    for i, (axes, loc) in enumerate(zip(layout.dims, local, strict=True)):
        start = mesh.linear_index(coords, axes) * loc
        shape = [n] + [loc if k == i else 1 for k in range(x.ndim)]
        index.append((start[:, None] + np.arange(loc)).reshape(shape))
    out = x[tuple(index)] if index else np.broadcast_to(x[None], (n,))
    if layout.partial:
        away = np.zeros(n, dtype=bool)
        for a, _ in layout.partial:
            away |= coords[:, mesh.axis_index(a)] != 0
        out = np.array(out, copy=True)
        out[away] = identity(layout.partial[0][1], out.dtype)  # one reducer per value in practice
    return out


def assemble(stacked: np.ndarray, layout: Layout, mesh: Mesh,
             shape: Sequence[int] | None = None) -> np.ndarray:
    """The global value of a per-device stack: replicated axes read at coordinate 0 (like `np.asarray` of a
    jax.Array), partial axes combined with their reducer, shards concatenated, padding cut to `shape`."""
    x = np.asarray(stacked)
    split = [a for d in layout.dims for a in d]
    partial = [a for a, _ in layout.partial]
    rest = [a for a in mesh.names if a not in split and a not in partial]
    grid = mesh.device_array().transpose([mesh.axis_index(a) for a in (*split, *partial, *rest)])
    grid = grid.reshape(*grid.shape[:len(split) + len(partial)], -1)[..., 0]
    data = x[grid]  # [*split sizes, *partial sizes, *local]
    for k in reversed(range(len(partial))):
        reducer = layout.partial[k][1]
        data = _REDUCE[reducer](data, axis=len(split) + k).astype(x.dtype, copy=False)
    rank = layout.rank
    parts = [mesh.size_of(d) for d in layout.dims]
    local = x.shape[1:]
    data = data.reshape((*parts, *local))
    data = data.transpose([j for i in range(rank) for j in (i, rank + i)])
    full = data.reshape([p * s for p, s in zip(parts, local, strict=True)])
    if shape is not None:
        full = full[tuple(slice(0, s) for s in shape)]
    return np.array(full)  # (not ascontiguousarray: it turns a 0-d result into 1-d)


# ------------------------------------------------------------------------------------- before / after

def run_before(module: Module, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The reference: global inputs, one device, global outputs (or every device of its mesh, alike, when it
    calls a shard_map under GSPMD: its boundary custom calls shard per device)."""
    if boundary.is_gspmd_manual(module):
        return _run_replicated(module, inputs)
    return [o[0] for o in run(module, [np.asarray(x)[None] for x in inputs], 1)]


def _run_replicated(module: Module, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A global program whose shard_map body runs per device between two custom calls: on every device with
    the global values replicated (all devices compute them alike)."""
    n = module_mesh(module, module.main).size
    return [o[0] for o in run(module, [np.broadcast_to(np.asarray(x)[None], (n, *np.shape(x))) for x in inputs], n)]


def is_shard_map(module: Module) -> bool:
    return any(op.opcode == "manual_computation" for f in module.funcs.values() for op in walk(f.body.ops))


def spmd_mesh(module: Module) -> Mesh:
    """The mesh of a partitioned module: its `sdy.mesh`, else inferred from every device list in it, else
    (when replica groups do not factor, e.g. a mutated program) from its entry shardings alone."""
    try:
        return module_mesh(module, module.main)
    except ShardingError:
        f = module.main
        tiles = [s.devices.array for a in (*f.arg_attrs, *f.result_attrs)
                 if isinstance(s := sharding_of(a), Tiled)]
        return infer_mesh(tiles, module.num_partitions)


def entry_layouts(attrs: Sequence[Any], values: Sequence[Value], mesh: Mesh) -> list[Layout | None]:
    """The layout each entry parameter/result annotation (`mhlo.sharding` or `sdy.sharding`) declares."""
    out: list[Layout | None] = []
    for a, v in zip(attrs, values, strict=True):
        s = sharding_of(a)
        out.append(None if s is None else layout_of(s, mesh, v.tensor.rank))
    return out


def run_after(module: Module, inputs: Sequence[np.ndarray], mesh: Mesh | None = None,
              in_layouts: Sequence[Layout] | None = None, out_layouts: Sequence[Layout] | None = None,
              out_shapes: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
    """The distributed program on global inputs, giving global outputs.

    A jitted shard_map (StableHLO with `sdy.manual_computation`) runs globally, its manual computations on
    all devices of their mesh. A partitioned module (entry parameters are local shards) runs on
    `mesh.size` devices: inputs are sharded by `in_layouts` (default: the entry `mhlo.sharding`s,
    replicated where there is none) and outputs assembled by `out_layouts` (default: the result
    shardings; partitioned HLO often has none, then the caller must pass them) cut to `out_shapes`."""
    if is_shard_map(module):
        return run_before(module, inputs)
    if boundary.is_gspmd_manual(module):
        return _run_replicated(module, inputs)
    f = module.main
    mesh = mesh or spmd_mesh(module)
    if module.num_partitions > 1 and mesh.size != module.num_partitions:
        raise ShardingError(None, f"mesh {mesh.describe()} has {mesh.size} devices, the module is "
                            f"partitioned {module.num_partitions} ways")
    ins = list(in_layouts) if in_layouts is not None else [
        lay or Layout.replicated(p.tensor.rank) for lay, p in zip(entry_layouts(f.arg_attrs, f.params, mesh),
                                                                  f.params, strict=True)]
    if out_layouts is not None:
        outs = list(out_layouts)
    else:
        declared = entry_layouts(f.result_attrs, f.outputs, mesh)
        if any(lay is None for lay in declared):
            raise ShardingError(None, f"{module.path}: result {declared.index(None)} has no sharding "
                                "annotation; pass out_layouts")
        outs = [lay for lay in declared if lay is not None]
    stacked = [shard(np.asarray(x), lay, mesh) for x, lay in zip(inputs, ins, strict=True)]
    results = run(module, stacked, mesh.size)
    shapes = list(out_shapes) if out_shapes is not None else [None] * len(results)
    return [assemble(r, lay, mesh, s) for r, lay, s in zip(results, outs, shapes, strict=True)]


def run_pair(before: Module, after: Module, inputs: Sequence[np.ndarray]) -> tuple[list[np.ndarray],
                                                                                   list[np.ndarray]]:
    """Both programs on the same global inputs. A partitioned `after` whose parameters or results carry
    no sharding takes their layouts from those of `before` (on `before`'s mesh when it has one), and one
    whose local shape is the global one is read as replicated. (XLA of jax 0.11+ keeps no sharding at
    all on the module after SPMD partitioning: there every layout comes from `before`.)"""
    ref = run_before(before, inputs)
    if is_shard_map(after) or boundary.is_gspmd_manual(after):
        return ref, run_after(after, inputs)
    mesh = spmd_mesh(after)
    if len(meshes := used_meshes(before)) == 1:
        named = mesh_from_sdy(meshes[0][1])
        mesh = named if named.size == mesh.size else mesh
    f, b = after.main, before.main
    ins = _boundary_layouts(after, "parameter", f.arg_attrs, f.params, b.arg_attrs, b.params,
                            [np.shape(x) for x in inputs], mesh)
    outs = _boundary_layouts(after, "result", f.result_attrs, f.outputs, b.result_attrs, b.outputs,
                             [r.shape for r in ref], mesh)
    return ref, run_after(after, inputs, mesh, in_layouts=ins, out_layouts=outs, out_shapes=[r.shape for r in ref])


def _boundary_layouts(after: Module, what: str, attrs: Sequence[Any], values: Sequence[Value],
                      ref_attrs: Sequence[Any], ref_values: Sequence[Value], shapes: Sequence[tuple[int, ...]],
                      mesh: Mesh) -> list[Layout]:
    """The layouts of the after program's parameters or results: declared, else the reference's sharding
    hints, else replicated when the local shape is the global one."""
    declared = entry_layouts(attrs, values, mesh)
    try:
        hinted = entry_layouts(ref_attrs, ref_values, mesh)
    except ShardingError:
        hinted = [None] * len(declared)
    out: list[Layout] = []
    for i, (d, h, shape, v) in enumerate(zip(declared, hinted, shapes, values, strict=True)):
        if d is None and h is None and v.tensor.shape != tuple(shape):
            raise ShardingError(None, f"{after.path}: {what} {i} is a {list(v.tensor.shape)} shard of a "
                                f"{list(shape)} value and neither program says how it is split")
        out.append(d or h or Layout.replicated(len(shape)))
    return out
