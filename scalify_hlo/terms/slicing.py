"""Slices in one normal form: outermost, so that work done slice by slice meets work done at once.

An unrolled loop over microbatches (`for m: y[m] = f(x[m])`, then `stack`) computes the same as `f(x)`
when `f` treats the sliced dim as a batch dim. Moving every slice outward, through elementwise ops and
through dot_general along a free dim, turns each `f(x[m])` into `f(x)[m]`; consecutive slices of one
tensor, concatenated, are that tensor. All of it is exact. (Reshapes and broadcasts already go outward:
`terms._sink_movement`.)

A slice of a concatenate is the concatenate of the parts' pieces it covers, so a cyclic shift of a cyclic
shift (`concatenate(x[L-s:], x[:L-s])`, a ring's ppermute) is one shift. A sum over every shift of `x` by
multiples of a block (a ring all-reduce: each device adds the blocks passed round) is then, on every
block, the sum of `x`'s blocks: the tiling of that sum (`sum_of_rolls`; exact on integers, a reassociation
over the reals).

A dynamic_update_slice at constant offsets of a window that spans the other dims whole (an unrolled scan
writing its rows into a buffer) is the concatenate of the buffer's rows before the window, the update and
the rows after it (`update_as_concatenate`); a dynamic_slice at constant offsets is a slice
(`dynamic_as_slice`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.ops.reducers import OP_OF_REDUCER, Reducer
from scalify_hlo.terms.term import peel, scalar_value

_COMBINE = {r.value: op for r, op in OP_OF_REDUCER.items()}  # a scatter's "computation" -> its elementwise op

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms
    from scalify_hlo.terms.term import AttrKey, Term


def _unit_strides(t: Term) -> bool:
    return all(s == 1 for s in (t.attr("strides") or ()))


def _window(t: Term) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return tuple(t.attr("start_indices")), tuple(t.attr("limit_indices"))


def slice_of(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term:
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    attrs = (("limit_indices", hi), ("start_indices", lo), ("strides", (1,) * len(lo)))
    return terms.apply("slice", (x,), attrs, TensorType(shape, x.type.dtype))


def window_along(shape: tuple[int, ...], dim: int, a: int, b: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The window `[a, b)` along `dim`, the other dims whole: (lo, hi)."""
    return (tuple(a if k == dim else 0 for k in range(len(shape))),
            tuple(b if k == dim else n for k, n in enumerate(shape)))


def slice_along(terms: Terms, x: Term, dim: int, a: int, b: int) -> Term:
    return slice_of(terms, x, *window_along(x.type.shape, dim, a, b))


def pull_elementwise(terms: Terms, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
    """op(x[s], y[s], splat) = op(x, y, splat)[s]."""
    sliced = [a for a in args if a.op == "slice" and scalar_value(a) is None]
    if not sliced or not all(_unit_strides(a) for a in sliced):
        return None
    first = sliced[0]
    src = first.args[0].type.shape
    if any(a.attrs != first.attrs or a.args[0].type.shape != src for a in sliced):
        return None
    inner = peel(terms, args, sliced, src)
    if inner is None:
        return None
    whole = terms.apply(op, inner, attrs, TensorType(src, type.dtype))
    lo, hi = _window(first)
    return slice_of(terms, whole, lo, hi)


def _unsliced(t: Term) -> tuple[Term, tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """`t` as `squeeze(x[lo:hi])`: (x, lo, hi, the squeezed dims of the slice), or None."""
    squeezed: tuple[int, ...] = ()
    s = t
    if t.op == "reshape" and t.args[0].op == "slice":
        s = t.args[0]
        squeezed = tuple(i for i, (a, b) in enumerate(zip(*_window(s), strict=True))
                         if b - a == 1 and s.args[0].type.shape[i] > 1)
        if tuple(n for i, n in enumerate(s.type.shape) if i not in squeezed) != t.type.shape:
            return None
    if s.op != "slice" or not _unit_strides(s):
        return None
    lo, hi = _window(s)
    return s.args[0], lo, hi, squeezed


def pull_dot(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """dot(x[s], w) = dot(x, w)[s'] when the slice only cuts free dims of x (a microbatch of x)."""
    dims = a.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims):
        return None
    for side in (0, 1):
        found = _unsliced(args[side])
        if found is None:
            continue
        x, lo, hi, squeezed = found
        kept = [i for i in range(x.type.rank) if i not in squeezed]  # operand dim k is x dim kept[k]
        batch, contract = (dims.lhs_batch, dims.lhs_contract) if side == 0 else (dims.rhs_batch, dims.rhs_contract)
        fixed = {kept[k] for k in (*batch, *contract)}
        cut = [i for i in range(x.type.rank) if (lo[i], hi[i]) != (0, x.type.shape[i])]
        if any(i in fixed for i in cut):
            continue
        mb, mc = tuple(kept[k] for k in batch), tuple(kept[k] for k in contract)
        new = DotDims(mb, dims.rhs_batch, mc, dims.rhs_contract) if side == 0 else \
            DotDims(dims.lhs_batch, mb, dims.lhs_contract, mc)
        operands = (x, args[1]) if side == 0 else (args[0], x)
        lt, rt = operands[0].type, operands[1].type
        lfree = [i for i in range(lt.rank) if i not in (*new.lhs_batch, *new.lhs_contract)]
        rfree = [i for i in range(rt.rank) if i not in (*new.rhs_batch, *new.rhs_contract)]
        shape = (tuple(lt.shape[i] for i in new.lhs_batch) + tuple(lt.shape[i] for i in lfree)
                 + tuple(rt.shape[i] for i in rfree))
        whole = terms.apply("dot_general", operands, (("dot_dimension_numbers", new), *_other(a)),
                            TensorType(shape, type.dtype))
        # where each dim of x landed in the result (x's free dims, in order, after the batch dims)
        free = lfree if side == 0 else rfree
        offset = len(new.lhs_batch) + (0 if side == 0 else len(lfree))
        out_lo = [0] * len(shape)
        out_hi = list(shape)
        for i in cut:
            j = offset + free.index(i)
            out_lo[j], out_hi[j] = lo[i], hi[i]
        part = slice_of(terms, whole, tuple(out_lo), tuple(out_hi))
        return part if part.type == type else terms.apply("reshape", (part,), (), type)
    return None


def _other(a: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple((k, v) for k, v in a.items() if k != "dot_dimension_numbers")


def join_slices(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """A concatenate in one normal form: nested concatenates along the same dim flattened, and each run of
    consecutive slices of one tensor (`x[a:b], x[b:c]` along d, the same window elsewhere) joined into one
    slice (`x[a:c]`); the concatenate of a single part is that part. None when nothing changes."""
    d = a.get("dimension")
    if d is None or not args:
        return None
    flat: list[Term] = []
    for t in args:
        if t.op == "concatenate" and t.attr("dimension") == d:
            flat.extend(t.args)
        else:
            flat.append(t)
    parts: list[Term] = []
    for t in flat:
        prev = parts[-1] if parts else None
        if prev is not None and (joined := _consecutive(terms, prev, t, int(d))) is not None:
            parts[-1] = joined
        else:
            parts.append(t)
    if len(parts) == 1:
        return parts[0]
    if len(parts) == len(args) and all(p is q for p, q in zip(parts, args, strict=True)):
        return None
    return terms.apply("concatenate", tuple(parts), (("dimension", d),), type)


def _consecutive(terms: Terms, s: Term, t: Term, d: int) -> Term | None:
    """`x[a:c]` when `s` is `x[a:b]` and `t` is `x[b:c]` along `d` (the same window elsewhere)."""
    if s.op != "slice" or t.op != "slice" or s.args[0] is not t.args[0] or not (_unit_strides(s) and _unit_strides(t)):
        return None
    (slo, shi), (tlo, thi) = _window(s), _window(t)
    if tlo[d] != shi[d] or any(slo[i] != tlo[i] or shi[i] != thi[i] for i in range(len(slo)) if i != d):
        return None
    return slice_of(terms, s.args[0], slo, tuple(thi[d] if i == d else h for i, h in enumerate(shi)))


def slice_of_concatenate(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term:
    """`concatenate(p_1, .., p_k)[lo:hi]` as the concatenate of the parts' pieces the window covers: a cyclic
    shift of a shift (a ring's ppermutes, a roll of a roll) is then one shift, its slices joined."""
    d = int(x.attr("dimension"))
    pieces: list[Term] = []
    at = 0
    for p in x.args:
        n = p.type.shape[d]
        a, b = max(lo[d], at) - at, min(hi[d], at + n) - at
        if a < b:
            plo = tuple(a if i == d else v for i, v in enumerate(lo))
            phi = tuple(b if i == d else v for i, v in enumerate(hi))
            pieces.append(slice_of(terms, p, plo, phi))
        at += n
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    return terms.apply("concatenate", tuple(pieces), (("dimension", d),), TensorType(shape, x.type.dtype))


_ROLL_TERMS = 64  # summands looked at for a sum of rolls (a ring's steps: one per device of an axis)


def _roll(t: Term) -> tuple[Term, int, int] | None:
    """(x, d, s) when `t` is `x` shifted cyclically by `s` rows along `d`: `concatenate(x[L-s:], x[:L-s])`."""
    if t.op != "concatenate" or len(t.args) != 2:
        return None
    a, b = t.args
    if a.op != "slice" or b.op != "slice" or a.args[0] is not b.args[0] or not (_unit_strides(a) and _unit_strides(b)):
        return None
    x, d = a.args[0], int(t.attr("dimension"))
    n = x.type.shape[d]
    s = a.type.shape[d]
    whole = tuple((0, m) for m in x.type.shape)
    (alo, ahi), (blo, bhi) = _window(a), _window(b)
    want_a = tuple((n - s, n) if i == d else w for i, w in enumerate(whole))
    want_b = tuple((0, n - s) if i == d else w for i, w in enumerate(whole))
    if tuple(zip(alo, ahi, strict=True)) != want_a or tuple(zip(blo, bhi, strict=True)) != want_b:
        return None
    return x, d, s


def _summands(type: TensorType, args: tuple[Term, ...]) -> list[Term] | None:
    """The summands of an `add` of `args` (nested adds of `type` flattened); None past `_ROLL_TERMS`."""
    leaves: list[Term] = []
    stack = list(args)
    while stack:
        u = stack.pop()
        if u.op == "add" and u.type == type:
            stack.extend(u.args)
        else:
            leaves.append(u)
        if len(leaves) + len(stack) > _ROLL_TERMS:
            return None
    return leaves


def sum_of_rolls(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """`x + roll(x, B) + .. + roll(x, (n-1)·B)` along a dim of `n·B` rows, among the summands of an `add`
    (in any order and nesting, with other summands), as the tiling of the sum of `x`'s `n` blocks. None
    when no summands make such an orbit."""
    if not any(a.op == "concatenate" for a in args):
        return None
    leaves = _summands(type, args)
    if leaves is None:
        return None
    shifts: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (x, dim) -> (shift, summand)
    base: dict[int, Term] = {}
    for i, t in enumerate(leaves):
        if (r := _roll(t)) is not None:
            x, d, s = r
            shifts.setdefault((x.id, d), []).append((s, i))
            base[x.id] = x
    for (xid, d), found in shifts.items():
        x = base[xid]
        by_shift = dict(found)
        block = min(by_shift)
        n = x.type.shape[d] // block
        unrolled = [i for i, t in enumerate(leaves) if t is x]
        if (x.type.shape[d] % block or len(by_shift) != len(found) or set(by_shift) != {k * block for k in range(1, n)}
                or not unrolled):
            continue
        used = {*(i for _, i in found), unrolled[0]}
        cut = (*x.type.shape[:d], n, block, *x.type.shape[d + 1:])
        blocks = terms.apply("reshape", (x,), (), TensorType(cut, x.type.dtype))
        zero = terms.scalar(0.0, x.type.dtype)
        total = terms.apply("reduce", (blocks, zero), (("dimensions", (d,)), ("reducer", Reducer.SUM.value)),
                            TensorType((*cut[:d], *cut[d + 1:]), x.type.dtype))
        out = terms.tile(total, d, n)
        if x.type.dtype.startswith(("f", "bf")):
            terms.notes.add("the proof summed the blocks passed round a ring in another order (exact over the "
                            "reals); floating-point results may differ by rounding")
        for i, t in enumerate(leaves):
            if i not in used:
                out = terms.apply("add", (out, t), (), type)
        return out
    return None


def ring_gaps(t: Term) -> tuple[int, int, int, list[int]] | None:
    """(dim, block, blocks, missing shifts) when the summands of `t` (an `add` tree) are `x` and some of its
    cyclic shifts by multiples of one block along one dim, but not all of them: a ring all-reduce a step
    short, or one that adds a block twice. None otherwise."""
    leaves = _summands(t.type, (t,))
    if leaves is None:
        return None
    rolls = [r for u in leaves if (r := _roll(u)) is not None]
    if not rolls or len({(x.id, d) for x, d, _ in rolls}) != 1:
        return None
    x, d, _ = rolls[0]
    block = math.gcd(*(s for _, _, s in rolls))
    if x.type.shape[d] % block:
        return None
    n = x.type.shape[d] // block
    present = [0] * n
    present[0] += sum(u is x for u in leaves)
    for _, _, s in rolls:
        present[s // block] += 1
    missing = [k * block for k in range(n) if present[k] == 0]
    return (d, block, n, missing) if missing or any(c > 1 for c in present) else None


def iota_window(pred: Term) -> tuple[int, int, int] | None:
    """(dim, a, b) when the boolean `pred` is true exactly at the positions whose index along `dim` lies in
    [a, b): a comparison of an iota with a constant, broadcast along the other dims, or a conjunction."""
    dims: tuple[int, ...] | None = None
    if pred.op == "broadcast_in_dim":
        dims, pred = tuple(pred.attr("broadcast_dimensions")), pred.args[0]
    if pred.op == "and":
        parts = [iota_window(x) for x in pred.args]
        if any(p is None for p in parts) or len({p[0] for p in parts if p is not None}) != 1:
            return None
        d0 = parts[0][0]  # type: ignore[index]
        inner = (d0, max(p[1] for p in parts if p), min(p[2] for p in parts if p))
    elif pred.op == "compare" and pred.args[0].op == "iota":
        k = scalar_value(pred.args[1])
        if k is None or k != int(k):
            return None
        d = pred.args[0].attr("iota_dimension")
        n, k = pred.type.shape[d], int(k)
        bounds = {"GE": (k, n), "GT": (k + 1, n), "LT": (0, k), "LE": (0, k + 1)}.get(pred.attr("comparison_direction"))
        if bounds is None:
            return None
        inner = (d, *bounds)
    elif pred.op == "constant" and pred.type.rank:
        inner_or_none = _constant_window(np.asarray(pred.attr("value").array, dtype=bool))
        if inner_or_none is None:
            return None
        inner = inner_or_none
    else:
        return None
    return inner if dims is None else (dims[inner[0]], inner[1], inner[2])


def _constant_window(mask: np.ndarray) -> tuple[int, int, int] | None:
    """(dim, a, b) when a constant mask is true exactly where its index along `dim` lies in [a, b)."""
    for d in range(mask.ndim):
        line = np.moveaxis(mask, d, 0).reshape(mask.shape[d], -1)
        if not np.all(line == line[:, :1]):
            continue
        true = np.flatnonzero(line[:, 0])
        if true.size == 0:
            return (d, 0, 0)
        a, b = int(true[0]), int(true[-1]) + 1
        return (d, a, b) if true.size == b - a else None
    return None


def scatter_window(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """A scatter of one window at a constant, in-bounds position, combined by a reduction (`x.at[a:b].add(u)`,
    `.max`, `.min`, `.multiply`) as the tensor it makes: the window `op(x[w], u)` joined with the rows of `x`
    around it along each dim (`embed`), so that it meets a program that computes that block and joins it.
    None for anything else (several or computed indices, batching dims, other update computations)."""
    g = a.get("scatter_dimension_numbers")
    combine = _COMBINE.get(a.get("computation"))  # type: ignore[arg-type]
    if len(args) != 3 or g is None or combine is None or g.input_batching_dims:
        return None
    x, idx, upd = args
    vec = _constant_ints(idx)
    if vec is None or len(vec) != len(g.scattered_dims_to_operand_dims):
        return None
    scatter_dims = [d for d in range(upd.type.rank) if d not in g.update_window_dims]
    if any(upd.type.shape[d] != 1 for d in scatter_dims):
        return None
    sizes = iter(upd.type.shape[d] for d in g.update_window_dims)
    window = tuple(1 if d in g.inserted_window_dims else next(sizes) for d in range(x.type.rank))
    start = [0] * x.type.rank
    for k, d in enumerate(g.scattered_dims_to_operand_dims):
        start[d] = vec[k]
    end = tuple(s + w for s, w in zip(start, window, strict=True))
    if any(s < 0 or e > n for s, e, n in zip(start, end, x.type.shape, strict=True)):
        return None  # XLA skips an out-of-bounds window: left to the opaque scatter
    wtype = TensorType(window, type.dtype)
    block = terms.apply(combine, (slice_of(terms, x, tuple(start), end), terms.apply("reshape", (upd,), (), wtype)),
                        (), wtype)
    return embed(terms, x, block, tuple(start))


def embed(terms: Terms, x: Term, block: Term, start: tuple[int, ...]) -> Term:
    """`x` with the window at `start` replaced by `block`: dim by dim from the last, the block joined with
    the rows of `x` before and after it (a slice of `x` on the block's window in the dims already done)."""
    cur = block
    shape = x.type.shape
    for d in range(x.type.rank - 1, -1, -1):
        lo, hi = start[d], start[d] + block.type.shape[d]
        if (lo, hi) == (0, shape[d]):
            continue
        parts = []
        for a, b in ((0, lo), (hi, shape[d])):
            if a < b:
                wlo = tuple(a if k == d else start[k] if k < d else 0 for k in range(len(shape)))
                whi = tuple(b if k == d else start[k] + block.type.shape[k] if k < d else shape[k]
                            for k in range(len(shape)))
                parts.append(slice_of(terms, x, wlo, whi))
        pieces = (*parts[:1], cur, *parts[1:]) if lo > 0 else (cur, *parts)
        out = tuple(shape[k] if k >= d else block.type.shape[k] for k in range(len(shape)))
        cur = terms.apply("concatenate", pieces, (("dimension", d),), TensorType(out, x.type.dtype))
    return cur


def _constant_ints(t: Term) -> list[int] | None:
    """The entries of a small integer constant (a literal, or one value broadcast)."""
    if not t.type.dtype.startswith(("i", "ui")) or t.type.size > 16:
        return None
    v = scalar_value(t)
    if v is not None:
        return [int(v)] * t.type.size
    if t.op == "constant":
        lit = t.attr("value")
        return [int(e) for e in lit.array.reshape(-1)]
    return None


def update_as_concatenate(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """`dynamic_update_slice(x, u, offsets)` at constant offsets, `u` whole along all dims but one, as
    `concatenate(x[:a], u, x[a+m:])` along that dim (offsets clamped into range, as XLA does)."""
    x, u, *offsets = args
    at = [scalar_value(o) for o in offsets]
    partial = [d for d in range(type.rank) if u.type.shape[d] != type.shape[d]]
    if any(v is None for v in at) or len(partial) > 1:
        return None
    if not partial:
        return u
    (d,) = partial
    m, n = u.type.shape[d], type.shape[d]
    a = min(max(int(at[d]), 0), n - m)  # type: ignore[arg-type]
    pieces = [p for p in (slice_along(terms, x, d, 0, a), u, slice_along(terms, x, d, a + m, n)) if p.type.shape[d]]
    return terms.apply("concatenate", tuple(pieces), (("dimension", d),), type)


def dynamic_as_slice(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """`dynamic_slice(x, offsets)` at constant offsets as the slice it reads (offsets clamped into range,
    as XLA does)."""
    x, *offsets = args
    at = [scalar_value(o) for o in offsets]
    if any(v is None for v in at) or len(at) != x.type.rank:
        return None
    lo = tuple(min(max(int(v), 0), n - m) for v, n, m in zip(at, x.type.shape, type.shape, strict=True))  # type: ignore[arg-type]
    return slice_of(terms, x, lo, tuple(a + m for a, m in zip(lo, type.shape, strict=True)))


def take_as_concatenate(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """A gather of whole slices at constant indices along one dim (`jnp.take(x, [2, 0, 1], axis=k)`, an
    index permutation) as the concatenate of those rows of `x` (indices clamped into range, as XLA does;
    consecutive rows as one slice). Only the spelling whose gathered dim stays where it was."""
    x, idx = args
    dn = a.get("dimension_numbers")
    sizes = a.get("slice_sizes")
    if dn is None or sizes is None or dn.operand_batching_dims or len(dn.start_index_map) != 1:
        return None
    (k,) = dn.start_index_map
    while idx.op == "reshape":
        (idx,) = idx.args
    if dn.collapsed_slice_dims != (k,) or idx.op != "constant" or not idx.type.dtype.startswith(("i", "ui")):
        return None
    rows = [min(max(int(v), 0), x.type.shape[k] - 1) for v in idx.attr("value").array.reshape(-1)]
    whole = tuple(1 if d == k else n for d, n in enumerate(x.type.shape))
    offset = tuple(d for d in range(type.rank) if d != k)
    if tuple(sizes) != whole or tuple(dn.offset_dims) != offset or type.shape[k] != len(rows) or len(rows) > 64:
        return None
    parts = tuple(slice_along(terms, x, k, r, r + 1) for r in rows)  # consecutive rows join: `join_slices`
    return parts[0] if len(parts) == 1 else terms.apply("concatenate", parts, (("dimension", k),), type)


def slice_of_tile(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """A window of `tile(s, d, n)` (`jnp.tile`'s broadcast-and-merge, as a roll by a traced shift reads
    `x` twice over) as the rows of `s` it covers: one slice of `s` within a copy, or the concatenate of
    the pieces of the copies it spans (a rotation of `s`)."""
    if x.op != "reshape" or x.args[0].op != "broadcast_in_dim":
        return None
    wide, shape = x.args[0].type.shape, x.type.shape
    if len(wide) != len(shape) + 1:
        return None
    d = next((i for i in range(len(shape)) if wide[i] != shape[i]), len(shape) - 1)
    if wide[:d] != shape[:d] or wide[d + 2:] != shape[d + 1:] or wide[d] * wide[d + 1] != shape[d]:
        return None
    n, m = wide[d], wide[d + 1]
    s = terms.untile(x, d, n)
    if s is None:
        return None
    pieces = []
    for c in range(lo[d] // m, -(-hi[d] // m)):
        a, b = max(lo[d], c * m) - c * m, min(hi[d], (c + 1) * m) - c * m
        pieces.append(slice_of(terms, s, tuple(a if i == d else v for i, v in enumerate(lo)),
                               tuple(b if i == d else v for i, v in enumerate(hi))))
    if len(pieces) == 1:
        return pieces[0]
    out = tuple(h - v for v, h in zip(lo, hi, strict=True))
    return terms.apply("concatenate", tuple(pieces), (("dimension", d),), TensorType(out, x.type.dtype))

