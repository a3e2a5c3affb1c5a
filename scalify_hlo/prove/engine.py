"""The prover's driver: both programs into one term table, `Holds` facts forward, outputs checked.

`verify(before, after)` reads both modules, derives the before program's terms (one-device mesh) and
the after program's facts (its mesh, parameters seeded from their shardings), keeps the two in step
(`sync.py`), and checks every output: the fact must be resolved, laid out as declared, and its term
proven equal to the reference's. Only then is the verdict `Equivalent`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import scalify_hlo.parsers as parsers  # (installed from ./parsers: mypy cannot follow the mapping)
from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.errors import MismatchError, Span, UnsupportedError, UsageError
from scalify_hlo.ir.nodes import Module, Op, TensorType, walk
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.layout.program import Program, prepare
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric.oracle import numeric_check
from scalify_hlo.prove.derive import Deriver, loop_term, while_terms
from scalify_hlo.prove.egraph import Budget, EGraph
from scalify_hlo.prove.localize import localize_blocks, localize_failure, localize_mismatch
from scalify_hlo.prove.scaling import localize_scaling, prefer_scaling
from scalify_hlo.prove.sync import Sync
from scalify_hlo.report.verdicts import (
    Counterexample,
    Discrepancy,
    Equivalent,
    Finding,
    OutputProof,
    Report,
    Unknown,
)
from scalify_hlo.rules.facts import Fact, Failed, Holds, Varying, view
from scalify_hlo.terms import block_equality, blockwise
from scalify_hlo.terms.evaluate import NotEvaluable, evaluate
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


@dataclass(frozen=True, slots=True)
class Options:
    budget: Budget = field(default_factory=Budget)
    seed: int = 0
    numeric_limit: int = 1 << 24  # elements: term evaluation for counterexamples only below this
    plain: bool = False  # same-device-count equivalence (two per-device or two global programs, no layouts)
    progress: Callable[[str, int, int], None] | None = None  # (stage, ops done, ops in the stage)
    # Input name -> half-open range [lo, hi) its integer values are promised to lie in (token ids):
    # the verdict then holds for those inputs only, and the report says so.
    assume: Mapping[str, tuple[int, int]] = field(default_factory=dict)


def load(source: str | Path | Module) -> Module:
    return source if isinstance(source, Module) else parsers.load(source)


def prove(before: str | Path | Module, after: str | Path | Module, options: Options | None = None) -> Report:
    """Prove `after` (partitioned HLO or shard_map StableHLO) equivalent to the single-device `before`."""
    opts = options or Options()
    started = time.perf_counter()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    _jaxlib.ir(), _jaxlib.dialects()  # importing jaxlib's MLIR: a fixed cost, reported on its own
    timings["startup"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bm, am = load(before), load(after)
    timings["parse"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    bp = prepare(bm)
    ap = prepare(am, hint=bp.mesh if bp.mesh.size == am.num_partitions else None)
    if ap.form == "spmd" and ap.mesh == bp.mesh and len(ap.in_layouts) == len(bp.in_layouts):
        # XLA of jax 0.11+ keeps no sharding on the partitioned module: a parameter without one is laid
        # out as the before program's in_sharding says (jit hands those to XLA), like the outputs.
        ap = dataclasses.replace(ap, in_layouts=tuple(a or b for a, b in zip(ap.in_layouts, bp.in_layouts,
                                                                               strict=True)))
    timings["mesh"] = time.perf_counter() - t0
    _check_pair(bp, ap, opts.plain)
    _check_assumptions(bp, opts.assume)
    prover = _Prover(bp, ap, opts)
    report = prover.run()
    timings.update(prover.timings)
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
        "resynced": prover.sync.stats.resynced if prover.sync else 0,
        # Segments: the e-graph questions (one per resolved value where the programs part and meet again,
        # plus outputs and loop steps); unique ones are the e-graphs actually built, the rest memo hits.
        "segments_total": prover.egraph.stats.questions,
        "segments_unique": prover.egraph.stats.egraph_calls,
    }
    return Report(report.verdict, str(bm.path), str(am.path), stats, report.notes, report.numeric, dict(opts.assume))


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
    names = [_param_name(bp, i) for i in range(len(bp.func.params))]
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
    def __init__(self, bp: Program, ap: Program, opts: Options) -> None:
        self.bp, self.ap, self.opts = bp, ap, opts
        self.terms = Terms({name: (lo, hi - 1) for name, (lo, hi) in opts.assume.items()})
        self.egraph = EGraph(opts.budget)
        self.sync: Sync | None = None
        self.timings: dict[str, float] = {}
        self.notes: list[str] = []
        self.proof_notes: list[str] = []  # how outputs were proven: reported when the verdict is `equivalent`

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
        bd = Deriver(self.terms, Mesh(()), plain=plain, loops=self._reference_loop)
        params = [self.terms.param(i, p.tensor, _param_name(bp, i)) for i, p in enumerate(bp.func.params)]
        if self.opts.progress is not None:
            report = self.opts.progress
            bd.progress = lambda done, total: report("reading the reference", done, total)
        bouts = bd.region(bp.func.body, [Holds(t, Layout.replicated(t.type.rank)) for t in params])
        self.timings["before"] = time.perf_counter() - t0
        before_terms: list[Term] = []
        for j, f in enumerate(bouts):
            g = bd.lift(f)
            if not isinstance(g, Holds):
                reason = g.reason if isinstance(g, Failed) else "a non-tensor result"
                return self._report(Unknown(f"the before program's output {j} cannot be read: {reason}"))
            before_terms.append(g.term)
        if bp.form != "global" and not plain:
            return self._report(Unknown(f"the before program is a {bp.form} program; expected a single-device one"))
        before_values = [f.term for f in bd.facts.values() if isinstance(f, Holds)]
        self.sync = Sync(self.egraph, before_values)
        self.bd = bd
        t0 = time.perf_counter()
        ad = Deriver(self.terms, Mesh(()) if plain else ap.mesh, resync=self.sync.resync, known=self.sync.known,
                     loops=self._induction, plain=plain)
        ad.loop_terms = True
        seeds = self._seeds(params)
        if self.opts.progress is not None:
            report = self.opts.progress
            ad.progress = lambda done, total: report("deriving facts", done, total)
        aouts = ad.region(ap.func.body, seeds)
        self.timings["after"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        verdict = self._outputs(bd, ad, before_terms, aouts)
        self.timings["outputs"] = time.perf_counter() - t0
        if isinstance(verdict, Equivalent):  # how the proof went: said only of a proof that stands
            self.notes.extend(n for n in self.proof_notes if n not in self.notes)
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
        layout it entered the loop with. Step: the after body maps these facts to facts holding exactly
        what the reference body computes from the `v_i`, under the same layouts; and the conditions agree.
        Then each result holds the reference loop's result.

        The reference loops' bodies are read over the loop variables first (the loops inside them are then
        known), the after body once, whichever reference loop is tried; loops inside it are proven by this
        same rule as they come: a nest costs one reading of each body, linear in its depth. Where no step
        is proven but the layouts carry over, the after loop is still exactly the `loop` term of its own
        body (same induction): the outputs are then compared, and evaluated for a counterexample, like any
        others. A loop that matches no reference loop gets that term only when `ad.loop_terms` asks."""
        assert self.sync is not None
        holds = [ad.lift(f) for f in facts]
        if not all(isinstance(h, Holds) for h in holds):
            bad = next(h for h in holds if not isinstance(h, Holds))
            return tuple(bad if isinstance(bad, Failed) else ad.ctx.unsupported(op, "a loop over non-tensors")
                         for _ in op.results)
        hs = [h for h in holds if isinstance(h, Holds)]
        partners = self.loops.get(tuple(sorted(h.term.id for h in hs)), [])
        if not partners and not ad.loop_terms:
            return tuple(ad.ctx.unsupported(op, "a loop whose initial values match no loop of the reference")
                         for _ in op.results)
        n = len(self.terms)
        loop_vars = [self.terms.fresh(f"loop{n}.{i}", h.term.type) for i, h in enumerate(hs)]
        # The reference bodies first: the loops inside them are then known when the after body meets its own.
        steps = [step for partner in partners if (step := self._reference_step(partner, hs, loop_vars)) is not None]
        a_args = [Holds(v, h.layout) for v, h in zip(loop_vars, hs, strict=True)]
        a_step: list[Holds] = []
        for i, a in enumerate((*ad.region(op.regions[0], a_args), *ad.region(op.regions[1], a_args))):
            a = ad.lift(a)
            if isinstance(a, Failed):
                return tuple(a for _ in op.results)
            what = "condition" if i == 0 else f"carried value {i - 1}"
            if not isinstance(a, Holds):
                return tuple(ad.ctx.unsupported(op, f"the loop's {what} is not a tensor fact") for _ in op.results)
            want = Layout.replicated(0) if i == 0 else hs[i - 1].layout
            if a.layout != want:
                return tuple(ad.ctx.fail(op, f"the loop's {what} leaves an iteration as {a.layout.describe(ad.mesh)} "
                                         f"but entered it as {want.describe(ad.mesh)}", evidence=False)
                             for _ in op.results)
            a_step.append(a)
        for b_step, results in steps:
            if all(a.term is b or self.sync.prove(a.term, b) for a, b in zip(a_step, b_step, strict=True)):
                return tuple(Holds(g.term, h.layout) if isinstance(g, Holds) else g
                             for g, h in zip(results, hs, strict=True))
        if not steps and not ad.loop_terms:
            # A case split may still follow it iteration by iteration (a ring of collectives against a
            # reference without that loop). Against a reference loop it could not: the reference's loop
            # term is never unrolled.
            return tuple(ad.ctx.unsupported(op, "a loop whose initial values match no loop of the reference")
                         for _ in op.results)
        terms = loop_term(ad, [h.term for h in hs], loop_vars, a_step[0].term, [a.term for a in a_step[1:]])
        return tuple(Holds(t, h.layout) for t, h in zip(terms, hs, strict=True))

    def _reference_step(self, partner: _RefLoop, hs: list[Holds], loop_vars: list[Term]
                        ) -> tuple[list[Term], list[Fact]] | None:
        """One iteration of a reference loop over the after loop's variables, in the after loop's order of
        the carried values: the condition's and the bodies' terms, and the loop's results. None when the
        loops carry other values."""
        assert self.sync is not None
        b_inits = partner.inits
        if len(b_inits) != len(hs) or len(partner.results) != len(hs):
            return None
        # The partitioner may carry the values in another order: match them by their initial terms.
        sigma: list[int] = []
        for h in hs:
            k = next((k for k, g in enumerate(b_inits) if g.term is h.term and k not in sigma), None)
            if k is None:
                return None
            sigma.append(k)
        b_vars = [loop_vars[0]] * len(hs)
        for i, k in enumerate(sigma):
            b_vars[k] = loop_vars[i]
        b_args = [Holds(v, Layout.replicated(v.type.rank)) for v in b_vars]
        bd = self.bd
        b_cond = [bd.lift(f) for f in bd.region(partner.op.regions[0], b_args)]
        b_body = [bd.lift(f) for f in bd.region(partner.op.regions[1], b_args)]
        held = [f.term for f in (*b_cond, *(b_body[k] for k in sigma)) if isinstance(f, Holds)]
        self.sync.add_before(held)
        if len(held) != len(hs) + 1:
            return None
        return held, [partner.results[k] for k in sigma]

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
            g = ad.lift(f) if isinstance(f, Varying) else f
            if isinstance(g, Failed):
                finding = localize_failure(g, j, self.bp, bd, self.ap, ad)
                (evidence if g.evidence else doubts).append(finding)
                if g.evidence and g.partial:
                    partial[id(finding)] = _partial_counterexample(j, bt.type.rank)
                continue
            if not isinstance(g, Holds):
                doubts.append(Finding(f"output {j} is not a tensor fact"))
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
                partial[id(finding)] = _partial_counterexample(j, bt.type.rank)
                continue
            term = g.term
            if expected is not None and g.layout != expected:
                seen = view(g.term, g.layout, expected.dims, self.ap.mesh, self.terms)
                if seen is None or expected.partial:
                    evidence.append(Finding(
                        f"output {j} is laid out as {g.layout.describe(self.ap.mesh)} but declared "
                        f"{expected.describe(self.ap.mesh)}", expected=expected.describe(self.ap.mesh),
                        found=g.layout.describe(self.ap.mesh)))
                    continue
                term = seen
            norm = blockwise.Normaliser(self.terms)
            if term is bt or self.sync.prove(term, bt) or self._blockwise(term, bt, norm):
                proofs.append(OutputProof(j, (expected or g.layout).describe(self.ap.mesh)))
                continue
            finding = (localize_blocks(j, self.ap, ad, norm)
                       or localize_mismatch(j, term, bt, self.bp, bd, self.ap, ad, self.sync))
            cex = self._counterexample(j, term, bt)
            if cex is not None:
                evidence.append(Finding(finding.reason, finding.before, finding.after, finding.also,
                                        finding.expected, finding.found, cex))
            else:  # no counterexample: the values are not known to differ, only not proven equal
                doubts.append(dataclasses.replace(finding, reason=finding.reason.replace(
                    f"output {j} differs from the reference", f"output {j} is not proven equal to the reference")))
            made = (evidence if cex is not None else doubts)[-1]
            scaled[id(made)] = (made, localize_scaling(j, term, bt, self.bp, bd, self.ap, ad, self.sync))
        evidence, doubts = prefer_scaling(evidence, scaled), prefer_scaling(doubts, scaled)
        if evidence:
            return self._backed(evidence, doubts, partial)
        if doubts:
            reason = doubts[0].reason
            if self.egraph.stats.exhausted:
                reason += " (an e-graph budget ran out: raise --iterations, --nodes or --timeout)"
            return Unknown(reason, tuple(doubts))
        return Equivalent(tuple(proofs))

    def _backed(self, evidence: list[Finding], doubts: list[Finding], partial: dict[int, Counterexample]
                ) -> Discrepancy | Unknown:
        """A discrepancy is printed only with a counterexample: inputs on which the programs, executed,
        differ. Layout contradictions are first checked by running both programs (devices simulated);
        when the programs agree, the contradiction was a layout the rules do not model: `unknown`. Where
        the programs are too big to run, a value left partial is shown wrong at the op alone."""
        if any(f.counterexample is not None for f in evidence):
            return Discrepancy(tuple(evidence + doubts))
        first = evidence[0]
        if _runnable(self.bp, self.ap, self.opts.numeric_limit):
            result = numeric_check(self.bp.module, self.ap.module, self.opts.seed, self._assumed_bounds())
            cex = result.get("counterexample")
            if result.get("ran") and not result["ok"] and isinstance(cex, Counterexample):
                return Discrepancy((dataclasses.replace(first, counterexample=cex), *evidence[1:], *doubts))
            if result.get("ran") and result["ok"]:
                return Unknown(f"not proven: {first.reason} — yet both programs agree when run on random inputs, "
                               "so this is a layout the rules do not model, not evidence of a bug",
                               tuple(evidence + doubts))
        for i, f in enumerate(evidence):
            if id(f) in partial:
                backed = dataclasses.replace(f, counterexample=partial[id(f)])
                return Discrepancy((*evidence[:i], backed, *evidence[i + 1:], *doubts))
        return Unknown(f"not proven: {first.reason} (no counterexample: the programs were not run)",
                       tuple(evidence + doubts))

    def _assumed_bounds(self) -> dict[int, tuple[int, int]]:
        """Input index -> promised half-open range, for the random inputs of a numeric run."""
        names = {_param_name(self.bp, i): i for i in range(len(self.bp.func.params))}
        return {names[k]: v for k, v in self.opts.assume.items() if k in names}

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

    def _run_per_device(self, j: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Plain mode: both per-device programs on the same random per-device inputs, output `j` of all
        devices (collectives exchange data between the simulated devices)."""
        devices = max(self.bp.module.num_partitions, self.ap.module.num_partitions, 1)
        inputs = _stacked_random(self.bp, devices, rng)
        b = numeric.run(self.bp.func, inputs, devices, module=self.bp.module)[j]
        a = numeric.run(self.ap.func, inputs, devices, module=self.ap.module)[j]
        return np.asarray(a), np.asarray(b)

    def _counterexample(self, j: int, after_term: Term, before_term: Term) -> Counterexample | None:
        """Both sides evaluated on random inputs: the evidence that an unproven equality is false."""
        total = sum(t.type.size for root in (after_term, before_term) for t in root.walk())
        if total > self.opts.numeric_limit:
            return None
        rng = np.random.default_rng(self.opts.seed)
        try:
            if self.opts.plain:
                a, b = self._run_per_device(j, rng)
            else:
                leaves = {t.id: t for root in (after_term, before_term) for t in root.walk() if t.op == "param"}
                env = {i: _random(t.type, rng, self.terms.intervals.get(i)) for i, t in leaves.items()}
                a = evaluate(after_term, env)
                b = evaluate(before_term, env)
        except (NotEvaluable, UnsupportedError, ValueError, TypeError, IndexError, KeyError, NotImplementedError):
            return None
        if a.shape != b.shape:
            return None
        exact = a.dtype.kind in "iub" and b.dtype.kind in "iub"  # 2**53 + 1 and 2**53 differ, even as floats not
        same_exactly = a == b if exact else None
        before_raw, after_raw = b, a
        a, b = a.astype(np.float64), b.astype(np.float64)
        with np.errstate(all="ignore"):
            diff = np.abs(a - b)
            same = same_exactly if same_exactly is not None else \
                (a == b) | (np.isnan(a) & np.isnan(b)) | (diff <= 1e-3 + 1e-3 * np.abs(b))
        bad = ~same
        if not np.isfinite(b).any():
            return None  # random inputs drove the reference to inf/NaN everywhere: no evidence either way
        if not bad.any():
            self.notes.append(f"output {j}: not proven, but equal on random inputs (a rule may be missing)")
            return None
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), a.shape))
        # a NaN or inf where the reference is finite is an unbounded difference, not none
        worst = float(np.max(np.where(np.isfinite(diff), diff, np.inf)[bad]))
        if exact:
            gaps = np.abs(after_raw.astype(object) - before_raw.astype(object))[bad]
            return Counterexample(j, idx, int(before_raw[idx]), int(after_raw[idx]), float(max(gaps)))
        return Counterexample(j, idx, float(b[idx]), float(a[idx]), worst)


def _running_max(t: Term) -> bool:
    """Whether `t` shifts an exp by a running max (online softmax): a maximum of two computed values, not
    the maximum with a constant that `jnp.max(..., initial=)` in an ordinary softmax makes."""
    return any(e.op == "exponential" and e.args[0].op == "subtract" and
               any(u.op == "maximum" and not any(is_constant(a) for a in u.args) for u in e.args[0].args[1].walk())
               for e in t.walk())


def _runnable(bp: Program, ap: Program, limit: int) -> bool:
    """Whether both programs are small enough to run whole (elements made by all ops, all devices)."""
    devices = max(ap.mesh.size, ap.module.num_partitions, 1)
    total = 0
    for p, copies in ((bp, 1), (ap, devices)):
        for op in walk(p.func.body.ops):
            for r in op.results:
                if isinstance(r.type, TensorType):
                    total += r.type.size * copies
            if total > limit:
                return False
    return True


def _partial_counterexample(j: int, rank: int) -> Counterexample:
    """A value left partial over an axis (a reduction missing, over the wrong axes or with the wrong
    reducer) where a whole one is needed is wrong for the local values where one device of the axis holds
    the whole value and the others zero: there a device holds 0 where the reference has 1. Built at the
    op alone, for programs too big to run whole."""
    return Counterexample(j, (0,) * rank, 1.0, 0.0, 1.0,
                          "built at the op (the program is too big to run): local values where one device of the "
                          "partial axes holds the whole value and the others 0")


def _stacked_random(p: Program, devices: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [np.stack([_random(v.tensor, rng) for _ in range(devices)]) for v in p.func.params]


def _random(t: TensorType, rng: np.random.Generator, within: tuple[int, int] | None = None) -> np.ndarray:
    """Random values of type `t`; integers in the inclusive range `within` (an assumption) or [0, 8)."""
    if t.dtype in ("i1",):
        return rng.integers(0, 2, t.shape).astype(bool)
    if t.dtype.startswith(("i", "ui")):
        lo, hi = within if within is not None else (0, 7)
        return rng.integers(lo, hi + 1, t.shape).astype(numpy_dtype(t.dtype))
    return rng.standard_normal(t.shape).astype(np.float32)


def _param_name(p: Program, i: int) -> str:
    locs = p.func.arg_locs
    if i < len(locs) and locs[i].op_name:
        return locs[i].op_name or ""
    return f"arg{i}"
