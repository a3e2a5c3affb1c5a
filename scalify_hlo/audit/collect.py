"""`audit()`: walk a partitioned program, list its collectives with their loops, count layers, add flags."""

from __future__ import annotations

import dataclasses
from typing import Any

from scalify_hlo.audit.flags import add_flags
from scalify_hlo.audit.ops import describe, group_of, name_of, traffic
from scalify_hlo.audit.report import Audit, Collective
from scalify_hlo.ir.loops import trip_count
from scalify_hlo.ir.nodes import Module, Op, TensorType, Value, walk
from scalify_hlo.layout.program import COLLECTIVES, Program, prepare, prepare_against


def audit(module: Module, reference: Module | None = None) -> Audit:
    """The audit of a distributed program; `reference` (the program before partitioning) names its mesh
    axes when the module itself does not."""
    ref = prepare(reference) if reference is not None else None
    prog = prepare_against(module, ref) if ref is not None else prepare(module)
    hint = ref is not None and not module.meshes and ref.mesh.size == module.num_partitions and ref.mesh.size > 1
    names = "module" if module.meshes else "reference" if hint else "positions"
    result = Audit(module.path, prog.form, prog.mesh.describe(), prog.mesh.size, axis_names=names)
    producers = {v: op for op in walk(prog.func.body.ops) for v in op.results}
    around: list[tuple[Op, tuple[str, ...], int]] = []  # (collective, loops around it, executions per step)
    loops: dict[str, dict[str, Any]] = {}

    def visit(ops: tuple[Op, ...], where: tuple[str, ...], times: int) -> None:
        for op in ops:
            if op.opcode in COLLECTIVES:
                around.append((op, where, times))
            if op.opcode == "while" and len(op.regions) == 2:
                trips = trip_count(op, producers)
                name = name_of(op)
                loops[name] = {"where": name, "source": op.loc.site, "trips": trips, "collectives": 0}
                for region in op.regions:
                    visit(region.ops, (*where, name), times * (trips if trips is not None else 1))
            else:
                for region in op.regions:
                    visit(region.ops, where, times)

    visit(prog.func.body.ops, (), 1)
    for i, (op, where, times) in enumerate(around):
        axes, n = group_of(op, prog)
        t = op.results[0].type if op.results else None
        shape = t.shape if isinstance(t, TensorType) else ()
        dtype = t.dtype if isinstance(t, TensorType) else "?"
        for name in where:
            loops[name]["collectives"] += 1
        result.collectives.append(Collective(i, op.opcode, name_of(op), axes, n, traffic(op, n), tuple(shape), dtype,
                                             op.loc.site, executions=times, loops=where))
        if n == 1 or (axes and prog.mesh.size_of(a for a in axes if a != "?") == 1 and "?" not in axes):
            result.flags.append({"kind": "size-1 group", "message": f"{describe(op)} runs over a group of one device: "
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
    result.outputs = [{"index": i, "type": str(v.type), "sharding": _output_sharding(prog, ref, i)}
                      for i, v in enumerate(prog.func.body.results)]
    add_flags(prog, result)
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


def _output_sharding(prog: Program, ref: Program | None, i: int) -> str:
    """How result `i` is laid out: declared by the module, else by the reference program (partitioned HLO
    text keeps no result shardings), else replicated when the reference's result has the same shape."""
    layout = prog.out_layouts[i]
    if layout is not None:
        return layout.describe(prog.mesh)
    if ref is None or i >= len(ref.out_layouts):
        return "not declared"
    hinted = ref.out_layouts[i]
    if hinted is not None:
        return f"{hinted.describe(prog.mesh)} (as the reference declares)"
    same = ref.func.body.results[i].type == prog.func.body.results[i].type
    return "replicated" if same and prog.form == "spmd" else "not declared"
