"""The op registry: opcode → its transfer rule, one row per op, alphabetical.

A row names how a `Holds` fact of the operands becomes one of the result (`rules/spmd.py`,
`rules/collectives.py`, `rules/layout.py`, `rules/indexing.py`). Every elementwise op (the table in
`ops/elementwise.py`, which also gives its NumPy meaning) shares one generic rule, as JAX's lowering
registry reuses one rule with `functools.partial`. The numeric kernel of an op is the entry of the same
opcode in `numeric.kernels.KERNELS`; `docs/ops.md` lists every op with its pieces. An op missing here is
unsupported: the verdict becomes `unknown` and names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalify_hlo.ir.nodes import Op
from scalify_hlo.ops.elementwise import ELEMENTWISE
from scalify_hlo.rules import collectives as C
from scalify_hlo.rules import indexing as X
from scalify_hlo.rules import layout as L
from scalify_hlo.rules import spmd as S
from scalify_hlo.rules.facts import Ctx, Fact

Transfer = Callable[[Ctx, Op, tuple[Fact, ...]], tuple[Fact, ...]]


@dataclass(frozen=True, slots=True)
class OpSem:
    transfer: Transfer


_EW = OpSem(S.elementwise)  # every row of ops/elementwise.py

OPS: dict[str, OpSem] = {
    **dict.fromkeys(ELEMENTWISE, _EW),
    "all_gather": OpSem(C.all_gather),
    "all_reduce": OpSem(C.all_reduce),
    "all_to_all": OpSem(C.all_to_all),
    "bitcast": OpSem(L.bitcast),
    "broadcast_in_dim": OpSem(L.broadcast_in_dim),
    "collective_permute": OpSem(C.collective_permute),
    "concatenate": OpSem(L.concatenate),
    "constant": OpSem(L.constant),
    "copy": OpSem(S.identity),
    "dot": OpSem(S.dot_general),
    "dot_general": OpSem(S.dot_general),
    "dynamic_slice": OpSem(X.dynamic_slice),
    "dynamic_update_slice": OpSem(X.dynamic_update_slice),
    "gather": OpSem(X.gather),
    "get_tuple_element": OpSem(S.get_tuple_element),
    "iota": OpSem(L.iota),
    "optimization_barrier": OpSem(S.identity),
    "pad": OpSem(L.pad),
    "partition_id": OpSem(C.partition_id),
    "reduce": OpSem(S.reduce),
    "reduce_scatter": OpSem(C.reduce_scatter),
    "reduce_window": OpSem(X.reduce_window),
    "replica_id": OpSem(C.replica_id),
    "reshape": OpSem(L.reshape),
    "reverse": OpSem(L.reverse),
    "scatter": OpSem(X.scatter),
    "select_and_scatter": OpSem(X.replicated_only),
    "sharding_constraint": OpSem(S.identity),
    "slice": OpSem(L.slice_),
    "sort": OpSem(X.sort),
    "transpose": OpSem(L.transpose),
    "top_k": OpSem(X.sort),
    "tuple": OpSem(S.tuple_),
}

# Custom calls XLA and JAX emit around sharding: they annotate, they do not compute.
IDENTITY_CUSTOM_CALLS = frozenset({"Sharding", "ShardingConstraint", "mhlo.sharding", "xla.sdy.FuncResultSharding"})
