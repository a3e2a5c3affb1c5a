"""Blocks of a value, moved inward: `x[lo:hi]` rewritten so that the slice reaches the operands.

The slice normal form (`slicing.py`) moves slices outward, so that work done block by block meets work
done at once. Comparing a program that only ever computes blocks (a ring's key blocks, a device's own
token group) with the reference asks the opposite: which block of each reference value does the block
of the output need. `push_slice` (a window) and `push_take` (one index of a dim, the dim dropped) move
the cut through the ops for which the cut dims are batch dims, rebuilding each op with `Terms.apply`
(which pulls slices back out where that is the normal form), and fold it into constants. Exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import DotDims, Literal, TensorType
from scalify_hlo.ops.elementwise import SHAPE_PRESERVING
from scalify_hlo.terms.evaluate import evaluate_constant
from scalify_hlo.terms.slicing import slice_along, slice_of, window_along
from scalify_hlo.terms.table import LEAVES, Terms
from scalify_hlo.terms.term import Term

# What a cut of a term became (None: being computed).
Memo = dict[tuple[Any, ...], Any]
FOLD_LIMIT = 1 << 16  # elements: constant-only terms up to this size are folded to their values


def push_slice(terms: Terms, t: Term, lo: tuple[int, ...], hi: tuple[int, ...], memo: Memo | None = None) -> Term:
    """`t[lo:hi]`, with the slice moved into `t` through ops for which the sliced dims are batch dims
    (elementwise ops, broadcasts, transposes, the kept dims of reductions, the free and batch dims of
    dot_general) and folded into constants. Exact."""
    memo = {} if memo is None else memo
    key = ("slice", t.id, lo, hi)
    if key in memo:
        done = memo[key]
        return done if done is not None else slice_of(terms, t, lo, hi)  # met again while pushing it: stop
    memo[key] = None
    out = memo[key] = _push(terms, t, lo, hi, memo)
    return out


def _push(terms: Terms, t: Term, lo: tuple[int, ...], hi: tuple[int, ...],
          memo: Memo) -> Term:
    shape = t.type.shape
    if lo == (0,) * len(shape) and hi == shape:
        return t
    out_type = TensorType(tuple(b - a for a, b in zip(lo, hi, strict=True)), t.type.dtype)
    if (value := _small_constant(terms, t)) is not None:
        return folded(terms, value[tuple(map(slice, lo, hi))], out_type)
    op = t.op
    if op == "slice" and all(s == 1 for s in (t.attr("strides") or ())):
        base = tuple(t.attr("start_indices"))
        return push_slice(terms, t.args[0], tuple(b + a for b, a in zip(base, lo, strict=True)),
                          tuple(b + a for b, a in zip(base, hi, strict=True)), memo)
    if op == "broadcast_in_dim":
        (x,) = t.args
        dims = tuple(t.attr("broadcast_dimensions"))
        where = {j: d for j, d in enumerate(dims) if x.type.shape[j] == t.type.shape[d]}  # stretched unit dims: whole
        return terms.apply(op, (push_slice(terms, x, *_operand_window(x, where, lo, hi), memo),), t.attrs, out_type)
    if op == "transpose":
        x = t.args[0]
        where = {p: i for i, p in enumerate(t.attr("permutation"))}
        return terms.apply(op, (push_slice(terms, x, *_operand_window(x, where, lo, hi), memo),), t.attrs, out_type)
    if op in SHAPE_PRESERVING and all(a.type.shape == shape for a in t.args):
        args = tuple(push_slice(terms, a, lo, hi, memo) for a in t.args)
        return terms.apply(op, args, t.attrs, out_type)
    if op == "reduce" and len(t.args) == 2:
        x, init = t.args
        reduced = set(t.attr("dimensions"))
        where = {j: i for i, j in enumerate(j for j in range(x.type.rank) if j not in reduced)}
        inner = push_slice(terms, x, *_operand_window(x, where, lo, hi), memo)
        return terms.apply(op, (inner, init), t.attrs, out_type)
    dims = t.attr("dot_dimension_numbers")
    if op == "dot_general" and isinstance(dims, DotDims):
        # the result is [batch, lhs free, rhs free]
        sides = []
        first = len(dims.lhs_batch)
        for x, batch, contract in ((t.args[0], dims.lhs_batch, dims.lhs_contract),
                                   (t.args[1], dims.rhs_batch, dims.rhs_contract)):
            free = [j for j in range(x.type.rank) if j not in (*batch, *contract)]
            where = {j: i for i, j in enumerate(batch)} | {j: first + i for i, j in enumerate(free)}
            sides.append(push_slice(terms, x, *_operand_window(x, where, lo, hi), memo))
            first += len(free)
        return terms.apply(op, (sides[0], sides[1]), t.attrs, out_type)
    if op == "reshape":
        moved = _slice_reshape(terms, t, lo, hi, out_type, memo)
        if moved is not None:
            return moved
    if op == "concatenate":
        return _slice_concat(terms, t, lo, hi, out_type, memo)
    return slice_of(terms, t, lo, hi)


def _slice_concat(terms: Terms, t: Term, lo: tuple[int, ...], hi: tuple[int, ...], out_type: TensorType,
                  memo: Memo) -> Term:
    """A window of a concatenation: the windows of the pieces it overlaps, concatenated."""
    d = int(t.attr("dimension"))
    parts: list[Term] = []
    start = 0
    for p in t.args:
        end = start + p.type.shape[d]
        a, b = max(lo[d], start), min(hi[d], end)
        if a < b:
            plo = tuple(a - start if k == d else x for k, x in enumerate(lo))
            phi = tuple(b - start if k == d else x for k, x in enumerate(hi))
            parts.append(push_slice(terms, p, plo, phi, memo))
        start = end
    if len(parts) == 1:
        return parts[0]
    return terms.apply("concatenate", tuple(parts), t.attrs, out_type)


def _slice_reshape(terms: Terms, t: Term, lo: tuple[int, ...], hi: tuple[int, ...], out_type: TensorType,
                   memo: Memo) -> Term | None:
    """A window on one out dim of a reshape as a cut of the operand: `x[64, d] -> [8, 8, d]` rows of one
    group, or `x[8, 8, d] -> [64, d]` rows `[8g, 8g + 8)` = group `g`."""
    cut = [k for k in range(len(lo)) if (lo[k], hi[k]) != (0, t.type.shape[k])]
    if len(cut) != 1:
        return None
    (k,) = cut
    (x,) = t.args
    xs, ys = x.type.shape, t.type.shape
    tail = int(np.prod(ys[k:], dtype=np.int64))
    inner = int(np.prod(ys[k + 1:], dtype=np.int64))
    a, b = lo[k] * inner, hi[k] * inner  # the window as a range of the flattened tail
    p = next((p for p in range(len(xs)) if int(np.prod(xs[p:], dtype=np.int64)) == tail), None)
    if p is None:
        return None
    # walk the operand dims of the tail: fix digits while the range sits inside one index of a dim
    taken = x
    dim = p
    for j in range(p, len(xs)):
        below = int(np.prod(xs[j + 1:], dtype=np.int64))
        first, last = a // below, (b - 1) // below
        if first == last and (b - a) <= below:
            taken = push_take(terms, taken, dim, first % xs[j], memo)
            a, b = a - first * below, b - first * below
            continue
        if a % below or b % below:
            return None
        taken = push_slice(terms, taken, *window_along(taken.type.shape, dim, a // below, b // below), memo)
        break
    return terms.apply("reshape", (taken,), (), out_type)


def _operand_window(x: Term, where: dict[int, int], lo: tuple[int, ...], hi: tuple[int, ...]
                    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The window of operand `x` that a result window needs: operand dim `j` cut like result dim
    `where[j]`, the others whole."""
    xlo = tuple(lo[where[j]] if j in where else 0 for j in range(x.type.rank))
    xhi = tuple(hi[where[j]] if j in where else n for j, n in enumerate(x.type.shape))
    return xlo, xhi


def folded(terms: Terms, value: np.ndarray, type: TensorType) -> Term:
    """The constant term of `value`, held in the element type's canonical NumPy dtype (so that equal
    constants folded along different paths are one term)."""
    try:
        holder = np.dtype("float32") if type.dtype == "bf16" else numpy_dtype(type.dtype)
    except ValueError:
        holder = np.asarray(value).dtype
    array = np.ascontiguousarray(np.broadcast_to(np.asarray(value, dtype=holder), type.shape))
    return terms.constant(Literal(array, type.dtype), type)


def _small_constant(terms: Terms, t: Term) -> np.ndarray | None:
    """`constant_value` of a small term (which terms read a leaf is remembered by the table: a push visits
    every node, and walking each one's subterms again would be quadratic)."""
    if t.type.size > FOLD_LIMIT or not terms.leafless(t):
        return None
    return evaluate_constant(t)


def constant_value(t: Term) -> np.ndarray | None:
    """The value of a term built from constants and iotas only (None if it reads anything else)."""
    if any(s.op in LEAVES for s in t.walk()):
        return None
    return evaluate_constant(t)




def push_take(terms: Terms, t: Term, dim: int, index: int, memo: Memo | None = None) -> Term:
    """`t` at `index` along `dim`, that dim dropped (one group of a vmapped computation), with the cut
    moved into `t` like `push_slice`'s. Exact."""
    memo = {} if memo is None else memo
    key = ("take", t.id, dim, index)
    if key in memo:
        done = memo[key]
        return done if done is not None else _take_whole(terms, t, dim, index)  # met again: stop
    memo[key] = None
    out = memo[key] = _take(terms, t, dim, index, memo)
    return out


def _take_whole(terms: Terms, t: Term, dim: int, index: int) -> Term:
    """The take as a slice and a reshape of `t` itself (not moved inward)."""
    shape = t.type.shape
    out_type = TensorType(shape[:dim] + shape[dim + 1:], t.type.dtype)
    return terms.apply("reshape", (slice_along(terms, t, dim, index, index + 1),), (), out_type)


def _drop(dims: tuple[int, ...], k: int) -> tuple[int, ...]:
    """Dim numbers after dim `k` is removed (`k` itself left out); unchanged for `k` < 0 (none removed)."""
    return dims if k < 0 else tuple(d - (d > k) for d in dims if d != k)


def _take(terms: Terms, t: Term, dim: int, index: int, memo: Memo) -> Term:
    shape = t.type.shape
    out_type = TensorType(shape[:dim] + shape[dim + 1:], t.type.dtype)
    if (value := _small_constant(terms, t)) is not None:
        return folded(terms, np.take(value, index, axis=dim), out_type)
    op = t.op
    if op == "slice" and all(s == 1 for s in (t.attr("strides") or ())):
        lo, hi = tuple(t.attr("start_indices")), tuple(t.attr("limit_indices"))
        inner = push_take(terms, t.args[0], dim, lo[dim] + index, memo)
        return push_slice(terms, inner, lo[:dim] + lo[dim + 1:], hi[:dim] + hi[dim + 1:], memo)
    if op == "broadcast_in_dim":
        (x,) = t.args
        dims = tuple(t.attr("broadcast_dimensions"))
        if dim in dims:
            j = dims.index(dim)
            x = push_take(terms, x, j, 0 if x.type.shape[j] == 1 else index, memo)
        return terms.apply(op, (x,), (("broadcast_dimensions", _drop(dims, dim)),), out_type)
    if op == "transpose":
        perm = tuple(t.attr("permutation"))
        inner = push_take(terms, t.args[0], perm[dim], index, memo)
        return terms.apply(op, (inner,), (("permutation", _drop(perm, perm[dim])),), out_type)
    if op in SHAPE_PRESERVING and all(a.type.shape == shape for a in t.args):
        return terms.apply(op, tuple(push_take(terms, a, dim, index, memo) for a in t.args), t.attrs, out_type)
    if op == "reduce" and len(t.args) % 2 == 0:
        k = len(t.args) // 2
        reduced = tuple(t.attr("dimensions"))
        x_dim = [j for j in range(t.args[0].type.rank) if j not in reduced][dim]
        operands = tuple(push_take(terms, x, x_dim, index, memo) for x in t.args[:k])
        attrs = tuple((n, _drop(reduced, x_dim) if n == "dimensions" else v) for n, v in t.attrs)
        return terms.apply(op, (*operands, *t.args[k:]), attrs, out_type)
    if op == "reduce_window" and _window_is_one(t, dim):
        k = len(t.args) // 2
        operands = tuple(push_take(terms, x, dim, index, memo) for x in t.args[:k])
        return terms.apply(op, (*operands, *t.args[k:]), _drop_window_attrs(t, dim), out_type)
    dims = t.attr("dot_dimension_numbers")
    if op == "dot_general" and isinstance(dims, DotDims):
        return _take_dot(terms, t, dims, dim, index, out_type, memo)
    if op == "reshape":
        taken = _take_reshape(terms, t, dim, index, out_type, memo)
        if taken is not None:
            return taken
    if op == "concatenate":
        d = int(t.attr("dimension"))
        if d == dim:
            start = 0
            for p in t.args:
                if start <= index < start + p.type.shape[d]:
                    return push_take(terms, p, dim, index - start, memo)
                start += p.type.shape[d]
        else:
            pieces = tuple(push_take(terms, p, dim, index, memo) for p in t.args)
            return terms.apply(op, pieces, (("dimension", d - (d > dim)),), out_type)
    return _take_whole(terms, t, dim, index)


def _take_dot(terms: Terms, t: Term, dims: DotDims, dim: int, index: int, out_type: TensorType,
              memo: Memo) -> Term:
    x, y = t.args
    nb = len(dims.lhs_batch)
    lfree = [j for j in range(x.type.rank) if j not in (*dims.lhs_batch, *dims.lhs_contract)]
    rfree = [j for j in range(y.type.rank) if j not in (*dims.rhs_batch, *dims.rhs_contract)]
    if dim < nb:
        lx, ry = dims.lhs_batch[dim], dims.rhs_batch[dim]
    elif dim < nb + len(lfree):
        lx, ry = lfree[dim - nb], -1
    else:
        lx, ry = -1, rfree[dim - nb - len(lfree)]
    if lx >= 0:
        x = push_take(terms, x, lx, index, memo)
    if ry >= 0:
        y = push_take(terms, y, ry, index, memo)
    new = DotDims(_drop(dims.lhs_batch, lx), _drop(dims.rhs_batch, ry),
                  _drop(dims.lhs_contract, lx), _drop(dims.rhs_contract, ry))
    attrs = tuple((n, new if n == "dot_dimension_numbers" else v) for n, v in t.attrs)
    return terms.apply("dot_general", (x, y), attrs, out_type)


def _window_is_one(t: Term, dim: int) -> bool:
    """A reduce_window whose window neither spans nor strides nor pads `dim` (a batch dim of it)."""
    for name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
        v = t.attr(name)
        if v is not None and int(tuple(v)[dim]) != 1:
            return False
    pad = t.attr("padding")
    if pad is None:
        return True
    rows = np.asarray(pad.array if isinstance(pad, Literal) else pad).reshape(t.type.rank, 2)
    return not rows[dim].any()


def _drop_window_attrs(t: Term, dim: int) -> tuple[tuple[str, object], ...]:
    out: list[tuple[str, object]] = []
    for name, v in t.attrs:
        if name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations") and v is not None:
            v = tuple(x for k, x in enumerate(tuple(v)) if k != dim)
        elif name == "padding" and v is not None:
            rows = np.asarray(v.array if isinstance(v, Literal) else v).reshape(t.type.rank, 2)
            kept = np.ascontiguousarray(np.delete(rows, dim, axis=0))
            v = Literal(kept, v.dtype) if isinstance(v, Literal) else tuple(map(tuple, kept.tolist()))
        out.append((name, v))
    return tuple(out)


def _take_reshape(terms: Terms, t: Term, dim: int, index: int, out_type: TensorType,
                  memo: Memo) -> Term | None:
    """Through a reshape (row-major): the out dim is a range of one operand dim, or a run of operand dims
    fixed to the digits of `index`."""
    (x,) = t.args
    xs, ys = x.type.shape, t.type.shape
    inner = int(np.prod(ys[dim + 1:], dtype=np.int64))
    tail = int(np.prod(ys[dim:], dtype=np.int64))
    for p in range(len(xs) + 1):
        if int(np.prod(xs[p:], dtype=np.int64)) == inner:
            # operand dims [q, p) make exactly out dim `dim`: take each at its digit of `index`
            q = next((q for q in range(p, -1, -1) if int(np.prod(xs[q:], dtype=np.int64)) == tail), None)
            if q is None:
                break
            taken = x
            digits = np.unravel_index(index, xs[q:p]) if p > q else ()
            for digit in digits:
                taken = push_take(terms, taken, q, int(digit), memo)
            return terms.apply("reshape", (taken,), (), out_type)
    for p in range(len(xs)):
        if int(np.prod(xs[p:], dtype=np.int64)) == tail:
            below = int(np.prod(xs[p + 1:], dtype=np.int64))
            if inner % below:
                return None
            rows = inner // below
            window = window_along(xs, p, index * rows, (index + 1) * rows)
            return terms.apply("reshape", (push_slice(terms, x, *window, memo),), (), out_type)
    return None


def squeeze_units(terms: Terms, t: Term) -> Term | None:
    """A reshape that only drops (or moves) unit dims, as `push_take` of each: the same value computed
    without them. None for any other reshape."""
    (x,) = t.args
    kept = [n for n in x.type.shape if n != 1]
    if kept != [n for n in t.type.shape if n != 1] or t.type.rank >= x.type.rank:
        return None
    taken = x
    while True:
        unit = next((k for k, n in enumerate(taken.type.shape) if n == 1), None)
        if unit is None:
            break
        taken = push_take(terms, taken, unit, 0)
    return terms.apply("reshape", (taken,), (), t.type)
