"""Which stack frame of an after-program op a report names.

An op's location is a call stack; the innermost frame is usually the line to edit. Not when that line is
in a helper the reference runs too, from another caller (a shard_map body and its reference both calling
`lookup(table, ids)`): the reference is right by definition, so the helper's line alone is not the bug;
the first frame, going outward, where the after-program's stack leaves the reference's known callers is
the call that passed the wrong arguments. Where the reference runs the very same stack (a partitioned
program beside its own single-device lowering), or its stack stops short (ops of a called function carry
no frame of their callers), the innermost frame stays.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from scalify_hlo.ir.nodes import Frame, Module, walk
from scalify_hlo.report.verdicts import Discrepancy, Equivalent, Finding, Site, Unknown

Key = tuple[tuple[str, int], ...]


def _key(frames: Iterable[Frame]) -> Key:
    return tuple((f.file, f.line) for f in frames)


Stacks = tuple[set[Key], dict[Key, set[tuple[str, str | None]]]]


def reference_stacks(reference: Module) -> Stacks:
    """Every innermost part (frames[:k], k >= 1) of every stack of the reference's ops, and for those the
    reference continues outward (a known caller: a function's own ops carry no frame of its callers, so a
    part that ends there says nothing about who called), the (file, function) of each caller."""
    parts: set[Key] = set()
    continued: dict[Key, set[tuple[str, str | None]]] = {}
    for func in reference.funcs.values():
        for op in walk(func.body.ops):
            frames = op.loc.frames
            keys = _key(frames)
            parts.update(keys[:k] for k in range(1, len(keys) + 1))
            for k in range(1, len(keys)):
                continued.setdefault(keys[:k], set()).add((frames[k].file, frames[k].function))
    return parts, continued


def focused(site: Site, reference: Stacks) -> Site:
    """`site` named at the innermost frame of its stack where it leaves the reference's known callers."""
    parts, continued = reference
    stack = site.stack
    k = 1
    if len(stack) < 2 or _key(stack[:1]) not in parts:
        return site
    while k < len(stack) and _key(stack[:k + 1]) in parts:
        k += 1
    callers = continued.get(_key(stack[:k]))
    if k == len(stack) or callers is None:
        return site  # the reference runs this very stack, or nothing says its caller differs
    frame = stack[k]
    if (frame.file, frame.function) in callers:
        # The same function calls it from another line: a script lowering both programs from two lines of
        # one function (`lower(ref)`, then `lower(partitioned)`), not a caller passing other arguments.
        return site
    return replace(site, source=str(frame), column=frame.column)


def focus(verdict: Equivalent | Discrepancy | Unknown, reference: Module) -> Equivalent | Discrepancy | Unknown:
    """The verdict with its after-program sites named as `focused` says."""
    if isinstance(verdict, Equivalent):
        return verdict
    if not any(f.after is not None and len(f.after.stack) > 1 for f in verdict.findings):
        return verdict
    stacks = reference_stacks(reference)

    def one(f: Finding) -> Finding:
        return replace(f, after=focused(f.after, stacks) if f.after is not None else None,
                       also=tuple(focused(s, stacks) for s in f.also))

    return replace(verdict, findings=tuple(one(f) for f in verdict.findings))
