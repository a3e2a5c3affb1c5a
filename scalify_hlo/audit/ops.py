"""What the audit reads off one op: its name for the user, the devices it combines, the bytes it moves,
(trip counts of loops are `ir.loops`)."""

from __future__ import annotations

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType
from scalify_hlo.layout.groups import axes_of_groups, axes_of_pairs, device_groups, has_channel
from scalify_hlo.layout.program import Program
from scalify_hlo.numeric.machine import np_dtype
from scalify_hlo.report.verdicts import user_name


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
