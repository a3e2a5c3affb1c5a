#!/usr/bin/env python
"""Scale benchmark of the verifier on Llama-3.1 stacks partitioned by XLA (FSDP x TP on fake CPU devices).

    python tools/bench.py                  # the default matrix; prints a Markdown table, writes BENCH.md
    python tools/bench.py --quick          # 8B and the 405B 1-layer only
    python tools/bench.py --only 405b-64   # one case (repeatable)
    python tools/bench.py --only 405b-train-64 --md /tmp/train.md   # report elsewhere (results: /tmp/train.json)
    python tools/bench.py --only passes-8l-train --md /tmp/passes.md  # `passes` over a whole XLA dump only
    python tools/bench.py --check          # run what the targets need, print each target and whether it is met
    python tools/bench.py --check --from-results   # run nothing: judge (and re-render BENCH.md from) results.json
    options: --timeout SECONDS (per verify, default 600), --passes-timeout SECONDS (per `passes` run, default
             3600), --no-generate (cached pairs and dumps only), --repeat N
             (fresh runs per case, fastest kept), --md PATH (write the report there instead of BENCH.md, and
             the results next to it as PATH.json), --list

Cases are forward passes (``405b-64``, ...) and training steps (``*-train-*``: loss, ``jax.grad``, optax AdamW
with the moments sharded like the params, bf16 params; ``tools/programs/llama_train.py``, ``tools/bench_train.py``).
A ``passes-*`` case times ``scalify_hlo.passes.check_dump`` (``scalify-hlo passes``: every consecutive pass pair
of XLA's whole pipeline dump) over an unrolled train step at the fixtures' widths
(``bench_programs.generate_pass_dump``, cached under ``out/bench/<key>/dump/``, generation not timed), once per
``--jobs`` setting, each in a fresh process: pairs, verdict counts, seconds, speedup of 2 jobs over 1.

For every case: the pair's generation cost (``tools/bench_programs.py``, cached under ``out/bench/<key>/``,
reported separately), the parse floor measured in this run on the same files (XLA's HLO text parser, XLA's
HLO→StableHLO converter, and MLIR parsing of before.mlir and of the converted after module), then
``scalify_hlo.prove.engine.prove()`` in a fresh subprocess (its own peak RSS), with its verdict, wall time, stage
timings, and the ratio wall / parse floor. Imports (jax, MLIR dialects) are paid before either clock starts.
Writes ``BENCH.md`` at the repo root and ``out/bench/results.json`` (``tools/bench_report.py``); both describe
the cases of this run only (``--only``/``--quick`` replace a full table: use ``--md`` for a partial run).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_programs as bp
import bench_train
from bench_report import (
    BENCH_MD,
    BUG_LAYER,
    RESULTS,
    _fmt,
    floor_table,
    generation_table,
    passes_table,
    passes_targets,
    results_table,
    targets,
    targets_text,
    verify_results,
    write_reports,
)

REPO = bp.REPO
OUT = bp.OUT
PYTHON = sys.executable
MARK = "BENCH-RESULT "


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    spec: bp.Spec
    what: str
    bug_layer: int | None = None


def _case(name: str, size: str, layers: int | None, devices: int, what: str, *, scanned: bool = False,
          tp: int = bp.TP, bug_layer: int | None = None, train: bool = False) -> Case:
    return Case(name, bp.Spec(size, layers or bp.SIZES[size].layers, devices, scanned, tp, train), what, bug_layer)


CASES: list[Case] = [
    _case("405b-64", "405b", None, 64, "headline: 126 layers unrolled, 64 devices (fsdp 8 x tp 8)"),
    _case("405b-1L-64", "405b", 1, 64, "depth ratio: 1 layer, 64 devices"),
    _case("405b-8", "405b", None, 8, "device ratio: 8 devices (fsdp 1 x tp 8: no FSDP all-gathers)"),
    _case("405b-8-tp4", "405b", None, 8, "device ratio, same collectives as 64/4096: 8 devices as fsdp 2 x tp 4",
          tp=4),
    _case("405b-16", "405b", None, 16, "device ratio, same program as 64/4096 up to shard sizes: fsdp 2 x tp 8"),
    _case("405b-4096", "405b", None, 4096, "device ratio: 4096 devices (fsdp 512 x tp 8, 2 x 2048 processes)"),
    _case("405b-scan-64", "405b", None, 64, "126 layers under lax.scan (one while loop), 64 devices",
          scanned=True),
    _case("8b-64", "8b", None, 64, "Llama-3.1 8B, 32 layers unrolled, 64 devices"),
    _case("70b-64", "70b", None, 64, "Llama-3.1 70B, 80 layers unrolled, 64 devices"),
    _case("405b-64-bug97", "405b", None, 64, f"headline pair, layer {BUG_LAYER}'s attention-out all-reduce "
          "over fsdp instead of tp", bug_layer=BUG_LAYER),
    # Training steps (bf16 params, AdamW state sharded like the params).
    _case("8b-train-64", "8b", None, 64, "train step: Llama-3.1 8B, 32 layers unrolled, 64 devices (fsdp 8 x tp 8)",
          train=True),
    _case("8b-train-8", "8b", None, 8, "train step: 8B, 32 layers unrolled, 8 devices as fsdp 2 x tp 4", tp=4,
          train=True),
    _case("8b-train-scan-64", "8b", None, 64, "train step: 8B, 32 layers under lax.scan, 64 devices", scanned=True,
          train=True),
    _case("70b-train-64", "70b", None, 64, "train step: Llama-3.1 70B, 80 layers unrolled, 64 devices", train=True),
    _case("405b-train-1L-64", "405b", 1, 64, "train step: 405B, 1 layer, 64 devices", train=True),
    _case("405b-train-64", "405b", None, 64, "train step: 405B, 126 layers unrolled, 64 devices (fsdp 8 x tp 8)",
          train=True),
    _case("405b-train-scan-64", "405b", None, 64, "train step: 405B, 126 layers under lax.scan, 64 devices",
          scanned=True, train=True),
    _case("405b-train-8", "405b", None, 8, "train step, device ratio: 405B, 126 layers, 8 devices as fsdp 2 x tp 4",
          tp=4, train=True),
    _case("405b-train-4096", "405b", None, 4096, "train step, device ratio: 405B, 126 layers, 4096 devices "
          "(fsdp 512 x tp 8, 2 x 2048 processes)", train=True),
    _case("405b-train-64-bug97", "405b", None, 64, f"405B train step, the all-reduce of layer {BUG_LAYER}'s "
          f"'{bench_train.BUG_WEIGHT}' weight gradient over tp instead of fsdp (backward pass)", bug_layer=BUG_LAYER,
          train=True),
]


@dataclasses.dataclass(frozen=True)
class PassesCase:
    """``check_dump`` over a whole XLA pass dump, timed once per entry of ``jobs`` (worker processes)."""

    name: str
    spec: bp.PassDumpSpec
    what: str
    jobs: tuple[int, ...] = (1, 2)


PASSES_CASES: list[PassesCase] = [
    PassesCase("passes-8l-train", bp.PassDumpSpec(layers=8, devices=8, tp=4, dtype="float32"),
               "`passes` over the full XLA dump of a train step (8 layers unrolled, fixture widths, float32, 8 "
               "devices as fsdp 2 x tp 4): all pairs, --jobs 1 and --jobs 2"),
]
AnyCase = Case | PassesCase
# One `passes` run checks every pair of the dump one after the other: far longer than one verify.
PASSES_TIMEOUT = 3600.0
QUICK = ("8b-64", "405b-1L-64")
CHECK = ("405b-64", "405b-1L-64", "405b-8", "405b-8-tp4", "405b-16", "405b-4096", "405b-64-bug97",
         "8b-train-8", "8b-train-64", "405b-train-64", "405b-train-scan-64", "405b-train-64-bug97",
         "405b-train-8", "405b-train-4096", "passes-8l-train")
# The `passes` case checks a whole dump pair by pair: about 6 min on 2 cores (both jobs settings).
ALL: list[AnyCase] = [*CASES, *PASSES_CASES]
BY_NAME: dict[str, AnyCase] = {c.name: c for c in (*CASES, *PASSES_CASES)}


# ============================================================================================== children


def _child_main(mode: str, first: str, second: str) -> int:
    """Runs in a fresh process: ``floor`` or ``verify`` on one pair (before, after), or ``passes`` on a dump
    (directory, jobs); prints one JSON result line."""
    import resource

    t0 = time.perf_counter()
    warm = _warm_imports()
    if mode == "passes":
        import scalify_hlo.passes  # noqa: F401
    import_s = time.perf_counter() - t0
    out: dict[str, Any] = {"import_seconds": round(import_s, 3)}
    if mode == "floor":
        out.update(parse_floor(first, second, warm))
    elif mode == "passes":
        out.update(_passes(first, int(second)))
    else:
        out.update(_verify(first, second))
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    if mode == "passes" and int(second) > 1:  # the largest worker process, reaped when the pool shut down
        out["workers_peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    print(MARK + json.dumps(out), flush=True)
    return 0


def _warm_imports() -> dict[str, Any]:
    """Everything both clocks would otherwise pay once: jax, jaxlib's HLO bindings, MLIR dialects, the prover."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import jaxlib._hlo as xla_hlo
    from jax._src.interpreters import mlir as jax_mlir
    from jax.extend.mlir import hlo_to_stablehlo, ir
    from jax.extend.mlir.dialects import chlo, func, sdy, stablehlo  # noqa: F401  (dialect registration)
    from jaxlib.mlir.dialects import mhlo  # noqa: F401

    import scalify_hlo.prove.engine  # noqa: F401

    with jax_mlir.make_ir_context():
        pass
    return {"hlo": xla_hlo, "ir": ir, "hlo_to_stablehlo": hlo_to_stablehlo, "ctx": jax_mlir.make_ir_context}


def parse_floor(before: str, after: str, warm: dict[str, Any]) -> dict[str, Any]:
    """What any verifier must pay to read the pair: XLA parse, HLO→StableHLO, MLIR parse of both modules."""
    ir = warm["ir"]
    t: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        t[name] = round(now - clock, 4)
        clock = now

    after_text, before_text = Path(after).read_text(), Path(before).read_text()
    lap("read")
    module = warm["hlo"].hlo_module_from_text(after_text)
    lap("xla_parse")
    converted = bytes(warm["hlo_to_stablehlo"](module.as_serialized_hlo_module_proto()))
    lap("hlo_to_stablehlo")
    with warm["ctx"]():
        b = ir.Module.parse(before_text)
        lap("mlir_parse_before")
        a = ir.Module.parse(converted)
        lap("mlir_parse_after")
        ops = _count_ops(b.operation) + _count_ops(a.operation)
    lap("walk")
    t["total"] = round(sum(v for k, v in t.items() if k != "walk"), 4)
    return {"floor": t, "floor_walk_ops": ops}


def _count_ops(op: Any) -> int:
    n = 1
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                n += _count_ops(inner.operation)
    return n


def _verify(before: str, after: str) -> dict[str, Any]:
    from scalify_hlo.prove.engine import prove

    t0 = time.perf_counter()
    report = prove(before, after)
    wall = time.perf_counter() - t0
    out: dict[str, Any] = {"verdict": report.name, "wall": round(wall, 3),
                           "stats": _jsonable(report.stats)}
    findings = report.findings
    if findings:
        f = findings[0]
        out["reason"] = f.reason
        out["finding_after"] = f.after.instruction if f.after else None
        out["finding_after_ir"] = f.after.ir if f.after else None
        out["finding_also"] = [s.instruction for s in f.also]
        out["finding_before_source"] = f.before.source if f.before else None
    elif report.name != "equivalent":
        out["reason"] = getattr(report.verdict, "reason", None)
    return out


def _passes(dump: str, jobs: int) -> dict[str, Any]:
    """``check_dump`` over every pair of the dump; wall time includes starting the worker processes (spawn)."""
    from collections import Counter

    from scalify_hlo.passes import check_dump

    t0 = time.perf_counter()
    results = check_dump(Path(dump), jobs=jobs)
    wall = time.perf_counter() - t0
    slowest = sorted(results, key=lambda r: -r.seconds)[:3]
    return {
        "jobs": jobs, "wall": round(wall, 3), "pairs": len(results), "modules": len({r.module for r in results}),
        "verdicts": dict(Counter(r.verdict for r in results)), "modes": dict(Counter(r.mode for r in results)),
        "errors": sum(r.error is not None for r in results),
        "pair_seconds": round(sum(r.seconds for r in results), 3),  # the pairs' own times, summed over workers
        "sequence": "".join(r.verdict[0] for r in results),  # e/u/d per pair in pipeline order: jobs must agree
        "slowest": [{"passes": r.passes, "seconds": round(r.seconds, 3), "verdict": r.verdict} for r in slowest],
        "not_equivalent": [_pass_finding(r) for r in results if r.verdict != "equivalent"],
    }


def _pass_finding(r: Any) -> dict[str, Any]:
    """A pair that is not proven: where (module, passes, files) and why (reason, first finding's instruction)."""
    out: dict[str, Any] = {"verdict": r.verdict, "module": r.module, "passes": r.passes, "mode": r.mode,
                           "before": r.before.name, "after": r.after.name, "reason": r.reason[:500]}
    findings = r.report.findings if r.report is not None else []
    if findings and findings[0].after is not None:
        out["instruction"] = findings[0].after.instruction
    return out


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def run_child(mode: str, before: Path | str, after: Path | str, timeout: float) -> dict[str, Any]:
    """One fresh process; its peak RSS is watched from here too, so a timed-out case still reports it."""
    cmd = [PYTHON, str(Path(__file__).resolve()), "_child", mode, str(before), str(after)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    peak = 0
    out, err = "", ""
    while True:
        peak = max(peak, bp._vm_hwm_kib(proc.pid))
        try:
            out, err = proc.communicate(timeout=0.2)
            break
        except subprocess.TimeoutExpired:
            if time.perf_counter() - started > timeout:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                return {"verdict": "timeout", "wall": round(time.perf_counter() - started, 1),
                        "peak_rss_mib": round(peak / 1024, 1), "reason": f"killed after {timeout:.0f}s"}
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        tail = (err or out).strip().splitlines()[-1:] or ["no output"]
        return {"verdict": "error", "wall": round(time.perf_counter() - started, 1),
                "peak_rss_mib": round(peak / 1024, 1), "reason": f"exit {proc.returncode}: {tail[0][:300]}"}
    return json.loads(lines[-1][len(MARK):])


# ================================================================================================ cases


def prepare(case: Case, *, generate: bool) -> tuple[Path, Path, dict[str, Any], dict[str, Any] | None]:
    """(before, after, generation stats, bug info): for a bug case, after is the mutated copy of its base."""
    g = bp.generate_case(case.spec, OUT, cache_only=not generate)
    gen = {"cached": g.cached, **g.stats}
    if case.bug_layer is None:
        return g.before, g.after, gen, None
    if case.spec.train:
        after, bug = _mutated_train(case, g.after)
        return g.before, after, gen, bug
    after, bug = _mutated(case, g.after, generate=generate)
    return g.before, after, gen, bug


def _mutated(case: Case, base_after: Path, *, generate: bool) -> tuple[Path, dict[str, Any]]:
    """``inject_bug`` on the base after.hlo; the per-layer all-reduce count comes from the 1-layer program."""
    assert case.bug_layer is not None
    t0 = time.perf_counter()
    one = bp.generate_case(dataclasses.replace(case.spec, layers=1), OUT, cache_only=not generate)
    per_layer = len(bp.entry_all_reduces(one.after.read_text()))
    text = base_after.read_text()
    mutated, instruction = bp.inject_bug(text, case.bug_layer, "replica_groups", per_layer=per_layer)
    dest = OUT / f"{case.spec.key}_bug-replica_groups-L{case.bug_layer}"
    dest.mkdir(parents=True, exist_ok=True)
    after = dest / "after.hlo"
    after.write_text(mutated)
    line = bp.instruction_line(mutated, instruction)
    info = {"instruction": instruction, "layer": case.bug_layer, "per_layer_all_reduces": per_layer,
            "line": (line or 0) + 1, "mutation_seconds": round(time.perf_counter() - t0, 3),
            "base": str(base_after.relative_to(REPO))}
    (dest / "bug.json").write_text(json.dumps(info, indent=2) + "\n")
    return after, info


def _mutated_train(case: Case, base_after: Path) -> tuple[Path, dict[str, Any]]:
    """``bench_train.inject_gradient_bug``: layer ``bug_layer``'s weight-gradient all-reduce on the wrong axis."""
    assert case.bug_layer is not None
    t0 = time.perf_counter()
    mutated, instruction = bench_train.inject_gradient_bug(base_after.read_text(), case.bug_layer)
    dest = OUT / f"{case.spec.key}_bug-grad-{bench_train.BUG_WEIGHT}-L{case.bug_layer}"
    dest.mkdir(parents=True, exist_ok=True)
    after = dest / "after.hlo"
    after.write_text(mutated)
    line = bp.instruction_line(mutated, instruction)
    info = {"instruction": instruction, "layer": case.bug_layer, "weight": bench_train.BUG_WEIGHT,
            "line": (line or 0) + 1, "mutation_seconds": round(time.perf_counter() - t0, 3),
            "base": str(base_after.relative_to(REPO))}
    (dest / "bug.json").write_text(json.dumps(info, indent=2) + "\n")
    return after, info


def best_of(mode: str, before: Path, after: Path, timeout: float, repeat: int) -> dict[str, Any]:
    """``repeat`` fresh runs, the fastest kept (all times listed); a timeout or error stops the repeats."""
    runs: list[dict[str, Any]] = []
    for _ in range(max(1, repeat)):
        r = run_child(mode, before, after, timeout)
        runs.append(r)
        if r.get("verdict") in ("timeout", "error", "unknown"):  # nothing to time more precisely
            return r
    key = (lambda r: r["floor"]["total"]) if mode == "floor" else (lambda r: r["wall"])
    best = dict(min(runs, key=key))
    if len(runs) > 1:
        best["runs"] = [key(r) for r in runs]
    return best


def run_case(case: Case, *, generate: bool, timeout: float, repeat: int = 1) -> dict[str, Any]:
    res: dict[str, Any] = {"name": case.name, "what": case.what, "spec": dataclasses.asdict(case.spec),
                           "key": case.spec.key, "mesh": case.spec.mesh}
    try:
        before, after, gen, bug = prepare(case, generate=generate)
    except Exception as err:  # generation failure or missing cache: report it, go on with the others
        res["generation"] = {"error": f"{type(err).__name__}: {str(err).strip()[:500]}"}
        return res
    if bug is not None:
        res["bug"] = bug
    res["generation"] = gen
    res["files"] = {"before": str(before.relative_to(REPO)), "after": str(after.relative_to(REPO))}
    res["floor"] = best_of("floor", before, after, timeout, repeat)
    res["verify"] = best_of("verify", before, after, timeout, repeat)
    floor = res["floor"].get("floor", {}).get("total")
    wall = res["verify"].get("wall")
    if floor and wall and res["verify"]["verdict"] not in ("timeout", "error"):
        res["ratio"] = round(wall / floor, 2)
    if case.bug_layer is not None:
        res["localised"] = _localised(res, after)
    return res


def _localised(res: dict[str, Any], after: Path) -> dict[str, Any]:
    v, bug = res["verify"], res["bug"]
    reported = v.get("finding_after")
    same = reported is not None and reported.lstrip("%") == bug["instruction"].lstrip("%")
    out: dict[str, Any] = {"injected": bug["instruction"], "reported": reported, "same_instruction": same,
                           "in_also": bug["instruction"] in (v.get("finding_also") or [])}
    if reported and "weight" in bug:  # a train step: the layer and weight whose update the instruction feeds
        out.update(bench_train.located(after.read_text(), reported))
    elif reported:
        text = after.read_text()
        line = bp.instruction_line(text, reported)
        out["reported_layer"] = (bp.layer_of_line(text, line, bug["per_layer_all_reduces"])
                                 if line is not None else None)
    return out


def run_passes_case(case: PassesCase, *, generate: bool, timeout: float, repeat: int = 1) -> dict[str, Any]:
    """The dump (cached), then one fresh ``passes`` child per jobs setting (fastest of ``repeat`` kept)."""
    res: dict[str, Any] = {"name": case.name, "what": case.what, "kind": "passes",
                           "spec": dataclasses.asdict(case.spec), "key": case.spec.key, "mesh": case.spec.mesh}
    try:
        d = bp.generate_pass_dump(case.spec, OUT, cache_only=not generate)
    except Exception as err:  # generation failure or missing cache: report it, go on with the others
        res["generation"] = {"error": f"{type(err).__name__}: {str(err).strip()[:500]}"}
        return res
    res["generation"] = {"cached": d.cached, **d.stats}
    res["files"] = {"dump": str(d.dump.relative_to(REPO))}
    res["timeout"] = timeout
    res["runs"] = [best_of_passes(d.dump, jobs, timeout, repeat) for jobs in case.jobs]
    by_jobs = {r.get("jobs"): r for r in res["runs"]}
    one, two = by_jobs.get(1, {}), by_jobs.get(2, {})
    if one.get("wall") and two.get("wall") and "pairs" in one and "pairs" in two:
        res["speedup"] = round(one["wall"] / two["wall"], 2)
        res["same_verdicts"] = one["sequence"] == two["sequence"]
    return res


def best_of_passes(dump: Path, jobs: int, timeout: float, repeat: int) -> dict[str, Any]:
    """``repeat`` fresh ``check_dump`` runs with ``jobs`` workers, the fastest kept (all times listed)."""
    runs: list[dict[str, Any]] = []
    for _ in range(max(1, repeat)):
        r = {"jobs": jobs, **run_child("passes", dump, str(jobs), timeout)}
        runs.append(r)
        if "pairs" not in r:  # timeout or error: nothing to time more precisely
            return r
    best = dict(min(runs, key=lambda r: r["wall"]))
    if len(runs) > 1:
        best["runs"] = [r["wall"] for r in runs]
    return best


# ================================================================================================== main


def select(ns: argparse.Namespace) -> list[AnyCase]:
    if ns.only:
        unknown = [n for n in ns.only if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; see --list")
        return [BY_NAME[n] for n in ns.only]
    if ns.quick:
        return [BY_NAME[n] for n in QUICK]
    if ns.check:
        return [BY_NAME[n] for n in CHECK]
    return list(ALL)


def run(cases: Sequence[AnyCase], *, generate: bool, timeout: float, repeat: int = 1,
        progress: Callable[[str], None] = print, passes_timeout: float = PASSES_TIMEOUT) -> list[dict[str, Any]]:
    results = []
    for case in cases:
        t0 = time.perf_counter()
        progress(f"[{case.name}] {case.what} ...")
        if isinstance(case, PassesCase):
            r = run_passes_case(case, generate=generate, timeout=passes_timeout, repeat=repeat)
            progress(_passes_progress(r, time.perf_counter() - t0))
            results.append(r)
            continue
        r = run_case(case, generate=generate, timeout=timeout, repeat=repeat)
        if "error" in r.get("generation", {}):
            progress(f"[{case.name}] not run: {r['generation']['error']}")
            results.append(r)
            continue
        v = r.get("verify", {})
        progress(f"[{case.name}] generation {_fmt(r.get('generation', {}).get('seconds'))} s "
                 f"({'cached' if r.get('generation', {}).get('cached') else 'new'}), floor "
                 f"{_fmt(r.get('floor', {}).get('floor', {}).get('total'), '.3f')} s, verify "
                 f"{v.get('verdict')} in {_fmt(v.get('wall'))} s ({time.perf_counter() - t0:.1f} s in all)")
        results.append(r)
    return results


def _passes_progress(r: dict[str, Any], seconds: float) -> str:
    g = r.get("generation", {})
    if "error" in g:
        return f"[{r['name']}] not run: {g['error']}"
    runs = ", ".join(f"jobs {x.get('jobs')}: {x.get('pairs', x.get('verdict'))} pairs "
                     f"{x.get('verdicts', x.get('reason'))} in {_fmt(x.get('wall'))} s" for x in r.get("runs", []))
    return (f"[{r['name']}] generation {_fmt(g.get('seconds'))} s ({'cached' if g.get('cached') else 'new'}); "
            f"{runs}; speedup {_fmt(r.get('speedup'))} ({seconds:.1f} s in all)")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        return _child_main(*argv[1:4])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per verify (default 600)")
    ap.add_argument("--passes-timeout", type=float, default=PASSES_TIMEOUT,
                    help=f"seconds per `passes` run (default {PASSES_TIMEOUT:.0f})")
    ap.add_argument("--no-generate", action="store_true", help="use cached pairs and dumps only")
    ap.add_argument("--repeat", type=int, default=1, help="fresh verify/floor runs per case, fastest kept")
    ap.add_argument("--check", action="store_true", help="print the issue's targets and whether each is met")
    ap.add_argument("--from-results", action="store_true",
                    help="run nothing: re-render BENCH.md from out/bench/results.json (with --check: judge it)")
    ap.add_argument("--md", type=Path, metavar="PATH",
                    help="write the report to PATH (results to PATH with .json) instead of BENCH.md/results.json")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ns = ap.parse_args(argv)
    if ns.list:
        for c in BY_NAME.values():
            print(f"{c.name:20s} {c.spec.key:34s} {c.what}")
        return 0
    md, res = (ns.md, ns.md.with_suffix(".json")) if ns.md else (BENCH_MD, RESULTS)
    if ns.from_results:
        stored = json.loads(res.read_text())
        results = stored["cases"]
        write_reports(results, stored.get("timeout", ns.timeout), stored.get("repeat", 1), stored, md_path=md,
                      results_path=res)
        print(f"re-rendered {_shown(md)} from {_shown(res)}")
    else:
        results = run(select(ns), generate=not ns.no_generate, timeout=ns.timeout, repeat=ns.repeat,
                      passes_timeout=ns.passes_timeout)
        write_reports(results, ns.timeout, ns.repeat, md_path=md, results_path=res)
        verified = verify_results(results)
        if verified:
            print()
            print(results_table(verified))
            print()
            print(floor_table(verified))
            print()
            print(generation_table(verified))
        if len(verified) < len(results):
            print()
            print(passes_table(results))
        print(f"\nwrote {_shown(md)} and {_shown(res)}")
    if ns.check:
        print("\nTargets:")
        print(targets_text(results))
        chosen = select(ns)
        judged = targets(results) + (bench_train.train_targets(results)
                                     if any(isinstance(c, Case) and c.spec.train for c in chosen) else []) + \
            (passes_targets(results) if any(isinstance(c, PassesCase) for c in chosen) else [])
        return 0 if all(ok for _, ok, _ in judged) else 1
    return 0


def _shown(path: Path) -> str:
    return str(path.resolve().relative_to(REPO)) if path.resolve().is_relative_to(REPO) else str(path)


if __name__ == "__main__":
    sys.exit(main())
