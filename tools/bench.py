#!/usr/bin/env python
"""Scale benchmark of the verifier on Llama-3.1 stacks partitioned by XLA (FSDP x TP on fake CPU devices).

    python tools/bench.py                  # the default matrix; prints a Markdown table, writes BENCH.md
    python tools/bench.py --quick          # 8B and the 405B 1-layer only
    python tools/bench.py --only 405b-64   # one case (repeatable)
    python tools/bench.py --check          # run what the targets need, print each target and whether it is met
    python tools/bench.py --check --from-results   # run nothing: judge (and re-render BENCH.md from) results.json
    options: --timeout SECONDS (per verify, default 600), --no-generate (cached pairs only), --repeat N
             (fresh runs per case, fastest kept), --list

For every case: the pair's generation cost (``tools/bench_programs.py``, cached under ``out/bench/<key>/``,
reported separately), the parse floor measured in this run on the same files (XLA's HLO text parser, XLA's
HLO→StableHLO converter, and MLIR parsing of before.mlir and of the converted after module), then
``scalify_hlo.prove.engine.prove()`` in a fresh subprocess (its own peak RSS), with its verdict, wall time, stage
timings, and the ratio wall / parse floor. Imports (jax, MLIR dialects) are paid before either clock starts.
Writes ``BENCH.md`` at the repo root and ``out/bench/results.json``; both describe the cases of this run only
(``--only``/``--quick`` replace a full table).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_programs as bp

REPO = bp.REPO
OUT = bp.OUT
RESULTS = OUT / "results.json"
BENCH_MD = REPO / "BENCH.md"
PYTHON = sys.executable
MARK = "BENCH-RESULT "
STAGES = ("parse", "mesh", "before", "after", "outputs")
GIB = 1024.0

# Targets of the issue.
HEADLINE_SECONDS, HEADLINE_GIB = 10.0, 2.0
DEVICE_RATIO, DEPTH_RATIO = 1.3, 3.0
BUG_LAYER = 97


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    spec: bp.Spec
    what: str
    bug_layer: int | None = None


def _case(name: str, size: str, layers: int | None, devices: int, what: str, *, scanned: bool = False,
          tp: int = bp.TP, bug_layer: int | None = None) -> Case:
    return Case(name, bp.Spec(size, layers or bp.SIZES[size].layers, devices, scanned, tp), what, bug_layer)


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
]
QUICK = ("8b-64", "405b-1L-64")
CHECK = ("405b-64", "405b-1L-64", "405b-8", "405b-8-tp4", "405b-16", "405b-4096", "405b-64-bug97")
BY_NAME = {c.name: c for c in CASES}


# ============================================================================================== children


def _child_main(mode: str, before: str, after: str) -> int:
    """Runs in a fresh process: ``floor`` or ``verify`` on one pair; prints one JSON result line."""
    import resource

    t0 = time.perf_counter()
    warm = _warm_imports()
    import_s = time.perf_counter() - t0
    out: dict[str, Any] = {"import_seconds": round(import_s, 3)}
    if mode == "floor":
        out.update(parse_floor(before, after, warm))
    else:
        out.update(_verify(before, after))
    out["peak_rss_mib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
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


def _jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))


def run_child(mode: str, before: Path, after: Path, timeout: float) -> dict[str, Any]:
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
    if reported:
        text = after.read_text()
        line = bp.instruction_line(text, reported)
        out["reported_layer"] = (bp.layer_of_line(text, line, bug["per_layer_all_reduces"])
                                 if line is not None else None)
    return out


# ============================================================================================== reports


def _fmt(x: Any, spec: str = ".2f") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool) or (isinstance(x, int) and not spec.endswith("d")):
        return str(x)
    return format(x, spec) if isinstance(x, int | float) else str(x)


def segments(stats: dict[str, Any]) -> str:
    """unique/total segments if the prover reports them (several spellings tolerated), else '-'."""
    seg = stats.get("segments")
    if isinstance(seg, dict):
        u, t = seg.get("unique"), seg.get("total")
        if u is not None and t is not None:
            return f"{u}/{t}"
    for u_key, t_key in (("segments_unique", "segments_total"), ("unique_segments", "segments"),
                         ("unique_segments", "total_segments")):
        if u_key in stats and t_key in stats and not isinstance(stats[t_key], dict):
            return f"{stats[u_key]}/{stats[t_key]}"
    return "-"


def results_table(results: Sequence[dict[str, Any]]) -> str:
    head = ("| case | verdict | wall s | parse | mesh | before | after | outputs | other | peak RSS MiB | "
            "floor s | wall/floor | segments u/t | bug localised |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        v = r.get("verify", {})
        st = v.get("stats", {}).get("stages", {})
        other = None
        if "seconds" in v.get("stats", {}):
            other = v["stats"]["seconds"] - sum(st.get(k, 0.0) for k in st)
        loc = r.get("localised")
        loc_s = "-" if loc is None else (
            f"{'yes' if loc['same_instruction'] else 'no'} (%{loc['reported']} layer "
            f"{_fmt(loc.get('reported_layer'))}; injected %{loc['injected']})")
        verdict = v.get("verdict") or ("gen failed" if "error" in r.get("generation", {}) else "-")
        rows.append("| " + " | ".join([
            r["name"], verdict, _fmt(v.get("wall")), *(_fmt(st.get(k)) for k in STAGES), _fmt(other),
            _fmt(v.get("peak_rss_mib"), ".0f"), _fmt(r.get("floor", {}).get("floor", {}).get("total")),
            _fmt(r.get("ratio"), ".1f"), segments(v.get("stats", {})), loc_s]) + " |")
    return "\n".join(rows)


def generation_table(results: Sequence[dict[str, Any]]) -> str:
    head = ("| case | key | mesh (fsdp x tp) | procs | gen s | import | lower | compile→dump | peak RSS MiB | "
            "before KB | after KB | before ops | after ops (ENTRY) | all-gather | all-reduce | cached |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        g = r.get("generation", {})
        if "error" in g:
            rows.append(f"| {r['name']} | {r['key']} | {g['error'][:120]} |")
            continue
        st, ops = g.get("stages", {}), g.get("after_op_counts", {})
        m = r["mesh"]
        rows.append("| " + " | ".join([
            r["name"], r["key"], f"{m['fsdp']} x {m['tp']}", _fmt(g.get("processes"), "d"), _fmt(g.get("seconds")),
            _fmt(st.get("jax_ready")), _fmt(st.get("lowered")), _fmt(st.get("dump")),
            _fmt(g.get("peak_rss_mib"), ".0f"), _fmt(g.get("before_bytes", 0) / 1024, ".0f"),
            _fmt(g.get("after_bytes", 0) / 1024, ".0f"), _fmt(g.get("before_ops"), "d"),
            f"{_fmt(g.get('after_ops'), 'd')} ({_fmt(g.get('after_entry_ops'), 'd')})",
            _fmt(ops.get("all-gather", 0), "d"), _fmt(ops.get("all-reduce", 0), "d"),
            "yes" if g.get("cached") else "no"]) + " |")
    return "\n".join(rows)


def floor_table(results: Sequence[dict[str, Any]]) -> str:
    keys = ("xla_parse", "hlo_to_stablehlo", "mlir_parse_before", "mlir_parse_after", "total")
    head = "| case | " + " | ".join(keys) + " | MLIR ops walked | floor peak RSS MiB |"
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        f = r.get("floor", {})
        t = f.get("floor", {})
        rows.append("| " + " | ".join([r["name"], *(_fmt(t.get(k), ".3f") for k in keys),
                                       _fmt(f.get("floor_walk_ops"), "d"), _fmt(f.get("peak_rss_mib"), ".0f")])
                    + " |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------- targets


def targets(results: Sequence[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """(target, met? (None: not measured), measured) for each target of the issue."""
    by = {r["name"]: r for r in results}

    def v(name: str) -> dict[str, Any]:
        return by.get(name, {}).get("verify", {})

    def wall(name: str) -> float | None:
        """A time to take a ratio of: only of a proof (an `unknown` after minutes says nothing about scaling)."""
        x = v(name)
        return x.get("wall") if x.get("verdict") == "equivalent" else None

    out: list[tuple[str, bool | None, str]] = []
    h = v("405b-64")
    if h:
        ok = h.get("verdict") == "equivalent" and (h.get("wall") or 1e9) <= HEADLINE_SECONDS and \
            (h.get("peak_rss_mib") or 1e9) <= HEADLINE_GIB * GIB
        out.append((f"405B unrolled, 64 devices: equivalent in <= {HEADLINE_SECONDS:g} s and <= {HEADLINE_GIB:g} GiB",
                    ok, f"{h.get('verdict')}, {_fmt(h.get('wall'))} s, {_fmt(h.get('peak_rss_mib'), '.0f')} MiB"))
    else:
        out.append(("405B unrolled, 64 devices: equivalent in <= 10 s and <= 2 GiB", None, "not run"))
    out.append(_ratio("8 (1 x 8) -> 4096 devices time ratio", wall("405b-4096"), wall("405b-8"), DEVICE_RATIO))
    out.append(_ratio("126 layers vs 1 layer time ratio", wall("405b-64"), wall("405b-1L-64"), DEPTH_RATIO))
    b = v("405b-64-bug97")
    loc = by.get("405b-64-bug97", {}).get("localised")
    if b:
        ok = b.get("verdict") == "discrepancy" and bool(loc and loc["same_instruction"]) and \
            (b.get("wall") or 1e9) <= HEADLINE_SECONDS and (b.get("peak_rss_mib") or 1e9) <= HEADLINE_GIB * GIB
        where = f"reported %{loc['reported']} (layer {loc.get('reported_layer')}), injected %{loc['injected']}" \
            if loc else "no finding"
        out.append((f"layer-{BUG_LAYER} bug found and localised within the same budget", ok,
                    f"{b.get('verdict')}, {_fmt(b.get('wall'))} s, {_fmt(b.get('peak_rss_mib'), '.0f')} MiB; {where}"))
    else:
        out.append((f"layer-{BUG_LAYER} bug found and localised within the same budget", None, "not run"))
    return out


def _ratio(label: str, num: float | None, den: float | None, limit: float) -> tuple[str, bool | None, str]:
    if num is None or den is None or den <= 0:
        return f"{label} <= {limit:g}", None, "not measured (a case is missing, timed out or failed)"
    r = num / den
    return f"{label} <= {limit:g}", r <= limit, f"{r:.2f} ({num:.2f} s / {den:.2f} s)"


def extra_ratios(results: Sequence[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """Device ratios against baselines whose program has the same collectives as 4096 (information only)."""
    by = {r["name"]: r.get("verify", {}) for r in results}

    def wall(name: str) -> float | None:
        return by.get(name, {}).get("wall") if by.get(name, {}).get("verdict") == "equivalent" else None

    return [_ratio(f"{base} -> 4096 devices time ratio", wall("405b-4096"), wall(base), DEVICE_RATIO)
            for base in ("405b-8-tp4", "405b-16") if base in by]


def targets_text(results: Sequence[dict[str, Any]]) -> str:
    lines = []
    for label, ok, measured in targets(results):
        mark = "MET" if ok else ("not measured" if ok is None else "NOT MET")
        lines.append(f"- [{'x' if ok else ' '}] {label}: **{mark}** — {measured}")
    for label, ok, measured in extra_ratios(results):
        mark = "within" if ok else ("not measured" if ok is None else "above")
        lines.append(f"- (information) {label}: {mark} — {measured}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, Any]:
    mem_kib = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                                capture_output=True, text=True).stdout.strip())
    return {"cores": os.cpu_count(), "cpu": cpu, "ram_gib": round(mem_kib / 1024 / 1024, 1),
            "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(), "jax": version("jax"), "jaxlib": version("jaxlib"),
            "egglog": version("egglog"), "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "dirty": dirty, "generator": bp.GENERATOR_VERSION}


def write_reports(results: list[dict[str, Any]], timeout: float, repeat: int = 1,
                  stored: dict[str, Any] | None = None) -> str:
    """BENCH.md and results.json of this run; with ``stored`` (a results.json), BENCH.md re-rendered from it."""
    if stored is None:
        m = machine()
        m["command"] = " ".join(["python", "tools/bench.py", *sys.argv[1:]])
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"machine": m, "timeout": timeout, "repeat": repeat, "cases": results},
                                      indent=2) + "\n")
    else:
        m = stored["machine"]
    cases = "\n".join(f"- `{r['name']}` ({r['key']}): {r['what']}" for r in results)
    dirty = " (with uncommitted changes)" if m.get("dirty") else ""
    md = f"""# BENCH — scalify-hlo at scale

Written by `tools/bench.py` (`{m.get('command', 'python tools/bench.py')}`); raw data in
`out/bench/results.json`. Pairs generated by {m['generator']}.

Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM; Python {m['python']}, jax {m['jax']}
(jaxlib {m['jaxlib']}), egglog {m['egglog']}; {m['date']}, commit {m['commit']}{dirty}; load average at the
end {m['load_average']} (1, 5, 15 min: other work on the machine shows up in every time below).

Programs: Llama-3.1 decoder stacks (`tools/programs/llama.py`: RMSNorm, RoPE, GQA causal attention, SwiGLU)
at the real widths, seq {bp.SEQ}, batch = fsdp devices, float32, MaxText-style FSDP x TP specs, Shardy;
before = `jax.jit(...).lower(...).as_text(debug_info=True)`, after = XLA's `after_spmd-partitioning` dump.

{cases}

## Targets

{targets_text(results)}

## Verify (fresh process per case; imports excluded from every clock)

`wall` is the `prove()` call; the stage columns are `report.stats["stages"]`; `other` = `stats["seconds"]`
minus the stages (time the prover spends outside its named stages); `floor` = XLA parse + HLO→StableHLO +
MLIR parse of both files (table below); timeout {timeout:.0f} s per case; fastest of {repeat} fresh run(s).

{results_table(results)}

## Parse floor (seconds; same files, same run)

{floor_table(results)}

## Generation (cached under `out/bench/<key>/`; not part of any verify time)

Worker process: jax import, lowering (jit trace + StableHLO), compile until XLA has written the
`after_spmd-partitioning` dump, then killed (XLA's CPU optimisation and codegen never run).

{generation_table(results)}
"""
    BENCH_MD.write_text(md)
    return md


# ================================================================================================== main


def select(ns: argparse.Namespace) -> list[Case]:
    if ns.only:
        unknown = [n for n in ns.only if n not in BY_NAME]
        if unknown:
            raise SystemExit(f"unknown case(s) {unknown}; see --list")
        return [BY_NAME[n] for n in ns.only]
    if ns.quick:
        return [BY_NAME[n] for n in QUICK]
    if ns.check:
        return [BY_NAME[n] for n in CHECK]
    return list(CASES)


def run(cases: Sequence[Case], *, generate: bool, timeout: float, repeat: int = 1,
        progress: Callable[[str], None] = print) -> list[dict[str, Any]]:
    results = []
    for case in cases:
        t0 = time.perf_counter()
        progress(f"[{case.name}] {case.what} ...")
        r = run_case(case, generate=generate, timeout=timeout, repeat=repeat)
        v = r.get("verify", {})
        progress(f"[{case.name}] generation {_fmt(r.get('generation', {}).get('seconds'))} s "
                 f"({'cached' if r.get('generation', {}).get('cached') else 'new'}), floor "
                 f"{_fmt(r.get('floor', {}).get('floor', {}).get('total'), '.3f')} s, verify "
                 f"{v.get('verdict')} in {_fmt(v.get('wall'))} s ({time.perf_counter() - t0:.1f} s in all)")
        results.append(r)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_child"]:
        return _child_main(*argv[1:4])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", metavar="NAME", help="run only this case (repeatable)")
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per verify (default 600)")
    ap.add_argument("--no-generate", action="store_true", help="use cached pairs only")
    ap.add_argument("--repeat", type=int, default=1, help="fresh verify/floor runs per case, fastest kept")
    ap.add_argument("--check", action="store_true", help="print the issue's targets and whether each is met")
    ap.add_argument("--from-results", action="store_true",
                    help="run nothing: re-render BENCH.md from out/bench/results.json (with --check: judge it)")
    ap.add_argument("--list", action="store_true", help="list the cases")
    ns = ap.parse_args(argv)
    if ns.list:
        for c in CASES:
            print(f"{c.name:16s} {c.spec.key:28s} {c.what}")
        return 0
    if ns.from_results:
        stored = json.loads(RESULTS.read_text())
        results = stored["cases"]
        write_reports(results, stored.get("timeout", ns.timeout), stored.get("repeat", 1), stored)
        print(f"re-rendered {BENCH_MD.relative_to(REPO)} from {RESULTS.relative_to(REPO)}")
    else:
        results = run(select(ns), generate=not ns.no_generate, timeout=ns.timeout, repeat=ns.repeat)
        write_reports(results, ns.timeout, ns.repeat)
        print()
        print(results_table(results))
        print()
        print(floor_table(results))
        print()
        print(generation_table(results))
        print(f"\nwrote {BENCH_MD.relative_to(REPO)} and {RESULTS.relative_to(REPO)}")
    if ns.check:
        print("\nTargets:")
        print(targets_text(results))
        return 0 if all(ok for _, ok, _ in targets(results)) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
