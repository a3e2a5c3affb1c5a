"""Part 2 of the differential fuzzer (tools/fuzz.py): text mutants of the partitioned fixtures, confirmed by
XLA execution.

The correct partitioned fixtures (tests/fixtures/*/after.hlo, verdict equivalent) get one text mutation
each (tools/fuzz_hlo_mutations.py). A mutant XLA parses is run by XLA on 8 fake devices (`run_hlo_on`, the
in/out shardings from rebuilding the fixture with tools/gen_fixtures.build, `load_case`) on the fixture's
oracle.npz inputs and random input sets like them; one whose outputs differ from the unmutated program's is
CONFIRMED, and the verifier must never call it equivalent (`run_mutants`, counts in `MutantSummary`).
Import it through tools/fuzz.py, which sets XLA_FLAGS (8 fake CPU devices) before jax starts.
"""

from __future__ import annotations

import collections
import difflib
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import numpy as np
from fuzz_hlo_mutations import MUTATION_KINDS, Instr, mutate, mutation_sites
from fuzz_verdicts import compare, outcome_of, run_verify

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


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
        # XLA's own partitioner outputs only (a committed mutant has no shardings of its own to run with), and
        # not compiled.as_text(): XLA does not compile its own optimised output again (fusions without their
        # backend configs fail, some abort the process in the CPU emitter)
        if expected["verdict"] == "equivalent" and expected.get("after_kind") == "spmd_hlo":
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
        if not kinds:  # nothing this fuzzer knows how to mutate (no collectives, constants, tables...)
            names.remove(name)
            if not names:
                break
            continue
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
