"""The audit's flags: patterns in a partitioned program worth a look, each with the op and source line."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from scalify_hlo.audit.ops import describe, group_of, tensor_bytes
from scalify_hlo.audit.report import Audit, fmt_axes
from scalify_hlo.ir.nodes import Op, TensorType, Value, walk
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.layout.program import Program
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.rules.facts import Fact, Holds
from scalify_hlo.terms.table import Terms

LARGE_REPLICATED = 1 << 20  # bytes: a replicated input this large on every device is worth a look


def add_flags(prog: Program, result: Audit) -> None:
    facts = _facts(prog)
    _replicated_inputs(prog, result)
    _unsplit_among_split_peers(prog, result)
    _gather_then_slice(prog, result)
    _gathered_twice(prog, result, facts)
    _double_reductions(prog, result, facts)


def _facts(prog: Program) -> dict[Value, Fact]:
    """The prover's facts of a GSPMD program's values (what each holds and how it is laid out); none for a
    shard_map body, whose values are per-device blocks the derivation reads differently."""
    if prog.form != "spmd":
        return {}
    terms = Terms()
    d = Deriver(terms, prog.mesh)
    seeds = [Holds(terms.param(i, p.tensor), layout or Layout.replicated(p.tensor.rank))
             for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True))]
    d.region(prog.func.body, seeds)
    return d.facts


def _input_name(prog: Program, i: int) -> str:
    name = prog.func.arg_locs[i].op_name if i < len(prog.func.arg_locs) else None
    return name or prog.func.params[i].name or f"%{i}"


def _unsplit_among_split_peers(prog: Program, result: Audit) -> None:
    """An input left whole over an axis that inputs of the same shape are split over: optimizer state
    replicated where the parameters it updates are FSDP/zero-1 sharded, or one parameter of a stack
    missed by the sharding rules."""
    if prog.mesh.size == 1:
        return
    peers: dict[tuple[tuple[int, ...], str], list[int]] = defaultdict(list)
    for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True)):
        if isinstance(p.type, TensorType) and p.type.rank and int(np.prod(p.type.shape)) > 1:
            shape = p.type.shape
            if prog.form == "spmd" and layout is not None:  # a GSPMD program's parameters are the shards
                shape = tuple(n * prog.mesh.size_of(axes) for n, axes in zip(shape, layout.dims, strict=True))
            peers[(shape, p.type.dtype)].append(i)
    for group in peers.values():
        layouts = {i: prog.in_layouts[i] for i in group}
        split = {i: (lay.split_axes() if lay is not None else frozenset()) for i, lay in layouts.items()}
        for i in group:
            for axis in sorted(frozenset().union(*split.values()) - split[i]):
                others = [j for j in group if axis in split[j]]
                names = ", ".join(f"input {j} ({_input_name(prog, j)})" for j in others[:3])
                more = f" and {len(others) - 3} more" if len(others) > 3 else ""
                result.flags.append({"kind": "not split like its peers", "message": (
                    f"input {i} ({_input_name(prog, i)}, {prog.func.params[i].type}) is not split over "
                    f"{fmt_axes((axis,))} while {names}{more} of the same global shape {'is' if len(others) == 1 else 'are'} split: FSDP/zero-1 sharding "
                    "intended for it too?")})


def _gathered_twice(prog: Program, result: Audit, facts: dict[Value, Fact]) -> None:
    """All-gathers of the same data (the same value, or one the prover shows holds the same tensor) over
    the same devices: the second moves again what the first one brought (FSDP's re-gather in the backward
    pass trades this traffic for memory; elsewhere it is waste)."""
    first: dict[tuple[Any, ...], Op] = {}
    for op in walk(prog.func.body.ops):
        if op.opcode != "all_gather" or not op.operands:
            continue
        f = facts.get(op.operands[0])
        data: Any = (f.term.id, f.layout) if isinstance(f, Holds) else op.operands[0]
        key = (data, str(op.attrs.get("all_gather_dim", op.attrs.get("dimensions"))), group_of(op, prog))
        if key in first:
            result.flags.append({"kind": "gathered twice", "message": (
                f"{describe(op)} gathers the same data over the same devices as {describe(first[key])} "
                "(a re-gather: intended to save memory?)")})
        else:
            first[key] = op


def _replicated_inputs(prog: Program, result: Audit) -> None:
    if prog.form != "spmd" or prog.mesh.size == 1:
        return
    for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True)):
        if isinstance(p.type, TensorType) and (layout is None or not layout.split_axes()) and \
                tensor_bytes(p.type) >= LARGE_REPLICATED:
            result.flags.append({"kind": "replicated", "message": f"input {i} ({_input_name(prog, i)}, {p.type}, "
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


def _double_reductions(prog: Program, result: Audit, facts: dict[Value, Fact]) -> None:
    for op in walk(prog.func.body.ops):
        if op.opcode != "all_reduce" or not op.operands:
            continue
        f = facts.get(op.operands[0])
        if not isinstance(f, Holds):
            continue
        axes, _ = group_of(op, prog)
        wasted = [a for a in axes if a != "?" and a not in f.layout.partial_axes()]
        if wasted:
            result.flags.append({"kind": "reduction of a non-partial value", "message": (
                f"{describe(op)} reduces over {fmt_axes(tuple(wasted))}, where the value is not "
                "partial: a sum multiplies it by the group size (a reduction performed twice?)")})
