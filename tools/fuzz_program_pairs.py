"""Part 1 of the differential fuzzer (tools/fuzz.py): random shard_map programs checked pair by pair.

tools/fuzz_programs.py writes each random program (a correct pair and a perturbed pair) as Python source;
this module imports that source, runs the reference and the shard_map with JAX on several random inputs
to know the truth (SAME, DIFFERENT, AMBIGUOUS or INVALID), lowers both sides and gives them to
`scalify_hlo.verify` (`run_programs`, `check_pair`), and keeps the counts (`ProgramSummary`). Import it
through tools/fuzz.py, which sets XLA_FLAGS (8 fake CPU devices) before jax starts.
"""

from __future__ import annotations

import importlib.util
import math
import re
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import fuzz_programs
import jax
import numpy as np
from fuzz_verdicts import compare, outcome_of, run_verify
from jax.sharding import AxisType, Mesh, NamedSharding

TRUTH_SEEDS = 3
INT_RANGE = (-4, 5)  # integer inputs: small, so sums and products stay far from overflow and ties are common


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
    localised: str | None = None  # a true bug found: "exact" (the perturbed line named), "other line", "none"


def localisation_of(text: str, perturbed_lines: int, named: str | None) -> str:
    """How a discrepancy was localised: "exact" when it names one of the perturbation's lines (the last
    `perturbed_lines` lines up to the `# PERTURBED` marker, or the OUT_SPECS line for a perturbation of
    the out_specs), "other line" when it names another line of the program, "none" when it names none."""
    if named is None or ".py:" not in named:
        return "none"
    line = int(named.rsplit(":", 1)[1])
    lines = text.splitlines()
    marked = next((i + 1 for i, ln in enumerate(lines) if "# PERTURBED" in ln), None)
    if marked is None:
        specs = next(i + 1 for i, ln in enumerate(lines) if ln.startswith("OUT_SPECS"))
        return "exact" if line == specs else "other line"
    return "exact" if marked - perturbed_lines < line <= marked else "other line"


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
               workdir: Path, budget: float, hard_limit: float, perturbed_lines: int = 1) -> PairResult:
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
    found = pair == "perturbed" and truth == "DIFFERENT" and v.name == "discrepancy"
    return PairResult(**base, truth=truth, max_abs_diff=worst, verdict=v.name, reason=v.reason, seconds=v.seconds,
                      outcome=outcome, source=text if outcome != "ok" else None, error=v.error,
                      localised=localisation_of(text, perturbed_lines, v.named) if found else None)


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
            # true bugs found: named at one of the perturbed lines / at another line / at no line
            "localised_exact": self.count(lambda r: r.localised == "exact"),
            "localised_other_line": self.count(lambda r: r.localised == "other line"),
            "localised_none": self.count(lambda r: r.localised == "none"),
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
            pairs: list[tuple[str, str | None, str, int]] = [
                ("correct", None, program.render(title="correct pair"), 0)]
            sites = program.perturbation_sites()
            if sites:
                rng = np.random.default_rng(pseed)
                site = sites[int(rng.integers(len(sites)))]
                kind = program.perturbation(site)
                written = len(program.steps[site[0]].perturbations[site[1]].impl) if site[0] < len(program.steps) else 1
                pairs.append(("perturbed", kind, program.render(site, title=f"perturbed pair ({kind})"), written))
            for pair, kind, text, written in pairs:
                r = check_pair(text, f"p{pseed}_{pair}", pair, kind, program, workdir, budget, hard_limit, written)
                summary.results.append(r)
                if r.outcome not in ("ok", "invalid"):
                    log(f"  {r.id}: {r.outcome.upper()} truth {r.truth}, verdict {r.verdict}: {r.reason[:160]}")
            if i % 25 == 24:
                jax.clear_caches()  # thousands of one-off executables otherwise stay cached
