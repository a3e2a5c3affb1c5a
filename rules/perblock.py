"""Scalars that differ per device by their data: a device's local reduction of its block, used per device.

A reduce of every dim of a split tensor leaves each device the reduction of its block: a partial value, when
a collective combines the devices' values afterwards (rules/spmd.py). A shard_map body may instead use it
per device: the predicate of a `lax.cond`, a compare, a convert, the input of a psum of something else.
It is then the shard of no global tensor of its rank, but element `b_A(c)` of the *blockwise* reduction
(the tensor cut into its blocks along the split axes `A`, each block reduced): a `PerBlock` fact
(facts.py). The value is exact per device, so it is sound to carry it:

- through elementwise ops on scalars (other operands one global scalar): the op on the blockwise terms;
- into a laid-out tensor where it is spread (a select's scalar predicate, a broadcast or a reshape of the
  scalar): every element of a device's shard takes its device's value, so the spread tensor is the
  blockwise term repeated over each block (a data movement and a broadcast, `facts.regroup`);
- through an all-reduce, which combines the devices' values: a reduction of the blockwise term;
- through a conditional whose index is such a scalar: every device computes every branch (they are pure)
  and selects per device, `case(i, b_0, .., b_n) = select(i == 0, b_0, select(i == 1, b_1, .. b_n))`.

The output comparison then decides (a missing collective shows as a term or layout that differs, with a
counterexample). Anywhere else the value is the failure reading it as a partial value found (e.g. "a psum
is missing before convert"), reported where it was found, as before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scalify_hlo.rules.facts import (
    Ctx,
    Fact,
    Failed,
    Holds,
    PerBlock,
    Varying,
    constant_term,
    join,
    regroup,
    view,
)

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Op, TensorType
from scalify_hlo.layout.groups import varying_axes
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.ops.reducers import Reducer, identity
from scalify_hlo.terms.term import AttrKey, Term


def blockwise(ctx: Ctx, x: Holds, init: Term, reducer: Reducer, dtype: str) -> tuple[Term, tuple[str, ...]] | None:
    """The reduction of every block of `x` (a reduce of all its dims, some split): `[n_A]`, block `b_A(c)`
    the one device `c` holds, and `A` (the split axes, dim by dim, major first). None for an uneven split."""
    shape, dims = x.term.type.shape, x.layout.dims
    axes = tuple(a for d in dims for a in d)
    if not axes or any(n % ctx.mesh.size_of(d) for n, d in zip(shape, dims, strict=True)):
        return None
    digits = [[*((a, ctx.mesh.axis_size(a)) for a in d), (f"_l{i}", n // ctx.mesh.size_of(d))]
              for i, (n, d) in enumerate(zip(shape, dims, strict=True))]
    grouped = regroup(ctx.terms, x.term, digits, [list(axes), [f"_l{i}" for i in range(len(shape))]])
    n_a = ctx.mesh.size_of(axes)
    term = ctx.terms.apply("reduce", (grouped, init), (("dimensions", (1,)), ("reducer", reducer.value)),
                           TensorType((n_a,), dtype))
    return term, axes


def reread(ctx: Ctx, op: Op, hs: Sequence[Holds], failure: Failed) -> Fact:
    """An elementwise op reading a partial scalar it is not linear in: the partial operands re-read as the
    per-device values they are (when a local reduce of blocks made them), else `failure`."""
    facts: list[Fact] = []
    # A block's value set against its own all-reduced value (`x.max() == pmax(x.max())`: which blocks reach
    # the max) reads both as meant: no suspect for a later difference.
    whole = {h.term.id for h in hs if not h.layout.partial}
    for h in hs:
        if not h.layout.partial:
            facts.append(h)
        elif h.blocks is not None and h.term.type.rank == 0:
            facts.append(PerBlock(h.blocks[0], h.blocks[1], failure))
            if h.term.id not in whole:
                ctx.per_block.append((h.blocks[0], failure))
        else:
            return failure
    return combine(ctx, op, op.opcode, term_attrs(op), op.result.tensor, facts)


def combine(ctx: Ctx, op: Op, opcode: str, attrs: AttrKey, out_t: TensorType, facts: Sequence[Fact]) -> Fact:
    """Elementwise `opcode` on operands some of which are `PerBlock` scalars (see the module docstring)."""
    blocks = [f for f in facts if isinstance(f, PerBlock)]
    failure = blocks[0].failure
    facts = [PerBlock(f.blocks[0], f.blocks[1], failure)
             if isinstance(f, Holds) and f.layout.partial and f.blocks is not None and f.term.type.rank == 0 else f
             for f in facts]
    blocks = [f for f in facts if isinstance(f, PerBlock)]
    axes = blocks[0].axes
    if any(b.axes != axes for b in blocks):
        return failure  # blocks of different splits: not modelled
    n_a = ctx.mesh.size_of(axes)
    if out_t.rank == 0:
        args: list[Term] = []
        for f in facts:
            if isinstance(f, PerBlock):
                args.append(f.term)
            elif isinstance(f, Holds) and f.term.type.rank == 0 and not f.layout.partial:
                args.append(ctx.terms.apply("broadcast_in_dim", (f.term,), (("broadcast_dimensions", ()),),
                                            TensorType((n_a,), f.term.type.dtype)))
            elif isinstance(f, Varying) and (table := _table(ctx, f, axes)) is not None:
                args.append(table)
            else:
                return failure
        return PerBlock(ctx.terms.apply(opcode, tuple(args), attrs, TensorType((n_a,), out_t.dtype)), axes, failure)
    # A tensor result: only a select whose scalar predicate is the per-device value picks per device.
    pred, rest = facts[0], facts[1:]
    if opcode != "select" or not isinstance(pred, PerBlock):
        return failure
    hs = [f for f in rest if isinstance(f, Holds) and not f.layout.partial]
    if len(hs) != len(rest):
        return failure
    joined = join([h.layout for h in hs])
    layout = joined and _with_axes(joined, axes)
    if layout is None:
        return failure
    terms: list[Term] = []
    for h in hs:
        t = view(h.term, h.layout, layout.dims, ctx.mesh, ctx.terms)
        if t is None:
            return failure
        terms.append(t)
    gshape = terms[0].type.shape
    spread = _spread(ctx, (pred.term, pred.axes), layout, gshape)
    if spread is None:
        return failure
    term = ctx.terms.apply("select", (spread, *terms), attrs, TensorType(gshape, out_t.dtype))
    return Holds(term, layout)


def _table(ctx: Ctx, v: Varying, axes: tuple[str, ...]) -> Term | None:
    """A device-varying scalar (an `axis_index` offset) as the constant `[n_A]` of its value on each block
    over `axes`; None when it varies along another axis."""
    values = np.asarray(v.values)
    if v.type.rank or not set(varying_axes(values, ctx.mesh)) <= set(axes):
        return None
    mesh = ctx.mesh
    grid = values.reshape(-1)[mesh.device_array()]  # [*mesh.shape]: each coordinate's value
    order = [mesh.names.index(a) for a in axes]
    rest = [i for i in range(len(mesh.names)) if i not in order]
    table = np.transpose(grid, (*order, *rest)).reshape(mesh.size_of(axes), -1)[:, 0]  # (constant along `rest`)
    return constant_term(np.ascontiguousarray(table), TensorType((table.size,), v.type.dtype), ctx.terms)


def _with_axes(layout: Layout, axes: tuple[str, ...]) -> Layout | None:
    """`layout` also split over those of `axes` it is not split over (a value combined with per-device
    values varies over them too): as minor axes of its first split dim (of dim 0 if none is split)."""
    missing = tuple(a for a in axes if a not in layout.split_axes())
    if not missing:
        return layout
    if layout.rank == 0 or set(missing) & layout.partial_axes():
        return None
    d = next((i for i, dd in enumerate(layout.dims) if dd), 0)
    dims = list(layout.dims)
    dims[d] = (*dims[d], *missing)
    try:
        return Layout(tuple(dims), layout.partial)
    except ShardingError:
        return None


def _spread(ctx: Ctx, blocks: tuple[Term, tuple[str, ...]], layout: Layout, gshape: tuple[int, ...]) -> Term | None:
    """The tensor of shape `gshape` whose shard under `layout` at device `c` is filled with `c`'s value,
    element b_A(c) of `blocks` (a term and the axes `A`)."""
    blocks_term, axes = blocks
    if not set(axes) <= layout.split_axes() or layout.partial:
        return None
    if any(n % ctx.mesh.size_of(d) for n, d in zip(gshape, layout.dims, strict=True)):
        return None
    local = [n // ctx.mesh.size_of(d) for n, d in zip(gshape, layout.dims, strict=True)]
    target = [[*d, f"_l{i}"] for i, d in enumerate(layout.dims)]
    new = [*((a, ctx.mesh.axis_size(a)) for a in sorted(layout.split_axes() - set(axes))),
           *((f"_l{i}", n) for i, n in enumerate(local))]
    return regroup(ctx.terms, blocks_term, [[(a, ctx.mesh.axis_size(a)) for a in axes]], target, new)


def keep_blocks(facts: Sequence[Fact], out: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A broadcast or reshape of a partial scalar that knows its blocks (`Holds.blocks`) stays partial (it
    is linear) and keeps them: each device's result is its block's value, repeated, whatever follows (a
    psum reads the partial sum; a shard_map output the per-device values, `leaving`)."""
    if (len(facts) == 1 and isinstance(x := facts[0], Holds) and x.blocks is not None and x.term.type.rank == 0
            and len(out) == 1 and isinstance(y := out[0], Holds) and y.layout.partial == x.layout.partial):
        return (dataclasses.replace(y, blocks=x.blocks),)
    return out


def leaving(ctx: Ctx, h: Holds, local: tuple[int, ...], declared: Layout) -> Holds:
    """A shard_map result of local shape `local` under out spec `declared`. A partial value that knows its
    blocks, where the spec splits over their axes, is the per-device values it is (each device returns its
    own block's result): dim 0 split over the blocks' axes, every element of device `c`'s shard its block's
    value. Anything else is `h` itself (still partial where a psum is missing: the boundary says so)."""
    if not h.layout.partial or h.blocks is None or not local or not set(h.blocks[1]) <= declared.split_axes():
        return h
    layout = Layout(((*h.blocks[1],), *(() for _ in local[1:])))
    gshape = (local[0] * ctx.mesh.size_of(h.blocks[1]), *local[1:])
    term = _spread(ctx, h.blocks, layout, gshape)
    return h if term is None else Holds(term, layout, h.origin)


def broadcast(ctx: Ctx, op: Op, pb: PerBlock) -> Fact:
    """A broadcast or reshape of the per-device scalar to a local shape: spread along dim 0, split over
    the blocks' axes (the layout the scalar's blocks give the result)."""
    out = op.result.tensor
    if op.operands[0].tensor.rank != 0:
        return pb.failure
    if out.rank == 0:
        return pb
    layout = Layout(((*pb.axes,), *(() for _ in out.shape[1:])))
    gshape = (out.shape[0] * ctx.mesh.size_of(pb.axes), *out.shape[1:])
    spread = _spread(ctx, (pb.term, pb.axes), layout, gshape)
    return pb.failure if spread is None else Holds(spread, layout)


def all_reduce(ctx: Ctx, pb: PerBlock, axes: tuple[str, ...], reducer: Reducer) -> Fact:
    """An all-reduce over `axes` of the per-device scalar: the reduction of the blockwise term over the
    digits of those axes (over axes it does not vary along, a sum multiplies and a max changes nothing)."""
    sizes = [ctx.mesh.axis_size(a) for a in pb.axes]
    dtype = pb.term.type.dtype
    t = ctx.terms.apply("reshape", (pb.term,), (), TensorType(tuple(sizes), dtype))
    red = tuple(i for i, a in enumerate(pb.axes) if a in axes)
    rest = tuple(a for a in pb.axes if a not in axes)
    if red:
        init = ctx.terms.scalar(identity(reducer, dtype), dtype)
        kept = tuple(s for i, s in enumerate(sizes) if i not in red)
        t = ctx.terms.apply("reduce", (t, init), (("dimensions", red), ("reducer", reducer.value)),
                            TensorType(kept, dtype))
    copies = math.prod(ctx.mesh.axis_size(a) for a in axes if a not in pb.axes)
    if copies > 1:
        if reducer is Reducer.PROD:
            return pb.failure
        if reducer is Reducer.SUM:
            scale = ctx.terms.splat(float(copies), t.type)
            t = ctx.terms.apply("multiply", (t, scale), (), t.type)
    if not rest:
        return Holds(ctx.terms.apply("reshape", (t,), (), TensorType((), dtype)), Layout(()))
    flat = ctx.terms.apply("reshape", (t,), (), TensorType((ctx.mesh.size_of(rest),), dtype))
    return PerBlock(flat, rest, pb.failure)


def select_branches(ctx: Ctx, op: Op, index: PerBlock, results: Sequence[Fact], out_t: TensorType,
                    if_op: bool) -> Fact:
    """Result of a conditional whose index (an `if`'s predicate) is a per-device scalar, from every
    branch's result (`results` in index order): selects, per device."""
    n = len(results)
    w = index.term
    n_a = w.type.shape[0]
    pred_t = TensorType((n_a,), "i1")
    if if_op or (n == 2 and w.op == "convert" and w.args[0].type.dtype == "i1"):
        # `if` and `lax.cond` (a case on convert(p)): the predicate picks branch 1.
        p = w if if_op else w.args[0]
        return combine(ctx, op, "select", (), out_t, [PerBlock(p, index.axes, index.failure), results[1], results[0]])
    acc = results[-1]
    for k in range(n - 2, -1, -1):
        if isinstance(acc, Failed):
            return acc
        kth = ctx.terms.splat(float(k), w.type)
        eq = ctx.terms.apply("compare", (w, kth), (("comparison_direction", "EQ"),), pred_t)
        acc = combine(ctx, op, "select", (), out_t, [PerBlock(eq, index.axes, index.failure), results[k], acc])
    return acc


def read_by(ctx: Ctx, term: Term) -> Failed | None:
    """The failure of a partial scalar re-read per device (`reread`) that `term` reads, if any: where an
    output that differs from the reference names the fault (a missing collective, as before re-reading)."""
    if not ctx.per_block:
        return None
    ids = {t.id for t in term.walk()}
    return next((f for w, f in ctx.per_block if w.id in ids), None)
