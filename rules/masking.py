"""Transfer rules for vocab-parallel lookups: indices shifted to a shard, masked, gathered and summed.

Megatron's embedding and cross-entropy, and GSPMD's partitioned gather, read rows of a table split along
the gathered dim: each device shifts the ids by the first row it holds (`ids - axis_index * v_local`),
masks the ids outside its rows, gathers from its shard, zeroes the masked rows, and a sum over the axis
assembles the lookup. Until the zeroing no device holds the shard of any global tensor, so the steps are
tracked as `Shifted`, `InWindow` and `Lookup` facts (facts.py), each exact per device. The zeroed lookup
is a partial sum of the global gather when, along the axis, the devices' windows are disjoint and cover
every index the program can see: a range from a clamp in the program, or one the user assumes
(`--assume ids=0:32000`). Without one the verdict is `unknown`, and says what to assume.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scalify_hlo.rules import masked_moves as M
from scalify_hlo.rules.facts import (
    NEG,
    POS,
    Ctx,
    Fact,
    Holds,
    InWindow,
    Lookup,
    Shifted,
    Varying,
    Window,
    Written,
    constant_term,
)
from scalify_hlo.rules.indexing import gather as gather_holds

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import GatherDims, Op, TensorType
from scalify_hlo.layout.groups import match_axis_index
from scalify_hlo.layout.mesh import Layout, Reducer
from scalify_hlo.numeric.machine import shard
from scalify_hlo.ops.reducers import reducer_of
from scalify_hlo.terms import ranges

_FLIP = {"LT": "GT", "GT": "LT", "LE": "GE", "GE": "LE", "EQ": "EQ", "NE": "NE"}
_MASKED = (Shifted, InWindow, Lookup)

Rule = Callable[[Ctx, Op, tuple[Fact, ...]], tuple[Fact, ...] | None]


def applies(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> bool:
    """Whether this op is a step of a masked lookup: it reads one, or shifts or compares indices by a
    per-device amount (the first step)."""
    if any(isinstance(f, Written) for f in facts):
        return op.opcode not in ("tuple", "get_tuple_element")
    if op.opcode not in RULES:
        return False
    if any(isinstance(f, _MASKED) for f in facts):
        return True
    if op.opcode == "gather" and len(facts) == 2 and isinstance(facts[1], Varying) \
            and isinstance(facts[0], Holds) and facts[0].layout.split_axes():
        return True  # constant indices shifted per device: computed per device, read as shifted here
    if op.opcode not in ("add", "subtract", "compare") or len(facts) != 2:
        return False
    return (any(isinstance(f, Varying) and _scalar(ctx, f) is not None for f in facts)
            and any(_index(ctx, f) is not None for f in facts))


def transfer(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    rule = RULES.get(op.opcode)
    out = None if rule is None else rule(ctx, op, facts)
    if out is None and any(isinstance(f, Written) for f in facts):
        return tuple(ctx.unsupported(op, f"{op.opcode} of a block written at an index shifted per device, before the "
                                         "select that keeps the write only where the index lies in the block")
                     for _ in op.results)
    return out


# -- reading operands ---------------------------------------------------------------------------------------

def _per_device(ctx: Ctx, f: Fact) -> np.ndarray | None:
    """The value on each device of a tensor that holds one value per device (the same in every element)."""
    if isinstance(f, Varying):
        rows = np.asarray(f.values).reshape(f.values.shape[0], -1)
        return rows[:, 0] if rows.shape[1] and np.all(rows == rows[:, :1]) else None
    if isinstance(f, Holds) and not f.layout.partial:
        folded = ctx.fold(f.term)
        if folded is not None and folded.size and np.all(folded == folded.reshape(-1)[0]):
            return np.full(ctx.mesh.size, folded.reshape(-1)[0])
    return None


def _dtype(f: Fact) -> str:
    return f.type.dtype if isinstance(f, Varying) else f.term.type.dtype if isinstance(f, Holds) else ""


def _scalar(ctx: Ctx, f: Fact) -> np.ndarray | None:
    """An integer that may differ between devices but not between elements: one value per device."""
    if not _dtype(f).startswith(("i", "ui")) or _dtype(f) == "i1":
        return None
    values = _per_device(ctx, f)
    return None if values is None else values.astype(np.int64)


def _index(ctx: Ctx, f: Fact) -> Holds | None:
    """A tensor of integer indices (not a constant: those are plain index arithmetic)."""
    if (isinstance(f, Holds) and not f.layout.partial and f.term.type.dtype.startswith(("i", "ui"))
            and f.term.type.dtype != "i1" and ctx.fold(f.term) is None):
        return f
    return None


def _bool(ctx: Ctx, f: Fact) -> bool | None:
    """The value of a boolean that is the same everywhere."""
    values = _per_device(ctx, f) if _dtype(f) == "i1" else None
    if values is None or not np.all(values == values[0]):
        return None
    return bool(values[0])


def _same_base(ctx: Ctx, a: Holds, b: Holds) -> bool:
    """Whether every device holds the same local indices under `a` and `b`: the same fact, or broadcasts of
    one index tensor laid out alike on the dims they map, differing only along dims they broadcast over
    (constant there), where each device's block has the same size (a gather's slice dims split, the
    mask over them not)."""
    if a.term is b.term and a.layout == b.layout:
        return True
    s, t = a.term, b.term
    if (s.op != "broadcast_in_dim" or t.op != "broadcast_in_dim" or s.args[0] is not t.args[0]
            or s.attrs != t.attrs or a.layout.partial or b.layout.partial or s.type.rank != t.type.rank):
        return False
    mapped = set(dict(s.attrs).get("broadcast_dimensions", ()))
    la = a.layout.local_shape(s.type.shape, ctx.mesh)
    lb = b.layout.local_shape(t.type.shape, ctx.mesh)
    return all((s.type.shape[i] == t.type.shape[i] and a.layout.dims[i] == b.layout.dims[i]) if i in mapped
               else la[i] == lb[i] for i in range(s.type.rank))


def _constant(ctx: Ctx, op: Op, value: bool) -> Holds:
    t = op.result.tensor
    return Holds(ctx.terms.splat(float(value), t), Layout.replicated(t.rank))


def _mask(ctx: Ctx, op: Op, base: Holds, window: Window, negated: bool = False) -> Fact:
    empty = window.lo >= window.hi
    if np.all(empty):
        return _constant(ctx, op, negated)
    if np.all((window.lo <= NEG) & (window.hi >= POS)):
        return _constant(ctx, op, not negated)
    return InWindow(base, window, negated)


def _condition(direction: str, k: np.ndarray) -> tuple[Window, bool] | None:
    """The base values `v` with `v <direction> k`, per device: a window, or the outside of one."""
    neg, pos = np.full_like(k, NEG), np.full_like(k, POS)
    match direction:
        case "LT":
            return Window(neg, k), False
        case "LE":
            return Window(neg, k + 1), False
        case "GE":
            return Window(k, pos), False
        case "GT":
            return Window(k + 1, pos), False
        case "EQ":
            return Window(k, k + 1), False
        case "NE":
            return Window(k, k + 1), True
    return None


def _decided(direction: str, bounds: tuple[np.ndarray, np.ndarray] | None, k: np.ndarray) -> np.ndarray | None:
    """`v <direction> k` per device, for every `v` within `bounds`; None where that depends on `v`."""
    if bounds is None:
        return None
    fns = {"LT": np.less, "LE": np.less_equal, "GE": np.greater_equal, "GT": np.greater, "EQ": np.equal,
           "NE": np.not_equal}
    lo, hi = bounds
    at_lo, at_hi = np.asarray(fns[direction](lo, k)), np.asarray(fns[direction](hi, k))
    same = at_lo == at_hi
    if direction in ("EQ", "NE"):
        same &= (lo == hi) | (k < lo) | (k > hi)
    return at_lo if bool(np.all(same)) else None


# -- the steps ----------------------------------------------------------------------------------------------

def _shift(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """ids ± (per-device offset), and further constant shifts of such an index."""
    x, y = facts
    sign = -1 if op.opcode == "subtract" else 1
    pairs = [(x, y, sign)] + ([(y, x, 1)] if sign == 1 else [])
    for a, b, s in pairs:
        k = _scalar(ctx, b)
        if k is None:
            continue
        if isinstance(a, Shifted):
            outside = None if a.outside is None else (a.outside[0] + s * k, a.outside[1] + s * k)
            return (Shifted(a.base, a.shift + s * k, a.window, outside, a.origin),)
        base = _index(ctx, a)
        if base is not None and isinstance(b, Varying):
            return (Shifted(base, s * k, None, None, ctx.source(b)),)
    return None


def _bounded(x: Shifted, k: np.ndarray, upper: bool) -> Shifted:
    """min(x, k) (upper) or max(x, k): x where it is within the bound, k elsewhere (`jnp.clip`)."""
    keep = _condition("LE" if upper else "GE", k - x.shift)
    assert keep is not None
    window = keep[0] if x.window is None else keep[0] & x.window
    outside: tuple[np.ndarray, np.ndarray] | None = (k, k)
    if x.window is not None:
        if x.outside is None:
            outside = None
        else:
            bound = np.minimum if upper else np.maximum
            lo, hi = bound(x.outside[0], k), bound(x.outside[1], k)
            outside = (np.minimum(lo, k), np.maximum(hi, k))
    return Shifted(x.base, x.shift, window, outside, x.origin)


def _clip(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    x, y = facts if isinstance(facts[0], Shifted) else facts[::-1]
    k = _scalar(ctx, y)
    if not isinstance(x, Shifted) or k is None:
        return None
    return (_bounded(x, k, op.opcode == "minimum"),)


def _clamp(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    lo, x, hi = facts
    a, b = _scalar(ctx, lo), _scalar(ctx, hi)
    if not isinstance(x, Shifted) or a is None or b is None:
        return None
    return (_bounded(_bounded(x, a, upper=False), b, upper=True),)


def _compare(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    direction = str(op.attrs["comparison_direction"])
    x, y = facts
    if _scalar(ctx, y) is None and _scalar(ctx, x) is not None:
        x, y, direction = y, x, _FLIP[direction]
    k = _scalar(ctx, y)
    if k is None:
        return None
    if isinstance(x, Shifted):
        cond = _condition(direction, k - x.shift)
        if cond is None:
            return None
        window, negated = cond
        if x.window is None:
            return (_mask(ctx, op, x.base, window, negated),)
        outside = _decided(direction, x.outside, k)
        if outside is None or negated:
            return None
        if not outside.any():
            return (_mask(ctx, op, x.base, window & x.window),)
        if outside.all() and x.window.within(window):
            return (_constant(ctx, op, True),)
        return None
    base = _index(ctx, x)
    plain = _condition(direction, k)
    if base is not None and isinstance(y, Varying) and plain is not None:
        return (_mask(ctx, op, base, *plain),)
    return None


def _logic(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    x, y = facts
    is_and = op.opcode == "and"
    for a, b in ((x, y), (y, x)):
        v = _bool(ctx, a)
        if v is not None and isinstance(b, InWindow):
            return (b,) if v == is_and else (_constant(ctx, op, v),)
    if not (isinstance(x, InWindow) and isinstance(y, InWindow) and _same_base(ctx, x.base, y.base)):
        return None
    if x.negated == y.negated and is_and != x.negated:
        # a ∧ b, or ¬a ∨ ¬b = ¬(a ∧ b)
        return (_mask(ctx, op, x.base, x.window & y.window, x.negated),)
    if not is_and and not x.negated and not y.negated:
        # (-∞, a) ∪ [b, ∞) with a ≤ b is the outside of [a, b) (GSPMD's "not in my shard" test)
        for lo, hi in ((x.window, y.window), (y.window, x.window)):
            if np.all(lo.lo <= NEG) and np.all(hi.hi >= POS) and np.all(lo.hi <= hi.lo):
                return (_mask(ctx, op, x.base, Window(lo.hi, hi.lo), negated=True),)
    return None


def _not(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    (x,) = facts
    return (InWindow(x.base, x.window, not x.negated),) if isinstance(x, InWindow) else None


def _select(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    p, a, b = facts
    chosen = _bool(ctx, p)
    if chosen is not None:
        return (a if chosen else b,)
    look = a if isinstance(a, Lookup) else b if isinstance(b, Lookup) else None
    if look is not None and not isinstance(p, InWindow):
        p = _varying_mask(ctx, p, look) or p
    if not isinstance(p, InWindow):
        return None
    if p.negated:
        p, a, b = InWindow(p.base, p.window), b, a
    if isinstance(a, Shifted) and isinstance(b, Shifted) and _same_base(ctx, a.base, b.base) \
            and _same_base(ctx, p.base, a.base):
        # JAX's negative-index normalisation (`where(i < 0, i + n, i)`): kept as the branch that holds on the
        # upper half-line of the mask's index (there the index is as shifted; elsewhere any value).
        if np.all(p.window.lo <= NEG):
            kept, window = b, Window(p.window.hi, np.full_like(p.window.hi, POS))
        elif np.all(p.window.hi >= POS):
            kept, window = a, p.window
        else:
            return None
        return (Shifted(kept.base, kept.shift, window if kept.window is None else window & kept.window, None,
                        kept.origin),)
    if isinstance(a, Shifted) and _same_base(ctx, p.base, a.base):
        k = _scalar(ctx, b)
        if k is None or (a.window is not None and not p.window.within(a.window)):
            return None
        return (Shifted(a.base, a.shift, p.window, (k, k), a.origin),)
    if isinstance(a, Lookup) and _is_zero(ctx, b):
        return (_zeroed(ctx, op, p, a),)
    if isinstance(a, Written) and (kept := _kept_write(ctx, op, p, a, b)) is not None:
        return (kept,)
    return None


def _update(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """`dynamic_update_slice(block, update, ..., index - block_start, ...)` into a dim split over axes `A`, the
    index shifted by minus each device's block start along `A` (a KV cache split over the sequence, written
    at `pos - axis_index * block`): `Written`, until a select keeps it only where the index lies in the block."""
    x, update, *starts = facts
    shifted = [k for k, f in enumerate(starts) if isinstance(f, Shifted)]
    if len(shifted) != 1 or not isinstance(x, Holds) or not isinstance(update, Holds) or len(op.results) != 1:
        return None
    (d,) = shifted
    index = starts[d]
    assert isinstance(index, Shifted)
    if x.layout.partial or update.layout.partial or update.layout.split_axes() or not x.layout.dims[d] \
            or index.base.term.type.rank != 0:
        return None
    local = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    if any(k != d and (update.term.type.shape[k] != local[k] or x.layout.dims[k]) for k in range(len(local))):
        return None  # (other dims whole on every device and covered by the update)
    if any(k != d and ((z := _scalar(ctx, f)) is None or np.any(z)) for k, f in enumerate(starts)):
        return None
    if match_axis_index(-index.shift, ctx.mesh) != (x.layout.dims[d], local[d]):
        return None
    return (Written(x, update, index, d, op),)


def _kept_write(ctx: Ctx, op: Op, mask: InWindow, w: Written, other: Fact) -> Fact | None:
    """`select(index in window, written, x)`: where the window keeps only indices whose write lies inside the
    device's block (no clamp moved it) and, along the split axes, the windows cover every index the program
    can see, each device's block of the global update — `dynamic_update_slice(x, update, index)` under x's
    layout. An index the windows leave uncovered would be written nowhere (`unknown`, saying what to assume)."""
    if not (isinstance(other, Holds) and other.term is w.x.term and other.layout == w.x.layout) \
            or not _same_base(ctx, mask.base, w.index.base) \
            or (w.index.window is not None and not mask.window.within(w.index.window)):
        return None
    d = w.dim
    axes = w.x.layout.dims[d]
    block = w.x.layout.local_shape(w.x.term.type.shape, ctx.mesh)[d]
    size = w.update.term.type.shape[d]
    start = -w.index.shift  # each device's block start, in the index's values
    lo, hi = mask.window.lo, mask.window.hi
    empty = lo >= hi
    if not np.all(empty | ((lo >= start) & (hi <= start + block - size + 1))):
        return ctx.fail(op, "the select keeps a write whose index lies outside the device's block (the op clamps "
                        "it back into the block, onto rows the reference does not write)", evidence=True,
                        origin=w.origin)
    segments, _ = _kept_segments(ctx, mask.window, axes)  # (disjoint: each window lies in its own block)
    seen = ranges.interval(ctx.terms, mask.base.term)
    if not _covered(seen, segments):
        keeps, names = _kept_text(segments), _inputs_of(mask.base)
        hint = f"; if it does, pass --assume {names[0]}={segments[0][0]}:{segments[0][1]}" \
            if len(names) == 1 and segments and len(segments) == 1 else ""
        return ctx.unsupported(op, f"the masked update equals the reference only if the index lies in {keeps} "
                               f"(elsewhere no device writes it, where the reference clamps it){hint}")
    dtype = w.index.base.term.type.dtype
    idx = tuple(w.index.base.term if k == d else ctx.terms.scalar(0.0, dtype) for k in range(w.x.term.type.rank))
    term = ctx.terms.apply("dynamic_update_slice", (w.x.term, w.update.term, *idx), (), w.x.term.type)
    return Holds(term, w.x.layout, w.x.origin)


def _is_zero(ctx: Ctx, f: Fact) -> bool:
    if not isinstance(f, Holds) or f.layout.partial:
        return False
    folded = ctx.fold(f.term)
    return folded is not None and folded.size > 0 and not np.any(folded)


def _zeroed(ctx: Ctx, op: Op, mask: InWindow, look: Lookup) -> Fact:
    """A lookup with the rows outside `mask` zeroed: a partial sum over the table's axes of the global
    gather, if along those axes exactly one device keeps each index the program can see."""
    if not _same_base(ctx, mask.base, look.base):
        return ctx.unsupported(op, "a lookup masked by a condition on other indices than it gathers with")
    if not mask.window.within(look.window):
        return ctx.fail(op, "the mask keeps rows the device does not hold (the indices are masked to other "
                        "bounds than the device's shard of the table)", evidence=True, origin=look.origin)
    axes = look.axes
    segments, twice = _kept_segments(ctx, mask.window, axes)
    if twice is not None:
        return ctx.fail(op, f"two devices along {_axes(axes)} both keep the indices in [{twice[0]}, {twice[1]}): "
                        "their rows are summed twice", evidence=True, origin=look.origin)
    seen = ranges.interval(ctx.terms, mask.base.term)
    if not _covered(seen, segments):
        return _uncovered(ctx, op, mask, look, seen, segments)
    layout = look.value.layout
    partial = tuple(sorted((*layout.partial, *((a, Reducer.SUM) for a in axes))))
    return Holds(look.value.term, Layout(layout.dims, partial), op)


def _uncovered(ctx: Ctx, op: Op, mask: InWindow, look: Lookup, seen: tuple[int, int] | None,
               segments: list[tuple[int, int]]) -> Fact:
    keeps, names = _kept_text(segments), _inputs_of(mask.base)
    if seen is not None:
        return ctx.unsupported(op, f"the indices can be in [{seen[0]}, {seen[1] + 1}) but the devices along "
                               f"{_axes(look.axes)} keep only {keeps}: the others would be looked up nowhere")
    hint = ""
    if len(names) == 1 and len(segments) == 1:
        hint = f"; if they are (JAX's `table[ids]` promises it), pass --assume {names[0]}={segments[0][0]}:" \
               f"{segments[0][1]}"
    what = f"`{names[0]}`" if len(names) == 1 else "the indices"
    return ctx.unsupported(op, f"the masked lookup equals the reference only if {what} lie in {keeps} "
                           f"(elsewhere it is 0 where the reference clamps the index){hint}")


def _kept_text(segments: list[tuple[int, int]]) -> str:
    return " ∪ ".join(f"[{s}, {e})" for s, e in segments) or "different ranges on different devices"


def _inputs_of(index: Holds) -> list[str]:
    """The program inputs an index is computed from (what `--assume` can name)."""
    return sorted({str(t.attr("name")) for t in index.term.walk() if t.op == "param"})


def _kept_segments(ctx: Ctx, window: Window, axes: tuple[str, ...]
                   ) -> tuple[list[tuple[int, int]], tuple[int, int] | None]:
    """Along `axes`, the ranges of indices the devices' windows keep, merged where they meet (the same in
    every group of the other axes; none where they differ), and the first range two devices both keep."""
    segments: list[tuple[int, int]] | None = None
    twice: tuple[int, int] | None = None
    for group in _groups(ctx, axes):
        lo, hi = window.lo[group], window.hi[group]
        keep = lo < hi
        order = np.argsort(lo[keep], kind="stable")
        los, his = lo[keep][order], hi[keep][order]
        for i in range(len(los) - 1):
            if los[i + 1] < his[i] and twice is None:
                twice = (int(max(los[i + 1], los[i])), int(min(his[i], his[i + 1])))
        merged = _merge(list(zip(los.tolist(), his.tolist(), strict=True)))
        segments = merged if segments is None or merged == segments else []
    return segments or [], twice


def _covered(seen: tuple[int, int] | None, segments: list[tuple[int, int]]) -> bool:
    """Every index the program can see (`seen`, inclusive) lies in one of the kept ranges."""
    return seen is not None and any(s <= seen[0] and seen[1] < e for s, e in segments)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s, e in spans:
        if out and s == out[-1][1]:
            out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def _groups(ctx: Ctx, axes: tuple[str, ...]) -> list[np.ndarray]:
    """Device ids, one row per combination of the other axes' coordinates."""
    grid = ctx.mesh.device_array()
    names = ctx.mesh.names
    moved = np.moveaxis(grid, [names.index(a) for a in axes], list(range(grid.ndim - len(axes), grid.ndim)))
    return list(moved.reshape(-1, ctx.mesh.size_of(axes)))


def _axes(axes: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in axes) + "}"


def _gather(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    table, idx = facts
    g = op.attrs.get("dimension_numbers")
    if isinstance(idx, Varying) and isinstance(table, Holds) and isinstance(g, GatherDims):
        shifted = _shifted_constant(ctx, table, g, idx)
        if shifted is None:
            return None
        idx = shifted
    if not (isinstance(table, Holds) and isinstance(idx, Shifted) and isinstance(g, GatherDims)):
        return None
    itype = idx.base.term.type
    if len(g.start_index_map) != 1 or (g.index_vector_dim < itype.rank and itype.shape[g.index_vector_dim] != 1):
        return None
    d = g.start_index_map[0]
    sizes = op.attrs.get("slice_sizes")
    if isinstance(sizes, tuple) and d < len(sizes) and sizes[d] != 1:
        # A window of several rows starting near the shard's end is clamped inside the local shard, not
        # continued on the next device: the masked pieces do not sum to the reference's window.
        return (ctx.unsupported(op, f"a shifted-index gather of windows of {sizes[d]} rows along the split dim "
                                "(windows crossing a shard edge are clamped inside the shard)"),)
    axes = table.layout.dims[d]
    if not axes or table.layout.partial or set(axes) & (idx.base.layout.split_axes() | idx.base.layout.partial_axes()):
        return (ctx.unsupported(op, "a shifted-index gather from a table not split along the gathered dim, or "
                                "with indices split over the table's axes"),)
    rows = table.layout.local_shape(table.term.type.shape, ctx.mesh)[d]
    match = match_axis_index(-idx.shift, ctx.mesh)
    if match is None or match[0] != axes or match[1] != rows:
        offsets = (-idx.shift[ctx.mesh.device_array().reshape(-1)])[:8].tolist()
        return (ctx.fail(op, f"the indices are shifted by {offsets}... on the devices, but the device at index k "
                         f"along {_axes(axes)} holds rows from {rows}·k of the table: they gather the wrong rows",
                         evidence=True, origin=idx.origin, expected=f"offset {rows} × index along {_axes(axes)}",
                         found=f"offsets {offsets}"),)
    whole = Holds(table.term, Layout(tuple(() if i == d else a for i, a in enumerate(table.layout.dims))))
    (value,) = gather_holds(ctx, op, (whole, idx.base))
    if not isinstance(value, Holds):
        return (value,)
    base = _index_at_outputs(ctx, g, idx.base, value)
    window = Window(-idx.shift, -idx.shift + rows)
    if idx.window is not None:
        window = window & idx.window
    return (Lookup(value, base, window, axes, op),)


def _shifted_constant(ctx: Ctx, table: Holds, g: GatherDims, idx: Varying) -> Shifted | None:
    """Constant indices shifted by each device's first row of the table (computed per device, so numbers,
    not a term), read as one constant shifted: at each position, the index of the one device whose local
    index falls in its rows, shifted back by its first row (-1, below every device's rows, where none
    does; two devices that disagree: None). (A CLIP loss gathers the diagonal of a row-split similarity
    matrix with `arange` labels.)"""
    if len(g.start_index_map) != 1 or not idx.type.dtype.startswith(("i", "ui")):
        return None
    d = g.start_index_map[0]
    axes = table.layout.dims[d]
    if not axes:
        return None
    rows = table.layout.local_shape(table.term.type.shape, ctx.mesh)[d]
    starts = ctx.mesh.block_indices(axes) * rows
    values = np.asarray(idx.values).astype(np.int64)
    inside = (values >= 0) & (values < rows)
    back = values + starts.reshape((-1,) + (1,) * (values.ndim - 1))
    base = np.where(inside, back, np.iinfo(np.int64).max).min(axis=0)
    if np.any(inside & (back != base)):
        return None
    base = np.where(inside.any(axis=0), base, -1)
    # What the fact says, checked on every device: where the base lies in the device's rows, the device's index
    # is the base shifted (devices along other axes may hold other indices there: then it is not this fact).
    ends = (starts + rows).reshape(back.shape[:1] + (1,) * (values.ndim - 1))
    claimed = (base >= starts.reshape(ends.shape)) & (base < ends)
    if np.any(claimed & (back != base)):
        return None
    term = constant_term(base.astype(np.asarray(idx.values).dtype), idx.type, ctx.terms)
    # Exact only where the base lies in the device's rows; elsewhere the device's index is any value.
    return Shifted(Holds(term, Layout.replicated(idx.type.rank)), -starts, Window(starts, starts + rows), None, None)


def _local_values(ctx: Ctx, f: Fact) -> np.ndarray | None:
    """Each device's local values (`[devices, *local shape]`) of a value known as numbers: computed per
    device, or a constant tensor under its layout."""
    if isinstance(f, Varying):
        return np.asarray(f.values)
    if not isinstance(f, Holds) or f.layout.partial or (values := ctx.fold(f.term)) is None:
        return None
    try:
        return shard(np.asarray(values), f.layout, ctx.mesh)
    except (ShardingError, ValueError):
        return None


def _varying_mask(ctx: Ctx, p: Fact, look: Lookup) -> InWindow | None:
    """A mask computed per device from constant indices: whether each device keeps exactly the lookup's
    rows that lie in its window (or exactly the others, negated)."""
    local = _local_values(ctx, look.base)
    values = _local_values(ctx, p) if _dtype(p) == "i1" else None
    if local is None or values is None:
        return None
    mask = values.astype(bool)
    if mask.shape != local.shape:
        return None
    lo = look.window.lo.reshape((-1,) + (1,) * (local.ndim - 1))
    hi = look.window.hi.reshape((-1,) + (1,) * (local.ndim - 1))
    inside = (local >= lo) & (local < hi)
    if np.array_equal(mask, inside):
        return InWindow(look.base, look.window)
    if np.array_equal(mask, ~inside):
        return InWindow(look.base, look.window, negated=True)
    return None


def _index_at_outputs(ctx: Ctx, g: GatherDims, idx: Holds, value: Holds) -> Holds:
    """The index each output element of the gather was read with, as a tensor of the output's shape. It is
    the same along the offset dims, so a split there (the table's rows split too, over other axes: an
    embedding `P("vocab_axis", "embed_axis")`) gives each device the block it holds."""
    out = value.term.type
    batch = tuple(j for j in range(out.rank) if j not in g.offset_dims)
    t = idx.term
    if g.index_vector_dim < t.type.rank:
        shape = tuple(n for i, n in enumerate(t.type.shape) if i != g.index_vector_dim)
        t = ctx.terms.apply("reshape", (t,), (), TensorType(shape, t.type.dtype))
    t = ctx.terms.apply("broadcast_in_dim", (t,), (("broadcast_dimensions", batch),), TensorType(out.shape, t.type.dtype))
    return Holds(t, Layout(value.layout.dims))


def _reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """Reducing a mask over unit dims (the index vector dim) only drops them."""
    x = facts[0]
    if not isinstance(x, InWindow) or len(facts) != 2 or len(op.results) != 1:
        return None
    reducer = reducer_of(op.regions[0]) if op.regions else None
    init = _bool(ctx, facts[1])
    if reducer not in (Reducer.AND, Reducer.OR) or init is not (reducer is Reducer.AND):
        return None  # only with the identity as init is one element reduced the element itself
    dims = tuple(op.attrs.get("dimensions", ()))  # type: ignore[arg-type]
    local = x.base.layout.local_shape(x.base.term.type.shape, ctx.mesh)
    if any(local[d] != 1 for d in dims):
        return None
    return M.movement(ctx, op, (x,), "reshape")


def _all_reduce(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    look = next((f for f in facts if isinstance(f, Lookup)), None)
    if look is None:
        return None
    return tuple(ctx.fail(op, f"the lookup's rows from devices that do not hold them are summed: each device along "
                          f"{_axes(look.axes)} must zero the rows of the indices outside its shard before the sum",
                          evidence=True, origin=look.origin) for _ in op.results)


RULES: dict[str, Rule] = {
    "add": _shift,
    "all_gather": M.regrouped,
    "all_to_all": M.regrouped,
    "all_reduce": _all_reduce,
    "and": _logic,
    "broadcast_in_dim": M.movement,
    "clamp": _clamp,
    "compare": _compare,
    "copy": M.movement,
    "dynamic_update_slice": _update,
    "gather": _gather,
    "maximum": _clip,
    "minimum": _clip,
    "not": _not,
    "or": _logic,
    "reduce": _reduce,
    "reshape": M.movement,
    "scatter": M.scatter,
    "select": _select,
    "subtract": _shift,
    "transpose": M.movement,
}
