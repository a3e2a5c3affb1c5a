"""Layer memoization (DESIGN §4): a run of isomorphic segments of a function body is derived once.

An unrolled model repeats one block of ops per layer. `plan` finds such runs in an op list without
knowing what a layer is: every op gets integer structural keys (`Shapes`: its kind, and each operand as the
distance back to the op that made it within a period, its type beyond, or what it is when computed from
constants alone), and a period `P` with equal keys at `i` and `i + P` over a long stretch marks
consecutive segments of `P` ops that compute the same thing from different inputs.

`Segments.derive` then reads the first segment once over *fresh leaves* standing for the values it
reads from outside (its inputs), under their layouts: every fact so derived holds whatever those inputs
are, since no rule can see through a leaf. That segment is also read op by op, and the template is kept
only if substituting its own inputs gives the same facts for what it hands on. Every later segment takes
the template's facts with its own inputs' terms substituted for the leaves, each term rebuilt by
`Terms.apply` (no transfer rule re-run): depth costs hashing and substitution, not derivation. A segment is
read op by op as usual where anything differs: an input that is not a plain resolved tensor or is laid out
otherwise, inputs shared in another pattern, an input read as it is (a constant tensor, a value every
layer reads, a per-device table of offsets) that is another one, or a fact of the template that is neither
a plain `Holds` nor numbers per device (failures and the per-device readings of masks keep their own
diagnostics). In the after program, the values a segment hands on are resynchronised with the reference's
terms as in the op-by-op reading.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalify_hlo.ir.nodes import ChannelHandle, Op, Value
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import region_key
from scalify_hlo.rules.facts import Fact, Holds, Varying
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

MIN_OPS = 512  # bodies shorter than this are read op by op: nothing to gain
MIN_PERIOD = 12  # shorter repeats are runs of alike elementwise ops, not layers
MIN_SEGMENTS = 3
_CLOSED_LEAVES = frozenset({"constant", "iota"})
_CANDIDATES = 8  # periods tried (the most frequent distances between equal signatures)


@dataclass(frozen=True, slots=True)
class Run:
    """`count` consecutive segments of `period` ops from `start`, alike op for op."""

    start: int
    period: int
    count: int

    def segment(self, k: int) -> range:
        a = self.start + k * self.period
        return range(a, a + self.period)


@dataclass
class LayerStats:
    runs: int = 0
    templates: int = 0  # segments read op by op over fresh leaves
    instances: int = 0  # segments that took a template's facts
    ops: int = 0  # ops whose facts were substituted, not derived
    declined: int = 0  # segments of a run read op by op after all
    unfaithful: int = 0  # templates dropped: substituted, their first segment differed from its reading


WIDTH = 8  # operands an op's key spells out; an op with more is never part of a run


@dataclass(frozen=True, slots=True)
class Shapes:
    """What every op of a body computes from where, as integer arrays (`shapes`): its kind (opcode,
    attributes, result types, nested bodies; a channel by its kind, not its number, which is unique per
    collective) and, per operand, either the distance back to the op of the body that made it and which of
    its results, or the operand's type (a parameter), or, for a value computed from constants alone, a key
    of what it is (XLA's dumps share one constant, and its broadcast, among all layers)."""

    kind: np.ndarray  # [n]; negative (unique) for an op never part of a run
    dist: np.ndarray  # [n, WIDTH]; 0: not made by an op of the body
    res: np.ndarray
    typ: np.ndarray  # the operand's type id (from 1; 0: no operand)
    closed: np.ndarray  # key of a value computed from constants alone, else 0

    def codes(self, period: int, at: slice = slice(None)) -> np.ndarray:
        """Per op and operand, one integer at a given period: an operand made at most a period back is
        its distance and result (the same op of this segment or of the one before), one made further back
        its type alone (a layer's backward pass reads its forward activations from ever further back).
        Different operands in this sense never share a code (the low two bits say which kind it is)."""
        dist, typ, closed = self.dist[at], self.typ[at], self.closed[at]
        near = (dist > 0) & (dist <= period)
        code = np.where(near, (dist * (WIDTH + 1) + self.res[at] + 1) * 4,
                        np.where(dist > 0, typ * 4 + 1, typ * 4 + 2))
        return np.where(closed != 0, closed * 4 + 3, code)


def shapes(ops: Sequence[Op]) -> Shapes:
    n = len(ops)
    where: dict[Value, tuple[int, int]] = {}
    closed: dict[Value, int] = {}
    kinds: dict[Any, int] = {}
    types: dict[Any, int] = {}
    kind = np.empty(n, dtype=np.int64)
    dist = np.zeros((n, WIDTH), dtype=np.int64)
    res = np.zeros((n, WIDTH), dtype=np.int64)
    typ = np.zeros((n, WIDTH), dtype=np.int64)
    ckey = np.zeros((n, WIDTH), dtype=np.int64)
    rows_d: list[tuple[int, int, int, int]] = []  # (op, slot, distance, result)
    rows_t: list[tuple[int, int, int]] = []  # (op, slot, type id)
    rows_c: list[tuple[int, int, int]] = []
    for i, op in enumerate(ops):
        items: Any = op.attrs.items_
        if "channel_handle" in op.attrs:
            items = tuple((k, v.type if isinstance(v, ChannelHandle) else v) for k, v in items)
        results = op.results
        static = (op.opcode, items, results[0].type if len(results) == 1 else tuple(r.type for r in results),
                  tuple(region_key(r) for r in op.regions) if op.regions else ())
        k = kinds.setdefault(static, len(kinds))
        operands = op.operands
        kind[i] = k if len(operands) <= WIDTH else -1 - i
        spelled: list[Any] = [k]
        is_closed = not op.regions
        for slot, v in enumerate(operands[:WIDTH]):
            rows_t.append((i, slot, types.setdefault(v.type, len(types) + 1)))
            if (c := closed.get(v)) is not None:
                rows_c.append((i, slot, c))
                spelled.append(c)
                continue
            is_closed = False
            if (at := where.get(v)) is not None:
                rows_d.append((i, slot, i - at[0], at[1]))
        if len(operands) > WIDTH:
            is_closed = False
        for j, r in enumerate(op.results):
            where[r] = (i, j)
            if is_closed:
                closed[r] = (hash((*spelled, j)) >> 3) or 1
    if rows_d:
        a = np.array(rows_d, dtype=np.int64)
        dist[a[:, 0], a[:, 1]] = a[:, 2]
        res[a[:, 0], a[:, 1]] = a[:, 3]
    if rows_t:
        a = np.array(rows_t, dtype=np.int64)
        typ[a[:, 0], a[:, 1]] = a[:, 2]
    if rows_c:
        a = np.array(rows_c, dtype=np.int64)
        ckey[a[:, 0], a[:, 1]] = a[:, 2]
    return Shapes(kind, dist, res, typ, ckey)


@dataclass(frozen=True, slots=True)
class Plan:
    runs: tuple[Run, ...]
    shapes: Shapes | None

    def alike(self, a: int, b: int, run: Run) -> bool:
        """The segments of `run` starting at ops `a` and `b` compute alike from their inputs (exactly)."""
        assert self.shapes is not None
        x, y = slice(a, a + run.period), slice(b, b + run.period)
        return (np.array_equal(self.shapes.kind[x], self.shapes.kind[y])
                and np.array_equal(self.shapes.codes(run.period, x), self.shapes.codes(run.period, y)))


def _hashes(kind: np.ndarray, codes: np.ndarray) -> np.ndarray:
    h = kind.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    for s in range(codes.shape[1]):
        h = (h ^ codes[:, s].astype(np.uint64)) * np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(31)
    return h


def plan(ops: Sequence[Op], eligible: Callable[[Op], bool]) -> Plan:
    """Non-overlapping runs of alike segments, the most ops covered first; only eligible ops inside.
    Candidate periods are the commonest distances between ops alike up to their far operands."""
    n = len(ops)
    if n < MIN_OPS:
        return Plan((), None)
    table = shapes(ops)
    bad = np.array([not eligible(op) for op in ops], dtype=bool)
    kind = np.where(bad, -1 - np.arange(n), table.kind)  # unique: never part of a repeat
    local = _hashes(kind, table.codes(0))
    order = np.argsort(local, kind="stable")
    same = local[order[1:]] == local[order[:-1]]
    gaps = (order[1:] - order[:-1])[same]
    gaps = gaps[(gaps >= MIN_PERIOD) & (gaps <= n // MIN_SEGMENTS)]
    if gaps.size == 0:
        return Plan((), table)
    values, counts = np.unique(gaps, return_counts=True)
    candidates = values[np.argsort(-counts, kind="stable")][:_CANDIDATES]
    found: list[tuple[int, Run]] = []
    for period in (int(p) for p in candidates):
        sigs = _hashes(kind, table.codes(period))
        eq = np.concatenate(([False], sigs[:-period] == sigs[period:], [False]))
        edges = np.flatnonzero(eq[1:] != eq[:-1])
        for s, e in zip(edges[::2], edges[1::2], strict=True):
            count = (int(e) - int(s)) // period + 1
            if count >= MIN_SEGMENTS:
                found.append(((count - 1) * period, Run(int(s), period, count)))  # ops not derived
    found.sort(key=lambda x: (-x[0], x[1].period))
    taken = np.zeros(n, dtype=bool)
    runs: list[Run] = []
    for _, run in found:
        span = slice(run.start, run.start + run.count * run.period)
        if not taken[span].any():
            taken[span] = True
            runs.append(run)
    return Plan(tuple(sorted(runs, key=lambda r: r.start)), table)


def _inputs(ops: Sequence[Op], seg: range) -> tuple[list[Value], tuple[int, ...]]:
    """The values a segment reads from outside it (in order of first use) and, per operand read, which."""
    inside: set[Value] = set()
    slots: dict[Value, int] = {}
    pattern: list[int] = []
    for i in seg:
        op = ops[i]
        for v in op.operands:
            if v in inside:
                pattern.append(-1)
            else:
                pattern.append(slots.setdefault(v, len(slots)))
        inside.update(op.results)
    return list(slots), tuple(pattern)


@dataclass(frozen=True, slots=True)
class _Input:
    """How a template reads one input: through a fresh `leaf` under `layout`, or as the very `fact` every
    segment must read too (a tensor computed from constants alone, a value the next segment reads as well,
    a per-device table such as the offsets of each device's shard: made once for all layers)."""

    leaf: Term | None
    layout: Layout | None
    fact: Fact | None


@dataclass
class _Template:
    start: int  # the segment it was read from
    pattern: tuple[int, ...]
    inputs: list[_Input]
    facts: list[tuple[Holds | Varying, ...]]  # per op of the segment (a Varying: taken as it is)
    origins: list[tuple[int | None, ...]]  # per op and result: the segment op that made it partial


class Segments:
    """Derives the runs of one body for a `Deriver` (its facts, its rules)."""

    def __init__(self, ops: Sequence[Op], results: Sequence[Value], found: Plan, terms: Terms,
                 facts: dict[Value, Fact], derive_op: Callable[[Op], None],
                 resync: Callable[[Holds, Op], Holds] | None, stats: LayerStats) -> None:
        self.terms = terms
        self.facts = facts
        self.derive_op = derive_op
        self.resync = resync
        self.stats = stats
        self._closed_memo: dict[int, bool] = {}
        self._plan = found
        self._run = Run(0, 0, 0)
        # The last op reading each value (past the body: a result of it), for what a segment hands on.
        self._last_use: dict[Value, int] = {}
        for i, op in enumerate(ops):
            for v in op.operands:
                self._last_use[v] = i
        self._last_use.update((v, len(ops)) for v in results)

    @property
    def runs(self) -> tuple[Run, ...]:
        return self._plan.runs

    def derive(self, ops: Sequence[Op], run: Run,
               without_resync: Callable[[Callable[[], None]], None]) -> None:
        self.stats.runs += 1
        self._run = run
        template: _Template | None = None
        tries = 2  # the first segment may read its inputs otherwise than the rest (the first layer)
        for k in range(run.count):
            seg = run.segment(k)
            if template is None and tries and k + 1 < run.count:
                tries -= 1
                template = self._template(ops, seg, without_resync)
                if template is not None:
                    # Read this segment op by op too, and keep the template only if it makes the same
                    # facts for everything the segment hands on: substituted layers are then what the
                    # op-by-op reading makes (its resynchronisations included), in both programs alike.
                    for i in seg:
                        self.derive_op(ops[i])
                    if not self._reproduces(ops, seg, template):
                        self.stats.unfaithful += 1
                        template, tries = None, 0
                    continue
            made = None if template is None else self._substituted(ops, seg, template)
            if made is None:
                self.stats.declined += 1
                for i in seg:
                    self.derive_op(ops[i])
                continue
            for i, facts in zip(seg, made, strict=True):
                for r, f in zip(ops[i].results, facts, strict=True):
                    self.facts[r] = f
            self.stats.instances += 1
            self.stats.ops += len(seg)

    def _reproduces(self, ops: Sequence[Op], seg: range, t: _Template) -> bool:
        made = self._substituted(ops, seg, t)
        if made is None:
            return False
        for i, facts in zip(seg, made, strict=True):
            for r, f in zip(ops[i].results, facts, strict=True):
                if self._last_use.get(r, -1) >= seg.stop and not _same_fact(self.facts.get(r), f, exact=True):
                    return False
        return True

    # -- the template --------------------------------------------------------------------------------------
    def _template(self, ops: Sequence[Op], seg: range,
                  without_resync: Callable[[Callable[[], None]], None]) -> _Template | None:
        inputs, pattern = _inputs(ops, seg)
        # An input the next segment reads too (a bias correction, a mask: made once for all layers) is
        # read as it is, so that the rules see what it is (a broadcast), as they do op by op.
        shared = set(_inputs(ops, range(seg.stop, seg.stop + len(seg)))[0]) if seg.stop + len(seg) <= len(ops) else set()
        saved = [self.facts.get(v) for v in inputs]
        reads: list[_Input] = []
        for v, f in zip(inputs, saved, strict=True):
            if isinstance(f, Varying) or (isinstance(f, Holds) and _plain(f) and (v in shared or self._closed(f.term))):
                reads.append(_Input(None, None, f))
            elif isinstance(f, Holds) and _plain(f):
                # (named by the table's size: a leaf of no other template, of either program)
                reads.append(_Input(self.terms.fresh(f"layer input {len(self.terms)}", f.term.type), f.layout, None))
            else:
                return None
        try:
            for v, read in zip(inputs, reads, strict=True):
                if read.leaf is not None and read.layout is not None:
                    self.facts[v] = Holds(read.leaf, read.layout)

            def read_segment() -> None:
                for i in seg:
                    self.derive_op(ops[i])

            without_resync(read_segment)
            position = {id(ops[i]): i - seg.start for i in seg}
            facts: list[tuple[Holds | Varying, ...]] = []
            origins: list[tuple[int | None, ...]] = []
            for i in seg:
                out = tuple(self.facts[r] for r in ops[i].results)
                kept = tuple(f for f in out if isinstance(f, Varying) or (isinstance(f, Holds) and f.blocks is None))
                if len(kept) != len(out):
                    return None
                where = tuple(None if not isinstance(f, Holds) or f.origin is None
                              else position.get(id(f.origin), -1) for f in kept)
                if -1 in where:
                    return None
                facts.append(kept)
                origins.append(where)
        finally:
            for v, f in zip(inputs, saved, strict=True):
                assert f is not None
                self.facts[v] = f
        self.stats.templates += 1
        return _Template(seg.start, pattern, reads, facts, origins)

    def _closed(self, term: Term) -> bool:
        """Computed from constants and iotas alone (a causal mask made once for all layers): such an input
        stays itself in the template, where the rules may read it, and every segment must read the same."""
        hit = self._closed_memo.get(term.id)
        if hit is None:
            hit = self._closed_memo[term.id] = all(t.op in _CLOSED_LEAVES for t in term.walk() if not t.args)
        return hit

    # -- a segment from the template -----------------------------------------------------------------------
    def _substituted(self, ops: Sequence[Op], seg: range, t: _Template) -> list[tuple[Fact, ...]] | None:
        """The facts of `seg`'s ops from the template, or None where it does not apply."""
        if not self._plan.alike(seg.start, t.start, self._run):
            return None  # (equal hashes, unequal ops: the plan's hashes collided)
        inputs, pattern = _inputs(ops, seg)
        if pattern != t.pattern or len(inputs) != len(t.inputs):
            return None
        sigma: dict[int, Term] = {}
        for v, read in zip(inputs, t.inputs, strict=True):
            f = self.facts.get(v)
            if read.fact is not None:
                if not _same_fact(f, read.fact):
                    return None
                continue
            assert read.leaf is not None
            if not isinstance(f, Holds) or not _plain(f) or f.layout != read.layout or f.term.type != read.leaf.type:
                return None
            sigma[read.leaf.id] = f.term
        memo: dict[int, Term] = {}
        out: list[tuple[Fact, ...]] = []
        for i, holds, where in zip(seg, t.facts, t.origins, strict=True):
            made: list[Fact] = []
            for r, h, o in zip(ops[i].results, holds, where, strict=True):
                if isinstance(h, Varying):  # numbers per device, computed from no input that varies
                    made.append(h)
                    continue
                term = self._subst(h.term, sigma, memo)
                fact = Holds(term, h.layout, None if o is None else ops[seg.start + o])
                if self.resync is not None and not h.layout.partial and self._last_use.get(r, -1) >= seg.stop:
                    # What the segment hands on is resynchronised as the op-by-op reading would (inside
                    # it, the template's terms stand: read without the reference, they match it or not
                    # alike in every layer).
                    fact = self.resync(fact, ops[i])
                made.append(fact)
            out.append(tuple(made))
        return out

    def _subst(self, term: Term, sigma: dict[int, Term], memo: dict[int, Term]) -> Term:
        """`term` with the template's leaves replaced, each node rebuilt by `Terms.apply`: the template's
        terms are normal forms over leaves no rule could see into, and what an input really is may allow
        more (a slice of a concatenation); rebuilt, they are what reading the segment op by op makes."""
        done = memo.get(term.id)
        if done is not None:
            return done
        stack = [term]
        while stack:
            t = stack[-1]
            if t.id in memo:
                stack.pop()
                continue
            if not t.args:
                memo[t.id] = sigma.get(t.id, t)
                stack.pop()
                continue
            pending = [a for a in t.args if a.id not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            args = tuple(memo[a.id] for a in t.args)
            if all(a is b for a, b in zip(args, t.args, strict=True)):
                memo[t.id] = t
                continue
            memo[t.id] = self.terms.apply(t.op, args, t.attrs, t.type)
        return memo[term.id]


def _plain(f: Fact | None) -> bool:
    return isinstance(f, Holds) and f.blocks is None and f.origin is None and not f.layout.partial


def _same_fact(f: Fact | None, g: Fact, exact: bool = False) -> bool:
    """`f` says what `g` says: the same term under the same layout (plain ones only, unless `exact`: then
    also the same partial axes and origin), or the same numbers per device."""
    if f is g:
        return True
    if isinstance(f, Holds) and isinstance(g, Holds):
        if exact:
            return f.term is g.term and f.layout == g.layout and f.origin is g.origin and f.blocks == g.blocks
        return f.term is g.term and f.layout == g.layout and _plain(f) and _plain(g)
    if isinstance(f, Varying) and isinstance(g, Varying):
        return f.type == g.type and f.values.shape == g.values.shape and bool(np.array_equal(f.values, g.values))
    return False
