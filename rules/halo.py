"""Transfer rules for halo exchange: each device extends its block of a split dim with its neighbours' rows.

A convolution or pooling window over a spatially split image reads rows of the neighbouring blocks.
XLA's partitioner sends them: it slices the edge rows of each block, shifts them one device along the
axis with a collective-permute (the devices at the ends receive zeros), concatenates them around the
block and masks the rows that fall outside the image; an image split along two dims repeats this per dim.
Until the window op no device holds the shard of any global tensor, so the steps are tracked as a `Halo`
fact (facts.py): along each exchanged dim, device `c` holds the rows `[b(c)·block − lo, b(c)·block + block
+ hi)` of a global tensor, and a known value (`fill`) at positions outside the tensor. Each rule below
keeps that statement exact per device. A window op over a halo whose outside positions hold its padding
value, with no padding of its own along those dims, computes the block of the global op padded by
`(lo, hi)` (`window_padding`): `Holds` again.

Anything else reading a halo is unsupported (`unknown`), never read as a block.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import numpy.typing as npt
from scalify_hlo.rules.collectives import rolled
from scalify_hlo.rules.facts import Ctx, Fact, Failed, Fill, Halo, Holds, Varying, upstream

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType
from scalify_hlo.layout.groups import axis_shift, match_axis_index
from scalify_hlo.layout.mesh import Layout, Mesh, Reducer
from scalify_hlo.terms.slicing import slice_along
from scalify_hlo.terms.term import Term, scalar_value

_OPS = ("slice", "collective_permute", "concatenate", "select")
# Ops whose own rules read a halo (the window ops) or pass it on untouched (tuples).
_READ_ELSEWHERE = ("convolution", "reduce_window", "tuple", "get_tuple_element")


def applies(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> bool:
    """Whether `op` is a step of a halo exchange (it slices rows of a split dim's block, or moves a halo on),
    or reads a halo where no rule models it."""
    if any(isinstance(f, Halo) for f in facts):
        return op.opcode not in _READ_ELSEWHERE
    return op.opcode == "slice" and len(facts) == 1 and isinstance(facts[0], Holds)


def describe(h: Halo, ctx: Ctx) -> str:
    """What each device holds, in words: which rows of which split dim."""
    parts = []
    for d, lo, hi in h.sides:
        block = block_of(h, d, ctx.mesh)
        axes = list(h.base.layout.dims[d])
        parts.append(f"rows [{-lo}, {block + hi}) around its block of dim {d} (split over {axes}, blocks of "
                     f"{block})")
    return "on each device " + " and ".join(parts)


def transfer(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """The halo `op` makes, or None to leave `op` to the ordinary rules."""
    match op.opcode:
        case "slice":
            return _slice(ctx, op, facts[0])
        case "collective_permute":
            return (_permute(ctx, op, facts[0]),)
        case "concatenate":
            return (_concatenate(ctx, op, facts),)
        case "select":
            return (_select(ctx, op, facts),)
        case "copy" | "optimization_barrier" if len(facts) == 1:
            return facts  # (identities: the rows are those of the operand)
    h = next(f for f in facts if isinstance(f, Halo))
    return tuple(ctx.unsupported(op, f"{op.opcode} of a value that holds {describe(h, ctx)}: no rule reads such "
                                     "rows except convolutions and window reductions (XLA's halo exchange)")
                 for _ in op.results)


# -- the rows each device holds ------------------------------------------------------------------------------

def extent(h: Halo, dim: int) -> tuple[int, int]:
    """(lo, hi) rows beyond the block along `dim` ((0, 0): the block itself)."""
    return next(((lo, hi) for d, lo, hi in h.sides if d == dim), (0, 0))


def _with_extent(h: Halo, dim: int, lo: int, hi: int) -> tuple[tuple[int, int, int], ...]:
    sides = {d: (a, b) for d, a, b in h.sides}
    sides[dim] = (lo, hi)
    return tuple((d, a, b) for d, (a, b) in sorted(sides.items()) if (a, b) != (0, 0))


def block_of(h: Halo, dim: int, mesh: Mesh) -> int:
    return h.base.term.type.shape[dim] // mesh.size_of(h.base.layout.dims[dim])


def rows(h: Halo, dim: int, mesh: Mesh) -> npt.NDArray[np.int64]:
    """`[devices, local rows]`: the global row each device holds at each local position along `dim`."""
    block = block_of(h, dim, mesh)
    lo, hi = extent(h, dim)
    index = mesh.block_indices(h.base.layout.dims[dim])
    return index[:, None] * block - lo + np.arange(block + lo + hi)[None, :]


def inside(h: Halo, mesh: Mesh, shape: tuple[int, ...]) -> npt.NDArray[np.bool_]:
    """`[devices, *shape]` (the local shape): whether each device's element lies inside the tensor."""
    out = np.ones((mesh.size, *shape), dtype=bool)
    for d, _, _ in h.sides:
        r = rows(h, d, mesh)
        ok = (r >= 0) & (r < h.base.term.type.shape[d])
        out &= ok.reshape(mesh.size, *(n if k == d else 1 for k, n in enumerate(shape)))
    return out


def outside(h: Halo, mesh: Mesh) -> bool:
    """Whether some device holds a position outside the tensor (where it holds `fill`)."""
    for d, _, _ in h.sides:
        r = rows(h, d, mesh)
        if r.size and (r.min() < 0 or r.max() >= h.base.term.type.shape[d]):
            return True
    return False


def as_halo(f: Fact) -> Halo | None:
    """A halo, or a plain block of a split value (a halo of no extra rows)."""
    if isinstance(f, Halo):
        return f
    if isinstance(f, Holds) and f.layout.split_axes() and not f.layout.partial:
        return Halo(f, (), None, None)
    return None


# -- the rules ---------------------------------------------------------------------------------------------

def _slice(ctx: Ctx, op: Op, f: Fact) -> tuple[Fact, ...] | None:
    """Rows `[start, limit)` of each device's block (or halo) along split dims, with any static slice of
    the whole dims: a halo of negative extents. None (the ordinary rule) for a value whose blocks are kept."""
    start = list(op.attrs["start_indices"])  # type: ignore[arg-type]
    limit = list(op.attrs["limit_indices"])  # type: ignore[arg-type]
    strides = list(op.attrs["strides"])  # type: ignore[arg-type]
    local = op.operands[0].tensor.shape
    h = as_halo(f)
    if h is None:
        return None
    base = h.base
    cut = [d for d, axes in enumerate(base.layout.dims) if axes and (start[d], limit[d], strides[d]) != (0, local[d], 1)]
    if isinstance(f, Holds) and not cut:
        return None
    if any(base.term.type.shape[d] % ctx.mesh.size_of(base.layout.dims[d]) for d in cut):
        return None  # (uneven blocks: the ordinary rule says so)
    if any(strides[d] != 1 for d in cut):
        return (_every_kth(ctx, op, h, cut, start, limit, strides),)
    # The whole dims are sliced globally; the split dims stay whole in the base and narrow in the window.
    gstart, glimit = list(start), list(limit)
    for d, axes in enumerate(base.layout.dims):
        if axes:
            gstart[d], glimit[d] = 0, base.term.type.shape[d]
    term = base.term
    if (gstart, glimit, strides) != ([0] * len(local), list(term.type.shape), [1] * len(local)):
        term = _global_slice(ctx, term, gstart, glimit, strides)
    out = dataclasses.replace(h, base=Holds(term, base.layout, base.origin), origin=op)
    for d in cut:
        lo, hi = extent(h, d)
        out = dataclasses.replace(out, sides=_with_extent(out, d, lo - start[d], hi - (local[d] - limit[d])))
    return (settled(ctx, out) or out,)


def _every_kth(ctx: Ctx, op: Op, h: Halo, cut: list[int], start: list[int], limit: list[int], strides: list[int]
               ) -> Fact:
    """Every `k`-th row of each device's block, from its row `s < k` to its end, along split dims whose
    blocks are a multiple of `k` rows (`x[:, 1::2]`, or XLA's `x[:, 0:3][:, ::2]` of 4-row blocks): the same
    rows of the whole tensor, each block's its own (a block starts at a multiple of `k`). The device may hold
    a halo of its block (rows trimmed or added) as long as the rows taken are the block's. Anything else
    along a split dim is not modelled."""
    local = op.operands[0].tensor.shape
    base = h.base
    first: dict[int, int] = {}
    for d in cut:
        k, block = strides[d], block_of(h, d, ctx.mesh)
        s = start[d] - extent(h, d)[0]  # the first row taken, counted from the block's start
        if k == 1 or block % k or not 0 <= s < k or -(-(limit[d] - start[d]) // k) != block // k:
            return ctx.unsupported(op, "a strided slice of a split dim's rows")
        first[d] = s
    if any(d not in first for d, _, _ in h.sides):
        return ctx.unsupported(op, "a strided slice of halo rows along another dim")
    term = base.term
    dims = base.layout.dims
    gstart = [first.get(d, 0 if dims[d] else start[d]) for d in range(len(local))]
    glimit = [term.type.shape[d] if dims[d] else limit[d] for d in range(len(local))]
    return Holds(_global_slice(ctx, term, gstart, glimit, strides), base.layout, op)


def _global_slice(ctx: Ctx, term: Term, lo: list[int], hi: list[int], strides: list[int]) -> Term:
    """`term[lo:hi:strides]`, the slice of the global tensor."""
    shape = tuple(-(-(b - a) // st) for a, b, st in zip(lo, hi, strides, strict=True))
    attrs = (("limit_indices", tuple(hi)), ("start_indices", tuple(lo)), ("strides", tuple(strides)))
    return ctx.terms.apply("slice", (term,), attrs, TensorType(shape, term.type.dtype))


def settled(ctx: Ctx, h: Halo) -> Holds | None:
    """A halo whose rows are as many as a block along every exchanged dim (`lo + hi == 0`: a hand-written
    stencil's `p[:-2]`, `p[1:-1]`, `p[2:]` of its block with both neighbours' rows) is a block again: device c holds the
    rows `[b(c)·block − lo, …)` of the tensor shifted by `lo`, the fill where it leaves the tensor —
    `pad(x, (lo, 0))[:n]` (`lo > 0`) or `pad(x, (0, −lo))[−lo:]`. None otherwise, or where the fill is unknown."""
    if any(lo + hi for _, lo, hi in h.sides) or (h.fill is None and outside(h, ctx.mesh)):
        return None
    term = h.base.term
    if h.fill == "wrap" and outside(h, ctx.mesh):
        if len(h.sides) != 1:
            return None
        ((d, lo, _),) = h.sides
        return Holds(rolled(ctx.terms, term, d, lo), h.base.layout, h.origin)  # row r holds row (r − lo) mod n
    for d, lo, _ in h.sides:
        n = term.type.shape[d]
        term = filled_rows(ctx, term, d, -lo, n - lo, h.fill if isinstance(h.fill, float) else 0.0)
    return Holds(term, h.base.layout, h.origin)


def filled_rows(ctx: Ctx, term: Term, dim: int, a: int, b: int, fill: float) -> Term:
    """Rows `[a, b)` of `term` along `dim`, the tensor extended by `fill` on both sides: a slice of its pad."""
    size, rank = term.type.shape[dim], term.type.rank
    low, high = max(-a, 0), max(b - size, 0)
    if low or high:
        attrs = (("edge_padding_high", tuple(high if k == dim else 0 for k in range(rank))),
                 ("edge_padding_low", tuple(low if k == dim else 0 for k in range(rank))),
                 ("interior_padding", (0,) * rank))
        shape = tuple(size + low + high if k == dim else m for k, m in enumerate(term.type.shape))
        value = ctx.terms.scalar(fill, term.type.dtype)
        term = ctx.terms.apply("pad", (term, value), attrs, TensorType(shape, term.type.dtype))
    return slice_along(ctx.terms, term, dim, a + low, b + low)


def _permute(ctx: Ctx, op: Op, f: Fact) -> Fact:
    assert isinstance(f, Halo)
    pairs = op.attrs.get("source_target_pairs")
    if not isinstance(pairs, Literal):
        return ctx.unsupported(op, "collective-permute without source-target pairs")
    dims = f.base.layout.dims
    found = next(((d, s) for d, axes in enumerate(dims) if axes
                  and (s := axis_shift(pairs.array, ctx.mesh, axes)) is not None), None)
    if found is None:
        return ctx.unsupported(op, "a collective-permute of halo rows that is not a shift along the axes of "
                                   "one split dim")
    d, (k, cyclic) = found
    lo, hi = extent(f, d)
    if lo > 0 or hi > 0:
        return ctx.unsupported(op, "a collective-permute of rows that reach beyond a device's own block")
    block = block_of(f, d, ctx.mesh)
    # Device i receives device (i − k)'s rows along d: the same window, k blocks earlier. A device with no
    # sender holds zeros, under a cyclic shift the other end's rows: either way at rows outside the tensor
    # (the sent rows lie inside the sender's block). Other dims are as the sender held them.
    held_outside = outside(f, ctx.mesh)
    fill: Fill
    if cyclic:
        fill = None if held_outside else "wrap"
    else:
        fill = 0.0 if not held_outside or f.fill == 0.0 else None
    moved = dataclasses.replace(f, sides=_with_extent(f, d, lo + k * block, hi - k * block), fill=fill, origin=op)
    return settled(ctx, moved) or moved


def _concatenate(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    dim = int(op.attrs["dimension"])  # type: ignore[arg-type]
    failed = next((f for f in facts if isinstance(f, Failed)), None)
    if failed is not None:
        return upstream(failed, op)
    parts = [as_halo(f) for f in facts]
    halos = [h for h in parts if h is not None]
    if len(halos) != len(parts):
        return ctx.unsupported(op, "a concatenate of halo rows with values that are not rows of the same tensor")
    first = halos[0]
    base = first.base
    if any(h.base.term.id != base.term.id or h.base.layout != base.layout for h in halos):
        return ctx.unsupported(op, "a concatenate of halo rows of different tensors")
    if not base.layout.dims[dim]:
        return ctx.unsupported(op, "a concatenate of halo rows along a dim that is not split")
    if any({s for s in h.sides if s[0] != dim} != {s for s in first.sides if s[0] != dim} for h in halos):
        return ctx.unsupported(op, "a concatenate of halo rows that differ along another dim")
    block = block_of(first, dim, ctx.mesh)
    halos = _unwrapped(halos, dim, block, block * ctx.mesh.size_of(base.layout.dims[dim]))
    for a, b in itertools.pairwise(halos):
        if -extent(b, dim)[0] != block + extent(a, dim)[1]:  # b must start where a ends
            # Rows of one tensor side by side that are not neighbours: evidence (backed by a counterexample
            # or `unknown`), at the permute that moved the rows, where a wrong shift is written.
            moved = [h.origin for h in (a, b) if h.origin is not None and h.origin.opcode == "collective_permute"]
            at = moved[0] if moved else op
            return ctx.fail(at, f"rows of one tensor concatenated along dim {dim} that are not neighbours: each "
                            f"device's rows [{-extent(a, dim)[0]}, {block + extent(a, dim)[1]}) then "
                            f"[{-extent(b, dim)[0]}, {block + extent(b, dim)[1]}) around its block (a halo row "
                            "sent to the wrong neighbour, or the wrong row sent)", evidence=True)
    fills = {h.fill for h in halos if outside(h, ctx.mesh)}
    fill = fills.pop() if len(fills) == 1 else None
    sides = _with_extent(first, dim, extent(first, dim)[0], extent(halos[-1], dim)[1])
    joined = Halo(base, sides, fill, op)
    return settled(ctx, joined) or joined


def _unwrapped(halos: list[Halo], dim: int, block: int, size: int) -> list[Halo]:
    """The halos, those whose rows wrap around the tensor (a cyclic shift's) moved by whole tensor lengths so
    that each starts where the one before it ends, counted from the first that does not wrap. On a ring of
    two devices a shift by one is also a shift by minus one, and `axis_shift` names one of the two: rows
    that wrap hold row `p mod size` at every position `p`, so either reading is exact."""
    out = list(halos)
    anchor = next((i for i, h in enumerate(out) if h.fill != "wrap"), 0)

    def moved(h: Halo, m: int) -> Halo:  # the window m tensor lengths later
        lo, hi = extent(h, dim)
        return dataclasses.replace(h, sides=_with_extent(h, dim, lo - m * size, hi + m * size))

    for i in range(anchor + 1, len(out)):  # out[i] must start where out[i - 1] ends
        m, r = divmod(block + extent(out[i - 1], dim)[1] + extent(out[i], dim)[0], size)
        if out[i].fill == "wrap" and m and not r:
            out[i] = moved(out[i], m)
    for i in range(anchor - 1, -1, -1):  # out[i] must end where out[i + 1] starts
        m, r = divmod(-extent(out[i + 1], dim)[0] - block - extent(out[i], dim)[1], size)
        if out[i].fill == "wrap" and m and not r:
            out[i] = moved(out[i], m)
    return out


def _select(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Fact:
    """`select(mask, halo, c)` (or `select(mask, c, halo)`) with `c` a splat constant: the halo with fill
    `c` when the mask keeps every position inside the tensor on every device and, unless the halo's fill
    is already `c`, clears every position outside it."""
    pred, a, b = facts
    failed = next((f for f in facts if isinstance(f, Failed)), None)
    if failed is not None:
        return upstream(failed, op)
    keep_true = isinstance(a, Halo)
    h, other = (a, b) if keep_true else (b, a)
    if not isinstance(h, Halo) or not isinstance(other, Holds) or other.layout.partial:
        return ctx.unsupported(op, "a select between a halo and a value that is not a constant")
    c = scalar_value(other.term)
    shape = op.result.tensor.shape
    mask = mask_values(ctx, pred, shape)
    if c is None or mask is None:
        return ctx.unsupported(op, "a select of halo rows by a mask that is not computed per device")
    if not keep_true:
        mask = ~mask
    if c == 0.0 and (one := _one_device(ctx, h, mask)) is not None:
        return one
    held = inside(h, ctx.mesh, shape)
    if not mask[held].all():
        return ctx.unsupported(op, "a mask that clears positions inside the tensor from a halo")
    if h.fill != c and mask[~held].any():
        return ctx.unsupported(op, "a mask that keeps positions outside the tensor in a halo")
    return dataclasses.replace(h, fill=c if outside(h, ctx.mesh) else h.fill)


def _one_device(ctx: Ctx, h: Halo, mask: npt.NDArray[np.bool_]) -> Holds | None:
    """The rows the devices at index `k` along the halo's axes hold, kept there and zeroed on the others
    (`select(axis_index == k, rows, 0)`, then a psum: how XLA hands every device `x[:, 0]` or `x[:, -1]` of a
    sequence split over tp): a partial sum over those axes of that slice of the tensor. None otherwise (a
    mask that is not whole per device, or rows that leave the tensor)."""
    if len(h.sides) != 1 or h.base.layout.partial:
        return None
    ((d, lo, hi),) = h.sides
    axes = h.base.layout.dims[d]
    flat = mask.reshape(ctx.mesh.size, -1)
    if not flat.size or not np.all(flat == flat[:, :1]):
        return None
    index = ctx.mesh.block_indices(axes)
    kept = np.unique(index[flat[:, 0]])
    if kept.size != 1 or not np.array_equal(flat[:, 0], index == kept[0]):
        return None
    if any(set(axes) & set(other) for i, other in enumerate(h.base.layout.dims) if i != d):
        return None
    block, n = block_of(h, d, ctx.mesh), h.base.term.type.shape[d]
    first, last = int(kept[0]) * block - lo, (int(kept[0]) + 1) * block + hi
    if first < 0 or last > n:
        return None
    rows_k = slice_along(ctx.terms, h.base.term, d, first, last)
    dims = tuple(() if i == d else a for i, a in enumerate(h.base.layout.dims))
    return Holds(rows_k, Layout(dims, tuple((a, Reducer.SUM) for a in axes)), h.origin)


def mask_values(ctx: Ctx, pred: Fact, shape: tuple[int, ...]) -> npt.NDArray[np.bool_] | None:
    """`[devices, *shape]`: the mask on every device, computed per device or a constant of the program. A
    scalar predicate (`where(axis_index == k, rows, 0)` spelt with a scalar) keeps or clears every position."""
    if isinstance(pred, Varying):
        values = np.asarray(pred.values, dtype=bool).reshape(ctx.mesh.size, -1)
        if values.shape[1] == 1:
            return np.broadcast_to(values.reshape(ctx.mesh.size, *([1] * len(shape))), (ctx.mesh.size, *shape))
        return values.reshape(ctx.mesh.size, *shape) if values.shape[1] == math.prod(shape) else None
    if isinstance(pred, Holds) and not pred.layout.split_axes() and not pred.layout.partial:
        folded = ctx.fold(pred.term)
        if folded is not None and folded.shape in (shape, ()):
            return np.broadcast_to(np.asarray(folded, dtype=bool), (ctx.mesh.size, *shape))
    return None


def dynamic_window(ctx: Ctx, x: Holds, dim: int, offsets: npt.NDArray[np.int64], sizes: list[int],
                   op: Op) -> Halo | None:
    """A dynamic-slice of a whole tensor at `block · index + c` along `dim` (index: the device's along some
    axes), `sizes[dim]` rows long: each device's block of the tensor and rows around it, a halo. Seen
    through a zero-interior pad of the dim (XLA's cumsum over a split dim slices a padded all-gather), the
    halo is of the unpadded tensor, with the pad value outside it. None where that is not what it is."""
    local = x.term.type.shape
    if x.layout.partial or x.layout.dims[dim] or any(
            k != dim and sizes[k] != n for k, n in enumerate(x.layout.local_shape(local, ctx.mesh))):
        return None
    if (offsets < 0).any() or (offsets > local[dim] - sizes[dim]).any():
        return None  # clamped by the op: not a window at these offsets
    first = int(offsets[int(ctx.mesh.device_array().flat[0])])
    match = match_axis_index(offsets - first, ctx.mesh)
    if match is None or not match[0] or match[1] <= 0:
        return None
    axes, block = match
    term, shift, fill = x.term, 0, None
    if term.op == "pad":
        low, high, inner = (tuple(term.attr(k)) for k in ("edge_padding_low", "edge_padding_high", "interior_padding"))
        if any(inner) or any(k != dim and (low[k], high[k]) != (0, 0) for k in range(len(low))):
            return None
        term, shift, fill = term.args[0], int(low[dim]), scalar_value(term.args[1])
        if fill is None:
            return None
    if term.type.shape[dim] != block * ctx.mesh.size_of(axes):
        return None
    dims = list(x.layout.dims)
    dims[dim] = axes
    try:
        layout = Layout(tuple(dims))
    except ShardingError:
        return None
    lo = shift - first
    return Halo(Holds(term, layout, x.origin), ((dim, lo, sizes[dim] - block - lo),), fill, op)


# -- window ops over a halo ----------------------------------------------------------------------------------

def window_padding(ctx: Ctx, op: Op, h: Halo, dim: int, padding: tuple[int, int], dilation: int, stride: int,
                   window: int, pad_value: float) -> tuple[int, int] | Failed:
    """The padding along `dim` of the global window op (convolution, reduce_window) whose block each device
    computes by applying the op to its halo with `padding` of its own, input `dilation`, `stride` and a
    window spanning `window` rows, when the op pads with `pad_value`.

    Undilated, the device's windows start at its block's first row: no padding of its own, a stride
    dividing the block, one output per stride of the block, and the global padding is the halo's extents.
    Dilated by r (the input gradient of a strided conv), its halo row m is the global row b·block − lo + m,
    at dilated position r·(b·block − lo + m): the device's outputs are rows [b·r·block, (b+1)·r·block) of
    the global op padded by r·lo + its own low padding, when its own padding lies between two dilated rows
    (less than r) and it gives r·block outputs, stride 1."""
    block = block_of(h, dim, ctx.mesh)
    if outside(h, ctx.mesh) and h.fill != pad_value:
        return ctx.unsupported(op, f"a window over halo rows holding {h.fill} outside the tensor, where the "
                                   f"op pads with {pad_value}")
    lo, hi = extent(h, dim)
    held = block + lo + hi
    if dilation == 1:
        if padding != (0, 0) or block % stride:
            return ctx.unsupported(op, f"a window over halo rows with padding {padding} and stride {stride} "
                                       f"(block {block})")
        if held < window or (held - window) // stride + 1 != block // stride:
            return ctx.unsupported(op, f"a window of {window} over {held} halo rows that does not give the "
                                       f"device's {block // stride} output rows")
        return lo, hi
    a, b = padding
    span = a + (held - 1) * dilation + 1 + b
    if stride != 1 or not (0 <= a < dilation and 0 <= b < dilation) or span - window + 1 != dilation * block:
        return ctx.unsupported(op, f"a window over halo rows dilated by {dilation} with padding {padding}, stride "
                                   f"{stride} and {held} rows (block {block}) whose outputs are not the block's")
    n = ctx.mesh.size_of(h.base.layout.dims[dim])
    size = h.base.term.type.shape[dim]
    p_lo = a + dilation * lo
    return p_lo, n * dilation * block + window - 1 - ((size - 1) * dilation + 1) - p_lo


def contracted_window(ctx: Ctx, op: Op, h: Halo | None, dim: int, kernel_rows: int, padding: tuple[int, int],
                      lhs_dilation: int, rhs_dilation: int) -> tuple[int, int] | Failed:
    """The padding along `dim` of the global convolution of which each device computes a partial sum when
    the kernel's rows along that dim are split like the input's (a weight gradient): device i's kernel
    rows are rows `[i·kb, (i+1)·kb)` of the kernel, which meet the input rows from `i·kb·dilation − lo`,
    where its halo starts when the input's block is `kb·dilation`. Both output sizes then agree."""
    if h is None:
        return ctx.unsupported(op, "a convolution over a split kernel dim of a partial input")
    n = ctx.mesh.size_of(h.base.layout.dims[dim])
    block = block_of(h, dim, ctx.mesh)
    if kernel_rows % n or padding != (0, 0) or lhs_dilation != 1 or block != kernel_rows // n * rhs_dilation:
        return ctx.unsupported(op, f"a convolution over split input and kernel rows (input block {block}, "
                                   f"kernel {kernel_rows} rows over {n} devices, padding {padding}, dilations "
                                   f"{lhs_dilation}/{rhs_dilation}) whose windows are not the blocks' own")
    if outside(h, ctx.mesh) and h.fill != 0.0:
        return ctx.unsupported(op, "a convolution of halo rows whose rows outside the image are not zero")
    return extent(h, dim)
