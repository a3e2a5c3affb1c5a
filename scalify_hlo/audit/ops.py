"""What the audit reads off one op: its name for the user, the devices it combines, the bytes it moves,
and the trip count of a `while` loop."""

from __future__ import annotations

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType, Value
from scalify_hlo.layout.groups import axes_of_groups, axes_of_pairs, device_groups, has_channel
from scalify_hlo.layout.program import Program
from scalify_hlo.numeric.machine import np_dtype
from scalify_hlo.report.verdicts import user_name

MAX_TRIPS = 1 << 24  # a static loop counted further than this is treated as of unknown trip count


def name_of(op: Op) -> str:
    """An op as the user can find it: its HLO instruction name, else JAX's op_name, else its opcode."""
    return user_name(op.loc.name or (op.results[0].name if op.results else None)) or op.loc.op_name or op.opcode


def describe(op: Op) -> str:
    """`all_gather (all-gather.3 at model.py:12)` for messages."""
    name = user_name(op.loc.name or (op.results[0].name if op.results else None))
    at = ", ".join(x for x in (name, f"at {op.loc.site}" if op.loc.site else None) if x)
    return f"{op.opcode} ({at})" if at else op.opcode


def tensor_bytes(t: TensorType) -> int:
    try:
        width = np_dtype(t.dtype).itemsize
    except (ValueError, KeyError, TypeError):
        width = 4
    return int(np.prod(t.shape, dtype=np.int64)) * width


def traffic(op: Op, n: int) -> int:
    if n <= 1:
        return 0
    ins = sum(tensor_bytes(v.tensor) for v in op.operands if isinstance(v.type, TensorType))
    outs = sum(tensor_bytes(v.tensor) for v in op.results if isinstance(v.type, TensorType))
    match op.opcode:
        case "all_reduce":
            return 2 * (n - 1) * ins // n
        case "all_gather":
            return (n - 1) * outs // n
        case "reduce_scatter" | "all_to_all":
            return (n - 1) * ins // n
        case _:
            return ins  # collective-permute / broadcast: the operand moves once


def group_of(op: Op, prog: Program) -> tuple[tuple[str, ...], int]:
    """The mesh axes a collective runs over and its group size (a permute: the devices along the axes
    its pairs move on; "?" when the groups are not the fibres of mesh axes)."""
    if op.opcode in ("collective_permute", "collective_broadcast"):
        pairs = op.attrs.get("source_target_pairs")
        axes = axes_of_pairs(pairs.array, prog.mesh) if isinstance(pairs, Literal) else None
        if axes is None:
            return ("?",), 2
        return axes, max(2, prog.mesh.size_of(axes))
    if not has_channel(op):
        return (), 1
    arr = device_groups(op, prog.mesh.size)
    n = arr.shape[1]
    try:
        return axes_of_groups(arr, prog.mesh, prog.mesh.size), n
    except ShardingError:
        return ("?",), n


def _scalar(v: Value, producers: dict[Value, Op]) -> int | None:
    """The integer a scalar constant holds, else None."""
    op = producers.get(v)
    if op is None or op.opcode != "constant":
        return None
    lit = op.attrs.get("value")
    if not isinstance(lit, Literal) or lit.array.size != 1 or lit.array.dtype.kind not in "iu":
        return None
    return int(lit.array.reshape(()))


_COMPARE = {"LT": lambda a, b: a < b, "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b,
            "GE": lambda a, b: a >= b, "NE": lambda a, b: a != b}


_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}


def trip_count(op: Op, producers: dict[Value, Op]) -> int | None:
    """The iterations of a `while` whose condition compares a carried counter with a constant, the counter
    starting at a constant and stepped by a constant add (or subtract) in the body; None otherwise."""
    cond, body = op.regions
    if len(cond.results) != 1:
        return None
    test = producers.get(cond.results[0])
    if test is None or test.opcode != "compare" or len(test.operands) != 2:
        return None
    direction = str(test.attrs.get("comparison_direction", ""))
    a, b = test.operands
    if a in cond.args and (bound := _scalar(b, producers)) is not None:
        k = cond.args.index(a)
    elif b in cond.args and (bound := _scalar(a, producers)) is not None and direction in _FLIPPED:
        k, direction = cond.args.index(b), _FLIPPED[direction]
    else:
        return None
    if direction not in _COMPARE or k >= len(op.operands) or k >= len(body.results):
        return None
    start = _scalar(op.operands[k], producers)
    step_op = producers.get(body.results[k])
    if start is None or step_op is None or step_op.opcode not in ("add", "subtract") or len(step_op.operands) != 2:
        return None
    x, y = step_op.operands
    counter = body.args[k]
    if x is counter:
        step = _scalar(y, producers)
    elif y is counter and step_op.opcode == "add":
        step = _scalar(x, producers)
    else:
        return None
    if step is None:
        return None
    step = -step if step_op.opcode == "subtract" else step
    holds = _COMPARE[direction]
    if not holds(start, bound):
        return 0
    if step == 0 or holds(start + step * MAX_TRIPS, bound):
        return None  # never ends, or too long to count: not a static layer count
    lo, hi = 0, MAX_TRIPS  # the first n with the condition false at start + n·step (monotone in n)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(start + step * mid, bound):
            lo = mid + 1
        else:
            hi = mid
    return lo
