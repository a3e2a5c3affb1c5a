"""Case analysis per device: a shard_map body derived once for each device of a small mesh.

Some bodies compute per device what no layout describes: a mixture of experts routes each device's own
tokens as one group (a cumsum over the local tokens is not a block of any global cumsum), then exchanges
the experts' slots with all_to_all. Derived with partition-id pinned to one device, every value of the
body is a whole tensor of its own (the device's input blocks are slices of the global inputs), and every
collective is a plain function of the devices' terms: an all-reduce folds its group's terms, an
all-gather concatenates them, an all-to-all hands chunk `j` of each member to member `j`, a
collective-permute moves a term along each pair. The results are assembled from the devices' blocks under
the layout the body declares for them.

This is the last fallback for bodies left `unknown`, for meshes of at most `cases.CASE_LIMIT` devices: its
cost is one derivation of the body per device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from scalify_hlo.ir.nodes import Literal, Op, Region, TensorType, Value
from scalify_hlo.layout.groups import device_groups, has_channel
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer
from scalify_hlo.ops.reducers import OP_OF_REDUCER, reducer_of
from scalify_hlo.prove.cases import agree, record_case_terms, run_ops
from scalify_hlo.rules.facts import Fact, Failed, Holds, Varying
from scalify_hlo.terms.slicing import slice_along, slice_of
from scalify_hlo.terms.term import Term

if TYPE_CHECKING:
    from scalify_hlo.prove.derive import Deriver

Combine = Callable[[list["Deriver"], Op], list[tuple[Fact, ...]]]


def derive_per_device(d: Deriver, region: Region, args: Sequence[Fact], declared: Sequence[Layout]
                      ) -> tuple[tuple[Fact, ...], dict[Value, Fact]]:
    """The body's results assembled from every device's derivation, and the merged fact of each value
    inside it (the devices agree on it, or it differs per device)."""
    devices = [int(x) for x in d.mesh.device_array().reshape(-1)]
    cases: list[Deriver] = []
    for dev in devices:
        sub = d.sibling()
        sub.hooks = {**d.hooks, "partition_id": partial(_partition_id, dev)}
        sub.facts = dict(d.facts)
        for v, f in zip(region.args, args, strict=True):
            sub.facts[v] = _block(sub, f, dev)
        cases.append(sub)
    run_ops(cases, region.ops, partial(_along, devices))
    record_case_terms(d, cases, region)
    results = tuple(_assemble(d, [sub.facts[v] for sub in cases], devices, want)
                    for v, want in zip(region.results, declared, strict=True))
    merged: dict[Value, Fact] = {}
    for op in region.ops:
        for v in op.results:
            facts = [sub.lift(sub.facts[v]) for sub in cases]
            if (same := agree(facts)) is not None:
                merged[v] = same
                continue
            merged[v] = next((f for f in facts if isinstance(f, Failed)),
                             Failed("a value that differs from device to device", op, False))
            shown = [f for f in facts if isinstance(f, Holds)]
            if shown:
                d.case_views[v] = shown[-1]
    return results, merged


def _partition_id(dev: int, d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    return (Varying(np.full(d.mesh.size, dev, dtype=np.uint32), op.result.tensor),)


def _block(d: Deriver, f: Fact, dev: int) -> Fact:
    """`f` on device `dev`: the block it holds, a whole value of its own."""
    if not isinstance(f, Holds) or not f.layout.split_axes():
        return f
    if f.layout.partial:
        return Failed("a shard_map operand that is partial", None, False)
    coords = d.mesh.coords(np.array([dev]))[0]
    shape = f.term.type.shape
    lo, hi = [], []
    for k, axes in enumerate(f.layout.dims):
        index = _block_index(d.mesh, coords, axes)
        rows = shape[k] // d.mesh.size_of(axes)
        lo.append(index * rows)
        hi.append((index + 1) * rows)
    return Holds(slice_of(d.terms, f.term, tuple(lo), tuple(hi)), Layout.replicated(len(shape)), f.origin)


def _block_index(mesh: Mesh, coords: np.ndarray, axes: tuple[str, ...]) -> int:
    """Which block of a dim split over `axes` (major first) the device at `coords` holds."""
    index = 0
    for a in axes:
        index = index * mesh.axis_size(a) + int(coords[mesh.axis_index(a)])
    return index


def _assemble(d: Deriver, facts: list[Fact], devices: list[int], declared: Layout) -> Fact:
    """One fact from every device's block of a result declared `declared`: the blocks concatenated (the
    devices that hold the same block must hold the same term)."""
    failed = next((f for f in facts if isinstance(f, Failed)), None)
    if failed is not None:
        return failed
    lifted = [d.lift(f) for f in facts]
    holds = [f for f in lifted if isinstance(f, Holds) and not f.layout.split_axes() and not f.layout.partial]
    if len(holds) != len(facts):
        return Failed("a result that is not a whole tensor on every device", None, False)
    coords = d.mesh.coords(np.array(devices))
    grid: dict[tuple[int, ...], Term] = {}
    for h, c in zip(holds, coords, strict=True):
        index = tuple(_block_index(d.mesh, c, axes) for axes in declared.dims)
        seen = grid.setdefault(index, h.term)
        if seen is not h.term:
            return Failed("devices that hold the same block of a result hold different values", None, False)
    counts = [d.mesh.size_of(axes) for axes in declared.dims]
    whole = _concat_grid(d, grid, counts, holds[0].term.type)
    return Holds(whole, Layout(declared.dims))


def _concat_grid(d: Deriver, grid: dict[tuple[int, ...], Term], counts: list[int], block: TensorType) -> Term:
    """The tensor whose block at grid index `i` is `grid[i]` (innermost dims joined first)."""
    cells = dict(grid)
    shape = list(block.shape)
    for k in reversed(range(len(counts))):
        if counts[k] == 1:
            continue
        shape[k] *= counts[k]
        t = TensorType(tuple(shape), block.dtype)
        joined: dict[tuple[int, ...], Term] = {}
        for rest in {key[:k] + key[k + 1:] for key in cells}:
            parts = tuple(cells[(*rest[:k], i, *rest[k:])] for i in range(counts[k]))
            joined[(*rest[:k], 0, *rest[k:])] = d.terms.apply("concatenate", parts, (("dimension", k),), t)
        cells = joined
    (whole,) = cells.values()
    return whole


# -- collectives between devices -------------------------------------------------------------------------

def _along(devices: list[int], op: Op) -> Combine | None:
    name = op.opcode
    if name == "collective_permute":
        return partial(_permute, devices) if has_channel(op) else None  # (without one: derive.py)
    if name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        return partial(_collective, devices)
    return None


def _groups(op: Op, devices: list[int]) -> list[list[int]] | None:
    if not has_channel(op):
        return None  # cross-replica groups: one replica, every partition alone
    return [[int(x) for x in row] for row in device_groups(op, len(devices))]


def _terms_of(cases: list[Deriver], v: Value) -> list[Term] | Fact:
    out: list[Term] = []
    for c in cases:
        f = c.lift(c.facts[v])
        if isinstance(f, Failed):
            return f
        if not isinstance(f, Holds) or f.layout.split_axes() or f.layout.partial:
            return Failed("a collective of a value that is not whole on every device", None, False)
        out.append(f.term)
    return out


def _collective(devices: list[int], cases: list[Deriver], op: Op) -> list[tuple[Fact, ...]]:
    position = {dev: k for k, dev in enumerate(devices)}
    groups = _groups(op, devices)
    if groups is not None and sorted(g for group in groups for g in group) != sorted(devices):
        groups = None  # not a partition of the devices: nothing to say about who receives what
    out: list[list[Fact]] = [[] for _ in cases]
    for v, res in zip(op.operands, op.results, strict=True):
        terms = _terms_of(cases, v)
        if not isinstance(terms, list) or groups is None:
            bad = terms if isinstance(terms, Failed) else cases[0].ctx.unsupported(
                op, "replica groups that are not a partition of the devices (or cross-replica ones)")
            for o in out:
                o.append(bad)
            continue
        for group in groups:
            members = [terms[position[g]] for g in group]
            for j, g in enumerate(group):
                t = _exchange(cases[0], op, members, j, res.tensor, reducer_of(op.regions[0]) if op.regions else None)
                out[position[g]].append(t)
    return [tuple(o) for o in out]


def _exchange(d: Deriver, op: Op, members: list[Term], j: int, out: TensorType, reducer: Reducer | None) -> Fact:
    """What member `j` of a group receives, given every member's term."""
    terms = d.terms
    name = op.opcode
    if name in ("all_reduce", "reduce_scatter"):
        if reducer is None:
            return d.ctx.unsupported(op, "a reduction whose body is not a single add/max/min/mul/and/or")
        total = members[0]
        for m in members[1:]:
            total = terms.apply(OP_OF_REDUCER[reducer], (total, m), (), total.type)
        if name == "all_reduce":
            return Holds(total, Layout.replicated(out.rank))
        return Holds(_chunk(d, total, int(op.attrs["scatter_dimension"]), len(members), j),  # type: ignore[arg-type]
                     Layout.replicated(out.rank))
    if name == "all_gather":
        dim = int(op.attrs["all_gather_dim"])  # type: ignore[arg-type]
        return Holds(terms.apply("concatenate", tuple(members), (("dimension", dim),), out), Layout.replicated(out.rank))
    split, concat = int(op.attrs["split_dimension"]), int(op.attrs["concat_dimension"])  # type: ignore[arg-type]
    pieces = tuple(_chunk(d, m, split, len(members), j) for m in members)
    return Holds(terms.apply("concatenate", pieces, (("dimension", concat),), out), Layout.replicated(out.rank))


def _chunk(d: Deriver, t: Term, dim: int, n: int, j: int) -> Term:
    rows = t.type.shape[dim] // n
    return slice_along(d.terms, t, dim, j * rows, (j + 1) * rows)


def _permute(devices: list[int], cases: list[Deriver], op: Op) -> list[tuple[Fact, ...]]:
    position = {dev: k for k, dev in enumerate(devices)}
    pairs = op.attrs.get("source_target_pairs")
    if not isinstance(pairs, Literal):
        return [tuple(c.ctx.unsupported(op, "a permute without pairs") for _ in op.results) for c in cases]
    source: dict[int, int] = {}
    for s, t in np.asarray(pairs.array, dtype=np.int64).reshape(-1, 2):
        source[int(t)] = int(s)
    out: list[tuple[Fact, ...]] = []
    for dev, c in zip(devices, cases, strict=True):
        row: list[Fact] = []
        for v, res in zip(op.operands, op.results, strict=True):
            if dev not in source:
                zeros = c.terms.mk("nothing_received", (), (("site", op.loc.name or str(id(op))),), res.tensor)
                row.append(Holds(zeros, Layout.replicated(res.tensor.rank)))
                continue
            sender = cases[position[source[dev]]]
            f = sender.lift(sender.facts[v])
            if isinstance(f, Holds) and (f.layout.split_axes() or f.layout.partial):
                f = c.ctx.unsupported(op, "a permute of a value that is not whole on every device")
            row.append(f)
        out.append(tuple(row))
    return out

