"""Reducers: the associative ops a reduction or an all-reduce combines values with, in one table.

A reduction body that applies one of these ops to its two arguments is that reducer (`reducer_of`);
anything else is a general body. The table says, per reducer, the elementwise op that combines two
values and the name of the collective JAX users know it by.
"""

from __future__ import annotations

import enum

from scalify_hlo.ir.nodes import Region


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


def reducer_of(region: Region) -> Reducer | None:
    """The reducer of a two-argument region that applies one associative op to its arguments."""
    if len(region.args) != 2 or len(region.ops) != 1 or len(region.results) != 1:
        return None
    (op,) = region.ops
    if op.results != region.results or set(op.operands) != set(region.args):
        return None
    return REDUCER_OF_OP.get(op.opcode)
