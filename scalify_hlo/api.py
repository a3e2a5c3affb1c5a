"""The Python API: `verify(before, after, **options) -> Report` on paths, text or lowered objects.

Accepted for either side: a path, StableHLO/HLO text or MLIR bytecode, a jax `Lowered` (its StableHLO with
locations), a jax `Compiled` (its optimized HLO), an `ir.Module` from jaxlib's MLIR bindings, or an
already parsed `scalify_hlo.ir.nodes.Module`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import scalify_hlo.parsers as parsers
from scalify_hlo.ir.errors import UnsupportedError, UsageError
from scalify_hlo.ir.nodes import Module
from scalify_hlo.numeric.oracle import with_numeric
from scalify_hlo.prove.egraph import Budget
from scalify_hlo.prove.engine import Options, prove
from scalify_hlo.report.verdicts import Report, Unknown

Source = str | bytes | Path | Module | Any


def as_module(source: Source, name: str) -> Module:
    """Any accepted input as a parsed module (`name` labels it in diagnostics when it has no path)."""
    if isinstance(source, Module):
        return source
    if isinstance(source, Path):
        return parsers.load(source)
    if isinstance(source, bytes):
        return parsers.loads(source, name)
    if isinstance(source, str):
        head = source.lstrip()[:200]
        if "\n" in source or head.startswith(("module", "HloModule", "func.func", "#loc", "//")):
            return parsers.loads(source, name)
        return parsers.load(source)
    as_text = getattr(source, "as_text", None)
    if callable(as_text):  # jax Lowered (StableHLO with locations) or Compiled (optimized HLO)
        try:
            text = as_text(debug_info=True)
        except TypeError:
            text = as_text()
        return parsers.loads(text, name)
    get_asm = getattr(source, "operation", None)
    if get_asm is not None and hasattr(get_asm, "get_asm"):  # an ir.Module
        return parsers.loads(get_asm.get_asm(enable_debug_info=True), name)
    raise TypeError(f"cannot verify a {type(source).__name__}; expected a path, IR text or bytes, a jax Lowered "
                    "or Compiled object, an MLIR module or a scalify_hlo.ir.nodes.Module")


def verify(before: Source, after: Source, *, numeric: bool = False, seed: int = 0, iterations: int = 12,
           nodes: int = 50_000, timeout: float = 5.0, assume: Mapping[str, tuple[int, int]] | None = None,
           progress: Callable[[str, int, int], None] | None = None, time_limit: float | None = 600.0,
           excess_precision: bool = False) -> Report:
    """Prove `after` (the distributed program) equivalent to `before` (its single-device reference).

    `assume={"ids": (0, vocab)}` states that an integer input lies in a half-open range (what `table[ids]`
    promises); the verdict then holds for such inputs only. Returns a `Report`; `report.name` is
    "equivalent", "discrepancy" or "unknown", `report.render()` the compiler-style diagnostic,
    `report.to_json()` the JSON report. Bad input raises `ScalifyError`; a legal program the tool does
    not model (`UnsupportedError`) is an `unknown` report, as on the command line. A path of "-" reads
    standard input, for one of the two programs at most. `timeout` bounds each e-graph question,
    `time_limit` the whole proof (seconds; None: unbounded): past it the values not yet read are left
    unread and the verdict is `unknown`, naming the first. `excess_precision`: a rounding to a low-precision
    float that one program skips is not a difference (`Options.excess_precision`)."""
    if _is_stdin(before) and _is_stdin(after):
        raise UsageError(None, "both before and after are '-'; standard input can be one of them, expected "
                         "a file or text for the other")
    bm, am = as_module(before, "<before>"), as_module(after, "<after>")
    opts = Options(budget=Budget(iterations=iterations, nodes=nodes, seconds=timeout), seed=seed,
                   assume=dict(assume or {}), progress=progress, time_limit=time_limit,
                   excess_precision=excess_precision)
    try:
        report = prove(bm, am, opts)
    except UnsupportedError as err:
        report = unmodelled_report(bm.path, am.path, err)
    if numeric:
        report = with_numeric(report, bm, am, seed)
    return report


def _is_stdin(source: Source) -> bool:
    return isinstance(source, str | Path) and str(source) == parsers.STDIN


def unmodelled_report(before: str, after: str, err: UnsupportedError) -> Report:
    """The report on a legal program the tool does not model (device lists no mesh expresses, ...):
    `unknown` with the reason, where bad input would be an exception (exit 3)."""
    where = f"{err.span}: " if err.span is not None else ""
    return Report(Unknown(f"{where}{err.message}"), before, after)


def assert_equivalent(report: Report) -> None:
    """A pytest-friendly assertion: passes on `equivalent`, else fails with the full diagnostic."""
    if report.name != "equivalent":
        raise AssertionError(f"scalify-hlo: {report.name}\n{report.render()}")
