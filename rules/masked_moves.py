"""Masked indices moved without being read: data movement, collectives and scatters carry a mask, a shifted
index or a lookup along (its base moved by the op's ordinary rule), or settle it into the block it is.

The per-device facts of `masking.py` (`Shifted`, `InWindow`, `Lookup`) say what each device holds in terms
of a base tensor; an op that only moves data moves the base and keeps the per-device part, provided that
part does not change along the devices the op mixes (a gather over the data axis of a mask whose window is
set by the vocab axis). A shifted index no rule reads is the base plus the constant of the shifts.
"""

from __future__ import annotations

import numpy as np
from scalify_hlo.rules import collectives as C
from scalify_hlo.rules import indexing
from scalify_hlo.rules import layout as L
from scalify_hlo.rules import spmd as S
from scalify_hlo.rules.facts import (
    NEG,
    POS,
    Ctx,
    Fact,
    Failed,
    Holds,
    InWindow,
    Lookup,
    Masked,
    Shifted,
    Varying,
    join,
    view,
)

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import Op, ScatterDims, TensorType, Value
from scalify_hlo.layout.groups import match_axis_index, varying_axes
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.terms.term import Term


def settled(ctx: Ctx, f: Fact) -> Fact:
    """An index shifted per device with no window (`x + axis_index * k` read by an op no masking rule
    models, or leaving the body) as the block it is: the base plus the constant tensor whose block on each
    device is that device's shift. Any other fact as it is."""
    if not isinstance(f, Shifted) or f.window is not None:
        return f
    base = f.base
    local = base.layout.local_shape(base.term.type.shape, ctx.mesh)
    dtype = base.term.type.dtype
    values = np.broadcast_to(f.shift.reshape(-1, *(1,) * len(local)), (ctx.mesh.size, *local))
    shift = ctx.lift(Varying(values.astype(numpy_dtype(dtype)), TensorType(local, dtype)))
    layout = join([Layout(base.layout.dims), Layout(shift.layout.dims)]) if isinstance(shift, Holds) else None
    if layout is None or not isinstance(shift, Holds):
        return f
    a = view(base.term, base.layout, layout.dims, ctx.mesh, ctx.terms)
    b = view(shift.term, shift.layout, layout.dims, ctx.mesh, ctx.terms)
    if a is None or b is None:
        return f
    return Holds(ctx.terms.apply("add", (a, b), (), a.type), Layout(layout.dims, base.layout.partial), base.origin)


def settled_mask(ctx: Ctx, f: Fact) -> Fact:
    """A mask no masking rule reads, as the tensor it is: with the same window on every device (a case of a
    case split, the device fixed), the plain test of the base; else, where the base has a unit dim that is
    whole (`one_hot(top, e)` with one class per device: `top == axis_index`), the tensor along that dim
    whose block on each device is that device's test, provided the window's ends step by the same amount
    along some mesh axes (`lo = lo₀ + s · index`). Any other fact as it is."""
    if not isinstance(f, InWindow) or f.base.layout.partial:
        return f
    base, lo, hi = f.base, f.window.lo.astype(np.int64), f.window.hi.astype(np.int64)
    lo_inf, hi_inf = lo <= NEG, hi >= POS
    ends = [e for e, inf in ((lo, lo_inf), (hi, hi_inf)) if not inf.any()]
    if not ends or any(inf.any() and not inf.all() for inf in (lo_inf, hi_inf)):
        return f
    first = int(ctx.mesh.device_array().reshape(-1)[0])
    steps = ends[0] - ends[0][first]
    match = match_axis_index(steps, ctx.mesh)
    if match is None or any(not np.array_equal(e - e[first], steps) for e in ends):
        return f
    axes, scale = match
    if not axes:  # the same window everywhere
        wide, unit, step = base.term, None, None
    else:
        unit = next((d for d, n in enumerate(base.term.type.shape) if n == 1 and not base.layout.dims[d]), None)
        if unit is None or set(axes) & base.layout.split_axes():
            return f
        wide = ctx.terms.tile(base.term, unit, ctx.mesh.size_of(axes))
        step = ctx.terms.iota(unit, wide.type)
        if scale != 1:
            step = ctx.terms.apply("multiply", (step, ctx.terms.splat(float(scale), wide.type)), (), wide.type)
    pred = TensorType(wide.type.shape, "i1")

    def test(direction: str, e: np.ndarray) -> Term:
        at = ctx.terms.splat(float(e[first]), wide.type)
        if step is not None:
            at = ctx.terms.apply("add", (step, at), (), wide.type) if e[first] else step
        return ctx.terms.apply("compare", (wide, at), (("comparison_direction", direction),), pred)

    if not lo_inf.any() and not hi_inf.any() and np.all(hi - lo == 1):
        term = test("EQ", lo)
    elif lo_inf.all():
        term = test("LT", hi)
    elif hi_inf.all():
        term = test("GE", lo)
    else:
        term = ctx.terms.apply("and", (test("GE", lo), test("LT", hi)), (), pred)
    if f.negated:
        term = ctx.terms.apply("not", (term,), (), pred)
    dims = tuple(axes if d == unit else ds for d, ds in enumerate(base.layout.dims))
    return Holds(term, Layout(dims), base.origin)


def retyped(op: Op, opcode: str, dtype: str) -> Op:
    """`op` producing another element type (to move an integer base along with a mask or rows)."""
    return Op(opcode, op.operands, (Value(TensorType(op.result.tensor.shape, dtype)),), op.attrs, (), op.loc)


def move_base(ctx: Ctx, op: Op, h: Holds, opcode: str | None = None) -> Holds | None:
    name = opcode or op.opcode
    (out,) = _MOVES[name](ctx, retyped(op, name, h.term.type.dtype), (h,))
    return out if isinstance(out, Holds) else None


def movement(ctx: Ctx, op: Op, facts: tuple[Fact, ...], opcode: str | None = None) -> tuple[Fact, ...] | None:
    f = facts[0]
    if not isinstance(f, Shifted | InWindow | Lookup):
        return None
    moved: Masked | None = None
    match f:
        case Shifted():
            base = move_base(ctx, op, f.base, opcode)
            moved = None if base is None else Shifted(base, f.shift, f.window, f.outside, f.origin)
        case InWindow():
            base = move_base(ctx, op, f.base, opcode)
            moved = None if base is None else InWindow(base, f.window, f.negated)
        case Lookup():
            base, value = move_base(ctx, op, f.base, opcode), move_base(ctx, op, f.value, opcode)
            moved = None if base is None or value is None else Lookup(value, base, f.window, f.axes, f.origin)
    return None if moved is None else (moved,)


def regrouped(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """A mask (or an index shifted per device) all-gathered or all-to-all'd over axes along which its
    per-device window (shift) does not change: the mask of the moved base (the out-of-shard rows of a
    vocab-split table's gradient, the batch regrouped over the data axis, the window set by the vocab axis)."""
    f = facts[0]
    if len(facts) != 1 or not isinstance(f, InWindow | Shifted):
        return None
    axes = C.groups_axes(ctx, op)
    if isinstance(axes, Failed):
        return (axes,)
    per_device = [f.window.lo, f.window.hi] if isinstance(f, InWindow) else \
        [f.shift, *((f.window.lo, f.window.hi) if f.window is not None else ()), *(f.outside or ())]
    if any(set(axes) & set(varying_axes(v, ctx.mesh)) for v in per_device):
        return None
    return movement(ctx, op, facts)


def scatter(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """XLA's scatter into a dim split over axes `A`: each device scatters into its own block with the indices
    shifted by minus its block's start, and drops the updates whose shifted index leaves the block (a scatter
    skips out-of-bounds windows). With one row per update along that dim, each device's rows are those rows
    of the scatter it would make holding the whole dim with the indices unshifted: the ordinary rule's
    result for that (other split dims, batching dims and all), split along the dim over `A` again."""
    if len(facts) != 3 or len(op.results) != 1:
        return None
    x, idx, upd = facts
    g = op.attrs.get("scatter_dimension_numbers")
    if not (isinstance(x, Holds) and isinstance(idx, Shifted) and isinstance(upd, Holds) and isinstance(g, ScatterDims)):
        return None
    if idx.window is not None or idx.outside is not None or x.layout.partial \
            or upd.layout.partial or idx.base.layout.partial or len(g.scattered_dims_to_operand_dims) != 1:
        return None
    (d,) = g.scattered_dims_to_operand_dims
    match = match_axis_index(-idx.shift, ctx.mesh)
    if match is not None and not x.layout.dims[d]:
        # An operand the same on the devices along the indices' axes (the zeros a gradient starts from) is
        # each device's block of its copies side by side (`view`).
        dims = tuple(match[0] if k == d else a for k, a in enumerate(x.layout.dims))
        seen = view(x.term, x.layout, dims, ctx.mesh, ctx.terms)
        if seen is None:
            return None
        x = Holds(seen, Layout(dims), x.origin)
    axes = x.layout.dims[d]
    block = x.layout.local_shape(x.term.type.shape, ctx.mesh)[d]
    if not axes or d not in g.inserted_window_dims or match is None or match[0] != axes or match[1] != block:
        return None
    whole = Holds(x.term, Layout(tuple(() if k == d else a for k, a in enumerate(x.layout.dims))))
    if not any(h.layout.split_axes() for h in (whole, idx.base, upd)):
        # (the ordinary rule's whole-value case types its term by the op's result: here, one block of it)
        term = ctx.terms.apply("scatter", (x.term, idx.base.term, upd.term), term_attrs(op), x.term.type)
        out: Fact = Holds(term, whole.layout)
    else:
        (out,) = indexing.scatter(ctx, op, (whole, idx.base, upd))
    if not isinstance(out, Holds) or out.term.type.shape[d] != x.term.type.shape[d] or out.layout.dims[d] \
            or set(axes) & (out.layout.split_axes() | out.layout.partial_axes()):
        return None
    dims = tuple(axes if k == d else a for k, a in enumerate(out.layout.dims))
    return (Holds(out.term, Layout(dims, out.layout.partial), x.origin),)


# The movement ops a mask moves through, with the transfer rule that moves its base.
_MOVES = {"all_gather": C.all_gather, "all_to_all": C.all_to_all, "broadcast_in_dim": L.broadcast_in_dim, "copy": S.identity,
          "reshape": L.reshape, "transpose": L.transpose}
