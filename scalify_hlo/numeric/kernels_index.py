"""Kernels that index, reduce or reorder: dynamic slices, gather, scatter, reduce, reduce_window,
select_and_scatter, sort, top_k, map, and the padding helper they share.

Per-device values (start indices, gather indices) differ across the device axis, so these kernels treat
the device axis as one more batch dimension: gather and scatter add it to the operand/indices batching
dims of the StableHLO semantics and then run one generic vectorised implementation. Ops with a body
(reducers, comparators, update computations) evaluate it over whole arrays of scalars at once
(`Machine.scalar_region`); a body that is a single add/max/min/mul/and/or/xor takes a NumPy fast path.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from scalify_hlo.ir.dtypes import widen
from scalify_hlo.ir.nodes import GatherDims, Literal, Op, Region, ScatterDims
from scalify_hlo.numeric.values import Val, as_array, dtype_of

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine

UFUNCS: dict[str, np.ufunc] = {
    "add": np.add, "and": np.bitwise_and, "maximum": np.maximum, "minimum": np.minimum,
    "multiply": np.multiply, "or": np.bitwise_or, "xor": np.bitwise_xor,
}


def int_attr(op: Op, name: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
    if name not in op.attrs and default is not None:
        return tuple(default)
    v = op.attrs[name]
    if isinstance(v, Literal):
        return tuple(int(x) for x in v.array.reshape(-1))
    return tuple(int(x) for x in v)  # type: ignore[union-attr]


def binop_of(region: Region) -> str | None:
    """The opcode when `region` is exactly `return op(arg0, arg1)` for a NumPy-reducible op."""
    if len(region.ops) != 1 or len(region.args) != 2 or len(region.results) != 1:
        return None
    op = region.ops[0]
    if op.opcode in UFUNCS and set(op.operands) == set(region.args) and region.results[0] is op.results[0]:
        return op.opcode
    return None


def _is_replace(region: Region, n: int) -> bool:
    """`return update` (`x.at[i].set(u)`): the region ignores the current values."""
    return not region.ops and tuple(region.results) == tuple(region.args[n:])


def pad_with(x: np.ndarray, value: np.ndarray, lo: Sequence[int], hi: Sequence[int],
             interior: Sequence[int]) -> np.ndarray:
    """StableHLO `pad` of `[D, *s]` by a per-device scalar `[D]`; negative edges crop."""
    if not any(lo) and not any(hi) and not any(interior):
        return x
    d = x.shape[0]
    v = np.asarray(value).astype(x.dtype).reshape(d, *[1] * (x.ndim - 1))
    if any(interior):
        shape = [d] + [n + max(n - 1, 0) * i for n, i in zip(x.shape[1:], interior, strict=True)]
        spread = np.array(np.broadcast_to(v, shape))
        spread[(slice(None), *(slice(None, None, i + 1) for i in interior))] = x
        x = spread
    sizes = x.shape[1:]
    out = np.array(np.broadcast_to(v, [d] + [max(0, a + n + b) for a, n, b in zip(lo, sizes, hi, strict=True)]))
    src = [slice(max(0, -a), max(max(0, -a), n - max(0, -b))) for a, n, b in zip(lo, sizes, hi, strict=True)]
    dst = [slice(max(0, a), max(0, a) + (s.stop - s.start)) for a, s in zip(lo, src, strict=True)]
    out[(slice(None), *dst)] = x[(slice(None), *src)]
    return out


# --------------------------------------------------------------------------------------- dynamic slices

def _starts(args: list[Val], limits: Sequence[int]) -> list[np.ndarray]:
    """Per-device start indices clamped into range, as XLA does."""
    return [np.clip(as_array(a).astype(np.int64).reshape(-1), 0, max(lim, 0)) for a, lim in zip(args, limits, strict=True)]


def _window_index(starts: list[np.ndarray], sizes: Sequence[int]) -> tuple[Any, ...]:
    """A fancy index selecting window `[start, start+size)` on every device (starts may differ)."""
    d = starts[0].shape[0] if starts else 1
    rank = len(sizes)
    index: list[np.ndarray] = [np.arange(d).reshape(d, *[1] * rank)]
    for k, (s, size) in enumerate(zip(starts, sizes, strict=True)):
        index.append((s[:, None] + np.arange(size)).reshape(d, *[size if j == k else 1 for j in range(rank)]))
    return tuple(index)


def _uniform(starts: list[np.ndarray]) -> bool:
    return all((s == s[0]).all() for s in starts if s.size)


def dynamic_slice(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    sizes = int_attr(op, "slice_sizes")
    starts = _starts(args[1:], [n - s for n, s in zip(x.shape[1:], sizes, strict=True)])
    if _uniform(starts):
        return [x[(slice(None), *(slice(int(s[0]), int(s[0]) + n) for s, n in zip(starts, sizes, strict=True)))]]
    return [x[_window_index(starts, sizes)]]


def dynamic_update_slice(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x, update = as_array(args[0]), as_array(args[1])
    sizes = update.shape[1:]
    starts = _starts(args[2:], [n - s for n, s in zip(x.shape[1:], sizes, strict=True)])
    out = np.array(x, copy=True)
    if _uniform(starts):
        out[(slice(None), *(slice(int(s[0]), int(s[0]) + n) for s, n in zip(starts, sizes, strict=True)))] = update
    else:
        out[_window_index(starts, sizes)] = update
    return [out]


# ----------------------------------------------------------------------------------------- gather/scatter

def _place(a: np.ndarray, positions: Sequence[int], rank: int) -> np.ndarray:
    """`a` (one dim per entry of `positions`) reshaped to broadcast at those dims of a rank-`rank` array."""
    shape = [1] * rank
    for k, p in enumerate(positions):
        shape[p] = a.shape[k]
    return a.reshape(shape)


def _batch_starts(s: np.ndarray, j: int, index_map: Sequence[int], operand_batching: Sequence[int],
                  indices_batching: Sequence[int], ivd: int) -> np.ndarray:
    """Start of operand dim `j` per batch position (`s` is `[*B, K]`, the index vector last)."""
    b = s.shape[:-1]
    if j in index_map:
        return s[..., index_map.index(j)]
    if j in operand_batching:
        p = indices_batching[operand_batching.index(j)]
        p = p if p < ivd else p - 1
        return np.arange(b[p]).reshape([b[p] if k == p else 1 for k in range(len(b))])
    return np.zeros((1,) * len(b), dtype=np.int64)


def _indices(x: np.ndarray, ivd: int) -> np.ndarray:
    s = x.astype(np.int64)
    if ivd == s.ndim:
        s = s[..., None]
    return np.moveaxis(s, ivd, -1)


def gather(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    g = op.attrs["dimension_numbers"]
    assert isinstance(g, GatherDims)
    sizes = (1, *int_attr(op, "slice_sizes"))
    # The device axis is one more batching dim of both the operand and the indices.
    ivd = g.index_vector_dim + 1
    s = _indices(as_array(args[1]), ivd)
    offset = [d + 1 for d in g.offset_dims]
    collapsed = [d + 1 for d in g.collapsed_slice_dims]
    ob, ib = [0, *(d + 1 for d in g.operand_batching_dims)], [0, *(d + 1 for d in g.start_indices_batching_dims)]
    index_map = [d + 1 for d in g.start_index_map]
    window = [j for j in range(x.ndim) if j not in collapsed and j not in ob]
    rank = s.ndim - 1 + len(offset)
    batch_pos = [d for d in range(rank) if d not in offset]
    index = []
    for j in range(x.ndim):
        start = _batch_starts(s, j, index_map, ob, ib, ivd)
        if j in index_map:
            start = np.clip(start, 0, x.shape[j] - sizes[j])
        full = _place(start, batch_pos, rank)
        if j in window:
            w = offset[window.index(j)]
            full = full + _place(np.arange(sizes[j]), [w], rank)
        index.append(full)
    return [x[tuple(index)]]


def combine(m: Machine, region: Region, targets: list[np.ndarray], idx: np.ndarray,
            updates: list[np.ndarray]) -> None:
    """`targets[i][idx] = region(targets[i][idx], updates[i])` in place, duplicates applied in order."""
    if idx.size == 0:
        return
    name = binop_of(region) if len(targets) == 1 else None
    if name is not None:
        t = widen(targets[0])
        t = np.array(t, copy=True) if t is targets[0] else t
        UFUNCS[name].at(t, idx, widen(updates[0]))
        targets[0][...] = t.astype(targets[0].dtype)
        return
    if _is_replace(region, len(targets)):
        for t, u in zip(targets, updates, strict=True):
            t[idx] = u
        return
    # Rounds: each round takes at most one update per target element, so rounds run vectorised.
    order = np.argsort(idx, kind="stable")
    s = idx[order]
    pos = np.arange(s.size)
    first = np.maximum.accumulate(np.where(np.r_[True, s[1:] != s[:-1]], pos, 0))
    rank = np.empty_like(pos)
    rank[order] = pos - first
    for r in range(int(rank.max()) + 1):
        sel = np.flatnonzero(rank == r)
        where = idx[sel]
        new = m.scalar_region(region, [t[where] for t in targets] + [u[sel] for u in updates])
        for t, v in zip(targets, new, strict=True):
            t[where] = v


def scatter(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    n = (len(args) - 1) // 2
    inputs = [as_array(a) for a in args[:n]]
    sd = op.attrs["scatter_dimension_numbers"]
    assert isinstance(sd, ScatterDims)
    ivd = sd.index_vector_dim + 1
    s = _indices(as_array(args[n]), ivd)
    updates = [as_array(a) for a in args[n + 1:]]
    shape_u = updates[0].shape
    uwd = [d + 1 for d in sd.update_window_dims]
    inserted = [d + 1 for d in sd.inserted_window_dims]
    ob = [0, *(d + 1 for d in sd.input_batching_dims)]
    ib = [0, *(d + 1 for d in sd.scatter_indices_batching_dims)]
    index_map = [d + 1 for d in sd.scattered_dims_to_operand_dims]
    x0 = inputs[0]
    window = [j for j in range(x0.ndim) if j not in inserted and j not in ob]
    rank = len(shape_u)
    scatter_pos = [d for d in range(rank) if d not in uwd]
    valid = np.ones(s.shape[:-1], dtype=bool)
    index = []
    for j in range(x0.ndim):
        start = _batch_starts(s, j, index_map, ob, ib, ivd)
        size = shape_u[uwd[window.index(j)]] if j in window else 1
        # XLA skips an update window that does not fit in the operand, rather than clamping it.
        valid = valid & (start >= 0) & (start <= x0.shape[j] - size)
        full = _place(start, scatter_pos, rank)
        if j in window:
            full = full + _place(np.arange(size), [uwd[window.index(j)]], rank)
        index.append(full)
    mask = np.broadcast_to(_place(valid, scatter_pos, rank), shape_u)
    flat = np.ravel_multi_index(tuple(np.broadcast_to(i, shape_u)[mask] for i in index), x0.shape)
    targets = [np.array(x, copy=True).reshape(-1) for x in inputs]
    combine(m, op.regions[0], targets, flat, [np.broadcast_to(u, shape_u)[mask] for u in updates])
    return [t.reshape(x0.shape).astype(dtype_of(r), copy=False) for t, r in zip(targets, op.results, strict=True)]


# -------------------------------------------------------------------------------------------- reduce

def tree_fold(m: Machine, region: Region, xs: list[np.ndarray], inits: list[np.ndarray]) -> list[np.ndarray]:
    """Reduce `[M, K]` arrays along K with `region`, adjacent pairs first (log K region calls), then fold
    the result into `inits` (`[M]`). Correct for any associative reducer, commutative or not."""
    vals = xs
    while vals[0].shape[1] > 1:
        k = vals[0].shape[1]
        h = k // 2
        pairs = m.scalar_region(region, [v[:, 0:2 * h:2] for v in vals] + [v[:, 1:2 * h:2] for v in vals])
        vals = [np.concatenate([p, v[:, 2 * h:]], axis=1) if k % 2 else p for p, v in zip(pairs, vals, strict=True)]
    if vals[0].shape[1] == 0:
        return inits
    return m.scalar_region(region, [*inits, *(v[:, 0] for v in vals)])


def _reduce_arrays(m: Machine, region: Region, xs: list[np.ndarray], inits: list[np.ndarray],
                   axes: tuple[int, ...]) -> list[np.ndarray]:
    """Reduce each `[D, ...]` of `xs` over `axes` (not 0) with per-device `inits` `[D]`."""
    kept = [d for d in range(xs[0].ndim) if d not in axes]
    kept_shape = [xs[0].shape[d] for d in kept]
    name = binop_of(region) if len(xs) == 1 else None
    if name is not None:
        x = widen(xs[0])
        init = widen(inits[0]).reshape(inits[0].shape[0], *[1] * (len(kept) - 1))
        ufunc = UFUNCS[name]
        if math.prod(x.shape[d] for d in axes) == 0:
            return [np.broadcast_to(init, kept_shape).astype(xs[0].dtype)]
        return [ufunc(init, ufunc.reduce(x, axis=axes))]
    k = math.prod(xs[0].shape[d] for d in axes)
    flat = [x.transpose(*kept, *axes).reshape(-1, k) for x in xs]
    flat_inits = [np.broadcast_to(i.reshape(i.shape[0], *[1] * (len(kept) - 1)), kept_shape).reshape(-1)
                  for i in inits]
    return [r.reshape(kept_shape) for r in tree_fold(m, region, flat, flat_inits)]


def reduce(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    n = len(args) // 2
    axes = tuple(d + 1 for d in int_attr(op, "dimensions"))
    outs = _reduce_arrays(m, op.regions[0], [as_array(a) for a in args[:n]], [as_array(a) for a in args[n:]], axes)
    return [o.astype(dtype_of(r), copy=False) for o, r in zip(outs, op.results, strict=True)]


def _padding(op: Op, rank: int) -> tuple[list[int], list[int]]:
    pad = op.attrs.get("padding")
    if not isinstance(pad, Literal):
        return [0] * rank, [0] * rank
    rows = np.asarray(pad.array, dtype=np.int64).reshape(rank, 2)
    return rows[:, 0].tolist(), rows[:, 1].tolist()


def _windows(x: np.ndarray, init: np.ndarray, op: Op, padded: bool = True) -> np.ndarray:
    """`[D, *out, *window]` view of the (dilated, padded) operand for reduce_window/select_and_scatter."""
    r = x.ndim - 1
    dims = int_attr(op, "window_dimensions")
    strides = int_attr(op, "window_strides", [1] * r)
    base = int_attr(op, "base_dilations", [1] * r)
    dil = int_attr(op, "window_dilations", [1] * r)
    if padded:
        lo, hi = _padding(op, r)
        x = pad_with(x, init, lo, hi, [b - 1 for b in base])
    span = [(w - 1) * d + 1 for w, d in zip(dims, dil, strict=True)]
    v = sliding_window_view(x, (1, *span))  # [D, *out_full, 1, *span]
    index: tuple[Any, ...] = (slice(None), *(slice(None, None, s) for s in strides), 0,
                              *(slice(None, None, d) for d in dil))
    return v[index]


def reduce_window(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    n = len(args) // 2
    inits = [as_array(a) for a in args[n:]]
    views = [_windows(as_array(x), i, op) for x, i in zip(args[:n], inits, strict=True)]
    r = as_array(args[0]).ndim - 1
    axes = tuple(range(1 + r, 1 + 2 * r))
    outs = _reduce_arrays(m, op.regions[0], views, inits, axes)
    return [o.astype(dtype_of(res), copy=False) for o, res in zip(outs, op.results, strict=True)]


def select_and_scatter(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """Per window pick one element with the `select` body, then combine the source value into it."""
    x, source, init = (as_array(a) for a in args)
    select, scatter_body = op.regions
    d, r = x.shape[0], x.ndim - 1
    lo, hi = _padding(op, r)
    xp = pad_with(x, np.zeros(d, x.dtype), lo, hi, [0] * r)
    ok = pad_with(np.ones(x.shape, bool), np.zeros(d, bool), lo, hi, [0] * r)
    pos = np.broadcast_to(np.arange(xp[0].size).reshape(xp.shape[1:]), xp.shape)
    wins = [_windows(a, np.zeros(d, a.dtype), op, padded=False) for a in (xp, ok, pos)]
    k = math.prod(wins[0].shape[1 + r:])
    vx, vok, vpos = (w.reshape(-1, k) for w in wins)
    best, best_ok, best_pos = vx[:, 0], vok[:, 0], vpos[:, 0]
    for j in range(1, k):
        keep = m.scalar_region(select, [best, vx[:, j]])[0].astype(bool)
        take = vok[:, j] & (~best_ok | ~keep)
        best, best_pos = np.where(take, vx[:, j], best), np.where(take, vpos[:, j], best_pos)
        best_ok = best_ok | vok[:, j]
    out = np.array(np.broadcast_to(init.reshape(d, *[1] * r), xp.shape))
    device = np.repeat(np.arange(d), best_pos.size // d)
    flat_idx = (device * xp[0].size + best_pos)[best_ok]
    flat = out.reshape(-1)
    combine(m, scatter_body, [flat], flat_idx, [source.reshape(-1)[best_ok]])
    crop = tuple(slice(a, a + n) for a, n in zip(lo, x.shape[1:], strict=True))
    return [flat.reshape(xp.shape)[(slice(None), *crop)].astype(dtype_of(op.results[0]))]


def map_(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    outs = m.scalar_region(op.regions[0], [as_array(a) for a in args])
    return [o.astype(dtype_of(r), copy=False) for o, r in zip(outs, op.results, strict=True)]


# ---------------------------------------------------------------------------------------------- sort

def _bitonic(m: Machine, region: Region, flat: list[np.ndarray]) -> np.ndarray:
    """The stable sorting permutation of rows `[M, n]` under the comparator `region`, by a bitonic network
    (log² n vectorised comparator calls). Ties fall back to the original position, padding sorts last."""
    rows, n = flat[0].shape
    size = 1 << max(n - 1, 0).bit_length()
    perm = np.broadcast_to(np.arange(size), (rows, size)).copy()

    def less(p: np.ndarray, q: np.ndarray) -> np.ndarray:
        vp, vq = p < n, q < n
        a = [np.take_along_axis(f, np.minimum(p, n - 1), axis=1) for f in flat]
        b = [np.take_along_axis(f, np.minimum(q, n - 1), axis=1) for f in flat]
        lt = m.scalar_region(region, [v for pair in zip(a, b, strict=True) for v in pair])[0].astype(bool)
        gt = m.scalar_region(region, [v for pair in zip(b, a, strict=True) for v in pair])[0].astype(bool)
        return np.where(vp & vq, lt | (~gt & (p < q)), vp & ~vq)

    k = 2
    while k <= size:
        j = k // 2
        while j >= 1:
            i = np.arange(size)
            lo = i[(i ^ j) > i]
            hi = lo ^ j
            ascending = (lo & k) == 0
            a, b = perm[:, lo], perm[:, hi]
            swap = np.where(ascending, less(b, a), less(a, b))
            perm[:, lo], perm[:, hi] = np.where(swap, b, a), np.where(swap, a, b)
            j //= 2
        k *= 2
    return perm[:, :n]


def sort(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    xs = [as_array(a) for a in args]
    dim = int(op.attrs.get("dimension", -1))  # type: ignore[arg-type]
    dim = (dim if dim >= 0 else dim + xs[0].ndim - 1) + 1
    moved = [np.moveaxis(x, dim, -1) for x in xs]
    shape = moved[0].shape
    flat = [x.reshape(-1, shape[-1]) for x in moved]
    region = op.regions[0]
    single = region.ops[0] if len(region.ops) == 1 else None
    if (single is not None and single.opcode == "compare" and single.operands == tuple(region.args[:2])
            and region.results[0] is single.results[0]
            and str(single.attrs.get("comparison_direction")) == "LT" and flat[0].dtype.kind in "iub"):
        perm = np.argsort(flat[0], axis=1, kind="stable")  # plain integer keys: NumPy's order is XLA's
    else:
        perm = _bitonic(m, region, flat)
    return [np.moveaxis(np.take_along_axis(f, perm, axis=1).reshape(shape), -1, dim) for f in flat]


def total_key(x: np.ndarray) -> np.ndarray:
    """Signed integers ordered like IEEE totalOrder: -NaN < -inf < ... < -0 < +0 < ... < inf < NaN."""
    f = x.astype(np.float64 if x.dtype == np.float64 else np.float32)
    i: Any = f.view(np.int64 if f.dtype == np.float64 else np.int32)
    return np.where(i < 0, i ^ np.iinfo(i.dtype).max, i)


def top_k(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    k = int(op.attrs["k"])  # type: ignore[arg-type]
    w = widen(x)
    key = total_key(w) if w.dtype.kind == "f" else w  # integer keys: NaN is the largest, as in XLA
    if bool(op.attrs.get("largest", True)):
        key = ~key  # reverses the order of any integer type exactly
    order = np.argsort(key, axis=-1, kind="stable")[..., :k]
    return [np.take_along_axis(x, order, axis=-1), order.astype(dtype_of(op.results[1]))]
