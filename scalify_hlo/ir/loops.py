"""Static facts about `while` loops read off the IR: how many times a counted loop runs."""

from __future__ import annotations

from scalify_hlo.ir.nodes import Literal, Op, Value

MAX_TRIPS = 1 << 24  # a static loop counted further than this is treated as of unknown trip count


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
