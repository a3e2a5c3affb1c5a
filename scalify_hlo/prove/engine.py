"""The prover's driver: both programs into one term table, `Holds` facts forward, outputs checked.

`verify(before, after)` reads both modules, derives the before program's terms (one-device mesh) and
the after program's facts (its mesh, parameters seeded from their shardings), keeps the two in step
(`sync.py`), and checks every output: the fact must be resolved, laid out as declared, and its term
proven equal to the reference's. Only then is the verdict `Equivalent`. Counterexamples, without which
no `Discrepancy` is reported, come from `evidence.py`; the options are in `options.py`.
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import scalify_hlo.parsers as parsers  # (installed from ./parsers: mypy cannot follow the mapping)
from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import MismatchError, Span, UsageError
from scalify_hlo.ir.nodes import Module, Op, TensorType, walk
from scalify_hlo.layout.boundary import is_gspmd_manual
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.layout.program import Program, prepare, prepare_against
from scalify_hlo.ops.reducers import rounding_reducers
from scalify_hlo.parsers.chlo import expand_for_hlo
from scalify_hlo.prove import carried
from scalify_hlo.prove.derive import Deriver, loop_term, unrolled, while_terms
from scalify_hlo.prove.egraph import Deadline, EGraph
from scalify_hlo.prove.evidence import Evidence, param_name, partial_counterexample
from scalify_hlo.prove.layers import LayerStats
from scalify_hlo.prove.localize import localize_blocks, localize_failure, localize_mismatch
from scalify_hlo.prove.options import Options
from scalify_hlo.prove.origin import Tracer, refine, refine_verdict
from scalify_hlo.prove.scaling import localize_scaling, prefer_scaling
from scalify_hlo.prove.sync import Sync
from scalify_hlo.report.focus import focus
from scalify_hlo.report.verdicts import (
    Counterexample,
    Discrepancy,
    Equivalent,
    Finding,
    OutputProof,
    Report,
    Site,
    Unknown,
)
from scalify_hlo.rules import halo, perblock
from scalify_hlo.rules.facts import Fact, Failed, Halo, Holds, Varying, as_layout, view
from scalify_hlo.terms import block_equality, blockwise
from scalify_hlo.terms.joins import is_constant
from scalify_hlo.terms.ranges import dtype_bounds
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


@dataclass(frozen=True, slots=True)
class _RefLoop:
    """A loop of the reference program as it was read: its op, its initial facts and its result facts."""

    op: Op
    inits: tuple[Holds, ...]
    results: tuple[Fact, ...]


def load(source: str | Path | Module) -> Module:
    return source if isinstance(source, Module) else parsers.load(source)


def prove(before: str | Path | Module, after: str | Path | Module, options: Options | None = None) -> Report:
    """Prove `after` (partitioned HLO or shard_map StableHLO) equivalent to the single-device `before`."""
    with _rare_young_collections(), rounding_reducers((options or Options()).excess_precision):
        return _prove(before, after, options)


@contextmanager
def _rare_young_collections() -> Iterator[None]:
    """The garbage collector's youngest generation collected every 100,000 allocations instead of 700,
    then restored: a proof allocates millions of small objects (ops, terms, facts) that live to the end and
    hold no cycles, and each collection scanning them is time lost (17% of a 405B forward pass, measured;
    the same peak memory)."""
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, 100_000), *older)
    try:
        yield
    finally:
        gc.set_threshold(young, *older)


def _prove(before: str | Path | Module, after: str | Path | Module, options: Options | None) -> Report:
    opts = options or Options()
    started = time.perf_counter()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    _jaxlib.ir(), _jaxlib.dialects()  # importing jaxlib's MLIR: a fixed cost, reported on its own
    timings["startup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bm, am = load(before), load(after)
    if am.kind == "hlo":  # (XLA expanded the chlo ops it has no opcode for: so must the reference)
        bm = expand_for_hlo(bm)
    timings["parse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bp = prepare(bm)
    ap = prepare_against(am, bp)
    timings["mesh"] = time.perf_counter() - t0
    _check_pair(bp, ap, opts.plain)
    _check_assumptions(bp, opts.assume)
    # The time limit counts from the start: parsing is part of the run a user waits for.
    deadline = Deadline(started + opts.time_limit, opts.time_limit) if opts.time_limit is not None else None
    prover = _Prover(bp, ap, opts, deadline)
    report = prover.run()
    timings.update(prover.timings)
    first = prover
    if prover.layers.instances and isinstance(report.verdict, Unknown) and not (deadline and deadline.passed()):
        # Substituted layers keep the normal forms their template chose over opaque inputs; where that
        # leaves a question open, every op is read as usual before `unknown` is said.
        prover = _Prover(bp, ap, dataclasses.replace(opts, layers=False), deadline)
        report = prover.run()
        for k, v in prover.timings.items():
            timings[k] = timings.get(k, 0.0) + v
    stats = {
        "seconds": round(time.perf_counter() - started, 3),
        "stages": {k: round(v, 4) for k, v in timings.items()},
        "ops": sum(1 for _ in walk(ap.func.body.ops)),
        "before_ops": sum(1 for _ in walk(bp.func.body.ops)),
        "mesh": ap.mesh.describe(),
        "after_form": ap.form,
        "terms": len(prover.terms),
        "egraph_calls": prover.egraph.stats.egraph_calls,
        "egraph_memo_hits": prover.egraph.stats.memo_hits,
        "egraph_max_nodes": prover.egraph.stats.max_nodes,
        "egraph_seconds": round(prover.egraph.stats.seconds, 4),
        "egraph_budget_exhausted": prover.egraph.stats.exhausted,
        "time_limit_reached": bool(deadline and deadline.passed()),
        "egraph_ruled_out": prover.egraph.stats.ruled_out,  # questions no rewrite could settle, not asked
        "resynced": prover.sync.stats.resynced if prover.sync else 0,
        # How the outputs of a proof were proven (`OutputProof.how`): the share that needed saturation.
        "proofs": dict(Counter(o.how for o in report.verdict.outputs)) if isinstance(report.verdict, Equivalent) else {},
        # Segments: the e-graph questions (one per resolved value where the programs part and meet again,
        # plus outputs and loop steps); unique ones are the e-graphs actually built, the rest memo hits.
        "segments_total": prover.egraph.stats.questions,
        "segments_unique": prover.egraph.stats.egraph_calls,
        # Layer memoization: runs of alike segments found, segments read over fresh leaves (templates),
        # segments that took a template's facts, ops so substituted; `retried`: re-derived without.
        "layers": {**dataclasses.asdict(first.layers), "retried": prover is not first},
    }
    verdict = focus(report.verdict, bm)
    return Report(verdict, str(bm.path), str(am.path), stats, report.notes, report.numeric, dict(opts.assume))


def _check_pair(bp: Program, ap: Program, plain: bool = False) -> None:
    """Inputs the two programs cannot be compared on at all: that is bad input (exit 3), not a verdict."""
    b, a = bp.func, ap.func
    if len(b.params) != len(a.params):
        raise MismatchError(Span(ap.path), f"the after program has {len(a.params)} parameters, the before program "
                            f"{len(b.params)}; expected the same inputs in the same order")
    if len(b.outputs) != len(a.outputs):
        raise MismatchError(Span(ap.path), f"the after program has {len(a.outputs)} results, the before program "
                            f"{len(b.outputs)}; expected the same outputs in the same order")
    for i, (pb, pa) in enumerate(zip(b.params, a.params, strict=True)):
        if not isinstance(pb.type, TensorType) or not isinstance(pa.type, TensorType):
            continue
        if pb.type.dtype != pa.type.dtype:
            raise MismatchError(Span(ap.path), f"parameter {i} is {pa.type} after but {pb.type} before; "
                                "expected the same element type")
        layout = ap.in_layouts[i] if ap.form == "spmd" and not plain else None
        want = layout.local_shape(pb.type.shape, ap.mesh) if layout is not None else pb.type.shape
        if tuple(pa.type.shape) != tuple(want):
            how = f"its {layout.describe(ap.mesh)} shard" if layout is not None else "the same shape"
            raise MismatchError(Span(ap.path), f"parameter {i} is {pa.type} after but {pb.type} before; expected "
                                f"{how}: {list(want)}")


def _check_assumptions(bp: Program, assume: Mapping[str, tuple[int, int]]) -> None:
    names = [param_name(bp, i) for i in range(len(bp.func.params))]
    for name, (lo, hi) in assume.items():
        if name not in names:
            raise UsageError(Span(bp.path), f"--assume names `{name}`, which is not an input of the before program; "
                             f"expected one of: {', '.join(names)}")
        t = bp.func.params[names.index(name)].type
        dtype = t.dtype if isinstance(t, TensorType) else ""
        bounds = dtype_bounds(dtype)
        if bounds is None:
            raise UsageError(Span(bp.path), f"--assume {name}=...: `{name}` is {t}; expected an integer input")
        if hi <= lo or lo < bounds[0] or hi - 1 > bounds[1]:
            raise UsageError(Span(bp.path), f"--assume {name}={lo}:{hi}: expected a non-empty range of {dtype} "
                             f"values, within [{bounds[0]}, {bounds[1] + 1})")


class _Prover:
    def __init__(self, bp: Program, ap: Program, opts: Options, deadline: Deadline | None = None) -> None:
        self.bp, self.ap, self.opts, self.deadline = bp, ap, opts, deadline
        self.terms = Terms({name: (lo, hi - 1) for name, (lo, hi) in opts.assume.items()}, dot_views=opts.plain,
                           excess_precision=opts.excess_precision)
        self.egraph = EGraph(opts.budget, deadline)
        self.sync: Sync | None = None
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []
        self.proof_notes: list[str] = []  # how outputs were proven: reported when the verdict is `equivalent`
        self.layers = LayerStats()
        self.evidence = Evidence(bp, ap, opts, self.terms, self.notes)
        # Both programs run once, lazily, to name where a differing output's values part ways (`origin`).
        self.tracer = Tracer(bp, ap, opts.seed, self.evidence.assumed_bounds(), opts.numeric_limit, deadline)

    def run(self) -> Report:
        bp, ap = self.bp, self.ap
        if max(bp.module.num_replicas, ap.module.num_replicas) > 1:
            # Cross-replica collectives and replica-id are modelled for one replica only.
            return self._report(Unknown("programs with several replicas (num_replicas > 1) are not supported; "
                                        "expected SPMD partitions of one replica"))
        t0 = time.perf_counter()
        plain = self.opts.plain
        # Every reference loop, as the before program reads it (loop bodies too, each time an induction
        # re-reads the body around them): the loops an after loop may be proven against.
        self.loops: dict[tuple[int, ...], list[_RefLoop]] = {}
        # A reference with a shard_map inside (a jit that calls one) reads it over the module's mesh; what
        # surrounds it, and so every output, is global.
        manual = (bp.form == "manual" or is_gspmd_manual(bp.module)) and not plain
        bd = Deriver(self.terms, bp.mesh if manual else Mesh(()), plain=plain, loops=self._reference_loop,
                     deadline=self.deadline)
        params = [self.terms.param(i, p.tensor, param_name(bp, i)) for i, p in enumerate(bp.func.params)]
        if self.opts.progress is not None:
            report = self.opts.progress
            bd.progress = lambda done, total: report("reading the reference", done, total)
        layers = self.layers if self.opts.layers else None
        bouts = bd.region(bp.func.body, [Holds(t, Layout.replicated(t.type.rank)) for t in params], layers=layers)
        self.timings["before"] = time.perf_counter() - t0
        before_terms: list[Term] = []
        for j, f in enumerate(bouts):
            g = bd.lift(f)
            if isinstance(g, Holds) and g.layout.partial:
                g = Failed(f"a value still partial over {sorted(g.layout.partial_axes())} leaves a shard_map", None, False)
            elif isinstance(f, Varying) and isinstance(g, Holds) and g.layout.split_axes():
                # (a global program has one value, not one per device: no layout reads it as blocks)
                g = Failed("a value that differs from device to device is an output of the reference", None, False)
            if not isinstance(g, Holds):
                reason = f"the before program's output {j} cannot be read: " + (
                    g.reason if isinstance(g, Failed) else "a non-tensor result")
                at = g.op if isinstance(g, Failed) else None
                return self._report(Unknown(reason, (Finding(reason, before=Site.of(at)),) if at else ()))
            before_terms.append(g.term)
        if bp.form not in ("global", "manual") and not plain:
            return self._report(Unknown(f"the before program is a {bp.form} program; expected a single-device one"))
        before_values = [f.term for f in bd.facts.values() if isinstance(f, Holds)]
        self.sync = Sync(self.egraph, before_values)
        self.bd = bd
        t0 = time.perf_counter()
        ad = Deriver(self.terms, Mesh(()) if plain else ap.mesh, resync=self.sync.resync, known=self.sync.known,
                     loops=self._induction, plain=plain, deadline=self.deadline)
        ad.loop_terms = True
        seeds = self._seeds(params)
        if self.opts.progress is not None:
            report = self.opts.progress
            ad.progress = lambda done, total: report("deriving facts", done, total)
        aouts = ad.region(ap.func.body, seeds, layers=layers)
        self.timings["after"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        verdict = self._outputs(bd, ad, before_terms, aouts)
        self.timings["outputs"] = time.perf_counter() - t0
        if isinstance(verdict, Equivalent):  # how the proof went: said only of a proof that stands
            self.notes.extend(n for n in self.proof_notes if n not in self.notes)
        if isinstance(verdict, Equivalent):
            self.notes.extend(sorted(n for n in self.terms.notes if n not in self.notes))
        if isinstance(verdict, Equivalent) and (self.sync.stats.resynced or self.sync.stats.proven):
            self.notes.append("the proof used equality saturation (associativity/commutativity and exact scalings "
                              "over the reals); floating-point results may differ by rounding")
        return self._report(verdict)

    def _reference_loop(self, bd: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        """A loop of the reference program: its terms (`derive.while_terms`), and a note of it under its
        initial values, for the after program's loops that start like it."""
        out = while_terms(bd, op, facts)
        inits = tuple(h for f in facts if isinstance(h := bd.lift(f), Holds))
        if len(inits) == len(facts):
            known = self.loops.setdefault(tuple(sorted(h.term.id for h in inits)), [])
            if not any(r.op is op and all(a.term is b.term for a, b in zip(r.inits, inits, strict=True))
                       for r in known):
                known.append(_RefLoop(op, inits, out))
        return out

    def _induction(self, ad: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
        """A loop of the after program, proven by induction against a reference loop it starts like.

        Hypothesis: on entering an iteration every carried value holds the loop variable `v_i` under the
        layout it entered the loop with, and the reference's value in its slot is `v_i` (or the tiling of
        `v_i` it was paired with, `carried.match`). Step: the after body maps these facts to facts holding
        exactly what the reference body computes from those, under the same layouts (compared through the
        same tilings); and the conditions agree. Then each result holds the reference loop's result.

        The reference loops' bodies are read over the loop variables first (the loops inside them are then
        known), the after body once, whichever reference loop is tried; loops inside it are proven by this
        same rule as they come: a nest costs one reading of each body, linear in its depth. (A carried
        value that leaves an iteration more split than it entered starts the reading over, `carried.relaid`.)
        Where no step is proven but the layouts carry over, the after loop is still exactly the `loop` term
        of its own body (same induction): the outputs are then compared, and evaluated for a counterexample,
        like any others. A loop that matches no reference loop gets that term only when `ad.loop_terms` asks."""
        assert self.sync is not None
        holds = [ad.lift(f) for f in facts]
        if not all(isinstance(h, Holds) for h in holds):
            bad = next(h for h in holds if not isinstance(h, Holds))
            return tuple(bad if isinstance(bad, Failed) else ad.ctx.unsupported(op, "a loop over non-tensors")
                         for _ in op.results)
        hs = [h for h in holds if isinstance(h, Holds)]
        partners = self._partners(ad, hs)
        if not partners and (out := unrolled(ad, op, facts)) is not None:
            return out
        alone = tuple(range(len(hs)))
        # A carried value that leaves an iteration more split than it entered (a scan's buffer of zeros
        # that each iteration writes a batch-split slot of) is read again as what its initial value also
        # is, the shard of its view under that layout (`view`: exact, so the hypothesis stays true), and
        # the body derived again; layouts only grow more split, so this ends.
        for _ in range(len(hs) * len(ad.mesh.axes) + 1):
            if not partners and not ad.loop_terms:
                return tuple(ad.ctx.unsupported(op, "a loop whose initial values match no loop of the reference")
                             for _ in op.results)
            # Slots carrying one value twice share a variable, as the first pairing that needs it says (the
            # pairings that would share otherwise are not tried).
            share = next((p.share for _, p in partners if p.share != alone), alone)
            loop_vars, steps, a_out = self._round(ad, op, hs, [(r, p) for r, p in partners if p.share == share],
                                                  share)
            relaid = carried.relaid(ad.mesh, self.terms, hs, a_out[1:])
            if relaid is None:
                break
            hs = relaid
            partners = self._partners(ad, hs)
        else:
            return tuple(ad.ctx.unsupported(op, "a loop whose carried layouts do not settle") for _ in op.results)
        a_step = self._carried(ad, op, hs, a_out)
        if isinstance(a_step, Failed):
            return tuple(a_step for _ in op.results)
        for b_step, results, pairing in steps:
            # A value paired with a tiling of the reference's is compared through that tiling.
            seen = [a_step[0].term, *(view(a.term, a.layout, lay.dims, ad.mesh, self.terms)
                                      for a, lay in zip(a_step[1:], pairing.layouts, strict=True))]
            if all(a is not None and (a is b or self.sync.prove(a, b)) for a, b in zip(seen, b_step, strict=True)):
                return tuple(Holds(g.term, lay) if isinstance(g, Holds) else g
                             for g, lay in zip(results, pairing.layouts, strict=True))
        if not steps and not ad.loop_terms:
            # A case split may still follow it iteration by iteration (a ring of collectives against a
            # reference without that loop). Against a reference loop it could not: the reference's loop
            # term is never unrolled.
            return tuple(ad.ctx.unsupported(op, "a loop whose initial values match no loop of the reference")
                         for _ in op.results)
        if share != alone:  # the loop's own term binds one variable per slot: read the body again so
            loop_vars, _, a_out = self._round(ad, op, hs, [], alone)
            a_step = self._carried(ad, op, hs, a_out)
            if isinstance(a_step, Failed):
                return tuple(a_step for _ in op.results)
        terms = loop_term(ad, [h.term for h in hs], loop_vars, a_step[0].term, [a.term for a in a_step[1:]])
        return tuple(Holds(t, h.layout) for t, h in zip(terms, hs, strict=True))

    def _round(self, ad: Deriver, op: Op, hs: list[Holds], partners: list[tuple[_RefLoop, carried.Pairing]],
               share: tuple[int, ...]) -> tuple[list[Term], list[tuple[list[Term], list[Fact], carried.Pairing]],
                                                list[Fact]]:
        """One reading of an after loop from `hs`: its variables (slots sharing one as `share` says), one
        iteration of each reference partner over them, and the after condition's and body's facts."""
        n = len(self.terms)
        fresh = {i: self.terms.fresh(f"loop{n}.{i}", hs[i].term.type) for i in sorted(set(share))}
        loop_vars = [fresh[share[i]] for i in range(len(hs))]
        # The reference bodies first: the loops inside them are then known when the after body meets its own.
        steps = [step for partner, pairing in partners
                 if (step := self._reference_step(ad, partner, pairing, hs, loop_vars)) is not None]
        # A value the body returns unchanged is its initial value on every iteration: read as that.
        fixed = carried.invariant(op)
        a_args = [h if i in fixed else Holds(v, h.layout) for i, (v, h) in enumerate(zip(loop_vars, hs, strict=True))]
        a_out = [ad.lift(a) for a in (*ad.region(op.regions[0], a_args), *ad.region(op.regions[1], a_args))]
        return loop_vars, steps, a_out

    @staticmethod
    def _carried(ad: Deriver, op: Op, hs: list[Holds], a_out: list[Fact]) -> list[Holds] | Failed:
        """The condition's and carried values' facts after one iteration, each laid out as it entered."""
        a_step: list[Holds] = []
        for i, a in enumerate(a_out):
            if isinstance(a, Failed):
                return a
            what = "condition" if i == 0 else f"carried value {i - 1}"
            if not isinstance(a, Holds):
                return ad.ctx.unsupported(op, f"the loop's {what} is not a tensor fact")
            want = Layout.replicated(0) if i == 0 else hs[i - 1].layout
            if a.layout != want:
                return ad.ctx.fail(op, f"the loop's {what} leaves an iteration as {a.layout.describe(ad.mesh)} "
                                   f"but entered it as {want.describe(ad.mesh)}", evidence=False)
            a_step.append(a)
        return a_step

    def _partners(self, ad: Deriver, hs: list[Holds]) -> list[tuple[_RefLoop, carried.Pairing]]:
        """The reference loops an after loop starting from `hs` may reproduce, each with the pairing of
        their carried values (`carried.match`: the partitioner may carry them in another order, some twice,
        and hold some as shards of tilings of the reference's). Loops starting from the same terms first."""
        same = self.loops.get(tuple(sorted(h.term.id for h in hs)), [])
        others = [r for rs in self.loops.values() if rs is not same for r in rs] if not same else []
        out = []
        for partner in (*same, *others):
            if len(partner.inits) == len(partner.results) <= len(hs):
                pairing = carried.match(ad.mesh, self.terms, hs, partner.inits)
                if pairing is not None:
                    out.append((partner, pairing))
        return out

    def _reference_step(self, ad: Deriver, partner: _RefLoop, pairing: carried.Pairing, hs: list[Holds],
                        loop_vars: list[Term]) -> tuple[list[Term], list[Fact], carried.Pairing] | None:
        """One iteration of a reference loop over the after loop's variables, in the after loop's order of
        the carried values: the condition's and the bodies' terms, and the loop's results (with the
        pairing). A value the after loop holds as the shard of a tiling of the reference's is that tiling
        of its variable. None when the body cannot be read."""
        assert self.sync is not None
        b_vars: list[Term | None] = [None] * len(partner.inits)
        fixed = carried.invariant(partner.op)
        for i, k in enumerate(pairing.sigma):
            if k in fixed:
                b_vars[k] = partner.inits[k].term
            elif pairing.share[i] == i:
                b_vars[k] = view(loop_vars[i], hs[i].layout, pairing.layouts[i].dims, ad.mesh, self.terms)
        if any(v is None for v in b_vars):
            return None
        b_args = [Holds(v, Layout.replicated(v.type.rank)) for v in b_vars if v is not None]
        bd = self.bd
        b_cond = [bd.lift(f) for f in bd.region(partner.op.regions[0], b_args)]
        b_body = [bd.lift(f) for f in bd.region(partner.op.regions[1], b_args)]
        held = [f.term for f in (*b_cond, *(b_body[k] for k in pairing.sigma)) if isinstance(f, Holds)]
        self.sync.add_before(held)
        if len(held) != len(hs) + 1:
            return None
        return held, [partner.results[k] for k in pairing.sigma], pairing

    def _report(self, verdict: Equivalent | Discrepancy | Unknown) -> Report:
        return Report(verdict, self.bp.path, self.ap.path, {}, tuple(self.notes))

    def _seeds(self, params: list[Term]) -> list[Fact]:
        ap = self.ap
        seeds: list[Fact] = []
        for i, t in enumerate(params):
            layout = ap.in_layouts[i] if ap.form == "spmd" and not self.opts.plain else None
            seeds.append(Holds(t, layout or Layout.replicated(t.type.rank)))
        return seeds

    def _expected_layout(self, j: int, rank: int) -> Layout | None:
        if self.ap.form != "spmd" or self.opts.plain:
            return Layout.replicated(rank)
        return self.ap.out_layouts[j] or self.bp.out_layouts[j]

    def _outputs(self, bd: Deriver, ad: Deriver, before_terms: list[Term], aouts: tuple[Fact, ...]
                 ) -> Equivalent | Discrepancy | Unknown:
        assert self.sync is not None
        proofs: list[OutputProof] = []
        evidence: list[Finding] = []
        doubts: list[Finding] = []
        partial: dict[int, Counterexample] = {}  # finding id -> the op-level case of a value left partial
        scaled: dict[int, tuple[Finding, Finding | None]] = {}  # term mismatches and a scaling that explains them
        for j, (bt, f) in enumerate(zip(before_terms, aouts, strict=True)):
            if self.deadline is not None and self.deadline.passed() and not isinstance(f, Failed):
                # (comparing an output that differs, and looking for where, may take long: not past the limit)
                doubts.append(Finding(f"output {j} is not compared: {self.deadline.reason}"))
                continue
            g = ad.lift(f) if isinstance(f, Varying) else f
            if isinstance(g, Failed):
                finding = localize_failure(g, j, self.bp, bd, self.ap, ad)
                (evidence if g.evidence else doubts).append(finding)
                if g.evidence and g.partial:
                    partial[id(finding)] = partial_counterexample(j, bt.type.rank)
                continue
            if not isinstance(g, Holds):
                what = f"holds {halo.describe(g, ad.ctx)}" if isinstance(g, Halo) else "is not a tensor fact"
                doubts.append(Finding(f"output {j} {what}"))
                continue
            expected = self._expected_layout(j, bt.type.rank)
            if g.layout.partial:
                axes = ", ".join(f'"{a}"' for a, _ in g.layout.partial)
                finding = localize_failure(
                    Failed(f"output {j} is still partial over {{{axes}}}: every device holds a partial result and "
                           f"a reduction over {{{axes}}} is missing", g.origin, True, origin=g.origin,
                           expected=expected.describe(self.ap.mesh) if expected else "no partial axes",
                           found=g.layout.describe(self.ap.mesh), partial=True), j, self.bp, bd, self.ap, ad)
                evidence.append(finding)
                partial[id(finding)] = partial_counterexample(j, bt.type.rank)
                continue
            term = g.term
            if expected is not None and g.layout != expected:
                seen = view(g.term, g.layout, expected.dims, self.ap.mesh, self.terms)
                if seen is None:  # the same numbers on every device, the split dims named otherwise
                    seen = as_layout(g, expected, bt.type.shape, self.ap.mesh, self.terms)
                if seen is None or expected.partial:
                    evidence.append(Finding(
                        f"output {j} is laid out as {g.layout.describe(self.ap.mesh)} but declared "
                        f"{expected.describe(self.ap.mesh)}", expected=expected.describe(self.ap.mesh),
                        found=g.layout.describe(self.ap.mesh)))
                    continue
                term = seen
            norm = blockwise.Normaliser(self.terms, self.deadline.passed if self.deadline is not None else lambda: False)
            how = ("identical" if term is bt else "saturation" if self.sync.prove(term, bt)
                   else "blockwise" if self._blockwise(term, bt, norm) else None)
            if how is not None:
                proofs.append(OutputProof(j, (expected or g.layout).describe(self.ap.mesh), how))
                continue
            finding = (localize_blocks(j, self.ap, ad, norm)
                       or localize_mismatch(j, term, bt, self.bp, bd, self.ap, ad, self.sync))
            cex = self.evidence.counterexample(j, term, bt)
            if cex is not None:
                read = perblock.read_by(ad.ctx, term)  # a per-device scalar where a psum may be missing
                finding = (localize_failure(read, j, self.bp, bd, self.ap, ad) if read is not None
                           else refine(self.tracer, j, finding))
                evidence.append(Finding(finding.reason, finding.before, finding.after, finding.also,
                                        finding.expected, finding.found, cex))
            else:  # no counterexample: the values are not known to differ, only not proven equal
                doubts.append(dataclasses.replace(finding, reason=finding.reason.replace(
                    f"output {j} differs from the reference", f"output {j} is not proven equal to the reference")))
            made = (evidence if cex is not None else doubts)[-1]
            scaled[id(made)] = (made, localize_scaling(j, term, bt, self.bp, bd, self.ap, ad, self.sync))
        evidence, doubts = prefer_scaling(evidence, scaled), prefer_scaling(doubts, scaled)
        if evidence:
            return self.evidence.backed(evidence, doubts, partial)
        if doubts and (found := self.evidence.run_for_evidence(doubts)) is not None:
            return refine_verdict(self.tracer, found)
        if doubts:
            reason = doubts[0].reason
            if self.deadline is not None and self.deadline.passed():
                if self.deadline.reason not in reason:  # (an op left unread says so already)
                    reason += f" ({self.deadline.reason})"
            elif self.egraph.stats.exhausted:
                reason += f" ({self._exhausted()}: raise --iterations, --nodes or --timeout)"
            return Unknown(reason, tuple(doubts))
        return Equivalent(tuple(proofs))

    def _exhausted(self) -> str:
        """Where an e-graph budget first ran out: the op whose value was being brought back in step, if any."""
        stats, op = self.egraph.stats, self.sync.exhausted_at if self.sync else None
        where = ""
        if op is not None:
            site = Site.of(op)
            where = f", first at {site.label()}" + (f" ({site.source})" if site.source else "")
        return (f"an e-graph budget ran out {stats.exhausted} time{'s' if stats.exhausted > 1 else ''}{where}, "
                f"reaching {stats.exhausted_nodes} e-nodes")

    def _blockwise(self, term: Term, bt: Term, norm: blockwise.Normaliser) -> bool:
        if not block_equality.equal(self.terms, term, bt, norm):
            return False
        seen: set[int] = set()
        used = [t for root in (term, bt) for t in root.walk(seen)]
        if not any(t.type.dtype.startswith(("f", "bf")) for t in used):
            return True  # integer sums and maxima regroup exactly: nothing to say about rounding
        softmax = " (online softmax: running max, rescaled sums)" if _running_max(term) else ""
        note = (f"the proof compared outputs block by block with the reference's blocks and put blockwise "
                f"reductions{softmax} in one normal form, with identities exact over the reals for finite values; "
                "floating-point results may differ by rounding")
        if note not in self.proof_notes:
            self.proof_notes.append(note)
        return True

def _running_max(t: Term) -> bool:
    """Whether `t` shifts an exp by a running max (online softmax): a maximum of two computed values, not
    the maximum with a constant that `jnp.max(..., initial=)` in an ordinary softmax makes."""
    return any(e.op == "exponential" and e.args[0].op == "subtract" and
               any(u.op == "maximum" and not any(is_constant(a) for a in u.args) for u in e.args[0].args[1].walk())
               for e in t.walk())


