"""Reductions over blocks in one normal form, for the blockwise comparison (`blockwise.Normaliser`).

A shard_map body reduces blocks one mesh axis at a time (a psum over ("i", "j") of a tensor split over
both folds one axis, then the other: a reduce of a reshape of a reduce of a reshape), where the reference
reshapes the tensor into its blocks once and reduces several dims; a psum_scatter of two halves is a reduce
of a reshape where the reference adds two slices. All of these reduce a set of *digits* of the root tensor
(its dims cut in mixed radix, row-major). The normal form is

    reshape(reduce(reshape(root, digits), reduced digits), result shape)

with unit digits dropped and neighbouring digits of the same kind (both reduced, or both kept) merged, so
that two terms reducing the same elements of the same root meet as one term. Reduces are fused only with
the same reducer and an init that is its identity (each level then takes it in once more, which changes
nothing); sums of slices only where the slices tile a window of one dim, in equal pieces. Besides:

- a window `[a, b)` of a cumulative reduction (cumsum, cummax: a reduce_window from the dim's first row)
  is the cumulative reduction of `x[a:b]` combined with the reduction of `x[:a]`, broadcast; from the
  last row (a reversed cumsum) with that of `x[b:]`. So a prefix sum computed block by block, each
  block's own cumsum plus the totals of the blocks before it, meets the reference's cumsum;
- a reduction of `select(mask, x, identity)` with a constant mask varying along one reduced dim only is
  the reduction of `x`'s runs the mask keeps (`jnp.where(jnp.arange(n) < i, totals, 0).sum()` for a
  device's index `i` pinned by a case split); a reduction over a concatenation of single rows (scalars
  gathered into a vector) is the combination of the rows;
- rows summed one at a time onto a running total (`x[k] + Σ x[:k]`, a scan's carry) are the sum over the
  rows they tile together (`merge_rows`), however the additions were grouped;
- `select(p, 1, 0)` is `convert(p)` (a bool converted is 1 or 0);
- `sum(convert(b)) > 0` (or `!= 0`) over bools is `any(b)`, when the count cannot overflow.

All are exact (sums over the reals, as everywhere in the blockwise normal form).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import pairwise

import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import Literal, TensorType
from scalify_hlo.ops.reducers import OP_OF_REDUCER, Reducer, is_identity
from scalify_hlo.terms.movement import Chain
from scalify_hlo.terms.pushing import constant_value, push_slice
from scalify_hlo.terms.slicing import slice_of, window_along
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import AttrKey, Term, scalar_value

Make = Callable[[str, tuple[Term, ...], AttrKey, TensorType], Term]


class _Digits:
    """The root's digits (`movement.Chain`: the current value's dims as runs of them) and which of them
    the reduces so far have reduced."""

    def __init__(self, root: Term) -> None:
        self.root = root
        self.chain = Chain.of(root)
        self.reduced: set[int] = set()

    def reshape(self, shape: tuple[int, ...]) -> bool:
        return self.chain.reshape(shape)

    def reduce(self, dims: tuple[int, ...]) -> None:
        for d in dims:
            self.reduced.update(self.chain.dims[d])
        self.chain.dims = [run for d, run in enumerate(self.chain.dims) if d not in dims]

    def build(self, terms: Terms, init: Term, attrs: AttrKey, type: TensorType) -> Term:
        kinds: list[bool | None] = []  # per root dim: reduced whole (True), kept whole (False), cut (None)
        for run in self.chain.root_dims:
            taken = [d in self.reduced for d in run]
            kinds.append(any(taken) if all(taken) or not any(taken) else None)
        if None not in kinds:
            # Whole dims of the root reduced: the plain reduce of the root is the form (a reduce the
            # program wrote without reshapes, which the blockwise merges read as it is, takes no other).
            x = self.root
            reduced_dims = tuple(i for i, k in enumerate(kinds) if k is True)
            kept = tuple(n for n, k in zip(x.type.shape, kinds, strict=True) if k is not True)
        else:
            merged: list[list[int | bool]] = []  # [size, reduced] of neighbouring digits of one kind, root order
            for digit in (d for run in self.chain.root_dims for d in run):
                size, red = self.chain.sizes[digit], digit in self.reduced
                if merged and merged[-1][1] == red:
                    merged[-1][0] = int(merged[-1][0]) * size
                else:
                    merged.append([size, red])
            x = terms.apply("reshape", (self.root,), (), TensorType(tuple(int(s) for s, _ in merged),
                                                                     self.root.type.dtype))
            reduced_dims = tuple(i for i, (_, r) in enumerate(merged) if r)
            kept = tuple(int(s) for s, r in merged if not r)
        keyed = dict(attrs)
        keyed["dimensions"] = reduced_dims
        reduced = terms.mk("reduce", (x, init), tuple(sorted(keyed.items())), TensorType(kept, type.dtype))
        return terms.apply("reshape", (reduced,), (), type)


def _form(t: Term, reducer: str, init: Term) -> _Digits:
    """The digits of `t` (a value some reduces with `reducer` and `init`, and reshapes, made of a root)."""
    if t.op == "reshape":
        inner = _form(t.args[0], reducer, init)
        if inner.reshape(t.type.shape):
            return inner
    elif t.op == "reduce" and len(t.args) == 2 and t.attr("reducer") == reducer and t.args[1] is init:
        inner = _form(t.args[0], reducer, init)
        inner.reduce(tuple(t.attr("dimensions")))
        return inner
    return _Digits(t)


def reduce_rule(terms: Terms, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
    """A single reduce (of reshapes of reduces) in the normal form of the module docstring."""
    a = dict(attrs)
    if len(args) != 2 or set(a) != {"dimensions", "reducer"}:
        return None
    x, init = args
    exact = exact_reducer(a["reducer"], init)  # the reducer, when `init` is its identity
    if exact is not None and is_identity(scalar_value(x), exact, type.dtype):
        return x if x.type == type else terms.splat(float(scalar_value(x) or 0), type)  # the identity, reduced
    if x.op in ("select", "concatenate"):
        return _reduce_pieces(terms, x, init, attrs, type)
    if x.op not in ("reshape", "reduce"):
        return None  # nothing to see through (and the blockwise merges read such reduces as they are)
    reducer = str(a["reducer"])
    known = reducer in Reducer._value2member_map_
    # Reshapes are seen through always; inner reduces only where fusing them is exact.
    fuse = known and is_identity(scalar_value(init), Reducer(reducer), init.type.dtype)
    digits = _form(x, reducer if fuse else "", init)
    digits.reduce(tuple(a["dimensions"]))
    out = digits.build(terms, init, attrs, type)
    return None if out.op == "reduce" and out.args == args and out.attrs == attrs else out


def sink_reshape(terms: Terms, make: Make, op: str, args: tuple[Term, ...], attrs: AttrKey,
                 type: TensorType) -> Term | None:
    """op(reshape(a), x) = reshape(op(a, reshape(x))) for a reshape that merges dims (to fewer dims):
    reshapes outermost, as the reference writes `(x.reshape(blocks) * y).reshape(-1)`. Each step moves
    the op to more dims, so the rewriting ends."""
    moved = [a for a in args if a.op == "reshape" and a.args[0].type.rank > a.type.rank and scalar_value(a) is None]
    if not moved or type.rank == 0:
        return None
    src = moved[0].args[0].type.shape
    if any(m.args[0].type.shape != src for m in moved):
        return None
    inner: list[Term] = []
    for a in args:
        if a in moved:
            inner.append(a.args[0])
        elif a.type.rank == 0:
            inner.append(a)  # a select's scalar predicate, a clamp's scalar bounds
        else:
            inner.append(terms.apply("reshape", (a,), (), TensorType(src, a.type.dtype)))
    body = make(op, tuple(inner), attrs, TensorType(src, type.dtype))
    return make("reshape", (body,), (), type)


def slice_sum(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """`x[.., s:s+m, ..] + x[.., s+m:s+2m, ..]` as the sum over a dim of 2 of `x[.., s:s+2m, ..]` cut in two."""
    if len(args) != 2 or any(a.op != "slice" for a in args) or args[0].args[0] is not args[1].args[0]:
        return None
    x = args[0].args[0]
    lo = [tuple(a.attr("start_indices")) for a in args]
    hi = [tuple(a.attr("limit_indices")) for a in args]
    if any(any(s != 1 for s in (a.attr("strides") or ())) for a in args):
        return None
    differ = [d for d in range(x.type.rank) if lo[0][d] != lo[1][d]]
    if len(differ) != 1 or any(hi[0][d] != hi[1][d] for d in range(x.type.rank) if d not in differ):
        return None
    (d,) = differ
    first, second = sorted(range(2), key=lambda i: lo[i][d])
    m = hi[first][d] - lo[first][d]
    if hi[first][d] != lo[second][d] or hi[second][d] - lo[second][d] != m:
        return None
    start, limit = list(lo[first]), list(hi[first])
    limit[d] = hi[second][d]
    shape = tuple(b - s for s, b in zip(start, limit, strict=True))
    window = terms.apply("slice", (x,), (("limit_indices", tuple(limit)), ("start_indices", tuple(start)),
                                         ("strides", (1,) * x.type.rank)), TensorType(shape, x.type.dtype))
    cut = terms.apply("reshape", (window,), (), TensorType((*shape[:d], 2, m, *shape[d + 1:]), x.type.dtype))
    zero = terms.scalar(0, type.dtype)
    return terms.apply("reduce", (cut, zero), (("dimensions", (d,)), ("reducer", "sum")), type)


def select_bool(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """select(p, 1, 0) = convert(p)."""
    p, on_true, on_false = args
    if p.type.dtype != "i1" or p.type.shape != type.shape or type.dtype == "i1":
        return None
    if scalar_value(on_true) == 1 and scalar_value(on_false) == 0:
        return terms.apply("convert", (p,), (), type)
    return None


def _mask_line(mask: Term, shape: tuple[int, ...]) -> tuple[int, np.ndarray] | None:
    """(d, the mask along d) for a constant mask that varies along one dim `d` only, else None."""
    m = constant_value(mask)
    if m is None:
        return None
    m = np.broadcast_to(np.asarray(m, dtype=bool), shape)
    varying = [d for d in range(m.ndim) if not (m == np.take(m, [0], axis=d)).all()]
    if len(varying) != 1:
        return None
    (d,) = varying
    return d, m[tuple(slice(None) if k == d else 0 for k in range(m.ndim))]


def select_runs(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """select(mask, x, y) with a constant mask that varies along one dim only (the caller checks that `x` or
    `y` reads a concatenation: blocks a permutation delivered, masked as the reference masks a take): the
    concatenation of `x`'s and `y`'s windows over the runs of rows the mask keeps and drops."""
    mask, x, y = args
    if mask.type.shape != type.shape:
        return None
    found = _mask_line(mask, type.shape)
    if found is None:
        return None
    d, line = found
    bounds = [0, *(np.flatnonzero(np.diff(line.astype(np.int8))) + 1).tolist(), len(line)]
    parts = [push_slice(terms, x if line[a] else y, *window_along(type.shape, d, a, b)) for a, b in pairwise(bounds)]
    return terms.apply("concatenate", tuple(parts), (("dimension", d),), type)


def count_positive(terms: Terms, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
    """sum(convert(b)) > 0 (or != 0) over bools `b` = any(b) (or-reduce), when the count fits the type."""
    a = dict(attrs)
    direction = a.get("comparison_direction")
    s, zero = args
    if direction not in ("GT", "NE") or scalar_value(zero) != 0 or s.op != "reduce" or s.attr("reducer") != "sum":
        return None
    c, init = s.args
    if c.op != "convert" or c.args[0].type.dtype != "i1" or scalar_value(init) != 0:
        return None
    try:
        nd = numpy_dtype(c.type.dtype)
    except ValueError:
        return None
    count = math.prod(c.type.shape[d] for d in s.attr("dimensions"))
    if nd.kind == "f":
        exact = count < 2 ** (np.finfo(nd).nmant + 1)
    elif nd.kind in "iu":
        exact = count <= np.iinfo(nd).max
    else:
        exact = False
    if not exact:
        return None
    false = terms.scalar(0, "i1")
    return terms.apply("reduce", (c.args[0], false), (("dimensions", tuple(s.attr("dimensions"))), ("reducer", "or")),
                       type)


def _combine(terms: Terms, reducer: Reducer, parts: list[Term], type: TensorType) -> Term:
    out = parts[0]
    for p in parts[1:]:
        out = terms.apply(OP_OF_REDUCER[reducer], (out, p), (), type)
    return out


def exact_reducer(name: object, init: Term) -> Reducer | None:
    """The reducer named `name` when `init` is its identity (where a split reduction is exact)."""
    if name not in Reducer._value2member_map_:
        return None
    r = Reducer(name)
    return r if r is not Reducer.PROD and is_identity(scalar_value(init), r, init.type.dtype) else None


def _reduce_pieces(terms: Terms, x: Term, init: Term, attrs: AttrKey, type: TensorType) -> Term | None:
    """The reduction of a masked select or of a concatenation of rows, as the module docstring says."""
    a = dict(attrs)
    reducer, dims = exact_reducer(a["reducer"], init), tuple(a["dimensions"])
    if reducer is None:
        return None
    if x.op == "concatenate":
        d = int(x.attr("dimension"))
        # Rows only: a concatenation of longer blocks is what merging reductions builds (blockwise).
        if d not in dims or any(p.type.shape[d] != 1 or p.op not in ("reshape", "broadcast_in_dim") for p in x.args):
            return None
        return _combine(terms, reducer, [terms.apply("reduce", (p, init), attrs, type) for p in x.args], type)
    mask, kept, dropped = x.args
    if not is_identity(scalar_value(dropped), reducer, type.dtype) or mask.type.shape != x.type.shape:
        return None
    found = _mask_line(mask, x.type.shape)
    if found is None or found[0] not in dims:
        return None
    d, line = found
    edges = np.flatnonzero(np.diff(np.concatenate([[0], line.astype(np.int8), [0]])))
    runs = list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
    if not runs:
        return terms.splat(float(scalar_value(init) or 0), type)  # the identity (checked above)
    parts = [terms.apply("reduce", (push_slice(terms, kept, *window_along(kept.type.shape, d, s, e)), init), attrs, type)
             for s, e in runs]
    return _combine(terms, reducer, parts, type)


def cumulative_slice(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """`x[lo:hi]` for `x` a cumulative reduction along one dim (module docstring), or None."""
    if x.op != "reduce_window" or len(x.args) != 2:
        return None
    y, init = x.args
    reducer = exact_reducer(x.attr("computation"), init)
    pad = x.attr("padding")
    if reducer is None or not isinstance(pad, Literal):
        return None
    rank = y.type.rank
    window = tuple(int(w) for w in x.attr("window_dimensions"))
    pads = np.asarray(pad.array).reshape(rank, 2)
    for name in ("window_strides", "base_dilations", "window_dilations"):
        v = x.attr(name)
        if v is not None and any(int(s) != 1 for s in v):
            return None
    spans = [k for k in range(rank) if window[k] != 1 or pads[k].any()]
    if len(spans) != 1:
        return None
    (d,) = spans
    n, w = y.type.shape[d], window[d]
    prefix = (int(pads[d][0]), int(pads[d][1])) == (w - 1, 0)
    if w < n or not (prefix or (int(pads[d][0]), int(pads[d][1])) == (0, w - 1)):
        return None
    a, b = lo[d], hi[d]
    if (a, b) == (0, n) and w == n:
        return None  # the whole reduction, already with the shortest window
    cut = np.zeros((rank, 2), dtype=np.int64)
    cut[d] = (b - a - 1, 0) if prefix else (0, b - a - 1)
    attrs = tuple((k, Literal(cut.reshape(pad.array.shape), pad.dtype) if k == "padding" else
                   (tuple(b - a if j == d else 1 for j in range(rank)) if k == "window_dimensions" else v))
                  for k, v in x.attrs)
    part = slice_of(terms, y, lo, hi)
    own = terms.apply("reduce_window", (part, init), attrs, part.type)
    rest = (0, a) if prefix else (b, n)
    if rest[0] == rest[1]:
        return own
    before = slice_of(terms, y, tuple(rest[0] if k == d else v for k, v in enumerate(lo)),
                      tuple(rest[1] if k == d else v for k, v in enumerate(hi)))
    kept = tuple(k for k in range(rank) if k != d)
    total = terms.apply("reduce", (before, init), (("dimensions", (d,)), ("reducer", reducer.value)),
                        TensorType(tuple(part.type.shape[k] for k in kept), part.type.dtype))
    spread = terms.apply("broadcast_in_dim", (total,), (("broadcast_dimensions", kept),), part.type)
    return terms.apply(OP_OF_REDUCER[reducer], (own, spread), (), part.type)


def unit_window(args: tuple[Term, ...], attrs: AttrKey) -> Term | None:
    """A reduce_window whose windows are single elements (no padding, stride or dilation) of one operand,
    from the reducer's identity, as that operand (the cumulative reduction of one row, above)."""
    if len(args) != 2:
        return None
    x, init = args
    a = dict(attrs)
    if exact_reducer(a.get("computation"), init) is None:
        return None
    pad = a.get("padding")
    if isinstance(pad, Literal) and np.asarray(pad.array).any():
        return None
    for name in ("window_dimensions", "window_strides", "base_dilations", "window_dilations"):
        v = a.get(name)
        if v is not None and any(int(s) != 1 for s in v):
            return None
    return x


_Rows = tuple[Term, int, tuple[tuple[int, int], ...], tuple[int, ...]]  # (x, d, the other dims' windows, rows)


def _row_sum(t: Term) -> _Rows | None:
    """`t` as the sum over one dim `d` of some rows of a tensor, keeping `d` as a unit dim: a slice one
    row thick, the reshape of a sum over `d` of a window that puts the unit dim back, or a sum of every
    s-th row (a column of `x` reshaped into rows of s, summed: `_strided`)."""
    if t.op == "slice" and all(s == 1 for s in t.attr("strides") or ()):
        x, lo, hi = t.args[0], t.attr("start_indices"), t.attr("limit_indices")
        ds = [d for d in range(t.type.rank) if t.type.shape[d] == 1 and x.type.shape[d] > 1]
        if len(ds) != 1:
            return None
        (d,) = ds
        return x, d, tuple((lo[k], hi[k]) for k in range(x.type.rank) if k != d), (lo[d],)
    r = t.args[0] if t.op == "reshape" else t
    if r.op != "reduce" or r.attr("reducer") != "sum" or scalar_value(r.args[1]) != 0:
        return None
    w, dims = r.args[0], tuple(r.attr("dimensions"))
    if len(dims) != 1:
        return None
    (d,) = dims
    if r is not t and t.type.shape != tuple(1 if k == d else n for k, n in enumerate(w.type.shape)):
        return None  # a reshape that does more than put the summed dim back as a unit dim
    pieces = list(w.args) if w.op == "concatenate" and w.attr("dimension") == d else [w]
    found = [_rows_of(p, d) for p in pieces]
    if any(f is None for f in found) or len({(f[0].id, f[1]) for f in found if f is not None}) != 1:
        return None
    x, rest, _ = found[0]  # type: ignore[misc]
    return x, d, rest, tuple(p for f in found if f is not None for p in f[2])


def _rows_of(w: Term, d: int) -> tuple[Term, tuple[tuple[int, int], ...], tuple[int, ...]] | None:
    """The rows along `d` a slice reads: of `x` itself, or of `x` reshaped into rows of s along `d`, one
    column wide (every s-th row of `x`)."""
    if w.op != "slice" or any(s != 1 for s in w.attr("strides") or ()):
        return None
    g, lo, hi = w.args[0], w.attr("start_indices"), w.attr("limit_indices")
    shape = g.type.shape
    if g.op == "reshape" and d + 1 < g.type.rank and hi[d + 1] - lo[d + 1] == 1 and \
            g.args[0].type.shape == (*shape[:d], shape[d] * shape[d + 1], *shape[d + 2:]):
        step = shape[d + 1]
        rest = tuple((lo[k], hi[k]) for k in range(g.type.rank) if k not in (d, d + 1))
        return g.args[0], rest, tuple(q * step + lo[d + 1] for q in range(lo[d], hi[d]))
    return g, tuple((lo[k], hi[k]) for k in range(g.type.rank) if k != d), tuple(range(lo[d], hi[d]))


def merge_rows(terms: Terms, atoms: list[Term]) -> list[Term] | None:
    """Summands that are sums over one dim of rows of one tensor, merged into one sum where together they
    are a range of rows or every s-th row of one; None if no two summands merge."""
    groups: dict[tuple[int, int, tuple[tuple[int, int], ...], TensorType], list[tuple[tuple[int, ...], Term]]] = {}
    tensors: dict[int, Term] = {}
    for a in atoms:
        if (rows := _row_sum(a)) is not None:
            x, d, rest, at = rows
            tensors[x.id] = x
            groups.setdefault((x.id, d, rest, a.type), []).append((at, a))
    out = list(atoms)
    changed = False
    for (xid, d, rest, type), members in groups.items():
        x = tensors[xid]
        members.sort(key=lambda m: m[0])
        every = sorted(p for at, _ in members for p in at)
        if len(members) < 2 or len(set(every)) != len(every):
            continue  # a row twice is not a sum over rows
        step = every[1] - every[0]
        if any(b - a != step for a, b in pairwise(every)):
            continue
        lo = tuple([*(a for a, _ in rest[:d]), every[0], *(a for a, _ in rest[d:])])
        hi = tuple([*(b for _, b in rest[:d]), every[-1] + 1, *(b for _, b in rest[d:])])
        merged = _strided(terms, x, d, lo, hi, step, type)
        if merged is None:
            continue
        for _, atom in members:
            out.remove(atom)
        out.append(merged)
        changed = True
    return out if changed else None


def _strided(terms: Terms, x: Term, d: int, lo: tuple[int, ...], hi: tuple[int, ...], step: int,
             type: TensorType) -> Term | None:
    """The sum over `d` of rows `lo[d], lo[d] + step, .., hi[d] - 1` of `x[lo:hi]` (the other dims'
    window), shaped `type`: the plain sum of the window for step 1; else the sum over the row dim of `x`
    reshaped into rows of `step` (`x.reshape(-1, step)[q:q+m, r].sum(0)`), when `step` divides the dim."""
    zero = terms.scalar(0, x.type.dtype)
    keep = "dimensions", (d,)
    if step == 1:
        window = slice_of(terms, x, lo, hi)
        total = terms.mk("reduce", (window, zero), (keep, ("reducer", "sum")),
                         TensorType(tuple(n for k, n in enumerate(window.type.shape) if k != d), x.type.dtype))
        return terms.apply("reshape", (total,), (), type)
    n = x.type.shape[d]
    if n % step:
        return None
    grid = terms.apply("reshape", (x,), (), TensorType((*x.type.shape[:d], n // step, step, *x.type.shape[d + 1:]),
                                                       x.type.dtype))
    q, r = divmod(lo[d], step)
    column = slice_of(terms, grid, (*lo[:d], q, r, *lo[d + 1:]), (*hi[:d], (hi[d] - 1) // step + 1, r + 1, *hi[d + 1:]))
    total = terms.mk("reduce", (column, zero), (keep, ("reducer", "sum")),
                     TensorType(tuple(k for j, k in enumerate(column.type.shape) if j != d), x.type.dtype))
    return terms.apply("reshape", (total,), (), type)
