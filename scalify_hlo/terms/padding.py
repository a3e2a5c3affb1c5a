"""Padded splits: the forms XLA's padding of a dim a mesh axis does not divide takes, read back.

XLA pads such a dim to the next multiple (30 over 4 devices as 4 blocks of 8), works on the padded
blocks, masks the padding where it would change a result (a select before a contraction or a reduction),
and cuts it off at the end. The forms here move the cut through the ops it commutes with until the pad
drops out (`through_pad`), read a mask that keeps a window as that window padded (`masked_window`), and
drop a pad read only where it holds the operand's own values. Each is exact; a dot's padding with zeros
is in `dots.py`, a reduce's with its identity in `reductions.py`, a gather's in `ranges.py`.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from scalify_hlo.ir.nodes import DotDims, ScatterDims, TensorType
from scalify_hlo.ops.elementwise import SHAPE_PRESERVING
from scalify_hlo.terms.slicing import iota_window, slice_of, window_along
from scalify_hlo.terms.term import Term, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms


def slice_of_pad(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """`pad(y)[lo:hi]` as `pad(y[lo':hi'])` with only the padding the window keeps (edge padding only, none
    negative): a shift with a fill written as a padded slice or as a sliced pad is one term
    (`jnp.pad(x, 1)[:-2]` and a stencil's rows from the neighbours). None when `x` is not such a pad."""
    if x.op != "pad":
        return None
    low, high, inner = (tuple(x.attr(k)) for k in ("edge_padding_low", "edge_padding_high", "interior_padding"))
    if any(inner) or any(v < 0 for v in (*low, *high)):
        return None
    y, value = x.args
    n = y.type.shape
    ylo = tuple(min(max(a - p, 0), m) for a, p, m in zip(lo, low, n, strict=True))
    yhi = tuple(max(min(b - p, m), c) for b, p, m, c in zip(hi, low, n, ylo, strict=True))
    new_low = tuple(max(p - a, 0) for a, p in zip(lo, low, strict=True))
    kept = tuple(c - a for a, c in zip(ylo, yhi, strict=True))
    new_high = tuple(b - a - k - nl for a, b, k, nl in zip(lo, hi, kept, new_low, strict=True))
    if any(v < 0 for v in new_high):
        return None
    inner_y = slice_of(terms, y, ylo, yhi)
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    attrs = (("edge_padding_high", new_high), ("edge_padding_low", new_low), ("interior_padding", inner))
    return terms.apply("pad", (inner_y, value), attrs, TensorType(shape, x.type.dtype))


def through_pad(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """`x[lo:hi]` with the slice moved into `x`'s operands, where the window keeps none of the padding of
    a pad that `x` computes from through ops the slice commutes with (elementwise ops, broadcasts,
    transposes, the kept dims of reductions): the pad then drops out. XLA pads a dim a mesh axis does not
    divide (30 as 4 blocks of 8), computes on the padded blocks, and cuts the padding off at the end; the
    slice normal form, which moves slices outward, would leave the pad in. Exact. None otherwise."""
    windows = _operand_windows(x, lo, hi)
    if windows is None or not _reaches_cut_pad(x, lo, hi):
        return None
    args = tuple(a if w is None else _absorbed(terms, a, *w, 8) or slice_of(terms, a, *w)
                 for a, w in zip(x.args, windows, strict=True))
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    return terms.apply(x.op, args, x.attrs, TensorType(shape, x.type.dtype))


def _absorbed(terms: Terms, t: Term, lo: tuple[int, ...], hi: tuple[int, ...], depth: int) -> Term | None:
    """`t[lo:hi]` with no slice left, where `t` is index arithmetic the cut goes all the way through: an
    iota cut at its start, broadcasts and elementwise ops of such (a one-hot of labels over the padded
    columns, cut to the real ones, is the one-hot over those). None otherwise."""
    if lo == (0,) * len(lo) and hi == t.type.shape:
        return t
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    if t.op == "iota":
        return (terms.apply("iota", (), t.attrs, TensorType(shape, t.type.dtype))
                if lo[t.attr("iota_dimension")] == 0 else None)
    if depth == 0 or not (t.op == "broadcast_in_dim" or t.op in SHAPE_PRESERVING):
        return None
    windows = _operand_windows(t, lo, hi)
    if windows is None:
        return None
    args = []
    for a, w in zip(t.args, windows, strict=True):
        cut = a if w is None else _absorbed(terms, a, *w, depth - 1)
        if cut is None:
            return None
        args.append(cut)
    return terms.apply(t.op, tuple(args), t.attrs, TensorType(shape, t.type.dtype))


Window = tuple[tuple[int, ...], tuple[int, ...]]


def _operand_windows(x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> list[Window | None] | None:
    """The window of each operand that `x[lo:hi]` reads (None: the operand whole, as a reduce's initial
    value), for the ops a slice commutes with; None for any other op."""
    if x.op in SHAPE_PRESERVING and all(a.type.shape == x.type.shape for a in x.args):
        return [(lo, hi)] * len(x.args)
    if x.op == "broadcast_in_dim":
        (y,) = x.args
        ylo, yhi = [0] * y.type.rank, list(y.type.shape)
        for j, d in enumerate(x.attr("broadcast_dimensions")):
            if y.type.shape[j] == x.type.shape[d]:  # (a stretched unit dim stays whole)
                ylo[j], yhi[j] = lo[d], hi[d]
        return [(tuple(ylo), tuple(yhi))]
    if x.op == "transpose":
        perm = x.attr("permutation")
        ylo, yhi = [0] * len(perm), [0] * len(perm)
        for i, p in enumerate(perm):
            ylo[p], yhi[p] = lo[i], hi[i]
        return [(tuple(ylo), tuple(yhi))]
    if x.op == "reduce" and len(x.args) == 2:
        y = x.args[0]
        reduced = set(x.attr("dimensions"))
        kept = [j for j in range(y.type.rank) if j not in reduced]
        ylo, yhi = [0] * y.type.rank, list(y.type.shape)
        for i, j in enumerate(kept):
            ylo[j], yhi[j] = lo[i], hi[i]
        return [(tuple(ylo), tuple(yhi)), None]
    dims = x.attr("dot_dimension_numbers")
    if x.op == "dot_general" and isinstance(dims, DotDims):
        # the result is [batch, lhs free, rhs free]; contracted dims are read whole
        out: list[Window | None] = []
        first = len(dims.lhs_batch)
        for y, batch, contract in ((x.args[0], dims.lhs_batch, dims.lhs_contract),
                                   (x.args[1], dims.rhs_batch, dims.rhs_contract)):
            ylo, yhi = [0] * y.type.rank, list(y.type.shape)
            free = [j for j in range(y.type.rank) if j not in (*batch, *contract)]
            for i, j in (*enumerate(batch), *((first + k, j) for k, j in enumerate(free))):
                ylo[j], yhi[j] = lo[i], hi[i]
            out.append((tuple(ylo), tuple(yhi)))
            first += len(free)
        return out
    return None


def _reaches_cut_pad(x: Term, lo: tuple[int, ...], hi: tuple[int, ...], budget: int = 64) -> bool:
    """Whether `x[lo:hi]` reads, through ops a slice commutes with (at most `budget` of them), a window of
    a pad that leaves out all of its padding."""
    # breadth first: the pad is near in the programs this is for, and a wide subgraph beside it (the
    # statistics of a softmax) must not use up the budget first
    queue: deque[tuple[Term, tuple[int, ...], tuple[int, ...]]] = deque([(x, lo, hi)])
    seen: set[tuple[int, tuple[int, ...], tuple[int, ...]]] = set()
    while queue and budget > 0:
        t, a, b = queue.popleft()
        if (t.id, a, b) in seen:
            continue
        seen.add((t.id, a, b))
        budget -= 1
        if t.op == "pad":
            if any(t.attr("interior_padding")):
                continue
            low, n = t.attr("edge_padding_low"), t.args[0].type.shape
            padded = [d for d, (p, q) in enumerate(zip(low, t.attr("edge_padding_high"), strict=True)) if p or q]
            if padded and all(low[d] <= a[d] and b[d] <= low[d] + n[d] for d in padded):
                return True
            continue
        windows = _operand_windows(t, a, b)
        if windows is not None:
            queue.extend((arg, *w) for arg, w in zip(t.args, windows, strict=True) if w is not None)
    return False


def masked_window(terms: Terms, pred: Term, on_true: Term, on_false: Term) -> Term | None:
    """`select(pred, t, c)` where `pred` keeps a window along one dim and the window cuts off the padding
    of a pad that `t` computes from (through elementwise ops): `t`'s window, padded with `c`. XLA masks
    the padded blocks of a dim a mesh axis does not divide before it contracts or reduces them; the pad
    then drops out of the window (`through_pad`). Exact. None otherwise."""
    fill = on_false.args[0] if on_false.op == "broadcast_in_dim" and on_false.args[0].type.rank == 0 else None
    if fill is None or scalar_value(fill) is None or on_true.type != on_false.type:
        return None
    window = iota_window(pred)
    if window is None:
        return None
    d, a, b = window
    lo, hi = window_along(on_true.type.shape, d, a, b)
    if not _reaches_cut_pad(on_true, lo, hi):
        return None
    n = on_true.type.shape[d]
    low = tuple(a if k == d else 0 for k in range(on_true.type.rank))
    high = tuple(n - b if k == d else 0 for k in range(on_true.type.rank))
    return terms.apply("pad", (slice_of(terms, on_true, lo, hi), fill),
                       (("edge_padding_high", high), ("edge_padding_low", low),
                        ("interior_padding", (0,) * on_true.type.rank)), on_true.type)


def masked_pad(on_true: Term, on_false: Term, pred: Term) -> Term | None:
    """`select(pred, pad(y, v), v)` where `pred` is false only at padded positions (a mask along one dim,
    `iota >= k`): the pad itself. XLA's partitioner masks the rows a shift brought in from outside the tensor
    with such a select (`jnp.pad(x, ((1, 0), ...))[:-1]` over a split dim) although the pad already holds
    the fill there. None otherwise."""
    if on_true.op != "pad" or any(on_true.attr("interior_padding")):
        return None
    fill, other = scalar_value(on_true.args[1]), scalar_value(on_false)
    if fill is None or other is None or other != fill or math.copysign(1, other) != math.copysign(1, fill):
        return None  # (the same value, -0.0 and 0.0 told apart)
    window = iota_window(pred)
    if window is None:
        return None
    d, a, b = window
    low, high = on_true.attr("edge_padding_low")[d], on_true.attr("edge_padding_high")[d]
    n = on_true.type.shape[d]
    return on_true if low >= 0 and high >= 0 and a <= low and b >= n - high else None


def slice_of_broadcast(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """A window of a broadcast that keeps every dim the operand gives (a unit dim it stretches aside):
    the broadcast of that operand to the window's shape (a mean broadcast over 32 padded columns, cut to
    the 30 real ones, is the mean broadcast over 30). Exact."""
    if x.op != "broadcast_in_dim":
        return None
    (y,) = x.args
    for j, d in enumerate(x.attr("broadcast_dimensions")):
        if y.type.shape[j] == x.type.shape[d] and (lo[d], hi[d]) != (0, x.type.shape[d]):
            return None
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    return terms.apply("broadcast_in_dim", (y,), x.attrs, TensorType(shape, x.type.dtype))


def slice_of_scatter(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """The leading rows `[0, n)` of a scatter along dims where each update writes one element (inserted
    window dims, not batch dims): the scatter into the operand's leading rows. An update at an index past
    `n` lands outside the window in the one and is dropped, as out of bounds, in the other (XLA skips
    out-of-bounds updates; JAX's gradients of `take` rely on it). XLA scatters into a padded block of a dim
    a mesh axis does not divide (50 as 4 blocks of 13) and cuts the padding off at the end. Exact."""
    if x.op != "scatter" or len(x.args) != 3:
        return None
    dims = x.attr("scatter_dimension_numbers")
    if not isinstance(dims, ScatterDims):
        return None
    operand, idx, upd = x.args
    cut = [d for d in range(x.type.rank) if (lo[d], hi[d]) != (0, x.type.shape[d])]
    if any(lo[d] != 0 or d not in dims.inserted_window_dims or d in dims.input_batching_dims for d in cut):
        return None
    inner = slice_of(terms, operand, lo, hi)
    return terms.apply("scatter", (inner, idx, upd), x.attrs, inner.type)
