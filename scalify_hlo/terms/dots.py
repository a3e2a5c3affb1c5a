"""Canonical forms of dot products: how XLA's dot passes rewrite a dot and what it was are one term.

`dot` (StableHLO's matrix product) is a `dot_general`; a transposed operand folds into the dimension
numbers (transpose folding); unit batch dims become free dims (batch-dot-simplification); in plain
equivalence (`Terms.dot_views`), reshapes of the operands that merge or split free dims, or merge paired
contracted dims alike on both sides, move outside the dot (the dot decomposer); a slice of a free dim
moves outside (`slicing.pull_dot`). Exact.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.terms import precision, slicing
from scalify_hlo.terms.movement import reshape_groups, without_new_dims
from scalify_hlo.terms.term import Term, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms


def dot(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """`dot(x, y)` contracts x's last dim with y's first."""
    dims = DotDims((), (), (args[0].type.rank - 1,), (0,))
    return terms.apply("dot_general", args, (("dot_dimension_numbers", dims),), type)


def dot_general(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return (precision.unwidened(terms, "dot_general", args, tuple(a.items()), type)
            or _fold_operand_transposes(terms, args, a, type) or _broadcasts_out_of_dot(terms, args, a, type)
            or _reshapes_out_of_dot(terms, args, a, type) or slicing.pull_dot(terms, args, a, type)
            or _zero_pads_out_of_dot(terms, args, a, type))


def _zero_pads_out_of_dot(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                          ) -> Term | None:
    """dot(x, pad(y, 0)): XLA pads a dim a mesh axis does not divide (30 as 4 blocks of 8) and multiplies
    the padded blocks. Padding along a free dim adds result entries that are sums of products with zero,
    so the dot of `y` is padded instead; padding along a contracted dim adds products with zero to every
    sum, so the other operand is cut to the rows `y` pairs with. Exact over the reals (finite values)."""
    dims = a.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims):
        return None
    for side in (0, 1):
        p = args[side]
        if p.op != "pad" or scalar_value(p.args[1]) != 0 or p.type.dtype != type.dtype:
            continue
        low, high = p.attr("edge_padding_low"), p.attr("edge_padding_high")
        if any(p.attr("interior_padding")) or any(v < 0 for v in (*low, *high)):
            continue
        batch, contract = (dims.lhs_batch, dims.lhs_contract) if side == 0 else (dims.rhs_batch, dims.rhs_contract)
        padded = [d for d in range(p.type.rank) if low[d] or high[d]]
        if any(d in batch for d in padded):
            continue
        y = p.args[0]
        other = args[1 - side]
        ocontract = dims.rhs_contract if side == 0 else dims.lhs_contract
        lo, hi = [0] * other.type.rank, list(other.type.shape)
        for d in padded:
            if d in contract:
                k = ocontract[contract.index(d)]
                lo[k], hi[k] = low[d], low[d] + y.type.shape[d]
        cut = slicing.slice_of(terms, other, tuple(lo), tuple(hi))
        operands = (y, cut) if side == 0 else (cut, y)
        # result dims: batch, lhs free, rhs free
        lfree = [i for i in range(args[0].type.rank) if i not in (*dims.lhs_batch, *dims.lhs_contract)]
        rfree = [i for i in range(args[1].type.rank) if i not in (*dims.rhs_batch, *dims.rhs_contract)]
        free, offset = (lfree, len(dims.lhs_batch)) if side == 0 else (rfree, len(dims.lhs_batch) + len(lfree))
        out_low, out_high = [0] * type.rank, [0] * type.rank
        for d in padded:
            if d not in contract:
                j = offset + free.index(d)
                out_low[j], out_high[j] = low[d], high[d]
        shape = tuple(n - lo_ - hi_ for n, lo_, hi_ in zip(type.shape, out_low, out_high, strict=True))
        inner = terms.apply("dot_general", operands, tuple(a.items()), TensorType(shape, type.dtype))
        if not any((*out_low, *out_high)):
            return inner
        return terms.apply("pad", (inner, p.args[1]), (("edge_padding_high", tuple(out_high)),
                                                         ("edge_padding_low", tuple(out_low)),
                                                         ("interior_padding", (0,) * type.rank)), type)
    return None


def _broadcasts_out_of_dot(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                           ) -> Term | None:
    """dot(x, broadcast(y)) where the broadcast adds free dims of the dot: the dot without them, broadcast
    along them (every slice along such a dim is the same sum of products). XLA's simplifier computes the
    gradient of a mean-reduced loss, a dot with a broadcast scalar, at width one and broadcasts after."""
    dims = a.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims):
        return None
    sides = [(dims.lhs_batch, dims.lhs_contract), (dims.rhs_batch, dims.rhs_contract)]
    drops: list[set[int]] = []
    for t, (batch, contract) in zip(args, sides, strict=True):
        added = set(range(t.type.rank)) - set(t.attr("broadcast_dimensions")) if t.op == "broadcast_in_dim" else set()
        drops.append(added - set(batch) - set(contract))
    if not any(drops):
        return None
    narrow = tuple(without_new_dims(terms, t, drop) if drop else t for t, drop in zip(args, drops, strict=True))
    lm, rm = ({d: i for i, d in enumerate(k for k in range(t.type.rank) if k not in drop)}
              for t, drop in zip(args, drops, strict=True))
    new = DotDims(tuple(lm[d] for d in dims.lhs_batch), tuple(rm[d] for d in dims.rhs_batch),
                  tuple(lm[d] for d in dims.lhs_contract), tuple(rm[d] for d in dims.rhs_contract))
    # Result dims: batch, lhs free, rhs free (in order); those of dropped dims are broadcast back.
    lfree = [d for d in range(args[0].type.rank) if d not in (*dims.lhs_batch, *dims.lhs_contract)]
    rfree = [d for d in range(args[1].type.rank) if d not in (*dims.rhs_batch, *dims.rhs_contract)]
    out_kept = [*range(len(dims.lhs_batch)),
                *(len(dims.lhs_batch) + i for i, d in enumerate(lfree) if d not in drops[0]),
                *(len(dims.lhs_batch) + len(lfree) + i for i, d in enumerate(rfree) if d not in drops[1])]
    attrs = tuple((k, new if k == "dot_dimension_numbers" else v) for k, v in a.items())
    inner = terms.apply("dot_general", narrow, attrs,
                        TensorType(tuple(type.shape[i] for i in out_kept), type.dtype))
    return terms.apply("broadcast_in_dim", (inner,), (("broadcast_dimensions", tuple(out_kept)),), type)


def _fold_operand_transposes(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                             ) -> Term | None:
    """dot(x, transpose(y)) is dot(x, y) with y's dims renumbered (XLA's transpose folding writes it so),
    the result transposed where the transpose reordered y's free dims: transposes outermost."""
    dims = a.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims) or not any(x.op == "transpose" for x in args):
        return None
    sides = [[dims.lhs_batch, dims.lhs_contract], [dims.rhs_batch, dims.rhs_contract]]
    operands = list(args)
    order: list[list[int]] = [[], []]  # per side: the new rank, among its free dims, of each old free dim
    for side, x in enumerate(args):
        batch, contract = sides[side]
        free = [i for i in range(x.type.rank) if i not in (*batch, *contract)]
        order[side] = list(range(len(free)))
        if x.op != "transpose":
            continue
        perm = tuple(x.attr("permutation"))
        moved = [perm[i] for i in free]
        order[side] = [sorted(moved).index(d) for d in moved]
        sides[side] = [tuple(perm[i] for i in batch), tuple(perm[i] for i in contract)]
        operands[side] = x.args[0]
    new = DotDims(sides[0][0], sides[1][0], sides[0][1], sides[1][1])
    attrs = tuple((k, new if k == "dot_dimension_numbers" else v) for k, v in a.items())
    nb, nl = len(new.lhs_batch), len(order[0])
    # result dim j of the written dot is dim q[j] of the folded one
    q = (*range(nb), *(nb + r for r in order[0]), *(nb + nl + r for r in order[1]))
    if q == tuple(range(type.rank)):
        return terms.apply("dot_general", (operands[0], operands[1]), attrs, type)
    inner_shape = [0] * type.rank
    for j, src in enumerate(q):
        inner_shape[src] = type.shape[j]
    inner = terms.apply("dot_general", (operands[0], operands[1]), attrs, TensorType(tuple(inner_shape), type.dtype))
    return terms.apply("transpose", (inner,), (("permutation", q),), type)


def _reshapes_out_of_dot(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                         ) -> Term | None:
    """A batch or contracted pair of unit dims is a pair of free dims, the dot reshaped (what
    batch-dot-simplification writes). Over each view of the operands (`_dot_views`), a view as reshape(x)
    lets a reshape that merges or splits free dims, or merges paired contracted dims alike on both sides,
    move outside (the dot decomposer's matrix product between reshapes)."""
    dims = a.get("dot_dimension_numbers")
    if not isinstance(dims, DotDims):
        return None
    # A unit pair is a pair of free unit dims (a sum of one product); a contracted one only beside another
    # contracted pair (a block of one row of a blocked contraction stays a contraction, as written).
    lhs = args[0].type.shape
    summed = any(lhs[d] != 1 for d in dims.lhs_contract)
    units = any(lhs[d] == 1 for d in dims.lhs_batch) or (summed and any(lhs[d] == 1 for d in dims.lhs_contract))
    for (x, mx), (y, my) in itertools.product(_dot_views(terms, args[0]), _dot_views(terms, args[1])):
        if x is args[0] and y is args[1] and not units:
            continue
        pairs: list[list[tuple[int, int]]] = [[], []]  # batch, contracted: (x dim, y dim)
        for k, (ls, rs) in enumerate(((dims.lhs_batch, dims.rhs_batch), (dims.lhs_contract, dims.rhs_contract))):
            for dl, dr in zip(ls, rs, strict=True):
                if lhs[dl] == 1 and (k == 0 or summed):
                    continue
                gl, gr = mx.get(dl), my.get(dr)
                if gl is None or gr is None or [x.type.shape[d] for d in gl] != [y.type.shape[d] for d in gr]:
                    break
                pairs[k].extend(zip(gl, gr, strict=True))
            else:
                continue
            break
        else:
            new = DotDims(tuple(p for p, _ in pairs[0]), tuple(q for _, q in pairs[0]),
                          tuple(p for p, _ in pairs[1]), tuple(q for _, q in pairs[1]))
            lfree = [d for d in range(x.type.rank) if d not in (*new.lhs_batch, *new.lhs_contract)]
            rfree = [d for d in range(y.type.rank) if d not in (*new.rhs_batch, *new.rhs_contract)]
            shape = (*(x.type.shape[d] for d in new.lhs_batch), *(x.type.shape[d] for d in lfree),
                     *(y.type.shape[d] for d in rfree))
            attrs = tuple((k, new if k == "dot_dimension_numbers" else v) for k, v in a.items())
            inner = terms.apply("dot_general", (x, y), attrs, TensorType(shape, type.dtype))
            return terms.apply("reshape", (inner,), (), type)
    return None


def _dot_views(terms: Terms, r: Term) -> list[tuple[Term, dict[int, tuple[int, ...]]]]:
    """The ways to read a dot operand `r` as reshape(x): (x, r dim -> the x dims it is made of), for the
    dims made of whole x dims; `r` itself last. Only with `terms.dot_views` (plain equivalence, where no
    layout is read off the terms): under a layout derivation, the 405B train step under `lax.scan` lost a
    layout with them (a reshape's reading chosen by the reference's terms)."""
    views = []
    for x in _reshaped_from(terms, r) if terms.dot_views else ():
        groups = reshape_groups(x.type.shape, r.type.shape)
        if groups is not None:
            views.append((x, {rs[0]: tuple(xs) for xs, rs in groups if len(rs) == 1}))
    views.append((r, {d: (d,) for d in range(r.type.rank)}))
    return views


def _reshaped_from(terms: Terms, r: Term) -> Iterator[Term]:
    """Each `x` with `r = reshape(x)` in view: a reshape's operand, or for a join of reshapes (the normal
    form of a reshaped join, `movement.reshape_outward`) each join of their operands that reshapes to it
    (along a unit dim or beside it: both can be)."""
    if r.op == "reshape":
        yield r.args[0]
        return
    if r.op != "concatenate" or any(p.op != "reshape" for p in r.args):
        return
    pieces = tuple(p.args[0] for p in r.args)
    first = pieces[0].type.shape
    if any(p.type.rank != len(first) for p in pieces):
        return
    for d in reversed(range(len(first))):
        if any(p.type.shape[:d] + p.type.shape[d + 1:] != first[:d] + first[d + 1:] for p in pieces):
            continue
        shape = tuple(sum(p.type.shape[d] for p in pieces) if k == d else n for k, n in enumerate(first))
        joined = terms.apply("concatenate", pieces, (("dimension", d),), TensorType(shape, r.type.dtype))
        if terms.apply("reshape", (joined,), (), r.type) is r:  # the canonical form says it is the same value
            yield joined
