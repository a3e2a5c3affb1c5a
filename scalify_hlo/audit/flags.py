"""The audit's flags: patterns in a partitioned program worth a look, each with the op and source line."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from scalify_hlo.audit.ops import describe, group_of, tensor_bytes
from scalify_hlo.audit.report import Audit, fmt_axes
from scalify_hlo.ir.nodes import Op, TensorType, walk
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.layout.program import Program
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.rules.facts import Holds
from scalify_hlo.terms.table import Terms

LARGE_REPLICATED = 1 << 20  # bytes: a replicated input this large on every device is worth a look


def add_flags(prog: Program, result: Audit) -> None:
    _replicated_inputs(prog, result)
    _gather_then_slice(prog, result)
    _double_reductions(prog, result)


def _replicated_inputs(prog: Program, result: Audit) -> None:
    if prog.form != "spmd" or prog.mesh.size == 1:
        return
    for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True)):
        if isinstance(p.type, TensorType) and (layout is None or not layout.split_axes()) and \
                tensor_bytes(p.type) >= LARGE_REPLICATED:
            name = prog.func.arg_locs[i].op_name if i < len(prog.func.arg_locs) else None
            result.flags.append({"kind": "replicated", "message": f"input {i} ({name or p.name}, {p.type}, "
                                 f"{tensor_bytes(p.type):,} bytes) is fully replicated on all {prog.mesh.size} devices"})


def _gather_then_slice(prog: Program, result: Audit) -> None:
    users: dict[Any, list[Op]] = defaultdict(list)
    for op in walk(prog.func.body.ops):
        for v in op.operands:
            users[v].append(op)
    for op in walk(prog.func.body.ops):
        if op.opcode != "all_gather":
            continue
        for user in users[op.results[0]]:
            if user.opcode in ("slice", "dynamic_slice") and user.results[0].type == op.operands[0].type:
                result.flags.append({"kind": "resharding ping-pong", "message": (
                    f"{describe(op)} gathers data that {describe(user)} "
                    "slices back to the shard's shape")})


def _double_reductions(prog: Program, result: Audit) -> None:
    if prog.form != "spmd":
        return
    terms = Terms()
    d = Deriver(terms, prog.mesh)
    seeds = [Holds(terms.param(i, p.tensor), layout or Layout.replicated(p.tensor.rank))
             for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True))]
    d.region(prog.func.body, seeds)
    for op in walk(prog.func.body.ops):
        if op.opcode != "all_reduce" or not op.operands:
            continue
        f = d.facts.get(op.operands[0])
        if not isinstance(f, Holds):
            continue
        axes, _ = group_of(op, prog)
        wasted = [a for a in axes if a != "?" and a not in f.layout.partial_axes()]
        if wasted:
            result.flags.append({"kind": "reduction of a non-partial value", "message": (
                f"{describe(op)} reduces over {fmt_axes(tuple(wasted))}, where the value is not "
                "partial: a sum multiplies it by the group size (a reduction performed twice?)")})
