"""A shard_map inside a program (`sdy.manual_computation`): the body read on shards, its results left whole.

The operands are global values; the body sees their shards under the declared `in_shardings`, manual over
all axes or only some (`axis_names`). It is read in one pass, then, while some result is left unknown, by
case splits along one mesh axis and per device (`cases`, `per_device`). What it returns is read back as the
global tensor its out sharding describes (`rules/boundary.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Op, Value, walk
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.layout.program import manual_layouts
from scalify_hlo.prove import cases, per_device
from scalify_hlo.rules import boundary
from scalify_hlo.rules.facts import Blocks, Fact, Failed, Holds, PerBlock, Varying

if TYPE_CHECKING:
    from scalify_hlo.prove.derive import Deriver


def manual(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """`sdy.manual_computation` (shard_map): operands are global, the body sees their shards."""
    try:
        ins, outs, axes = manual_layouts(op, d.mesh)
    except ShardingError as err:
        return tuple(d.ctx.unsupported(op, err.message) for _ in op.results)
    # Manual over some axes only (`jax.shard_map(..., axis_names={"tp"})`): the body's values are the
    # shards over those axes and whole along the others (no collective or axis_index may name an auto
    # axis there), so it is read as a body replicated over the auto axes, provided no operand or result is
    # declared split over one.
    auto = set(d.mesh.names) - set(axes)
    named = {a for layout in (*ins, *outs) for a in (*layout.split_axes(), *layout.partial_axes())}
    if named & auto:
        return tuple(d.ctx.unsupported(op, f"a shard_map manual over only some axes with operands or results split "
                                           f"over the others ({sorted(named & auto)})") for _ in op.results)
    args: list[Fact] = []
    for f, layout in zip(facts, ins, strict=True):
        g = d.lift(f)
        if not isinstance(g, Holds) or g.layout != Layout.replicated(layout.rank):
            return tuple(d.ctx.unsupported(op, "a shard_map operand that is not a global value")
                         for _ in op.results)
        args.append(Holds(g.term, layout))
    # A loop that matches no reference loop fails for now: the case splits below may still follow it.
    loop_terms, d.loop_terms = d.loop_terms, False
    try:
        results = _manual_body(d, op, args, outs)
    finally:
        d.loop_terms = loop_terms
    if _open(results) and loop_terms and any(inner.opcode == "while" for inner in walk(op.regions[0].ops)):
        # Nothing followed it: such loops get their own terms, so that the outputs can be compared (and
        # evaluated for a counterexample) rather than left unknown.
        trial = d.region(op.regions[0], args)
        if not _open(trial):
            results = trial
    made = {v: inner for inner in op.regions[0].ops for v in inner.results}  # the body's op of each value
    out: list[Fact] = []
    for f, layout, res, ret in zip(results, outs, op.results, op.regions[0].results, strict=True):
        out.append(_leave_manual(d, op, d.lift(f), layout, res, made.get(ret)))
    return tuple(out)


def _manual_body(d: Deriver, op: Op, args: list[Fact], outs: Sequence[Layout]) -> tuple[Fact, ...]:
    """The shard_map body's results: one pass, then case splits (along an axis, per device) while open."""
    results = d.region(op.regions[0], args)
    if _open(results) and cases.worth_trying(op.regions[0]):
        for axis, size in d.mesh.axes:
            if 1 < size <= cases.CASE_LIMIT:
                trial, merged = cases.derive_cases(d, op.regions[0], args, axis, outs)
                if not _open(trial):
                    results = trial
                    d.facts.update(merged)
                    break
    if _open(results) and 1 < d.mesh.size <= cases.CASE_LIMIT:
        trial, merged = per_device.derive_per_device(d, op.regions[0], args, outs)
        if not _open(trial):
            results = trial
            d.facts.update(merged)
    return results


def _open(results: Sequence[Fact]) -> bool:
    """Some result is unknown (neither derived nor shown wrong): unsupported, or values no device holds a
    block of that nothing settled (rows of a table, halos, masks), which the boundary cannot read."""
    return any((isinstance(f, Failed) and not f.evidence) or not isinstance(f, _RETURNABLE) for f in results)


_RETURNABLE = (Failed, Holds, Varying, PerBlock, Blocks)  # what `boundary.returned` reads


def _leave_manual(d: Deriver, op: Op, f: Fact, declared: Layout, res: Value, producer: Op | None) -> Fact:
    if isinstance(f, Failed):
        return f
    f = boundary.returned(d.ctx, op, f, declared.local_shape(res.tensor.shape, d.mesh), declared)
    if isinstance(f, Failed):
        return f
    return boundary.left(d.ctx, op, f, declared, res.tensor.shape, producer)
