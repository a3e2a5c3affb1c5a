"""Transfer rules for how values are spread over devices (DESIGN §3).

Elementwise ops on shards and on partial values, contractions and reductions over split dims (which
make values partial), and the collectives that combine them again. Each rule is a function
`(ctx, op, facts) -> facts` registered in `semantics.OPS`. A rule either derives `Holds` for its result
or says why not: with `evidence=True` when the layouts contradict each other (the program is wrong), with
`evidence=False` when we merely cannot tell (the verdict is then `unknown`).
"""

from __future__ import annotations

from scalify_hlo.rules import argreduce, perblock
from scalify_hlo.rules.facts import (
    Best,
    Blocks,
    Ctx,
    Fact,
    Failed,
    Holds,
    PerBlock,
    TupleFact,
    Varying,
    join,
    lift_as,
    realigned,
    upstream,
    view,
)

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import DotDims, Op, TensorType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.ops.reducers import COLLECTIVE_NAME, Reducer, is_identity, reducer_of
from scalify_hlo.terms.term import Term, scalar_value


def axes_text(ctx: Ctx, axes: tuple[str, ...] | frozenset[str]) -> str:
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
    by_hand = _argmax_by_hand(ctx, op, facts)
    if by_hand is not None:
        return (by_hand,)
    facts = tuple(argreduce.per_device(ctx, op, f) for f in facts)
    if any(isinstance(f, PerBlock) for f in facts):
        # (a device-varying scalar stays one: perblock reads it as a table over the blocks' axes)
        lifted = [ctx.lift(f) if isinstance(f, Varying) and f.type.rank else f for f in facts]
        return (perblock.combine(ctx, op, op.opcode, term_attrs(op), op.result.tensor, lifted),)
    holds = list(facts)
    if any(isinstance(f, Varying) for f in holds):
        computed = ctx.varying(op, facts)
        if computed is not None:
            return (computed,)
        # Numbers per device may be the shards of several tensors (a row mask with the batch dim one row per
        # device fits a split of either dim): first as laid out like the tensors they meet.
        like = join([Layout(f.layout.dims) for f in holds if isinstance(f, Holds) and f.term.type.rank])

        def as_met(f: Varying) -> Fact:
            fits = like if like is not None and len(like.dims) == f.type.rank else None
            return (lift_as(ctx, f, fits) if fits is not None else None) or ctx.lift(f, fits)
        holds = [as_met(f) if isinstance(f, Varying) else f for f in holds]
    for f in holds:
        if isinstance(f, Failed):
            return (upstream(f, op),)
    hs = [f for f in holds if isinstance(f, Holds)]
    if len(hs) != len(holds):
        return (ctx.not_tensors(op, holds),)
    out_t = op.result.tensor
    if op.opcode == "select" and hs[0].term.type.rank == 0 < out_t.rank and not hs[0].layout.partial:
        # A scalar predicate picks a whole operand: the same as its broadcast.
        pred = ctx.terms.apply("broadcast_in_dim", (hs[0].term,), (("broadcast_dimensions", ()),),
                               TensorType(out_t.shape, hs[0].term.type.dtype))
        hs[0] = Holds(pred, Layout.replicated(out_t.rank))
    zero_like = [_is_zero(h.term) and not h.layout.partial for h in hs]
    partials = {h.layout.partial for h, z in zip(hs, zero_like, strict=True) if h.layout.partial and not z}
    # Where the value was made partial; an all-reduce that left it partial (over other axes) is where the fix goes.
    origins = [h.origin for h in hs if h.layout.partial and h.origin is not None]
    origin = next((o for o in origins if o.opcode == "all_reduce"), origins[0] if origins else None)
    if len(partials) > 1:
        return (ctx.fail(op, f"{op.opcode} combines values partial over different axes "
                         f"({'; '.join(ctx.describe(Layout((), p)) for p in partials)})", evidence=True,
                         origin=origin, partial=True),)
    partial = next(iter(partials), ())
    if partial:
        reducers = {r for _, r in partial}
        is_partial = [bool(h.layout.partial) or z for h, z in zip(hs, zero_like, strict=True)]
        axes = frozenset(a for a, _ in partial)
        if len(reducers) != 1 or not _partial_allowed(op, is_partial, next(iter(reducers))):
            r = next(iter(reducers))
            failure = ctx.fail(
                op, f"{op.opcode} is applied to a value that is still partial over {axes_text(ctx, axes)} "
                f"(each device holds a partial {r.value}); a {COLLECTIVE_NAME[r]} over {axes_text(ctx, axes)} "
                "is missing before it", evidence=True, origin=origin,
                expected="no partial axes", found=ctx.describe(Layout((), partial)), partial=True)
            # Each device's local reduction of its block, used per device: carried on as the scalar per
            # device it is (the failure reported where it cannot be).
            return (perblock.reread(ctx, op, tuple(hs), failure),)
    dims = join([Layout(h.layout.dims) for h in hs])
    if dims is None:
        # (Numbers per device lifted to a tensor took the first layout that fit: no realignment of those.)
        again = None if any(isinstance(f, Varying) for f in facts) else realigned(hs, ctx.mesh, ctx.terms)
        if again is None:
            return (_misaligned(ctx, op, hs),)
        args, layout = again
        result = ctx.terms.apply(op.opcode, args, term_attrs(op), TensorType(args[0].type.shape, out_t.dtype))
        return (Holds(result, layout),)
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


def bitcast_convert(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Same-width bitcasts are elementwise. A width change adds (narrowing: u64 -> u32[..., 2]) or removes
    (widening) a minor dim of bit pieces, which must be whole on every device (JAX's rbg keys: u32[2, 2] ->
    u64[2])."""
    src, out = op.operands[0].tensor, op.result.tensor
    if src.rank == out.rank:
        return elementwise(ctx, op, facts)
    (f,) = facts
    if isinstance(f, Varying):
        computed = ctx.varying(op, facts)
        if computed is not None:
            return (computed,)
    g = ctx.lift(f) if isinstance(f, Varying) else f
    if isinstance(g, Failed):
        return (upstream(g, op),)
    if not isinstance(g, Holds) or g.layout.partial:
        return (ctx.unsupported(op, "a width-changing bitcast of a value that is not a whole tensor"),)
    shape = g.term.type.shape
    if out.rank == src.rank + 1:
        dims, gshape = (*g.layout.dims, ()), (*shape, out.shape[-1])
    elif out.rank + 1 == src.rank and not g.layout.dims[-1]:
        dims, gshape = g.layout.dims[:-1], shape[:-1]
    else:
        return (ctx.unsupported(op, f"a bitcast joining bit pieces laid out {ctx.describe(g.layout)}"),)
    term = ctx.terms.apply(op.opcode, (g.term,), term_attrs(op), TensorType(gshape, out.dtype))
    return (Holds(term, Layout(dims)),)


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
            return (upstream(bad, op),)
        return (ctx.not_tensors(op, (lhs, rhs)),)
    dims = op.attrs.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims):
        dims = DotDims((), (), (lhs.term.type.rank - 1,), (0,))
    if lhs.layout.partial and rhs.layout.partial:
        return (ctx.fail(op, "dot_general of two partial values: the products of partial sums are not the "
                         "product of the sums; a psum is missing", evidence=True, origin=lhs.origin, partial=True),)
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
        # (`view` refuses axes the widened side already splits or sums over; `a`'s extra axes may sit anywhere
        # in its order: GQA's key heads split over tp:(1)2 against query heads over tp:(1)2 × tp:(2)2.)
        if set(b) < set(a) and (moved := view(rt, Layout(tuple(rd), rhs.layout.partial),
                                              tuple(a if k == ri else d for k, d in enumerate(rd)),
                                              ctx.mesh, ctx.terms)) is not None:
            rt, rd[ri] = moved, a
        elif set(a) < set(b) and (moved := view(lt, Layout(tuple(ld), lhs.layout.partial),
                                                tuple(b if k == li else d for k, d in enumerate(ld)),
                                                ctx.mesh, ctx.terms)) is not None:
            lt, ld[li] = moved, b
        else:
            return (ctx.fail(op, f"dot_general contracts or batches dims split differently: lhs dim {li} over "
                             f"{axes_text(ctx, frozenset(a))}, rhs dim {ri} over {axes_text(ctx, frozenset(b))}",
                             evidence=True, found=f"{ctx.describe(lhs.layout)} · {ctx.describe(rhs.layout)}"),)
    contracted = [a for i in dims.lhs_contract for a in ld[i]]
    lhs_free = [i for i in range(len(ld)) if i not in dims.lhs_batch and i not in dims.lhs_contract]
    rhs_free = [i for i in range(len(rd)) if i not in dims.rhs_batch and i not in dims.rhs_contract]
    out_dims = [ld[i] for i in dims.lhs_batch] + [ld[i] for i in lhs_free] + [rd[i] for i in rhs_free]
    partial = dict(partial_in)
    if partial and any(r is not Reducer.SUM for r in partial.values()):
        return (ctx.fail(op, "dot_general of a value partial under max/min", evidence=True, origin=origin,
                         partial=True),)
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
            return (upstream(f, op),)
    if not isinstance(x, Holds) or not isinstance(init, Holds):
        return (ctx.not_tensors(op, (x, init)),)
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
                         f"{COLLECTIVE_NAME[r]} is missing before it", evidence=True, origin=x.origin, partial=True),)
    if (split or partial) and not _combines_per_shard(init.term, reducer):
        return (ctx.fail(op, "reduce over a split dim with an init value that is not the reducer's identity: "
                         "every device adds it once", evidence=True),)
    for a in split:
        partial[a] = reducer
    layout = Layout(tuple(d for i, d in enumerate(x.layout.dims) if i not in red), tuple(partial.items()))
    gshape = tuple(s for i, s in enumerate(x.term.type.shape) if i not in red)
    term = ctx.terms.apply("reduce", (x.term, init.term), (("dimensions", red), ("reducer", reducer.value)),
                           TensorType(gshape, op.result.tensor.dtype))
    blocks = perblock.blockwise(ctx, x, init.term, reducer, op.result.tensor.dtype) if split and not x.layout.partial and not gshape else None
    return (Holds(term, layout, op if split else x.origin, blocks),)


def _argmax_by_hand(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact | None:
    """The steps of an argmax written with pmax and pmin over block results (rules/argreduce.py)."""
    if op.opcode == "add" and any(isinstance(f, Blocks) for f in facts):
        return argreduce.offset(ctx, op, facts)
    if op.opcode == "compare" and any(isinstance(f, Holds) and f.layout.partial for f in facts):
        return argreduce.best(ctx, op, facts)
    if op.opcode == "select" and facts and isinstance(facts[0], Best):
        return argreduce.pick(ctx, op, facts)
    return None


def _variadic_reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A reduction of several operands with one body (argmax: values and indices). Supported where the
    reduced dims are whole on every device: then it is the global reduction, shard by shard; over a split
    dim, an argmax/argmin gives each device's block result (rules/argreduce.py)."""
    if any(isinstance(f, Blocks) for f in facts):
        return argreduce.combine(ctx, op, facts)
    k = len(op.results)
    # Indices computed per device (an iota plus the shard offset) are lifted as laid out like the values.
    like = join([Layout(f.layout.dims) for f in facts[:k] if isinstance(f, Holds)])
    held: list[Holds] = []
    for i, f in enumerate(facts):
        seen = lift_as(ctx, f, like) if isinstance(f, Varying) and like is not None and i < k else None
        g = seen or (ctx.lift(f) if isinstance(f, Varying) else f)
        if not isinstance(g, Holds):
            bad = g if isinstance(g, Failed) else ctx.not_tensors(op, (g,))
            return tuple(bad for _ in op.results)
        held.append(g)
    red = tuple(op.attrs["dimensions"])  # type: ignore[arg-type]
    xs, inits = held[:k], held[k:]
    layout = join([Layout(h.layout.dims) for h in xs])
    if layout is None or any(h.layout.partial for h in held) or any(i.layout.split_axes() for i in inits):
        return tuple(ctx.unsupported(op, "a variadic reduce of operands laid out differently or partial")
                     for _ in op.results)
    viewed = [view(h.term, h.layout, layout.dims, ctx.mesh, ctx.terms) for h in xs]
    if any(t is None for t in viewed):
        return tuple(ctx.unsupported(op, "a variadic reduce of operands laid out differently") for _ in op.results)
    if any(layout.dims[d] for d in red):
        seen = [Holds(t, layout) for t in viewed if t is not None]
        return argreduce.block_reduce(ctx, op, seen, inits, layout, red)
    out_layout = Layout(tuple(d for i, d in enumerate(layout.dims) if i not in red))
    args = (*(t for t in viewed if t is not None), *(h.term for h in inits))
    shape = tuple(s for i, s in enumerate(args[0].type.shape) if i not in red)
    return tuple(Holds(ctx.terms.mk("reduce", args, (*term_attrs(op), ("index", i)), TensorType(shape, r.tensor.dtype)),
                       out_layout) for i, r in enumerate(op.results))


def _combines_per_shard(init: Term, reducer: Reducer) -> bool:
    """Whether each device may start from `init` and the shards' results still combine to the whole: the
    reducer's identity, or any init under an idempotent reducer (max/min see it once or many times alike)."""
    return reducer in (Reducer.MAX, Reducer.MIN) or is_identity(scalar_value(init), reducer, init.type.dtype)


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

