"""The atoms the blockwise normal form (`blockwise.Normaliser`) merges: which reductions group together,
where a term is cut into blocks, which terms cannot overflow, and the signed multisets of sums."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.ops.elementwise import SHAPE_PRESERVING
from scalify_hlo.terms.joins import Joins, as_broadcast, block_order, broadcast, follow_dim
from scalify_hlo.terms.term import AttrKey, Term, scalar_value

LOWEST = {"f16": float(np.finfo(np.float16).min), "bf16": -3.3895313892515355e38,
          "f32": float(np.finfo(np.float32).min), "f64": float(np.finfo(np.float64).min)}


def groups(atoms: list[Term], key: Callable[[Term], tuple[Any, ...] | None]
           ) -> tuple[list[Term], list[list[Term]]] | None:
    """The atoms that share a key with another (to be merged), apart from the rest; None if none do."""
    by_key: dict[tuple[Any, ...], list[Term]] = {}
    for a in atoms:
        if (k := key(a)) is not None:
            by_key.setdefault(k, []).append(a)
    groups = [g for g in by_key.values() if len(g) >= 2]
    if not groups:
        return None
    merging = {a.id for g in groups for a in g}
    return [a for a in atoms if a.id not in merging], groups


def cuts(t: Term, dim: int) -> list[int]:
    """Where `t` is cut into concatenated blocks along `dim`: the inner boundaries of the first
    concatenation along that dim it is made of."""
    for s, k in follow_dim(t, dim):
        if s.op == "concatenate" and s.attr("dimension") == k:
            return [int(c) for c in np.cumsum([p.type.shape[k] for p in s.args])[:-1]]
    return []


def reads_concat(t: Term, depth: int = 8) -> bool:
    """Whether a concatenation is within `depth` ops of `t` (through ops a slice can move into)."""
    if t.op == "concatenate":
        return True
    if depth == 0 or not (t.op in SHAPE_PRESERVING or t.op in ("transpose", "broadcast_in_dim", "dot_general", "reshape")):
        return False
    return any(reads_concat(a, depth - 1) for a in t.args)


def bounded(t: Term) -> bool:
    """Whether `t` is finite whenever its inputs are: a finite constant, or exp(c - y) with c at or below
    the lowest finite value (the exponent is not positive; its exp cannot overflow). Only then is 0·t = 0:
    exp(y - c) overflows to inf, and 0·inf is NaN."""
    if (c := scalar_value(t)) is not None:
        return bool(np.isfinite(c))
    while (view := as_broadcast(t)) is not None:
        t = view[0]
    if t.op != "exponential" or t.args[0].op != "subtract":
        return False
    low = scalar_value(t.args[0].args[0])
    return low is not None and low <= LOWEST.get(t.type.dtype, -np.inf)


def exponent(n: Joins, t: Term) -> Term | None:
    """`e` when `t` is exp(e), or a broadcast of one (then `e` broadcast alike)."""
    if t.op == "exponential":
        return t.args[0]
    view = as_broadcast(t)
    if view is not None and view[0].op == "exponential":
        (e,) = view[0].args
        return broadcast(n, e, view[1], t.type.shape)
    return None


def with_dims(attrs: AttrKey, dims: DotDims) -> AttrKey:
    return tuple((k, dims if k == "dot_dimension_numbers" else v) for k, v in attrs)


def reduction(t: Term, reducer: str) -> bool:
    return t.op == "reduce" and len(t.args) == 2 and t.attr("reducer") == reducer


def single_reduce(t: Term, reducer: str) -> bool:
    return reduction(t, reducer) and len(t.attr("dimensions")) == 1


def split_dim(group: list[Term]) -> int | None:
    """The reduced dim along which the reductions' operands are blocks of one another: the only one for a
    reduction over one dim; over several (a psum of a sum over all dims), the one dim along which the
    blocks start at different rows (None when that is not exactly one dim)."""
    dims = tuple(group[0].attr("dimensions"))
    if len(dims) == 1:
        return dims[0]
    varying = [d for d in dims if len({block_order(r.args[0], d) for r in group}) > 1]
    if len(varying) != 1:
        return None
    (d,) = varying
    shapes = {tuple(n for k, n in enumerate(r.args[0].type.shape) if k != d) for r in group}
    return d if len(shapes) == 1 else None


def flatten(t: Term, op: str) -> list[Term]:
    return [x for a in t.args for x in flatten(a, op)] if t.op == op else [t]


def accumulate(form: dict[int, tuple[Term, int]], atom: Term, c: int) -> None:
    _, old = form.get(atom.id, (atom, 0))
    form[atom.id] = (atom, old + c)


def is_float(type: TensorType) -> bool:
    return type.dtype.startswith(("f", "bf"))
