"""Which frame of an after-program op's stack a finding names (`report.focus`), on stacks built by hand.

The reference's stacks decide: a helper the reference also runs, called from another function, is named at
the caller that passed it other arguments; the same op reached from another line of the *same* function
(a script that lowers the reference on one line and the partitioned program on the next) stays at its
innermost frame, where the op is written.
"""

from __future__ import annotations

from scalify_hlo.ir.nodes import Frame
from scalify_hlo.report.focus import Key, Stacks, focused
from scalify_hlo.report.verdicts import Site

HELPER = Frame("model.py", 10, 4, "lookup")


def _site(*frames: Frame) -> Site:
    return Site("gather", None, str(frames[0]), frames[0].column, stack=frames)


def _reference(*stacks: tuple[Frame, ...]) -> Stacks:
    parts: set[Key] = set()
    continued: dict[Key, set[tuple[str, str | None]]] = {}
    for frames in stacks:
        keys = tuple((f.file, f.line) for f in frames)
        parts.update(keys[:k] for k in range(1, len(keys) + 1))
        for k in range(1, len(keys)):
            continued.setdefault(keys[:k], set()).add((frames[k].file, frames[k].function))
    return parts, continued


def test_a_helper_called_by_another_function_is_named_at_the_call() -> None:
    ref = _reference((HELPER, Frame("model.py", 30, 8, "reference"), Frame("run.py", 5, 0, "main")))
    site = _site(HELPER, Frame("model.py", 52, 11, "body"), Frame("run.py", 6, 0, "main"))
    assert focused(site, ref).source == "model.py:52"


def test_the_same_function_lowering_from_another_line_keeps_the_op_line() -> None:
    ref = _reference((Frame("progs.py", 73, 12, "strided"), Frame("gen.py", 27, 4, "build")))
    site = _site(Frame("progs.py", 73, 12, "strided"), Frame("gen.py", 28, 4, "build"))
    assert focused(site, ref).source == "progs.py:73"


def test_the_very_same_stack_keeps_the_innermost_frame() -> None:
    stack = (HELPER, Frame("model.py", 30, 8, "reference"))
    assert focused(_site(*stack), _reference(stack)).source == "model.py:10"
