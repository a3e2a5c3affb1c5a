"""Transfer rules of the GSPMD shard_map boundary: `SPMDFullToShardShape` and `SPMDShardToFullShape`.

They are what `sdy.manual_computation` is under Shardy (`prove.derive._manual`), spelled as two custom
calls around a plain body (`layout/boundary.py`). Entering: a global value (replicated on every device)
becomes, on each device, its shard under the layout its `Sharding` annotation declares: the same term
under that layout. Leaving: the body's value, held under some layout, is the shard of the global result
under the declared one; a value still partial there is a missing psum, a layout that cannot be viewed
as the declared one a contradiction (both evidence, backed by running the programs).

What global tensor a shard_map output is (`assemble`, both forms): every device's local value placed at
the block its coordinates name under the declared out_specs. Copies a value holds the same on every device
of an axis the out_specs name are tiled (or repeated, the axis minor); axes named in another order, or on
another dim, than the value is split over permute its blocks: a data movement of the held term, whose
global shape may differ from it (`P("y", "x")` for a value split `P("x", "y")`).
"""

from __future__ import annotations

from scalify_hlo.rules import argreduce, perblock
from scalify_hlo.rules.facts import Blocks, Ctx, Fact, Failed, Holds, Varying, regroup, view

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Op
from scalify_hlo.layout import boundary
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.terms.slicing import ring_gaps
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


def _held(ctx: Ctx, op: Op, f: Fact) -> Holds | Failed:
    g = ctx.lift(f) if isinstance(f, Varying) else f
    if isinstance(g, Holds | Failed):
        return g
    return ctx.unsupported(op, "an operand that is not a tensor")


def assemble(term: Term, have: Layout, want: Layout, mesh: Mesh, terms: Terms) -> Term | None:
    """The global tensor whose shard under `want` is, on every device, the shard of `term` under `have`:
    `term`'s dims cut into their block digits (one per axis of `have`, major first) and a local digit,
    regrouped into `want`'s dims (its axes, then the local digit), repeated along `want`'s axes `have` does
    not use. None where no such tensor exists: a value that differs along an axis `want` does not name
    (or is partial), or an uneven split."""
    if have.partial or want.partial or have.rank != want.rank:
        return None
    if not have.split_axes() <= want.split_axes():
        return None
    digits: list[list[tuple[str, int]]] = []
    target: list[list[str]] = []
    for d, (h, w) in enumerate(zip(have.dims, want.dims, strict=True)):
        size, n = term.type.shape[d], mesh.size_of(h)
        if size % n:
            return None
        digits.append([*((a, mesh.axis_size(a)) for a in h), (f"_local{d}", size // n)])
        target.append([*w, f"_local{d}"])
    new = [(a, mesh.axis_size(a)) for w in want.dims for a in w if a not in have.split_axes()]
    return regroup(terms, term, digits, target, new)


def leave(term: Term, have: Layout, want: Layout, mesh: Mesh, terms: Terms) -> Term | None:
    """The global result of a shard_map output held as `term` under `have` and declared `want`: `view`
    where it applies (the terms the rest of the prover builds), else `assemble`."""
    seen = view(term, have, want.dims, mesh, terms)
    if seen is not None:
        return seen
    term, have = _untiled(term, have, want, mesh, terms)
    return assemble(term, have, want, mesh, terms)


def _untiled(term: Term, have: Layout, want: Layout, mesh: Mesh, terms: Terms) -> tuple[Term, Layout]:
    """`term` under `have` without the major axes of a dim that `want` does not name and along which its
    blocks are copies (`term` a tiling, as a ring all-reduce leaves every device the same sum): a value
    replicated over them."""
    if have.partial:
        return term, have
    named = want.split_axes()
    dims = list(have.dims)
    for d, axes in enumerate(have.dims):
        extra = tuple(a for a in axes if a not in named)
        if not extra or axes[:len(extra)] != extra:
            continue
        one = terms.untile(term, d, mesh.size_of(extra))
        if one is not None:
            term, dims[d] = one, axes[len(extra):]
    return term, Layout(tuple(dims))


def full_to_shard(ctx: Ctx, op: Op, facts: tuple[Fact, ...], operand_sharding: str | None) -> tuple[Fact, ...]:
    g = _held(ctx, op, facts[0])
    if isinstance(g, Failed):
        return (g,)
    if len(facts) != 1 or g.layout != Layout.replicated(g.term.type.rank):
        return (ctx.unsupported(op, "a shard_map operand that is not a global value"),)
    try:
        layout = boundary.entering(op, operand_sharding, ctx.mesh)
        local = layout.local_shape(g.term.type.shape, ctx.mesh)
    except ShardingError as err:
        return (ctx.unsupported(op, err.message),)
    if local != op.results[0].tensor.shape:
        return (ctx.unsupported(op, f"shards of shape {list(local)} under {ctx.describe(layout)}, the body takes "
                                f"{list(op.results[0].tensor.shape)}"),)
    return (Holds(g.term, layout, g.origin),)


def returned(ctx: Ctx, op: Op, f: Fact, local: tuple[int, ...], declared: Layout) -> Holds | Failed:
    """A shard_map body's result of local shape `local` as it leaves under out spec `declared`: per-device
    results (a device's own block reduction, argmax block results) read as the tensor of them where the
    spec splits over their axes; a value still partial is a missing psum."""
    if isinstance(f, Blocks):
        held = argreduce.leaving(ctx, f, declared)
        if held is None:
            return ctx.unsupported(op, f"argmax/argmin results of each device's block returned under "
                                   f"{ctx.describe(declared)}, which does not lay their block dim out over the "
                                   f"blocks' axes {list(f.axes)}")
        return held
    g = _held(ctx, op, f)
    if isinstance(g, Failed):
        return g
    g = perblock.leaving(ctx, g, local, declared)
    if g.layout.partial:
        axes = ", ".join(f'"{a}"' for a, _ in g.layout.partial)
        return ctx.fail(op, f"shard_map returns a value that is still partial over {{{axes}}}: a psum over "
                        f"{{{axes}}} is missing", evidence=True, origin=g.origin,
                        expected=ctx.describe(declared), found=ctx.describe(g.layout), partial=True)
    return g


def shard_to_full(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    if isinstance(facts[0], Failed):
        return (facts[0],)
    try:
        declared = boundary.leaving(op, ctx.mesh)
    except ShardingError as err:
        return (ctx.unsupported(op, err.message),)
    g = returned(ctx, op, facts[0], op.operands[0].tensor.shape, declared)
    if isinstance(g, Failed):
        return (g,)
    return (left(ctx, op, g, declared, op.results[0].tensor.shape),)


def left(ctx: Ctx, op: Op, g: Holds, declared: Layout, shape: tuple[int, ...], producer: Op | None = None
         ) -> Holds | Failed:
    """The global value of a shard_map result `g` declared `declared` (of global `shape`), or why it is not
    one: a value that differs along an axis the spec does not name (evidence, found where the value was
    made: its origin, else `producer`, the body's op that returns it)."""
    term = leave(g.term, g.layout, declared, ctx.mesh, ctx.terms)
    if term is None:
        why, origin = "", g.origin or producer
        if (gaps := ring_gaps(g.term)) is not None:
            d, block, n, missing = gaps
            what = (f"misses the shift by {', '.join(map(str, missing))} rows" if missing
                    else "counts some shift twice")
            why = (f": it sums a tensor and its cyclic shifts by multiples of {block} rows along dim {d}, which "
                   f"{what} (a ring all-reduce needs each of the {n} shifts once)")
        return ctx.fail(op, f"shard_map declares its output as {ctx.describe(declared)} but the value is laid out "
                        f"as {ctx.describe(g.layout)}{why}", evidence=True, origin=origin,
                        expected=ctx.describe(declared), found=ctx.describe(g.layout))
    if term.type.shape != shape:
        return ctx.unsupported(op, f"a result of global shape {list(term.type.shape)}, declared {list(shape)}")
    return Holds(term, Layout.replicated(declared.rank))
