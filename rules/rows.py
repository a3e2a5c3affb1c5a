"""Transfer rules for a split dim that is padded: each device's rows tracked by table until they are blocks.

Padding a dim split over devices (`jnp.pad` of a sequence split over tp, the left pad of a causal conv1d)
cannot keep blocks: the padded tensor's blocks are longer than the operand's. XLA pads each device's
block, widened with its neighbours' rows (a halo), takes a window of it at an offset of its own per
device (the padded tensor's block), clears the rows past the tensor, and takes windows of that again for
the slices that follow, each a collective-permute and a dynamic-slice away. A device's window then moves
by a different number of rows on each device, which no `Halo` describes, so the steps are tracked as a
`Rows` fact (facts.py): the global row each device holds at each local position, a `[devices, rows]`
table, kept exact per device by every rule here. A table whose rows are each device's block of a shifted
tensor settles into `Holds` again; one whose rows are a block of the tensor and its neighbours' rows into
a `Halo`, which the window ops read.

Anything else reading such rows is unsupported (`unknown`), never read as a block.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from scalify_hlo.rules import halo as H
from scalify_hlo.rules.facts import JUNK_ROW, OUT_ROW, Ctx, Fact, Failed, Halo, Holds, Rows, upstream
from scalify_hlo.rules.indexing import start_offsets

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType
from scalify_hlo.layout.groups import match_axis_index
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.terms.term import Term, scalar_value

_PASS = ("copy", "optimization_barrier")
_LEFT_ALONE = ("tuple", "get_tuple_element")  # (rows carried in a tuple: read where they are unpacked)


def applies(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> bool:
    """Whether `op` reads rows held by table, or starts a table: a pad of a split dim, or a dynamic-slice
    of a halo at offsets of each device's own."""
    if any(isinstance(f, Rows) for f in facts):
        return op.opcode not in _LEFT_ALONE
    if not facts:
        return False
    x = facts[0]
    if op.opcode == "dynamic_slice":
        return isinstance(x, Halo)
    if op.opcode == "pad":
        return isinstance(x, Halo) or (isinstance(x, Holds) and not x.layout.partial
                                       and (dim := _padded_dim(op)) is not None and bool(x.layout.dims[dim]))
    return False


def transfer(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    failed = next((f for f in facts if isinstance(f, Failed)), None)
    if failed is not None:
        return tuple(upstream(failed, op) for _ in op.results)
    match op.opcode:
        case "pad":
            return (_pad(ctx, op, facts),)
        case "dynamic_slice":
            return (_dynamic_slice(ctx, op, facts),)
        case "slice":
            return (_slice(ctx, op, facts[0]),)
        case "collective_permute":
            return (_permute(ctx, op, facts[0]),)
        case "concatenate":
            return (_concatenate(ctx, op, facts),)
        case "select":
            return (_select(ctx, op, facts),)
        case _ if op.opcode in _PASS and len(facts) == 1:
            return facts
    rows = next(f for f in facts if isinstance(f, Rows))
    # Named at the op that placed the rows last: there they stopped being blocks of anything, which is where
    # a wrong permute or offset is written; the op reading them is as the partitioner always writes it.
    at = rows.origin or op
    return tuple(ctx.unsupported(at, f"{describe(rows)}, read by {op.opcode}: no rule reads such rows until they "
                                     "are blocks of a tensor again") for _ in op.results)


def describe(r: Rows) -> str:
    return (f"rows of dim {r.dim} that each device holds by a table of its own (the steps of a padded split "
            f"dim's resharding; {r.table.shape[1]} rows per device)")


# -- tables ----------------------------------------------------------------------------------------------

def as_rows(ctx: Ctx, f: Fact, dim: int) -> Rows | None:
    """`f` as rows of `dim` held by table: a block of a split dim, a halo along that dim alone, rows."""
    if isinstance(f, Rows):
        return f if f.dim == dim else None
    if isinstance(f, Halo):
        if any(d != dim for d, _, _ in f.sides) or f.fill == "wrap" or f.base.layout.partial:
            return None
        base, table, fill = f.base, H.rows(f, dim, ctx.mesh), f.fill
    elif isinstance(f, Holds) and not f.layout.partial and f.layout.dims[dim]:
        n = ctx.mesh.size_of(f.layout.dims[dim])
        if f.term.type.shape[dim] % n:
            return None
        base, table, fill = f, H.rows(Halo(f, (), None, None), dim, ctx.mesh), None
    else:
        return None
    dims = tuple(() if k == dim else a for k, a in enumerate(base.layout.dims))
    return Rows(Holds(base.term, Layout(dims), base.origin), dim, np.asarray(table, dtype=np.int64), fill, f.origin)


def _peeled(r: Rows) -> Rows:
    """`r` over the tensor its base is a window of along its dim (`slice`, `pad` by a constant: how a
    shift of blocks with zeros coming in reads), the rows each device holds unchanged."""
    t, table, fill = r.base.term, r.table, r.fill
    while t.op in ("slice", "pad") and t.args:
        inner = t.args[0]
        rank, n = t.type.rank, t.type.shape[r.dim]
        if t.op == "slice":
            starts, limits, strides = (tuple(t.attr(k)) for k in ("start_indices", "limit_indices", "strides"))
            if any((starts[k], limits[k], strides[k]) != (0, inner.type.shape[k], 1) for k in range(rank)
                   if k != r.dim) or strides[r.dim] != 1:
                break
            lo, value = -starts[r.dim], None
        else:
            low, high, interior = (tuple(t.attr(k)) for k in ("edge_padding_low", "edge_padding_high",
                                                              "interior_padding"))
            value = scalar_value(t.args[1])
            if any(interior) or value is None or any((low[k], high[k]) != (0, 0) for k in range(rank) if k != r.dim):
                break
            lo = low[r.dim]
        placed = (table >= 0) & (table < n)
        # Rows outside this window hold the fill (padding); rows of unknown values stay unknown.
        held = np.where(placed, table - lo, np.where(table == JUNK_ROW, JUNK_ROW, OUT_ROW))
        pads = placed & ((held < 0) | (held >= inner.type.shape[r.dim]))  # rows of this pad's own padding
        if pads.any():
            if value is None:
                break
            if fill is None or fill != value:
                if (held == OUT_ROW).any() or (table == OUT_ROW).any():
                    held = np.where(pads, JUNK_ROW, held)
                else:
                    fill = float(value)
        table, t = np.where(pads & (held != JUNK_ROW), OUT_ROW, held), inner
    if t is r.base.term:
        return r
    return Rows(Holds(t, r.base.layout, r.base.origin), r.dim, table, fill, r.origin)


def _together(rows: list[Rows]) -> list[Rows] | None:
    """The rows over one tensor: as they are, or each over the tensor its base is a window of."""
    if all(r.base.term.id == rows[0].base.term.id and r.base.layout == rows[0].base.layout for r in rows):
        return rows
    peeled = [_peeled(r) for r in rows]
    if all(r.base.term.id == peeled[0].base.term.id and r.base.layout == peeled[0].base.layout for r in peeled):
        return peeled
    return None


def _outside(r: Rows) -> npt.NDArray[np.bool_]:
    """Entries that hold the fill: rows outside the tensor and rows of padding."""
    n = r.base.term.type.shape[r.dim]
    return (r.table != JUNK_ROW) & ((r.table < 0) | (r.table >= n))


def _refilled(r: Rows, fill: float | None) -> np.ndarray:
    """`r`'s table for rows that are to hold `fill`: a row holding another fill holds unknown values."""
    if fill is not None and r.fill == fill:
        return r.table
    return np.where(_outside(r), JUNK_ROW, r.table)


def _made(ctx: Ctx, r: Rows) -> Fact:
    """`r`, settled when its rows are blocks (`Holds`) or blocks with neighbours' rows (`Halo`), of its
    base or of its base with the dim unfolded into a unit dim before it (`_unfolded`)."""
    t = r.table
    if t.shape[1] == 0 or (t == JUNK_ROW).any() or not (t != OUT_ROW).any(axis=1).all():
        return r
    made = _settled(ctx, r)
    if made is not r:
        return made
    unfolded = _unfolded(ctx, r)
    if unfolded is not None and not isinstance(settled := _settled(ctx, unfolded), Rows):
        return settled
    return r


def _unfolded(ctx: Ctx, r: Rows) -> Rows | None:
    """`r` over its base with the dim reshaped `[1, g·m] -> [g, m]` into a unit dim before it, when every
    device's rows lie in one of the g groups and the group is the device's index along some axes: RoPE's
    half of each head when the heads and the head dim are one dim split over tp (fewer KV heads than tp:
    XLA keeps the heads dim as a unit dim and exchanges half heads)."""
    term, d = r.base.term, r.dim
    shape = term.type.shape
    if d == 0 or shape[d - 1] != 1 or r.base.layout.dims[d - 1] or r.fill is None:
        return None
    placed = r.table != OUT_ROW
    for g in range(2, shape[d] + 1):
        if shape[d] % g:
            continue
        m = shape[d] // g
        group = np.where(placed, r.table // m, -1)
        per_device = group.max(axis=1)
        if ((group != per_device[:, None]) & placed).any() or ((r.table < 0) | (r.table >= shape[d]))[placed].any():
            continue
        found = match_axis_index(per_device, ctx.mesh)
        if found is None or found[1] not in (0, 1):
            continue
        dims = list(r.base.layout.dims)
        dims[d - 1] = found[0]
        try:
            layout = Layout(tuple(dims))
        except ShardingError:
            continue
        new_shape = tuple(g if k == d - 1 else m if k == d else s for k, s in enumerate(shape))
        reshaped = ctx.terms.apply("reshape", (term,), (), TensorType(new_shape, term.type.dtype))
        table = np.where(placed, r.table % m, OUT_ROW)
        return Rows(Holds(reshaped, layout, r.base.origin), d, table, r.fill, r.origin)
    return None


def _settled(ctx: Ctx, r: Rows) -> Fact:
    t = r.table
    devices, n = t.shape
    size = r.base.term.type.shape[r.dim]
    placed = t != OUT_ROW
    first = placed.argmax(axis=1)
    start = t[np.arange(devices), first] - first
    expected = start[:, None] + np.arange(n)[None, :]
    if not np.array_equal(np.where(placed, t, expected), expected):
        return r
    if ((expected[~placed] >= 0) & (expected[~placed] < size)).any():
        return r  # padding where a row of the tensor belongs
    leaves = bool(((expected < 0) | (expected >= size)).any())  # (rows where the fill is held)
    dev0 = int(ctx.mesh.device_array().flat[0])
    found = match_axis_index(start - start[dev0], ctx.mesh)
    if found is None:
        return r
    axes, step = found
    used = {a for d in r.base.layout.dims for a in d}
    if set(axes) & used:
        return r
    dims = list(r.base.layout.dims)
    dims[r.dim] = axes
    try:
        layout = Layout(tuple(dims))
    except ShardingError:
        return r
    s = int(start[dev0])
    count = ctx.mesh.size_of(axes)
    if not axes or step == n:
        term = _window(ctx, r, s, s + n * count)  # (None: rows outside the tensor of unknown values)
        return r if term is None else Holds(term, layout, r.origin)
    if size % count == 0 and step == size // count:
        fill = r.fill if leaves else None
        halo = Halo(Holds(r.base.term, layout, r.base.origin), ((r.dim, -s, n - step + s),), fill, r.origin)
        return H.settled(ctx, halo) or halo
    return r


def _window(ctx: Ctx, r: Rows, a: int, b: int) -> Term | None:
    """Rows `[a, b)` of the tensor extended by the fill on both sides (None: past the tensor, an unknown fill)."""
    if r.fill is None and (a < 0 or b > r.base.term.type.shape[r.dim]):
        return None
    return H.filled_rows(ctx, r.base.term, r.dim, a, b, r.fill or 0.0)


# -- the rules ---------------------------------------------------------------------------------------------

def _padded_dim(op: Op) -> int | None:
    """The one dim `op` pads at its edges (no interior padding), else None."""
    lo, hi, inner = (tuple(op.attrs[k]) for k in ("edge_padding_low", "edge_padding_high",  # type: ignore[arg-type]
                                                  "interior_padding"))
    dims = [d for d in range(len(lo)) if (lo[d], hi[d], inner[d]) != (0, 0, 0)]
    if len(dims) != 1 or inner[dims[0]]:
        return None
    return dims[0]


def _pad(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    """The rows with `lo` rows of padding before and `hi` after on every device (negative: rows cut off)."""
    dim = _padded_dim(op)
    value = facts[1]
    folded = ctx.fold(value.term) if isinstance(value, Holds) and not value.layout.partial else None
    if dim is None or folded is None or folded.size != 1:
        return ctx.unsupported(op, "a pad of rows of a split dim along more than that dim, or by a value that is "
                                   "not a constant")
    r = as_rows(ctx, facts[0], dim)
    if r is None:
        return ctx.unsupported(op, f"a pad along dim {dim} of rows that are not a block or halo of one tensor")
    v = float(np.asarray(folded).reshape(-1)[0])
    lo = int(op.attrs["edge_padding_low"][dim])  # type: ignore[index]
    hi = int(op.attrs["edge_padding_high"][dim])  # type: ignore[index]
    t = _refilled(r, v)
    t = t[:, max(-lo, 0):t.shape[1] - max(-hi, 0)]
    out = np.full((t.shape[0], max(lo, 0) + t.shape[1] + max(hi, 0)), OUT_ROW, dtype=np.int64)
    out[:, max(lo, 0):max(lo, 0) + t.shape[1]] = t
    return _made(ctx, Rows(r.base, dim, out, v, op))


def _offsets(ctx: Ctx, f: Fact) -> np.ndarray | None:
    """A start index on every device, `[devices]` (as `indexing.start_offsets` reads it)."""
    off = start_offsets(ctx, f)
    if isinstance(off, np.ndarray):
        return off
    return np.full(ctx.mesh.size, off, dtype=np.int64) if isinstance(off, int) else None


def _dynamic_slice(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    """Each device's window of its rows at its own offset (clamped, as the op clamps it); the other dims
    whole."""
    x, *starts = facts
    local = op.operands[0].tensor.shape
    sizes = list(op.attrs["slice_sizes"])  # type: ignore[arg-type]
    offsets = [_offsets(ctx, s) for s in starts]
    cut = [d for d in range(len(local)) if sizes[d] != local[d]]
    if any(o is None for o in offsets) or len(cut) > 1:
        return ctx.unsupported(op, "a dynamic-slice of rows along more than one dim, or at offsets not known on "
                                   "every device")
    dim = cut[0] if cut else (x.dim if isinstance(x, Rows) else (x.sides[0][0] if isinstance(x, Halo) and x.sides
                                                                  else None))
    r = as_rows(ctx, x, dim) if dim is not None else None
    start = offsets[dim] if dim is not None else None
    if r is None or dim is None or start is None:
        return ctx.unsupported(op, "a dynamic-slice of halo rows along another dim than theirs")
    off = np.clip(start, 0, local[dim] - sizes[dim])
    window = r.table[np.arange(r.table.shape[0])[:, None], off[:, None] + np.arange(sizes[dim])[None, :]]
    return _made(ctx, dataclasses.replace(r, table=window, origin=op))


def _slice(ctx: Ctx, op: Op, x: Fact) -> Fact:
    assert isinstance(x, Rows)
    start = list(op.attrs["start_indices"])  # type: ignore[arg-type]
    limit = list(op.attrs["limit_indices"])  # type: ignore[arg-type]
    strides = list(op.attrs["strides"])  # type: ignore[arg-type]
    local = op.operands[0].tensor.shape
    if any((start[d], limit[d], strides[d]) != (0, local[d], 1) for d in range(len(local)) if d != x.dim) \
            or strides[x.dim] != 1:
        return ctx.unsupported(op, f"a slice of {describe(x)} along another dim, or strided")
    return _made(ctx, dataclasses.replace(x, table=x.table[:, start[x.dim]:limit[x.dim]], origin=op))


def _permute(ctx: Ctx, op: Op, x: Fact) -> Fact:
    """Device t takes the table row of its source; a device no one sends to holds zeros. Only between
    devices that hold the same block of the other dims."""
    assert isinstance(x, Rows)
    pairs = op.attrs.get("source_target_pairs")
    if not isinstance(pairs, Literal):
        return ctx.unsupported(op, "collective-permute without source-target pairs")
    p = np.asarray(pairs.array, dtype=np.int64).reshape(-1, 2)
    mesh = ctx.mesh
    if p.size and (p.min() < 0 or p.max() >= mesh.size):
        return ctx.unsupported(op, "a collective-permute naming a device outside the mesh")
    used = [a for d in x.base.layout.dims for a in d]
    if used and p.size:
        coords = mesh.coords(p)
        keep = [mesh.axis_index(a) for a in used]
        if not np.array_equal(coords[:, 0, keep], coords[:, 1, keep]):
            return ctx.unsupported(op, f"a collective-permute of {describe(x)} between devices holding different "
                                       "blocks of the other dims")
    t = x.table
    fill = x.fill
    zeros = JUNK_ROW
    if fill == 0.0 or (fill is None and not _outside(x).any()):
        fill, zeros = 0.0, OUT_ROW
    out = np.full_like(t, zeros)
    out[p[:, 1]] = t[p[:, 0]]
    return _made(ctx, Rows(x.base, x.dim, out, fill, op))


def _concatenate(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    dim = int(op.attrs["dimension"])  # type: ignore[arg-type]
    parts = [as_rows(ctx, f, dim) for f in facts]
    if any(r is None for r in parts):
        return ctx.unsupported(op, f"a concatenate along dim {dim} of rows held by table with values that are not "
                                   "rows of the same tensor along that dim")
    rows = _together([r for r in parts if r is not None])
    if rows is None:
        return ctx.unsupported(op, "a concatenate of rows of different tensors")
    base = rows[0].base
    fill = next((r.fill for r in rows if _outside(r).any()), None)
    table = np.concatenate([_refilled(r, fill) for r in rows], axis=1)
    return _made(ctx, Rows(base, dim, table, fill, op))


def _select(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    """`select(mask, a, b)` with the mask the same along the other dims, of rows of one tensor on both sides
    (each device keeps some rows of one and some of the other: XLA's exchange of half-blocks picks what it
    received by a predicate per device), or of rows and a splat constant `c`: the rows it clears hold `c`,
    the new fill."""
    pred, a, b = facts
    r = a if isinstance(a, Rows) else b
    if not isinstance(r, Rows):
        return ctx.unsupported(op, "a select of rows")
    shape = op.result.tensor.shape
    mask = H.mask_values(ctx, pred, shape)
    if mask is None:
        return ctx.unsupported(op, f"a select of {describe(r)} by a mask that is not computed per device")
    moved = np.moveaxis(mask, 1 + r.dim, -1).reshape(mask.shape[0], -1, shape[r.dim])
    if moved.shape[1] and not (moved == moved[:, :1]).all():
        return ctx.unsupported(op, f"a select of {describe(r)} by a mask that differs along the other dims")
    keep = moved[:, 0] if moved.shape[1] else np.ones((mask.shape[0], shape[r.dim]), dtype=bool)
    ra, rb = as_rows(ctx, a, r.dim), as_rows(ctx, b, r.dim)
    if ra is not None and rb is not None:
        both = _together([ra, rb])
        if both is None:
            return ctx.unsupported(op, "a select between rows of different tensors")
        ra, rb = both
        fill = ra.fill if _outside(ra).any() else rb.fill
        table = np.where(keep, _refilled(ra, fill), _refilled(rb, fill))
        return _made(ctx, Rows(ra.base, ra.dim, table, fill, op))
    other = b if ra is not None else a
    c = scalar_value(other.term) if isinstance(other, Holds) and not other.layout.partial else None
    if c is None:
        return ctx.unsupported(op, f"a select between {describe(r)} and a value that is not a constant or rows of "
                                   "the same tensor")
    value = float(c)
    if ra is None:
        keep = ~keep
    table = np.where(keep, _refilled(r, value), OUT_ROW)
    return _made(ctx, Rows(r.base, r.dim, table, value, op))


# -- where the other rules stop --------------------------------------------------------------------------

RESCUED = ("collective_permute", "dynamic_slice", "select")


def rescue(ctx: Ctx, op: Op, facts: tuple[Fact, ...], again: Callable[[int], Fact | None]) -> tuple[Fact, ...] | None:
    """Rows by table for an op the other rules leave unsupported (without evidence of a bug): a
    collective-permute of a split dim's blocks or halo that is not a shift (XLA's exchange of half-blocks
    when a split dim is cut in halves: `jnp.split` of a fused gate/up projection), a dynamic-slice at an
    offset of each device's own into blocks, or a select between such rows and the blocks they came from. `again(i)`: operand i read as rows where it was permuted (the
    ordinary rule reads a permute of blocks as a tensor of its own, which no table here can join). None
    where no table describes it either."""
    if len(op.results) != 1 or any(isinstance(f, Failed) for f in facts):
        return None
    if op.opcode == "collective_permute":
        return next(((out,) for out in (_permute(ctx, op, r) for r in _readings(ctx, facts[0]))
                     if not isinstance(out, Failed)), None)
    if op.opcode == "dynamic_slice":  # (a window of its own per device of blocks settled a step early)
        return next(((out,) for out in (_dynamic_slice(ctx, op, (r, *facts[1:])) for r in _readings(ctx, facts[0]))
                     if not isinstance(out, Failed)), None)
    for k in (1, 2):
        for r in _readings(ctx, facts[k]):
            for other in (facts[3 - k], again(3 - k)):
                if other is None:
                    continue
                swapped = list(facts)
                swapped[k], swapped[3 - k] = r, other
                out = _select(ctx, op, tuple(swapped))
                if not isinstance(out, Failed):
                    return (out,)
    return None


def permuted(ctx: Ctx, op: Op, x: Fact) -> Fact | None:
    """A collective-permute's result as rows by table, whatever the ordinary rule made of it."""
    return next((out for out in (_permute(ctx, op, r) for r in _readings(ctx, x)) if not isinstance(out, Failed)),
                None)


def _readings(ctx: Ctx, x: Fact) -> list[Rows]:
    return [r for d in _candidate_dims(x) if (r := as_rows(ctx, x, d)) is not None]


def _candidate_dims(x: Fact | None) -> list[int]:
    if isinstance(x, Rows):
        return [x.dim]
    if isinstance(x, Halo):
        return [d for d, _, _ in x.sides][:1] if len(x.sides) == 1 else []
    if isinstance(x, Holds):
        return [d for d, axes in enumerate(x.layout.dims) if axes]
    return []
