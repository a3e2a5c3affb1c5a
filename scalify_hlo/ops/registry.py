"""One table: opcode → what the prover knows about it. Alphabetical, one row per op.

A row names the op's transfer rule (how a `Holds` fact of its operands becomes one of its result, in
`rules/spmd.py`, `rules/collectives.py`, `rules/layout.py`, `rules/indexing.py`) and whether it is
elementwise. The ~45 elementwise ops share one
generic rule (like JAX's lowering registry reuses one rule with `functools.partial`). The numeric
kernel of each op is the entry of the same opcode in `kernels.KERNELS`. An op that is not in this table
is unsupported: the verdict becomes `unknown` and names it.

`term_attrs` says which attributes are part of an op's meaning (everything except hints such as
precision configs, shardings and channel ids); ops with a body (reduce, sort, scatter) carry a key of it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalify_hlo.ir.nodes import Literal, Op
from scalify_hlo.rules import collectives as C
from scalify_hlo.rules import indexing as X
from scalify_hlo.rules import layout as L
from scalify_hlo.rules import spmd as S
from scalify_hlo.rules.facts import Ctx, Fact

Transfer = Callable[[Ctx, Op, tuple[Fact, ...]], tuple[Fact, ...]]


@dataclass(frozen=True, slots=True)
class OpSem:
    transfer: Transfer
    elementwise: bool = False


_EW = OpSem(S.elementwise, elementwise=True)

OPS: dict[str, OpSem] = {
    "abs": _EW,
    "add": _EW,
    "all_gather": OpSem(C.all_gather),
    "all_reduce": OpSem(C.all_reduce),
    "all_to_all": OpSem(C.all_to_all),
    "and": _EW,
    "atan2": _EW,
    "bitcast": OpSem(L.bitcast),
    "bitcast_convert": _EW,
    "broadcast_in_dim": OpSem(L.broadcast_in_dim),
    "cbrt": _EW,
    "ceil": _EW,
    "clamp": _EW,
    "collective_permute": OpSem(C.collective_permute),
    "compare": _EW,
    "concatenate": OpSem(L.concatenate),
    "constant": OpSem(L.constant),
    "convert": _EW,
    "copy": OpSem(S.identity),
    "cosine": _EW,
    "count_leading_zeros": _EW,
    "divide": _EW,
    "dot": OpSem(S.dot_general),
    "dot_general": OpSem(S.dot_general),
    "dynamic_slice": OpSem(X.dynamic_slice),
    "dynamic_update_slice": OpSem(X.dynamic_update_slice),
    "erf": _EW,
    "erf_inv": _EW,
    "exponential": _EW,
    "exponential_minus_one": _EW,
    "floor": _EW,
    "gather": OpSem(X.gather),
    "get_tuple_element": OpSem(S.get_tuple_element),
    "imag": _EW,
    "iota": OpSem(L.iota),
    "is_finite": _EW,
    "log": _EW,
    "log_plus_one": _EW,
    "logistic": _EW,
    "maximum": _EW,
    "minimum": _EW,
    "multiply": _EW,
    "negate": _EW,
    "not": _EW,
    "optimization_barrier": OpSem(S.identity),
    "or": _EW,
    "pad": OpSem(L.pad),
    "partition_id": OpSem(C.partition_id),
    "popcnt": _EW,
    "power": _EW,
    "real": _EW,
    "reduce": OpSem(S.reduce),
    "reduce_precision": _EW,
    "reduce_scatter": OpSem(C.reduce_scatter),
    "reduce_window": OpSem(X.reduce_window),
    "remainder": _EW,
    "replica_id": OpSem(C.replica_id),
    "reshape": OpSem(L.reshape),
    "reverse": OpSem(L.reverse),
    "round_nearest_afz": _EW,
    "round_nearest_even": _EW,
    "rsqrt": _EW,
    "scatter": OpSem(X.scatter),
    "select_and_scatter": OpSem(X.replicated_only),
    "select": _EW,
    "sharding_constraint": OpSem(S.identity),
    "shift_left": _EW,
    "shift_right_arithmetic": _EW,
    "shift_right_logical": _EW,
    "sign": _EW,
    "sine": _EW,
    "slice": OpSem(L.slice_),
    "sort": OpSem(X.replicated_only),
    "sqrt": _EW,
    "square": _EW,  # chlo.square (jnp.square); read as x * x (terms.py)
    "subtract": _EW,
    "tan": _EW,
    "tanh": _EW,
    "transpose": OpSem(L.transpose),
    "top_k": OpSem(X.replicated_only),
    "tuple": OpSem(S.tuple_),
    "xor": _EW,
}

# Custom calls XLA and JAX emit around sharding: they annotate, they do not compute.
IDENTITY_CUSTOM_CALLS = frozenset({"Sharding", "ShardingConstraint", "mhlo.sharding", "xla.sdy.FuncResultSharding"})

def literal_of(op: Op) -> Literal | None:
    v = op.attrs.get("value")
    return v if isinstance(v, Literal) else None
