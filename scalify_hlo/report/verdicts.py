"""Verdicts as values, and their rendering as compiler-style text and as JSON.

`Equivalent` is only ever built by the prover when every output's `Holds` fact was derived;
`Discrepancy` carries evidence (contradicting layouts, or a numeric counterexample); everything else
is `Unknown` with the reason. Exit codes: 0 equivalent, 1 discrepancy, 2 unknown (3 is bad input,
raised before any verdict exists).

The JSON report is versioned (`SCHEMA`) and documented field by field in docs/json.md. Reports name values
as the user sees them: HLO instruction names, JAX op names and source lines; the parser's own numbering of
StableHLO values (`%89`) is never shown, as no file the user has contains it. An `unknown` report is
worded as not proven, never as a difference.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeAlias, assert_never

from scalify_hlo.ir.nodes import PARSER_NUMBERING, Frame, Op, SourceLoc

SCHEMA = 1  # the JSON report's version (docs/json.md): bumped when a field changes meaning or goes away
_SITES_SHOWN = 3  # findings with one reason at one line: the sites listed before "and N more"


def user_name(name: str | None) -> str | None:
    """`name` when the user can find it (an HLO instruction, a named MLIR location), else None: the
    StableHLO parser numbers values itself (`%89`, `%arg0`), and those numbers are in no file."""
    return None if not name or PARSER_NUMBERING.fullmatch(name) else name


@dataclass(frozen=True, slots=True)
class Site:
    """One op on one side, where a JAX engineer would look."""

    opcode: str
    instruction: str | None  # HLO instruction name or named MLIR location; None when it has no name of its own
    source: str | None  # user file:line (innermost frame)
    column: int | None = None
    ir: str | None = None  # the op's line in the input file (HLO dumps), file:line
    op_name: str | None = None  # JAX's op_name, e.g. jit(f)/dot_general
    layout: str | None = None
    # The op's stack frames, innermost first, when `source` is the innermost: `report.focus` may name a
    # caller instead (a helper the reference runs too).
    stack: tuple[Frame, ...] = field(default=(), compare=False)

    @staticmethod
    def of(op: Op, layout: str | None = None, frame: Frame | None = None) -> Site:
        """`op`'s site; `frame` picks one of its stack frames instead of the innermost."""
        loc: SourceLoc = op.loc
        frame = frame or loc.frame
        name = user_name(loc.name or (op.results[0].name if op.results else None))
        ir = f"{loc.ir_file}:{loc.ir_line}" if loc.ir_file and loc.ir_line else None
        source = str(frame) if frame is not None else None
        stack = loc.frames if frame is loc.frame else ()
        return Site(op.opcode, name, source, frame.column if frame else None, ir, loc.op_name, layout, stack)

    def label(self) -> str:
        """`name = opcode` (HLO), else the opcode with JAX's op_name, e.g. `reduce [jit(f)/reduce_sum]`."""
        if self.instruction:
            return f"{self.instruction} = {self.opcode}"
        return self.opcode + (f" [{self.op_name}]" if self.op_name else "")

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
    # How the term was proven the reference's: "identical" (derived as the very term the reference
    # computes, values brought back in step by saturation on the way included), "saturation" (equality
    # saturation at the output), "blockwise" (the normal form of block reductions, e.g. online softmax).
    how: str = "identical"


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

    @property
    def reason(self) -> str:
        """The verdict's reason as reported: an `unknown` one says "not proven", never "differs"."""
        return _not_proven(self.verdict.reason) if isinstance(self.verdict, Unknown) else self.verdict.reason

    def reported_findings(self) -> tuple[Finding, ...]:
        """The findings as reported: those of an `unknown` verdict are worded as not proven."""
        if isinstance(self.verdict, Unknown):
            return tuple(replace(f, reason=_not_differs(f.reason)) for f in self.verdict.findings)
        return self.findings

    def to_json(self) -> dict[str, Any]:
        """The JSON report, schema `SCHEMA`: every field is described in docs/json.md."""
        findings = [f.to_json() for f in self.reported_findings()]
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "verdict": self.name,
            "reason": self.reason,
            "before": self.before,
            "after": self.after,
            "discrepancies": findings if isinstance(self.verdict, Discrepancy) else [],
            "stats": self.stats,
            "notes": merged_notes(self.notes),
            "assumptions": {k: list(v) for k, v in self.assumptions.items()},
        }
        if isinstance(self.verdict, Unknown):
            out["hints"] = findings
        if isinstance(self.verdict, Equivalent):
            out["outputs"] = [{"index": o.index, "layout": o.layout, "how": o.how} for o in self.verdict.outputs]
        if self.numeric is not None:
            out["numeric"] = self.numeric
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, default=str)

    def render(self, *, source_root: Path | None = None) -> str:
        lines: list[str] = []
        for group in _same_line_and_reason(self.reported_findings(), self.after):
            lines.extend(_render_group(group, self, source_root))
        if isinstance(self.verdict, Equivalent):
            for o in self.verdict.outputs:
                lines.append(f"output {o.index}: holds the reference value, layout {o.layout}")
        for note in merged_notes(self.notes):
            lines.append(f"note: {note}")
        if self.assumptions:
            promised = ", ".join(f"{k} in [{lo}, {hi})" for k, (lo, hi) in self.assumptions.items())
            lines.append(f"assuming: {promised} (--assume); the verdict is for such inputs only")
        if self.numeric is not None:
            lines.append(f"numeric check: {self.numeric.get('summary', self.numeric)}")
        stats = ", ".join(f"{k} {v}" for k, v in self.stats.items() if k in ("seconds", "ops", "egraph_calls"))
        lines.append(f"verdict: {self.name} — {self.reason}" + (f" ({stats})" if stats else ""))
        return "\n".join(lines)


def _number(x: float) -> float | str:
    """A float for JSON, which has no NaN or infinities: those as the strings "nan", "inf", "-inf"."""
    return x if math.isfinite(x) else str(x)


_DIFFERS = re.compile(r"\b(output \d+) differs from the reference")
_PER_OUTPUT = re.compile(r"output (\d+): (.*)", re.DOTALL)


def _not_differs(reason: str) -> str:
    """A reason worded for values not known to differ, only not proven equal."""
    return _DIFFERS.sub(r"\1 is not proven equal to the reference", reason)


def _not_proven(reason: str) -> str:
    text = _not_differs(reason)
    return text if "not proven" in text.split(":", 1)[0] else f"not proven: {text}"


def merged_notes(notes: tuple[str, ...] | list[str]) -> list[str]:
    """Each note once, in order; per-output notes with the same text as one ("outputs 0-3, 7: ...")."""
    per_output: dict[str, list[int]] = {}
    order: list[str] = []  # a note's text, or its per-output tail
    for note in notes:
        m = _PER_OUTPUT.fullmatch(note)
        key = m.group(2) if m else note
        if key not in per_output:
            per_output[key] = []
            order.append(key)
        if m:
            per_output[key].append(int(m.group(1)))
    out = []
    for key in order:
        outputs = sorted(set(per_output[key]))
        if not outputs:
            out.append(key)
        else:
            out.append(f"output{'s' if len(outputs) > 1 else ''} {_ranges(outputs)}: {key}")
    return out


def _ranges(ns: list[int]) -> str:
    """Sorted distinct integers as "0-3, 7"."""
    runs: list[list[int]] = []
    for n in ns:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _where(f: Finding, fallback: str) -> str:
    site = f.after or f.before
    return (site.source or site.ir or fallback) if site else fallback


def _same_line_and_reason(findings: tuple[Finding, ...], fallback: str) -> list[list[Finding]]:
    """Findings grouped by (line, reason), in order of first appearance: one diagnostic each, however many
    values share it (a missing psum shows in every gradient it feeds)."""
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((_where(f, fallback), f.reason), []).append(f)
    return list(groups.values())


def _render_group(group: list[Finding], report: Report, root: Path | None) -> list[str]:
    kind = "error" if isinstance(report.verdict, Discrepancy) else "note"
    first = group[0]
    site = first.after or first.before
    lines = [f"{_where(first, report.after)}: {kind}: {first.reason}"]
    if site and site.source:
        lines.extend(_source_excerpt(site.source, site.column, [root, Path(report.after).parent,
                                                               Path(report.before).parent]))
    shown: list[list[str]] = []
    for f in group:
        details = _details(f)
        if details not in shown:
            shown.append(details)
    for k, details in enumerate(shown[:_SITES_SHOWN]):
        if len(shown) > 1:  # several values share the diagnostic: tell their details apart
            lines.append(f"  [{k + 1}/{len(shown)}]")
        lines.extend(details)
    if len(shown) > _SITES_SHOWN:
        lines.append(f"  ... and {len(shown) - _SITES_SHOWN} more values with this reason at this line "
                     "(the JSON report lists them all)")
    return lines


def _details(f: Finding) -> list[str]:
    lines = []
    if f.after:
        lines.append(f"  after:  {f.after.label()}" + (f" ({f.after.ir})" if f.after.ir else "")
                     + (f" [{f.after.op_name}]" if f.after.op_name and f.after.instruction else ""))
    for s in f.also:
        at = s.source or s.ir
        lines.append(f"  also:   {s.label()}" + (f" at {at}" if at else ""))
    if f.before:
        lines.append(f"  before: {f.before.label()} at {f.before.source or '?'}")
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
