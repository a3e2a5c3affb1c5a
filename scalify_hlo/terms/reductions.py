"""Normal forms of a reduce over dims that hold no data of their own: unit dims a reshape added, and dims a
broadcast added under `and`/`or`. (The blockwise normaliser, `blockwise.py`, owns the forms of
reductions over blocks.) Exact.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.reducers import Reducer, is_identity
from scalify_hlo.terms.movement import without_new_dims
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
    if _from_identity(a, init, type.dtype) is None:
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
    reducer = _from_identity(a, init, type.dtype)
    if reducer not in _IDEMPOTENT:
        return None
    dims = tuple(a.get("dimensions") or ())
    added = [d for d in dims if d not in x.attr("broadcast_dimensions")]
    if not added or any(x.type.shape[d] == 0 for d in added):  # (over no elements: the identity)
        return None
    narrow = without_new_dims(terms, x, added)
    at = {d: i for i, d in enumerate(d for d in range(x.type.rank) if d not in added)}
    rest = tuple(at[d] for d in dims if d not in added)
    if not rest:
        return narrow
    return terms.apply("reduce", (narrow, init), (("dimensions", rest), ("reducer", reducer.value)), type)


def over_identity_pad(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType
                      ) -> Term | None:
    """A reduce of a pad whose padding lies only along reduced dims and whose fill is the reduce's own
    initial value, its reducer's identity: the reduce of the pad's operand. XLA pads a dim a mesh axis does
    not divide (30 over 4 devices as 4 blocks of 8) and reduces the padded blocks. Exact: the fill is folded
    in once already, and folding in the identity again changes nothing (not even the sign of a zero, as the
    fill and the initial value must have the same one)."""
    if len(args) != 2 or args[0].op != "pad":
        return None
    (x, fill), init = args[0].args, args[1]
    if _from_identity(a, init, type.dtype) is None:
        return None
    v, w = scalar_value(fill), scalar_value(init)
    if v is None or w is None or v != w or math.copysign(1, v) != math.copysign(1, w):
        return None
    pad = args[0]
    pads = list(zip(pad.attr("edge_padding_low"), pad.attr("edge_padding_high"), pad.attr("interior_padding"),
                    strict=True))
    if any(p < 0 for ps in pads for p in ps):
        return None
    if not {d for d, ps in enumerate(pads) if any(ps)} <= set(a.get("dimensions") or ()):
        return None
    return terms.apply("reduce", (x, init), tuple(sorted(a.items())), type)


def _from_identity(a: dict[str, Any], init: Term, dtype: str) -> Reducer | None:
    """The reduce's reducer, where it starts from that reducer's identity; else None."""
    try:
        reducer = Reducer(a.get("reducer"))
    except ValueError:
        return None
    return reducer if is_identity(scalar_value(init), reducer, dtype) else None
