"""Transfer rules for how values are spread over devices (DESIGN §3).

Elementwise ops on shards and on partial values, contractions and reductions over split dims (which
make values partial), and the collectives that combine them again. Each rule is a function
`(ctx, op, facts) -> facts` registered in `semantics.OPS`. A rule either derives `Holds` for its result
or says why not: with `evidence=True` when the layouts contradict each other (the program is wrong), with
`evidence=False` when we merely cannot tell (the verdict is then `unknown`).
"""

from __future__ import annotations

import numpy as np

from scalify_hlo.errors import ShardingError
from scalify_hlo.facts import Ctx, Fact, Failed, Holds, TupleFact, Varying, join, view
from scalify_hlo.ir import Literal, Op, Region, TensorType
from scalify_hlo.mesh import Layout, Reducer, axes_of_groups, shift_of_pairs
from scalify_hlo.terms import Term, scalar_value

REDUCER_OF_OP = {"add": Reducer.SUM, "maximum": Reducer.MAX, "minimum": Reducer.MIN,
                 "multiply": Reducer.PROD, "and": Reducer.AND, "or": Reducer.OR}
COLLECTIVE_NAME = {Reducer.SUM: "psum", Reducer.MAX: "pmax", Reducer.MIN: "pmin", Reducer.PROD: "pprod",
                   Reducer.AND: "pand", Reducer.OR: "por"}


def reducer_of(region: Region) -> Reducer | None:
    """The reducer of a two-argument region that applies one associative op to its arguments."""
    if len(region.args) != 2 or len(region.ops) != 1 or len(region.results) != 1:
        return None
    (op,) = region.ops
    if op.results != region.results or set(op.operands) != set(region.args):
        return None
    return REDUCER_OF_OP.get(op.opcode)


def _axes(ctx: Ctx, axes: tuple[str, ...] | frozenset[str]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in sorted(axes)) + "}"


def _is_zero(t: Term) -> bool:
    v = scalar_value(t)
    return v is not None and v == 0.0


# ---------------------------------------------------------------------------------------- elementwise

def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


def _partial_allowed(op: Op, partial: list[bool], reducer: Reducer) -> bool:
    """Whether `op` applied devicewise and then reduced equals the op applied to the reduced values.

    SUM: the op must be linear in the partial operands (all of them jointly), every other operand
    constant over the reduced devices. MAX/MIN: the op must be monotone in the partial operands (and a
    min under MAX, or a max under MIN, may see only one of them). A literal zero is a partial value of
    any reducer (the sum of zeros is zero)."""
    opcode, n = op.opcode, len(partial)
    if opcode == "convert":
        # Exact over the reals for float → float only; float → int truncates each summand.
        if not (_is_float(op.operands[0].tensor.dtype) and _is_float(op.result.tensor.dtype)):
            return False
        return reducer in (Reducer.SUM, Reducer.MAX, Reducer.MIN)
    if reducer is Reducer.SUM:
        if opcode in ("add", "subtract"):
            return all(partial)
        if opcode in ("negate", "copy", "real", "imag"):
            return True
        if opcode == "multiply":
            return sum(partial) == 1
        if opcode == "divide":
            return partial == [True, False]
        if opcode == "select":
            return not partial[0] and all(partial[1:])
        return False
    if reducer in (Reducer.MAX, Reducer.MIN):
        same, other = ("maximum", "minimum") if reducer is Reducer.MAX else ("minimum", "maximum")
        if opcode in (same, "copy"):
            return True
        if opcode == other:
            return sum(partial) == 1
        if opcode == "add":
            return sum(partial) == 1
        if opcode == "subtract":
            return partial[0] and not any(partial[1:]) and n == 2
        if opcode == "select":
            return not partial[0] and all(partial[1:])
    return False


def elementwise(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    holds = list(facts)
    if any(isinstance(f, Varying) for f in holds):
        computed = ctx.varying(op, facts)
        if computed is not None:
            return (computed,)
        holds = [ctx.lift(f) if isinstance(f, Varying) else f for f in holds]
    for f in holds:
        if isinstance(f, Failed):
            return (Failed(f.reason, op, f.evidence, True, f.origin),)
    hs = [f for f in holds if isinstance(f, Holds)]
    if len(hs) != len(holds):
        return (ctx.unsupported(op, "operands that are not tensors"),)
    zero_like = [_is_zero(h.term) and not h.layout.partial for h in hs]
    partials = {h.layout.partial for h, z in zip(hs, zero_like, strict=True) if h.layout.partial and not z}
    origin = next((h.origin for h in hs if h.layout.partial), None)
    if len(partials) > 1:
        return (ctx.fail(op, f"{op.opcode} combines values partial over different axes "
                         f"({'; '.join(ctx.describe(Layout((), p)) for p in partials)})", evidence=True,
                         origin=origin),)
    partial = next(iter(partials), ())
    if partial:
        reducers = {r for _, r in partial}
        is_partial = [bool(h.layout.partial) or z for h, z in zip(hs, zero_like, strict=True)]
        axes = frozenset(a for a, _ in partial)
        if len(reducers) != 1 or not _partial_allowed(op, is_partial, next(iter(reducers))):
            r = next(iter(reducers))
            return (ctx.fail(
                op, f"{op.opcode} is applied to a value that is still partial over {_axes(ctx, axes)} "
                f"(each device holds a partial {r.value}); a {COLLECTIVE_NAME[r]} over {_axes(ctx, axes)} "
                "is missing before it", evidence=True, origin=origin,
                expected="no partial axes", found=ctx.describe(Layout((), partial))),)
    dims = join([Layout(h.layout.dims) for h in hs])
    if dims is None:
        return (_misaligned(ctx, op, hs),)
    try:
        target = Layout(dims.dims, partial)
    except ShardingError:
        return (_misaligned(ctx, op, hs),)
    terms = []
    for h in hs:
        t = view(h.term, h.layout, target.dims, ctx.mesh, ctx.terms)
        if t is None:
            return (_misaligned(ctx, op, hs),)
        terms.append(t)
    gtype = TensorType(terms[0].type.shape, op.result.tensor.dtype)
    term = ctx.terms.apply(op.opcode, tuple(terms), term_attrs(op), gtype)
    return (Holds(term, target, origin if partial else None),)


def _misaligned(ctx: Ctx, op: Op, hs: list[Holds]) -> Failed:
    found = "; ".join(ctx.describe(h.layout) for h in hs)
    # Not evidence: per-device values can combine shards no layout describes (the diagonal blocks of
    # ring attention). Only the term comparison or a counterexample can say it is wrong.
    return ctx.fail(op, f"{op.opcode} combines shards that do not line up: its operands are laid out as "
                    f"{found}", evidence=False, found=found)


# ------------------------------------------------------------------------------------------- contractions

def dot_general(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    lhs, rhs = (ctx.lift(f) if isinstance(f, Varying) else f for f in facts)
    if not isinstance(lhs, Holds) or not isinstance(rhs, Holds):
        bad = lhs if isinstance(lhs, Failed) else rhs
        if isinstance(bad, Failed):
            return (Failed(bad.reason, op, bad.evidence, True, bad.origin),)
        return (ctx.unsupported(op, "operands that are not tensors"),)
    dims = op.attrs.get("dot_dimension_numbers")
    from scalify_hlo.ir import DotDims

    if not isinstance(dims, DotDims):
        dims = DotDims((), (), (lhs.term.type.rank - 1,), (0,))
    if lhs.layout.partial and rhs.layout.partial:
        return (ctx.fail(op, "dot_general of two partial values: the products of partial sums are not the "
                         "product of the sums; a psum is missing", evidence=True, origin=lhs.origin),)
    partial_in = lhs.layout.partial or rhs.layout.partial
    origin = lhs.origin if lhs.layout.partial else rhs.origin
    ld, rd = list(lhs.layout.dims), list(rhs.layout.dims)
    lt, rt = lhs.term, rhs.term
    # Batch and contracting dims must be split alike on both sides; where one side is replicated over
    # the other side's axes, view it as the tiled tensor (the same rule as elementwise operands).
    for li, ri in (*zip(dims.lhs_batch, dims.rhs_batch, strict=True),
                   *zip(dims.lhs_contract, dims.rhs_contract, strict=True)):
        if ld[li] == rd[ri]:
            continue
        a, b = ld[li], rd[ri]
        if b == a[len(a) - len(b):] and not (set(a) - set(b)) & (rhs.layout.split_axes() | rhs.layout.partial_axes()):
            rt = ctx.terms.tile(rt, ri, ctx.mesh.size_of(a[: len(a) - len(b)]))
            rd[ri] = a
        elif a == b[len(b) - len(a):] and not (set(b) - set(a)) & (lhs.layout.split_axes() | lhs.layout.partial_axes()):
            lt = ctx.terms.tile(lt, li, ctx.mesh.size_of(b[: len(b) - len(a)]))
            ld[li] = b
        else:
            return (ctx.fail(op, f"dot_general contracts or batches dims split differently: lhs dim {li} over "
                             f"{_axes(ctx, frozenset(a))}, rhs dim {ri} over {_axes(ctx, frozenset(b))}",
                             evidence=True, found=f"{ctx.describe(lhs.layout)} · {ctx.describe(rhs.layout)}"),)
    contracted = [a for i in dims.lhs_contract for a in ld[i]]
    lhs_free = [i for i in range(len(ld)) if i not in dims.lhs_batch and i not in dims.lhs_contract]
    rhs_free = [i for i in range(len(rd)) if i not in dims.rhs_batch and i not in dims.rhs_contract]
    out_dims = [ld[i] for i in dims.lhs_batch] + [ld[i] for i in lhs_free] + [rd[i] for i in rhs_free]
    partial = dict(partial_in)
    if partial and any(r is not Reducer.SUM for r in partial.values()):
        return (ctx.fail(op, "dot_general of a value partial under max/min", evidence=True, origin=origin),)
    for axis in contracted:
        partial[axis] = Reducer.SUM
    try:
        layout = Layout(tuple(out_dims), tuple(partial.items()))
    except ShardingError:
        return (ctx.fail(op, "dot_general's result would use one mesh axis twice (both operands' free dims "
                         "are split over it): each device multiplies blocks no layout describes", evidence=False,
                         found=f"{ctx.describe(lhs.layout)} · {ctx.describe(rhs.layout)}"),)
    gtype = TensorType(
        tuple(lt.type.shape[i] for i in dims.lhs_batch) + tuple(lt.type.shape[i] for i in lhs_free)
        + tuple(rt.type.shape[i] for i in rhs_free), op.result.tensor.dtype)
    term = ctx.terms.apply("dot_general", (lt, rt), (("dot_dimension_numbers", dims),), gtype)
    return (Holds(term, layout, op if contracted else origin),)


def reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    n = len(op.results)
    if n != 1:
        return _variadic_reduce(ctx, op, facts)
    x, init = (ctx.lift(f) if isinstance(f, Varying) else f for f in facts)
    for f in (x, init):
        if isinstance(f, Failed):
            return (Failed(f.reason, op, f.evidence, True, f.origin),)
    if not isinstance(x, Holds) or not isinstance(init, Holds):
        return (ctx.unsupported(op, "operands that are not tensors"),)
    reducer = reducer_of(op.regions[0])
    if reducer is None:
        return (ctx.unsupported(op, "a reduction whose body is not a single add/max/min/mul/and/or"),)
    red = tuple(op.attrs["dimensions"])  # type: ignore[arg-type]
    split = [a for d in red for a in x.layout.dims[d]]
    if init.layout.partial:
        return (ctx.fail(op, "reduce with a partial init value", evidence=True),)
    partial = dict(x.layout.partial)
    if partial and any(r is not reducer for r in partial.values()):
        r = next(iter(partial.values()))
        return (ctx.fail(op, f"reduce {reducer.value} of a value partial under {r.value}; a "
                         f"{COLLECTIVE_NAME[r]} is missing before it", evidence=True, origin=x.origin),)
    if (split or partial) and not _is_identity(init.term, reducer):
        return (ctx.fail(op, "reduce over a split dim with an init value that is not the reducer's identity: "
                         "every device adds it once", evidence=True),)
    for a in split:
        partial[a] = reducer
    layout = Layout(tuple(d for i, d in enumerate(x.layout.dims) if i not in red), tuple(partial.items()))
    gshape = tuple(s for i, s in enumerate(x.term.type.shape) if i not in red)
    term = ctx.terms.apply("reduce", (x.term, init.term), (("dimensions", red), ("reducer", reducer.value)),
                           TensorType(gshape, op.result.tensor.dtype))
    return (Holds(term, layout, op if split else x.origin),)


def _variadic_reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A reduction of several operands with one body (argmax: values and indices). Supported where the
    reduced dims are whole on every device: then it is the global reduction, shard by shard."""
    from scalify_hlo.semantics import term_attrs

    held: list[Holds] = []
    for f in facts:
        g = ctx.lift(f) if isinstance(f, Varying) else f
        if not isinstance(g, Holds):
            bad = g if isinstance(g, Failed) else ctx.unsupported(op, "operands that are not tensors")
            return tuple(bad for _ in op.results)
        held.append(g)
    k = len(op.results)
    red = tuple(op.attrs["dimensions"])  # type: ignore[arg-type]
    xs, inits = held[:k], held[k:]
    layout = join([Layout(h.layout.dims) for h in xs])
    if layout is None or any(h.layout.partial for h in held) or any(i.layout.split_axes() for i in inits):
        return tuple(ctx.unsupported(op, "a variadic reduce of operands laid out differently or partial")
                     for _ in op.results)
    if any(layout.dims[d] for d in red):
        return tuple(ctx.unsupported(op, "a variadic reduce (argmax-style) over a split dim") for _ in op.results)
    viewed = [view(h.term, h.layout, layout.dims, ctx.mesh, ctx.terms) for h in xs]
    if any(t is None for t in viewed):
        return tuple(ctx.unsupported(op, "a variadic reduce of operands laid out differently") for _ in op.results)
    out_layout = Layout(tuple(d for i, d in enumerate(layout.dims) if i not in red))
    args = (*(t for t in viewed if t is not None), *(h.term for h in inits))
    shape = tuple(s for i, s in enumerate(args[0].type.shape) if i not in red)
    return tuple(Holds(ctx.terms.mk("reduce", args, (*term_attrs(op), ("index", i)), TensorType(shape, r.tensor.dtype)),
                       out_layout) for i, r in enumerate(op.results))


def _is_identity(t: Term, reducer: Reducer) -> bool:
    v = scalar_value(t)
    if v is None:
        return False
    ident = {Reducer.SUM: 0.0, Reducer.PROD: 1.0, Reducer.MAX: float("-inf"), Reducer.MIN: float("inf"),
             Reducer.OR: 0.0, Reducer.AND: 1.0}[reducer]
    if reducer in (Reducer.MAX, Reducer.MIN) and t.type.dtype.startswith(("i", "ui")):
        return True  # integer max/min inits are the type's extreme values
    return v == ident


# --------------------------------------------------------------------------------------------- collectives

def _groups_axes(ctx: Ctx, op: Op) -> tuple[str, ...] | Failed:
    groups = op.attrs.get("replica_groups")
    if "channel_handle" not in op.attrs:
        return ()  # cross-replica with one replica: every partition is its own group
    arr = groups.array if isinstance(groups, Literal) else None
    try:
        import numpy as np

        return axes_of_groups(arr if arr is not None else np.zeros((0,), dtype=np.int64), ctx.mesh, ctx.mesh.size)
    except ShardingError as err:
        return ctx.fail(op, f"{op.opcode}: {err.message}", evidence=True)


def all_reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = _groups_axes(ctx, op)
    reducer = reducer_of(op.regions[0]) if op.regions else None
    out: list[Fact] = []
    for f in facts:
        if isinstance(axes, Failed):
            out.append(axes)
        elif reducer is None:
            out.append(ctx.unsupported(op, "an all-reduce whose body is not a single add/max/min/mul/and/or"))
        else:
            out.append(_all_reduce_one(ctx, op, ctx.lift(f) if isinstance(f, Varying) else f, axes, reducer))
    return tuple(out)


def _all_reduce_one(ctx: Ctx, op: Op, f: Fact, axes: tuple[str, ...], reducer: Reducer) -> Fact:
    if isinstance(f, Failed):
        return Failed(f.reason, op, f.evidence, True, f.origin)
    if not isinstance(f, Holds):
        return ctx.unsupported(op, "an all-reduce of a non-tensor")
    layout, term = f.layout, f.term
    partial = dict(layout.partial)
    remaining = set(partial) - set(axes)
    for a in axes:
        if a in partial:
            if partial[a] is not reducer:
                return ctx.fail(op, f"all-reduce {reducer.value} over {_axes(ctx, frozenset(axes))} but the value "
                                f"is partial under {partial[a].value} over \"{a}\"", evidence=True,
                                origin=f.origin, expected=f"{COLLECTIVE_NAME[partial[a]]}",
                                found=f"{COLLECTIVE_NAME[reducer]}")
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
    comparison then shows)."""
    d = next(i for i, dd in enumerate(layout.dims) if a in dd)
    axes = layout.dims[d]
    k = axes.index(a)
    major, minor = ctx.mesh.size_of(axes[:k]), ctx.mesh.size_of(axes[k + 1:])
    if minor != 1 or reducer not in (Reducer.SUM, Reducer.MAX, Reducer.MIN):
        return None  # minor axes would interleave with the folded blocks
    n = ctx.mesh.axis_size(a)
    shape = term.type.shape
    rest = shape[d] // (major * n)
    split = (*shape[:d], major, n, rest, *shape[d + 1:])
    dtype = term.type.dtype
    t = ctx.terms.apply("reshape", (term,), (), TensorType(split, dtype))
    init = ctx.terms.scalar({Reducer.SUM: 0.0, Reducer.MAX: float("-inf"), Reducer.MIN: float("inf")}[reducer], dtype)
    red = (d + 1,)
    reduced = TensorType((*shape[:d], major, rest, *shape[d + 1:]), dtype)
    t = ctx.terms.apply("reduce", (t, init), (("dimensions", red), ("reducer", reducer.value)), reduced)
    t = ctx.terms.apply("reshape", (t,), (), TensorType((*shape[:d], major * rest, *shape[d + 1:]), dtype))
    dims = list(layout.dims)
    dims[d] = axes[:k]
    return t, Layout(tuple(dims), layout.partial)


def all_gather(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = _groups_axes(ctx, op)
    dim = int(op.attrs["all_gather_dim"])  # type: ignore[arg-type]
    out: list[Fact] = []
    for f in facts:
        f = ctx.lift(f) if isinstance(f, Varying) else f
        if isinstance(axes, Failed) or isinstance(f, Failed):
            bad = axes if isinstance(axes, Failed) else f
            assert isinstance(bad, Failed)
            out.append(bad if bad is axes else Failed(bad.reason, op, bad.evidence, True, bad.origin))
            continue
        if not isinstance(f, Holds):
            out.append(ctx.unsupported(op, "an all-gather of a non-tensor"))
            continue
        have = f.layout.dims[dim]
        if f.layout.partial_axes() & set(axes):
            out.append(ctx.fail(op, f"all-gather over {_axes(ctx, frozenset(axes))} of a value that is partial "
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
            out.append(ctx.fail(op, f"all-gather along dim {dim} over {list(axes)}, but the value is split over "
                                f"them along another dim ({ctx.describe(f.layout)})", evidence=True))
        else:
            out.append(Holds(ctx.terms.tile(f.term, dim, ctx.mesh.size_of(axes)), f.layout, f.origin))
    return tuple(out)


def reduce_scatter(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = _groups_axes(ctx, op)
    reducer = reducer_of(op.regions[0]) if op.regions else None
    dim = int(op.attrs["scatter_dimension"])  # type: ignore[arg-type]
    (f,) = facts
    if isinstance(axes, Failed):
        return (axes,)
    if reducer is None:
        return (ctx.unsupported(op, "a reduce-scatter whose body is not a single add/max/min"),)
    reduced = _all_reduce_one(ctx, op, ctx.lift(f) if isinstance(f, Varying) else f, axes, reducer)
    if not isinstance(reduced, Holds):
        return (reduced,)
    dims = list(reduced.layout.dims)
    dims[dim] = (*dims[dim], *axes)
    return (Holds(reduced.term, Layout(tuple(dims), reduced.layout.partial), reduced.origin),)


def all_to_all(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    axes = _groups_axes(ctx, op)
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
    major part of `d`. The new global value is a data movement of the old one."""
    layout, v = f.layout, f.term
    n = ctx.mesh.size_of(axes)
    s = next((i for i, dd in enumerate(layout.dims) if dd[len(dd) - len(axes):] == axes and dd), None)
    if s is None or s == d or layout.dims[d]:
        return ctx.unsupported(op, f"an all-to-all along dim {d} of a value laid out as {ctx.describe(layout)}")
    shape = v.type.shape
    before_a = layout.dims[s][: len(layout.dims[s]) - len(axes)]
    nb = ctx.mesh.size_of(before_a)
    m = shape[s] // (nb * n)
    k = shape[d] // n
    e = d + 1 if k == 1 and d + 1 < len(shape) and not layout.dims[d + 1] else None
    # Digits of V: dim s = (b, j, i), dim d = (c, kk), other dims as they are.
    fine: list[tuple[str, int]] = []
    for i, size in enumerate(shape):
        if i == s:
            fine += [("b", nb), ("j", n), ("i", m)]
        elif i == d:
            fine += [("c", n), ("kk", k)]
        else:
            fine.append((f"x{i}", size))
    target: list[list[str]] = []
    for i in range(len(shape)):
        if i == s:
            target.append(["b", "i"])
        elif i == d:
            target.append(["j", "kk"] if e is not None else ["c", "j", "kk"])
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
    dims[e if e is not None else d] = axes
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
    if shift is None:
        return (ctx.unsupported(op, "a collective-permute that is not a cyclic shift along one mesh axis"),)
    axis, k = shift
    if axis in f.layout.partial_axes() or axis not in f.layout.split_axes():
        return (f,)  # a permutation of identical copies (or of the summands of a partial sum) changes nothing
    d = next(i for i, dd in enumerate(f.layout.dims) if axis in dd)
    if f.layout.dims[d] != (axis,):
        return (ctx.unsupported(op, "a shift along an axis that shares its dim with other axes"),)
    block = f.term.type.shape[d] // ctx.mesh.axis_size(axis)
    term = ctx.terms.mk("roll", (f.term,), (("dim", d), ("shift", k * block)), f.term.type)
    return (Holds(term, f.layout, f.origin),)


def partition_id(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    import numpy as np

    ids = np.arange(ctx.mesh.size, dtype=np.uint32)
    return (Varying(ids, op.result.tensor),)


def replica_id(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    import numpy as np

    return (Varying(np.zeros(ctx.mesh.size, dtype=np.uint32), op.result.tensor),)


def identity(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Ops that only annotate (sharding constraints, optimization barriers, copies)."""
    return facts[: len(op.results)] if len(facts) >= len(op.results) else facts


def tuple_(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    return (TupleFact(facts),)


def get_tuple_element(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    (f,) = facts
    if isinstance(f, TupleFact):
        return (f.elements[int(op.attrs["index"])],)  # type: ignore[arg-type]
    return (f,)


def term_attrs(op: Op) -> tuple[tuple[str, object], ...]:
    from scalify_hlo.semantics import term_attrs as _ta

    return _ta(op)
