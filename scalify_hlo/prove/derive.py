"""The forward derivation of `Holds` facts through a program (the Datalog part of DESIGN §3).

The dataflow graph is acyclic inside a region, so the least fixpoint of the transfer rules is one pass
in program order; `while` bodies are handled by induction (see `engine.py`): a reference loop is a `loop`
term binding variables of its own (`while_terms`), an after loop is proven to reproduce it. The same
driver reads the before program: with a one-device mesh every fact is `Holds(term, replicated)`, so the
before program's terms come out of the very same rules, and structurally equal computations meet as the
same term.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from scalify_hlo.ir.nodes import Op, Region, Value, walk
from scalify_hlo.layout import boundary as layout_boundary
from scalify_hlo.layout.groups import keeps_without_channel
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.kernels import kernel_of
from scalify_hlo.numeric.machine import Machine, NumericUnsupported
from scalify_hlo.ops.attrs import region_key, term_attrs
from scalify_hlo.ops.reducers import top_k_of_call
from scalify_hlo.ops.registry import IDENTITY_CUSTOM_CALLS, OPS
from scalify_hlo.prove import branches, manual
from scalify_hlo.prove.egraph import Deadline
from scalify_hlo.prove.layers import LayerStats, Segments, plan
from scalify_hlo.prove.lift import lifted
from scalify_hlo.rules import boundary, halo, linalg, masked_moves, masking, rows, sorting
from scalify_hlo.rules import collectives as C
from scalify_hlo.rules import layout as L
from scalify_hlo.rules import spmd as S
from scalify_hlo.rules.facts import (
    Ctx,
    Fact,
    Failed,
    Holds,
    InWindow,
    PerBlock,
    Shifted,
    TupleFact,
    Varying,
    constant_term,
)
from scalify_hlo.rules.linalg import LAPACK_TARGETS
from scalify_hlo.terms import evaluate as termeval
from scalify_hlo.terms import ranges
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

# Small device-varying values (offsets, masks of shard bounds) are evaluated per device; past this many
# elements across all devices they are not, and the value must be understood symbolically instead.
VARYING_LIMIT = 1 << 22
FOLD_LIMIT = 1 << 20

# Ops whose per-device evaluation is index arithmetic, worth doing numerically.
_VARYING_OPS = frozenset({
    "abs", "add", "and", "broadcast_in_dim", "clamp", "compare", "concatenate", "convert", "divide",
    "dynamic_slice", "maximum", "minimum", "multiply", "negate", "not", "or", "remainder", "reshape",
    "select", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign", "slice", "subtract",
    "transpose", "xor", "iota",
})

Resync = Callable[[Holds, Op], Holds]
LoopBody = tuple[Op, tuple[Term, ...], Term, tuple[Term, ...]]  # (the loop, its variables, condition, bodies)
Loops = Callable[["Deriver", Op, tuple[Fact, ...]], tuple[Fact, ...]]


def _steps(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...] | None:
    """The facts of a step of a masked lookup or a halo exchange: values no device holds a block of yet,
    tracked per device by their own rule families until they are blocks again."""
    for family in (masking, rows, halo):
        if family.applies(ctx, op, facts) and (steps := family.transfer(ctx, op, facts)) is not None:
            return steps
    return None


def _settle(ctx: Ctx, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Indices shifted per device that no masking rule reads here, as the blocks they are."""
    return tuple(masked_moves.settled(ctx, f) if isinstance(f, Shifted) else
                 masked_moves.settled_mask(ctx, f) if isinstance(f, InWindow) else f for f in facts)


class Deriver:
    """Derives a fact for every value of a function, given facts for its parameters."""

    def __init__(self, terms: Terms, mesh: Mesh, resync: Resync | None = None,
                 known: Callable[[Term], int] | None = None, loops: Loops | None = None, plain: bool = False,
                 deadline: Deadline | None = None) -> None:
        self.terms = terms
        self.mesh = mesh
        self.deadline = deadline  # past it, ops are left unread (`op`)
        self.facts: dict[Value, Fact] = {}
        self._made_by: dict[Value, Op] = {}  # the op that made each value (`_as_rows` reads some again)
        self.resync = resync
        self.progress: Callable[[int, int], None] | None = None
        # How often each value is read (operands and region results, nested regions included), for the
        # rules that may call a value wrong only where nothing else reads it.
        self.uses: dict[Value, int] = {}
        self.ctx = Ctx(terms, mesh, self.fold, self.lift, self.varying, known or (lambda t: 0), self.source,
                       lambda v: self.uses.get(v, 2))
        self._fold_cache: dict[int, np.ndarray | None] = {}
        # Provenance of device-varying values, for localisation: which op computed a Varying, and which
        # Varying a lifted constant term came from.
        self.varying_op: dict[int, Op] = {}
        self.lifted_from: dict[int, Varying] = {}
        # Values inside a case-split shard_map body that differ per coordinate: the fact of the case that
        # reaches the outputs, shown in diagnostics (never reasoned with).
        self.case_views: dict[Value, Holds] = {}
        # ... and every case's term of each such value (None where a case holds no term), for localisation.
        self.case_terms: dict[Value, list[Term | None]] = {}
        # Reference loops already read (`while_terms`): each loop's condition and body terms, derived once
        # over the variables the loop binds, whatever it starts from (so a loop nest is read in linear time,
        # however often the induction re-reads the bodies around it); and those variables' names.
        self.loop_bodies: dict[tuple[int, ...], LoopBody | None] = {}
        self.loop_names: dict[tuple[Any, ...], int] = {}
        # An after loop that matches no reference loop: True gives it its own `loop` term (exact, so that
        # the outputs can be evaluated for a counterexample); False a failure, leaving the body open for
        # the case splits of a shard_map (`manual.manual` turns this off while they may still apply).
        self.loop_terms = False
        # Values made by a `Sharding` custom call, with its `mhlo.sharding` (the layout a GSPMD shard_map's
        # operand enters the body with: `rules/boundary.py`).
        self.annotated: dict[Value, str] = {}
        self.hooks: dict[str, Callable[[Deriver, Op, tuple[Fact, ...]], tuple[Fact, ...]]] = {
            "case": branches.conditional,
            "custom_call": _custom_call,
            "if": branches.conditional,
            "manual_computation": manual.manual,
            "while": loops if loops is not None else while_terms,
        }
        if plain:
            # Same-device-count comparison (two per-device programs): a collective or partition-id is an
            # opaque op that both sides must perform alike, not something to reason through.
            for opcode in (*_PLAIN_OPAQUE, "partition_id", "replica_id"):
                self.hooks[opcode] = _opaque

    # -- driving ----------------------------------------------------------------------------------------

    def sibling(self) -> Deriver:
        """A fresh derivation over the same terms and mesh (one case of a case split)."""
        return Deriver(self.terms, self.mesh, resync=self.resync, known=self.ctx.known, deadline=self.deadline)

    def region(self, region: Region, args: Sequence[Fact], keep_blocks: bool = False,
               layers: LayerStats | None = None) -> tuple[Fact, ...]:
        """Facts of the region's results. With `layers`, runs of alike segments (unrolled layers) are
        derived once each and substituted (`layers.py`), and what that did is counted there."""
        reads = _reads(region)
        for v in (*region.args, *(r for op in region.ops for r in op.results)):
            self.uses[v] = reads.get(v, 0)
        for v, f in zip(region.args, args, strict=True):
            self.facts[v] = f
        ops = region.ops
        segments: Segments | None = None
        if layers is not None and (found := plan(ops, self._memoizable)).runs:
            segments = Segments(ops, region.results, found, self.terms, self.facts, self.op, self.resync, layers)
        i = 0
        for run in segments.runs if segments is not None else ():
            for j in range(i, run.start):
                self._step(j, ops)
            assert segments is not None
            segments.derive(ops, run, self._without_resync)
            i = run.start + run.count * run.period
            if self.progress is not None:
                self.progress(i, len(ops))
        for j in range(i, len(ops)):
            self._step(j, ops)
        # A per-device scalar leaves a region only into a conditional that selects with it (`keep_blocks`);
        # elsewhere (loops, shard_map and program outputs) it is the failure found reading it as partial.
        return tuple(f.failure if isinstance(f, PerBlock) and not keep_blocks else masked_moves.settled(self.ctx, f)
                     for f in (self.facts[v] for v in region.results))

    def _step(self, i: int, ops: Sequence[Op]) -> None:
        self.op(ops[i])
        if self.progress is not None and i % 1024 == 1023:
            self.progress(i + 1, len(ops))

    def _memoizable(self, op: Op) -> bool:
        """Ops a layer template may hold: plain rules of the op table (no control flow, no hooks)."""
        return op.opcode not in self.hooks and (info := OPS.get(op.opcode)) is not None and info.transfer is not None

    def _without_resync(self, read: Callable[[], None]) -> None:
        # A template's terms are over leaves the reference never computes: nothing to resynchronise.
        resync, self.resync = self.resync, None
        try:
            read()
        finally:
            self.resync = resync

    def op(self, op: Op) -> None:
        if self.deadline is not None and self.deadline.passed():
            # Unread, not wrong: a failure without evidence, and the first such op is what the report names.
            out: tuple[Fact, ...] = tuple(self.ctx.unsupported(op, f"not read: {self.deadline.reason}")
                                          for _ in op.results)
        else:
            out = self._transfer(op, tuple(self.facts[v] for v in op.operands))
        if len(out) != len(op.results):
            out = tuple(self.ctx.unsupported(op, "results that do not match the rule") for _ in op.results)
        if self.resync is not None:
            out = tuple(self.resync(f, op) if isinstance(f, Holds) and not f.layout.partial else f for f in out)
        for v, f in zip(op.results, out, strict=True):
            self.facts[v] = f
            self._made_by[v] = op
            if isinstance(f, Varying):
                self.varying_op.setdefault(id(f), op)

    def _transfer(self, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        if op.opcode == "collective_permute" and (keeps := keeps_without_channel(op)) is not None:
            # (before every rule that reads its pairs, which name devices only with a channel)
            return facts if keeps else tuple(self.ctx.unsupported(op, "a collective-permute without a channel: "
                                                                  "cross-replica, so with one replica every device "
                                                                  "receives zeros") for _ in op.results)
        out = self._transfer_once(op, facts)
        if op.opcode in rows.RESCUED and any(isinstance(f, Failed) and not f.evidence for f in out) \
                and (rescued := rows.rescue(self.ctx, op, facts, lambda i: self._as_rows(op.operands[i]))) is not None:
            return rescued
        return out

    def _as_rows(self, v: Value, depth: int = 3) -> Fact | None:
        """`v` read again as rows by table (rules/rows.py) where a collective-permute, or a select between
        such rows, made it: the ordinary rules read a permute of blocks as a tensor of its own, and a select
        by a predicate per device as a masked tensor, which no table can join with the rows they came from."""
        src = self._made_by.get(v)
        if src is None or depth == 0:
            return None
        if src.opcode == "collective_permute":
            if keeps_without_channel(src) is not None:
                return None  # cross-replica: its pairs name no devices
            return rows.permuted(self.ctx, src, self.facts[src.operands[0]])
        if src.opcode == "select":
            again = rows.rescue(self.ctx, src, tuple(self.facts[u] for u in src.operands),
                                lambda i: self._as_rows(src.operands[i], depth - 1))
            return again[0] if again else None
        return None

    def _transfer_once(self, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        failed = next((f for f in facts if isinstance(f, Failed)), None)
        if failed is not None and op.opcode not in ("tuple", "get_tuple_element"):
            return tuple(failed for _ in op.results)
        if (block := next((f for f in facts if isinstance(f, PerBlock)), None)) is not None and not _carries(op):
            return tuple(block.failure for _ in op.results)  # a per-device scalar where it is not modelled
        if (steps := _steps(self.ctx, op, facts)) is not None:
            return steps
        settled = _settle(self.ctx, facts)
        if any(a is not b for a, b in zip(settled, facts, strict=True)):
            return self._transfer_once(op, settled)
        if op.opcode in self.hooks:
            return self.hooks[op.opcode](self, op, facts)
        if (info := OPS.get(op.opcode)) is not None and info.transfer is not None:
            return info.transfer(self.ctx, op, facts)
        return tuple(self.ctx.unsupported(op, "no transfer rule for this op") for _ in op.results)

    # -- device-varying values ----------------------------------------------------------------------------
    def source(self, v: Varying) -> Op | None:
        """The op that computed a device-varying value, looking through broadcasts and reshapes: the line
        that wrote an offset, not the one that used it."""
        op = self.varying_op.get(id(v))
        while op is not None and op.opcode in ("broadcast_in_dim", "reshape") and op.operands:
            f = self.facts.get(op.operands[0])
            before = self.varying_op.get(id(f)) if isinstance(f, Varying) else None
            if before is None:
                break
            op = before
        return op

    def fold(self, term: Term) -> np.ndarray | None:
        """The value of a term built only from constants and iotas, if it is small."""
        if term.id in self._fold_cache:
            return self._fold_cache[term.id]
        result = None
        if term.type.size <= FOLD_LIMIT and term.op not in ("param", "var"):
            result = termeval.evaluate_constant(term)
        self._fold_cache[term.id] = result
        return result

    def varying(self, op: Op, facts: tuple[Fact, ...]) -> Fact | None:
        if op.opcode not in _VARYING_OPS or len(op.results) != 1:
            return None
        n = self.mesh.size
        out_t = op.result.tensor
        if out_t.size * n > VARYING_LIMIT:
            return None
        arrays: list[Any] = []
        for f in facts:
            if isinstance(f, Varying):
                arrays.append(f.values)
            elif isinstance(f, Holds) and not f.layout.partial and not f.layout.split_axes():
                folded = self.fold(f.term)
                if folded is None:
                    return None
                arrays.append(np.broadcast_to(folded, (n, *folded.shape)))
            else:
                return None
        kernel = kernel_of(op.opcode)
        if kernel is None:
            return None
        try:
            (values,) = kernel(Machine(None, n), op, arrays)
        except (NumericUnsupported, ValueError, TypeError, IndexError):
            return None
        result = Varying(np.asarray(values), out_t)
        self.varying_op[id(result)] = op
        if out_t.rank >= 1 and out_t.size > 1:
            lifted = self.lift(result)
            if isinstance(lifted, Holds) and lifted.term.op in ("iota", "broadcast_in_dim"):
                return lifted  # a shard of a symbolic tensor (GSPMD's iota + offset): keep the symbol
        return result

    def _lifted(self, v: Varying, h: Holds) -> Holds:
        self.lifted_from.setdefault(h.term.id, v)
        return h

    def lift(self, f: Fact, like: Layout | None = None) -> Fact:
        """A device-varying value as the shard of a constant tensor under some layout, if it is one (one
        joining `like`, the layout of the tensors it meets, where there is one: `lift.lifted`)."""
        if not isinstance(f, Varying):
            return f
        values = np.asarray(f.values)
        t = f.type
        if np.all(values == values[:1]):
            return self._lifted(f, Holds(constant_term(values[0], t, self.terms), Layout.replicated(t.rank)))
        held = lifted(values, t, self.mesh, self.terms, like)
        if held is not None:
            return self._lifted(f, held)
        return Failed("a device-dependent value that is not the shard of any tensor", None, False)


def _carries(op: Op) -> bool:
    """Whether `op`'s rule carries per-device scalars (`PerBlock`, rules/perblock.py) on."""
    info = OPS.get(op.opcode)
    return op.opcode in ("case", "if", "tuple", "get_tuple_element") or (
        info is not None and info.transfer in (S.elementwise, S.identity, C.all_reduce, L.broadcast_in_dim, L.reshape))


_PLAIN_OPAQUE = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                 "collective_broadcast")


def _opaque(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """An op kept as an uninterpreted term of its operands and attributes. A variadic collective acts
    on each operand alone (that is what XLA's combiners rely on), so result i depends on operand i."""
    held: list[Term] = []
    for f in facts:
        g = d.lift(f)
        if not isinstance(g, Holds):
            return tuple(d.ctx.unsupported(op, "an operand without a term") for _ in op.results)
        held.append(g.term)
    attrs = term_attrs(op)
    out: list[Fact] = []
    per_operand = op.opcode in _PLAIN_OPAQUE and len(held) == len(op.results) > 1
    for i, r in enumerate(op.results):
        t = r.tensor
        args = (held[i],) if per_operand else tuple(held)
        out.append(Holds(d.terms.mk(op.opcode, args, attrs, t), Layout.replicated(t.rank)))
    return tuple(out)


def _reads(region: Region) -> Counter[Value]:
    """How often each value is read inside `region`: as an operand or a result, nested regions included."""
    reads: Counter[Value] = Counter(region.results)
    for op in walk(region.ops):
        reads.update(op.operands)
        for inner in op.regions:
            reads.update(inner.results)
    return reads


def while_terms(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A loop of the reference program: result `k` is `loop(inits, vars, cond, bodies)[k]`, the condition
    and the bodies being the loop's regions read over variables the term binds (`loop_term`). The after
    program's loop is proven to reproduce it by induction (engine.py). A loop whose regions cannot be read
    stays a term of its initial values and the regions' structure, opaque but still comparable."""
    inits: list[Term] = []
    for f in facts:
        g = d.lift(f)
        if not isinstance(g, Holds) or g.layout != Layout.replicated(g.term.type.rank):
            return tuple(d.ctx.unsupported(op, "a loop over values that are not global") for _ in op.results)
        inits.append(g.term)
    captured: list[Term] = []
    free = _captured(op)
    for v in free:
        g = d.lift(d.facts[v])
        if not isinstance(g, Holds):
            return tuple(d.ctx.unsupported(op, "a loop that captures a non-tensor") for _ in op.results)
        captured.append(g.term)
    body = _loop_body(d, op, captured)
    if body is not None:
        _, loop_vars, cond, bodies = body
        return tuple(Holds(t, Layout.replicated(t.type.rank)) for t in loop_term(d, inits, loop_vars, cond, bodies))
    keys = (("cond", region_key(op.regions[0], free)), ("body", region_key(op.regions[1], free)))
    out: list[Fact] = []
    for k, r in enumerate(op.results):
        t = r.tensor
        out.append(Holds(d.terms.mk("while", (*inits, *captured), (*keys, ("index", k)), t),
                         Layout.replicated(t.rank)))
    return tuple(out)


UNROLL_OPS = 20_000  # the body ops an after loop may derive when unrolled (iterations × body size)


def unrolled(d: Deriver, op: Op, facts: Sequence[Fact], budget: int = UNROLL_OPS) -> tuple[Fact, ...] | None:
    """A loop of the after program with no reference loop to follow (the reference unrolled it: a
    `fori_loop` over a static range against a Python loop or a repeated expression), derived iteration by
    iteration: exactly what inlining its bodies would give. None when a condition is not decided (not one
    boolean constant on every device) or the iterations would derive more than `budget` body ops."""
    cond, body = op.regions
    size = sum(1 for _ in walk(body.ops)) + sum(1 for _ in walk(cond.ops))
    carried = tuple(facts)
    while True:
        test = d.lift(d.region(cond, carried)[0])
        decided = ranges.bool_value(test.term) if isinstance(test, Holds) and not test.layout.partial else None
        if decided is None:
            return None
        if not decided:
            return carried
        budget -= size
        if budget < 0:
            return None
        # A per-device scalar crosses an iteration as it would cross the ops of the inlined bodies.
        carried = d.region(body, carried, keep_blocks=True)


def loop_term(d: Deriver, inits: Sequence[Term], loop_vars: Sequence[Term], cond: Term, bodies: Sequence[Term]
              ) -> tuple[Term, ...]:
    """The results of a loop as terms: `loop(inits, vars, cond, bodies)[k]`. Starting from `inits`, while
    `cond` holds, the variables take the values of `bodies` (both read over the variables): the variables
    are bound by the term, its meaning does not depend on their names. `termeval` evaluates it."""
    n = len(inits)
    return tuple(d.terms.mk("loop", (*inits, *loop_vars, cond, *bodies), (("carried", n), ("index", k)), b.type)
                 for k, b in enumerate(bodies))


def _loop_body(d: Deriver, op: Op, captured: list[Term]) -> LoopBody | None:
    """The loop's condition and bodies over its variables, read once per loop and captured values.

    The variables are named after the loop's structure: equal loops get equal terms, and a loop never
    holds a loop of its own structure (a region is larger than those inside it), so an inner loop's
    variables never shadow the ones of a loop around it."""
    key = (id(op), *(t.id for t in captured))
    if key in d.loop_bodies:
        return d.loop_bodies[key]
    d.loop_bodies[key] = None  # (a loop is never inside itself; the entry only guards against surprises)
    shape = (region_key(op.regions[0]), region_key(op.regions[1]))
    name = d.loop_names.setdefault(shape, len(d.loop_names))
    loop_vars = tuple(d.terms.fresh(f"while{name}.{k}", v.tensor) for k, v in enumerate(op.regions[1].args))
    args = [Holds(v, Layout.replicated(v.type.rank)) for v in loop_vars]
    cond = [d.lift(f) for f in d.region(op.regions[0], args)]
    bodies = [d.lift(f) for f in d.region(op.regions[1], args)]
    held = [f for f in (*cond, *bodies) if isinstance(f, Holds) and f.layout == Layout.replicated(f.term.type.rank)]
    if len(held) != len(cond) + len(bodies) or len(bodies) != len(loop_vars):
        return None
    body: LoopBody = (op, loop_vars, held[0].term, tuple(h.term for h in held[1:]))
    d.loop_bodies[key] = body
    return body


def _captured(op: Op) -> list[Value]:
    """Values a region op uses from outside its regions (StableHLO regions may capture)."""
    defined: set[Value] = set()
    used: list[Value] = []
    for region in op.regions:
        defined.update(region.args)
        for inner in walk(region.ops):
            defined.update(inner.results)
            for r in inner.regions:
                defined.update(r.args)
    for region in op.regions:
        for inner in walk(region.ops):
            used.extend(v for v in inner.operands if v not in defined and v not in used)
            for r in inner.regions:  # a nested body may yield a captured value as it is
                used.extend(v for v in r.results if v not in defined and v not in used)
        used.extend(v for v in region.results if v not in defined and v not in used)
    return used


def _custom_call(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    target = str(op.attrs.get("call_target_name", ""))
    if (text := layout_boundary.annotation(op)) is not None:
        d.annotated[op.results[0]] = text  # what a GSPMD shard_map's SPMDFullToShardShape reads
    if target in IDENTITY_CUSTOM_CALLS and len(facts) == len(op.results):
        return facts
    if target in LAPACK_TARGETS:
        return linalg.lapack(d.ctx, op, facts)
    if target == "SPMDFullToShardShape":
        return boundary.full_to_shard(d.ctx, op, facts, d.annotated.get(op.operands[0]) if op.operands else None)
    if target == "SPMDShardToFullShape":
        return boundary.shard_to_full(d.ctx, op, facts)
    if target == "TopK":
        top_k = top_k_of_call(op)
        if top_k is None:
            return tuple(d.ctx.unsupported(op, "XLA's TopK custom call with a comparator that is not a total "
                                              "order of the values") for _ in op.results)
        out = sorting.top_k(d.ctx, top_k, facts)
        return (TupleFact(out),) if len(op.results) == 1 else out
    return tuple(d.ctx.unsupported(op, f"custom call {target!r}") for _ in op.results)
