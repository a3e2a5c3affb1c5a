"""Concatenations in one normal form: blocks side by side joined into the tensor they are blocks of.

What the blockwise normal form (`blockwise.py`) produces when it merges reductions: the blocks of the
merged reduction's operand, concatenated along the reduced dim, must become the reference's operand. Rules
(each exact): constants concatenate to a constant; copies of one broadcast along a dim it stretches are
that broadcast, wider; blocks of one masked tensor are the masked tensor (`_concat_masked`); the same
elementwise op on each block is that op on the concatenated operands; consecutive slices of one tensor are
the wider slice (`slicing.join_slices`, through `Terms.apply`). What stays a concatenation while blocks are
being merged is recorded (`unjoined`): localisation names the op that made it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.elementwise import SHAPE_PRESERVING
from scalify_hlo.terms.pushing import FOLD_LIMIT, constant_value, folded
from scalify_hlo.terms.slicing import slice_of
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import AttrKey, Term, scalar_value


class Joins:
    """The concatenation rules of the normaliser (a mixin: `Normaliser` provides `terms` and `make`)."""

    terms: Terms
    unjoined: dict[int, str]
    _merging: int
    _concats: dict[tuple[tuple[int, ...], int, bool], Term]

    def make(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term:
        raise NotImplementedError

    def tick(self) -> None:
        """One step of work: raises when the comparison is out of fuel or time."""
        raise NotImplementedError

    def _concatenate(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        d = dict(attrs).get("dimension")
        if d is None:
            return None
        out = self.concat(args, int(d))
        return None if out.op == "concatenate" and out.args == args else out

    def merged(self, pieces: Sequence[Term], d: int) -> Term:
        """`concat` of the blocks of a reduction being merged (what stays unjoined is recorded)."""
        self._merging += 1
        try:
            return self.concat(pieces, d)
        finally:
            self._merging -= 1

    def unjoined_in(self, t: Term) -> str | None:
        """How blocks merged into `t` failed to join, if they did somewhere in it."""
        return next((self.unjoined[s.id] for s in t.walk() if s.id in self.unjoined), None)

    def concat(self, pieces: Sequence[Term], d: int) -> Term:
        """The concatenation of `pieces` along `d`, in normal form (memoised: blocks of a deep elementwise
        computation share their operands, which the columns of `_concat_elementwise` meet again and again)."""
        key = (tuple(p.id for p in pieces), d, self._merging > 0)
        hit = self._concats.get(key)
        if hit is None:
            self.tick()
            hit = self._concats[key] = self._concat(pieces, d)
        return hit

    def _concat(self, pieces: Sequence[Term], d: int) -> Term:
        flat: list[Term] = []
        for p in pieces:
            flat.extend(p.args if p.op == "concatenate" and p.attr("dimension") == d else (p,))
        if len(flat) == 1:
            return flat[0]
        shape = list(flat[0].type.shape)
        shape[d] = sum(p.type.shape[d] for p in flat)
        type = TensorType(tuple(shape), flat[0].type.dtype)
        attrs: AttrKey = (("dimension", d),)
        for rule in (self._concat_constants, self._concat_broadcasts, self._concat_masked, self._concat_elementwise):
            out = rule(flat, d, type)
            if out is not None:
                return out
        joined = self.terms.apply("concatenate", tuple(flat), attrs, type)
        if self._merging and joined.op == "concatenate":
            self.unjoined.setdefault(joined.id, "misplaced" if _same_source(flat) else "unscaled")
        return joined

    def _concat_constants(self, flat: list[Term], d: int, type: TensorType) -> Term | None:
        if type.size > FOLD_LIMIT or not all(is_constant(p) for p in flat):
            return None
        values: list[np.ndarray] = []
        for p in flat:
            if (v := constant_value(p)) is None:
                return None
            values.append(np.broadcast_to(v, p.type.shape))
        whole = np.concatenate(values, axis=d)
        return folded(self.terms, whole, type)

    def _concat_broadcasts(self, flat: list[Term], d: int, type: TensorType) -> Term | None:
        """Copies of one broadcast along a dim it stretches: the broadcast, wider."""
        views = [as_broadcast(p) for p in flat]
        first = views[0]
        if first is None or d in first[1] or any(v is None or v[0] is not first[0] or v[1] != first[1] for v in views):
            return None
        return broadcast(self, first[0], first[1], type.shape)

    def _concat_masked(self, flat: list[Term], d: int, type: TensorType) -> Term | None:
        """Blocks of `select(mask, x, fill)` read at consecutive windows of `x` (a block the mask clears
        entirely is just `fill`, one it keeps entirely just `x`'s window): the select over the union."""
        parsed: list[tuple[np.ndarray | bool, Term | None, tuple[int, ...] | None, float | None]] = []
        for p in flat:
            if p.op == "select" and p.args[1].op == "slice" and (f := scalar_value(p.args[2])) is not None:
                value = constant_value(p.args[0]) if p.args[0].type.size <= FOLD_LIMIT else None
                if value is None:
                    return None
                parsed.append((np.broadcast_to(value, p.type.shape), p.args[1], None, f))
            elif p.op == "slice":
                parsed.append((True, p, None, None))
            elif (f := scalar_value(p)) is not None:
                parsed.append((False, None, None, f))
            else:
                return None
        sources = {s.args[0].id for _, s, _, _ in parsed if s is not None}
        fills = {f for _, _, _, f in parsed if f is not None}
        if len(sources) != 1 or len(fills) != 1 or all(s is None for _, s, _, _ in parsed):
            return None
        known = [(k, s) for k, (_, s, _, _) in enumerate(parsed) if s is not None]
        if any(not all(st == 1 for st in (s.attr("strides") or ())) for _, s in known):
            return None
        k0, s0 = known[0]
        x = s0.args[0]
        lo0, hi0 = tuple(s0.attr("start_indices")), tuple(s0.attr("limit_indices"))
        start = lo0[d] - sum(p.type.shape[d] for p in flat[:k0])
        pos = start
        for k, p in enumerate(flat):
            s = parsed[k][1]
            if s is not None:
                lo, hi = tuple(s.attr("start_indices")), tuple(s.attr("limit_indices"))
                if lo[d] != pos or any(lo[i] != lo0[i] or hi[i] != hi0[i] for i in range(len(lo)) if i != d):
                    return None
            pos += p.type.shape[d]
        if start < 0 or pos > x.type.shape[d]:
            return None
        mask = np.concatenate([np.broadcast_to(m, p.type.shape) if not isinstance(m, bool)
                               else np.full(p.type.shape, m) for (m, _, _, _), p in zip(parsed, flat, strict=True)],
                              axis=d)
        (fill,) = fills
        lo = tuple(start if i == d else a for i, a in enumerate(lo0))
        hi = tuple(pos if i == d else b for i, b in enumerate(hi0))
        window = slice_of(self.terms, x, lo, hi)
        pred_type = TensorType(type.shape, "i1")
        pred = folded(self.terms, mask, pred_type)
        return self.make("select", (pred, window, self.terms.splat(fill, type)), (), type)

    def _concat_elementwise(self, flat: list[Term], d: int, type: TensorType) -> Term | None:
        """op(a1, b1) ++ op(a2, b2) = op(a1 ++ a2, b1 ++ b2) (a broadcast of op(...) seen as op of broadcasts)."""
        head = next((p for p in flat if p.op in SHAPE_PRESERVING), None)
        if head is None or any(a.type.shape != head.type.shape for a in head.args):
            return None
        columns: list[list[Term]] = [[] for _ in head.args]
        for p in flat:
            view = _elementwise_view(self, p, head)
            if view is None:
                return None
            for col, a in zip(columns, view, strict=True):
                col.append(a)
        args = tuple(self.concat(col, d) for col in columns)
        return self.make(head.op, args, head.attrs, type)


def _same_source(pieces: list[Term]) -> bool:
    """Blocks that read one tensor (through the same ops): then only their places can be wrong."""
    def source(t: Term) -> int | None:
        while t.op in ("select", "exponential", "subtract", "multiply", "convert", "negate"):
            t = t.args[1] if t.op == "select" else t.args[0]
        return t.args[0].id if t.op == "slice" else None

    found = {source(p) for p in pieces if scalar_value(p) is None}
    return len(found) == 1 and None not in found


def _elementwise_view(n: Joins, p: Term, head: Term) -> tuple[Term, ...] | None:
    """The operands of block `p` seen as `head`'s op (a broadcast of that op: its operands broadcast)."""
    if p.op == head.op and p.attrs == head.attrs and all(a.type.shape == p.type.shape for a in p.args):
        return p.args
    view = as_broadcast(p)
    if (view is not None and (inner := view[0]).op == head.op and inner.attrs == head.attrs
            and all(a.type.shape == inner.type.shape for a in inner.args)):
        return tuple(n.terms.apply("broadcast_in_dim", (a,), (("broadcast_dimensions", view[1]),),
                                   TensorType(p.type.shape, a.type.dtype)) for a in inner.args)
    return None


def follow_dim(t: Term, dim: int) -> Iterator[tuple[Term, int]]:
    """The subterms of `t` that dim `dim` runs through (with its number there), depth first: through
    elementwise ops, broadcasts that keep the dim, transposes, and the first block of a concatenation."""
    stack = [(t, dim)]
    seen: set[tuple[int, int]] = set()
    while stack:
        s, k = stack.pop()
        if (s.id, k) in seen:
            continue
        seen.add((s.id, k))
        yield s, k
        if s.op in SHAPE_PRESERVING:
            stack.extend((a, k) for a in reversed(s.args) if a.type.shape == s.type.shape)
        elif (view := as_broadcast(s)) is not None and k in view[1]:
            stack.append((view[0], view[1].index(k)))
        elif s.op == "transpose":
            stack.append((s.args[0], int(s.attr("permutation")[k])))
        elif s.op == "concatenate" and s.args:
            stack.append((s.args[0], k))


def block_order(t: Term, dim: int) -> tuple[int, int]:
    """Where a block comes from along `dim`: the offset of the first slice it reads along that dim
    (blocks that read none, such as a fully masked block, go last)."""
    return next(((0, int(s.attr("start_indices")[k])) for s, k in follow_dim(t, dim) if s.op == "slice"), (1, 0))


def as_broadcast(t: Term) -> tuple[Term, tuple[int, ...]] | None:
    """`t` as `broadcast_in_dim(x, dims)`: a broadcast, or a reshape that only inserts unit dims (how
    `Terms.apply` spells a broadcast that adds nothing but unit dims)."""
    if t.op == "broadcast_in_dim":
        return t.args[0], tuple(t.attr("broadcast_dimensions"))
    if t.op != "reshape":
        return None
    (x,) = t.args
    dims: list[int] = []
    j = 0
    for n in x.type.shape:
        while j < t.type.rank and t.type.shape[j] != n and t.type.shape[j] == 1:
            j += 1
        if j == t.type.rank or t.type.shape[j] != n:
            return None
        dims.append(j)
        j += 1
    if any(t.type.shape[k] != 1 for k in range(t.type.rank) if k not in dims):
        return None
    return x, tuple(dims)


def broadcast(n: Joins, x: Term, dims: tuple[int, ...], shape: tuple[int, ...]) -> Term:
    return n.make("broadcast_in_dim", (x,), (("broadcast_dimensions", dims),), TensorType(shape, x.type.dtype))


def is_constant(t: Term) -> bool:
    return t.op == "constant" or (t.op == "broadcast_in_dim" and t.args[0].op == "constant")
