"""Integer ranges of terms, and the canonicalisations they justify.

A token id is in `[0, vocab)` because the user says so (`--assume ids=0:32000`): JAX's `table[ids]`
promises in-bounds indices, and a vocab-parallel lookup is only equal to it for those. An index is in
`[0, 31]` because it went through `clamp(0, ·, 31)`. Knowing ranges, some comparisons are decided
(`ids < 0` is false), so `where(ids < 0, ids + vocab, ids)` is `ids`, and a clamp to bounds a value
already lies in is the value. Every rewrite here is exact for the inputs the assumptions admit; the
report states the assumptions with the verdict.

Intervals are inclusive `(lo, hi)` over the integers, computed only where the program's integer
arithmetic cannot wrap around (the interval must fit the element type).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.nodes import GatherDims, Literal, TensorType
from scalify_hlo.terms.term import scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms
    from scalify_hlo.terms.term import Term

Interval = tuple[int, int]

_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64, "ui8": 8, "ui16": 16, "ui32": 32, "ui64": 64}
_MOVEMENT = frozenset({"broadcast_in_dim", "reshape", "transpose", "slice", "reverse", "dynamic_slice", "gather",
                       "copy", "tile"})


def dtype_bounds(dtype: str) -> Interval | None:
    bits = _BITS.get(dtype)
    if bits is None:
        return None
    if dtype.startswith("ui"):
        return 0, (1 << bits) - 1
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _fits(iv: Interval | None, dtype: str) -> Interval | None:
    bounds = dtype_bounds(dtype)
    if iv is None or bounds is None or iv[0] < bounds[0] or iv[1] > bounds[1]:
        return None
    return iv


def _hull(a: Interval | None, b: Interval | None) -> Interval | None:
    if a is None or b is None:
        return None
    return min(a[0], b[0]), max(a[1], b[1])


_DEPTH = 64  # integer index arithmetic is shallow; deeper chains are simply not analysed


def interval(terms: Terms, t: Term, depth: int = 0) -> Interval | None:
    """The values `t` can take (for the assumed inputs), or None when not known."""
    if t.id in terms.intervals:
        return terms.intervals[t.id]
    if depth > _DEPTH:
        return None
    out = _fits(_compute(terms, t, depth + 1), t.type.dtype)
    terms.intervals[t.id] = out
    return out


def _compute(terms: Terms, t: Term, depth: int) -> Interval | None:
    if dtype_bounds(t.type.dtype) is None:
        return None
    op, args = t.op, t.args
    if op == "constant":
        lit: Literal = t.attr("value")
        if lit.array.size == 0:
            return None
        return int(lit.array.min()), int(lit.array.max())
    if op == "iota":
        return 0, max(t.type.shape[t.attr("iota_dimension")] - 1, 0)
    if op == "top_k" and t.attr("index") == 1:  # positions along the last dim of the operand
        return 0, max(args[0].type.shape[-1] - 1, 0)
    if op in _MOVEMENT:
        return interval(terms, args[0], depth)
    if op == "concatenate":
        ivs = [interval(terms, a, depth) for a in args]
        out = ivs[0]
        for iv in ivs[1:]:
            out = _hull(out, iv)
        return out
    if op == "convert":
        return interval(terms, args[0], depth) if dtype_bounds(args[0].type.dtype) is not None else None
    ivs = [interval(terms, a, depth) for a in args]
    if op == "select":
        return _hull(ivs[1], ivs[2])
    if op == "clamp" and (lo := ivs[0]) is not None and (hi := ivs[2]) is not None:
        # min(max(x, lo), hi) lies in [min(lo, hi), hi] whatever x is
        x = ivs[1]
        if x is None:
            return min(lo[0], hi[0]), hi[1]
        m = max(x[0], lo[0]), max(x[1], lo[1])
        return min(m[0], hi[0]), min(m[1], hi[1])
    if not ivs or any(iv is None for iv in ivs):
        return None
    a = ivs[0]
    assert a is not None
    if op == "negate":
        return -a[1], -a[0]
    if len(ivs) != 2:
        return None
    b = ivs[1]
    assert b is not None
    if op == "add":
        return a[0] + b[0], a[1] + b[1]
    if op == "subtract":
        return a[0] - b[1], a[1] - b[0]
    if op == "multiply":
        corners = [x * y for x in a for y in b]
        return min(corners), max(corners)
    if op == "maximum":
        return max(a[0], b[0]), max(a[1], b[1])
    if op == "minimum":
        return min(a[0], b[0]), min(a[1], b[1])
    return None


def decide(direction: str, a: Interval, b: Interval) -> bool | None:
    """`x <direction> y` for every x in a and y in b (True/False), or None when it depends."""
    lt_always, ge_always = a[1] < b[0], a[0] >= b[1]
    gt_always, le_always = a[0] > b[1], a[1] <= b[0]
    table: dict[str, tuple[bool, bool]] = {
        "LT": (lt_always, ge_always), "GE": (ge_always, lt_always),
        "GT": (gt_always, le_always), "LE": (le_always, gt_always),
        "EQ": (a[0] == a[1] == b[0] == b[1], a[1] < b[0] or b[1] < a[0]),
        "NE": (a[1] < b[0] or b[1] < a[0], a[0] == a[1] == b[0] == b[1]),
    }
    if direction not in table:
        return None
    yes, no = table[direction]
    return True if yes else False if no else None


def bool_value(t: Term) -> bool | None:
    """The value of a splat boolean constant."""
    v = scalar_value(t) if t.type.dtype == "i1" else None
    return None if v is None else bool(v)


def fold_compare(terms: Terms, args: tuple[Term, ...], direction: str, type: TensorType) -> Term | None:
    if dtype_bounds(args[0].type.dtype) is None or args[0].type.dtype.startswith("ui"):
        return None
    a, b = interval(terms, args[0]), interval(terms, args[1])
    if a is None or b is None:
        return None
    decided = decide(direction, a, b)
    return None if decided is None else terms.splat(float(decided), type)


def fold_clamp(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """clamp(lo, x, hi) is x when x already lies in [lo, hi]."""
    lo, x, hi = (interval(terms, a) for a in args)
    if lo is None or x is None or hi is None or args[1].type != type:
        return None
    return args[1] if lo[1] <= x[0] and x[1] <= hi[0] else None


def fold_logic(terms: Terms, op: str, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """and/or with a constant operand: x ∧ true = x, x ∧ false = false (and dually)."""
    if type.dtype != "i1" or len(args) != 2:
        return None
    absorbing = op == "or"  # true absorbs under or, false under and
    for side in (0, 1):
        v = bool_value(args[side])
        other = args[1 - side]
        if v is None:
            continue
        if v == absorbing:
            return terms.splat(float(v), type)
        if other.type == type:
            return other
    return None


def fold_reduce_logic(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    """and/or-reducing a splat boolean gives that boolean (with the identity as init)."""
    reducer = a.get("reducer")
    if reducer not in ("and", "or") or len(args) != 2 or type.dtype != "i1":
        return None
    x, init = bool_value(args[0]), bool_value(args[1])
    identity = reducer == "and"
    if x is None or init is not identity or args[0].type.size == 0:
        return None  # (reducing nothing gives the init, whatever the splat)
    return terms.splat(float(x), type)


def strip_index_clamp(terms: Terms, t: Term, hi: int) -> Term | None:
    """`t` without a clamp to [0, hi] (looking through movement ops), else None. A gather clamps its
    start index into the operand itself, so clamping it to exactly those bounds first changes nothing."""
    if t.op == "clamp" and scalar_value(t.args[0]) == 0 and scalar_value(t.args[2]) == hi:
        return t.args[1]
    if t.op in ("reshape", "broadcast_in_dim", "transpose"):
        inner = strip_index_clamp(terms, t.args[0], hi)
        if inner is not None:
            return terms.apply(t.op, (inner,), t.attrs, t.type)
    return None


def gather_past_pad(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    """gather(pad(y), idx) where the padding lies past the end of indexed dims only, and every start index
    provably stays where the slice lies within `y`: gather(y, idx). XLA pads a table a mesh axis does not
    divide (50 rows as 4 blocks of 13) and gathers from the padded block with the index clamped to the
    real rows. Exact (no start index is clamped in either gather, and the slices read only `y`)."""
    operand, idx = args
    g, sizes = a.get("dimension_numbers"), a.get("slice_sizes")
    if operand.op != "pad" or not isinstance(g, GatherDims) or sizes is None:
        return None
    y = operand.args[0]
    low, high = operand.attr("edge_padding_low"), operand.attr("edge_padding_high")
    if any(low) or any(operand.attr("interior_padding")) or any(h < 0 for h in high):
        return None
    padded = [d for d, h in enumerate(high) if h]
    if not padded or any(d not in g.start_index_map for d in padded):
        return None
    iv = interval(terms, idx)
    if iv is None or iv[0] < 0 or any(iv[1] > y.type.shape[d] - sizes[d] for d in padded):
        return None
    return terms.apply("gather", (y, idx), tuple(a.items()), type)


def fold_gather_clamp(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    operand, idx = args
    g, sizes = a.get("dimension_numbers"), a.get("slice_sizes")
    if not isinstance(g, GatherDims) or sizes is None or len(g.start_index_map) != 1:
        return None
    if g.index_vector_dim < idx.type.rank and idx.type.shape[g.index_vector_dim] != 1:
        return None
    d = g.start_index_map[0]
    stripped = strip_index_clamp(terms, idx, operand.type.shape[d] - sizes[d])
    if stripped is None:
        return None
    return terms.apply("gather", (operand, stripped), tuple(a.items()), type)
