"""Counterexamples: the evidence that an unproven equality is false.

A `discrepancy` is reported only with one. It comes from evaluating the two sides' terms of an output on
random inputs (`counterexample`), from running both whole programs with every device simulated
(`backed`, `run_for_evidence`: for layout contradictions and for outputs the rules could not follow), or,
for programs too big to run, from a value left partial, shown wrong at the op alone
(`partial_counterexample`). Agreement on random inputs proves nothing: the verdict stays `unknown`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scalify_hlo.ir.dtypes import LOW_FLOATS, numpy_dtype
from scalify_hlo.ir.errors import UnsupportedError
from scalify_hlo.ir.loops import trip_count
from scalify_hlo.ir.nodes import Op, TensorType, Value, walk
from scalify_hlo.layout.program import Program
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric.oracle import numeric_check
from scalify_hlo.numeric.values import WIDE, widened
from scalify_hlo.prove.options import Options
from scalify_hlo.report.verdicts import Counterexample, Discrepancy, Finding, Unknown
from scalify_hlo.terms.evaluate import NotEvaluable, evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


class Evidence:
    """Counterexamples for one pair of programs; notes (equal on random inputs) go to `notes`."""

    def __init__(self, bp: Program, ap: Program, opts: Options, terms: Terms, notes: list[str]) -> None:
        self.bp, self.ap, self.opts, self.terms, self.notes = bp, ap, opts, terms, notes
        # plain mode: (after outputs, before outputs) of one whole run, per WIDE setting; every unproven
        # output reads the same run
        self._runs: dict[bool, tuple[list[np.ndarray], list[np.ndarray]] | None] = {}

    def backed(self, evidence: list[Finding], doubts: list[Finding], partial: dict[int, Counterexample]
                ) -> Discrepancy | Unknown:
        """A discrepancy is printed only with a counterexample: inputs on which the programs, executed,
        differ. Layout contradictions are first checked by running both programs (devices simulated);
        when the programs agree, the contradiction was a layout the rules do not model: `unknown`. Where
        the programs are too big to run, a value left partial is shown wrong at the op alone."""
        if any(f.counterexample is not None for f in evidence):
            return Discrepancy(tuple(evidence + doubts))
        first = evidence[0]
        if runnable(self.bp, self.ap, self.opts.numeric_limit):
            result = numeric_check(self.bp.module, self.ap.module, self.opts.seed, self.assumed_bounds())
            cex = result.get("counterexample")
            if result.get("ran") and not result["ok"] and isinstance(cex, Counterexample):
                return Discrepancy((dataclasses.replace(first, counterexample=cex), *evidence[1:], *doubts))
            if result.get("ran") and result["ok"]:
                return Unknown(f"not proven: {first.reason} — yet both programs agree when run on random inputs, "
                               "so no bug was shown: most likely a layout the rules do not model (random inputs "
                               "miss a bug that only some inputs reach, such as labels equal to an argmax)",
                               tuple(evidence + doubts))
        for i, f in enumerate(evidence):
            if id(f) in partial:
                backed = dataclasses.replace(f, counterexample=partial[id(f)])
                return Discrepancy((*evidence[:i], backed, *evidence[i + 1:], *doubts))
        return Unknown(f"not proven: {first.reason} (no counterexample: the programs were not run)",
                       tuple(evidence + doubts))

    def run_for_evidence(self, doubts: list[Finding]) -> Discrepancy | None:
        """Outputs the rules could not follow are not known to differ; running both programs (devices
        simulated, when they are small enough) can still show that they do. A disagreement beyond float32
        noise is a counterexample: a discrepancy, named where the proof stopped following the program
        (often the op that is wrong: replica groups no mesh axes explain, a shard taken twice). Agreement
        proves nothing and leaves the verdict `unknown`."""
        if self.opts.plain or not runnable(self.bp, self.ap, self.opts.numeric_limit):
            return None
        if computes_in_low_precision(self.bp) or computes_in_low_precision(self.ap):
            return None  # bf16/f16/f8 rounding in another order drifts past the float32 tolerance
        result = numeric_check(self.bp.module, self.ap.module, self.opts.seed, self.assumed_bounds())
        cex = result.get("counterexample")
        if not (result.get("ran") and not result["ok"] and isinstance(cex, Counterexample)):
            return None
        k = next((i for i, f in enumerate(doubts) if f"output {cex.output} " in f.reason), 0)
        first = doubts[k]
        reason = (f"output {cex.output} differs from the reference when both programs run; the proof stopped "
                  f"following it here: {first.reason.removeprefix('not proven: ')}")
        return Discrepancy((dataclasses.replace(first, reason=reason, counterexample=cex),
                            *doubts[:k], *doubts[k + 1:]))

    def assumed_bounds(self) -> dict[int, tuple[int, int]]:
        """Input index -> promised half-open range, for the random inputs of a numeric run."""
        names = {param_name(self.bp, i): i for i in range(len(self.bp.func.params))}
        return {names[k]: v for k, v in self.opts.assume.items() if k in names}

    def _run_per_device(self, j: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Plain mode: both per-device programs on the same random per-device inputs, output `j` of all
        devices (collectives exchange data between the simulated devices). Both programs run once."""
        wide = WIDE.get()
        if wide not in self._runs:
            self._runs[wide] = None  # a run that fails fails for every output: tried once
            devices = max(self.bp.module.num_partitions, self.ap.module.num_partitions, 1)
            inputs = _stacked_random(self.bp, devices, rng)
            self._runs[wide] = (numeric.run(self.ap.func, inputs, devices, module=self.ap.module),
                                numeric.run(self.bp.func, inputs, devices, module=self.bp.module))
        run = self._runs[wide]
        if run is None:
            raise NotEvaluable("the programs could not be run")
        after, before = run
        return np.asarray(after[j]), np.asarray(before[j])

    def counterexample(self, j: int, after_term: Term, before_term: Term) -> Counterexample | None:
        """Both sides evaluated on random inputs: the evidence that an unproven equality is false. A float
        difference counts only if it survives computing both sides in float64 (`values.widened`): one that
        vanishes there is float32 rounding in another order, amplified, not a difference in meaning."""
        total = sum(t.type.size for root in (after_term, before_term) for t in root.walk())
        if total > self.opts.numeric_limit:
            return None
        sides = self._sides(j, after_term, before_term)
        if sides is None:
            return None
        a, b = sides
        exact = a.dtype.kind in "iub" and b.dtype.kind in "iub"  # 2**53 + 1 and 2**53 differ, even as floats not
        bad, diff = _differing(a, b, exact)
        if not np.isfinite(b.astype(np.float64)).any():
            return None  # random inputs drove the reference to inf/NaN everywhere: no evidence either way
        if not bad.any():
            self.notes.append(f"output {j}: not proven, but equal on random inputs (a rule may be missing)")
            return None
        if not exact:
            with widened():
                wide = self._sides(j, after_term, before_term)
            if wide is not None and wide[0].shape == a.shape and not _differing(*wide, exact)[0].any():
                self.notes.append(f"output {j}: not proven; on random inputs it differs in float32 but agrees "
                                  "computed in float64 (rounding in another order, not a difference in meaning)")
                return None
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(np.where(bad, diff, -1))), a.shape))
        # a NaN or inf where the reference is finite is an unbounded difference, not none
        worst = float(np.max(np.where(np.isfinite(diff), diff, np.inf)[bad]))
        if exact:
            gaps = np.abs(a.astype(object) - b.astype(object))[bad]
            return Counterexample(j, idx, int(b[idx]), int(a[idx]), float(max(gaps)))
        return Counterexample(j, idx, float(b[idx]), float(a[idx]), worst)

    def _sides(self, j: int, after_term: Term, before_term: Term) -> tuple[np.ndarray, np.ndarray] | None:
        """Output `j` of both sides on the random inputs of `opts.seed` (the same ones on every call);
        None when they cannot be evaluated or differ in shape."""
        rng = np.random.default_rng(self.opts.seed)
        try:
            if self.opts.plain:
                a, b = self._run_per_device(j, rng)
            else:
                leaves = {t.id: t for root in (after_term, before_term) for t in root.walk() if t.op == "param"}
                env = {i: _random(t.type, rng, self.terms.intervals.get(i)) for i, t in leaves.items()}
                if WIDE.get():
                    env = {i: x.astype(np.float64) if x.dtype.kind == "f" else x for i, x in env.items()}
                a = evaluate(after_term, env)
                b = evaluate(before_term, env)
        except (NotEvaluable, UnsupportedError, ValueError, TypeError, IndexError, KeyError, NotImplementedError):
            return None
        return (a, b) if a.shape == b.shape else None


def _differing(a: np.ndarray, b: np.ndarray, exact: bool) -> tuple[np.ndarray, np.ndarray]:
    """Where `a` and `b` differ (integers exactly; floats beyond 1e-3 absolute plus 1e-3 relative; NaN
    matches NaN), and |a - b| in float64."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        diff = np.abs(a64 - b64)
        same = a == b if exact else (a64 == b64) | (np.isnan(a64) & np.isnan(b64)) | (diff <= 1e-3 + 1e-3 * np.abs(b64))
    return ~same, diff


def computes_in_low_precision(p: Program) -> bool:
    """Whether any value of the program (its callees included) is a bf16, f16 or f8 float."""
    for func in p.module.funcs.values():
        for op in walk(func.body.ops):
            for r in op.results:
                if isinstance(r.type, TensorType) and r.type.dtype in LOW_FLOATS:
                    return True
    return False


_MAX_CALL_DEPTH = 64  # deeper call chains than any lowering makes are not run


def runnable(bp: Program, ap: Program, limit: int) -> bool:
    """Whether both programs are small enough to run whole: the elements made by all ops on all devices,
    a loop's body counted once per trip (a loop of unknown trip count once), stay within `limit`."""
    devices = max(ap.mesh.size, ap.module.num_partitions, 1)
    total = 0

    def count(p: Program, ops: tuple[Op, ...], copies: int, producers: dict[Value, Op], calls: int) -> bool:
        nonlocal total
        for op in ops:
            producers.update((r, op) for r in op.results)
            for r in op.results:
                if isinstance(r.type, TensorType):
                    total += r.type.size * copies
            times = None
            if op.opcode == "while" and len(op.regions) == 2:
                # The condition's compare and the body's step are read before the regions are counted.
                producers.update((r, o) for region in op.regions for o in region.ops for r in o.results)
                times = trip_count(op, producers)
            for region in op.regions:
                if not count(p, region.ops, copies * max(times or 1, 1), producers, calls):
                    return False
            # A loop inside a called function runs once per call: nested `fori_loop`s lower to calls.
            callee = op.attrs.get("callee") or op.attrs.get("decomposition")
            body = p.module.funcs.get(str(callee)) if callee is not None else None
            if body is not None and (calls >= _MAX_CALL_DEPTH or not count(p, body.body.ops, copies, {}, calls + 1)):
                return False
            if total > limit:
                return False
        return True

    return count(bp, bp.func.body.ops, 1, {}, 0) and count(ap, ap.func.body.ops, devices, {}, 0)


def partial_counterexample(j: int, rank: int) -> Counterexample:
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


def param_name(p: Program, i: int) -> str:
    locs = p.func.arg_locs
    if i < len(locs) and locs[i].op_name:
        return locs[i].op_name or ""
    return f"arg{i}"

