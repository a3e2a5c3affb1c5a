"""Scaling bugs: where a factor enters, compared between the two sides (a `psum` where `pmean` belongs).

A sum over devices of values that each already are the reference's value over the whole batch (the mean of
a shard's loss differentiated, then summed over the data axis) is the reference times the group size. The
term frontier (`localize.localize_mismatch`) then names where the two sides' terms first differ: the local
mean's 1/|shard|, which is right where the value is averaged (`pmean`) and wrong only where it is summed.
Here we compare the factor each side carries: after every sum over devices that feeds a differing output,
the after value is evaluated next to the reference values the prover would compare it with; if it is
exactly the group size times one of them, the collective is where the factor enters.

Which explanation to print is decided over all differing outputs (`prefer_scaling`): the one naming fewer
source lines (a mean written once and summed in two places is the mean's fault; a mean averaged here and
summed there is the sum's), the collective on a tie. This only chooses the lines a report names: it never
changes a verdict, and it runs only on outputs already found to differ or not proven equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from scalify_hlo.ir.errors import UnsupportedError
from scalify_hlo.ir.nodes import Op, TensorType, walk
from scalify_hlo.layout.program import Program
from scalify_hlo.ops.reducers import Reducer
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.prove.sync import Sync
from scalify_hlo.report.verdicts import Finding, Site
from scalify_hlo.rules.facts import Holds
from scalify_hlo.terms.evaluate import NotEvaluable, evaluate
from scalify_hlo.terms.term import Term

MAX_ELEMENTS = 1 << 20  # of the terms evaluated for one collective: beyond, no comparison
_SUMS = ("all_reduce", "reduce_scatter")
_COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "and", "or", "xor"})


def localize_scaling(j: int, after_term: Term, before_term: Term, bp: Program, bd: Deriver, ap: Program,
                     ad: Deriver, sync: Sync) -> Finding | None:
    """The first sum over devices feeding output `j` whose result is the group size times a reference
    value it is compared with (a `psum` where `pmean` belongs); None when there is none."""
    inside = {t.id for t in after_term.walk()}
    partners = _counterparts(after_term, before_term)
    for op in walk(ap.func.body.ops):
        if op.opcode not in _SUMS:
            continue
        for v, r in zip(op.operands, op.results, strict=False):
            f, g = ad.facts.get(v), ad.facts.get(r)
            if not isinstance(f, Holds) or not isinstance(g, Holds) or g.term.id not in inside:
                continue
            if sync.synced(g.term) or g.layout.partial:
                continue
            summed = [a for a, red in f.layout.partial if red is Reducer.SUM and a not in dict(g.layout.partial)]
            n = ap.mesh.size_of(summed)
            if n <= 1:
                continue
            reference = _scaled_counterpart(g.term, float(n), partners.get(g.term.id, []), sync)
            if reference is not None:
                return _finding(j, op, summed, n, reference, bp, bd, ap)
    return None


def _counterparts(after: Term, before: Term) -> dict[int, list[Term]]:
    """after term id -> the reference terms in the same place: both outputs descended together while
    their ops and attributes agree (an SGD update `w - lr * g` against `w - lr * g_ref` pairs g with g_ref)."""
    out: dict[int, list[Term]] = {}
    seen: set[tuple[int, int]] = set()
    stack = [(after, before)]
    while stack:
        a, b = stack.pop()
        if a is b or (a.id, b.id) in seen or a.type != b.type:
            continue
        seen.add((a.id, b.id))
        out.setdefault(a.id, []).append(b)
        if a.op == b.op and a.attrs == b.attrs and len(a.args) == len(b.args):
            args = b.args
            if a.op in _COMMUTATIVE and len(args) == 2 and (a.args[0] is args[1] or a.args[1] is args[0]):
                args = (args[1], args[0])  # the operand both share pairs with itself
            stack.extend(zip(a.args, args, strict=True))
    return out


def _scaled_counterpart(t: Term, n: float, partners: list[Term], sync: Sync) -> Term | None:
    """A reference term in `t`'s place (`partners`) or one the prover would compare `t` with
    (`Sync.candidates`) that `t` is `n` times, on random inputs."""
    frontier = sync.frontier(t)
    candidates = [*partners, *(c for c in (sync.candidates(t, frontier) if frontier else ())
                               if c not in partners)]
    if not candidates or sum(c.type.size for c in candidates) + t.type.size > MAX_ELEMENTS:
        return None
    seen: set[int] = set()
    if any(s.type.size > MAX_ELEMENTS for root in (t, *candidates) for s in root.walk(seen)):
        return None  # (a loop's body, say, computing on tensors too big to evaluate here)
    rng = np.random.default_rng(0)
    env = _random_env([t, *candidates], rng)
    try:
        value = evaluate(t, env).astype(np.float64)
    except (NotEvaluable, UnsupportedError, ValueError, TypeError, IndexError, KeyError, NotImplementedError):
        return None
    for b in candidates:
        try:
            ref = evaluate(b, env).astype(np.float64)
        except (NotEvaluable, UnsupportedError, ValueError, TypeError, IndexError, KeyError, NotImplementedError):
            continue
        if ref.shape != value.shape or not np.isfinite(ref).all() or not np.any(ref != 0):
            continue
        with np.errstate(all="ignore"):
            if np.allclose(value, n * ref, rtol=1e-4, atol=1e-6) and not np.allclose(value, ref, rtol=1e-4, atol=1e-6):
                return b
    return None


def _random_env(roots: Sequence[Term], rng: np.random.Generator) -> dict[int, np.ndarray]:
    seen: set[int] = set()
    leaves = [t for root in roots for t in root.walk(seen) if t.op == "param"]
    return {t.id: _random(t.type, rng) for t in leaves}


def _random(t: TensorType, rng: np.random.Generator) -> np.ndarray:
    if t.dtype == "i1":
        return rng.integers(0, 2, t.shape).astype(bool)
    if t.dtype.startswith(("i", "ui")):
        return rng.integers(0, 8, t.shape).astype(np.int64)
    return rng.standard_normal(t.shape).astype(np.float32)


def _finding(j: int, op: Op, axes: list[str], n: int, reference: Term, bp: Program, bd: Deriver,
             ap: Program) -> Finding:
    site = Site.of(op)
    before = next((o for o in walk(bp.func.body.ops)
                   if o.results and isinstance(h := bd.facts.get(o.results[0]), Holds) and h.term is reference), None)
    before_site = Site.of(before) if before is not None else None
    names = ", ".join(f'"{a}"' for a in axes)
    where = f" (the reference computes it at {before_site.source})" if before_site and before_site.source else ""
    reason = (f"output {j} differs from the reference: the sum over {{{names}}} at {site.source or site.label()} "
              f"yields {n} times the reference's value{where}: a mean over the {n} devices (pmean) belongs there, "
              f"or each summand is {n} times too large")
    return Finding(reason, before_site, site)


def prefer_scaling(findings: list[Finding], scaled: dict[int, tuple[Finding, Finding | None]]) -> list[Finding]:
    """`findings` with the scaling explanations put first where they explain every output whose term
    differs in no more source lines than the term frontier does. `scaled` maps id(finding) of each such
    output's finding (all of them, in `findings` or not) to it and its scaling finding (None: none)."""
    pairs = list(scaled.values())
    if not pairs or any(s is None for _, s in pairs):
        return findings
    if len({_where(s) for _, s in pairs}) > len({_where(f) for f, _ in pairs}):
        return findings
    out = []
    for f in findings:
        s = scaled[id(f)][1] if id(f) in scaled else None
        if s is None:
            out.append(f)
            continue
        reason = s.reason
        if "differs from the reference" not in f.reason:  # not known to differ: only not proven equal
            reason = reason.replace("differs from the reference", "is not proven equal to the reference", 1)
        # Where the terms first differ stays, second: where the summands get their factor.
        also = (f.after,) if f.after is not None else ()
        out.append(dataclasses.replace(s, reason=reason, also=also, counterexample=f.counterexample))
    return out


def _where(f: Finding | None) -> str | None:
    site = f.after if f is not None else None
    return (site.source or site.instruction) if site is not None else None
