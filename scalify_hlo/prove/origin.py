"""Origin tracing: the first op whose value differs from the reference's while its operands' values agree.

The term frontier (`localize.py`) names where the two sides' terms part ways; where the prover follows a
program only in part (a body derived case by case, a value the rules could not read) it names where it
stopped following, which may be well past where the programs part, and a term frontier can sit before the
bug (a value the prover could not match although it is right). Here both programs run on the same random
inputs and the after program's values are compared with the reference's (`agreement.py`). From the output
that differs, the search goes back through values that do not agree; the ORIGIN is the op, in one of its
executions (a loop's iteration), whose result does not agree although every operand does. Values computed
from no input (iotas, device indices, offset tables) are not compared: a wrong one shows at the first op
that applies it to data, usually on its line. An elementwise op is compared with the reference ops of its
kind that compute from what its operands hold (its twins), where there are such: a mask or constant it
applies may be wrong and its result still another reference value.

A value no reference value matches may be right all the same (a partitioned program computes values the
reference never does: a microbatch, a received block, a scalar index). So the evidence is ranked: an
elementwise op differing from its twins is strong; from inputs that agree, an elementwise op without twins
of inputs alone (no offset or mask computed from no input), or a loop or branch (whose bodies' values are
compared on their own), is medium; any other op is weak. The
prover's frontier (the op its finding names) stays where it is itself where the values part (computed from
no input and applied on the way to the output, or parting them by its twins), and where it lies on that way
and the origin found is only weak evidence; it gives way where its value agrees with the reference's or
lies off that way. A finding naming no source line does not replace one that names a line. This only names
lines of a discrepancy already backed by a counterexample: it never decides a verdict (agreement on random
inputs proves nothing, and a false agreement only moves the line named).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from scalify_hlo.ir.nodes import Op, Value, walk
from scalify_hlo.layout.program import Program
from scalify_hlo.numeric.values import Val
from scalify_hlo.ops.elementwise import ELEMENTWISE
from scalify_hlo.prove.agreement import (
    COMBINER,
    Agreement,
    Event,
    GiveUp,
    Recorder,
    Reference,
    dependent_on_inputs,
    links_of,
    run_both,
)
from scalify_hlo.prove.egraph import Deadline
from scalify_hlo.prove.evidence import runnable
from scalify_hlo.report.verdicts import Discrepancy, Finding, Site


@dataclass(frozen=True, slots=True)
class Origin:
    """The op where an output first differs, and the reference op computing what it should have."""

    op: Op
    named: Op  # the op to name: `op`, or the op with a source line it ran in or that uses its value
    before: Op | None
    alike: bool = False  # `op` makes the output from values that agree, into another reference value


class Tracer:
    """Both programs run once (lazily) on random inputs, their values kept; `origin(j)` per differing output."""

    def __init__(self, bp: Program, ap: Program, seed: int, bounds: dict[int, tuple[int, int]], limit: int,
                 deadline: Deadline | None = None) -> None:
        self.bp, self.ap = bp, ap
        self.seed, self.bounds, self.limit = seed, bounds, limit
        self.deadline = deadline
        self._search: _Search | None = None
        self._tried = False

    def origin(self, j: int, claimed: Site | None = None) -> Origin | None:
        """Where output `j` first differs; None where none is found or the prover's frontier (`claimed`, the
        op it names) stands (see the module docstring). One search serves every output, so the values it
        judged and its budget of comparisons (`agreement.MAX_COMPARISONS`) are shared: a program whose many
        outputs differ is searched once, not once per output. Past the run's deadline: None."""
        if self.deadline is not None and self.deadline.passed():
            return None
        if not self._tried:
            self._tried = True
            ran = run_both(self.bp, self.ap, self.seed, self.bounds) if runnable(self.bp, self.ap, self.limit) else None
            if ran is not None:
                self._search = _Search(*ran, self.bp, self.ap, self.deadline)
        if self._search is None or j >= len(self.ap.module.main.body.results):
            return None
        try:
            return self._search.origin(j, claimed)
        except GiveUp:
            return None


class _Search:
    """The after program's recorded values judged against the reference's, and the search back from an output."""

    def __init__(self, rb: Recorder, ra: Recorder, bp: Program, ap: Program, deadline: Deadline | None = None) -> None:
        self.ra, self.bp, self.ap = ra, bp, ap
        self.links = links_of(ap.module)
        self.dependent = dependent_on_inputs(ap.module, self.links)
        self.ref = Reference(rb)
        self.agree = Agreement(self.ref, ap.mesh, deadline)
        self.made = {r: op for f in ap.module.funcs.values() for op in walk(f.body.ops) for r in op.results}
        self.maker: dict[int, tuple[Value, int]] = {}  # id(array) → the value and event that made it (no alias)
        for v, kept in ra.instances.items():
            for i, a, _ in kept:
                known = self.maker.get(id(a))
                if v in self.made and (known is None or ra.events[i].done < ra.events[known[1]].done):
                    self.maker[id(a)] = (v, i)
        self.by_twin: set[int] = set()  # events whose result was judged against its twins
        self.unjudged: set[int] = set()  # events of elementwise ops whose twins never ran
        self.outside: dict[int, list[Value]] = {}  # id(op) → the values its bodies use from outside them

    def held(self, v: Value, i: int, a: Val, devices: int) -> list[Value] | None:
        """The reference values instance `a` of `v` holds (None: none). A value an elementwise op made (or an
        alias of it: a call's result, a loop's variable) is judged against the op's twins where it has any;
        without twins, one that holds what an operand holds computes nothing the reference does (`min(x, x)`)."""
        alias = False
        if isinstance(a, np.ndarray) and id(a) in self.maker:
            alias = self.maker[id(a)][0] is not v
            v, i = self.maker[id(a)]
        op = self.made.get(v)
        if op is None or op.opcode not in ELEMENTWISE or not isinstance(a, np.ndarray) or i >= len(self.ra.events):
            return self.agree.of(a, devices, self.ra.masks.get(i))
        # The operands made by elementwise ops are judged first, oldest first (a chain may be long: no recursion).
        stack = [(v, i, a)]
        while stack:
            w, k, x = stack[-1]
            if (id(x), -1 - k) in self.agree.memo:
                stack.pop()
                continue
            pending = [(*self.maker[id(y)], y) for u, y in zip(self.made[w].operands, self.ra.events[k].args, strict=True)
                       if u in self.dependent and isinstance(y, np.ndarray) and id(y) in self.maker
                       and self.made[self.maker[id(y)][0]].opcode in ELEMENTWISE
                       and (id(y), -1 - self.maker[id(y)][1]) not in self.agree.memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            self.agree.memo[(id(x), -1 - k)] = self._held_now(self.made[w], k, x)
        if alias and i in self.unjudged:  # (a branch's result, say: what it is, the op could not say)
            return self.agree.of(a, devices, self.ra.masks.get(i))
        return self.agree.memo[(id(a), -1 - i)]

    def _held_now(self, op: Op, i: int, a: np.ndarray) -> list[Value] | None:
        """`held` of elementwise op `op`'s execution `i`, its operands' already judged."""
        event = self.ra.events[i]
        mask = self.ra.masks.get(i)
        twins = self._twins(op, event, mask)
        ran = [e for t in twins for e in self.ref.of_value.get(t, ())]
        if twins and not ran:
            self.unjudged.add(i)
            return []  # (its twins never ran, a branch the reference did not take: no evidence either way)
        if twins:
            self.by_twin.add(i)
            return self.agree.match(a, event.devices, mask, ran)
        got = self.agree.of(a, event.devices, mask)
        if got and any(u in self.dependent and set(map(id, self.judge(x, event.devices, mask) or ())) & set(map(id, got))
                       for u, x in zip(op.operands, event.args, strict=True)):
            return None
        return got

    def judge(self, a: Val, devices: int, mask: np.ndarray | None) -> list[Value] | None:
        """`held` of an operand's instance: by the op that made it, else as any value."""
        if isinstance(a, np.ndarray) and id(a) in self.maker:
            v, i = self.maker[id(a)]
            return self.held(v, i, a, devices)
        return self.agree.of(a, devices, mask)

    def _twins(self, op: Op, event: Event, mask: np.ndarray | None) -> list[Value]:
        """The results of the reference ops of `op`'s kind (else of any elementwise kind: an op changed for
        another) whose operands are, where `op`'s come from inputs, the reference values `op`'s operands hold
        in `event`."""
        held: list[tuple[int, set[int]]] = []
        for k, (u, x) in enumerate(zip(op.operands, event.args, strict=True)):
            if u in self.dependent:
                got = self.judge(x, event.devices, mask)
                if not got:
                    return []
                held.append((k, {id(w) for w in got}))
        if not held:
            return []

        def twins(kinds: Iterable[str]) -> list[Value]:
            return [o.results[0] for kind in kinds for o in self.ref.ops.get(kind, ())
                    if len(o.operands) == len(op.operands) and len(o.results) == 1
                    and all(id(o.operands[k]) in ids for k, ids in held)]

        return twins((op.opcode,)) or twins(k for k in self.ref.ops if k in ELEMENTWISE)

    def differs(self, v: Value) -> bool:
        return any(self.held(v, i, a, d) is None for i, a, d in self.ra.instances.get(v, ()))

    def parts(self, v: Value, i: int, a: Val) -> list[Value] | None:
        """Execution `i` of `v`'s op gives a value that does not agree from operands that do: the reference
        values those hold (None: it does not)."""
        event = self.ra.events[i]
        if self.held(v, i, a, event.devices) is not None:
            return None
        op = self.made[v]
        matched: list[Value] = []
        inputs = [*zip(op.operands, event.args, strict=True), *self._captured(op, i)]
        for u, x in inputs:
            if u in self.dependent:
                got = self.judge(x, event.devices, self.ra.masks.get(i))
                if got is None:
                    return None
                matched.extend(got)
        return matched

    def _captured(self, op: Op, i: int) -> list[tuple[Value, Val]]:
        """The values `op`'s bodies use from outside them (a branch's operands), as they were at event `i`."""
        if op.opcode in COMBINER or not op.regions:
            return []
        if id(op) not in self.outside:
            inner = {v for r in op.regions for v in r.args} | {v for o in walk_regions(op) for v in (
                *o.results, *(a for r in o.regions for a in r.args))}
            self.outside[id(op)] = list(dict.fromkeys(
                u for o in walk_regions(op) for u in o.operands if u not in inner))
        out = []
        for u in self.outside[id(op)]:
            before = [a for k, a, _ in self.ra.instances.get(u, ()) if k < i]
            if before:
                out.append((u, before[-1]))
        return out

    def _medium(self, op: Op) -> bool:
        """An op without twins whose parting values is medium evidence: a loop or branch, or an elementwise op
        of inputs alone (one applying an offset or mask computed from no input is index arithmetic, as a
        partitioned program does where its reference does not: `ids - axis_index * rows`)."""
        if op.opcode in ("while", "case", "if"):
            return True
        return op.opcode in ELEMENTWISE and all(u in self.dependent for u in op.operands)

    def standing(self, claimed: Site, path: set[Value]) -> str:
        """What the values say of the op the prover names, given the values that differ on the way to the
        output (`path`): "stands" (computed from no input and applied on that way, or on it and parting the
        values itself by its twins), "parts" (on it, parting the values, no twin to say so), "differs" (on
        it, from inputs that do not all agree), "agrees" (off it), or "unseen" (no such op ran)."""
        state = "unseen"
        rank = ("unseen", "agrees", "differs", "parts", "stands")
        for op in _named_ops(self.made.values(), claimed):
            here = "unseen"
            if any(v not in self.dependent for v in op.results):
                here = "stands" if self._applied(op, path) else "agrees"
            elif any(v in path for v in op.results):
                parted = [i for v in op.results for i, a, _ in self.ra.instances.get(v, ())
                          if self.parts(v, i, a) is not None]
                here = ("stands" if any(i in self.by_twin for i in parted) else "parts") if parted else "differs"
            elif any(v in self.ra.instances for v in op.results):
                here = "agrees"  # (or differs off the way to the output: not where it parts)
            state = max(state, here, key=rank.index)
        return state

    def _applied(self, op: Op, path: set[Value]) -> bool:
        """`op` (computed from no input) feeds, through values computed from no input, an op on `path`."""
        free = set(op.results)
        for other in {id(o): o for o in self.made.values()}.values():  # (program order, callees after)
            if any(u in free for u in other.operands):
                if any(r in path for r in other.results):
                    return True
                free.update(r for r in other.results if r not in self.dependent)
        return False

    def origin(self, j: int, claimed: Site | None) -> Origin | None:
        out = self.ap.module.main.body.results[j]  # (the module as it ran: calls not inlined, `Program.func` is)
        bouts = self.bp.module.main.body.results
        want = self.ref.of_value.get(bouts[j], []) if j < len(bouts) else []
        if out not in self.dependent or not any(isinstance(a, np.ndarray) and self.agree.match(a, d, None, want) is None
                                                for _, a, d in self.ra.instances.get(out, ())):
            return None  # (on these inputs the output is the reference's)
        toward: dict[Value, Value] = {}  # value → the value it was reached from (one step toward the output)
        stack = [out]
        while stack:
            v = stack.pop()
            for p in self.links.get(v, ()):
                if p not in toward and p is not out and p in self.dependent and self.differs(p):
                    toward[p] = v
                    stack.append(p)
        # The origin: the strongest evidence first (an elementwise op differing from its twins; from inputs
        # that agree, an elementwise op no twin has, or a loop or branch whose bodies' values agree; any op),
        # then the first to finish.
        best: tuple[int, int, int, list[Value]] | None = None  # (-strength, finished, event, operands' values)
        for v in (out, *toward):
            if v not in self.made:
                continue
            for i, a, _ in self.ra.instances.get(v, ()):
                if (matched := self.parts(v, i, a)) is not None:
                    strength = 2 if i in self.by_twin else 1 if self._medium(self.made[v]) else 0
                    best = min(best or (1, 0, 0, []), (-strength, self.ra.events[i].done, i, matched))
        standing = self.standing(claimed, {out, *toward}) if claimed is not None else "unseen"
        if standing == "stands" or (standing in ("parts", "differs") and (best is None or best[0] == 0)):
            return None  # (the prover's frontier stands: a value nothing matches is no stronger evidence)
        if best is None:
            # Every value it is made of agrees: the last op making the output computes another of the
            # reference's values (a permutation that moves nothing, a step left out after it).
            last = self._maker_of(out)
            return Origin(last, last, None, alike=True) if last is not None and last.loc.frames else None
        _, _, i, matched = best
        op, named = self.ra.events[i].op, self._named(i, toward)
        if not named.loc.frames:
            return None  # (a line is what the prover's frontier names, too)
        return Origin(op, named, _counterpart(op, matched, self.bp))

    def _maker_of(self, v: Value) -> Op | None:
        """The op computing `v`, past the ops whose body computes it (a shard_map, a call)."""
        for _ in range(64):
            op = self.made.get(v)
            if op is None or op.opcode in COMBINER or op.opcode == "while" or (not op.regions and op.opcode != "call"):
                return op
            v = self.links[v][0]
        return None

    def _named(self, i: int, toward: dict[Value, Value]) -> Op:
        """The op to name for event `i`: its op if it has a source line, else the op it ran in (a call of the
        function holding it) that has one, else the first op with one on the way to the output."""
        events = self.ra.events
        e: int | None = i
        while e is not None:
            if events[e].op.loc.frames:
                return events[e].op
            e = events[e].parent
        op = events[i].op
        w = op.results[0] if op.results else None
        while w is not None and w in toward:
            w = toward[w]
            if (o := self.made.get(w)) is not None and o.loc.frames:
                return o
        return op


def walk_regions(op: Op) -> Iterator[Op]:
    """The ops in `op`'s bodies, depth first."""
    for r in op.regions:
        yield from walk(r.ops)


def _named_ops(ops: Iterable[Op], site: Site) -> list[Op]:
    """The ops `site` names: by instruction name (HLO); else by kind and place, an op with no source line of
    its own standing for the line it is used at when no op has the site's own."""
    unique = list({id(o): o for o in ops}.values())
    if site.instruction:
        return [o for o in unique if (o.opcode, Site.of(o).instruction) == (site.opcode, site.instruction)]
    alike = [(o, Site.of(o)) for o in unique if o.opcode == site.opcode]
    alike = [(o, s) for o, s in alike if (s.op_name, s.ir) == (site.op_name, site.ir)]
    exact = [o for o, s in alike if s.source == site.source]
    return exact or [o for o, s in alike if s.source is None]


def _counterpart(op: Op, matched: list[Value], bp: Program) -> Op | None:
    """The reference op of the same kind computing from the reference values `op`'s operands hold."""
    if not matched:
        return None
    ids = {id(v) for v in matched}
    return next((o for f in bp.module.funcs.values() for o in walk(f.body.ops)
                 if o.opcode == op.opcode and any(id(u) in ids for u in o.operands)), None)


def _what(op: Op) -> str:
    name = op.loc.op_name.rsplit("/", 1)[-1] if op.loc.op_name else None
    return name or op.opcode


def finding(j: int, origin: Origin, old: Finding) -> Finding:
    """The finding naming `origin` first; the frontier's site stays, second."""
    site = Site.of(origin.named)
    before = Site.of(origin.before) if origin.before is not None else old.before
    where = site.source or site.label()
    if origin.alike:
        reason = (f"output {j} differs from the reference: it is made at {_what(origin.op)} ({where}), from values "
                  "that agree with the reference's when run on random inputs, into another of the reference's values "
                  f"than its output {j}")
    else:
        reason = (f"output {j} differs from the reference: the values part ways at {_what(origin.op)} ({where}): "
                  "run on random inputs, its operands hold the reference's values and its result none of them")
    if origin.before is not None and before is not None and before.source:
        reason += f" (the reference computes {_what(origin.before)} at {before.source})"
    also = tuple(s for s in (old.after, *old.also) if s is not None and s.source != site.source)
    return Finding(reason, before, site, also, old.expected, old.found, old.counterexample)


def refine(tracer: Tracer, j: int, old: Finding) -> Finding:
    """`old` (where the prover's terms part ways, for output `j`), named at the origin where one is found."""
    origin = tracer.origin(j, old.after)
    return finding(j, origin, old) if origin is not None else old


def refine_verdict(tracer: Tracer, verdict: Discrepancy) -> Discrepancy:
    """A discrepancy found by running both programs (the proof stopped following them): its first finding
    named at the origin of the output that differs."""
    first = verdict.findings[0] if verdict.findings else None
    if first is None or first.counterexample is None:
        return verdict
    return Discrepancy((refine(tracer, first.counterexample.output, first), *verdict.findings[1:]))
