"""Blockwise reductions in one normal form: a reduction done block by block and combined is the reduction
over the concatenated blocks.

Ring attention computes a softmax over keys no device holds together: per key block a row max, a sum of
exponentials and a product with the value block, combined online (the running max grows, and what was
summed against the old max is rescaled by exp(m_old - m_new)). Rewritten bottom up with identities that
are exact over the reals for finite values, such a term becomes the reduction over the concatenated blocks:

- max(max_k a, max_k b) = max_k concat(a, b);  max(x, -inf) = x;  max(x, finfo.min) = x (x finite)
- Σ_k a + Σ_k b = Σ_k concat(a, b);  dot(x1, y1) + dot(x2, y2) = dot(concat(x1, x2), concat(y1, y2)) along
  the contraction;  sums and differences as signed multisets (a - m + m - m' = a - m')
- (Σ_k a)·z = Σ_k a·z;  dot(x, y)·z = dot(x·z, y) when z varies only along x's kept dims;  0·x = 0 when x
  cannot overflow (a finite constant, or exp(c - y) with c the lowest finite value: the first rescaling)
- exp(a)·exp(b) = exp(a + b);  dot(a / z, y) = dot(a, y) / z when z is constant along the contraction
- blocks side by side are the tensor they are blocks of (`joins.py`), e.g. for a masked tensor
  concat(select(c, x[w1], f), x[w2], f) = select(concat(c, true), x[w1 ∪ w2], f)

Under a commutative reduction blocks may be put in any order; they are sorted by where they come from
(the offset of the slice they read), which puts a ring's rotated blocks back in sequence.

This is a fallback for outputs the ordinary proof leaves open; `block_equality.equal` compares an after
term with the reference's under this normal form.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any

from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.ops.elementwise import SHAPE_PRESERVING
from scalify_hlo.ops.reducers import is_identity
from scalify_hlo.terms import merge_parts, reduce_form, unroll
from scalify_hlo.terms.joins import Joins, as_broadcast, block_order, broadcast, is_constant
from scalify_hlo.terms.movement import slice_of_split
from scalify_hlo.terms.pushing import FOLD_LIMIT, constant_value, folded, push_slice
from scalify_hlo.terms.slicing import dynamic_as_slice, update_as_concatenate, window_along
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import AttrKey, Term, scalar_value

FUEL = 200_000  # rewrites per comparison, then the answer is "not proven"


class _OutOfFuel(Exception):
    pass


# Out of fuel or depth, or a shape this module does not expect: not proven (never a wrong "equal").
GAVE_UP = (_OutOfFuel, RecursionError, ValueError, IndexError, KeyError, TypeError)


# -- the normaliser ------------------------------------------------------------------------------------

Rule = Callable[[tuple[Term, ...], AttrKey, TensorType], "Term | None"]


class Normaliser(Joins):
    """Rewrites terms bottom up to the normal form of the module docstring (memoised per term)."""

    def __init__(self, terms: Terms, expired: Callable[[], bool] = lambda: False) -> None:
        self.terms = terms
        self.expired = expired  # the run's time limit: past it, the comparison gives up like out of fuel
        self._concats = {}
        self.memo: dict[int, Term] = {}
        self.compared: dict[tuple[int, int], bool] = {}  # (after, before) term ids -> shown equal
        # For localisation: concatenations that merging blocks left behind ("misplaced": slices of one
        # tensor that are not consecutive; "unscaled": blocks that differ otherwise, e.g. in their shift),
        # and the first pair of terms a comparison could not match.
        self.unjoined: dict[int, str] = {}
        self.overflowing: set[int] = set()  # exp(x - c), c the lowest finite value: inf
        self.first_failure: tuple[Term, Term] | None = None
        self._merging = 0
        self.fuel = FUEL
        self._params: dict[int, tuple[int, ...]] = {}
        self._params_seen: set[int] = set()  # the keys of `_params`, as `Term.walk` extends them
        self.rules: dict[str, Rule] = {
            "add": self._linear_rule("add"),
            "concatenate": self._concatenate,
            "dot_general": self._dot_general,
            "exponential": self._exponential,
            "maximum": self._maximum,
            "multiply": self._multiply,
            "slice": self._slice,
            "subtract": self._linear_rule("subtract"),
        }
        # Reductions over blocks, sums of slices, bool counts (`reduce_form`).
        linear_add = self.rules["add"]
        self.rules["add"] = lambda a, k, t: reduce_form.slice_sum(self.terms, a, t) or linear_add(a, k, t)
        self.rules["reduce"] = lambda a, k, t: reduce_form.reduce_rule(self.terms, a, k, t)
        self.rules["reduce_window"] = lambda a, k, t: reduce_form.unit_window(a, k)
        self.rules["dynamic_update_slice"] = lambda a, k, t: update_as_concatenate(self.terms, a, t)
        self.rules["dynamic_slice"] = lambda a, k, t: dynamic_as_slice(self.terms, a, t)
        self.rules["loop"] = lambda a, k, t: unroll.unrolled(self.terms, self.terms.mk("loop", a, k, t), self)
        self.rules["select"] = lambda a, k, t: (reduce_form.select_bool(self.terms, a, t) or (
            reduce_form.select_runs(self.terms, a, t) if any(merge_parts.reads_concat(v) for v in a[1:]) else None))
        self.rules["compare"] = lambda a, k, t: reduce_form.count_positive(self.terms, a, k, t)

    def __call__(self, t: Term) -> Term:
        hit = self.memo.get(t.id)
        if hit is not None:
            return hit
        self.tick()
        r = t
        if t.op == "iota" and t.type.size <= FOLD_LIMIT and (value := constant_value(t)) is not None:
            r = folded(self.terms, value, t.type)
        elif t.args:
            args = tuple(self(a) for a in t.args)
            r = self.rewrite(t.op, args, t.attrs, t.type)
            if r is not t:
                r = self(r)  # a memo hit when `r` was met before
        self.memo[t.id] = r
        self.memo[r.id] = r
        return r

    def make(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term:
        return self(self.terms.apply(op, args, attrs, type))

    def tick(self) -> None:
        self.fuel -= 1
        if self.fuel < 0 or (self.fuel % 1024 == 0 and self.expired()):
            raise _OutOfFuel

    def rewrite(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term:
        if op not in ("constant", "reduce") and type.size <= FOLD_LIMIT and all(is_constant(a) for a in args):
            t = self.terms.apply(op, args, attrs, type)
            value = constant_value(t)
            if value is not None:
                return folded(self.terms, value, type)
        # Reshapes go outermost first, so that an op's own rule (a linear form, a product) sees its
        # operands at the rank the reference computes them at.
        if op in SHAPE_PRESERVING and (out := reduce_form.sink_reshape(self.terms, self.make, op, args, attrs,
                                                                        type)) is not None:
            return out
        rule = self.rules.get(op)
        if rule is not None and (out := rule(args, attrs, type)) is not None:
            return out
        if op in SHAPE_PRESERVING and (out := self._sink_transpose(op, args, attrs, type)) is not None:
            return out
        return self.terms.apply(op, args, attrs, type)

    # -- slices -------------------------------------------------------------------------------------
    def _slice(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        """A slice of a cumulative reduction is the reduction of the rows it covers (`reduce_form`); a slice
        that reaches into a concatenation (a piece another device sent) or a select by a constant mask (rows
        a buffer was written with), or an elementwise op with a constant operand (whose slice folds) is
        moved inward."""
        (x,) = args
        a = dict(attrs)
        if any(s != 1 for s in a.get("strides") or ()):
            return None
        if (part := reduce_form.cumulative_slice(self.terms, x, a["start_indices"], a["limit_indices"])) is not None:
            return part
        if (part := slice_of_split(self.terms, x, tuple(a["start_indices"]), tuple(a["limit_indices"]))) is not None:
            return part
        if not merge_parts.reads_concat(x) and not (x.op == "select" and is_constant(x.args[0])) and not (
                x.op in SHAPE_PRESERVING and any(is_constant(a) and scalar_value(a) is None for a in x.args)):
            return None
        moved = push_slice(self.terms, x, tuple(a["start_indices"]), tuple(a["limit_indices"]))
        return None if moved.op == "slice" and moved.args == (x,) else moved

    # -- maximum -------------------------------------------------------------------------------------
    def _maximum(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        flat = [x for a in args for x in merge_parts.flatten(a, "maximum")]
        atoms = flat
        if type.dtype in merge_parts.LOWEST:
            # At or below the lowest finite value, a constant is the identity of max over finite values.
            low = [a for a in atoms if (c := scalar_value(a)) is not None and c <= merge_parts.LOWEST[type.dtype]]
            if low and len(low) < len(atoms):
                atoms = [a for a in atoms if a not in low]
        merged = self._merge_reductions(atoms, "max")
        if merged is None and len(atoms) == len(flat):
            return None
        atoms = merged if merged is not None else atoms
        unique = sorted({a.id: a for a in atoms}.values(), key=lambda a: a.id)
        out = unique[0]
        for a in unique[1:]:
            out = self.terms.apply("maximum", (out, a), (), type)
        return out

    def _merge_reductions(self, atoms: list[Term], reducer: str) -> list[Term] | None:
        """Reductions of same-shaped operands (but along the dim they are blocks of), merged into one
        reduction of their concatenation (blocks sorted by origin); None if there is nothing to merge."""
        grouped = merge_parts.groups(atoms, lambda a: (a.attrs, a.type, a.args[1].id) if merge_parts.reduction(a, reducer) else None)
        if grouped is None:
            return None
        out, groups = grouped
        changed = False
        for g in groups:
            d = merge_parts.split_dim(g)
            if d is None:
                out.extend(g)
                continue
            changed = True
            pieces = sorted((p for r in g for p in self._split(r.args[0], d)), key=lambda x: block_order(x, d))
            whole = self.merged(pieces, d)
            out.append(self.make("reduce", (whole, g[0].args[1]), g[0].attrs, g[0].type))
        return out if changed else None

    def reordered(self, t: Term) -> Term:
        """`t` with its reduction's blocks in order (`_reorder`); `t` itself when that changes nothing."""
        if t.op != "reduce" or len(t.args) != 2:
            return t
        return self._reorder(t.args, t.attrs, t.type) or t

    def _reorder(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        """A reduction over a concatenation along a reduced dim (blocks a permutation delivered, zeros
        where a device received none) is the reduction of its blocks in block order, the reducer's
        identity left out, where that leaves fewer blocks: the form merging the reductions of the blocks
        one by one builds."""
        x, init = args
        dims = tuple(dict(attrs)["dimensions"])
        reducer = reduce_form.exact_reducer(dict(attrs)["reducer"], init)
        if reducer is None or x.op != "concatenate" or int(x.attr("dimension")) not in dims:
            return None
        d = int(x.attr("dimension"))
        pieces = [p for p in x.args if not is_identity(scalar_value(p), reducer, type.dtype)]
        if not pieces:
            return self.terms.splat(float(scalar_value(init) or 0), type)
        pieces.sort(key=lambda p: block_order(p, d))
        whole = self.merged(pieces, d)
        if len(whole.args if whole.op == "concatenate" else (whole,)) >= len(x.args):
            return None
        return self.make("reduce", (whole, init), attrs, type)

    # -- sums ----------------------------------------------------------------------------------------
    def _linear_rule(self, op: str) -> Rule:
        def rule(args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
            if not merge_parts.is_float(type):
                return None
            form: dict[int, tuple[Term, int]] = {}
            signs = (1, -1) if op == "subtract" else (1, 1)
            for a, s in zip(args, signs, strict=True):
                for atom, c in self._linear(a).values():
                    merge_parts.accumulate(form, atom, s * c)
            atoms = [(t, c) for t, c in form.values() if c != 0]
            positive = [t for t, c in atoms if c > 0 for _ in range(c)]
            positive = reduce_form.merge_rows(self.terms, positive) or positive
            for kind in ("sum", "dot"):
                merged = self._merge_sums(positive, kind)
                if merged is not None:
                    positive = merged
            negative = [t for t, c in atoms if c < 0 for _ in range(-c)]
            return self._rebuild(positive, negative, type)
        return rule

    def _linear(self, t: Term) -> dict[int, tuple[Term, int]]:
        """`t` as a signed multiset of atoms (through add, subtract, x·(-1) and broadcasts of them)."""
        form: dict[int, tuple[Term, int]] = {}
        if scalar_value(t) == 0.0:
            return form
        if t.op in ("add", "subtract"):
            for a, s in zip(t.args, (1, -1) if t.op == "subtract" else (1, 1), strict=True):
                for atom, c in self._linear(a).values():
                    merge_parts.accumulate(form, atom, s * c)
            return form
        if t.op == "multiply" and scalar_value(t.args[1]) == -1.0:
            return {k: (atom, -c) for k, (atom, c) in self._linear(t.args[0]).items()}
        view = as_broadcast(t) if scalar_value(t) is None else None
        if view is not None and view[0].op in ("add", "subtract", "multiply"):
            inner = self._linear(view[0])
            if len(inner) > 1 or any(c != 1 for _, c in inner.values()):
                for atom, c in inner.values():
                    merge_parts.accumulate(form, broadcast(self, atom, view[1], t.type.shape), c)
                return form
        merge_parts.accumulate(form, t, 1)
        return form

    def _rebuild(self, positive: list[Term], negative: list[Term], type: TensorType) -> Term:
        def total(ts: list[Term]) -> Term | None:
            out: Term | None = None
            for a in sorted(ts, key=lambda a: a.id):
                out = a if out is None else self.terms.apply("add", (out, a), (), type)
            return out

        pos, neg = total(positive), total(negative)
        if pos is None and neg is None:
            return self.terms.splat(0.0, type)
        if neg is None:
            assert pos is not None
            return pos
        if pos is None:
            return self.terms.apply("multiply", (neg, self.terms.splat(-1.0, type)), (), type)
        return self.terms.apply("subtract", (pos, neg), (), type)

    def _merge_sums(self, atoms: list[Term], kind: str) -> list[Term] | None:
        if kind == "sum":
            return self._merge_reductions(atoms, "sum")
        def key(a: Term) -> tuple[Any, ...] | None:
            dims = a.attr("dot_dimension_numbers")
            if a.op == "dot_general" and isinstance(dims, DotDims) and len(dims.lhs_contract) == 1:
                return (a.attrs, a.type, a.args[0].type.rank, a.args[1].type.rank)
            return None

        grouped = merge_parts.groups(atoms, key)
        if grouped is None:
            return None
        out, groups = grouped
        for g in groups:
            dims = g[0].attr("dot_dimension_numbers")
            (cl,), (cr,) = dims.lhs_contract, dims.rhs_contract
            pairs = [p for d in g for p in self._dot_pieces(d, cl, cr)]
            pairs.sort(key=lambda p: min(block_order(p[0], cl), block_order(p[1], cr)))
            lhs = self.merged([p[0] for p in pairs], cl)
            rhs = self.merged([p[1] for p in pairs], cr)
            out.append(self.make("dot_general", (lhs, rhs), g[0].attrs, g[0].type))
        return out

    def _dot_pieces(self, d: Term, cl: int, cr: int) -> list[tuple[Term, Term]]:
        """dot(x, y) as the pairs of its blocks along the contraction, cut where either operand is a
        concatenation of blocks merged earlier (each pair then sorts on its own)."""
        x, y = d.args
        cuts = sorted(set(merge_parts.cuts(x, cl)) | set(merge_parts.cuts(y, cr)))
        if not cuts:
            return [(x, y)]
        bounds = [0, *cuts, x.type.shape[cl]]
        return [(self._window(x, cl, a, b), self._window(y, cr, a, b)) for a, b in pairwise(bounds)]

    def _split(self, x: Term, d: int) -> list[Term]:
        """`x` as its blocks along `d`, where it is a concatenation of blocks merged earlier."""
        cuts = merge_parts.cuts(x, d)
        bounds = [0, *cuts, x.type.shape[d]]
        return [self._window(x, d, a, b) for a, b in pairwise(bounds)] if cuts else [x]

    def _window(self, x: Term, d: int, a: int, b: int) -> Term:
        return self(push_slice(self.terms, x, *window_along(x.type.shape, d, a, b)))

    def _exponential(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        (e,) = args
        out = self.terms.apply("exponential", args, attrs, type)
        if e.op == "subtract" and scalar_value(e.args[0]) is None and type.dtype in merge_parts.LOWEST:
            c = scalar_value(e.args[1])
            if c is not None and c <= merge_parts.LOWEST[type.dtype]:
                self.overflowing.add(out.id)  # a running max's initial value subtracted the wrong way round
        return out

    def overflow_in(self, t: Term) -> bool:
        return any(s.id in self.overflowing for s in t.walk())

    # -- products ------------------------------------------------------------------------------------
    def _multiply(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        if not merge_parts.is_float(type):
            return None
        a, b = args
        for zero, x in ((a, b), (b, a)):
            if scalar_value(zero) == 0.0 and merge_parts.bounded(x):
                return self.terms.splat(0.0, type)
        ea, eb = merge_parts.exponent(self, a), merge_parts.exponent(self, b)
        if ea is not None and eb is not None:
            total = self.make("add", (ea, eb), (), type)
            return self.make("exponential", (total,), (), type)
        for r, z in ((a, b), (b, a)):
            if merge_parts.single_reduce(r, "sum") and scalar_value(z) is None:
                x = r.args[0]
                (dim,) = r.attr("dimensions")
                kept = tuple(j for j in range(x.type.rank) if j != dim)
                zb = self.make("broadcast_in_dim", (z,), (("broadcast_dimensions", kept),), x.type)
                inner = self.make("multiply", (x, zb), (), x.type)
                return self.make("reduce", (inner, r.args[1]), r.attrs, r.type)
        for dt, z in ((a, b), (b, a)):
            if dt.op == "dot_general" and as_broadcast(z) is not None and scalar_value(z) is None:
                pushed = self._into_dot(dt, z, "multiply")
                if pushed is not None:
                    return pushed
        return None

    def _into_dot(self, dt: Term, z: Term, op: str) -> Term | None:
        """dot(x, y) op bcast(z) = dot(x op bcast'(z), y) when z's dims are dims x keeps (batch or free)."""
        dims: DotDims = dt.attr("dot_dimension_numbers")
        x, y = dt.args
        nb = len(dims.lhs_batch)
        lfree = [j for j in range(x.type.rank) if j not in (*dims.lhs_batch, *dims.lhs_contract)]
        rfree = [j for j in range(y.type.rank) if j not in (*dims.rhs_batch, *dims.rhs_contract)]
        view = as_broadcast(z)
        assert view is not None
        zsrc, zdims = view
        for side, (operand, batch, free, first) in enumerate(((x, dims.lhs_batch, lfree, nb),
                                                              (y, dims.rhs_batch, rfree, nb + len(lfree)))):
            mapped: list[int] = []
            for r in zdims:
                if r < nb:
                    mapped.append(batch[r])
                elif first <= r < first + len(free):
                    mapped.append(free[r - first])
                else:
                    break
            else:
                if mapped != sorted(mapped):
                    continue
                zb = broadcast(self, zsrc, tuple(mapped), operand.type.shape)
                inner = self.make(op, (operand, zb), (), operand.type)
                pair = (inner, y) if side == 0 else (x, inner)
                return self.make("dot_general", pair, dt.attrs, dt.type)
        return None

    def _dot_general(self, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        dims = dict(attrs).get("dot_dimension_numbers")
        if not isinstance(dims, DotDims):
            return None
        x, y = args
        for side, q in enumerate(args):
            view = as_broadcast(q.args[1]) if q.op == "divide" and scalar_value(q.args[1]) is None else None
            if view is not None:
                mapped = self._divide_dims(dims, type, side, q, view[1])
                if mapped is not None:
                    pair = (q.args[0], y) if side == 0 else (x, q.args[0])
                    inner = self.make("dot_general", pair, attrs, type)
                    return self.make("divide", (inner, broadcast(self, view[0], mapped, type.shape)), (), type)
        if self._params_of(x) > self._params_of(y):
            # One orientation: the operand reading the earlier parameters on the left, the result transposed.
            swapped = DotDims(dims.rhs_batch, dims.lhs_batch, dims.rhs_contract, dims.lhs_contract)
            nb = len(dims.lhs_batch)
            nl = x.type.rank - nb - len(dims.lhs_contract)
            nr = y.type.rank - nb - len(dims.rhs_contract)
            shape = type.shape[:nb] + type.shape[nb + nl:] + type.shape[nb:nb + nl]
            inner = self.make("dot_general", (y, x), merge_parts.with_dims(attrs, swapped), TensorType(shape, type.dtype))
            perm = tuple(range(nb)) + tuple(nb + nr + j for j in range(nl)) + tuple(nb + j for j in range(nr))
            return self.make("transpose", (inner,), (("permutation", perm),), type)
        return None

    def _divide_dims(self, dims: DotDims, type: TensorType, side: int, q: Term, zdims: tuple[int, ...]
                     ) -> tuple[int, ...] | None:
        """For dot(a / bcast(z), y) = dot(a, y) / bcast'(z): where z's dims land in the result (None when z
        varies along the contraction)."""
        batch, contract = (dims.lhs_batch, dims.lhs_contract) if side == 0 else (dims.rhs_batch, dims.rhs_contract)
        nb = len(dims.lhs_batch)
        free = [j for j in range(q.type.rank) if j not in (*batch, *contract)]
        # the result is [batch, lhs free, rhs free]
        first = nb if side == 0 else type.rank - len(free)
        mapped: list[int] = []
        for j in zdims:
            if j in contract:
                return None
            mapped.append(batch.index(j) if j in batch else first + free.index(j))
        return tuple(mapped) if mapped == sorted(mapped) else None

    def _params_of(self, t: Term) -> tuple[int, ...]:
        """The parameter indices `t` reads, sorted. Built children first over the subterms not met before,
        so a chain of n dots costs n, not n^2."""
        params = self._params
        for s in t.walk(self._params_seen):
            if s.op == "param":
                params[s.id] = (int(s.attr("index")),)
            elif len(s.args) == 1:
                params[s.id] = params[s.args[0].id]
            else:
                parts = {params[a.id] for a in s.args}
                params[s.id] = parts.pop() if len(parts) == 1 else tuple(sorted(set().union(*parts)))
        return params[t.id]

    # -- movement ------------------------------------------------------------------------------------
    def _sink_transpose(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
        """op(transpose(x, p), bcast(z)) = transpose(op(x, bcast'(z)), p): transposes outermost."""
        moved = [a for a in args if a.op == "transpose"]
        if not moved or any(a.attrs != moved[0].attrs for a in moved):
            return None
        perm = tuple(moved[0].attr("permutation"))
        inner_shape = moved[0].args[0].type.shape
        inner: list[Term] = []
        for a in args:
            if a.op == "transpose":
                inner.append(a.args[0])
            elif (c := scalar_value(a)) is not None:
                inner.append(self.terms.splat(c, TensorType(inner_shape, a.type.dtype)))
            elif (view := as_broadcast(a)) is not None:
                mapped = tuple(perm[d] for d in view[1])
                if list(mapped) != sorted(mapped):
                    return None
                inner.append(self.terms.apply("broadcast_in_dim", (view[0],), (("broadcast_dimensions", mapped),),
                                              TensorType(inner_shape, a.type.dtype)))
            else:
                return None
        body = self.make(op, tuple(inner), attrs, TensorType(inner_shape, type.dtype))
        return self.make("transpose", (body,), (("permutation", perm),), type)
