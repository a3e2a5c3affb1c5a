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

# The code is split along the fuzzer's seam: this file is the CLI (flags, the run, the printed tables, the
# JSON report, --replay); tools/fuzz_verdicts.py runs the verifier and compares outputs (both parts);
# part 1 is tools/fuzz_programs.py (writes random programs) and tools/fuzz_program_pairs.py (runs and
# verifies them); part 2 is tools/fuzz_hlo_mutations.py (HLO text mutations) and tools/fuzz_mutants.py
# (runs mutants of the fixtures with XLA and verifies them).

from __future__ import annotations

import os

# Must precede the first `import jax` (here, in the fuzz_* modules or in gen_fixtures): 8 fake CPU devices.
# Run as a script, XLA also skips its LLVM optimisations: thousands of one-off executables compile ~3x
# faster, same results.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
if __name__ == "__main__" and "xla_backend_optimization_level" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_backend_optimization_level=0"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse
import collections
import json
import math
import re
import signal
import sys
import tempfile
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import jax

TOOLS = Path(__file__).resolve().parent
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from fuzz_mutants import MutantSummary, run_mutants  # noqa: E402
from fuzz_program_pairs import TRUTH_SEEDS, load_program, lower_pair, mesh_of, run_programs, truth_of  # noqa: E402
from fuzz_verdicts import outcome_of  # noqa: E402

import scalify_hlo  # noqa: E402


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
