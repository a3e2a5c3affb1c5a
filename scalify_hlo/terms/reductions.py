"""Normal forms of a reduce over dims that hold no data of their own: unit dims a reshape added, and dims a
broadcast added under `and`/`or`. (The blockwise normaliser, `blockwise.py`, owns the forms of
reductions over blocks.) Exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.reducers import Reducer, is_identity
from scalify_hlo.terms.term import Term, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms


def added_units(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                ) -> Term | None:
    """A reduce, from its reducer's identity, over only unit dims a reshape added is that reshape's
    operand, reshaped (XLA's simplifier drops it so). Only there: a unit block of a blocked reduction stays
    a reduce, the form the blockwise normaliser merges."""
    if len(args) != 2:
        return None
    x, init = args
    dims = tuple(a.get("dimensions") or ())
    if x.op != "reshape" or not dims or any(x.type.shape[d] != 1 for d in dims):
        return None
    try:
        reducer = Reducer(a.get("reducer"))
    except ValueError:
        return None
    if not is_identity(scalar_value(init), reducer, type.dtype):
        return None
    return terms.apply("reshape", (x,), (), type)


# max and min are idempotent too, but a running maximum over broadcast blocks is the form the blockwise
# normaliser merges (ring attention's online softmax): left to it.
_IDEMPOTENT = (Reducer.AND, Reducer.OR)


def over_broadcast(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """An idempotent logical reduction (and, or from its identity) over dims a broadcast adds: those dims
    drop out (`all(isfinite(tile(g)))` is `all(isfinite(g))`). Exact."""
    if len(args) != 2 or args[0].op != "broadcast_in_dim":
        return None
    x, init = args
    try:
        reducer = Reducer(a.get("reducer"))
    except ValueError:
        return None
    if reducer not in _IDEMPOTENT or not is_identity(scalar_value(init), reducer, type.dtype):
        return None
    dims = tuple(a.get("dimensions") or ())
    added = [d for d in dims if d not in x.attr("broadcast_dimensions")]
    if not added or any(x.type.shape[d] == 0 for d in added):  # (over no elements: the identity)
        return None
    keep = [d for d in range(x.type.rank) if d not in added]
    at = {d: i for i, d in enumerate(keep)}
    kept = tuple(at[d] for d in x.attr("broadcast_dimensions"))
    narrow = terms.apply("broadcast_in_dim", x.args, (("broadcast_dimensions", kept),),
                         TensorType(tuple(x.type.shape[d] for d in keep), x.type.dtype))
    rest = tuple(at[d] for d in dims if d not in added)
    if not rest:
        return narrow
    return terms.apply("reduce", (narrow, init), (("dimensions", rest), ("reducer", reducer.value)), type)
