"""Mutations of correct after-programs: the miscompiles a partitioner (or a hand-written shard_map) makes.

Each mutation rewrites one op of the inlined entry function of a module and returns a new module (the
IR is immutable; values keep their identity, so untouched ops are shared).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from scalify_hlo.ir.inline import inline
from scalify_hlo.ir.nodes import Func, Literal, Module, Op, Region, Value

KINDS = ("replica_groups", "reducer", "drop_collective", "constant", "table", "swap_operands")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")
NON_COMMUTATIVE = ("subtract", "divide", "power", "remainder", "atan2")
_REDUCERS = {"add": "maximum", "maximum": "add", "minimum": "add", "multiply": "add"}


@dataclass(frozen=True)
class Mutant:
    kind: str
    op: Op
    module: Module

    def describe(self) -> str:
        return f"{self.kind} at {self.op.describe()}"


def _ops(region: Region) -> Iterator[Op]:
    for op in region.ops:
        yield op
        for r in op.regions:
            if op.opcode in ("manual_computation", "while", "case"):
                yield from _ops(r)


def sites(module: Module, kind: str, f: Func | None = None) -> list[Op]:
    """The ops of `module`'s (inlined) entry that mutation `kind` can change."""
    f = f or inline(module)
    out = []
    for op in _ops(f.body):
        if kind in ("replica_groups", "drop_collective") and op.opcode in COLLECTIVES:
            if kind == "drop_collective" and op.operands[0].type != op.results[0].type:
                continue
            if kind == "replica_groups" and not isinstance(op.attrs.get("replica_groups"), Literal):
                continue
            out.append(op)
        elif kind == "reducer" and op.opcode in ("all_reduce", "reduce_scatter") and op.regions:
            if len(op.regions[0].ops) == 1 and op.regions[0].ops[0].opcode in _REDUCERS:
                out.append(op)
        elif kind == "constant" and op.opcode == "constant":
            lit = op.attrs["value"]
            if isinstance(lit, Literal) and lit.array.size >= 1 and lit.dtype not in ("i1",):
                out.append(op)
        elif kind == "table" and op.opcode == "constant":
            lit = op.attrs["value"]
            if isinstance(lit, Literal) and lit.array.ndim == 1 and lit.array.size > 1 and not lit.is_splat:
                out.append(op)
        elif kind == "swap_operands" and op.opcode in NON_COMMUTATIVE and op.operands[0].type == op.operands[1].type:
            out.append(op)
    return out


def mutate(module: Module, kind: str, index: int, rng: np.random.Generator) -> Mutant | None:
    f = inline(module)
    candidates = sites(module, kind, f)
    if not candidates:
        return None
    op = candidates[index % len(candidates)]
    new, subst = _mutated_op(op, kind, rng)
    body = _rebuild(f.body, op, new, subst)
    func = dataclasses.replace(f, body=body)
    funcs = {name: (func if name == module.entry else g) for name, g in module.funcs.items()}
    return Mutant(kind, op, dataclasses.replace(module, funcs=funcs))


def _mutated_op(op: Op, kind: str, rng: np.random.Generator) -> tuple[Op | None, dict[Value, Value]]:
    if kind == "drop_collective":
        return None, {op.results[0]: op.operands[0]}
    if kind == "replica_groups":
        groups = op.attrs["replica_groups"]
        assert isinstance(groups, Literal)
        g = groups.array
        flat = g.reshape(-1)
        n = flat.size
        # The groups over the other axes: transpose the [G, S] grid (same devices, other fibres), or,
        # for a single group, reorder it.
        new = g.T.copy() if g.shape[0] > 1 and g.shape[1] > 1 else np.roll(flat, 1).reshape(g.shape)
        if n > 1 and new.shape[0] * new.shape[1] == n:
            return dataclasses.replace(op, attrs=op.attrs.replace(replica_groups=Literal(new, groups.dtype))), {}
        return None, {}
    if kind == "reducer":
        region = op.regions[0]
        inner = region.ops[0]
        swapped = dataclasses.replace(inner, opcode=_REDUCERS[inner.opcode])
        return dataclasses.replace(op, regions=(dataclasses.replace(region, ops=(swapped,)),)), {}
    if kind in ("constant", "table"):
        lit = op.attrs["value"]
        assert isinstance(lit, Literal)
        a = lit.array.copy()
        if kind == "table":
            a = np.roll(a, 1)
        elif a.dtype.kind == "f":
            with np.errstate(over="ignore"):  # -FLT_MAX (a mask value) becomes -inf: still a mutation
                a = a * np.asarray(1.5, a.dtype) + np.asarray(0.25, a.dtype)
        else:
            a = a + np.asarray(1, a.dtype)
        return dataclasses.replace(op, attrs=op.attrs.replace(value=Literal(a, lit.dtype))), {}
    if kind == "swap_operands":
        return dataclasses.replace(op, operands=(op.operands[1], op.operands[0], *op.operands[2:])), {}
    raise ValueError(kind)


def _rebuild(region: Region, target: Op, new: Op | None, subst: dict[Value, Value]) -> Region:
    ops: list[Op] = []
    for op in region.ops:
        if op is target:
            if new is not None:
                ops.append(new)
            continue
        operands = tuple(subst.get(v, v) for v in op.operands)
        regions = tuple(_rebuild(r, target, new, subst) for r in op.regions)
        if operands != op.operands or any(a is not b for a, b in zip(regions, op.regions, strict=True)):
            op = dataclasses.replace(op, operands=operands, regions=regions)
        ops.append(op)
    results = tuple(subst.get(v, v) for v in region.results)
    return Region(region.args, tuple(ops), results)


def as_func(module: Module) -> Func:
    return module.funcs[module.entry]


# `make test` checks every fourth mutation site; `make test-slow` all of them.
SWEEP = [pytest.param(4, id="sampled"), pytest.param(1, id="every_site", marks=pytest.mark.slow)]


def every_mutant_checked(before: Module, after: Module, verify: Callable[[Module, Module], str],
                         seeds: tuple[int, ...] = (0, 1), stride: int = 1) -> dict[str, int]:
    """Every single-op mutation of `after` (each seed; every `stride`-th site of each kind), verified;
    whatever is `equivalent` must agree with the numeric oracle on random inputs. Returns how many mutants
    got each verdict."""
    from scalify_hlo.numeric import machine as numeric
    from scalify_hlo.numeric import trials

    seen: dict[str, int] = {}
    for kind in KINDS:
        for index in range(0, len(sites(after, kind)), stride):
            for seed in seeds:
                mutant = mutate(after, kind, index, np.random.default_rng(seed))
                if mutant is None:
                    continue
                verdict = verify(before, mutant.module)
                seen[verdict] = seen.get(verdict, 0) + 1
                if verdict != "equivalent":
                    continue
                ref, out = numeric.run_pair(before, mutant.module, trials.random_inputs(before, seed))
                cmp = trials.compare(ref, out, rtol=2e-2, atol=2e-3)
                assert cmp.ok, f"FALSE EQUIVALENT: {mutant.describe()}: {cmp.reason}"
    return seen
