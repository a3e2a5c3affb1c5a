#!/usr/bin/env python
"""Differential soundness fuzzer: scalify-hlo's verdicts against what JAX/XLA actually compute.

    python tools/fuzz.py --seed 0 --programs 200 --seconds 900 --mutants 1000 --json fuzz.json
    python tools/fuzz.py --replay program.py          # one program (e.g. a failure's source) again

Part 1, programs: random shard_map programs over random meshes (1-3 axes, at most 8 devices), each with
a plain-jnp reference (tools/fuzz_programs.py). Every program gives a CORRECT pair (the body computes the
reference's block by construction) and a PERTURBED pair (one wrong axis, reducer, permutation, offset,
operand order, constant, trip count, out_spec, or a missing collective). Both sides run with JAX on 8 fake
CPU devices on several random inputs: that is the truth, SAME or DIFFERENT (AMBIGUOUS when float results
differ by more than reassociation should but less than a real change does; INVALID when JAX rejects a
perturbed program). Both are lowered (`as_text(debug_info=True)`, the reference without shardings, the
body under `jit(shard_map(...))` on sharded inputs) and given to `scalify_hlo.verify` in this process.

Part 2, mutants: the correct partitioned fixtures (tests/fixtures/*/after.hlo, verdict equivalent, XLA's
own partitioner output) get one text mutation each (replica groups, collective-permute pairs, offset
tables, scalar constants, operand order, dims, all-reduce/reduce-scatter reducers, while trip counts; not
a reduction's init or an integer constant of a loop body: XLA leaves the first undefined, the second can
make a loop that never ends). Mutants XLA parses are run by XLA on 8 fake devices (the runner of
tools/gen_fixtures, the in/out shardings from rebuilding the fixture with gen_fixtures.build) on the
fixture's oracle.npz inputs and two random input sets like them; a mutant whose outputs differ from the
unmutated program's on any of them is CONFIRMED, and the verifier must never call it equivalent. (A mutant
with the same outputs that the verifier calls a discrepancy is only listed: the verifier's counterexamples
come from inputs of its own.) A mutant whose XLA run exceeds --exec-limit ends the soak with its report.

Outcomes: false_equivalent (equivalent, truth DIFFERENT), false_discrepancy (discrepancy, truth SAME),
timeout (over 30 s, or over --timeout-wall, where the run is cut short), exception (any Python exception;
a ScalifyError counts too, since JAX/XLA compiled the program), unknown. The JSON report holds every
failing program's source (a module that --replay runs again and that can become a fixture) and every
failing mutant's diff. Exit code 1 when anything failed.
"""

from __future__ import annotations

import os

# Must precede the first `import jax` (here or in gen_fixtures): 8 fake CPU devices. Run as a script, XLA
# also skips its LLVM optimisations: thousands of one-off executables compile ~3x faster, same results.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
if __name__ == "__main__" and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import collections
import contextlib
import difflib
import hashlib
import importlib.util
import json
import math
import re
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import fuzz_programs  # noqa: E402

import scalify_hlo  # noqa: E402
from scalify_hlo.ir.errors import ScalifyError  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
TRUTH_SEEDS = 3
SLOW_SECONDS = 30.0  # a verification slower than this is a `timeout` (the soundness issue's limit)
INT_RANGE = (-4, 5)  # integer inputs: small, so sums and products stay far from overflow and ties are common

OUTCOMES = ("ok", "false_equivalent", "false_discrepancy", "timeout", "exception")


# ================================================================================================ shared


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


def run_verify(before: str, after: str, budget: float, hard_limit: float) -> Verdict:
    """scalify_hlo.verify in this process, classified; never raises (a Rust panic is a BaseException)."""
    t0 = time.perf_counter()
    try:
        with wall_limit(hard_limit):
            report = scalify_hlo.verify(before, after, timeout=budget)
        dt = time.perf_counter() - t0
        name = "timeout" if dt > SLOW_SECONDS else report.name
        return Verdict(name, report.verdict.reason, dt)
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


# ============================================================================================== programs


@dataclass
class PairResult:
    id: str
    pair: str  # correct | perturbed
    perturbation: str | None
    steps: list[str]
    mesh: dict[str, int]
    truth: str  # SAME | DIFFERENT | AMBIGUOUS | INVALID
    max_abs_diff: float | None
    verdict: str
    reason: str
    seconds: float
    outcome: str
    source: str | None = None
    error: str | None = None


def load_program(text: str, workdir: Path, stem: str) -> ModuleType:
    """Import the rendered program from a real file (so the lowered IR's locations name its lines)."""
    path = workdir / f"{stem}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(stem, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def mesh_of(shape: dict[str, int]) -> Mesh:
    n = int(np.prod(list(shape.values())))
    devices = np.array(jax.devices()[:n]).reshape(tuple(shape.values()))
    return Mesh(devices, tuple(shape), axis_types=(AxisType.Auto,) * len(shape))


def random_inputs(mod: ModuleType, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for _name, shape, dtype, _spec in mod.INPUTS:
        if dtype == "int32":
            out.append(rng.integers(*INT_RANGE, size=shape).astype(np.int32))
        else:
            out.append(rng.standard_normal(shape).astype(np.float32))
    return out


def truth_of(mod: ModuleType, mesh: Mesh, seeds: Sequence[int]) -> tuple[str, float]:
    """Run the reference (jit, one device, global inputs) and the shard_map (jit, inputs placed by their
    in_specs) on every seed's inputs: SAME only if every run agrees."""
    ref_fn = jax.jit(mod.ref, keep_unused=True)
    impl_fn = jax.jit(mod.impl(mesh), keep_unused=True)
    shardings = [NamedSharding(mesh, spec) for *_, spec in mod.INPUTS]
    verdicts, worst = [], 0.0
    for seed in seeds:
        inputs = random_inputs(mod, seed)
        refs = [np.asarray(r) for r in jax.tree.leaves(ref_fn(*inputs))]
        placed = [jax.device_put(x, s) for x, s in zip(inputs, shardings, strict=True)]
        outs = [np.asarray(o) for o in jax.tree.leaves(impl_fn(*placed))]
        v, w = compare(refs, outs, rtol=1e-5, loose=1e-3)
        verdicts.append(v)
        worst = max(worst, w) if not math.isnan(w) else worst
    for v in ("INVALID", "DIFFERENT", "AMBIGUOUS"):
        if v in verdicts:
            return v, worst
    return "SAME", worst


def lower_pair(mod: ModuleType, mesh: Mesh) -> tuple[str, str]:
    """before = jit(ref) lowered on unsharded shapes; after = jit(shard_map body) lowered on sharded ones."""
    plain = [jax.ShapeDtypeStruct(shape, np.dtype(dtype)) for _n, shape, dtype, _s in mod.INPUTS]
    placed = [jax.ShapeDtypeStruct(shape, np.dtype(dtype), sharding=NamedSharding(mesh, spec))
              for _n, shape, dtype, spec in mod.INPUTS]
    # keep_unused: a perturbed body may not read an input the reference reads (both keep every parameter)
    before = jax.jit(mod.ref, keep_unused=True).lower(*plain).as_text(debug_info=True)
    after = jax.jit(mod.impl(mesh), keep_unused=True).lower(*placed).as_text(debug_info=True)
    return before, after


def check_pair(text: str, ident: str, pair: str, perturbation: str | None, program: fuzz_programs.Program,
               workdir: Path, budget: float, hard_limit: float) -> PairResult:
    steps = [s.kind for s in program.steps]
    base = {"id": ident, "pair": pair, "perturbation": perturbation, "steps": steps, "mesh": program.mesh}
    try:
        mod = load_program(text, workdir, re.sub(r"\W", "_", ident))
        mesh = mesh_of(mod.MESH)
        truth, worst = truth_of(mod, mesh, range(TRUTH_SEEDS))
        before, after = lower_pair(mod, mesh) if truth != "INVALID" else ("", "")
    except Exception as err:  # JAX rejects the program (a perturbation that breaks shapes)
        outcome = "generator_error" if pair == "correct" else "invalid"
        return PairResult(**base, truth="INVALID", max_abs_diff=None, verdict="-", reason=f"{type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''}"[:300], seconds=0.0, outcome=outcome,
                          source=text if outcome == "generator_error" else None,
                          error=traceback.format_exc(limit=-4) if outcome == "generator_error" else None)
    if truth == "INVALID":
        return PairResult(**base, truth=truth, max_abs_diff=None, verdict="-", reason="output shapes differ",
                          seconds=0.0, outcome="invalid")
    if pair == "correct" and truth == "DIFFERENT":  # the generator's construction is wrong, not the verifier
        return PairResult(**base, truth=truth, max_abs_diff=worst, verdict="-", reason="correct pair differs",
                          seconds=0.0, outcome="generator_error", source=text)
    v = run_verify(before, after, budget, hard_limit)
    outcome = outcome_of(truth, v.name)
    return PairResult(**base, truth=truth, max_abs_diff=worst, verdict=v.name, reason=v.reason, seconds=v.seconds,
                      outcome=outcome, source=text if outcome != "ok" else None, error=v.error)


@dataclass
class ProgramSummary:
    programs: int = 0
    results: list[PairResult] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, pred: Callable[[PairResult], bool]) -> int:
        return sum(1 for r in self.results if pred(r))

    @property
    def verified(self) -> list[PairResult]:
        return [r for r in self.results if r.verdict != "-"]

    def counts(self) -> dict[str, Any]:
        verified = self.verified
        unknown = sum(1 for r in verified if r.verdict == "unknown")
        return {
            "programs": self.programs,
            "pairs": len(self.results),
            "pairs_verified": len(verified),
            "correct_pairs": self.count(lambda r: r.pair == "correct" and r.verdict != "-"),
            "perturbed_pairs": self.count(lambda r: r.pair == "perturbed" and r.verdict != "-"),
            "truly_different": self.count(lambda r: r.verdict != "-" and r.truth == "DIFFERENT"),
            "truly_same": self.count(lambda r: r.verdict != "-" and r.truth == "SAME"),
            "ambiguous": self.count(lambda r: r.verdict != "-" and r.truth == "AMBIGUOUS"),
            "invalid_perturbations": self.count(lambda r: r.outcome == "invalid"),
            "generator_errors": self.count(lambda r: r.outcome == "generator_error"),
            "equivalent": self.count(lambda r: r.verdict == "equivalent"),
            "discrepancy": self.count(lambda r: r.verdict == "discrepancy"),
            "unknown": unknown,
            "unknown_share": round(unknown / len(verified), 3) if verified else 0.0,
            "false_equivalent": self.count(lambda r: r.outcome == "false_equivalent"),
            "false_discrepancy": self.count(lambda r: r.outcome == "false_discrepancy"),
            "timeouts": self.count(lambda r: r.outcome == "timeout"),
            "exceptions": self.count(lambda r: r.outcome == "exception"),
            "exceptions_scalify_error": self.count(lambda r: r.verdict == "scalify_error"),
            "exceptions_crash": self.count(lambda r: r.verdict == "crash"),
            "max_verify_seconds": round(max((r.seconds for r in verified), default=0.0), 2),
            "mean_verify_seconds": round(sum(r.seconds for r in verified) / len(verified), 3) if verified else 0.0,
            "wall_seconds": round(self.seconds, 1),
        }


def run_programs(seed: int, n_programs: int, seconds: float, *, budget: float = 10.0, hard_limit: float = 120.0,
                 log: Callable[[str], None] = print) -> ProgramSummary:
    """Part 1: up to `n_programs` programs (each a correct and a perturbed pair) or `seconds`, whichever
    ends first."""
    summary = ProgramSummary()
    t0 = time.perf_counter()
    try:
        _fuzz_programs(summary, seed, n_programs, seconds, budget, hard_limit, log, t0)
    except KeyboardInterrupt:
        log("  interrupted: reporting the programs so far")
    summary.seconds = time.perf_counter() - t0
    return summary


def _fuzz_programs(summary: ProgramSummary, seed: int, n_programs: int, seconds: float, budget: float,
                   hard_limit: float, log: Callable[[str], None], t0: float) -> None:
    with tempfile.TemporaryDirectory(prefix="scalify_fuzz_") as tmp:
        workdir = Path(tmp)
        for i in range(n_programs):
            if time.perf_counter() - t0 > seconds:
                break
            pseed = seed * 1_000_003 + i
            program = fuzz_programs.generate(pseed)
            summary.programs += 1
            pairs: list[tuple[str, str | None, str]] = [
                ("correct", None, program.render(title="correct pair"))]
            sites = program.perturbation_sites()
            if sites:
                rng = np.random.default_rng(pseed)
                site = sites[int(rng.integers(len(sites)))]
                kind = program.perturbation(site)
                pairs.append(("perturbed", kind, program.render(site, title=f"perturbed pair ({kind})")))
            for pair, kind, text in pairs:
                r = check_pair(text, f"p{pseed}_{pair}", pair, kind, program, workdir, budget, hard_limit)
                summary.results.append(r)
                if r.outcome not in ("ok", "invalid"):
                    log(f"  {r.id}: {r.outcome.upper()} truth {r.truth}, verdict {r.verdict}: {r.reason[:160]}")
            if i % 25 == 24:
                jax.clear_caches()  # thousands of one-off executables otherwise stay cached


# =============================================================================================== mutants

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "all-reduce-start", "all-gather-start")
_NON_COMMUTATIVE = ("subtract", "divide", "power", "remainder", "atan2", "compare")
_REDUCERS = {"add": ["maximum", "multiply"], "maximum": ["add", "minimum"], "minimum": ["maximum", "add"],
             "multiply": ["add"]}
MUTATION_KINDS = ("replica_groups", "permute_pairs", "offset_table", "scalar_constant", "swap_operands", "dims",
                  "reducer", "trip_count")


@dataclass
class Instr:
    """One HLO instruction line, split: enough to rewrite it."""

    line: int
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    computation: str


_HEAD_RE = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*")
_COMP_RE = re.compile(r"^(?:ENTRY\s+)?(%[\w.\-]+)\s")


def parse_instructions(text: str) -> list[Instr]:
    out, comp = [], ""
    for i, line in enumerate(text.split("\n")):
        if not line.startswith(" "):
            m = _COMP_RE.match(line)
            if m and line.rstrip().endswith("{"):
                comp = m.group(1)
            continue
        head = _HEAD_RE.match(line)
        if not head:
            continue
        rest = line[head.end():]
        op = re.search(r"(?<=[\s}\]])([a-z][a-z0-9\-]*)\(", " " + rest)
        if not op:
            continue
        start = op.end() - 1  # the "(" in " " + rest
        depth, j = 0, start
        s = " " + rest
        for j in range(start, len(s)):
            if s[j] == "(":
                depth += 1
            elif s[j] == ")":
                depth -= 1
                if depth == 0:
                    break
        args = s[start + 1:j]
        operands = [a.strip() for a in _split_top(args)] if args.strip() else []
        out.append(Instr(i, head.group(1), s[1:op.start()].strip(), op.group(1), operands, s[j + 1:], comp))
    return out


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _groups_of(line: str) -> list[list[int]] | None:
    """A collective's replica groups as explicit lists, whatever the spelling (explicit, iota, mesh)."""
    import gen_fixtures as gf

    if "replica_groups=mesh[" in line:
        line = gf._explicit_mesh_groups(line)
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    if m:
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
        return groups if groups and all(groups) else None
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        g, s = int(m.group(1)), int(m.group(2))
        dims = [int(x) for x in m.group(3).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(4):
            ids = ids.transpose([int(x) for x in m.group(4).split(",")])
        return ids.reshape(g, s).tolist()
    return None


_GROUPS_SPELLING = re.compile(r"replica_groups=(?:mesh\[[^\]]*\](?:,\s*device_ids=\([^)]*\))?\s*\{[^}]*\}|"
                              r"\{(?:\{[\d,]*\},?)*\}|\[\d+,\d+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")


def _with_groups(line: str, groups: list[list[int]]) -> str:
    spelled = "replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return _GROUPS_SPELLING.sub(lambda _m: spelled, line, count=1)


@dataclass
class Mutant:
    fixture: str
    kind: str
    what: str
    text: str
    changed: list[int]  # line numbers


def _replace_lines(text: str, changes: dict[int, str]) -> str:
    lines = text.split("\n")
    for i, new in changes.items():
        lines[i] = new
    return "\n".join(lines)


def mutation_sites(text: str) -> dict[str, list[Instr]]:
    instrs = parse_instructions(text)
    lines = text.split("\n")
    conds = {m.group(1) for ins in instrs if ins.opcode == "while"
             for m in [re.search(r"condition=(%[\w.\-]+)", ins.attrs)] if m}
    bodies = {m.group(1) for ins in instrs if ins.opcode == "while"
              for m in [re.search(r"body=(%[\w.\-]+)", ins.attrs)] if m}
    # A reduction's init must be its reducer's identity (XLA may drop it, e.g. over a size-1 dim): changing
    # the init, or the reducer under it, makes a program whose result XLA does not define.
    inits = {o for ins in instrs if ins.opcode in ("reduce", "reduce-window")
             for o in ins.operands[len(ins.operands) // 2:]}
    sites: dict[str, list[Instr]] = {k: [] for k in MUTATION_KINDS}
    for ins in instrs:
        line = lines[ins.line]
        if ins.opcode in _COLLECTIVES and "replica_groups=" in line and _groups_of(line):
            sites["replica_groups"].append(ins)
        if ins.opcode.startswith("collective-permute") and "source_target_pairs=" in line:
            sites["permute_pairs"].append(ins)
        if ins.opcode == "constant":
            if re.match(r"[su]\d+\[\d+\]", ins.type) and "{" in (ins.operands[0] if ins.operands else ""):
                sites["offset_table"].append(ins)
            elif re.match(r"(?:[fsu]\d+|bf16|pred)\[\]", ins.type):
                if ins.computation in conds and ins.type.startswith("s32"):
                    sites["trip_count"].append(ins)  # the bound: +-1 iteration
                elif ins.name not in inits and not (ins.computation in bodies and ins.type[0] in "su"):
                    # (an integer constant of a loop body may be the counter's step: 1 -> 0 never ends)
                    sites["scalar_constant"].append(ins)
        if ins.opcode in _NON_COMMUTATIVE and len(ins.operands) == 2:
            sites["swap_operands"].append(ins)
        if ins.opcode == "select" and len(ins.operands) == 3:
            sites["swap_operands"].append(ins)
        if ins.opcode in ("dynamic-slice", "dynamic-update-slice") and len(ins.operands) >= 3:
            sites["swap_operands"].append(ins)
        if ins.opcode == "concatenate" and len(ins.operands) >= 2:
            sites["swap_operands"].append(ins)
        if re.search(r"(?<![\w_])(dimensions|iota_dimension|lhs_contracting_dims|rhs_contracting_dims|"
                     r"lhs_batch_dims|rhs_batch_dims)=", ins.attrs):
            sites["dims"].append(ins)
        if ins.opcode in ("all-reduce", "reduce-scatter", "all-reduce-start") and "to_apply=" in ins.attrs:
            sites["reducer"].append(ins)
    return sites


def _rank(type_text: str) -> int:
    m = re.match(r"\w+\[([\d,]*)\]", type_text)
    return len([x for x in m.group(1).split(",") if x]) if m else 0


def mutate(name: str, text: str, kind: str, ins: Instr, rng: np.random.Generator) -> Mutant | None:
    """One random mutation of `kind` at `ins` (None when this site admits no change of this kind)."""
    lines = text.split("\n")
    line = lines[ins.line]

    def done(new_line: str, what: str) -> Mutant | None:
        if new_line == line:
            return None
        return Mutant(name, kind, f"{ins.name} ({ins.opcode}): {what}", _replace_lines(text, {ins.line: new_line}),
                      [ins.line])

    if kind == "replica_groups":
        groups = _groups_of(line)
        assert groups is not None
        g, s = len(groups), len(groups[0])
        flat = [d for grp in groups for d in grp]
        options = []
        if g >= 2 and s >= 1:
            options.append("swap_between")
        if s >= 2:
            options.append("permute_within")
        if g >= 2 and s >= 2 and ins.opcode.startswith("all-reduce"):
            options.append("transpose")
        if len(flat) >= 2:
            options.append("rotate")
        if not options:
            return None
        how = options[int(rng.integers(len(options)))]
        new = [list(grp) for grp in groups]
        if how == "swap_between":
            a, b = (int(x) for x in rng.choice(g, 2, replace=False))
            i, j = int(rng.integers(s)), int(rng.integers(s))
            new[a][i], new[b][j] = new[b][j], new[a][i]
        elif how == "permute_within":
            k = int(rng.integers(g))
            perm = rng.permutation(s)
            while s > 1 and (perm == np.arange(s)).all():
                perm = rng.permutation(s)
            new[k] = [new[k][int(p)] for p in perm]
        elif how == "transpose":
            new = np.array(groups).T.tolist()
        else:
            rolled = flat[1:] + flat[:1]
            new = [rolled[i * s:(i + 1) * s] for i in range(g)]
        return done(_with_groups(line, new), f"replica groups {groups} -> {new} ({how})")
    if kind == "permute_pairs":
        m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
        if not m:
            return None
        pairs = [tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", m.group(1))]
        how = str(rng.choice(["reverse", "drop", "swap_targets"]))
        if how == "reverse":
            new = [(t, s_) for s_, t in pairs]
        elif how == "drop" and len(pairs) > 1:
            k = int(rng.integers(len(pairs)))
            new = pairs[:k] + pairs[k + 1:]
        elif len(pairs) >= 2:
            a, b = (int(x) for x in rng.choice(len(pairs), 2, replace=False))
            new = list(pairs)
            new[a], new[b] = (pairs[a][0], pairs[b][1]), (pairs[b][0], pairs[a][1])
        else:
            return None
        spelled = "source_target_pairs={" + ",".join(f"{{{s_},{t}}}" for s_, t in new) + "}"
        return done(line.replace(m.group(0), spelled), f"pairs {pairs} -> {new} ({how})")
    if kind == "offset_table":
        m = re.search(r"constant\(\{([-\d,\s]*)\}\)", line)
        if not m:
            return None
        values = [int(v) for v in m.group(1).split(",") if v.strip()]
        if len(values) < 2:
            return None
        how = str(rng.choice(["swap", "bump", "roll"]))
        new = list(values)
        if how == "swap":
            a, b = (int(x) for x in rng.choice(len(values), 2, replace=False))
            new[a], new[b] = new[b], new[a]
        elif how == "bump":
            k = int(rng.integers(len(values)))
            new[k] += int(rng.choice([-1, 1]))
            if ins.type.startswith("u") and new[k] < 0:
                new[k] = 1
        else:
            new = values[1:] + values[:1]
        if new == values:
            return None
        return done(line.replace(m.group(0), "constant({" + ", ".join(map(str, new)) + "})"),
                    f"table {values} -> {new} ({how})")
    if kind in ("scalar_constant", "trip_count"):
        m = re.search(r"constant\(([^()]*)\)", line)
        if not m:
            return None
        old = m.group(1).strip()
        if ins.type.startswith("pred"):
            new = "false" if old == "true" else "true"
        elif ins.type.startswith(("s", "u")):
            v = int(old)
            new = str(v + int(rng.choice([-1, 1])) if v > 0 or ins.type.startswith("s") else v + 1)
        else:
            try:
                v = float(old)
            except ValueError:
                return None
            choice = int(rng.integers(3))
            nv = 0.0 if not math.isfinite(v) else (v * 1.5 + 0.25 if choice == 0 else -v if choice == 1 and v else v + 1)
            with np.errstate(over="ignore"):  # FLT_MAX * 1.5 is inf: still a valid (and changed) constant
                new = repr(float(np.float32(nv)))
        return done(line.replace(m.group(0), f"constant({new})"), f"constant {old} -> {new}")
    if kind == "swap_operands":
        ops = list(ins.operands)
        if ins.opcode == "select":
            i, j = 1, 2
        elif ins.opcode in ("dynamic-slice", "dynamic-update-slice"):
            first = 1 if ins.opcode == "dynamic-slice" else 2
            idx = list(range(first, len(ops)))
            if len(idx) < 2:
                return None
            i, j = (int(x) for x in rng.choice(idx, 2, replace=False))
        elif ins.opcode == "concatenate":
            i, j = (int(x) for x in rng.choice(len(ops), 2, replace=False))
        else:
            i, j = 0, 1
        if ops[i] == ops[j]:
            return None
        ops[i], ops[j] = ops[j], ops[i]
        new_args = ", ".join(ops)
        head = line[:line.index(ins.opcode + "(", line.index("=")) + len(ins.opcode) + 1]
        return done(head + new_args + ")" + ins.attrs, f"operands {i} and {j} swapped")
    if kind == "dims":
        attrs = list(re.finditer(r"(?<![\w_])(dimensions|iota_dimension|lhs_contracting_dims|rhs_contracting_dims|"
                                 r"lhs_batch_dims|rhs_batch_dims)=(\{[\d,]*\}|\d+)", ins.attrs))
        if not attrs:
            return None
        m = attrs[int(rng.integers(len(attrs)))]
        values = [int(v) for v in m.group(2).strip("{}").split(",") if v]
        rank = max(_rank(ins.type), max(values, default=0) + 1, 1)
        if ins.opcode == "reduce":
            rank = _rank(ins.type) + len(values)
        if ins.opcode == "transpose" and len(values) >= 2:
            a, b = (int(x) for x in rng.choice(len(values), 2, replace=False))
            new = list(values)
            new[a], new[b] = new[b], new[a]
        elif values:
            k = int(rng.integers(len(values)))
            others = [d for d in range(rank) if d not in values]
            if not others:
                return None
            new = list(values)
            new[k] = int(rng.choice(others))
        else:
            return None
        spelled = "{" + ",".join(map(str, new)) + "}" if m.group(2).startswith("{") else str(new[0])
        new_attrs = ins.attrs[:m.start(2)] + spelled + ins.attrs[m.end(2):]
        return done(line[:len(line) - len(ins.attrs)] + new_attrs, f"{m.group(1)} {values} -> {new}")
    if kind == "reducer":
        m = re.search(r"to_apply=(%[\w.\-]+)", ins.attrs)
        if not m:
            return None
        comp = m.group(1)
        body = re.search(rf"^{re.escape(comp)} \(.*?^\}}\n", text, re.S | re.M)
        if not body:
            return None
        root = re.search(r"ROOT %[\w.\-]+ = \S+ (add|maximum|minimum|multiply)\(", body.group(0))
        if not root:
            return None
        new_op = str(rng.choice(_REDUCERS[root.group(1)]))
        clone = f"{comp}.{new_op}"  # deterministic: the same mutation twice is a duplicate
        new_body = body.group(0).replace(comp + " (", clone + " (", 1)
        new_body = re.sub(r"(ROOT %[\w.\-]+ = \S+ )" + root.group(1) + r"\(", rf"\g<1>{new_op}(", new_body, count=1)
        new_line = line.replace(f"to_apply={comp}", f"to_apply={clone}", 1)
        # The clone goes right before the first computation, so it is defined before any use.
        first = re.search(r"^%[\w.\-]+ \(", text, re.M)
        mutated = _replace_lines(text, {ins.line: new_line})
        if first is None:
            return None
        mutated = mutated[:first.start()] + new_body + "\n" + mutated[first.start():]
        return Mutant(name, kind, f"{ins.name} ({ins.opcode}): reducer {root.group(1)} -> {new_op}", mutated,
                      [ins.line])
    raise ValueError(kind)


@dataclass
class FixtureCase:
    name: str
    before: str
    after: str
    input_sets: list[list[np.ndarray]]  # the stored oracle inputs first, then random ones like them
    after_outs: list[list[np.ndarray]]  # the unmutated after.hlo's outputs on each input set
    in_shardings: list[Any]
    out_shardings: list[Any]
    sites: dict[str, list[Instr]]


def soak_fixtures() -> list[str]:
    """The partitioned fixtures proven equivalent: after.hlo with verdict "equivalent"."""
    out = []
    for d in sorted(FIXTURES.iterdir()):
        exp = d / "expected.json"
        if not (exp.exists() and (d / "after.hlo").exists() and (d / "oracle.npz").exists()):
            continue
        expected = json.loads(exp.read_text())
        # XLA's own partitioner outputs only (a committed mutant has no shardings of its own to run with)
        if expected["verdict"] == "equivalent" and expected.get("after_kind") in ("spmd_hlo", "compiled_hlo"):
            out.append(d.name)
    return out


def run_hlo_on(hlo_text: str, input_sets: Sequence[Sequence[np.ndarray]], in_shardings: Sequence[Any],
               out_shardings: Sequence[Any], out_shapes: Sequence[tuple[int, ...]]) -> list[list[np.ndarray]]:
    """tools/gen_fixtures.run_partitioned_hlo for several input sets: one compile, one run per set."""
    import gen_fixtures as gf
    from jax._src.lib import xla_client as xc

    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_partitions = gf.N_DEVICES
    build.num_replicas = 1
    build.use_spmd_partitioning = True
    build.device_assignment = xc.DeviceAssignment.create(np.arange(gf.N_DEVICES).reshape(1, gf.N_DEVICES))
    devices = jax.devices()[:gf.N_DEVICES]
    exe = devices[0].client.compile_and_load(gf._manual_stablehlo(hlo_text), xc.DeviceList(tuple(devices)), options)
    results = []
    for inputs in input_sets:
        args = [jax.device_put(x, sh) for x, sh in zip(inputs, in_shardings, strict=True)]
        shards = exe.execute_sharded(args).disassemble_into_single_device_arrays()
        results.append([np.asarray(jax.make_array_from_single_device_arrays(tuple(shape), sh, parts))
                        for parts, sh, shape in zip(shards, out_shardings, out_shapes, strict=True)])
    return results


def like(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Random inputs shaped like a stored one: integers (token ids, labels) within its observed range, floats
    with its spread; a mutant that agrees on the stored inputs by luck rarely agrees on these too."""
    if x.dtype.kind in "iu":
        lo, hi = (int(x.min()), int(x.max())) if x.size else (0, 1)
        return rng.integers(lo, hi + 1, size=x.shape).astype(x.dtype)
    if x.dtype == np.bool_:
        return rng.random(x.shape) < 0.5
    std = float(np.std(x)) if x.size > 1 else 1.0
    return (rng.standard_normal(x.shape) * (std or 1.0) + float(np.mean(x))).astype(x.dtype)


def load_case(name: str, extra_inputs: int = 2) -> FixtureCase:
    """A fixture with what running it needs. The in/out shardings are not stored in the fixture files, so the
    fixture is rebuilt with tools/gen_fixtures.build (a JAX lowering and compile); the unmutated after.hlo is
    then run on the stored inputs and must reproduce the stored outputs, which checks that pairing."""
    import gen_fixtures as gf

    d = FIXTURES / name
    built = gf.build(name)
    assert built.in_shardings is not None and built.out_shardings is not None
    npz = np.load(d / "oracle.npz")
    inputs = [npz[f"in_{i}"] for i in range(sum(1 for k in npz.files if k.startswith("in_")))]
    stored = [npz[f"after_out_{i}"] for i in range(sum(1 for k in npz.files if k.startswith("after_out_")))]
    after = (d / "after.hlo").read_text()
    shapes = [o.shape for o in built.before_out]
    rng = np.random.default_rng(len(name))
    input_sets = [inputs] + [[like(x, rng) for x in inputs] for _ in range(extra_inputs)]
    outs = run_hlo_on(after, input_sets, built.in_shardings, built.out_shardings, shapes)
    # the stored 0-d outputs were written with shape (1,) (see gen_fixtures.write_npz)
    stored = [s.reshape(o.shape) for s, o in zip(stored, outs[0], strict=True)]
    assert compare(stored, outs[0], rtol=1e-5, loose=1e-5)[0] == "SAME", \
        f"{name}: re-running after.hlo disagrees with oracle.npz"
    return FixtureCase(name, (d / "before.mlir").read_text(), after, input_sets, outs, list(built.in_shardings),
                       list(built.out_shardings), mutation_sites(after))


@dataclass
class MutantResult:
    fixture: str
    kind: str
    what: str
    truth: str  # DIFFERENT | SAME | AMBIGUOUS
    max_abs_diff: float
    verdict: str
    reason: str
    seconds: float
    outcome: str
    diff: str | None = None
    error: str | None = None


@dataclass
class MutantSummary:
    tried: int = 0
    unparsable: int = 0
    not_run: int = 0
    duplicates: int = 0
    results: list[MutantResult] = field(default_factory=list)
    seconds: float = 0.0
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped_fixtures: list[str] = field(default_factory=list)
    interrupted: str | None = None  # why the soak stopped early (Ctrl-C, SIGTERM, a hung XLA execution)
    by_fixture: dict[str, dict[str, int]] = field(default_factory=dict)

    def counts(self) -> dict[str, Any]:
        def n(pred: Callable[[MutantResult], bool]) -> int:
            return sum(1 for r in self.results if pred(r))

        confirmed = [r for r in self.results if r.truth == "DIFFERENT"]
        return {
            "mutants_tried": self.tried,
            "unparsable": self.unparsable,
            "xla_rejected": self.not_run,
            "duplicates": self.duplicates,
            "ran": len(self.results),
            "confirmed_different": len(confirmed),
            "same_output": n(lambda r: r.truth == "SAME"),
            "ambiguous": n(lambda r: r.truth == "AMBIGUOUS"),
            "confirmed_discrepancy": sum(1 for r in confirmed if r.verdict == "discrepancy"),
            "confirmed_unknown": sum(1 for r in confirmed if r.verdict == "unknown"),
            "false_equivalent": n(lambda r: r.outcome == "false_equivalent"),
            "same_output_discrepancy": n(lambda r: r.outcome == "same_output_discrepancy"),
            "timeouts": n(lambda r: r.outcome == "timeout"),
            "exceptions": n(lambda r: r.outcome == "exception"),
            "exceptions_scalify_error": n(lambda r: r.verdict == "scalify_error"),
            "exceptions_crash": n(lambda r: r.verdict == "crash"),
            "fixtures_skipped": len(self.skipped_fixtures),
            "interrupted": self.interrupted,
            "wall_seconds": round(self.seconds, 1),
        }


def run_mutants(seed: int, target: int, *, fixtures: Sequence[str] | None = None, seconds: float = math.inf,
                budget: float = 10.0, hard_limit: float = 120.0, max_tries: int | None = None,
                exec_limit: float = 300.0, on_hang: Callable[[MutantSummary], None] | None = None,
                log: Callable[[str], None] = print) -> MutantSummary:
    """Part 2: mutate until `target` mutants are confirmed different (or `max_tries`, or `seconds`).

    Ctrl-C / SIGTERM end the soak with what it has. An XLA execution cannot be interrupted from Python, so a
    mutant that runs longer than `exec_limit` seconds (a loop that no longer ends) ends the process after
    `on_hang(summary)` (main writes the JSON report there)."""
    summary = MutantSummary()
    t0 = time.perf_counter()
    try:
        _soak(summary, seed, target, fixtures, seconds, budget, hard_limit, max_tries, exec_limit, on_hang, log, t0)
    except KeyboardInterrupt:
        summary.interrupted = "interrupted"
        log("  interrupted: reporting the mutants so far")
    summary.seconds = time.perf_counter() - t0
    summary.by_kind = {k: dict(v) for k, v in summary.by_kind.items()}
    summary.by_fixture = {k: dict(v) for k, v in summary.by_fixture.items()}
    return summary


def _soak(summary: MutantSummary, seed: int, target: int, fixtures: Sequence[str] | None, seconds: float,
          budget: float, hard_limit: float, max_tries: int | None, exec_limit: float,
          on_hang: Callable[[MutantSummary], None] | None, log: Callable[[str], None], t0: float) -> None:
    import gen_fixtures as gf

    rng = np.random.default_rng(seed)
    names = list(fixtures or soak_fixtures())
    cases: dict[str, FixtureCase] = {}
    seen: set[str] = set()
    max_tries = max_tries or 12 * target + 50
    confirmed = 0
    while confirmed < target and summary.tried < max_tries and time.perf_counter() - t0 < seconds:
        name = names[int(rng.integers(len(names)))]
        if name not in cases:
            log(f"  loading fixture {name}")
            try:
                cases[name] = load_case(name)
            except Exception as err:  # a fixture the generator cannot rebuild (yet): mutate the others
                log(f"  skipping fixture {name}: {type(err).__name__}: {err}")
                names.remove(name)
                summary.skipped_fixtures.append(f"{name}: {type(err).__name__}: {err}")
                if not names:
                    break
                continue
        case = cases[name]
        kinds = [k for k in MUTATION_KINDS if case.sites[k]]
        kind = kinds[int(rng.integers(len(kinds)))]
        site = case.sites[kind][int(rng.integers(len(case.sites[kind])))]
        mutant = mutate(name, case.after, kind, site, rng)
        if mutant is None:
            continue
        summary.tried += 1
        digest = hashlib.sha1(mutant.text.encode()).hexdigest()
        if digest in seen:
            summary.duplicates += 1
            continue
        seen.add(digest)
        stats = summary.by_kind.setdefault(kind, collections.Counter())
        stats["tried"] += 1
        try:
            gf.xla_hlo().hlo_module_from_text(mutant.text)
        except Exception:
            summary.unparsable += 1
            continue
        def hung(what: str = mutant.what, name: str = name) -> None:
            summary.interrupted = f"XLA execution of {name} {what} ran over {exec_limit:.0f} s"
            log(f"  {summary.interrupted}: stopping")
            summary.seconds = time.perf_counter() - t0
            summary.by_kind = {k: dict(v) for k, v in summary.by_kind.items()}
            if on_hang is not None:
                on_hang(summary)
            os._exit(4)

        watchdog = threading.Timer(exec_limit, hung)
        watchdog.daemon = True
        watchdog.start()
        try:
            outs = run_hlo_on(mutant.text, case.input_sets, case.in_shardings, case.out_shardings,
                              [o.shape for o in case.after_outs[0]])
        except Exception:
            summary.not_run += 1
            continue
        finally:
            watchdog.cancel()
        # DIFFERENT if any input set shows it; SAME only if none shows any difference
        truths = [compare(ref, out, rtol=1e-4, loose=1e-3) for ref, out in zip(case.after_outs, outs, strict=True)]
        found = {t for t, _ in truths}
        truth = next((t for t in ("INVALID", "DIFFERENT", "AMBIGUOUS") if t in found), "SAME")
        worst = max((w for _, w in truths if not math.isnan(w)), default=math.nan)
        if truth == "INVALID":
            summary.not_run += 1
            continue
        v = run_verify(case.before, mutant.text, budget, hard_limit)
        # A same-output mutant called a discrepancy is only suspect: the verifier shows discrepancies with
        # inputs of its own, and a mutant can change the result on inputs none of ours hit.
        outcome = {"false_discrepancy": "same_output_discrepancy"}.get(outcome_of(truth, v.name),
                                                                       outcome_of(truth, v.name))
        diff = None
        if outcome != "ok":
            diff = "".join(difflib.unified_diff(case.after.splitlines(True), mutant.text.splitlines(True),
                                                f"{name}/after.hlo", f"{name}/after.hlo (mutant)", n=1))
        summary.results.append(MutantResult(name, kind, mutant.what, truth, worst, v.name, v.reason, v.seconds,
                                            outcome, diff, v.error))
        stats[truth.lower()] += 1
        stats[f"{truth.lower()}_{v.name}"] += 1
        per_fixture = summary.by_fixture.setdefault(name, collections.Counter())
        per_fixture["ran"] += 1
        per_fixture[truth.lower()] += 1
        if truth == "DIFFERENT":
            confirmed += 1
            if confirmed % 100 == 0:
                log(f"  {confirmed} confirmed of {len(summary.results)} run, {time.perf_counter() - t0:.0f} s")
        if outcome not in ("ok", "same_output_discrepancy"):
            log(f"  {name} {mutant.what}: {outcome.upper()} (truth {truth}, verdict {v.name}): {v.reason[:160]}")


# ================================================================================================== main


def table(title: str, counts: dict[str, Any]) -> str:
    width = max(len(k) for k in counts)
    return "\n".join([title, *(f"  {k:<{width}}  {v}" for k, v in counts.items())])


def replay(path: Path, budget: float) -> int:
    """Run one saved program (a module as tools/fuzz_programs.py renders it) through truth and verifier."""
    with tempfile.TemporaryDirectory(prefix="scalify_fuzz_") as tmp:
        mod = load_program(path.read_text(), Path(tmp), "replay_" + re.sub(r"\W", "_", path.stem))
        mesh = mesh_of(mod.MESH)
        truth, worst = truth_of(mod, mesh, range(TRUTH_SEEDS))
        print(f"truth: {truth} (max |difference| {worst:.3g})")
        before, after = lower_pair(mod, mesh)
        try:
            report = scalify_hlo.verify(before, after, timeout=budget)
        except Exception:
            traceback.print_exc()
            print("outcome: exception")
            return 1
        print(report.render())
        outcome = outcome_of(truth, report.name)
        print(f"outcome: {outcome}")
        return 0 if outcome == "ok" else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--programs", type=int, default=100, help="random programs (each a correct and a perturbed pair)")
    ap.add_argument("--seconds", type=float, default=600.0, help="time budget of the program part")
    ap.add_argument("--mutants", type=int, default=0, help="confirmed-different mutants to reach (0: skip part 2)")
    ap.add_argument("--mutant-seconds", type=float, default=math.inf, help="time budget of the mutant part")
    ap.add_argument("--fixtures", nargs="+", help="mutate only these fixtures (default: every equivalent after.hlo)")
    ap.add_argument("--budget", type=float, default=10.0, help="verify(..., timeout=) per program, seconds")
    ap.add_argument("--timeout-wall", type=float, default=120.0, help="hard wall limit per verification")
    ap.add_argument("--exec-limit", type=float, default=300.0,
                    help="a mutant XLA runs longer than this stops the soak (report written, exit code 4)")
    ap.add_argument("--json", type=Path, help="write counts and every failure (with its source) here")
    ap.add_argument("--replay", type=Path, help="run one saved program and exit")
    ns = ap.parse_args(argv)
    if ns.replay:
        return replay(ns.replay, ns.budget)
    report: dict[str, Any] = {"config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items()},
                              "jax": jax.__version__}
    failures = 0
    if ns.programs > 0:
        print(f"== programs (seed {ns.seed}, up to {ns.programs} programs / {ns.seconds:.0f} s)")
        ps = run_programs(ns.seed, ns.programs, ns.seconds, budget=ns.budget, hard_limit=ns.timeout_wall)
        counts = ps.counts()
        print(table("programs", counts))
        by_kind: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for r in ps.verified:
            by_kind[r.perturbation or "correct"][f"{r.truth.lower()}/{r.verdict}"] += 1
        print("by perturbation (truth/verdict):")
        for k in sorted(by_kind):
            print(f"  {k:22s} " + ", ".join(f"{kk} {vv}" for kk, vv in sorted(by_kind[k].items())))
        reasons = collections.Counter(re.sub(r"%[\w.#\-]+|\d+", "#", r.reason)[:120]
                                      for r in ps.verified if r.verdict == "unknown")
        report["programs"] = {"counts": counts, "by_perturbation": {k: dict(v) for k, v in by_kind.items()},
                              "unknown_reasons": dict(reasons.most_common(30)),
                              "failures": [asdict(r) for r in ps.results if r.outcome not in ("ok", "invalid")],
                              # every pair in brief; fuzz_programs.generate(N) rebuilds the program of id pN_...
                              "results": [{k: v for k, v in asdict(r).items() if k not in ("source", "error")}
                                          for r in ps.results]}
        failures += sum(counts[k] for k in ("false_equivalent", "false_discrepancy", "timeouts", "exceptions",
                                            "generator_errors"))
    if ns.mutants > 0:
        print(f"== mutants (seed {ns.seed}, target {ns.mutants} confirmed)")

        def mutant_report(ms: MutantSummary) -> int:
            counts = ms.counts()
            print(table("mutants", counts))
            print("by kind:")
            for k, v in sorted(ms.by_kind.items()):
                print(f"  {k:16s} " + ", ".join(f"{kk} {vv}" for kk, vv in sorted(v.items())))
            report["mutants"] = {
                "counts": counts, "by_kind": ms.by_kind, "by_fixture": ms.by_fixture,
                "skipped_fixtures": ms.skipped_fixtures,
                "failures": [asdict(r) for r in ms.results if r.outcome not in ("ok", "same_output_discrepancy")],
                "same_output_discrepancies": [asdict(r) for r in ms.results if r.outcome == "same_output_discrepancy"]}
            return sum(counts[k] for k in ("false_equivalent", "timeouts", "exceptions"))

        def on_hang(ms: MutantSummary) -> None:  # the process ends right after: report what there is
            mutant_report(ms)
            write_json(ns.json, report)

        ms = run_mutants(ns.seed, ns.mutants, fixtures=ns.fixtures, seconds=ns.mutant_seconds, budget=ns.budget,
                         hard_limit=ns.timeout_wall, exec_limit=ns.exec_limit, on_hang=on_hang)
        failures += mutant_report(ms)
    write_json(ns.json, report)
    return 1 if failures else 0


def write_json(path: Path | None, report: dict[str, Any]) -> None:
    if path is not None:
        path.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {path}")


def _terminate(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM ends a soak like Ctrl-C: with its report


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    sys.exit(main())
