"""Reducers: the associative ops a reduction or an all-reduce combines values with, in one table.

A reduction body that applies one of these ops to its two arguments is that reducer (`reducer_of`);
anything else is a general body. The table says, per reducer, the elementwise op that combines two
values, the name of the collective JAX users know it by, and (`identity`) the value it starts from.
The other bodies read here by their dataflow: JAX's argmax/argmin comparator of (value, index) pairs,
and the comparator of XLA's TopK custom call.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import ml_dtypes
import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import Attrs, AttrValue, Literal, Op, Region, TensorType, TupleType, Value


class Reducer(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    PROD = "prod"
    AND = "and"
    OR = "or"


# reducer → (the elementwise op combining two values, the collective's name in JAX)
REDUCERS: dict[Reducer, tuple[str, str]] = {
    Reducer.SUM: ("add", "psum"),
    Reducer.MAX: ("maximum", "pmax"),
    Reducer.MIN: ("minimum", "pmin"),
    Reducer.PROD: ("multiply", "pprod"),
    Reducer.AND: ("and", "pand"),
    Reducer.OR: ("or", "por"),
}
OP_OF_REDUCER = {r: op for r, (op, _) in REDUCERS.items()}
REDUCER_OF_OP = {op: r for r, op in OP_OF_REDUCER.items()}
COLLECTIVE_NAME = {r: name for r, (_, name) in REDUCERS.items()}


def identity(reducer: Reducer, dtype: str | np.dtype[Any]) -> int | float:
    """The value that leaves `reducer` unchanged in `dtype`: an integer max starts at the type's least
    value (not -inf), a boolean max at false."""
    if reducer in (Reducer.SUM, Reducer.OR):
        return 0
    if reducer in (Reducer.PROD, Reducer.AND):
        return 1
    nd = numpy_dtype(dtype) if isinstance(dtype, str) else dtype
    if nd.kind in "iu":
        info = np.iinfo(nd)
        return int(info.min) if reducer is Reducer.MAX else int(info.max)
    if nd.kind == "b":
        return 0 if reducer is Reducer.MAX else 1
    return float("-inf") if reducer is Reducer.MAX else float("inf")


def is_identity(value: float | int | None, reducer: Reducer, dtype: str) -> bool:
    """Whether the scalar `value` is `reducer`'s identity in `dtype` (False for an unknown value or a
    dtype NumPy cannot hold)."""
    if value is None:
        return False
    try:
        return bool(value == identity(reducer, dtype))
    except ValueError:
        return False


# Whether a reduction body that rounds its accumulator to a narrower float at each step (XLA's float
# normalization: an f32 max rounded to bf16) is read as its reducer: only where roundings XLA may drop are
# read away (`--excess-precision`, the default of `passes`), set for a run by `rounding_reducers`.
_ROUNDING: ContextVar[bool] = ContextVar("scalify_hlo_rounding_reducers", default=False)


@contextmanager
def rounding_reducers(allowed: bool) -> Iterator[None]:
    token = _ROUNDING.set(allowed)
    try:
        yield
    finally:
        _ROUNDING.reset(token)


def reducer_of(region: Region) -> Reducer | None:
    """The reducer of a two-argument region that applies one associative op to its arguments; also where
    sharding constraints or float converts stand around the op (a bf16 reduction computed in f32). A convert
    that rounds to a type narrower than the arguments' (an f32 reduction rounded to bf16 at each step) is
    another computation, None as for any other body, unless roundings are read away (`rounding_reducers`)."""
    if len(region.args) != 2 or len(region.results) != 1:
        return None
    defs = {r: op for op in region.ops for r in op.results}
    used: set[int] = set()

    def through_converts(v: Value) -> Value:
        # (and identities: the sharding constraint a partially manual shard_map's psum body carries, a copy in HLO)
        while (op := defs.get(v)) is not None and (op.opcode in ("sharding_constraint", "copy") or (
                op.opcode == "convert" and _is_float(v) and _is_float(op.operands[0]))):
            used.add(id(op))
            v = op.operands[0]
        return v

    core = defs.get(through_converts(region.results[0]))
    if core is None or len(core.operands) != 2 or len(core.results) != 1:
        return None
    used.add(id(core))
    sources = [through_converts(v) for v in core.operands]
    if set(sources) != set(region.args) or len(used) != len(region.ops):
        return None  # another op in the body, or the op not applied to both arguments
    if len(region.ops) > 1 and not all(_is_float(v) for v in (*region.args, *core.results)):
        return None
    own = region.args[0].type
    for op in () if _ROUNDING.get() else region.ops:
        if op.opcode == "convert" and isinstance(own, TensorType) and op.result.tensor.dtype != own.dtype \
                and not _holds_every(op.result.tensor.dtype, own.dtype):
            return None
    return REDUCER_OF_OP.get(core.opcode)


def _holds_every(wide: str, narrow: str) -> bool:
    """Whether float type `wide` represents every value of `narrow` (no rounding converting to it)."""
    try:
        w, n = ml_dtypes.finfo(numpy_dtype(wide)), ml_dtypes.finfo(numpy_dtype(narrow))
    except ValueError:
        return False
    return bool(w.nmant >= n.nmant and w.maxexp >= n.maxexp and w.minexp <= n.minexp)


def _is_float(v: Value) -> bool:
    return isinstance(v.type, TensorType) and v.type.dtype.startswith(("f", "bf"))


# ------------------------------------------------------------------------------ argmax / argmin bodies
# `jnp.argmax` / `jnp.argmin` reduce the values and an iota of indices together with JAX's comparator
# (`lax._compute_argminmax`): pick the operand's value if it is better or NaN, its index if its value was
# picked or ties with a smaller index. The body is recognised by its dataflow, whatever the op order and
# however the parser spells it (the reference's StableHLO and XLA's HLO list its ops in different orders).

ARG_REDUCERS = ("argmax", "argmin")
_BETTER = {"argmax": "GT", "argmin": "LT"}
# Compare types that are the IEEE / integer comparison (TOTALORDER orders NaNs and -0: another body).
_PLAIN_COMPARE = frozenset({None, "FLOAT", "SIGNED", "UNSIGNED"})


def _expr(v: Value, defs: dict[Value, Op], args: dict[Value, int]) -> Any:
    """A canonical expression of a body value: `or`/`and` operands unordered."""
    if v in args:
        return ("arg", args[v])
    op = defs.get(v)
    if op is None or len(op.results) != 1:
        return None
    ins = tuple(_expr(a, defs, args) for a in op.operands)
    if op.opcode == "compare":
        if op.attrs.get("compare_type") not in _PLAIN_COMPARE:
            return None
        return ("compare", op.attrs.get("comparison_direction"), *ins)
    if op.opcode in ("or", "and"):
        return (op.opcode, frozenset(ins))
    if op.opcode == "select":
        return ("select", *ins)
    return None


def _arg_exprs(kind: str) -> tuple[Any, Any]:
    a0, a1, a2, a3 = (("arg", i) for i in range(4))
    pick_value = ("or", frozenset({("compare", _BETTER[kind], a0, a2), ("compare", "NE", a0, a0)}))
    tie = ("and", frozenset({("compare", "EQ", a0, a2), ("compare", "LT", a1, a3)}))
    pick_index = ("or", frozenset({pick_value, tie}))
    return ("select", pick_value, a0, a2), ("select", pick_index, a1, a3)


def arg_reducer_of(region: Region) -> str | None:
    """"argmax" or "argmin" when `region` is JAX's comparator of (value, index) pairs, else None."""
    if len(region.args) != 4 or len(region.results) != 2:
        return None
    defs = {r: op for op in region.ops for r in op.results}
    args = {v: i for i, v in enumerate(region.args)}
    got = tuple(_expr(r, defs, args) for r in region.results)
    return next((k for k in ARG_REDUCERS if got == _arg_exprs(k)), None)


def arg_reducer_region(kind: str, value_dtype: str, index_dtype: str) -> Region:
    """JAX's comparator body for `kind` ("argmax" / "argmin"), for evaluating terms that name it."""
    def scalar(dtype: str, name: str) -> Value:
        return Value(TensorType((), dtype), name)

    v0, i0, v1, i1 = scalar(value_dtype, "%v0"), scalar(index_dtype, "%i0"), scalar(value_dtype, "%v1"), \
        scalar(index_dtype, "%i1")
    ops: list[Op] = []

    def emit(opcode: str, ins: tuple[Value, ...], dtype: str, **attrs: AttrValue) -> Value:
        r = scalar(dtype, f"%t{len(ops)}")
        ops.append(Op(opcode, ins, (r,), Attrs.of(attrs)))
        return r

    better = emit("compare", (v0, v1), "i1", comparison_direction=_BETTER[kind])
    nan = emit("compare", (v0, v0), "i1", comparison_direction="NE")
    pick_value = emit("or", (better, nan), "i1")
    eq = emit("compare", (v0, v1), "i1", comparison_direction="EQ")
    lt = emit("compare", (i0, i1), "i1", comparison_direction="LT")
    pick_index = emit("or", (pick_value, emit("and", (eq, lt), "i1")), "i1")
    value = emit("select", (pick_value, v0, v1), value_dtype)
    index = emit("select", (pick_index, i0, i1), index_dtype)
    return Region((v0, i0, v1, i1), tuple(ops), (value, index))


# ------------------------------------------------------------------------------- top-k comparator bodies
# XLA's compiled modules carry `lax.top_k` as a `TopK` custom call whose comparator orders the values (the
# indices ride along): a `compare` of the two values' total-order keys. For floats the key is the IEEE
# bits as a signed integer with the magnitude bits flipped where the sign is set (`select(bits < 0, bits ^
# INT_MAX, bits)`), the order of `lax.top_k`; integers compare as they are.

_FLIP = {"GT": "LT", "LT": "GT"}


def _total_key(v: Value, defs: dict[Value, Op]) -> Value | None:
    """The argument whose total-order key `v` is, if `v` is one (an integer argument is its own key)."""
    if v.tensor.dtype.startswith(("i", "ui")) and v not in defs:
        return v
    sel = defs.get(v)
    if sel is None or sel.opcode != "select" or len(sel.operands) != 3:
        return None
    cond, flipped, bits = (defs.get(x) for x in sel.operands)
    if bits is None or bits.opcode not in ("bitcast", "bitcast_convert") or cond is None or flipped is None:
        return None
    (arg,) = bits.operands
    width = arg.tensor.dtype.removeprefix("b").removeprefix("f")
    if not arg.tensor.dtype.startswith(("f", "bf")) or v.tensor.dtype != f"i{width}" or arg in defs:
        return None
    raw = bits.results[0]

    def const(x: Value) -> int | None:
        c = defs.get(x)
        lit = c.attrs.get("value") if c is not None and c.opcode == "constant" else None
        return int(lit.array.reshape(-1)[0]) if isinstance(lit, Literal) and lit.array.size == 1 else None

    sign = (cond.opcode == "compare" and cond.attrs.get("comparison_direction") == "LT"
            and cond.operands[0] == raw and const(cond.operands[1]) == 0)
    ops = set(flipped.operands)
    flip = flipped.opcode == "xor" and raw in ops and any(const(x) == (1 << (int(width) - 1)) - 1 for x in ops)
    return arg if sign and flip and sel.operands[2] == raw else None


def top_k_largest(region: Region) -> bool | None:
    """True when `region` orders its first pair of arguments largest first in the total order, False
    smallest first; None for any other comparator."""
    if len(region.args) < 2 or len(region.results) != 1:
        return None
    defs = {r: op for op in region.ops for r in op.results}
    root = defs.get(region.results[0])
    if root is None or root.opcode != "compare" or root.attrs.get("compare_type") not in (None, "SIGNED", "UNSIGNED"):
        return None
    direction = str(root.attrs.get("comparison_direction"))
    keys = [_total_key(x, defs) for x in root.operands]
    if direction not in _FLIP or keys == [None, None]:
        return None
    if keys == [region.args[1], region.args[0]]:
        keys, direction = keys[::-1], _FLIP[direction]
    if keys != [region.args[0], region.args[1]]:
        return None
    return direction == "GT"


def top_k_of_call(op: Op) -> Op | None:
    """XLA's `TopK` custom call as the `top_k` op it computes (results: values, indices), when its
    comparator (its first region: `ir.inline` attaches the called computation) is a total order."""
    if str(op.attrs.get("call_target_name")) != "TopK" or len(op.operands) != 1 or not op.regions:
        return None
    largest = top_k_largest(op.regions[0])
    results = op.results[0].type.elements if len(op.results) == 1 and isinstance(op.results[0].type, TupleType) \
        else tuple(r.type for r in op.results)
    if largest is None or len(results) != 2 or not all(isinstance(t, TensorType) for t in results):
        return None
    values = tuple(Value(t, f"{op.results[0].name}#{i}") for i, t in enumerate(results))
    k = values[0].tensor.shape[-1]
    return Op("top_k", op.operands, values, Attrs.of({"k": k, "largest": largest}), (), op.loc)
