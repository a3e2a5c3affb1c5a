"""`scalify-hlo passes DUMP_DIR`: verify every pass of an XLA pipeline dump, in order.

An XLA dump made with `--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*` holds, per module, the module
before optimizations and after every pass that changed it:
`module_0000.jit_f.0007.spmd-cleanup.after_cse.before_pipeline-end.txt`. Consecutive files bracket the
passes that ran between them. Each pair is checked with the same prover: the SPMD partitioner's pair
(a global program to a per-device one) with the full distributed check, every other pair as plain
equivalence at the same device count (collectives are then opaque ops both sides must perform alike).
A pass that changed only layouts, schedules or metadata leaves the term DAG as it was: its proof costs
a parse and a walk, no e-graph.
"""

from __future__ import annotations

import dataclasses
import itertools
import multiprocessing
import re
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scalify_hlo.parsers as parsers
from scalify_hlo.ir.errors import ScalifyError, UsageError
from scalify_hlo.ir.inline import inline
from scalify_hlo.ir.nodes import Module
from scalify_hlo.layout.program import form_of
from scalify_hlo.prove.engine import Options, prove
from scalify_hlo.report.verdicts import Report

_INDEXED = re.compile(r"^module_(\d+)\.(.+)\.(\d{4})\.(.+?)\.after_(.+?)(?:\.before_(.+?))?\.txt$")
_FIRST = re.compile(r"^module_(\d+)\.(.+)\.before_optimizations\.txt$")


@dataclass(frozen=True, slots=True)
class Stage:
    module: str
    index: int  # -1: before optimizations
    pipeline: str
    after_pass: str
    path: Path
    before_pass: str | None = None  # the pass about to run when this was dumped


def label(a: Stage, b: Stage) -> str:
    """What ran between two consecutive dumps: from the pass `a` was about to run to the one `b` ran after.
    A pass that runs a nested pipeline (the SPMD partitioner runs spmd-cleanup) is named for itself when
    the change shows at the start of its nested pipeline."""
    last = f"{b.pipeline}/{b.after_pass}" if b.pipeline else b.after_pass
    first = a.before_pass
    if first is None or first == "pipeline-end" or (first == b.after_pass and a.pipeline == b.pipeline):
        return last
    if b.after_pass == "pipeline-start" and b.pipeline != a.pipeline:
        return f"{a.pipeline}/{first} (to the start of its nested {b.pipeline})"
    return f"{a.pipeline}/{first} … {b.after_pass if b.pipeline == a.pipeline else last}"


@dataclass(frozen=True, slots=True)
class PassResult:
    module: str
    passes: str  # what ran between the two dumps
    before: Path
    after: Path
    mode: str  # "distributed" | "plain"
    report: Report | None
    seconds: float
    error: str | None = None

    @property
    def verdict(self) -> str:
        return self.report.name if self.report is not None else "unknown"

    @property
    def reason(self) -> str:
        if self.error is not None:
            return self.error
        return self.report.verdict.reason if self.report is not None else ""


def stages(dump: Path) -> dict[str, list[Stage]]:
    """Per module (id.name), its dumps in pipeline order."""
    out: dict[str, list[Stage]] = {}
    for p in sorted(dump.iterdir()):
        if m := _INDEXED.match(p.name):
            key = f"{m.group(1)}.{m.group(2)}"
            out.setdefault(key, []).append(Stage(key, int(m.group(3)), m.group(4), m.group(5), p, m.group(6)))
        elif m := _FIRST.match(p.name):
            key = f"{m.group(1)}.{m.group(2)}"
            out.setdefault(key, []).append(Stage(key, -1, "", "before-optimizations", p))
    for key in out:
        out[key].sort(key=lambda s: s.index)
    return out


def check_dump(dump: Path, *, stop_at_first: bool = False, options: Options | None = None,
               jobs: int = 1, ray: str | None = None) -> list[PassResult]:
    """Every consecutive pass pair of every module, in pipeline order. With `jobs` > 1 the pairs are
    checked in that many worker processes, with `ray` (a cluster address, "auto" for the running one,
    "local" to start one here) as tasks of a Ray cluster; the results (and, with `stop_at_first`, the
    first pass that breaks meaning) are the same as with one. Without `options`, roundings to bf16 a pass
    drops are no difference (`Options.excess_precision`), as on the command line."""
    pairs = [(key, label(a, b), a.path, b.path) for key, seq in stages(dump).items()
             for a, b in itertools.pairwise(seq)]
    opts = options or Options(excess_precision=True)  # XLA's passes run with xla_allow_excess_precision
    if ray is not None:
        return _on_ray(ray, pairs, opts, stop_at_first)
    results: list[PassResult] = []
    if jobs <= 1 or len(pairs) <= 1:
        cache: dict[Path, Module] = {}
        for pair in pairs:
            results.append(_check_pair(*pair, opts, cache))
            if stop_at_first and results[-1].verdict == "discrepancy":
                break
        return results
    # spawn, not fork: the parent holds MLIR contexts and egglog state a forked child must not share
    with ProcessPoolExecutor(min(jobs, len(pairs)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_check_pair, *pair, opts) for pair in pairs]
        for future in futures:  # in pipeline order, so the first discrepancy is the first pass that breaks
            results.append(future.result())
            if stop_at_first and results[-1].verdict == "discrepancy":
                for rest in futures:
                    rest.cancel()
                break
    return results


def _on_ray(address: str, pairs: list[tuple[str, str, Path, Path]], options: Options,
            stop_at_first: bool) -> list[PassResult]:
    """The pairs as tasks of a Ray cluster. Each dump file goes to the object store once, as bytes (the
    cluster's nodes need not see this file system); a task parses its two. The nodes need scalify-hlo."""
    try:
        import ray
    except ImportError:
        raise UsageError(None, "--ray needs Ray, which is not installed; expected "
                         "pip install 'scalify-hlo[ray]'") from None
    started_here = not ray.is_initialized()
    if started_here:
        try:  # "local": a Ray instance of this machine's cores for this run; else the cluster at `address`
            ray.init(address=None if address == "local" else address, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, ValueError, RuntimeError) as err:
            raise UsageError(None, f"--ray {address}: cannot reach a Ray cluster ({err}); expected 'local', "
                             "'auto' (the cluster `ray start` runs) or a cluster address") from None
    try:
        task: Any = ray.remote(num_cpus=1)(_check_pair)  # (typed stubs: no overload has 8 arguments)
        files = {p: ray.put(parsers.read_input(p)) for _, _, a, b in pairs for p in (a, b)}
        futures = [task.remote(key, name, a, b, options, None, files[a], files[b]) for key, name, a, b in pairs]
        results: list[PassResult] = []
        for future in futures:  # in pipeline order, as with worker processes
            results.append(ray.get(future))
            if stop_at_first and results[-1].verdict == "discrepancy":
                for rest in futures[len(results):]:
                    ray.cancel(rest)
                break
        return results
    finally:
        if started_here:
            ray.shutdown()


def _check_pair(key: str, name: str, a: Path, b: Path, options: Options,
                cache: dict[Path, Module] | None = None, a_data: bytes | None = None,
                b_data: bytes | None = None) -> PassResult:
    """One pass pair: the distributed check where it turns a global program into a per-device one. The
    files are read here unless their bytes come with the pair (a Ray task)."""
    cache = {} if cache is None else cache
    started = time.perf_counter()
    try:
        for p, data in ((a, a_data), (b, b_data)):
            if p not in cache:
                cache[p] = parsers.load(p) if data is None else parsers.loads(data, str(p))
        ma, mb = cache[a], cache[b]
        fa, fb = form_of(ma, inline(ma)), form_of(mb, inline(mb))
        plain = not (fa == "global" and fb == "spmd")
        report = prove(ma, mb, dataclasses.replace(options, plain=plain))
        return PassResult(key, name, a, b, "plain" if plain else "distributed", report, time.perf_counter() - started)
    except ScalifyError as err:
        return PassResult(key, name, a, b, "?", None, time.perf_counter() - started, err.message)


def render(results: list[PassResult]) -> str:
    lines = [f"{'module':<22} {'pass':<58} {'mode':<11} {'verdict':<12} {'seconds':>7}"]
    for r in results:
        lines.append(f"{r.module[:22]:<22} {r.passes[:58]:<58} {r.mode:<11} {r.verdict:<12} {r.seconds:>7.2f}")
    broken = next((r for r in results if r.verdict == "discrepancy"), None)
    counts = {v: sum(1 for r in results if r.verdict == v) for v in ("equivalent", "discrepancy", "unknown")}
    lines.append(f"{len(results)} pass pairs: {counts['equivalent']} equivalent, {counts['discrepancy']} discrepancy, "
                 f"{counts['unknown']} unknown")
    if broken is not None and broken.report is not None:
        lines.append(f"first pass that breaks meaning: {broken.passes} ({broken.after.name})")
        lines.append(broken.report.render())
    for r in results:
        if r.verdict == "unknown":
            lines.append(f"unknown: {r.passes}: {r.reason[:200]}")
    return "\n".join(lines)
