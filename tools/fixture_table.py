"""Print a Markdown table of every fixture: expected and actual verdict, site, seconds, e-graph size.

    python tools/fixture_table.py [--out FILE]

Each fixture is verified in this process after a warm-up, so the seconds exclude importing jax/egglog.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from scalify_hlo.prove.engine import Options, prove

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    args = ap.parse_args()
    warm = FIXTURES / "megatron_mlp_shardy"
    prove(warm / "before.mlir", warm / "after.hlo")
    rows = ["| fixture | expected | verdict | first site | seconds | e-graph calls (memo hits) | max e-nodes |",
            "|---|---|---|---|---|---|---|"]
    for d in sorted(p for p in FIXTURES.iterdir() if (p / "expected.json").exists()):
        exp = json.loads((d / "expected.json").read_text())
        after = d / "after.hlo" if (d / "after.hlo").exists() else d / "after.mlir"
        t0 = time.perf_counter()
        assume = {k: (lo, hi) for k, (lo, hi) in exp.get("assume", {}).items()}
        r = prove(d / "before.mlir", after, Options(assume=assume))
        seconds = time.perf_counter() - t0
        site = r.findings[0].after.source if r.findings and r.findings[0].after else ""
        want = f"{exp['bug']['file']}:{exp['bug']['line']}" if exp.get("bug") else ""
        mark = "" if r.name == exp["verdict"] and (not want or site == want) else " ✗"
        s = r.stats
        name = d.name + "".join(f" (--assume {k}={lo}:{hi})" for k, (lo, hi) in assume.items())
        rows.append(f"| {name} | {exp['verdict']} | {r.name}{mark} | {site} | {seconds:.2f} | "
                    f"{s['egraph_calls']} ({s['egraph_memo_hits']}) | {s['egraph_max_nodes']} |")
    table = "\n".join(rows)
    print(table)
    if args.out:
        args.out.write_text(table + "\n")


if __name__ == "__main__":
    main()
