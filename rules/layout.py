"""Transfer rules for ops that move data around: broadcast, reshape, transpose, slice, concat, pad.

A split dim is carried through a dimension bijection: a reshape keeps it only as the major part of the
merged or split dims (DESIGN §3), once the splits of a merged group are moved to its major dim (the same
local values read as the shards of a moved tensor); a static slice keeps it only when it takes the whole
local dim; a value replicated over axes combined with one split over them is seen as its tiled copies
(`facts.view`).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scalify_hlo.rules import argreduce, perblock
from scalify_hlo.rules.facts import (
    Blocks,
    Ctx,
    Fact,
    Failed,
    Holds,
    PerBlock,
    Varying,
    join,
    regroup,
    unshifted,
    view,
)

from scalify_hlo.ir.nodes import EMPTY_ATTRS, Op, TensorType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.terms.movement import reshape_groups, reverse_blocks


def holds_operands(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> list[Holds] | Failed:
    out = []
    for f in facts:
        g = ctx.lift(f) if isinstance(f, Varying) else unshifted(ctx, f)
        if isinstance(g, Failed):
            return Failed(g.reason, op, g.evidence, g.origin)
        if not isinstance(g, Holds):
            return ctx.not_tensors(op, (g,))
        out.append(g)
    return out


def _try_varying(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact | None:
    if any(isinstance(f, Varying) for f in facts):
        return ctx.varying(op, facts)
    return None


def _prelude(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> list[Holds] | tuple[Fact, ...]:
    """The operands as Holds facts, or the op's result already: computed per device when it is index
    arithmetic on device-varying values, or the failure of an operand."""
    v = _try_varying(ctx, op, facts)
    if v is not None:
        return (v,)
    ops = holds_operands(ctx, op, facts)
    return (ops,) if isinstance(ops, Failed) else ops


def broadcast_in_dim(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    return perblock.keep_blocks(facts, _broadcast_in_dim(ctx, op, facts))


def _broadcast_in_dim(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    (f,) = facts
    if isinstance(f, Blocks):
        return (argreduce.reshape(ctx, op, f),)
    if isinstance(f, PerBlock):
        return (perblock.broadcast(ctx, op, f),)
    if isinstance(f, Varying):
        out_t = op.result.tensor
        dims = tuple(op.attrs["broadcast_dimensions"])  # type: ignore[arg-type]
        src = f.values.reshape((f.values.shape[0], *[
            f.type.shape[dims.index(j)] if j in dims else 1 for j in range(out_t.rank)]))
        return (Varying(np.broadcast_to(src, (src.shape[0], *out_t.shape)), out_t),)
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return (ops,)
    (x,) = ops
    dims = tuple(op.attrs["broadcast_dimensions"])  # type: ignore[arg-type]
    local = op.result.tensor.shape
    xlocal = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    out_dims: list[tuple[str, ...]] = []
    gshape: list[int] = []
    for j, n in enumerate(local):
        if j in dims:
            i = dims.index(j)
            if xlocal[i] == n:
                out_dims.append(x.layout.dims[i])
                gshape.append(x.term.type.shape[i])
                continue
            if x.layout.dims[i]:
                return (ctx.unsupported(op, "a broadcast that expands a split dim"),)
        out_dims.append(())
        gshape.append(n)
    dtype = op.result.tensor.dtype
    term = ctx.terms.apply("broadcast_in_dim", (x.term,), (("broadcast_dimensions", dims),),
                           TensorType(tuple(gshape), dtype))
    if x.layout.split_axes() and ctx.known(term) < 2:
        # (A replicated operand stays replicated: `view` tiles it to meet split ones.)
        wider = _wider_broadcast(ctx, x, dims, out_dims, gshape, dtype)
        if wider is not None:
            return (wider,)
    return (Holds(term, Layout(tuple(out_dims), x.layout.partial), x.origin),)


def _wider_broadcast(ctx: Ctx, x: Holds, dims: tuple[int, ...], out_dims: list[tuple[str, ...]],
                     gshape: list[int], dtype: str) -> Holds | None:
    """The broadcast read as the shards of a wider one that the reference computes.

    Along a dim the broadcast creates (or widens from 1) the local value is constant, and so is it along
    every mesh axis the operand neither splits nor holds partial sums over: each device's copy is the
    block of that dim at its coordinate on such axes, whatever the coordinate. `jnp.repeat` of a tensor
    all-gathered over part of an axis is such a broadcast (GQA's key/value heads when there are fewer
    than devices): the partitioner broadcasts only the repeats the device's query heads need."""
    free = [a for a in ctx.mesh.names if a not in x.layout.split_axes() and a not in x.layout.partial_axes()]
    grown = [j for j in range(len(gshape))
             if gshape[j] > 1 and (j not in dims or x.term.type.shape[dims.index(j)] == 1)]
    if not free or not grown:
        return None
    best: tuple[int, Holds] | None = None
    for j in grown:
        for k in range(1, min(len(free), 3) + 1):
            for axes in itertools.permutations(free, k):
                shape = list(gshape)
                shape[j] = gshape[j] * ctx.mesh.size_of(axes)
                term = ctx.terms.apply("broadcast_in_dim", (x.term,), (("broadcast_dimensions", dims),),
                                       TensorType(tuple(shape), dtype))
                rank = ctx.known(term)
                if rank and (best is None or rank > best[0]):
                    new_dims = list(out_dims)
                    new_dims[j] = axes
                    best = (rank, Holds(term, Layout(tuple(new_dims), x.layout.partial), x.origin))
    return None if best is None else best[1]


def reshape(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    return perblock.keep_blocks(facts, _reshape(ctx, op, facts))


def _reshape(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A split dim survives a reshape as the major part of the dims it is merged with or split into.

    The local reshape does not always fix the global one: a shard [.., 2, ..] reshaped to [.., 1, 2, ..]
    is the shard of [.., 8, ..] → [.., 4, 2, ..] (the split moves to the unit dim) as much as of
    [.., 8, ..] → [.., 1, 8, ..]. Every reading is a true fact; we take the one whose global term the
    reference program computes (it is how the partitioner got there), else the first. When the reference
    computes none of the major readings, the axes of one split may also be spread over several result dims,
    or the splits of several dims joined into one (`_spread_reading`)."""
    if len(facts) == 1 and isinstance(facts[0], Blocks):
        return (argreduce.reshape(ctx, op, facts[0]),)
    if len(facts) == 1 and isinstance(facts[0], PerBlock):
        return (perblock.broadcast(ctx, op, facts[0]),)
    ops = _prelude(ctx, op, facts)
    if isinstance(ops, tuple):
        return ops
    (x,) = ops
    xlocal = tuple(x.layout.local_shape(x.term.type.shape, ctx.mesh))
    out_local = tuple(op.result.tensor.shape)
    core = reshape_groups(xlocal, out_local)
    if core is None:
        return (ctx.unsupported(op, f"reshape {list(xlocal)} → {list(out_local)}"),)
    major = _major_reading(ctx, op, x, xlocal, out_local, core)
    rank = ctx.known(major.term) if isinstance(major, Holds) else -1
    if rank < 2 and x.layout.split_axes():
        spread = _spread_reading(ctx, op, x, xlocal, out_local)
        if spread is not None and ctx.known(spread.term) > rank:
            return (spread,)
    return (major,)


def _major_reading(ctx: Ctx, op: Op, x: Holds, xlocal: tuple[int, ...], out_local: tuple[int, ...],
                   core: list[tuple[list[int], list[int]]]) -> Fact:
    """The reading that moves each split to the major position of the result dims it lands in."""

    def units_before(m: int) -> list[int]:
        """Output unit dims between core group m-1 and core group m (all of them after the last group)."""
        lo = core[m - 1][1][-1] if m > 0 else -1
        hi = core[m][1][0] if m < len(core) else len(out_local)
        return [j for j in range(lo + 1, hi) if out_local[j] == 1]

    for gi, _ in core:
        if any(x.layout.dims[i] for i in gi[1:]):
            moved = _split_to_major(ctx, x, gi)
            if moved is None:
                return ctx.unsupported(op, "a reshape that merges a split dim with a more major dim, unevenly "
                                       "split")
            x = moved
    options: list[list[int]] = []
    split = [k for k, axes in enumerate(x.layout.dims) if axes]
    for k in split:
        if xlocal[k] != 1:
            m = next(i for i, g in enumerate(core) if k in g[0])
            if core[m][0][0] != k or any(x.layout.dims[i] for i in core[m][0][1:]):
                return ctx.unsupported(op, f"a reshape that moves split dim {k} off the major position of the "
                                       "dims it is merged with (the shards would interleave)")
            options.append([core[m][1][0], *reversed(units_before(m))])
        else:
            m = sum(1 for g in core if g[0] and g[0][0] < k)
            merge = [core[m][1][0]] if m < len(core) and not any(x.layout.dims[i] for i in core[m][0]) else []
            options.append([*units_before(m), *merge])
    choices: list[tuple[int, Holds]] = []
    for combo in itertools.product(*options):
        if list(combo) != sorted(set(combo)):
            continue  # a reshape keeps the row-major order: split dims stay in their order
        out_dims: list[tuple[str, ...]] = [()] * len(out_local)
        gshape = list(out_local)
        for k, o in zip(split, combo, strict=True):
            out_dims[o] = x.layout.dims[k]
            gshape[o] = out_local[o] * ctx.mesh.size_of(x.layout.dims[k])
        term = ctx.terms.apply("reshape", (x.term,), (), TensorType(tuple(gshape), op.result.tensor.dtype))
        fact = Holds(term, Layout(tuple(out_dims), x.layout.partial), x.origin)
        rank = ctx.known(term)
        if rank == 2:
            return fact
        choices.append((-rank, fact))
    if not choices:
        return ctx.unsupported(op, f"a reshape {list(xlocal)} → {list(out_local)} that drops a split dim")
    return min(choices, key=lambda c: c[0])[1]


def _spread_reading(ctx: Ctx, op: Op, x: Holds, xlocal: tuple[int, ...], out_local: tuple[int, ...]) -> Holds | None:
    """A reading of the reshape the reference computes in which one split is spread over several result
    dims, or several splits meet in one; None when no such reading is the reference's.

    Each global dim is its split axes (major first) then its local part. Flattened in order, these digits
    are the same sequence before and after a row-major reshape, so any grouping of them into the result
    dims is a global reshape whose shards are the local one, provided each result dim holds its axes
    before its local digits. Only a result dim with one local element (a unit dim) has a choice: it may
    take some of the axes that are waiting. (`jnp.repeat` of key/value heads split over part of an axis
    reshapes `[.., 2·4, ..]` split over (tp_major, tp_minor) into `[.., 2, 4, ..]`, one axis each.)"""
    shape = x.term.type.shape
    stream: list[tuple[str, int]] = []  # ("", n): n local elements; (axis, size): a split axis
    for k, axes in enumerate(x.layout.dims):
        if shape[k] % ctx.mesh.size_of(axes):
            return None
        stream += [(a, ctx.mesh.axis_size(a)) for a in axes]
        if xlocal[k] != 1:
            stream.append(("", xlocal[k]))
    readings: list[list[tuple[str, ...]]] = []

    def place(j: int, pos: int, rest: int, dims: list[tuple[str, ...]]) -> None:
        # `rest`: local elements left of the digit at `pos` (0: all of it).
        if len(readings) > 16:
            return
        if j == len(out_local):
            if pos == len(stream):
                readings.append(dims)
            return
        waiting = 0
        while pos + waiting < len(stream) and stream[pos + waiting][0] and not rest:
            waiting += 1
        takes = range(waiting + 1) if out_local[j] == 1 else [waiting]
        for t in takes:
            axes = tuple(a for a, _ in stream[pos:pos + t])
            p, r, need = pos + t, rest, out_local[j]
            while need > 1:
                if p == len(stream) or stream[p][0]:
                    break
                have = r or stream[p][1]
                if have % need == 0 and have != need:
                    r, need = have // need, 1
                elif need % have == 0:
                    p, r, need = p + 1, 0, need // have
                else:
                    break
            if need == 1:
                place(j + 1, p, r, [*dims, axes])

    place(0, 0, 0, [])
    best: tuple[int, Holds] | None = None
    for dims in readings:
        if all(not d for d in dims) or tuple(dims) == x.layout.dims:
            continue
        gshape = tuple(n * ctx.mesh.size_of(d) for n, d in zip(out_local, dims, strict=True))
        term = ctx.terms.apply("reshape", (x.term,), (), TensorType(gshape, op.result.tensor.dtype))
        rank = ctx.known(term)
        if rank and (best is None or rank > best[0]):
            best = (rank, Holds(term, Layout(tuple(dims), x.layout.partial), x.origin))
    return None if best is None else best[1]


def _split_to_major(ctx: Ctx, x: Holds, group: list[int]) -> Holds | None:
    """The same local values, read as the shards of another global tensor: every split of the dims of
    `group` (consecutive dims a reshape merges or splits) moved to its first dim, as that dim's major part.

    On device `c` the local block is `X[.., b_k(c) * l_k + i_k, ..]` (dims `k` of the group, `l_k` their
    local sizes, `b_k(c) = 0` for unsplit dims). The tensor `X2` whose first group dim is split over all the
    group's axes (in dim order) and whose other group dims are whole, `X2[(b(c), i_f), .., i_k, ..] = X[..]`,
    has that same block on every device: a data movement of `X`. None for an uneven split."""
    shape = x.term.type.shape
    dims = x.layout.dims
    if any(shape[k] % ctx.mesh.size_of(dims[k]) for k in group):
        return None
    digits = [[(f"_{i}", n)] for i, n in enumerate(shape)]
    target = [[f"_{i}"] for i in range(len(shape))]
    for k in group:
        digits[k] = [*((a, ctx.mesh.axis_size(a)) for a in dims[k]), (f"_{k}", shape[k] // ctx.mesh.size_of(dims[k]))]
    first = group[0]
    axes = tuple(a for k in group for a in dims[k])
    target[first] = [*axes, f"_{first}"]
    term = regroup(ctx.terms, x.term, digits, target)
    new_dims = [() if k in group else d for k, d in enumerate(dims)]
    new_dims[first] = axes
    return Holds(term, Layout(tuple(new_dims), x.layout.partial), x.origin)


def bitcast(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """HLO's bitcast (after layout assignment) reinterprets the operand's buffer under the result's
    layout: a transpose to physical order, a reshape, and a transpose back. With default (row-major)
    layouts it is a plain reshape."""
    src = tuple(int(i) for i in np.asarray(op.attrs["source_layout"].array))  # type: ignore[union-attr]
    res = tuple(int(i) for i in np.asarray(op.attrs["result_layout"].array))  # type: ignore[union-attr]
    if src == tuple(reversed(range(len(src)))) and res == tuple(reversed(range(len(res)))):
        # (as the reshape it is: a per-device value, an offset read from a table, stays one)
        return reshape(ctx, dataclasses.replace(op, opcode="reshape", attrs=EMPTY_ATTRS), facts)
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return (ops,)
    (x,) = ops
    if x.layout != Layout.replicated(x.layout.rank):
        return (ctx.unsupported(op, "a layout-changing bitcast of a sharded value"),)
    dtype = op.result.tensor.dtype
    out_shape = op.result.tensor.shape
    to_physical = tuple(reversed(src))
    t = ctx.terms.apply("transpose", (x.term,), (("permutation", to_physical),),
                        TensorType(tuple(x.term.type.shape[d] for d in to_physical), dtype))
    order = tuple(reversed(res))
    t = ctx.terms.apply("reshape", (t,), (), TensorType(tuple(out_shape[d] for d in order), dtype))
    back = tuple(order.index(d) for d in range(len(order)))
    t = ctx.terms.apply("transpose", (t,), (("permutation", back),), TensorType(tuple(out_shape), dtype))
    return (Holds(t, Layout.replicated(len(out_shape)), x.origin),)


def transpose(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    ops = _prelude(ctx, op, facts)
    if isinstance(ops, tuple):
        return ops
    (x,) = ops
    perm = tuple(op.attrs["permutation"])  # type: ignore[arg-type]
    layout = Layout(tuple(x.layout.dims[p] for p in perm), x.layout.partial)
    gtype = TensorType(tuple(x.term.type.shape[p] for p in perm), op.result.tensor.dtype)
    return (Holds(ctx.terms.apply("transpose", (x.term,), (("permutation", perm),), gtype), layout, x.origin),)


def slice_(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    ops = _prelude(ctx, op, facts)
    if isinstance(ops, tuple):
        return ops
    (x,) = ops
    start = list(op.attrs["start_indices"])  # type: ignore[arg-type]
    limit = list(op.attrs["limit_indices"])  # type: ignore[arg-type]
    strides = list(op.attrs["strides"])  # type: ignore[arg-type]
    xlocal = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    for d, axes in enumerate(x.layout.dims):
        if not axes:
            continue
        if (start[d], limit[d], strides[d]) != (0, xlocal[d], 1):
            return (ctx.unsupported(op, f"a static slice of dim {d}, which is split over {list(axes)}"),)
        limit[d] = x.term.type.shape[d]
    gshape = tuple(-(-(hi - lo) // st) for lo, hi, st in zip(start, limit, strides, strict=True))
    attrs = (("limit_indices", tuple(limit)), ("start_indices", tuple(start)), ("strides", tuple(strides)))
    term = ctx.terms.apply("slice", (x.term,), attrs, TensorType(gshape, op.result.tensor.dtype))
    return (Holds(term, x.layout, x.origin),)


def concatenate(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    ops = _prelude(ctx, op, facts)
    if isinstance(ops, tuple):
        return ops
    dim = int(op.attrs["dimension"])  # type: ignore[arg-type]
    partials = {h.layout.partial for h in ops}
    target = join([Layout(h.layout.dims) for h in ops])
    if target is None or len(partials) != 1 or target.dims[dim]:
        return (ctx.unsupported(op, "a concatenate of differently laid out operands or along a split dim"),)
    terms = []
    for h in ops:
        t = view(h.term, h.layout, target.dims, ctx.mesh, ctx.terms)
        if t is None:
            return (ctx.unsupported(op, "a concatenate of differently laid out operands"),)
        terms.append(t)
    shape = list(terms[0].type.shape)
    shape[dim] = sum(t.type.shape[dim] for t in terms)
    term = ctx.terms.apply("concatenate", tuple(terms), (("dimension", dim),),
                           TensorType(tuple(shape), op.result.tensor.dtype))
    return (Holds(term, Layout(target.dims, next(iter(partials))), ops[0].origin),)


def pad(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return (ops,)
    x, value = ops
    lo, hi, inner = (tuple(op.attrs[k]) for k in ("edge_padding_low", "edge_padding_high",  # type: ignore[arg-type]
                                                  "interior_padding"))
    if any(x.layout.dims[d] and (lo[d], hi[d], inner[d]) != (0, 0, 0) for d in range(len(lo))):
        return (ctx.unsupported(op, "padding a split dim"),)
    if x.layout.partial and ctx.fold(value.term) is not None and np.any(ctx.fold(value.term)):
        return (ctx.fail(op, "padding a partial value with a non-zero value", evidence=True, origin=x.origin),)
    shape = tuple(n + a + b + max(n - 1, 0) * c for n, a, b, c in zip(x.term.type.shape, lo, hi, inner, strict=True))
    attrs = (("edge_padding_high", hi), ("edge_padding_low", lo), ("interior_padding", inner))
    term = ctx.terms.apply("pad", (x.term, value.term), attrs, TensorType(shape, op.result.tensor.dtype))
    return (Holds(term, x.layout, x.origin),)


def reverse(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return (ops,)
    (x,) = ops
    dims = tuple(op.attrs["dimensions"])  # type: ignore[arg-type]
    t = x.term
    whole = tuple(d for d in dims if not x.layout.dims[d])
    if whole:
        t = ctx.terms.apply("reverse", (t,), (("dimensions", whole),), TensorType(t.type.shape, op.result.tensor.dtype))
    for d in dims:
        if x.layout.dims[d]:
            # Each device reverses its own block: the rows of every block reversed, the blocks kept in place.
            n = ctx.mesh.size_of(x.layout.dims[d])
            if t.type.shape[d] % n:
                return (ctx.unsupported(op, f"reversing dim {d}, split in uneven blocks"),)
            t = reverse_blocks(ctx.terms, t, d, n, within=True)
    return (Holds(t, x.layout, x.origin),)


def iota(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    t = op.result.tensor
    term = ctx.terms.iota(int(op.attrs["iota_dimension"]), t)  # type: ignore[arg-type]
    return (Holds(term, Layout.replicated(t.rank)),)


def constant(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    t = op.result.tensor
    return (Holds(ctx.terms.apply("constant", (), (("value", op.attrs["value"]),), t), Layout.replicated(t.rank)),)
