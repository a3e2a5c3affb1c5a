"""Case analysis over a mesh axis: a shard_map body derived once per coordinate along the axis.

Pipeline stages (`where(axis_index("pp") == 0, x, received)`) make values that differ between the
coordinates of an axis in ways no layout describes. Derived with partition-id pinned to coordinate `i`
along the axis (every device computes as if it sat at `i`: exact for the devices that do), each case is
an ordinary derivation whose facts hold on the devices at coordinate `i`. Collectives that stay inside one
coordinate run as usual in each case; those along the axis combine the cases: an all-reduce reduces the
cases' terms, a collective-permute hands case `i`'s fact to case `j` for each pair `i → j` (zeros where
nobody sends). A result is a fact when every case agrees on it. A loop with a static trip count (a
`fori_loop` whose body permutes along the axis: a ring) runs iteration by iteration, its collectives
combining the cases like any other, within `UNROLL_LIMIT` iterations for a whole nest (beyond, the loop
is derived as a loop).

This is the fallback for bodies the one-pass derivation leaves `unknown`; its cost is one derivation of
the body per coordinate, so it is tried only along axes of at most `CASE_LIMIT` devices.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from scalify_hlo.ir.nodes import Literal, Op, Region, TensorType, Value, walk
from scalify_hlo.layout.groups import has_channel
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer
from scalify_hlo.ops.reducers import OP_OF_REDUCER, reducer_of
from scalify_hlo.prove import branches
from scalify_hlo.rules.collectives import all_reduce_one, groups_axes
from scalify_hlo.rules.facts import Fact, Failed, Holds, Varying
from scalify_hlo.terms import ranges
from scalify_hlo.terms.slicing import slice_along
from scalify_hlo.terms.term import Term

if TYPE_CHECKING:
    from scalify_hlo.prove.derive import Deriver

CASE_LIMIT = 16
# Iterations of a loop with a static trip count run one by one in a case split, nested loops' included:
# a nest of loops costs the product of its trip counts unrolled, so the budget is the whole nest's.
UNROLL_LIMIT = 64
Hook = Callable[["Deriver", Op, tuple[Fact, ...]], tuple[Fact, ...]]
Combine = Callable[[list["Deriver"], Op, str], list[tuple[Fact, ...]]]
Along = Callable[[Op], Callable[[list["Deriver"], Op], list[tuple[Fact, ...]]] | None]
_ALONG = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")


def worth_trying(region: Region) -> bool:
    return any(op.opcode == "partition_id" for op in walk(region.ops))


def derive_cases(d: Deriver, region: Region, args: Sequence[Fact], axis: str, declared: Sequence[Layout]
                 ) -> tuple[tuple[Fact, ...], dict[Value, Fact]]:
    """The body's results, derived case by case along `axis` (see the module docstring), and the merged
    fact of every value inside it. A result declared split over `axis` may differ per case: each case
    holds its block."""
    n = d.mesh.axis_size(axis)
    cases: list[Deriver] = []
    for i in range(n):
        sub = d.sibling()
        sub.hooks = {**d.hooks, "partition_id": _pinned_partition_id(d.mesh, axis, i)}
        sub.facts = dict(d.facts)
        for v, f in zip(region.args, args, strict=True):
            sub.facts[v] = _pinned(sub, f, axis, i)
        cases.append(sub)
    run_ops(cases, region.ops, lambda op: _along_axis(cases[0], op, axis))
    merged = {v: _merge(d, [sub.facts[v] for sub in cases], op, axis) for op in region.ops for v in op.results}
    record_case_terms(d, cases, region)
    results = tuple(_merge(d, [sub.facts[v] for sub in cases], None, axis, want)
                    for v, want in zip(region.results, declared, strict=True))
    # For localisation only: where the cases differ, the value of the last case whose value reaches an
    # output (a pipeline's outputs come from its last stage).
    reach: set[int] = set()
    for sub in cases:
        for v in region.results:
            if isinstance(f := sub.facts[v], Holds):
                for _ in f.term.walk(reach):
                    pass
    for op in region.ops:
        for v in op.results:
            if not isinstance(merged[v], Holds):
                shown = [f for sub in cases if isinstance(f := sub.facts[v], Holds) and f.term.id in reach]
                if shown:
                    d.case_views[v] = shown[-1]
    return results, merged


def run_ops(cases: list[Deriver], ops: Sequence[Op], along: Along, budget: list[int] | None = None) -> None:
    """Every op in every case; the collectives `along` names combine the cases instead. `budget` holds the
    iterations the loop around `ops` (if any) may still unroll, its inner loops included."""
    for op in ops:
        if op.opcode == "while" and _unrolled(cases, op, along, [UNROLL_LIMIT] if budget is None else budget):
            continue
        if op.opcode in ("case", "if") and _branched(cases, op, along, budget):
            continue
        combine = along(op)
        if combine is None and _combines_cases(op, along):
            # A body (a loop not unrolled, branches the cases disagree on) holding a collective that
            # combines the cases: each case alone would read it with the ordinary rule, as if its value
            # were every coordinate's.
            for sub in cases:
                sub.facts.update((v, sub.ctx.unsupported(op, "a body holding a collective that combines the "
                                                         "cases of a split, where the cases take other "
                                                         "iterations or branches")) for v in op.results)
            continue
        if combine is None:
            for sub in cases:
                sub.op(op)
            continue
        for sub, out in zip(cases, combine(cases, op), strict=True):
            for v, f in zip(op.results, out, strict=True):
                sub.facts[v] = f


def _combines_cases(op: Op, along: Along) -> bool:
    """Whether a body of `op` holds a collective that combines the cases of the split."""
    return any(along(inner) is not None for r in op.regions for inner in walk(r.ops))


def _branched(cases: list[Deriver], op: Op, along: Along, budget: list[int] | None) -> bool:
    """A conditional in a case split. When every case folds its index to the same branch, that branch's
    ops run like any others (its collectives combining the cases). False otherwise (`run_ops` then leaves
    it unknown if a branch combines the cases, else each case derives the conditional alone)."""
    values = {branches.index_value(sub, op, sub.facts[op.operands[0]]) for sub in cases}
    if len(values) == 1 and (value := values.pop()) is not None:
        region = branches.ordered(op)[branches.taken(op, value)]
        run_ops(cases, region.ops, along, budget)
        for sub in cases:
            sub.facts.update(zip(op.results, [sub.facts[v] for v in region.results], strict=True))
        return True
    return False


def _unrolled(cases: list[Deriver], op: Op, along: Along, budget: list[int]) -> bool:
    """A loop whose trip count every case knows (a `fori_loop` over a static range), run iteration by
    iteration, so that the collectives in its body combine the cases like any other. False (the loop's
    results not bound: it is derived as a loop then) when the condition is not decided, differs between
    cases, or holds once more than `budget` allows (shared with the loops around and inside this one)."""
    cond, body = op.regions
    carried = [[sub.facts[v] for v in op.operands] for sub in cases]
    while True:
        for sub, facts in zip(cases, carried, strict=True):
            sub.facts.update(zip(cond.args, facts, strict=True))
        run_ops(cases, cond.ops, along, budget)
        decided = {_decided(sub, sub.facts[cond.results[0]]) for sub in cases}
        if len(decided) != 1 or None in decided:
            return False
        if not decided.pop():
            for sub, facts in zip(cases, carried, strict=True):
                sub.facts.update(zip(op.results, facts, strict=True))
            return True
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        for sub, facts in zip(cases, carried, strict=True):
            sub.facts.update(zip(body.args, facts, strict=True))
        run_ops(cases, body.ops, along, budget)
        carried = [[sub.facts[v] for v in body.results] for sub in cases]


def _decided(d: Deriver, f: Fact) -> bool | None:
    """The value of a boolean scalar the same on every device, if it is one."""
    g = d.lift(f)
    return ranges.bool_value(g.term) if isinstance(g, Holds) and not g.layout.partial else None


def record_case_terms(d: Deriver, cases: list[Deriver], region: Region) -> None:
    """Every case's term of every value in the body (loop bodies: their last iteration), for localisation."""
    for op in walk(region.ops):
        for v in op.results:
            facts = [sub.lift(sub.facts[v]) if v in sub.facts else None for sub in cases]
            d.case_terms[v] = [f.term if isinstance(f, Holds) else None for f in facts]


def _pinned(d: Deriver, f: Fact, axis: str, i: int) -> Fact:
    """`f` on the devices at coordinate `i` along `axis`: a value split over the axis is its block `i`
    there, a whole value of its own (so that nothing in the case is split or partial over the axis)."""
    if not isinstance(f, Holds) or axis not in f.layout.split_axes():
        return f
    dim = next(k for k, axes in enumerate(f.layout.dims) if axis in axes)
    axes = f.layout.dims[dim]
    if axes[0] != axis:
        return Failed(f"an input split over \"{axis}\" together with more major axes", None, False)
    shape = f.term.type.shape
    rows = shape[dim] // d.mesh.axis_size(axis)
    block = slice_along(d.terms, f.term, dim, i * rows, (i + 1) * rows)
    dims = tuple(a[1:] if k == dim else a for k, a in enumerate(f.layout.dims))
    return Holds(block, Layout(dims, f.layout.partial), f.origin)


def _pinned_partition_id(mesh: Mesh, axis: str, i: int) -> Hook:
    grid = mesh.device_array()
    k = mesh.axis_index(axis)
    pinned = np.broadcast_to(np.take(grid, [i], axis=k), grid.shape)
    ids = np.zeros(mesh.size, dtype=np.uint32)
    ids[grid.reshape(-1)] = pinned.reshape(-1)

    def partition_id(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        return (Varying(ids, op.result.tensor),)

    return partition_id


def _merge(d: Deriver, facts: list[Fact], op: Op | None, axis: str, declared: Layout | None = None) -> Fact:
    """One fact for all coordinates: the cases agree; or they are device-varying values (then exact); or
    the value is declared split over `axis` along a dim, and case `i` holds block `i` of it there."""
    first = facts[0]
    failed = [f for f in facts if isinstance(f, Failed)]
    if failed:
        return next((f for f in failed if f.evidence), failed[0])
    if agree(facts) is not None:
        return first
    if declared is not None and (blocks := _blocks(d, facts, axis, declared)) is not None:
        return blocks
    if all(isinstance(f, Varying) for f in facts):
        grid = d.mesh.device_array()
        k = d.mesh.axis_index(axis)
        values = np.array(facts[0].values)
        for i, f in enumerate(facts):
            rows = np.take(grid, [i], axis=k).reshape(-1)
            values[rows] = f.values[rows]
        return Varying(values, facts[0].type)
    return Failed(f"a value that differs between the coordinates along \"{axis}\" in a way no layout describes",
                  op, False)


def agree(facts: list[Fact]) -> Holds | None:
    """The fact every case holds, when they all hold the same term under the same layout."""
    first = facts[0]
    if isinstance(first, Holds) and all(isinstance(f, Holds) and f.term is first.term and f.layout == first.layout
                                        for f in facts):
        return first
    return None


def _blocks(d: Deriver, facts: list[Fact], axis: str, declared: Layout) -> Holds | None:
    """Case `i` holds `t_i` under `L` (not over `axis`): together, `concat(t_0, ..., t_n-1)` along the dim
    `declared` splits over `axis` (most major), under `L` with `axis` put in front on that dim."""
    dim = next((k for k, axes in enumerate(declared.dims) if axes[:1] == (axis,)), None)
    holds = [f for f in facts if isinstance(f, Holds)]
    if dim is None or len(holds) != len(facts) or len({h.layout for h in holds}) != 1:
        return None
    layout = holds[0].layout
    if axis in layout.split_axes() | layout.partial_axes() or layout.partial:
        return None
    if len({h.term.type for h in holds}) != 1:
        return None
    t = holds[0].term.type
    shape = tuple(m * len(holds) if k == dim else m for k, m in enumerate(t.shape))
    whole = d.terms.apply("concatenate", tuple(h.term for h in holds), (("dimension", dim),),
                          TensorType(shape, t.dtype))
    dims = tuple((axis, *a) if k == dim else a for k, a in enumerate(layout.dims))
    return Holds(whole, Layout(dims))


def _along_axis(sub: Deriver, op: Op, axis: str) -> Callable[[list[Deriver], Op], list[tuple[Fact, ...]]] | None:
    combine = _along(sub, op, axis)
    return None if combine is None else (lambda cases, o: combine(cases, o, axis))


def _along(sub: Deriver, op: Op, axis: str) -> Combine | None:
    """The combining rule when `op` is a collective along `axis`, else None (each case runs it)."""
    if op.opcode not in _ALONG or not has_channel(op):  # (without one, each case reads it: derive.py)
        return None
    if op.opcode == "collective_permute":
        pairs = op.attrs.get("source_target_pairs")
        if not isinstance(pairs, Literal):
            return None
        p = np.asarray(pairs.array, dtype=np.int64).reshape(-1, 2)
        src, dst = sub.mesh.coords(p[:, 0]), sub.mesh.coords(p[:, 1])
        k = sub.mesh.axis_index(axis)
        return None if np.array_equal(src[:, k], dst[:, k]) else _permute
    axes = groups_axes(sub.ctx, op)
    if isinstance(axes, Failed) or axis not in axes:
        return None
    return _all_reduce if op.opcode == "all_reduce" else _unsupported


def _unsupported(cases: list[Deriver], op: Op, axis: str) -> list[tuple[Fact, ...]]:
    return [tuple(c.ctx.unsupported(op, f"this collective along the case axis \"{axis}\"") for _ in op.results)
            for c in cases]


def _all_reduce(cases: list[Deriver], op: Op, axis: str) -> list[tuple[Fact, ...]]:
    reducer = reducer_of(op.regions[0]) if op.regions else None
    axes = groups_axes(cases[0].ctx, op)
    if reducer is None or isinstance(axes, Failed):
        return _unsupported(cases, op, axis)
    rest = tuple(a for a in axes if a != axis)
    out: list[list[Fact]] = [[] for _ in cases]
    for v in op.operands:
        facts = [c.lift(c.facts[v]) for c in cases]
        if agree(facts) is not None:
            for o, c, f in zip(out, cases, facts, strict=True):  # every coordinate holds the same: as usual
                o.append(all_reduce_one(c.ctx, op, f, axes, reducer))
            continue
        reduced = [all_reduce_one(c.ctx, op, f, rest, reducer) for c, f in zip(cases, facts, strict=True)]
        combined = _combine(cases[0], op, reduced, axis, reducer)
        for o in out:
            o.append(combined)
    return [tuple(o) for o in out]


def _combine(d: Deriver, op: Op, facts: list[Fact], axis: str, reducer: Reducer) -> Fact:
    failed = next((f for f in facts if isinstance(f, Failed)), None)
    if failed is not None:
        return failed
    holds = [f for f in facts if isinstance(f, Holds)]
    layouts = {h.layout for h in holds}
    if len(holds) != len(facts) or len(layouts) != 1:
        return d.ctx.unsupported(op, f"an all-reduce along \"{axis}\" of values laid out differently per coordinate")
    layout = next(iter(layouts))
    if axis in layout.split_axes() or layout.partial:
        return d.ctx.unsupported(op, f"an all-reduce along \"{axis}\" of values split over it or still partial")
    name = OP_OF_REDUCER[reducer]
    term: Term = holds[0].term
    for h in holds[1:]:
        term = d.terms.apply(name, (term, h.term), (), term.type)
    return Holds(term, layout)


def _permute(cases: list[Deriver], op: Op, axis: str) -> list[tuple[Fact, ...]]:
    """Case j receives case i's value for every pair i → j along `axis` (the other coordinates kept)."""
    mesh = cases[0].mesh
    pairs = np.asarray(op.attrs["source_target_pairs"].array, dtype=np.int64).reshape(-1, 2)  # type: ignore[union-attr]
    src, dst = mesh.coords(pairs[:, 0]), mesh.coords(pairs[:, 1])
    k = mesh.axis_index(axis)
    others = [j for j in range(len(mesh.axes)) if j != k]
    source: dict[int, int] = {}
    for s, t in zip(src, dst, strict=True):
        if not np.array_equal(s[others], t[others]) or source.setdefault(int(t[k]), int(s[k])) != int(s[k]):
            return _unsupported(cases, op, axis)
    senders_per_target = len(pairs) // max(len(source), 1)
    if senders_per_target * len(source) != len(pairs) or senders_per_target != mesh.size // mesh.axes[k][1]:
        return _unsupported(cases, op, axis)  # not the same pairs at every combination of the other coordinates
    (v,) = op.operands
    out: list[tuple[Fact, ...]] = []
    for j, c in enumerate(cases):
        if j not in source:
            # Zeros, as a leaf of their own: where they reach an output, the permute that sent nothing
            # (not some other zeros) is where the programs part ways. Opaque to the prover, which is sound.
            t = op.result.tensor
            zeros = c.terms.mk("nothing_received", (), (("site", op.loc.name or str(id(op))),), t)
            out.append((Holds(zeros, Layout.replicated(t.rank)),))
            continue
        f = cases[source[j]].lift(cases[source[j]].facts[v])
        if isinstance(f, Holds) and axis in f.layout.split_axes() | f.layout.partial_axes():
            f = c.ctx.unsupported(op, f"a permute along \"{axis}\" of a value split or partial over it")
        out.append((f,))
    return out
