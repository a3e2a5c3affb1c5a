"""Keeping the after program's terms in step with the before program's (segments and memo, DESIGN §4).

When the partitioner kept the structure, an after-value's term *is* a before term (the same interned
object). Where it did not (a mean taken in two steps, operands swapped), the term is *foreign*. At every
value whose fact is resolved (no partial axes) we try to prove the foreign term equal to a before term
near it, in a small e-graph that holds only the two differing regions: the subterms both sides share
are opaque leaves. A proof replaces the foreign term by the before term, so everything downstream is
back in step and the next e-graph starts from there: each question covers one segment, not the model.
Questions are memoized by their shape with leaves renumbered, so 126 identical layers ask once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable
from dataclasses import dataclass
from typing import Any

from scalify_hlo.ir.nodes import Op
from scalify_hlo.prove.egraph import EGraph, attr_text
from scalify_hlo.rules.algebra import exact_text
from scalify_hlo.rules.facts import Holds
from scalify_hlo.terms.term import Term, scalar_exact, scalar_value

MAX_REGION = 4000  # nodes on one side of a question; beyond, we do not ask
MAX_UP = 64  # how far above the shared leaves to look for a before term to match
MAX_CANDIDATES = 4


@dataclass
class SyncStats:
    attempts: int = 0
    resynced: int = 0
    proven: int = 0  # equalities (outputs, loop steps) that needed the e-graph
    no_candidate: int = 0


class Sync:
    def __init__(self, egraph: EGraph, before_roots: Iterable[Term]) -> None:
        self.egraph = egraph
        self.before: dict[int, Term] = {}
        self.users: dict[int, list[Term]] = defaultdict(list)
        seen: set[int] = set()
        for root in before_roots:
            for t in root.walk(seen):
                self.before[t.id] = t
                for a in t.args:
                    self.users[a.id].append(t)
        self.signatures = {(t.op, tuple(a.type for a in t.args), t.type) for t in self.before.values()}
        self.subst: dict[int, Term] = {}
        self.stats = SyncStats()
        self.exhausted_at: Op | None = None  # the op whose question first ran out of e-graph budget
        self._frontier: dict[int, frozenset[int] | None] = {}
        self._up: dict[int, dict[int, int]] = {}  # before term -> the before terms above it (`_above`)

    def add_before(self, roots: Iterable[Term]) -> None:
        """More reference terms (a loop body unrolled once over fresh loop variables)."""
        seen = set(self.before)
        self._up.clear()  # new users: what lies above a term changes
        for root in roots:
            for t in root.walk(seen):
                self.before[t.id] = t
                self.signatures.add((t.op, tuple(a.type for a in t.args), t.type))
                for a in t.args:
                    self.users[a.id].append(t)

    def synced(self, t: Term) -> bool:
        return t.id in self.before

    def known(self, t: Term) -> int:
        """2: the reference computes this very term; 1: an op of this kind and these shapes; 0: neither.
        (Guides the choice between equally true readings of a local op, e.g. which global reshape.)"""
        if t.id in self.before:
            return 2
        return 1 if (t.op, tuple(a.type for a in t.args), t.type) in self.signatures else 0

    # -- the resync hook of the derivation ---------------------------------------------------------------
    def resync(self, fact: Holds, op: Op) -> Holds:
        t = fact.term
        if t.id in self.before:
            return fact
        if t.id in self.subst:
            return Holds(self.subst[t.id], fact.layout, fact.origin)
        frontier = self.frontier(t)
        if frontier is None:
            return fact
        candidates = self.candidates(t, frontier)
        if not candidates:
            self.stats.no_candidate += 1
            return fact
        self.stats.attempts += 1
        exhausted = self.egraph.stats.exhausted
        answers = self.prove_many(t, candidates)
        if self.exhausted_at is None and self.egraph.stats.exhausted > exhausted:
            self.exhausted_at = op
        for b, proven in zip(candidates, answers, strict=True):
            if proven:
                self.subst[t.id] = b
                self.stats.resynced += 1
                return Holds(b, fact.layout, fact.origin)
        return fact

    def frontier(self, t: Term) -> frozenset[int] | None:
        """The before terms at the bottom of `t`'s foreign region (None: region too big)."""
        if t.id in self._frontier:
            return self._frontier[t.id]
        leaves: set[int] = set()
        for size, node in enumerate(_walk_until(t, self.before), start=1):
            if size > MAX_REGION:
                self._frontier[t.id] = None
                return None
            for a in node.args:
                if a.id in self.before and scalar_value(a) is None:
                    leaves.add(a.id)
        result = frozenset(leaves)
        self._frontier[t.id] = result
        return result

    def candidates(self, t: Term, frontier: frozenset[int]) -> list[Term]:
        """Before terms of `t`'s type that lie above every shared leaf, nearest first."""
        if not frontier:
            return []
        # Intersect the frontier's up-sets starting from the smallest: what is in it, of `t`'s type, and
        # in every other one.
        ups = sorted((self._above(f) for f in frontier), key=len)
        first, rest = ups[0], ups[1:]
        before = self.before
        found = [before[i] for i in first if before[i].type == t.type and all(i in u for u in rest)]
        found.sort(key=lambda b: (sum(u[b.id] for u in ups), b.id))
        return found[:MAX_CANDIDATES]

    def _above(self, f: int) -> dict[int, int]:
        """Before terms above `f` (users, transitively, within `MAX_UP` steps) and their distance."""
        if f in self._up:
            return self._up[f]
        seen = {f: 0}
        queue = [self.before[f]]
        while queue and len(seen) < MAX_UP * 8:
            nxt = []
            for node in queue:
                d = seen[node.id]
                if d >= MAX_UP:
                    continue
                for u in self.users.get(node.id, ()):
                    if u.id not in seen:
                        seen[u.id] = d + 1
                        nxt.append(u)
            queue = nxt
        self._up[f] = seen
        return seen

    # -- questions to the e-graph -------------------------------------------------------------------------
    def prove_many(self, t: Term, candidates: list[Term]) -> tuple[bool, ...]:
        leaves = self._leaves(t, candidates)
        if leaves is None:
            return tuple(False for _ in candidates)
        pairs = [(t, b) for b in candidates]
        return self.egraph.equal(pairs, leaves, key=lambda: shape_key([x for p in pairs for x in p], leaves),
                                 first=True)

    def prove(self, t: Term, b: Term) -> bool:
        if t is b:
            return True
        proven = self.prove_many(t, [b])[0]
        self.stats.proven += proven
        return proven

    def _leaves(self, t: Term, candidates: list[Term]) -> frozenset[int] | None:
        """Opaque leaves: before terms under `t`'s foreign region, and for each candidate the terms
        below it that `t` also reaches (the shared part)."""
        frontier = self.frontier(t)
        if frontier is None:
            return None
        shared = set(frontier)
        # Everything under a shared leaf is shared too; the candidates' own regions stop there.
        for b in candidates:
            for size, _ in enumerate(_walk_until(b, shared), start=1):
                if size > MAX_REGION:
                    return None
        return frozenset(shared)


def _walk_until(root: Term, stop: Container[int]) -> Iterable[Term]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n.id in seen or n.id in stop:
            continue
        seen.add(n.id)
        yield n
        stack.extend(n.args)


def shape_key(roots: list[Term], leaves: frozenset[int]) -> tuple[Any, ...]:
    """The question's structure with leaves renumbered by first occurrence: equal keys, equal answers."""
    index: dict[int, int] = {}
    leaf_no: dict[int, int] = {}
    out: list[Any] = []
    for root in roots:
        stack: list[tuple[Term, bool]] = [(root, False)]
        while stack:
            t, expanded = stack.pop()
            if t.id in index:
                continue
            v = scalar_exact(t) if t.op in ("constant", "broadcast_in_dim") else None
            if t.id in leaves:
                token: Any = ("L", leaf_no.setdefault(t.id, len(leaf_no)))
            elif v is not None:
                token = ("S", exact_text(v), t.type)
            elif not expanded and t.args:
                stack.append((t, True))
                stack.extend((a, False) for a in reversed(t.args) if a.id not in index)
                continue
            else:
                token = (t.op, attr_text(t.attrs), t.type, tuple(index[a.id] for a in t.args))
            index[t.id] = len(out)
            out.append(token)
    return (tuple(index[r.id] for r in roots), tuple(out))
