"""The reports of ``tools/bench.py``: the Markdown tables (verify, parse floor, generation, passes over an XLA
dump), the issue's targets judged from the results, the machine description, and ``BENCH.md`` / ``results.json``
themselves.

Everything here reads result dictionaries (as ``tools/bench.py`` builds them and ``results.json`` stores them);
nothing runs a case.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

import bench_programs as bp
import bench_train

REPO = bp.REPO
RESULTS = bp.OUT / "results.json"
BENCH_MD = REPO / "BENCH.md"
STAGES = ("parse", "mesh", "before", "after", "outputs")
GIB = 1024.0

# Targets of the issue (scale): the forward pass against the parse floor, depth beyond the floor's own growth.
HEADLINE_SECONDS, HEADLINE_GIB = 10.0, 2.0
DEVICE_RATIO, DEPTH_RATIO, FLOOR_RATIO = 1.3, 3.0, 3.0
BUG_LAYER = 97


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


def layers(stats: dict[str, Any]) -> str:
    """templates/segments substituted by layer memoization (`stats["layers"]`), else '-'."""
    used = stats.get("layers")
    if not isinstance(used, dict):
        return "-"
    return f"{used.get('templates', 0)}/{used.get('instances', 0)}" + (" (retried)" if used.get("retried") else "")


def verify_results(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The before/after pair cases (verify, floor and generation tables); ``passes`` cases have their own table."""
    return [r for r in results if r.get("kind") != "passes"]


def passes_results(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in results if r.get("kind") == "passes"]


def results_table(results: Sequence[dict[str, Any]]) -> str:
    head = ("| case | verdict | wall s | parse | mesh | before | after | outputs | other | peak RSS MiB | "
            "floor s | wall/floor | segments u/t | layers t/s | bug localised |")
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
            _fmt(r.get("ratio"), ".1f"), segments(v.get("stats", {})), layers(v.get("stats", {})), loc_s]) + " |")
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


def passes_table(results: Sequence[dict[str, Any]]) -> str:
    """One row per ``passes`` case: the dump, pairs, verdict counts and seconds with 1 and 2 worker processes."""
    head = ("| case | dump files (MiB) | pairs | equivalent | unknown | discrepancy | jobs=1 s | jobs=2 s | speedup | "
            "same verdicts | peak RSS MiB jobs=1 | jobs=2 (main + largest worker) | gen s | cached |")
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in passes_results(results):
        g = r.get("generation", {})
        if "error" in g:
            rows.append(f"| {r['name']} | {g['error'][:240]} |")
            continue
        by_jobs = {x.get("jobs"): x for x in r.get("runs", [])}
        one, two = by_jobs.get(1, {}), by_jobs.get(2, {})
        counts = one.get("verdicts") or two.get("verdicts") or {}
        same = r.get("same_verdicts")
        rows.append("| " + " | ".join([
            r["name"], f"{_fmt(g.get('files'), 'd')} ({_fmt(g.get('bytes', 0) / 2**20, '.0f')})",
            _fmt(one.get("pairs", two.get("pairs")), "d"),
            *(_fmt(counts.get(v, 0) if counts else None, "d") for v in ("equivalent", "unknown", "discrepancy")),
            _passes_seconds(one), _passes_seconds(two), _fmt(r.get("speedup")),
            "-" if same is None else ("yes" if same else "NO"), _fmt(one.get("peak_rss_mib"), ".0f"),
            f"{_fmt(two.get('peak_rss_mib'), '.0f')} + {_fmt(two.get('workers_peak_rss_mib'), '.0f')}",
            _fmt(g.get("seconds")), "yes" if g.get("cached") else "no"]) + " |")
    return "\n".join(rows)


def _passes_seconds(run: dict[str, Any]) -> str:
    return _fmt(run.get("wall")) if "pairs" in run else f"{run.get('verdict', '-')}"


def passes_findings(results: Sequence[dict[str, Any]]) -> str:
    """The pairs not proven equivalent (from the jobs=1 run), one line per verdict and reason: how many pairs,
    the first (module, passes, dump file after, instruction) and the last pass."""
    lines = []
    for r in passes_results(results):
        runs = r.get("runs") or [{}]
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for f in runs[0].get("not_equivalent", []):
            groups.setdefault((f["verdict"], f["reason"]), []).append(f)
        for (verdict, reason), found in groups.items():
            f = found[0]
            at = f" (%{f['instruction']})" if f.get("instruction") else ""
            more = f"; {len(found)} pairs, to {found[-1]['passes']}" if len(found) > 1 else ""
            lines.append(f"- `{r['name']}` {verdict}: {f['passes']} — `{f['after']}`{at}{more}: {reason[:300]}")
    return "\n".join(lines) or "- none: every pair equivalent"


def passes_targets(results: Sequence[dict[str, Any]]) -> list[tuple[str, bool | None, str]]:
    """Issue 15: `passes` over the full dump of an 8-layer train step, all pairs, timed with 1 and 2 jobs; met
    when both runs checked every pair, agree pair by pair and found no discrepancy (a clean compile has none)."""
    label = "`passes` over the full XLA dump of an 8-layer train step, all pairs, --jobs 1 and --jobs 2"
    r = next((x for x in passes_results(results) if x["name"] == "passes-8l-train"), None)
    if r is None or "speedup" not in r:
        why = "not run" if r is None else r.get("generation", {}).get("error") or "a run timed out or failed"
        return [(label, None, why)]
    one, two = (next(x for x in r["runs"] if x["jobs"] == j) for j in (1, 2))
    counts = ", ".join(f"{n} {v}" for v, n in sorted(one["verdicts"].items()))
    ok = bool(r["same_verdicts"]) and not one["verdicts"].get("discrepancy") and one["pairs"] == two["pairs"]
    return [(label, ok, f"{one['pairs']} pairs ({counts}); {one['wall']:.2f} s with 1 job, {two['wall']:.2f} s with "
             f"2 (speedup {r['speedup']:.2f}); verdicts {'the same' if r['same_verdicts'] else 'DIFFER'}")]


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
    floor_of = {n: by.get(n, {}).get("floor", {}).get("floor", {}).get("total") for n in ("405b-64", "405b-1L-64")}
    f126 = floor_of["405b-64"]
    out.append(_ratio("405B forward, 126 layers, 64 devices: wall / parse floor", wall("405b-64"), f126, FLOOR_RATIO))
    w126, w1, f1 = wall("405b-64"), wall("405b-1L-64"), floor_of["405b-1L-64"]
    label = "126 vs 1 layer time ratio beyond the parse floor's own growth ((wall ratio) / (floor ratio))"
    if None in (w126, w1, f126, f1) or not (w1 and f1 and f126):
        out.append((f"{label} <= {DEPTH_RATIO:g}", None, "not measured (a case is missing, timed out or failed)"))
    else:
        assert w126 is not None and w1 is not None and f126 is not None and f1 is not None
        beyond = (w126 / w1) / (f126 / f1)
        out.append((f"{label} <= {DEPTH_RATIO:g}", beyond <= DEPTH_RATIO,
                    f"{beyond:.2f} (wall {w126:.2f} s / {w1:.2f} s = {w126 / w1:.1f}; floor {f126:.3f} s / "
                    f"{f1:.3f} s = {f126 / f1:.1f})"))
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
    if any(r.get("spec", {}).get("train") for r in results):  # the issue's train-step targets
        for label, ok, measured in bench_train.train_targets(results):
            mark = "MET" if ok else ("not measured" if ok is None else "NOT MET")
            lines.append(f"- [{'x' if ok else ' '}] train step: {label}: **{mark}** — {measured}")
        for label, ok, measured in bench_train.train_ratios(results):
            mark = "within" if ok else ("not measured" if ok is None else "above")
            lines.append(f"- (information, train step) {label}: {mark} — {measured}")
    if passes_results(results):
        for label, ok, measured in passes_targets(results):
            mark = "MET" if ok else ("not measured" if ok is None else "NOT MET")
            lines.append(f"- [{'x' if ok else ' '}] {label}: **{mark}** — {measured}")
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


def _passes_section(results: Sequence[dict[str, Any]]) -> str:
    return f"""
## Passes over an XLA dump (`scalify-hlo passes`, `scalify_hlo.passes.check_dump`)

Every consecutive pass pair of XLA's whole pipeline dump (`--xla_dump_hlo_pass_re=.*`, large constants in full)
of an unrolled Llama train step (loss, `jax.value_and_grad`, optax AdamW; params in the dtype the case names) at
the test fixtures' widths (`llama.TINY`: the instruction count of a real step, small files), compiled to the end
on fake CPU devices (`tools/bench_programs.py gen-passes`, cached under `out/bench/<key>/dump/`, not timed). One
fresh process per `--jobs` setting, imports excluded; the jobs=2 time includes starting its two spawned worker
processes (each imports the prover). Every pair is one `prove()` under its default time limit. `same verdicts`:
the two runs agree pair by pair.

{passes_table(results)}

Pairs not proven equivalent (jobs=1):

{passes_findings(results)}
"""


def write_reports(results: list[dict[str, Any]], timeout: float, repeat: int = 1,
                  stored: dict[str, Any] | None = None, *, md_path: Path = BENCH_MD, results_path: Path = RESULTS) -> str:
    """BENCH.md and results.json of this run; with ``stored`` (a results.json), BENCH.md re-rendered from it."""
    if stored is None:
        m = machine()
        m["command"] = " ".join(["python", "tools/bench.py", *sys.argv[1:]])
        results_path.parent.mkdir(parents=True, exist_ok=True)
        results_path.write_text(json.dumps({"machine": m, "timeout": timeout, "repeat": repeat, "cases": results},
                                      indent=2) + "\n")
    else:
        m = stored["machine"]
    cases = "\n".join(f"- `{r['name']}` ({r['key']}): {r['what']}" for r in results)
    verified = verify_results(results)
    # --md may be relative to the working directory: resolved before it is shown relative to the repo
    raw = results_path.resolve().relative_to(REPO) if results_path.resolve().is_relative_to(REPO) else results_path
    dirty = " (with uncommitted changes)" if m.get("dirty") else ""
    text = f"""# BENCH — scalify-hlo at scale

Written by `tools/bench.py` (`{m.get('command', 'python tools/bench.py')}`); raw data in
`{raw}`. Pairs generated by {m['generator']}.

Machine: {m['cores']} cores ({m['cpu']}), {m['ram_gib']} GiB RAM; Python {m['python']}, jax {m['jax']}
(jaxlib {m['jaxlib']}), egglog {m['egglog']}; {m['date']}, commit {m['commit']}{dirty}; load average at the
end {m['load_average']} (1, 5, 15 min: other work on the machine shows up in every time below).

Programs: Llama-3.1 decoder stacks (`tools/programs/llama.py`: RMSNorm, RoPE, GQA causal attention, SwiGLU)
at the real widths, seq {bp.SEQ}, batch = fsdp devices, float32, MaxText-style FSDP x TP specs, Shardy;
train steps (`*-train-*`, `tools/programs/llama_train.py`): mean-square loss of the stack, `jax.value_and_grad`,
optax AdamW with the moments sharded like the params, {bp.TRAIN_DTYPE} params and residual stream;
before = `jax.jit(...).lower(...).as_text(debug_info=True)`, after = XLA's `after_spmd-partitioning` dump.

{cases}

## Targets

{targets_text(results)}

## Verify (fresh process per case; imports excluded from every clock)

`wall` is the `prove()` call; the stage columns are `report.stats["stages"]`; `other` = `stats["seconds"]`
minus the stages (time the prover spends outside its named stages); `floor` = XLA parse + HLO→StableHLO +
MLIR parse of both files (table below); timeout {timeout:.0f} s per case; fastest of {repeat} fresh run(s).
`segments u/t`: e-graph questions built / asked; `layers t/s`: layer memoization's templates (segments read
once over fresh leaves) / segments given a template's facts instead of being derived (`prove/layers.py`).

{results_table(verified)}

## Parse floor (seconds; same files, same run)

{floor_table(verified)}

## Generation (cached under `out/bench/<key>/`; not part of any verify time)

Worker process: jax import, lowering (jit trace + StableHLO), compile until XLA has written the
`after_spmd-partitioning` dump, then killed (XLA's CPU optimisation and codegen never run).

{generation_table(verified)}
"""
    if passes_results(results):
        text += _passes_section(results)
    md_path.write_text(text)
    return text
