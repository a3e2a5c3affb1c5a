"""Verdicts as values, and their rendering as compiler-style text and as JSON.

`Equivalent` is only ever built by the prover when every output's `Holds` fact was derived;
`Discrepancy` carries evidence (contradicting layouts, or a numeric counterexample); everything else
is `Unknown` with the reason. Exit codes: 0 equivalent, 1 discrepancy, 2 unknown (3 is bad input,
raised before any verdict exists).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias, assert_never

from scalify_hlo.ir.nodes import Frame, Op, SourceLoc


@dataclass(frozen=True, slots=True)
class Site:
    """One op on one side, where a JAX engineer would look."""

    opcode: str
    instruction: str  # HLO instruction name or MLIR value name
    source: str | None  # user file:line (innermost frame)
    column: int | None = None
    ir: str | None = None  # the op's line in the input file (HLO dumps), file:line
    op_name: str | None = None  # JAX's op_name, e.g. jit(f)/dot_general
    layout: str | None = None

    @staticmethod
    def of(op: Op, layout: str | None = None, frame: Frame | None = None) -> Site:
        """`op`'s site; `frame` picks one of its stack frames instead of the innermost."""
        loc: SourceLoc = op.loc
        frame = frame or loc.frame
        name = loc.name or (op.results[0].name if op.results else op.opcode)
        ir = f"{loc.ir_file}:{loc.ir_line}" if loc.ir_file and loc.ir_line else None
        source = str(frame) if frame is not None else None
        return Site(op.opcode, name, source, frame.column if frame else None, ir, loc.op_name, layout)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in {
            "op": self.opcode, "instruction": self.instruction, "source": self.source, "ir": self.ir,
            "op_name": self.op_name, "layout": self.layout}.items() if v is not None}


@dataclass(frozen=True, slots=True)
class Counterexample:
    output: int
    index: tuple[int, ...]
    before: float | int  # integers exactly: 2**53 + 1 is not a float
    after: float | int
    max_abs_error: float
    how: str | None = None  # how the inputs were made when not drawn at random for a whole run

    def describe(self) -> str:
        def show(v: float | int) -> str:
            return str(v) if isinstance(v, int) else f"{v:.6g}"

        return (f"output {self.output}{list(self.index)}: before {show(self.before)}, after {show(self.after)} "
                f"(max |difference| {self.max_abs_error:.3g})" + (f"; {self.how}" if self.how else ""))


@dataclass(frozen=True, slots=True)
class Finding:
    reason: str
    before: Site | None = None
    after: Site | None = None
    also: tuple[Site, ...] = ()  # further after-side ops involved (e.g. where the bad value is consumed)
    expected: str | None = None
    found: str | None = None
    counterexample: Counterexample | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": self.reason}
        if self.before:
            out["before"] = self.before.to_json()
        if self.after:
            out["after"] = self.after.to_json()
        if self.also:
            out["also"] = [s.to_json() for s in self.also]
        if self.expected:
            out["expected"] = self.expected
        if self.found:
            out["found"] = self.found
        if self.counterexample:
            c = self.counterexample
            out["counterexample"] = {"output": c.output, "index": list(c.index), "before": _number(c.before),
                                     "after": _number(c.after), "max_abs_error": _number(c.max_abs_error)}
            if c.how:
                out["counterexample"]["how"] = c.how
        return out


@dataclass(frozen=True, slots=True)
class OutputProof:
    index: int
    layout: str


@dataclass(frozen=True, slots=True)
class Equivalent:
    outputs: tuple[OutputProof, ...]
    reason: str = "every output holds the reference value under its layout"


@dataclass(frozen=True, slots=True)
class Discrepancy:
    findings: tuple[Finding, ...]

    @property
    def reason(self) -> str:
        return self.findings[0].reason if self.findings else "the programs differ"


@dataclass(frozen=True, slots=True)
class Unknown:
    reason: str
    findings: tuple[Finding, ...] = ()


Verdict: TypeAlias = Equivalent | Discrepancy | Unknown


@dataclass(frozen=True, slots=True)
class Report:
    verdict: Verdict
    before: str
    after: str
    stats: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    numeric: dict[str, Any] | None = None
    assumptions: dict[str, tuple[int, int]] = field(default_factory=dict)  # input -> promised [lo, hi)

    @property
    def name(self) -> str:
        match self.verdict:
            case Equivalent():
                return "equivalent"
            case Discrepancy():
                return "discrepancy"
            case Unknown():
                return "unknown"
            case _:
                assert_never(self.verdict)

    @property
    def exit_code(self) -> int:
        return {"equivalent": 0, "discrepancy": 1, "unknown": 2}[self.name]

    @property
    def findings(self) -> tuple[Finding, ...]:
        return () if isinstance(self.verdict, Equivalent) else self.verdict.findings

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "verdict": self.name,
            "reason": self.verdict.reason,
            "before": self.before,
            "after": self.after,
            "discrepancies": [f.to_json() for f in self.findings] if isinstance(self.verdict, Discrepancy) else [],
            "stats": self.stats,
            "notes": list(self.notes),
            "assumptions": {k: list(v) for k, v in self.assumptions.items()},
        }
        if isinstance(self.verdict, Unknown):
            out["hints"] = [f.to_json() for f in self.verdict.findings]
        if isinstance(self.verdict, Equivalent):
            out["outputs"] = [{"index": o.index, "layout": o.layout} for o in self.verdict.outputs]
        if self.numeric is not None:
            out["numeric"] = self.numeric
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, default=str)

    def render(self, *, source_root: Path | None = None) -> str:
        lines: list[str] = []
        for f in self.findings:
            lines.extend(_render_finding(f, self, source_root))
        if isinstance(self.verdict, Equivalent):
            for o in self.verdict.outputs:
                lines.append(f"output {o.index}: holds the reference value, layout {o.layout}")
        for note in self.notes:
            lines.append(f"note: {note}")
        if self.assumptions:
            promised = ", ".join(f"{k} in [{lo}, {hi})" for k, (lo, hi) in self.assumptions.items())
            lines.append(f"assuming: {promised} (--assume); the verdict is for such inputs only")
        if self.numeric is not None:
            lines.append(f"numeric check: {self.numeric.get('summary', self.numeric)}")
        stats = ", ".join(f"{k} {v}" for k, v in self.stats.items() if k in ("seconds", "ops", "egraph_calls"))
        lines.append(f"verdict: {self.name} — {self.verdict.reason}" + (f" ({stats})" if stats else ""))
        return "\n".join(lines)


def _number(x: float) -> float | str:
    """A float for JSON, which has no NaN or infinities: those as the strings "nan", "inf", "-inf"."""
    return x if math.isfinite(x) else str(x)


def _render_finding(f: Finding, report: Report, root: Path | None) -> list[str]:
    kind = "error" if isinstance(report.verdict, Discrepancy) else "note"
    site = f.after or f.before
    where = (site.source or site.ir or report.after) if site else report.after
    lines = [f"{where}: {kind}: {f.reason}"]
    if site and site.source:
        lines.extend(_source_excerpt(site.source, site.column, [root, Path(report.after).parent,
                                                               Path(report.before).parent]))
    if f.after:
        lines.append(f"  after:  {f.after.instruction} = {f.after.opcode}"
                     + (f" ({f.after.ir})" if f.after.ir else "") + (f" [{f.after.op_name}]" if f.after.op_name else ""))
    for s in f.also:
        at = s.source or s.ir
        lines.append(f"  also:   {s.instruction} = {s.opcode}" + (f" at {at}" if at else ""))
    if f.before:
        lines.append(f"  before: {f.before.instruction} = {f.before.opcode} at {f.before.source or '?'}")
    if f.expected or f.found:
        lines.append(f"  expected: {f.expected or '?'}; found: {f.found or '?'}")
    if f.counterexample:
        lines.append(f"  counterexample: {f.counterexample.describe()}")
    return lines


def _source_excerpt(source: str, column: int | None, roots: list[Path | None]) -> list[str]:
    """The source line with a caret, when the file can be found (cwd, the inputs' dirs and parents)."""
    path_text, _, line_text = source.rpartition(":")
    if not line_text.isdigit():
        return []
    candidates = [Path(path_text)]
    for r in roots:
        if r is None:
            continue
        for parent in (r, *r.resolve().parents):
            candidates.append(parent / path_text)
    for p in candidates:
        try:
            if p.is_file():
                text = p.read_text(encoding="utf-8", errors="replace").splitlines()
                n = int(line_text)
                if 0 < n <= len(text):
                    src = text[n - 1].rstrip()
                    caret = " " * max((column or 1) - 1, len(src) - len(src.lstrip())) + "^"
                    return [f"  {src}", f"  {caret}"]
                return []
        except OSError:
            continue
    return []
