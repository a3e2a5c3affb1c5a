"""The `scalify-hlo` command line (typer).

Exit codes: 0 equivalent, 1 discrepancy, 2 unknown (also a legal program the tool does not model),
3 bad input, usage errors included. Bad input prints one diagnostic with file, line and what was
expected; nothing ever prints a Python traceback (set SCALIFY_DEBUG=1 to get one for an internal error).
The codes are given by the command group itself (`_Commands`), so `typer.testing.CliRunner` sees the
same ones as the installed script.

Inputs are regular files, or `-` for standard input (one of the two at most), up to 2 GiB each
(SCALIFY_MAX_INPUT_BYTES sets another limit; see `scalify_hlo.parsers.load`).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from scalify_hlo.ir.errors import ScalifyError, Span, UnsupportedError, UsageError

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

EXIT_UNKNOWN = 2
EXIT_BAD_INPUT = 3
EXIT_INTERRUPTED = 130


class _Commands(TyperGroup):
    """The command group, with this tool's exit codes for every way a run can end."""

    def main(self, *args: Any, **kwargs: Any) -> NoReturn:
        # Not standalone: errors come back here instead of being printed and exited on with click's codes
        # (click exits 2 on a usage error, which here means `unknown`).
        kwargs["standalone_mode"] = False
        try:
            rc = super().main(*args, **kwargs)
            code = rc if isinstance(rc, int) else 0
        except UnsupportedError as err:  # a legal program the tool does not model: unknown, not bad input
            typer.echo(err.render(), err=True)
            code = EXIT_UNKNOWN
        except ScalifyError as err:
            typer.echo(err.render(), err=True)
            code = EXIT_BAD_INPUT
        except (typer.Abort, KeyboardInterrupt):
            code = EXIT_INTERRUPTED
        except Exception as err:  # usage errors and our own bugs: one message, never a traceback
            show = getattr(err, "show", None)
            if callable(show) and isinstance(getattr(err, "exit_code", None), int):
                show()  # a usage error (typer vendors click; its exceptions carry show() and exit_code)
                code = EXIT_BAD_INPUT
            elif os.environ.get("SCALIFY_DEBUG"):
                raise
            else:
                typer.echo(f"internal error: {type(err).__name__}: {err} (set SCALIFY_DEBUG=1 for a traceback)",
                           err=True)
                code = EXIT_UNKNOWN
        sys.exit(code)


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Prove a distributed JAX/XLA program equivalent to its single-device reference.")

STDIN = "-"


def _positive_seconds(value: float) -> float:
    # click's FloatRange has no open lower bound, and a zero or NaN budget is as meaningless as a negative one.
    if not value > 0:
        raise typer.BadParameter(f"{value} is not a positive number of seconds")
    return value


def _check_output(option: str, path: Path | None) -> None:
    """Bad input (exit 3) when `path` cannot take a file, found before any work is done: a run that ends
    in a report nobody can write is time wasted."""
    if path is None or str(path) == STDIN:
        return
    if path.is_dir():
        raise UsageError(Span(str(path)), f"{option}: is a directory; expected the path of a file to write")
    parent = path.parent
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        raise UsageError(Span(str(path)), f"{option}: the folder {parent} {what}; expected a file in an "
                         "existing folder")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(Span(str(path)), f"{option}: not writable; expected a file this user can write")


def _write(option: str, path: Path, text: str) -> None:
    try:
        path.write_text(text + "\n", encoding="utf-8")
    except OSError as err:  # (checked before the run; this is what changed since)
        raise UsageError(Span(str(path)), f"{option}: cannot write: {err.strerror or err}") from None


class _Progress:
    """The progress bar of a long run (rich's, on stderr), shown once the run has taken `delay` seconds and
    cleared when it ends. None at all when stderr is not a terminal (pipes, CI logs, tests), with --quiet,
    or with --json (the caller passes enabled=False)."""

    def __init__(self, enabled: bool, console: Console | None = None, delay: float = 1.0) -> None:
        if console is None and enabled and sys.stderr.isatty():
            from rich.console import Console  # (rich loads in ~50 ms: only for a run that may show it)

            console = Console(stderr=True)
        self.console = console
        self.enabled = enabled and console is not None and console.is_terminal
        self.started = time.perf_counter()
        self.delay = delay
        self.bar: Progress | None = None
        self.task: TaskID | None = None

    def update(self, stage: str, done: int, total: int) -> None:
        if not self.enabled or time.perf_counter() - self.started < self.delay:
            return
        if self.bar is None or self.task is None:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description:<22}"), BarColumn(),
                                TextColumn("{task.completed}/{task.total} ops"), TimeElapsedColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(stage, total=total)
        self.bar.update(self.task, description=stage, completed=done, total=total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


def parse_assumption(text: str) -> tuple[str, tuple[int, int]]:
    """`NAME=LO:HI` → (name, (lo, hi)), half-open as Python ranges. ValueError when malformed."""
    name, sep, rest = text.partition("=")
    lo_text, colon, hi_text = rest.partition(":")
    if not sep or not colon or not name.strip():
        raise ValueError(f"expected NAME=LO:HI (an input name and a half-open integer range), got {text!r}")
    try:
        lo, hi = int(lo_text), int(hi_text)
    except ValueError:
        raise ValueError(f"expected integer bounds in NAME=LO:HI, got {text!r}") from None
    if hi <= lo:
        raise ValueError(f"the range in {text!r} is empty: expected LO < HI")
    return name.strip(), (lo, hi)

@app.command()
def diff(
    before: Annotated[Path, typer.Argument(help="the single-device reference (StableHLO .mlir or HLO text)")],
    after: Annotated[Path, typer.Argument(help="the distributed program (partitioned HLO or shard_map StableHLO)")],
    json_out: Annotated[Path | None, typer.Option("--json", help="write the JSON report here ('-' for stdout)")] = None,
    numeric: Annotated[bool, typer.Option(help="also run both programs on random inputs (devices simulated)")] = False,
    seed: Annotated[int, typer.Option(help="random seed of the numeric check")] = 0,
    iterations: Annotated[int, typer.Option(min=1, help="egglog iteration budget per question")] = 12,
    timeout: Annotated[float, typer.Option(callback=_positive_seconds,
                                           help="egglog seconds budget per question (> 0)")] = 5.0,
    nodes: Annotated[int, typer.Option(min=1, help="egglog e-node budget per question")] = 50_000,
    time_limit: Annotated[float, typer.Option(callback=_positive_seconds,
                                              help="seconds for the whole proof (> 0): past them the verdict is "
                                                   "unknown, naming the first value left unread")] = 600.0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="print only the verdict line")] = False,
    assume: Annotated[list[str] | None, typer.Option(
        help="NAME=LO:HI: integer input NAME lies in [LO, HI) (token ids: JAX's table[ids] promises it); "
             "repeatable. The verdict then holds for such inputs only")] = None,
    excess_precision: Annotated[bool, typer.Option(
        "--excess-precision/--exact-precision",
        help="a rounding to bf16/f16 that one program skips is no difference (XLA's compiled code drops them: "
             "xla_allow_excess_precision)")] = False,
) -> None:
    """Prove AFTER equivalent to BEFORE, or name the op and source line where they differ ('-': stdin)."""
    import scalify_hlo.parsers as parsers
    from scalify_hlo.api import verify
    from scalify_hlo.ir.nodes import Module

    promised: dict[str, tuple[int, int]] = {}
    for text in assume or []:
        try:
            name, bounds = parse_assumption(text)
        except ValueError as e:
            raise UsageError(None, f"--assume: {e}") from None
        promised[name] = bounds
    if str(before) == STDIN and str(after) == STDIN:
        raise UsageError(None, "both BEFORE and AFTER are '-'; standard input can be one of them, expected a "
                         "file for the other")
    _check_output("--json", json_out)
    # Standard input is read once, here: the numeric check needs the program again.
    sources: list[Path | Module] = [parsers.load(p) if str(p) == STDIN else p for p in (before, after)]
    bar = _Progress(enabled=not quiet and json_out is None)
    try:
        report = verify(sources[0], sources[1], numeric=numeric, seed=seed, iterations=iterations, nodes=nodes,
                        timeout=timeout, assume=promised, progress=bar.update, time_limit=time_limit,
                        excess_precision=excess_precision)
    finally:
        bar.close()
    if json_out is not None:
        text = report.dumps()
        if str(json_out) == "-":
            typer.echo(text)
        else:
            _write("--json", json_out, text)
    if json_out is None or str(json_out) != "-":
        rendered = report.render(source_root=Path.cwd())
        typer.echo(rendered.splitlines()[-1] if quiet else rendered)
    raise typer.Exit(report.exit_code)


@app.command()
def show(file: Annotated[Path, typer.Argument(help="a StableHLO .mlir or HLO text file ('-': stdin)")]) -> None:
    """Summarise a program: ops, collectives, mesh, layouts of inputs and outputs."""
    import scalify_hlo.parsers as parsers
    from scalify_hlo.ir.nodes import walk
    from scalify_hlo.layout.program import COLLECTIVES, prepare

    module = parsers.load(file)
    prog = prepare(module)
    ops = list(walk(prog.func.body.ops))
    typer.echo(f"{file}: {module.kind} module {module.name!r}, {prog.form} program, {len(ops)} ops")
    typer.echo(f"mesh: {prog.mesh.describe()} ({prog.mesh.size} devices)")
    for i, (p, layout) in enumerate(zip(prog.func.params, prog.in_layouts, strict=True)):
        where = layout.describe(prog.mesh) if layout is not None else "(no sharding)"
        name = prog.func.arg_locs[i].op_name if i < len(prog.func.arg_locs) else None
        typer.echo(f"  input {i}{f' ({name})' if name else ''}: {p.type} {where}")
    for j, (v, layout) in enumerate(zip(prog.func.outputs, prog.out_layouts, strict=True)):
        where = layout.describe(prog.mesh) if layout is not None else "(no sharding)"
        typer.echo(f"  output {j}: {v.type} {where}")
    counts = Counter(op.opcode for op in ops)
    typer.echo("ops: " + ", ".join(f"{k} {n}" for k, n in counts.most_common(12)))
    coll = [op for op in ops if op.opcode in COLLECTIVES]
    if coll:
        from scalify_hlo.layout.groups import axes_of_groups, device_groups, has_channel
        from scalify_hlo.report.verdicts import user_name

        typer.echo("collectives:")
        for op in coll:
            try:
                axes = (axes_of_groups(device_groups(op, prog.mesh.size), prog.mesh, prog.mesh.size)
                        if has_channel(op) and op.opcode not in ("collective_permute", "collective_broadcast")
                        else ())
                over = "{" + ", ".join(f'"{a}"' for a in axes) + "}"
            except ScalifyError as err:
                over = f"(groups not on the mesh: {err.message})"
            name = user_name(op.loc.name or (op.results[0].name if op.results else None))  # not the parser's %N
            typer.echo(f"  {f'{name} = ' if name else ''}{op.opcode} over {over} at {op.loc.site or '?'}")


@app.command()
def passes(
    dump: Annotated[Path, typer.Argument(help="an XLA dump dir (--xla_dump_to=DIR --xla_dump_hlo_pass_re=.*)")],
    stop: Annotated[bool, typer.Option("--stop/--continue", help="stop at the first pass that breaks meaning")] = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results as JSON ('-' for stdout)")] = None,
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=0, help="pass pairs checked in parallel, in worker "
                                      "processes (0, the default: one per core)")] = 0,
    ray: Annotated[str | None, typer.Option("--ray", help="check the pairs as tasks of a Ray cluster: 'auto' (the "
                                            "cluster `ray start` runs), an address, or 'local' (start one here); "
                                            "needs pip install 'scalify-hlo[ray]'")] = None,
    excess_precision: Annotated[bool, typer.Option(
        "--excess-precision/--exact-precision",
        help="a rounding to bf16/f16 that a pass drops is no difference (on by default: XLA's passes run with "
             "xla_allow_excess_precision)")] = True,
) -> None:
    """Verify each consecutive pass pair of an XLA dump; name the first pass that breaks meaning."""
    import json

    from scalify_hlo.ir.errors import ParseError
    from scalify_hlo.passes import check_dump, render
    from scalify_hlo.prove.options import Options

    if not dump.is_dir():
        raise ParseError(Span(str(dump)), "not a directory; expected an XLA dump directory")
    _check_output("--json", json_out)
    results = check_dump(dump, stop_at_first=stop, jobs=jobs or os.cpu_count() or 1, ray=ray,
                         options=Options(excess_precision=excess_precision))
    if not results:
        raise ParseError(Span(str(dump)), "no per-pass module dumps (module_*.after_*.txt) in this directory; "
                         "expected a dump made with --xla_dump_hlo_pass_re=.*")
    data = [{"module": r.module, "passes": r.passes, "before": r.before.name, "after": r.after.name, "mode": r.mode,
             "verdict": r.verdict, "seconds": round(r.seconds, 3), "reason": r.reason,
             "report": r.report.to_json() if r.report is not None and r.verdict == "discrepancy" else None}
            for r in results]
    if json_out is not None and str(json_out) == "-":
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        if json_out is not None:
            _write("--json", json_out, json.dumps(data, indent=2, default=str))
        typer.echo(render(results))
    verdicts = {r.verdict for r in results}
    raise typer.Exit(1 if "discrepancy" in verdicts else 2 if "unknown" in verdicts else 0)


@app.command()
def audit(
    file: Annotated[Path, typer.Argument(help="a partitioned HLO or shard_map StableHLO program ('-': stdin)")],
    json_out: Annotated[Path | None, typer.Option("--json", help="write the audit as JSON ('-' for stdout)")] = None,
    plot: Annotated[Path | None, typer.Option(help="an SVG/PNG bar chart of bytes per layer (needs matplotlib)")] = None,
    reference: Annotated[Path | None, typer.Option(
        "--reference", "-r", help="the program before partitioning (StableHLO .mlir): names the mesh axes as you "
        "did, when FILE (partitioned HLO) keeps only their positions")] = None,
) -> None:
    """Collectives with their mesh axes and bytes per device (per step: loops × their trip counts), per layer,
    the byte model used, and flags worth a look."""
    import scalify_hlo.parsers as parsers
    from scalify_hlo.audit import audit as run_audit
    from scalify_hlo.audit import plot as plot_audit

    _check_output("--json", json_out)
    _check_output("--plot", plot)
    if reference is not None and str(reference) == STDIN and str(file) == STDIN:
        raise UsageError(None, "both FILE and --reference are '-'; standard input can be one of them")
    result = run_audit(parsers.load(file), parsers.load(reference) if reference is not None else None)
    if json_out is not None and str(json_out) == "-":
        typer.echo(result.dumps())
    else:
        if json_out is not None:
            _write("--json", json_out, result.dumps())
        typer.echo(result.render())
    if plot is not None:
        plot_audit(result, str(plot))


def main() -> None:
    """The `scalify-hlo` script: the exit codes are the command group's (`_Commands.main`)."""
    app()
