"""Transfer rules for the collectives: what each one does to a `Holds` fact (DESIGN §3).

An all-reduce removes the partial axes its groups span, if its reducer is theirs; over axes where the
value is replicated it multiplies (a new value); over axes where it is split it adds different shards
(an exact, usually unintended, fold). An all-gather removes a split only in the order of the shards, or
(`tiled=False`: along another, unsplit dim) moves the split's digits into that dim in group order; a
reduce-scatter is an all-reduce then a split; an all-to-all moves a split from one dim to another; a
cyclic collective-permute rolls the shards. `partition-id` starts the device-dependent index arithmetic.
"""

from __future__ import annotations

import numpy as np
from scalify_hlo.rules import argreduce, perblock
from scalify_hlo.rules.facts import (
    Best,
    Blocks,
    Ctx,
    Fact,
    Failed,
    Holds,
    PerBlock,
    Varying,
    regroup,
    unshifted,
    upstream,
)
from scalify_hlo.rules.spmd import axes_text

from scalify_hlo.ir.errors import ShardingError, UnmodelledShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType
from scalify_hlo.layout.groups import (
    axes_of_groups,
    block_sources,
    device_groups,
    has_channel,
    relaid_by_pairs,
    shift_of_pairs,
)
from scalify_hlo.layout.mesh import Layout, Reducer
from scalify_hlo.ops.reducers import COLLECTIVE_NAME, identity, reducer_of
from scalify_hlo.terms.movement import reverse_blocks
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

# --------------------------------------------------------------------------------------------- collectives

def groups_axes(ctx: Ctx, op: Op, *, ordered: bool = True) -> tuple[str, ...] | Failed:
    """The mesh axes `op`'s replica groups span. `ordered=False` (all-reduce) reads each group as a set:
    the order of its members is then no evidence of anything."""
    if not has_channel(op):
        return ()  # cross-replica with one replica: every partition is its own group
    try:
        return axes_of_groups(device_groups(op, ctx.mesh.size), ctx.mesh, ctx.mesh.size, ordered=ordered)
    except UnmodelledShardingError as err:
        # Legal groups the mesh model cannot express: unknown, not a discrepancy without a counterexample.
        return ctx.unsupported(op, err.message)
    except ShardingError as err:
        return ctx.fail(op, f"{op.opcode}: {err.message}", evidence=True)


def all_reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = groups_axes(ctx, op, ordered=False)  # a reduction: who comes first in a group does not matter
    reducer = reducer_of(op.regions[0]) if op.regions else None
    out: list[Fact] = []
    for f in facts:
        if isinstance(axes, Failed):
            out.append(axes)
        elif reducer is None:
            out.append(ctx.unsupported(op, "an all-reduce whose body is not a single add/max/min/mul/and/or"))
        else:
            out.append(all_reduce_one(ctx, op, ctx.lift(f) if isinstance(f, Varying) else f, axes, reducer))
    return tuple(out)


def all_reduce_one(ctx: Ctx, op: Op, f: Fact, axes: tuple[str, ...], reducer: Reducer) -> Fact:
    if isinstance(f, Failed):
        return upstream(f, op)
    if isinstance(f, PerBlock):
        return perblock.all_reduce(ctx, f, axes, reducer)
    if isinstance(f, Best):
        return argreduce.least(ctx, op, f, axes, reducer)
    if not isinstance(f, Holds):
        return ctx.unsupported(op, "an all-reduce of a non-tensor")
    layout, term = f.layout, f.term
    partial = dict(layout.partial)
    remaining = set(partial) - set(axes)
    for a in axes:
        if a in partial:
            if partial[a] is not reducer:
                return ctx.fail(op, f"all-reduce {reducer.value} over {axes_text(ctx, frozenset(axes))} but the value "
                                f"is partial under {partial[a].value} over \"{a}\"", evidence=True,
                                origin=f.origin, expected=f"{COLLECTIVE_NAME[partial[a]]}",
                                found=f"{COLLECTIVE_NAME[reducer]}", partial=True)
            del partial[a]
        elif a in layout.split_axes():
            folded = _fold_shards(ctx, term, layout, a, reducer)
            if folded is None:
                return ctx.unsupported(op, f"an all-reduce over \"{a}\", which splits a dim together with other axes")
            term, layout = folded
        elif reducer is Reducer.SUM:
            # Summing n copies of the same value is n times the value: a new value, not the old one.
            n = ctx.mesh.axis_size(a)
            scale = ctx.terms.scalar(float(n), term.type.dtype)
            bcast = ctx.terms.apply("broadcast_in_dim", (scale,), (("broadcast_dimensions", ()),), term.type)
            term = ctx.terms.apply("multiply", (term, bcast), (), term.type)
        elif reducer is Reducer.PROD:
            return ctx.unsupported(op, "product all-reduce of replicated values")
    # Reducing over replicated axes while other axes stay partial is the classic "psum over the wrong
    # axis": this op, not the one that made the value partial, is where the fix goes.
    wasted = [a for a in axes if a not in dict(layout.partial) and a not in layout.split_axes()]
    origin = (op if wasted else f.origin) if remaining else None
    return Holds(term, Layout(layout.dims, tuple(partial.items())), origin)


def _fold_shards(ctx: Ctx, term: Term, layout: Layout, a: str, reducer: Reducer) -> tuple[Term, Layout] | None:
    """All-reducing a value split over `a` combines *different* shards: the result is the reduction of
    the tensor's blocks along that dim (exact; usually not what the program meant, which the term
    comparison then shows). With the dim split over axes around `a` too, the blocks are those of the
    digit of `a`: the result stays split over the others, in their order."""
    d = next(i for i, dd in enumerate(layout.dims) if a in dd)
    axes = layout.dims[d]
    k = axes.index(a)
    major = ctx.mesh.size_of(axes[:k])
    if reducer not in (Reducer.SUM, Reducer.MAX, Reducer.MIN):
        return None
    n = ctx.mesh.axis_size(a)
    shape = term.type.shape
    rest = shape[d] // (major * n)  # the minor axes' blocks and each device's rows
    split = (*shape[:d], major, n, rest, *shape[d + 1:])
    dtype = term.type.dtype
    t = ctx.terms.apply("reshape", (term,), (), TensorType(split, dtype))
    init = ctx.terms.scalar(identity(reducer, dtype), dtype)
    red = (d + 1,)
    reduced = TensorType((*shape[:d], major, rest, *shape[d + 1:]), dtype)
    t = ctx.terms.apply("reduce", (t, init), (("dimensions", red), ("reducer", reducer.value)), reduced)
    t = ctx.terms.apply("reshape", (t,), (), TensorType((*shape[:d], major * rest, *shape[d + 1:]), dtype))
    dims = list(layout.dims)
    dims[d] = axes[:k] + axes[k + 1:]
    return t, Layout(tuple(dims), layout.partial)


def all_gather(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = groups_axes(ctx, op)
    dim = int(op.attrs["all_gather_dim"])  # type: ignore[arg-type]
    out: list[Fact] = []
    for f in facts:
        f = ctx.lift(f) if isinstance(f, Varying) else unshifted(ctx, f)
        if isinstance(axes, Failed) or isinstance(f, Failed):
            bad = axes if isinstance(axes, Failed) else f
            assert isinstance(bad, Failed)
            out.append(bad if bad is axes else upstream(bad, op))
            continue
        if isinstance(f, Blocks):
            out.append(argreduce.all_gather(ctx, op, f, axes, dim))
            continue
        if not isinstance(f, Holds):
            out.append(ctx.unsupported(op, "an all-gather of a non-tensor"))
            continue
        have = f.layout.dims[dim]
        if f.layout.partial_axes() & set(axes):
            out.append(ctx.fail(op, f"all-gather over {axes_text(ctx, frozenset(axes))} of a value that is partial "
                                "over them: a psum (or reduce-scatter) was meant", evidence=True, origin=f.origin))
        elif have[len(have) - len(axes):] == axes and axes:
            dims = list(f.layout.dims)
            dims[dim] = have[: len(have) - len(axes)]
            out.append(Holds(f.term, Layout(tuple(dims), f.layout.partial), f.origin))
        elif set(axes) & set(have):
            out.append(ctx.fail(op, f"all-gather along dim {dim} over {list(axes)} but the dim is split over "
                                f"{list(have)}: the group order does not match the shard order", evidence=True,
                                expected=f"gather over the minor axes {list(have)}", found=str(list(axes))))
        elif set(axes) & f.layout.split_axes():
            out.append(_gather_into_new_dim(ctx, op, f, axes, dim))
        else:
            out.append(Holds(ctx.terms.tile(f.term, dim, ctx.mesh.size_of(axes)), f.layout, f.origin))
    return tuple(out)


def _gather_into_new_dim(ctx: Ctx, op: Op, f: Holds, axes: tuple[str, ...], d: int) -> Fact:
    """An all-gather along an unsplit dim `d` of a value split over `axes` along another dim `e`: what
    `all_gather(tiled=False)` lowers to (a new unit dim, then the gather along it). Member `j` of a group
    sends its block of `e`, so position `j` of `d` now indexes the `axes` digits of `e` (in group order)
    and `e` keeps its other axes: the result is replicated over `axes` and holds a data movement of the
    old tensor (the `axes` digits of `e` moved to the major end of `d`)."""
    layout, term = f.layout, f.term
    owners = [e for e, dd in enumerate(layout.dims) if set(axes) & set(dd)]
    if len(owners) != 1 or layout.dims[d] or not set(axes) <= set(layout.dims[owners[0]]):
        return ctx.unsupported(op, f"an all-gather along dim {d} over {list(axes)} of a value laid out as "
                               f"{ctx.describe(layout)}")
    (e,) = owners
    have = layout.dims[e]
    shape = term.type.shape
    n = ctx.mesh.size_of(have)
    if shape[e] % n:
        return ctx.unsupported(op, f"an all-gather of an unevenly split dim {e}")
    digits = [[(f"_{i}", s)] for i, s in enumerate(shape)]
    digits[e] = [*((a, ctx.mesh.axis_size(a)) for a in have), ("_local", shape[e] // n)]
    target = [[f"_{i}"] for i in range(len(shape))]
    target[d] = [*axes, f"_{d}"]
    rest = tuple(a for a in have if a not in axes)
    target[e] = [*rest, "_local"]
    moved = regroup(ctx.terms, term, digits, target)
    dims = list(layout.dims)
    dims[e] = rest
    return Holds(moved, Layout(tuple(dims), layout.partial), f.origin)


def reduce_scatter(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = groups_axes(ctx, op)
    reducer = reducer_of(op.regions[0]) if op.regions else None
    dim = int(op.attrs["scatter_dimension"])  # type: ignore[arg-type]
    (f,) = facts
    if isinstance(axes, Failed):
        return (axes,)
    if reducer is None:
        return (ctx.unsupported(op, "a reduce-scatter whose body is not a single add/max/min"),)
    if isinstance(f, PerBlock):
        return (upstream(f.failure, op),)
    reduced = all_reduce_one(ctx, op, ctx.lift(f) if isinstance(f, Varying) else f, axes, reducer)
    if not isinstance(reduced, Holds):
        return (reduced,)
    dims = list(reduced.layout.dims)
    dims[dim] = (*dims[dim], *axes)
    return (Holds(reduced.term, Layout(tuple(dims), reduced.layout.partial), reduced.origin),)


def all_to_all(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = groups_axes(ctx, op)
    split = int(op.attrs["split_dimension"])  # type: ignore[arg-type]
    concat = int(op.attrs["concat_dimension"])  # type: ignore[arg-type]
    out: list[Fact] = []
    for f in facts:
        f = ctx.lift(f) if isinstance(f, Varying) else f
        if isinstance(axes, Failed):
            out.append(axes)
        elif not isinstance(f, Holds):
            out.append(f if isinstance(f, Failed) else ctx.unsupported(op, "an all-to-all of a non-tensor"))
        elif not axes:
            out.append(f)
        elif f.layout.partial_axes() & set(axes):
            out.append(ctx.fail(op, f"all-to-all over {list(axes)} of a value partial over them", evidence=True,
                                origin=f.origin))
        elif split == concat:
            out.append(_all_to_all_same_dim(ctx, op, f, axes, split))
        else:
            have = f.layout.dims[concat]
            if have[len(have) - len(axes):] != axes:
                out.append(ctx.fail(op, f"all-to-all over {list(axes)} concatenates along dim {concat}, which is "
                                    f"split over {list(have)}: the groups do not match the shards", evidence=True))
                continue
            dims = list(f.layout.dims)
            dims[concat] = have[: len(have) - len(axes)]
            dims[split] = (*dims[split], *axes)
            out.append(Holds(f.term, Layout(tuple(dims), f.layout.partial), f.origin))
    return tuple(out)


def _all_to_all_same_dim(ctx: Ctx, op: Op, f: Holds, axes: tuple[str, ...], d: int) -> Fact:
    """XLA's array all-to-all (one dim): chunk `c` of dim `d` goes to device `c`, received chunks are
    stacked along `d` by source. It moves the split over `axes` from the dim `s` that had it (its shard
    index becomes dim `d`) to the chunks of dim `d`: onto the next dim when the chunks have size 1 (how
    XLA reshards sequence → heads: [.., n, 1, ..] → all-to-all → transpose → reshape), else as the
    major part of `d`. A dim `d` already split over other axes `B` keeps them, major: its chunks are cut
    from each device's block (how XLA takes a sorted dim whole: rows split over dp, the sorted columns
    moved from tp onto the rows). The new global value is a data movement of the old one."""
    layout, v = f.layout, f.term
    n = ctx.mesh.size_of(axes)
    s = next((i for i, dd in enumerate(layout.dims) if dd[len(dd) - len(axes):] == axes and dd), None)
    shape = v.type.shape
    nd = ctx.mesh.size_of(layout.dims[d])
    if s is None or s == d or shape[d] % (nd * n):
        return ctx.unsupported(op, f"an all-to-all along dim {d} of a value laid out as {ctx.describe(layout)}")
    before_a = layout.dims[s][: len(layout.dims[s]) - len(axes)]
    nb = ctx.mesh.size_of(before_a)
    m = shape[s] // (nb * n)
    k = shape[d] // (nd * n)
    e = d + 1 if k == 1 and d + 1 < len(shape) and not layout.dims[d + 1] else None
    # Digits of V: dim s = (b, j, i), dim d = (bd, c, kk) (bd: the block over d's own axes), other dims
    # as they are.
    fine: list[tuple[str, int]] = []
    for i, size in enumerate(shape):
        if i == s:
            fine += [("b", nb), ("j", n), ("i", m)]
        elif i == d:
            fine += [("bd", nd), ("c", n), ("kk", k)]
        else:
            fine.append((f"x{i}", size))
    target: list[list[str]] = []
    for i in range(len(shape)):
        if i == s:
            target.append(["b", "i"])
        elif i == d:
            target.append(["bd", "j", "kk"] if e is not None else ["bd", "c", "j", "kk"])
        elif i == e:
            target.append(["c", f"x{i}"])
        else:
            target.append([f"x{i}"])
    names = [nm for nm, _ in fine]
    sizes = dict(fine)
    order = [names.index(nm) for run in target for nm in run]
    dtype = v.type.dtype
    t = ctx.terms.apply("reshape", (v,), (), TensorType(tuple(sz for _, sz in fine), dtype))
    t = ctx.terms.apply("transpose", (t,), (("permutation", tuple(order)),),
                        TensorType(tuple(fine[o][1] for o in order), dtype))
    gshape = tuple(int(np.prod([sizes[nm] for nm in run])) for run in target)
    t = ctx.terms.apply("reshape", (t,), (), TensorType(gshape, dtype))
    dims = list(layout.dims)
    dims[s] = before_a
    if e is not None:
        dims[e] = axes
    else:
        dims[d] = (*layout.dims[d], *axes)
    return Holds(t, Layout(tuple(dims), layout.partial), f.origin)


def collective_permute(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    (f,) = facts
    f = ctx.lift(f) if isinstance(f, Varying) else f
    if not isinstance(f, Holds):
        return (f if isinstance(f, Failed) else ctx.unsupported(op, "a permute of a non-tensor"),)
    pairs = op.attrs.get("source_target_pairs")
    if not isinstance(pairs, Literal):
        return (ctx.unsupported(op, "collective-permute without source-target pairs"),)
    shift = shift_of_pairs(pairs.array, ctx.mesh)
    if shift is not None:
        axis, k = shift
        if axis in f.layout.partial_axes() or axis not in f.layout.split_axes():
            return (f,)  # a permutation of identical copies (or of the summands of a partial sum) changes nothing
        d = next(i for i, dd in enumerate(f.layout.dims) if axis in dd)
        if f.layout.dims[d] == (axis,):
            block = f.term.type.shape[d] // ctx.mesh.axis_size(axis)
            return (Holds(rolled(ctx.terms, f.term, d, k * block), f.layout, f.origin),)
    relaid = relaid_by_pairs(pairs.array, ctx.mesh, f.layout)
    if relaid is not None and all(set(a) == set(b) for a, b in zip(relaid.dims, f.layout.dims, strict=True)):
        # The same axes on each dim in another order (`("dp", "tp")` → `("tp", "dp")`, before an all-gather over
        # the new minor axis): the same value relaid, as the collectives that follow read it, rather than a
        # tensor of permuted blocks.
        return (Holds(f.term, relaid, f.origin),)
    permuted = _permuted_blocks(ctx, f, pairs.array)
    if permuted is not None:
        return (permuted,)
    if relaid is not None:  # the same value, its blocks moved to where another layout has them
        return (Holds(f.term, relaid, f.origin),)
    return (ctx.unsupported(op, "a collective-permute that is neither a cyclic shift along one mesh axis, nor a "
                            "permutation of the blocks of one split dim, nor a move of every block to where "
                            "another layout holds it"),)


def _permuted_blocks(ctx: Ctx, f: Holds, pairs: np.ndarray) -> Holds | None:
    """Any permutation of the blocks of one split dim (every device sends and receives at most once, other
    coordinates kept): the device at block index j holds block src[j] (zeros where it receives nothing),
    so the value is the tensor whose j-th block is `f`'s block src[j] (`blocks_in_order`)."""
    for d, axes in enumerate(f.layout.dims):
        src = block_sources(pairs, ctx.mesh, axes) if axes and not f.layout.partial else None
        if src is None:
            continue
        term = blocks_in_order(ctx.terms, f.term, d, src)
        if term is None:
            return None
        return f if term is f.term else Holds(term, f.layout, f.origin)
    return None


def blocks_in_order(terms: Terms, t: Term, d: int, src: np.ndarray) -> Term | None:
    """The tensor whose j-th of `len(src)` blocks along `d` is `t`'s block src[j] (zeros where src[j] < 0):
    slices and zero blocks concatenated, consecutive blocks as one slice; `t` itself for the identity;
    None when the dim does not divide into that many blocks."""
    n = len(src)
    size = t.type.shape[d]
    if size % n:
        return None
    block = size // n
    runs: list[list[int]] = []  # [first source block, end] of consecutive blocks; [-1, count]: zeros
    for s in src.tolist():
        if runs and s >= 0 and runs[-1][0] >= 0 and runs[-1][1] == s:
            runs[-1][1] = s + 1
        elif runs and s < 0 and runs[-1][0] < 0:
            runs[-1][1] += 1
        else:
            runs.append([s, s + 1] if s >= 0 else [-1, 1])
    if runs == [[0, n]]:
        return t
    if src.tolist() == list(range(n - 1, -1, -1)):
        return reverse_blocks(terms, t, d, n, within=False)  # as `jnp.flip` of the blocks spells it
    parts = []
    for lo, hi in runs:
        if lo < 0:
            shape = tuple(hi * block if i == d else m for i, m in enumerate(t.type.shape))
            parts.append(terms.splat(0.0, TensorType(shape, t.type.dtype)))
        else:
            parts.append(rows_of(terms, t, d, lo * block, hi * block))
    return parts[0] if len(parts) == 1 else terms.apply("concatenate", tuple(parts), (("dimension", d),), t.type)


def rolled(terms: Terms, t: Term, dim: int, shift: int) -> Term:
    """`jnp.roll(t, shift, dim)` as JAX writes it: the last `shift` rows, then the others (a concatenate of
    two slices), so that a shift by permutes meets the reference's roll."""
    n = t.type.shape[dim]
    s = shift % n
    if s == 0:
        return t
    parts = (rows_of(terms, t, dim, n - s, n), rows_of(terms, t, dim, 0, n - s))
    return terms.apply("concatenate", parts, (("dimension", dim),), t.type)


def rows_of(terms: Terms, t: Term, dim: int, lo: int, hi: int) -> Term:
    """Rows `[lo, hi)` of `t` along `dim`: a static slice."""
    start = tuple(lo if i == dim else 0 for i in range(t.type.rank))
    limit = tuple(hi if i == dim else m for i, m in enumerate(t.type.shape))
    shape = tuple(hi - lo if i == dim else m for i, m in enumerate(t.type.shape))
    attrs = (("limit_indices", limit), ("start_indices", start), ("strides", (1,) * t.type.rank))
    return terms.apply("slice", (t,), attrs, TensorType(shape, t.type.dtype))


def partition_id(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    import numpy as np

    ids = np.arange(ctx.mesh.size, dtype=np.uint32)
    return (Varying(ids, op.result.tensor),)


def replica_id(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    import numpy as np

    return (Varying(np.zeros(ctx.mesh.size, dtype=np.uint32), op.result.tensor),)


