"""`--numeric`: run both programs on random inputs (every device simulated) beside the proof.

Testing is never proof: a numeric agreement leaves an `unknown` unknown. A numeric disagreement is
evidence, so it turns an `unknown` into a `discrepancy` with the counterexample; and if it contradicts
an `equivalent` (the proof and the numbers disagree beyond float32 noise), the verdict becomes `unknown`
and says so loudly, because one of them is wrong.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

import scalify_hlo.parsers as parsers
from scalify_hlo.ir.errors import ScalifyError
from scalify_hlo.ir.nodes import Module
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric import trials
from scalify_hlo.numeric.values import widened
from scalify_hlo.report.verdicts import Counterexample, Discrepancy, Equivalent, Finding, Report, Unknown

RTOL, ATOL = 2e-2, 2e-3  # float32 sums in another order drift ~1e-3 on unit-variance inputs


def numeric_check(before: Module, after: Module, seed: int,
                  bounds: dict[int, tuple[int, int]] | None = None) -> dict[str, Any]:
    """Both programs on the same random inputs (integer input i in `bounds[i]`, a half-open promised
    range, when given)."""
    inputs = trials.random_inputs(before, seed, bounds)
    try:
        ref, out = numeric.run_pair(before, after, inputs)
    except (ScalifyError, ValueError, TypeError, IndexError) as err:
        message = err.message if isinstance(err, ScalifyError) else str(err)
        return {"ran": False, "summary": f"could not run: {message}"}
    cmp = trials.compare(ref, out, rtol=RTOL, atol=ATOL)
    if not cmp.ok and _rounding_only(before, after, inputs):
        return {"ran": True, "ok": True, "seed": seed, "rtol": RTOL, "atol": ATOL,
                "max_abs_error": [float(x) for x in cmp.max_abs], "max_rel_error": [float(x) for x in cmp.max_rel],
                "summary": f"outputs agree on random inputs computed in float64; in float32 they differ by "
                           f"rounding ({cmp.reason})"}
    result: dict[str, Any] = {
        "ran": True, "ok": cmp.ok, "seed": seed, "rtol": RTOL, "atol": ATOL,
        "max_abs_error": [float(x) for x in cmp.max_abs], "max_rel_error": [float(x) for x in cmp.max_rel],
        "summary": ("outputs agree on random inputs" if cmp.ok else f"outputs differ: {cmp.reason}"),
    }
    c = cmp.counterexample
    if c is not None and c.before is not None:
        b = float(np.asarray(c.before))
        a = float(np.asarray(c.after))
        result["counterexample"] = Counterexample(c.output, tuple(int(i) for i in c.index), b, a,
                                                  float(cmp.max_abs[c.output]))
    return result


def _rounding_only(before: Module, after: Module, inputs: list[np.ndarray]) -> bool:
    """Whether outputs that differ in float32 agree when both programs compute in float64
    (`values.widened`): then the difference is rounding in another order, amplified, not meaning."""
    try:
        with widened():
            ref, out = numeric.run_pair(before, after, inputs)
    except (ScalifyError, ValueError, TypeError, IndexError):
        return False
    return trials.compare(ref, out, rtol=RTOL, atol=ATOL).ok


def with_numeric(report: Report, before: str | Path | Module, after: str | Path | Module, seed: int) -> Report:
    bm = before if isinstance(before, Module) else parsers.load(before)
    am = after if isinstance(after, Module) else parsers.load(after)
    result = numeric_check(bm, am, seed)
    cex = result.pop("counterexample", None)
    if cex is not None:
        result["counterexample"] = {"output": cex.output, "index": list(cex.index), "before": cex.before,
                                    "after": cex.after}
    verdict = report.verdict
    if result.get("ran") and not result["ok"]:
        if isinstance(verdict, Unknown):
            findings = tuple(dataclasses.replace(f, counterexample=cex) for f in verdict.findings[:1]) + \
                verdict.findings[1:] or (Finding(f"numeric check: {result['summary']}", counterexample=cex),)
            verdict = Discrepancy(findings)
        elif isinstance(verdict, Equivalent):
            verdict = Unknown("the proof says equivalent but the numeric check disagrees beyond float32 noise "
                              f"({result['summary']}); please report this")
        elif isinstance(verdict, Discrepancy) and cex is not None and verdict.findings:
            first = verdict.findings[0]
            if first.counterexample is None:
                verdict = Discrepancy((dataclasses.replace(first, counterexample=cex), *verdict.findings[1:]))
    return dataclasses.replace(report, verdict=verdict, numeric=result)
