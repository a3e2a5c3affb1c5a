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

- `select(p, 1, 0)` is `convert(p)` (a bool converted is 1 or 0);
- `sum(convert(b)) > 0` (or `!= 0`) over bools is `any(b)`, when the count cannot overflow.

All are exact (sums over the reals, as everywhere in the blockwise normal form).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.reducers import Reducer, is_identity
from scalify_hlo.terms.movement import Chain
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
