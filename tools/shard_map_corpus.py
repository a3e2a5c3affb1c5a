#!/usr/bin/env python
"""Run the shard_map corpus of issue 12 through the verifier and print the table.

    python tools/shard_map_corpus.py                      # every program: Markdown table, totals, reasons
    python tools/shard_map_corpus.py --only tut_matmul_basic --only smt_pmax --json corpus.json
    python tools/shard_map_corpus.py --truth-only         # check the corpus itself (no verifier)

The corpus (tools/programs/shard_map_corpus.py) holds jnp references paired with shard_map bodies, written
after JAX's shard_map tutorial and tests/shard_map_test.py. For each program: both run with JAX on 8 fake
CPU devices on random inputs (three seeds) to establish the truth (SAME, DIFFERENT, AMBIGUOUS or INVALID);
both are lowered (the reference under `jit` on unsharded shapes, `jit(shard_map(body, check_vma=False))`
on sharded ones, `as_text(debug_info=True)`) and `scalify_hlo.verify` compares them. A correct program whose
truth is not SAME is a bug of the corpus (reported as `corpus_error`), as is a deliberately wrong twin
whose truth is not DIFFERENT.

Columns: the verdict; the seconds of analysis (verify only); how the proof went: "symbolic" (one pass over
the body), "case split over AXIS" (the body derived once per coordinate along a mesh axis,
prove/cases.py), "per device" (once per device, prove/per_device.py), with "tried ..." when a split was
attempted but left the result open; the reason of an unknown. The report carries no marker of a case
split, so this tool watches the two entry points while it verifies (a wrapper, not a change to the
prover). Outcomes: a correct program is `proven`, `unknown`, `false_discrepancy`, `timeout` or `exception`;
a wrong twin is `caught` (at its `# BUG:` line), `caught_elsewhere` (another line), `missed` (unknown) or
`false_equivalent`.
"""

from __future__ import annotations

import os

# Must precede the first `import jax`: 8 fake CPU devices.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import collections
import contextlib
import inspect
import json
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from fuzz_verdicts import SLOW_SECONDS, WallTimeout, compare, wall_limit  # noqa: E402
from programs.shard_map_corpus import REGISTRY  # noqa: E402
from programs.shard_map_corpus_spec import Arg, Program  # noqa: E402
from scalify_hlo.rules.facts import Failed  # noqa: E402

import scalify_hlo  # noqa: E402
from scalify_hlo.ir.errors import ScalifyError  # noqa: E402
from scalify_hlo.prove import cases, per_device  # noqa: E402

SEEDS = (0, 1, 2)
INT_RANGE = (-4, 5)  # small integers: sums stay far from overflow, ties and signs of both kinds are common
RTOL, LOOSE = 1e-4, 1e-2  # SAME within RTOL (atol scaled to the output), DIFFERENT beyond LOOSE
BUDGET, HARD_LIMIT = 5.0, 60.0  # the verifier's own timeout; the wall limit that cuts a runaway short


@dataclass
class Row:
    name: str
    origin: str
    bug: bool
    mesh: str
    truth: str
    verdict: str
    seconds: float
    how: str
    reason: str
    outcome: str
    named: str | None = None  # a discrepancy's first named source line
    bug_line: str | None = None  # a wrong twin's `# BUG:` line
    notes: list[str] = field(default_factory=list)
    error: str | None = None


def is_spec(x: Any) -> bool:
    return isinstance(x, P)


def mesh_of(prog: Program) -> Mesh:
    shape = tuple(n for _, n in prog.mesh)
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return Mesh(devices, tuple(a for a, _ in prog.mesh), axis_types=(AxisType.Auto,) * len(shape))


def _is_leaf(x: Any) -> bool:
    return isinstance(x, Arg | np.ndarray)


def per_leaf(fn: Callable[[Any, Any], Any], specs: Sequence[Any], trees: Sequence[Any]) -> list[Any]:
    """fn(spec, leaf) over the leaves (`Arg`s or arrays) of each argument, whose spec is a pytree prefix of it
    (as shard_map reads in_specs)."""
    return [jax.tree.map(lambda s, sub: jax.tree.map(lambda leaf: fn(s, leaf), sub, is_leaf=_is_leaf),
                         spec, tree, is_leaf=is_spec) for spec, tree in zip(specs, trees, strict=True)]


def random_inputs(prog: Program, seed: int) -> list[Any]:
    rng = np.random.default_rng(seed)

    def draw(a: Arg) -> np.ndarray:
        if a.dtype == "int32":
            return np.asarray(rng.integers(*INT_RANGE, size=a.shape), dtype=np.int32)
        if a.dtype == "bool":
            return np.asarray(rng.random(a.shape) < 0.5)
        return np.asarray(rng.standard_normal(a.shape), dtype=np.float32)

    return [jax.tree.map(draw, t, is_leaf=_is_leaf) for t in prog.inputs]


def shard_mapped(prog: Program, mesh: Mesh) -> Callable[..., Any]:
    return jax.shard_map(prog.body, mesh=mesh, in_specs=prog.in_specs, out_specs=prog.out_specs, check_vma=False)


def truth_of(prog: Program, mesh: Mesh) -> tuple[str, float]:
    """Both programs on every seed's inputs (the shard_map's placed by its in_specs): SAME only if all agree."""
    ref_fn, impl_fn = jax.jit(prog.ref, keep_unused=True), jax.jit(shard_mapped(prog, mesh), keep_unused=True)
    verdicts, worst = [], 0.0
    for seed in SEEDS:
        inputs = random_inputs(prog, seed)
        refs = [np.asarray(r) for r in jax.tree.leaves(ref_fn(*inputs))]
        placed = per_leaf(lambda s, x: jax.device_put(x, NamedSharding(mesh, s)), prog.in_specs, inputs)
        outs = [np.asarray(o) for o in jax.tree.leaves(impl_fn(*placed))]
        v, w = compare(refs, outs, rtol=RTOL, loose=LOOSE)
        verdicts.append(v)
        worst = max(worst, w) if not math.isnan(w) else worst
    for v in ("INVALID", "DIFFERENT", "AMBIGUOUS"):
        if v in verdicts:
            return v, worst
    return "SAME", worst


def lower_pair(prog: Program, mesh: Mesh) -> tuple[str, str]:
    """before = jit(ref) lowered on unsharded shapes; after = jit(shard_map(body)) lowered on sharded ones."""
    plain = [jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype)), t, is_leaf=_is_leaf)
             for t in prog.inputs]
    placed = per_leaf(lambda s, a: jax.ShapeDtypeStruct(a.shape, np.dtype(a.dtype), sharding=NamedSharding(mesh, s)),
                      prog.in_specs, list(prog.inputs))
    # keep_unused: a body may not read an input the reference reads (both keep every parameter)
    before = jax.jit(prog.ref, keep_unused=True).lower(*plain).as_text(debug_info=True)
    after = jax.jit(shard_mapped(prog, mesh), keep_unused=True).lower(*placed).as_text(debug_info=True)
    return before, after


# ------------------------------------------------------------------------------------ how it was proven


def _closed(results: Sequence[Any]) -> bool:
    """No result left unknown (the test prove/derive.py applies to accept a case split)."""
    return not any(isinstance(f, Failed) and not f.evidence for f in results)


@contextlib.contextmanager
def watch_splits() -> Iterator[list[tuple[str, bool]]]:
    """Record each case split the prover attempts while the block runs: (what, whether it closed every
    result). derive.py calls both through their modules (`cases.derive_cases`, `per_device.derive_per_device`),
    so replacing the module attributes for the duration sees every call."""
    seen: list[tuple[str, bool]] = []
    orig_cases, orig_devices = cases.derive_cases, per_device.derive_per_device

    def by_axis(d: Any, region: Any, args: Any, axis: str, declared: Any) -> Any:
        out = orig_cases(d, region, args, axis, declared)
        seen.append((f"case split over {axis}", _closed(out[0])))
        return out

    def by_device(d: Any, region: Any, args: Any, declared: Any) -> Any:
        out = orig_devices(d, region, args, declared)
        seen.append(("per device", _closed(out[0])))
        return out

    cases.derive_cases, per_device.derive_per_device = by_axis, by_device  # type: ignore[assignment]
    try:
        yield seen
    finally:
        cases.derive_cases, per_device.derive_per_device = orig_cases, orig_devices  # type: ignore[assignment]


def how_of(seen: Sequence[tuple[str, bool]]) -> str:
    used = [what for what, closed in seen if closed]
    if used:
        return used[-1]
    tried = sorted({what for what, _ in seen})
    return "symbolic" + (f" (tried {', '.join(tried)})" if tried else "")


# --------------------------------------------------------------------------------------------- one program


def bug_line(prog: Program) -> str | None:
    """`file:line` of the `# BUG:` comment in a wrong twin's body (file relative to the repository)."""
    lines, start = inspect.getsourcelines(prog.body)
    for k, text in enumerate(lines):
        if "# BUG:" in text:
            path = Path(inspect.getsourcefile(prog.body) or "").resolve()
            rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
            return f"{rel}:{start + k}"
    return None


def _same_line(named: str | None, expected: str | None) -> bool:
    if named is None or expected is None or ":" not in named:
        return False
    (nf, nl), (ef, el) = named.rsplit(":", 1), expected.rsplit(":", 1)
    return Path(nf).name == Path(ef).name and nl.split(":")[0] == el


def outcome_of(prog: Program, truth: str, verdict: str, named: str | None, expected: str | None) -> str:
    if verdict in ("scalify_error", "crash"):
        return "exception"
    if verdict == "timeout":
        return "timeout"
    if prog.bug:
        if truth != "DIFFERENT":
            return "corpus_error"
        return {"equivalent": "false_equivalent", "unknown": "missed"}.get(
            verdict, "caught" if _same_line(named, expected) else "caught_elsewhere")
    if truth != "SAME":
        return "corpus_error"
    return {"equivalent": "proven", "discrepancy": "false_discrepancy"}.get(verdict, "unknown")


def check(prog: Program, budget: float = BUDGET, hard_limit: float = HARD_LIMIT, verify: bool = True) -> Row:
    mesh_text = "x".join(str(n) for _, n in prog.mesh) + " (" + ",".join(a for a, _ in prog.mesh) + ")"
    base: dict[str, Any] = {"name": prog.name, "origin": prog.origin, "bug": prog.bug, "mesh": mesh_text,
                            "bug_line": bug_line(prog) if prog.bug else None}
    try:
        mesh = mesh_of(prog)
        truth, _worst = truth_of(prog, mesh)
        before, after = lower_pair(prog, mesh)
    except Exception as err:  # JAX rejects the pair: the corpus is wrong
        return Row(**base, truth="INVALID", verdict="-", seconds=0.0, how="-", outcome="corpus_error",
                   reason=f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300],
                   error=traceback.format_exc(limit=-4))
    if not verify:
        ok = truth == ("DIFFERENT" if prog.bug else "SAME")
        return Row(**base, truth=truth, verdict="-", seconds=0.0, how="-", reason="",
                   outcome="truth_ok" if ok else "corpus_error")
    t0 = time.perf_counter()
    notes: list[str] = []
    named = error = None
    with watch_splits() as seen:
        try:
            with wall_limit(hard_limit):
                report = scalify_hlo.verify(before, after, timeout=budget)
            verdict, reason, notes = report.name, report.verdict.reason, list(report.notes)
            if verdict == "discrepancy" and report.findings and report.findings[0].after is not None:
                named = report.findings[0].after.source
                named = named.removeprefix(str(REPO) + "/") if named else named
        except WallTimeout as err:
            verdict, reason = "timeout", str(err)
        except ScalifyError as err:
            verdict, reason, error = "scalify_error", f"{type(err).__name__}: {err.message}", traceback.format_exc(-8)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # a Rust panic in egglog is a BaseException
            verdict, reason, error = "crash", f"{type(err).__name__}: {err}"[:500], traceback.format_exc(limit=-8)
    seconds = time.perf_counter() - t0
    if verdict not in ("timeout", "scalify_error", "crash") and seconds > SLOW_SECONDS:
        verdict = "timeout"
    outcome = outcome_of(prog, truth, verdict, named, base["bug_line"])
    return Row(**base, truth=truth, verdict=verdict, seconds=round(seconds, 3), how=how_of(seen),
               reason=reason if verdict != "equivalent" else "", outcome=outcome, named=named, notes=notes,
               error=error)


# ---------------------------------------------------------------------------------------------- reports


def _cell(text: str) -> str:
    return text.replace(str(REPO) + "/", "").replace("|", "\\|").replace("\n", " ")


def table(rows: Sequence[Row]) -> str:
    out = ["| program | truth | verdict | seconds | how | outcome | reason (unknown) / line (discrepancy) |",
           "|---|---|---|---:|---|---|---|"]
    for r in rows:
        detail = r.reason.replace(str(REPO) + "/", "")[:100] if r.verdict not in ("equivalent", "discrepancy") else (r.named or "")
        if r.bug and r.bug_line and r.verdict == "discrepancy":
            detail = f"{r.named} (BUG at {r.bug_line.rsplit('/', 1)[-1]})"
        name = r.name + (" (bug twin)" if r.bug else "")
        out.append(f"| {name} | {r.truth} | {r.verdict} | {r.seconds:.2f} | {r.how} | {r.outcome} | {_cell(detail)} |")
    return "\n".join(out)


def totals(rows: Sequence[Row]) -> dict[str, Any]:
    correct = [r for r in rows if not r.bug]
    twins = [r for r in rows if r.bug]
    count = collections.Counter(r.outcome for r in rows)
    proven = [r for r in correct if r.outcome == "proven"]
    return {
        "programs": len(correct),
        "proven_equivalent": len(proven),
        "proven_share": round(len(proven) / len(correct), 3) if correct else 0.0,
        "proven_within_1s": sum(1 for r in proven if r.seconds <= 1.0),
        "proven_by_case_split": sum(1 for r in proven if r.how != "symbolic" and not r.how.startswith("symbolic")),
        "unknown": count["unknown"],
        "false_discrepancy": count["false_discrepancy"],
        "bug_twins": len(twins),
        "bugs_caught_at_line": count["caught"],
        "bugs_caught_elsewhere": count["caught_elsewhere"],
        "bugs_missed": count["missed"],
        "false_equivalent": count["false_equivalent"],
        "timeouts": count["timeout"],
        "exceptions": count["exception"],
        "corpus_errors": count["corpus_error"],
        "max_seconds": round(max((r.seconds for r in rows), default=0.0), 2),
        "mean_seconds": round(sum(r.seconds for r in rows) / len(rows), 3) if rows else 0.0,
    }


def reasons(rows: Sequence[Row]) -> dict[str, list[str]]:
    """Unknown correct programs grouped by their reason, numbers and quoted names blurred so that one
    construct's reasons fall together."""
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for r in rows:
        if r.outcome in ("unknown", "timeout", "exception", "missed"):
            key = re.sub(r"\d+", "N", r.reason.replace(str(REPO) + "/", ""))
            key = re.sub(r"%[\w#.]+", "%v", re.sub(r" ?\(\S+\.py:N\)", "", key))[:120]
            groups[key].append(r.name)
    return dict(sorted(groups.items(), key=lambda kv: -len(kv[1])))


def warm_up() -> None:
    """One small verification before the timed ones: the first call pays for imports and egglog's start-up,
    which is no program's analysis time."""
    check(REGISTRY["tut_psum_invariant_out"])


def report(rows: Sequence[Row], footer: str) -> str:
    """The table, the totals and the unproven programs grouped by reason, as Markdown."""
    out = [table(rows), "", "| total | value |", "|---|---:|"]
    out += [f"| {k} | {v} |" for k, v in totals(rows).items()]
    groups = reasons(rows)
    if groups:
        out += ["", "Not proven, grouped by reason:", ""]
        out += [f"- ({len(names)}) {key}: {', '.join(names)}" for key, names in groups.items()]
    return "\n".join([*out, "", footer])


def run(names: Sequence[str], verify: bool = True, log: Callable[[str], None] = print) -> list[Row]:
    if verify:
        warm_up()
    rows = []
    for name in names:
        row = check(REGISTRY[name], verify=verify)
        log(f"  {row.name}: truth {row.truth}, {row.verdict} in {row.seconds:.2f}s ({row.how}) -> {row.outcome}"
            + (f": {row.reason[:120]}" if row.outcome not in ("proven", "caught", "truth_ok") else ""))
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME", help="run this program (repeatable)")
    ap.add_argument("--json", type=Path, help="write every row and the totals here")
    ap.add_argument("--truth-only", action="store_true", help="only run both sides with JAX (check the corpus)")
    ap.add_argument("--render", type=Path, metavar="JSON", help="print the report of a saved --json run (no run)")
    args = ap.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        print(report([Row(**r) for r in saved["rows"]], f"saved run, jax {saved.get('jax')}"))
        return 0
    unknown = [n for n in args.only if n not in REGISTRY]
    if unknown:
        ap.error(f"no such program: {', '.join(unknown)} (known: {', '.join(REGISTRY)})")
    if jax.device_count() < 8:
        ap.error("jax was initialised with fewer than 8 devices")
    started = time.perf_counter()
    rows = run(args.only or list(REGISTRY), verify=not args.truth_only, log=lambda s: print(s, file=sys.stderr))
    wall = time.perf_counter() - started
    if args.truth_only:
        bad = [r for r in rows if r.outcome != "truth_ok"]
        for r in bad:
            print(f"{r.name}: truth {r.truth} {r.reason}")
        print(f"{len(rows) - len(bad)} of {len(rows)} pairs as expected ({wall:.0f} s)")
        return 1 if bad else 0
    summary, groups = totals(rows), reasons(rows)
    print(report(rows, f"wall {wall:.0f} s, jax {jax.__version__}"))
    if args.json:
        args.json.write_text(json.dumps({"totals": summary, "rows": [asdict(r) for r in rows],
                                         "reasons": groups, "jax": jax.__version__}, indent=1))
    failed = summary["false_equivalent"] + summary["false_discrepancy"] + summary["corpus_errors"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
