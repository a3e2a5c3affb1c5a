"""Which attributes are part of an op's meaning, and a structural key of a body.

Two ops with the same opcode, operands and `term_attrs` compute the same value: hints (precision configs,
shardings, channel ids, backend configs) are left out, and an op with a body carries its reducer or a key
of the body (`region_key`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scalify_hlo.ir.nodes import Op, Opaque, Region, Value
from scalify_hlo.ops.reducers import arg_reducer_of, reducer_of

_HINTS = frozenset({
    "precision_config", "mhlo.sharding", "sdy.sharding", "mhlo.frontend_attributes", "channel_handle",
    "use_global_device_ids", "result_accuracy", "indices_are_sorted", "unique_indices", "algorithm",
    "mhlo.original_value", "backend_config",
})
# An HLO instruction's physical layout (minor-to-major order, as `result_layout` and the `xla_shape` text
# spell it) changes where elements sit in memory, not their values: a hint for every op but `bitcast`,
# which reinterprets the buffer (its transfer rule and kernel read the layouts themselves).
_LAYOUTS = frozenset({"result_layout", "source_layout", "xla_shape"})
_LAYOUT_MEANINGFUL = frozenset({"bitcast"})


def region_key(region: Region, captured: Sequence[Value] = ()) -> tuple[Any, ...]:
    """A structural key of a body: same key, same computation. Values are numbered by position, nested
    bodies included; a value captured from outside is ("captured", its position in `captured`), so bodies
    that use captured values in other roles get other keys (-1: captured and not listed)."""
    free = {v: i for i, v in enumerate(captured)}
    return _region_key(region, {}, free)


def _region_key(region: Region, index: dict[Value, int], free: dict[Value, int]) -> tuple[Any, ...]:
    def token(v: Value) -> Any:
        if v in index:
            return index[v]
        return ("captured", free[v]) if v in free else -1

    n_args = len(region.args)
    for v in region.args:
        index[v] = len(index)
    items = []
    for op in region.ops:
        operands = tuple(token(v) for v in op.operands)
        items.append((op.opcode, operands, _attrs(op, index, free)))
        for r in op.results:
            index[r] = len(index)
    return (n_args, tuple(items), tuple(token(v) for v in region.results))


def term_attrs(op: Op) -> tuple[tuple[str, Any], ...]:
    return _attrs(op, {}, {})


def _attrs(op: Op, index: dict[Value, int], free: dict[Value, int]) -> tuple[tuple[str, Any], ...]:
    hints = _HINTS if op.opcode in _LAYOUT_MEANINGFUL else _HINTS | _LAYOUTS
    attrs = tuple((k, v) for k, v in op.attrs.items() if k not in hints and not isinstance(v, Opaque))
    if op.regions:
        reducer = reducer_of(op.regions[0]) if len(op.regions) == 1 else None
        # JAX's argmax/argmin comparator by name: the reference's StableHLO and XLA's HLO order its ops
        # differently, and the name is what the split-dim rule checks.
        arg = arg_reducer_of(op.regions[0]) if len(op.regions) == 1 and op.opcode == "reduce" else None
        # Nested bodies share the numbering: a use of an enclosing body's value names that value.
        # A sort's comparator is keyed by its dataflow (`comparator_key`): XLA's HLO lists it in
        # another order and leaves out the default comparison type.
        comparator = comparator_key(op.regions[0]) if op.opcode == "sort" and len(op.regions) == 1 else None
        key: Any = (reducer.value if reducer is not None else arg if arg is not None
                    else (comparator,) if comparator is not None
                    else tuple(_region_key(r, index, free) for r in op.regions))
        attrs = (*attrs, ("computation", key))
    return attrs


def _default_compare(dtype: str) -> str:
    return "FLOAT" if dtype.startswith(("f", "bf")) else "UNSIGNED" if dtype.startswith(("ui", "i1")) else "SIGNED"


def comparator_key(region: Region) -> tuple[Any, ...] | None:
    """A `region_key` of a flat scalar body that depends only on its dataflow: values numbered in the
    post-order of the results' expression trees (operands left to right), equal expressions once, dead
    ops left out, a comparison type that is its operands' default dropped (JAX spells it, XLA does not).
    Two bodies with the same key compute the same function of their arguments. None for bodies with
    nested bodies, multi-result ops or values from outside."""
    defs: dict[Value, Op] = {}
    for op in region.ops:
        if op.regions or len(op.results) != 1:
            return None
        defs[op.results[0]] = op
    number: dict[Value, int] = {v: i for i, v in enumerate(region.args)}
    seen: dict[Any, int] = {}  # an op's (opcode, operand numbers, attrs) -> its number
    items: list[tuple[Any, ...]] = []

    def visit(v: Value) -> int | None:
        if v in number:
            return number[v]
        op = defs.get(v)
        if op is None:
            return None
        ins: list[int] = []
        for a in op.operands:
            n = visit(a)
            if n is None:
                return None
            ins.append(n)
        attrs = _attrs(op, {}, {})
        if op.opcode == "compare" and op.operands:
            kind = op.attrs.get("compare_type")
            if kind is None or kind == _default_compare(op.operands[0].tensor.dtype):
                attrs = tuple((k, x) for k, x in attrs if k != "compare_type")
        item = (op.opcode, tuple(ins), attrs)
        if item not in seen:
            seen[item] = len(region.args) + len(items)
            items.append(item)
        number[v] = seen[item]
        return number[v]

    outs = [visit(r) for r in region.results]
    if any(n is None for n in outs):
        return None
    return (len(region.args), tuple(items), tuple(outs))
