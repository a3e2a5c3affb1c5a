"""Shared by both parts of the differential fuzzer (tools/fuzz.py): the verifier under time limits, the
comparison of actual outputs (the truth), and the outcome of a verdict against that truth.

`run_verify` runs `scalify_hlo.verify` in this process and classifies what comes back (equivalent,
discrepancy, unknown, timeout, scalify_error, crash) without ever raising; `compare` calls two sets of
outputs SAME, DIFFERENT or AMBIGUOUS; `outcome_of` turns truth and verdict into ok, false_equivalent,
false_discrepancy, timeout or exception. Import it through tools/fuzz.py, which sets XLA_FLAGS (8 fake CPU
devices) before jax starts.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

import scalify_hlo
from scalify_hlo.ir.errors import ScalifyError

SLOW_SECONDS = 30.0  # a verification slower than this is a `timeout` (the soundness issue's limit)

OUTCOMES = ("ok", "false_equivalent", "false_discrepancy", "timeout", "exception")


class WallTimeout(Exception):
    """Raised in the main thread by SIGALRM when a verification runs past the hard wall limit."""


@contextlib.contextmanager
def wall_limit(seconds: float) -> Iterator[None]:
    """Interrupt the block after `seconds` (main thread only: elsewhere it just runs). egglog's Rust loop
    is not interruptible, so this stops a runaway only when control comes back to Python."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def fire(signum: int, frame: Any) -> None:
        raise WallTimeout(f"over {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Verdict:
    name: str  # equivalent | discrepancy | unknown | timeout | scalify_error | crash
    reason: str
    seconds: float
    error: str | None = None
    named: str | None = None  # a discrepancy's first named source site ("file.py:12"), if any


def run_verify(before: str, after: str, budget: float, hard_limit: float) -> Verdict:
    """scalify_hlo.verify in this process, classified; never raises (a Rust panic is a BaseException)."""
    t0 = time.perf_counter()
    try:
        with wall_limit(hard_limit):
            report = scalify_hlo.verify(before, after, timeout=budget)
        dt = time.perf_counter() - t0
        name = "timeout" if dt > SLOW_SECONDS else report.name
        first = report.findings[0].after if report.name == "discrepancy" and report.findings else None
        return Verdict(name, report.verdict.reason, dt, named=first.source if first is not None else None)
    except WallTimeout as err:
        return Verdict("timeout", str(err), time.perf_counter() - t0)
    except ScalifyError as err:
        return Verdict("scalify_error", f"{type(err).__name__}: {err.message}", time.perf_counter() - t0,
                       traceback.format_exc(limit=-8))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:
        return Verdict("crash", f"{type(err).__name__}: {err}"[:500], time.perf_counter() - t0,
                       traceback.format_exc(limit=-8))


def outcome_of(truth: str, verdict: str) -> str:
    if verdict in ("scalify_error", "crash"):
        return "exception"
    if verdict == "timeout":
        return "timeout"
    if verdict == "equivalent" and truth == "DIFFERENT":
        return "false_equivalent"
    if verdict == "discrepancy" and truth == "SAME":
        return "false_discrepancy"
    return "ok"


def compare(refs: Sequence[np.ndarray], outs: Sequence[np.ndarray], rtol: float, loose: float) -> tuple[str, float]:
    """SAME (ints exact, floats allclose at `rtol`, atol scaled to the output's magnitude), DIFFERENT (not
    even allclose at `loose`), or AMBIGUOUS in between; and the largest absolute difference."""
    if len(refs) != len(outs) or any(r.shape != o.shape or r.dtype != o.dtype for r, o in zip(refs, outs, strict=True)):
        return "INVALID", math.nan
    worst, verdict = 0.0, "SAME"
    for r, o in zip(refs, outs, strict=True):
        if r.size == 0:
            continue
        diff = np.abs(r.astype(np.float64) - o.astype(np.float64))
        worst = max(worst, float(np.nanmax(diff)) if np.isfinite(diff).any() else math.inf)
        if r.dtype.kind in "iub":
            if not np.array_equal(r, o):
                verdict = "DIFFERENT"
            continue
        finite = np.abs(r[np.isfinite(r)])
        scale = max(1.0, float(finite.max()) if finite.size else 1.0)
        if np.allclose(o, r, rtol=rtol, atol=rtol * scale, equal_nan=True):
            continue
        if not np.allclose(o, r, rtol=loose, atol=loose * scale, equal_nan=True):
            verdict = "DIFFERENT"
        elif verdict == "SAME":
            verdict = "AMBIGUOUS"
    return verdict, worst
