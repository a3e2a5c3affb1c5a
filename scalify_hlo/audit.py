"""`scalify-hlo audit`: every collective of a distributed program with its mesh axes and traffic.

Bytes are what one device sends (and receives) per execution with the usual ring algorithms (`BYTE_MODEL`):
all-reduce 2·(n-1)/n·S, all-gather and reduce-scatter (n-1)/n of the gathered / scattered tensor,
all-to-all (n-1)/n·S, collective-permute S (S the per-device operand, n the group size). A collective
inside `while` loops runs once per iteration: per step it counts × the loops' trip counts when they are
static (a counter from a constant compared with a constant, stepped by a constant: `fori_loop`, `scan`).
Layers of an unrolled model are found as repetitions of the same sequence of collectives (kind and source
line); those of a scanned one are the iterations of the loop that holds the collectives.

Mesh axes are named as the user named them: the module's `sdy.mesh`, else the reference program's
(`reference=`, the program before partitioning: partitioned HLO keeps no axis names); without either
they are numbered by position (axis_0, ...), and the report says so.
Flags: large tensors replicated on every device, all-gather followed by a slice of the same data
(resharding ping-pong), collectives over size-1 groups, and reductions of values that are not partial
(from the prover's facts: summing replicated copies, i.e. a reduction performed twice).
"""

from __future__ import annotations

import dataclasses
import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Module, Op, TensorType, Value, walk
from scalify_hlo.layout.groups import axes_of_groups, device_groups, has_channel
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.layout.program import COLLECTIVES, Program, prepare
from scalify_hlo.numeric.machine import np_dtype
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.report.verdicts import user_name
from scalify_hlo.rules.facts import Holds
from scalify_hlo.terms.table import Terms

LARGE_REPLICATED = 1 << 20  # bytes: a replicated input this large on every device is worth a look
MAX_TRIPS = 1 << 24  # a static loop counted further than this is treated as of unknown trip count
# Bytes one device sends per execution, by collective kind (ring algorithms); stated in every report.
BYTE_MODEL: dict[str, str] = {
    "all_reduce": "2·(n-1)/n·S (ring: reduce-scatter then all-gather)",
    "all_gather": "(n-1)/n·S_out (ring; S_out the gathered result)",
    "reduce_scatter": "(n-1)/n·S (ring)",
    "all_to_all": "(n-1)/n·S (each device keeps 1/n)",
    "collective_permute": "S (the operand moves once)",
    "collective_broadcast": "S (the operand moves once)",
}


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
    layer: int | None = 0  # the layer of an unrolled model; None when not in one (scanned models: see `loop`)
    executions: int = 1  # per step: the product of the static trip counts of the loops around it
    loops: tuple[str, ...] = ()  # the `while` loops around it, outermost first (instruction or source line)

    @property
    def step_bytes(self) -> int:
        return self.bytes * self.executions

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_per_step": self.step_bytes}


@dataclass
class Audit:
    path: str
    form: str
    mesh: str
    devices: int
    collectives: list[Collective] = field(default_factory=list)
    flags: list[dict[str, Any]] = field(default_factory=list)
    layers: int = 1
    layers_from: str | None = None  # "repeated collectives", or the scanned loop whose iterations are layers
    axis_names: str = "module"  # where the axis names come from: "module", "reference" or "positions"
    loops: list[dict[str, Any]] = field(default_factory=list)  # every while loop: where, trip count

    @property
    def total_bytes(self) -> int:
        return sum(c.step_bytes for c in self.collectives)

    def by_kind_and_axes(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[f"{c.kind} over {_axes(c.axes)}"] += c.step_bytes
        return dict(out)

    def bytes_per_layer(self) -> list[int]:
        """Bytes per device of each layer: of an unrolled model, its collectives; of a scanned one, one
        iteration of the scanned loop (collectives outside it belong to no layer)."""
        per = [0] * self.layers
        for c in self.collectives:
            if c.layer is not None:
                per[c.layer] += c.step_bytes
            elif self.layers_from is not None and self.layers_from in c.loops:
                for k in range(self.layers):
                    per[k] += c.step_bytes // self.layers
        return per

    def byte_model(self) -> dict[str, str]:
        kinds = {c.kind for c in self.collectives}
        return {k: v for k, v in BYTE_MODEL.items() if k in kinds}

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "form": self.form, "mesh": self.mesh, "axis_names": self.axis_names,
                "devices": self.devices, "total_bytes_per_device": self.total_bytes,
                "by_kind_and_axes": self.by_kind_and_axes(),
                "byte_model": {"algorithm": "ring", "unit": "bytes one device sends per execution",
                               "S": "the per-device operand", "n": "the group size", "kinds": self.byte_model()},
                "layers": self.layers, "layers_from": self.layers_from, "bytes_per_layer": self.bytes_per_layer(),
                "loops": self.loops, "collectives": [c.to_json() for c in self.collectives], "flags": self.flags}

    def render(self) -> str:
        how = ""
        if self.layers > 1 and self.layers_from is not None:
            scan = next((loop for loop in self.loops if loop["where"] == self.layers_from), None)
            at = f" at {scan['source']}" if scan and scan["source"] else ""
            how = f" (the iterations of loop {self.layers_from}{at})" if scan else f" ({self.layers_from})"
        lines = [f"{self.path}: {self.form} program on mesh {self.mesh} ({self.devices} devices), "
                 f"{len(self.collectives)} collectives, {self.layers} layer(s){how}"]
        if self.axis_names == "positions":
            lines.append("note: the module names no mesh axes (numbered by position here); pass --reference "
                         "with the program before partitioning to see yours")
        lines.append(f"{'#':>4} {'layer':>5} {'collective':<20} {'axes':<18} {'n':>4} {'bytes/device':>14} "
                     f"{'×':>4}  source")
        for c in self.collectives:
            layer = str(c.layer) if c.layer is not None else "each" if self.layers_from in c.loops else "-"
            lines.append(f"{c.index:>4} {layer:>5} {c.kind:<20} {_axes(c.axes):<18} {c.group_size:>4} "
                         f"{c.bytes:>14,} {c.executions:>4}  {c.source or '?'} ({c.instruction})")
        for loop in self.loops:
            count = loop["trips"] if loop["trips"] is not None else "unknown (counted once)"
            if not loop["collectives"]:
                continue
            at = f" at {loop['source']}" if loop["source"] else ""
            lines.append(f"loop {loop['where']}{at}: {count} trip(s) per run, {loop['collectives']} collective(s) inside")
        lines.append("per device per step (× = executions per step):")
        for k, v in sorted(self.by_kind_and_axes().items()):
            lines.append(f"  {k:<40} {v:>14,} bytes")
        lines.append(f"  {'total':<40} {self.total_bytes:>14,} bytes")
        lines.append("byte model (ring; S the per-device operand, n the group size; per execution):")
        for kind, model in self.byte_model().items():
            lines.append(f"  {kind:<20} {model}")
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
    if not has_channel(op):
        return (), 1
    arr = device_groups(op, prog.mesh.size)
    n = arr.shape[1]
    try:
        return axes_of_groups(arr, prog.mesh, prog.mesh.size), n
    except ShardingError:
        return ("?",), n


def _layers(cs: list[Collective], ops: list[Op], producers: dict[Value, Op],
            parents: dict[Value, tuple[Value, ...]]) -> int:
    """The number of repetitions of the shortest period of (kind, source) in the collective sequence whose
    second repetition reads what the first one moved: layers feed each other, where two collectives of one
    call (a `ppermute` of a tuple) repeat without a data dependence."""
    seq = [(c.kind, c.source) for c in cs]
    n = len(seq)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and all(seq[i] == seq[i % period] for i in range(n)) and \
                _reads(ops[period:2 * period], ops[:period], producers, parents):
            return n // period
    return 1


def _reads(later: list[Op], earlier: list[Op], producers: dict[Value, Op],
           parents: dict[Value, tuple[Value, ...]]) -> bool:
    """Whether a result of an op in `earlier` flows into an op in `later` within one iteration: regions'
    arguments stand for their op's operands (not for values carried from the previous iteration), an op
    with regions for everything computed inside them."""
    targets = {id(op) for op in earlier}
    seen: set[int] = set()
    stack = [v for op in later for v in op.operands]
    while stack:
        v = stack.pop()
        if v in parents:
            if id(v) not in seen:
                seen.add(id(v))
                stack.extend(parents[v])
            continue
        op = producers.get(v)
        if op is None or id(op) in seen:
            continue
        if id(op) in targets:
            return True
        seen.add(id(op))
        stack.extend(op.operands)
        stack.extend(r for region in op.regions for r in region.results)
    return False


def audit(module: Module, reference: Module | None = None) -> Audit:
    """The audit of a distributed program; `reference` (the program before partitioning) names its mesh
    axes when the module itself does not."""
    hint = None
    if reference is not None and not module.meshes:
        ref_mesh = prepare(reference).mesh
        hint = ref_mesh if ref_mesh.size == module.num_partitions and ref_mesh.size > 1 else None
    prog = prepare(module, hint)
    names = "module" if module.meshes else "reference" if hint is not None else "positions"
    result = Audit(module.path, prog.form, prog.mesh.describe(), prog.mesh.size, axis_names=names)
    producers = {v: op for op in walk(prog.func.body.ops) for v in op.results}
    around: list[tuple[Op, tuple[str, ...], int]] = []  # (collective, loops around it, executions per step)
    loops: dict[str, dict[str, Any]] = {}

    def visit(ops: tuple[Op, ...], where: tuple[str, ...], times: int) -> None:
        for op in ops:
            if op.opcode in COLLECTIVES:
                around.append((op, where, times))
            if op.opcode == "while" and len(op.regions) == 2:
                trips = _trip_count(op, producers)
                name = _name(op)
                loops[name] = {"where": name, "source": op.loc.site, "trips": trips, "collectives": 0}
                for region in op.regions:
                    visit(region.ops, (*where, name), times * (trips if trips is not None else 1))
            else:
                for region in op.regions:
                    visit(region.ops, where, times)

    visit(prog.func.body.ops, (), 1)
    for i, (op, where, times) in enumerate(around):
        axes, n = _group(op, prog)
        t = op.results[0].type if op.results else None
        shape = t.shape if isinstance(t, TensorType) else ()
        dtype = t.dtype if isinstance(t, TensorType) else "?"
        for name in where:
            loops[name]["collectives"] += 1
        result.collectives.append(Collective(i, op.opcode, _name(op), axes, n, _traffic(op, n), tuple(shape), dtype,
                                             op.loc.site, executions=times, loops=where))
        if n == 1 or (axes and prog.mesh.size_of(a for a in axes if a != "?") == 1 and "?" not in axes):
            result.flags.append({"kind": "size-1 group", "message": f"{_what(op)} runs over a group of one device: "
                                 "it moves nothing and costs a launch"})
    result.loops = list(loops.values())
    for loop in result.loops:
        if loop["trips"] is None and loop["collectives"]:
            result.flags.append({"kind": "loop of unknown trip count", "message": (
                f"the loop {loop['where']} holds {loop['collectives']} collective(s) and its trip count is not "
                "static: they are counted once per step, a lower bound")})
    parents = {a: op.operands for op in walk(prog.func.body.ops) for region in op.regions for a in region.args}
    result.layers = _layers(result.collectives, [op for op, _, _ in around], producers, parents)
    if result.layers > 1:
        period = len(result.collectives) // result.layers
        result.layers_from = "repeated collectives"
        result.collectives = [dataclasses.replace(c, layer=c.index // period) for c in result.collectives]
    else:
        _scanned_layers(result)
    _flag_replicated_inputs(prog, result)
    _flag_gather_then_slice(prog, result)
    _flag_double_reductions(prog, result)
    return result


def _scanned_layers(result: Audit) -> None:
    """Layers of a scanned model: the iterations of the outermost static loop that holds collectives (the
    one whose collectives move the most bytes when several do); its collectives are in every layer."""
    outer = [loop for loop in result.loops if loop["trips"] and loop["trips"] > 1 and loop["collectives"]
             and any(c.loops[:1] == (loop["where"],) for c in result.collectives)]
    if not outer:
        return
    best = max(outer, key=lambda loop: sum(c.step_bytes for c in result.collectives if loop["where"] in c.loops))
    result.layers, result.layers_from = best["trips"], best["where"]
    result.collectives = [dataclasses.replace(c, layer=None) for c in result.collectives]


def _name(op: Op) -> str:
    """An op as the user can find it: its HLO instruction name, else JAX's op_name, else its opcode."""
    return user_name(op.loc.name or (op.results[0].name if op.results else None)) or op.loc.op_name or op.opcode


def _what(op: Op) -> str:
    """`all_gather (all-gather.3 at model.py:12)` for messages."""
    name = user_name(op.loc.name or (op.results[0].name if op.results else None))
    at = ", ".join(x for x in (name, f"at {op.loc.site}" if op.loc.site else None) if x)
    return f"{op.opcode} ({at})" if at else op.opcode


def _scalar(v: Value, producers: dict[Value, Op]) -> int | None:
    """The integer a scalar constant holds, else None."""
    op = producers.get(v)
    if op is None or op.opcode != "constant":
        return None
    lit = op.attrs.get("value")
    if not isinstance(lit, Literal) or lit.array.size != 1 or lit.array.dtype.kind not in "iu":
        return None
    return int(lit.array.reshape(()))


_COMPARE = {"LT": lambda a, b: a < b, "LE": lambda a, b: a <= b, "GT": lambda a, b: a > b,
            "GE": lambda a, b: a >= b, "NE": lambda a, b: a != b}
_FLIPPED = {"LT": "GT", "LE": "GE", "GT": "LT", "GE": "LE", "NE": "NE"}


def _trip_count(op: Op, producers: dict[Value, Op]) -> int | None:
    """The iterations of a `while` whose condition compares a carried counter with a constant, the counter
    starting at a constant and stepped by a constant add (or subtract) in the body; None otherwise."""
    cond, body = op.regions
    if len(cond.results) != 1:
        return None
    test = producers.get(cond.results[0])
    if test is None or test.opcode != "compare" or len(test.operands) != 2:
        return None
    direction = str(test.attrs.get("comparison_direction", ""))
    a, b = test.operands
    if a in cond.args and (bound := _scalar(b, producers)) is not None:
        k = cond.args.index(a)
    elif b in cond.args and (bound := _scalar(a, producers)) is not None and direction in _FLIPPED:
        k, direction = cond.args.index(b), _FLIPPED[direction]
    else:
        return None
    if direction not in _COMPARE or k >= len(op.operands) or k >= len(body.results):
        return None
    start = _scalar(op.operands[k], producers)
    step_op = producers.get(body.results[k])
    if start is None or step_op is None or step_op.opcode not in ("add", "subtract") or len(step_op.operands) != 2:
        return None
    x, y = step_op.operands
    counter = body.args[k]
    if x is counter:
        step = _scalar(y, producers)
    elif y is counter and step_op.opcode == "add":
        step = _scalar(x, producers)
    else:
        return None
    if step is None:
        return None
    step = -step if step_op.opcode == "subtract" else step
    holds = _COMPARE[direction]
    if not holds(start, bound):
        return 0
    if step == 0 or holds(start + step * MAX_TRIPS, bound):
        return None  # never ends, or too long to count: not a static layer count
    lo, hi = 0, MAX_TRIPS  # the first n with the condition false at start + n·step (monotone in n)
    while lo < hi:
        mid = (lo + hi) // 2
        if holds(start + step * mid, bound):
            lo = mid + 1
        else:
            hi = mid
    return lo


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
                    f"{_what(op)} gathers data that {_what(user)} "
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
                f"{_what(op)} reduces over {_axes(tuple(wasted))}, where the value is not "
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

