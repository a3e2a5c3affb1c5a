"""The op registry: one record per op, alphabetical: its numeric kernel and its layout transfer rule.

A record names the op's meaning twice over, once per way the verifier reads a program: `kernel` runs it on
NumPy arrays (the interpreter and the oracle, `numeric/`), `transfer` carries a `Holds` fact of its
operands to one of its result (`rules/spmd.py`, `rules/collectives.py`, `rules/layout.py`,
`rules/indexing.py`). Every elementwise op (the table in `ops/elementwise.py`, which gives its NumPy meaning)
shares one generic kernel and one generic rule, as JAX's lowering registry reuses one rule with
`functools.partial`; its record is made from its row. Adding an elementwise op is adding a row there;
adding any other op is writing its kernel and rule and one record here. `docs/ops.md` lists every op
with its pieces (`tools/gen_ops_table.py`).

A record without `transfer` is an op the derivation handles structurally (control flow, calls, async
pairs: `prove/derive.py`'s hooks) or does not carry layouts through (the verdict becomes `unknown` and
names it); one without `kernel` has no numeric meaning (a numeric check involving it is skipped, never
guessed). Importing this module registers the kernels with the interpreter (`numeric.kernels.register`),
as JAX's `mlir.register_lowering` fills the lowering table from the module that defines a primitive.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scalify_hlo.ir.nodes import Op
from scalify_hlo.numeric import kernels as K
from scalify_hlo.numeric import kernels_collective as NC
from scalify_hlo.numeric import kernels_conv as NV
from scalify_hlo.numeric import kernels_index as NX
from scalify_hlo.numeric import kernels_linalg as NL
from scalify_hlo.numeric import kernels_rng as NR
from scalify_hlo.numeric import kernels_shape as NS
from scalify_hlo.numeric.kernels import Kernel
from scalify_hlo.ops.elementwise import ELEMENTWISE
from scalify_hlo.rules import collectives as C
from scalify_hlo.rules import convolution as V
from scalify_hlo.rules import indexing as X
from scalify_hlo.rules import layout as L
from scalify_hlo.rules import linalg as LA
from scalify_hlo.rules import sorting as SO
from scalify_hlo.rules import spmd as S
from scalify_hlo.rules.facts import Ctx, Fact

Transfer = Callable[[Ctx, Op, tuple[Fact, ...]], tuple[Fact, ...]]


@dataclass(frozen=True, slots=True)
class OpInfo:
    kernel: Kernel | None
    transfer: Transfer | None = None


OPS: dict[str, OpInfo] = {
    **{name: OpInfo(K.elementwise(e.fn), S.elementwise) for name, e in ELEMENTWISE.items() if e.fn is not None},
    "after_all": OpInfo(NS.token),
    "all_gather": OpInfo(NC.all_gather, C.all_gather),
    "all_gather_done": OpInfo(NS.identity),
    "all_gather_start": OpInfo(NC.all_gather),
    "all_reduce": OpInfo(NC.all_reduce, C.all_reduce),
    "all_reduce_done": OpInfo(NS.identity),
    "all_reduce_start": OpInfo(NC.all_reduce),
    "all_to_all": OpInfo(NC.all_to_all, C.all_to_all),
    "async_done": OpInfo(NC.async_done),
    "async_start": OpInfo(NC.async_start),
    "async_update": OpInfo(NS.identity),
    "bitcast": OpInfo(K.bitcast, L.bitcast),
    "bitcast_convert": OpInfo(K.bitcast_convert, S.bitcast_convert),
    "broadcast": OpInfo(NS.broadcast),
    "broadcast_in_dim": OpInfo(NS.broadcast_in_dim, L.broadcast_in_dim),
    "call": OpInfo(NS.call),
    "case": OpInfo(NS.case),
    "cholesky": OpInfo(NL.cholesky, LA.batched_matrix),
    "collective_broadcast": OpInfo(NC.collective_broadcast),
    "collective_permute": OpInfo(NC.collective_permute, C.collective_permute),
    "collective_permute_done": OpInfo(NS.identity),
    "collective_permute_start": OpInfo(NC.collective_permute),
    "compare": OpInfo(K.compare, S.elementwise),
    "composite": OpInfo(NS.composite),
    "concatenate": OpInfo(NS.concatenate, L.concatenate),
    "constant": OpInfo(NS.constant, L.constant),
    "convert": OpInfo(K.convert, S.elementwise),
    "convolution": OpInfo(NV.convolution, V.convolution),
    "copy": OpInfo(NS.identity, S.identity),
    "create_token": OpInfo(NS.token),
    "custom_call": OpInfo(NS.custom_call),
    "domain": OpInfo(NS.identity),
    "dot": OpInfo(NS.dot, S.dot_general),
    "dot_general": OpInfo(NS.dot_general, S.dot_general),
    "dynamic_slice": OpInfo(NX.dynamic_slice, X.dynamic_slice),
    "dynamic_update_slice": OpInfo(NX.dynamic_update_slice, X.dynamic_update_slice),
    "fusion": OpInfo(NS.region),
    "gather": OpInfo(NX.gather, X.gather),
    "get_dimension_size": OpInfo(NS.get_dimension_size),
    "get_tuple_element": OpInfo(NS.get_tuple_element, S.get_tuple_element),
    "if": OpInfo(NS.if_),
    "iota": OpInfo(NS.iota, L.iota),
    "manual_computation": OpInfo(NS.manual),
    "map": OpInfo(NX.map_),
    "optimization_barrier": OpInfo(NS.identity, S.identity),
    "pad": OpInfo(NS.pad, L.pad),
    "partition_id": OpInfo(NS.partition_id, C.partition_id),
    "reduce": OpInfo(NX.reduce, S.reduce),
    "reduce_precision": OpInfo(K.reduce_precision, S.elementwise),
    "reduce_scatter": OpInfo(NC.reduce_scatter, C.reduce_scatter),
    "reduce_window": OpInfo(NX.reduce_window, X.reduce_window),
    "replica_id": OpInfo(NS.replica_id, C.replica_id),
    "reshape": OpInfo(NS.reshape, L.reshape),
    "reshard": OpInfo(NS.identity),
    "reverse": OpInfo(NS.reverse, L.reverse),
    "rng_bit_generator": OpInfo(NR.rng_bit_generator, LA.rng_bit_generator),
    "scatter": OpInfo(NX.scatter, X.scatter),
    "select_and_scatter": OpInfo(NX.select_and_scatter, X.replicated_only),
    "sharding_constraint": OpInfo(NS.identity, S.identity),
    "slice": OpInfo(NS.slice_, L.slice_),
    "sort": OpInfo(NX.sort, SO.sort),
    "top_k": OpInfo(NX.top_k, SO.top_k),
    "topk": OpInfo(NX.top_k, SO.top_k),
    "transpose": OpInfo(NS.transpose, L.transpose),
    "triangular_solve": OpInfo(NL.triangular_solve, LA.batched_matrix),
    "tuple": OpInfo(NS.tuple_, S.tuple_),
    "while": OpInfo(NS.while_),
}

# Custom calls XLA and JAX emit around sharding: they annotate, they do not compute.
IDENTITY_CUSTOM_CALLS = frozenset({"Sharding", "ShardingConstraint", "mhlo.sharding", "xla.sdy.FuncResultSharding"})

K.register({name: info.kernel for name, info in OPS.items() if info.kernel is not None})
