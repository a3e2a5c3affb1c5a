"""`scalify-hlo audit`: every collective of a distributed program with its mesh axes and traffic.

Bytes are what one device sends (and receives) per step with the usual ring algorithms:
all-reduce 2·(n-1)/n·S, all-gather and reduce-scatter (n-1)/n of the gathered / scattered tensor,
all-to-all (n-1)/n·S, collective-permute S (S the per-device operand, n the group size). Layers of an
unrolled model are found as repetitions of the same sequence of collectives (kind and source line).
Flags: large tensors replicated on every device, all-gather followed by a slice of the same data
(resharding ping-pong), collectives over size-1 groups, and reductions of values that are not partial
(from the prover's facts: summing replicated copies, i.e. a reduction performed twice).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Module, Op, TensorType, walk
from scalify_hlo.layout.mesh import Layout, axes_of_groups
from scalify_hlo.layout.program import COLLECTIVES, Program, prepare
from scalify_hlo.numeric.machine import np_dtype
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.rules.facts import Holds
from scalify_hlo.terms.table import Terms

LARGE_REPLICATED = 1 << 20  # bytes: a replicated input this large on every device is worth a look


@dataclass(frozen=True, slots=True)
class Collective:
    index: int
    kind: str
    instruction: str
    axes: tuple[str, ...]
    group_size: int
    bytes: int
    shape: tuple[int, ...]
    dtype: str
    source: str | None
    layer: int = 0


@dataclass
class Audit:
    path: str
    form: str
    mesh: str
    devices: int
    collectives: list[Collective] = field(default_factory=list)
    flags: list[dict[str, Any]] = field(default_factory=list)
    layers: int = 1

    @property
    def total_bytes(self) -> int:
        return sum(c.bytes for c in self.collectives)

    def by_kind_and_axes(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[f"{c.kind} over {_axes(c.axes)}"] += c.bytes
        return dict(out)

    def bytes_per_layer(self) -> list[int]:
        per = [0] * self.layers
        for c in self.collectives:
            per[c.layer] += c.bytes
        return per

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "form": self.form, "mesh": self.mesh, "devices": self.devices,
                "total_bytes_per_device": self.total_bytes, "by_kind_and_axes": self.by_kind_and_axes(),
                "layers": self.layers, "bytes_per_layer": self.bytes_per_layer(),
                "collectives": [asdict(c) for c in self.collectives], "flags": self.flags}

    def render(self) -> str:
        lines = [f"{self.path}: {self.form} program on mesh {self.mesh} ({self.devices} devices), "
                 f"{len(self.collectives)} collectives, {self.layers} layer(s)"]
        lines.append(f"{'#':>4} {'layer':>5} {'collective':<20} {'axes':<18} {'n':>4} {'bytes/device':>14}  source")
        for c in self.collectives:
            lines.append(f"{c.index:>4} {c.layer:>5} {c.kind:<20} {_axes(c.axes):<18} {c.group_size:>4} "
                         f"{c.bytes:>14,}  {c.source or '?'} ({c.instruction})")
        lines.append("per device per step:")
        for k, v in sorted(self.by_kind_and_axes().items()):
            lines.append(f"  {k:<40} {v:>14,} bytes")
        lines.append(f"  {'total':<40} {self.total_bytes:>14,} bytes")
        for f in self.flags:
            lines.append(f"flag: {f['kind']}: {f['message']}")
        return "\n".join(lines)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def _axes(axes: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in axes) + "}"


def _bytes(t: TensorType) -> int:
    try:
        width = np_dtype(t.dtype).itemsize
    except (ValueError, KeyError, TypeError):
        width = 4
    return int(np.prod(t.shape, dtype=np.int64)) * width


def _traffic(op: Op, n: int) -> int:
    if n <= 1:
        return 0
    ins = sum(_bytes(v.tensor) for v in op.operands if isinstance(v.type, TensorType))
    outs = sum(_bytes(v.tensor) for v in op.results if isinstance(v.type, TensorType))
    match op.opcode:
        case "all_reduce":
            return 2 * (n - 1) * ins // n
        case "all_gather":
            return (n - 1) * outs // n
        case "reduce_scatter" | "all_to_all":
            return (n - 1) * ins // n
        case _:
            return ins  # collective-permute / broadcast: the operand moves once


def _group(op: Op, prog: Program) -> tuple[tuple[str, ...], int]:
    if op.opcode in ("collective_permute", "collective_broadcast"):
        return (), 2
    if "channel_handle" not in op.attrs:
        return (), 1
    groups = op.attrs.get("replica_groups")
    arr = groups.array if isinstance(groups, Literal) else np.zeros((0,), dtype=np.int64)
    n = arr.shape[1] if arr.ndim == 2 and arr.size else prog.mesh.size
    try:
        return axes_of_groups(arr, prog.mesh, prog.mesh.size), n
    except ShardingError:
        return ("?",), n


def _layers(cs: list[Collective]) -> int:
    """The number of repetitions of the shortest period of (kind, source) in the collective sequence."""
    seq = [(c.kind, c.source) for c in cs]
    n = len(seq)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and all(seq[i] == seq[i % period] for i in range(n)):
            return n // period
    return 1


def audit(module: Module) -> Audit:
    prog = prepare(module)
    result = Audit(module.path, prog.form, prog.mesh.describe(), prog.mesh.size)
    ops = [op for op in walk(prog.func.body.ops) if op.opcode in COLLECTIVES]
    for i, op in enumerate(ops):
        axes, n = _group(op, prog)
        t = op.results[0].type if op.results else None
        shape = t.shape if isinstance(t, TensorType) else ()
        dtype = t.dtype if isinstance(t, TensorType) else "?"
        result.collectives.append(Collective(i, op.opcode, op.loc.name or op.describe(), axes, n, _traffic(op, n),
                                             tuple(shape), dtype, op.loc.site))
        if n == 1 or (axes and prog.mesh.size_of(a for a in axes if a != "?") == 1 and "?" not in axes):
            result.flags.append({"kind": "size-1 group", "message": f"{op.describe()} at {op.loc.site} runs over a "
                                 "group of one device: it moves nothing and costs a launch"})
    result.layers = _layers(result.collectives)
    if result.layers > 1:
        period = len(result.collectives) // result.layers
        result.collectives = [
            Collective(c.index, c.kind, c.instruction, c.axes, c.group_size, c.bytes, c.shape, c.dtype, c.source,
                       c.index // period) for c in result.collectives]
    _flag_replicated_inputs(prog, result)
    _flag_gather_then_slice(prog, result)
    _flag_double_reductions(prog, result)
    return result


def _flag_replicated_inputs(prog: Program, result: Audit) -> None:
    if prog.form != "spmd" or prog.mesh.size == 1:
        return
    for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True)):
        if isinstance(p.type, TensorType) and (layout is None or not layout.split_axes()) and \
                _bytes(p.type) >= LARGE_REPLICATED:
            name = prog.func.arg_locs[i].op_name if i < len(prog.func.arg_locs) else None
            result.flags.append({"kind": "replicated", "message": f"input {i} ({name or p.name}, {p.type}, "
                                 f"{_bytes(p.type):,} bytes) is fully replicated on all {prog.mesh.size} devices"})


def _flag_gather_then_slice(prog: Program, result: Audit) -> None:
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
                    f"{op.describe()} at {op.loc.site} gathers data that {user.describe()} at {user.loc.site} "
                    "slices back to the shard's shape")})


def _flag_double_reductions(prog: Program, result: Audit) -> None:
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
        axes, _ = _group(op, prog)
        wasted = [a for a in axes if a != "?" and a not in f.layout.partial_axes()]
        if wasted:
            result.flags.append({"kind": "reduction of a non-partial value", "message": (
                f"{op.describe()} at {op.loc.site} reduces over {_axes(tuple(wasted))}, where the value is not "
                "partial: a sum multiplies it by the group size (a reduction performed twice?)")})


def plot(a: Audit, path: str) -> None:
    """A bar chart of bytes per device per layer (matplotlib, an optional extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib: pip install 'scalify-hlo[plot]'") from err
    per = a.bytes_per_layer()
    fig, ax = plt.subplots(figsize=(max(4, len(per) * 0.3), 3))
    ax.bar(range(len(per)), per)
    ax.set_xlabel("layer")
    ax.set_ylabel("bytes per device")
    ax.set_title(f"{a.path}: collectives per layer")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)

