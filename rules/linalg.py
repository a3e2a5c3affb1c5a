"""Transfer rules of linear algebra (Cholesky, LU, triangular solves) and of random bits (`rng_bit_generator`).

Cholesky and LU factors and triangular solves act matrix by matrix over their leading batch dims, in
both spellings (`stablehlo.cholesky`/`triangular_solve`, and on CPU the LAPACK custom calls
`lapack_?potrf_ffi`, `lapack_?getrf_ffi` and `lapack_?trsm_ffi`): a batch dim split over mesh axes passes
through, each device solving its own matrices; a matrix dim split over an axis is not modelled (a distributed factorisation), so it fails naming
the dim (`unknown`). The result terms are the global op on the global operands: one term per result,
keyed by the op's meaning (the LAPACK options, read from either spelling of the backend config), so that
the reference's and the partitioned program's calls meet.

`rng_bit_generator` is a function of its state: when the state is one global value on every device (a
replicated key, as XLA's partitioner keeps it: it generates the whole global bits on every device and
slices them), so are the state and bits it returns, keyed by algorithm and the global bits' type. A state
split over devices or partial fails with the reason.

A multi-result term carries `index` and `result_types` (every result's global type), which
`terms.evaluate.as_op` dresses it with to run the kernel.
"""

from __future__ import annotations

from typing import Any

from scalify_hlo.rules.facts import Ctx, Fact, Failed, Holds, TupleFact, join, view
from scalify_hlo.rules.layout import holds_operands

from scalify_hlo.ir.nodes import Op, TensorType, TupleType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.numeric.kernels_linalg import GETRF_TARGETS, POTRF_TARGETS, TRSM_TARGETS
from scalify_hlo.ops.attrs import term_attrs

LAPACK_TARGETS = GETRF_TARGETS | POTRF_TARGETS | TRSM_TARGETS


def _result_types(op: Op) -> tuple[TensorType, ...]:
    """The op's results' types (a single tuple-typed result, HLO's custom call, counts as its elements)."""
    if len(op.results) == 1 and isinstance(op.results[0].type, TupleType):
        return tuple(t for t in op.results[0].type.elements if isinstance(t, TensorType))
    return tuple(r.tensor for r in op.results)


def _packed(op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """One fact per result: HLO's single tuple-typed result gets them as a tuple."""
    if len(op.results) == 1 and isinstance(op.results[0].type, TupleType):
        return (TupleFact(facts),)
    return facts


def _fail(ctx: Ctx, op: Op, what: str) -> tuple[Fact, ...]:
    failed = ctx.unsupported(op, what)
    return tuple(failed for _ in op.results)


def _batched(ctx: Ctx, op: Op, facts: tuple[Fact, ...], name: str, key: tuple[tuple[str, Any], ...]
             ) -> tuple[Fact, ...]:
    """Matrix by matrix over the leading batch dims: operands [*batch, m, k], results [*batch, ...]."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    if any(h.layout.partial for h in ops):
        return _fail(ctx, op, f"{name} of a partial value (a sum not yet taken)")
    if len({h.layout.rank for h in ops}) != 1:
        return _fail(ctx, op, f"{name} of operands of different ranks")
    layout = join([h.layout for h in ops])
    if layout is None:
        return _fail(ctx, op, f"{name} of operands laid out differently")
    rank = layout.rank
    for d in (rank - 2, rank - 1):
        if layout.dims[d]:
            return _fail(ctx, op, f"{name} with matrix dim {d} split over {ctx.describe(layout)} "
                                  "(a distributed factorisation is not modelled)")
    viewed = [view(h.term, h.layout, layout.dims, ctx.mesh, ctx.terms) for h in ops]
    args = tuple(t for t in viewed if t is not None)
    if len(args) != len(ops):
        return _fail(ctx, op, f"{name} of operands laid out differently")
    batch = layout.dims[:-2]
    types = []
    for t in _result_types(op):
        dims = batch + ((),) * (t.rank - len(batch))
        types.append((TensorType(tuple(n * ctx.mesh.size_of(a) for n, a in zip(t.shape, dims, strict=True)),
                                 t.dtype), Layout(dims)))
    multi = len(types) > 1
    every = tuple((g.shape, g.dtype) for g, _ in types)
    out = []
    for i, (g, lay) in enumerate(types):
        k = (*key, ("index", i), ("result_types", every)) if multi else key
        out.append(Holds(ctx.terms.apply(op.opcode, args, k, g), lay))
    return _packed(op, tuple(out))


def batched_matrix(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """`cholesky` and `triangular_solve`: batch dims pass through, the matrix dims must be whole."""
    return _batched(ctx, op, facts, op.opcode, term_attrs(op))


def lapack(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """The LAPACK custom calls of JAX's CPU lowering (potrf: factor and info; getrf: factors, pivots and info;
    trsm: the solution)."""
    target = str(op.attrs.get("call_target_name", ""))
    config: Any = op.attrs.get("mhlo.backend_config", op.attrs.get("backend_config"))
    if not isinstance(config, tuple) or not all(isinstance(kv, tuple) and len(kv) == 2 for kv in config):
        return _fail(ctx, op, f"custom call {target!r} without its LAPACK options")
    key = (("backend_config", tuple(sorted((str(k), int(v)) for k, v in config))), ("call_target_name", target))
    return _batched(ctx, op, facts, target, key)


def rng_bit_generator(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Replicated state in, replicated state and bits out: both programs compute the same function of the
    same value."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    (state,) = ops
    if state.layout.split_axes() or state.layout.partial:
        what = "partial" if state.layout.partial else f"laid out {ctx.describe(state.layout)}"
        return _fail(ctx, op, f"random bits from a state {what} (each device would draw from its own "
                              "state; only a state that is one global value is modelled)")
    types = _result_types(op)
    every = tuple((t.shape, t.dtype) for t in types)
    attrs = term_attrs(op)
    return _packed(op, tuple(
        Holds(ctx.terms.apply(op.opcode, (state.term,), (*attrs, ("index", i), ("result_types", every)), t),
              Layout.replicated(t.rank))
        for i, t in enumerate(types)))
