"""Per-device offset tables of a partitioned module, read as device groups for mesh inference.

XLA's partitioner takes a device's block with a dynamic-slice whose start is looked up from the partition
id through constant tables (`table_2[table_1[table_0[partition-id]]] · k`). When the block index is that
of part of a mesh axis (GQA's 2 key heads over a tp axis of 4: the major half of tp, `tp:(1)2`), no
sharding or replica group of the module cuts the axis there, and the dynamic-slice could not be read as a
shard. The devices that share a start form groups like replica groups do; handed to `infer_mesh` as
optional arrays, they refine the mesh where the tables cut it. Only the mesh is shaped here: whether a
slice is a shard is still decided by the rules (`rules/indexing.py`), so a table misread costs a proof,
never soundness.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from scalify_hlo.ir.nodes import Func, Literal, Op, Value, walk

_MAX_TABLE = 1 << 16  # constants larger than this are data, not offset tables
_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": np.add, "subtract": np.subtract, "multiply": np.multiply, "maximum": np.maximum,
    "minimum": np.minimum,
}
_SOURCES = frozenset({"partition_id", "constant"})
_READ = frozenset({*_SOURCES, "reshape", "convert", "dynamic_slice", "divide", *_BINARY})


def offset_groups(func: Func, num_devices: int) -> Iterator[np.ndarray]:
    """For each distinct per-device start index of a dynamic-slice or dynamic-update-slice, the groups of
    devices sharing a value ([groups, size], ids ascending), where every group has the same size."""
    dev: dict[Value, np.ndarray] = {}  # per-device scalars: [num_devices]
    const: dict[Value, np.ndarray] = {}
    seen: set[bytes] = set()
    for op in walk(func.body.ops):
        code = op.opcode
        if code in ("dynamic_slice", "dynamic_update_slice"):
            first = 1 if code == "dynamic_slice" else 2
            for v in op.operands[first:]:
                table = dev.get(v)
                if table is not None and (key := table.tobytes()) not in seen:
                    seen.add(key)
                    groups = _groups(table)
                    if groups is not None:
                        yield groups
        if code in _READ and (code in _SOURCES or (op.operands and (op.operands[0] in dev or op.operands[-1] in dev))):
            _evaluate(op, dev, const, num_devices)  # (ops that read nothing per device are most of a model)


def _evaluate(op: Op, dev: dict[Value, np.ndarray], const: dict[Value, np.ndarray], n: int) -> None:
    if len(op.results) != 1:
        return
    out = op.results[0]
    code = op.opcode
    if code == "partition_id":
        dev[out] = np.arange(n, dtype=np.int64)
    elif code == "constant":
        lit = op.attrs.get("value")
        if isinstance(lit, Literal) and lit.array.size <= _MAX_TABLE and lit.array.dtype.kind in "iub":
            const[out] = lit.array.astype(np.int64)
    elif code in ("reshape", "convert") and op.operands:
        x = op.operands[0]
        if x in dev:
            dev[out] = dev[x]
        elif x in const and code == "reshape":
            const[out] = const[x].reshape(-1)
    elif code == "dynamic_slice" and len(op.operands) == 2:
        table, index = const.get(op.operands[0]), dev.get(op.operands[1])
        if table is not None and index is not None and table.ndim == 1:
            dev[out] = table[np.clip(index, 0, table.size - 1)]
    elif code in _BINARY and len(op.operands) == 2:
        a, b = (dev.get(v, _scalar(const.get(v))) for v in op.operands)
        if a is not None and b is not None and any(v in dev for v in op.operands):
            dev[out] = _BINARY[code](a, b)
    elif code == "divide" and len(op.operands) == 2:
        a, b = dev.get(op.operands[0]), _scalar(const.get(op.operands[1]))
        if a is not None and b is not None and b > 0 and np.all(a >= 0):
            dev[out] = a // b  # (an integer divide truncates: the same for non-negative operands)


def _scalar(x: np.ndarray | None) -> np.ndarray | None:
    return x.reshape(()) if x is not None and x.size == 1 else None


def _groups(table: np.ndarray) -> np.ndarray | None:
    _, inverse, counts = np.unique(table, return_inverse=True, return_counts=True)
    if counts.size < 2 or counts.size == table.size or np.any(counts != counts[0]):
        return None
    return np.argsort(inverse, kind="stable").reshape(counts.size, int(counts[0]))
