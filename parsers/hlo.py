"""HLO text → common IR: XLA's own parser, XLA's HLO→StableHLO converter, then the StableHLO walk.

Reads XLA dumps (`*.before_optimizations.txt`, `*.after_spmd-partitioning.*.txt`, any pass dump) and
`compiled.as_text()`. Instruction names survive the conversion (see `_hloproto`), and each op knows its
line in the dump so a report can point into it.

Text from a newer XLA than the installed one is read where the difference is only spelling: XLA of jax
0.11+ prints a `get-tuple-element` without metadata as tuple access in its user's operand list
(`add(%param#0, %c)`, nested `%p#1#0`), which jaxlib 0.10.2's parser rejects. When the installed
parser fails on such text, `expand_tuple_access` writes the accesses out as the instructions they stand
for and the parse is retried (see the function for the names it gives them).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterator
from typing import Any

from scalify_hlo.parsers._hloproto import NAME_SEP, entry_computation_name, name_instructions
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ParseError, Span
from scalify_hlo.ir.nodes import Attrs, Module
from scalify_hlo.ir.tile_text import find_bad_tiles

_XLA_ERROR = re.compile(r"(\d+):(\d+): error: ([^\n]*)")
# XLA's printer elides constants larger than a few elements as `constant({...})` unless the dump asks for
# them (--xla_dump_large_constants); XLA's parser then fills them with 0, 1, 2, ... instead of failing.
_ELIDED = re.compile(r"\bconstant\(\{\.\.\.\}\)")
_ELIDED_TEXT = "constant({...})"  # what any match of _ELIDED contains: a fast test before the regex
_HEADER_INT = re.compile(r"\b(num_partitions|replica_count)=(\d+)")

# Tuple access in an operand list: `%name#i#j...` (the '%' is absent when XLA prints names without it).
_TUPLE_ACCESS = re.compile(r"(?<![\w.%-])(%?)([A-Za-z_][\w.-]*)((?:#\d+)+)")
# What the tuple-access scan must skip: string literals (metadata, backend configs) and /* comments */.
_SKIPPED = re.compile(r'"(?:[^"\\]|\\.)*"|/\*.*?\*/', re.DOTALL)
# An instruction definition: `[ROOT] %name = <shape> opcode(...)`; group 3 starts the shape.
_DEFINITION = re.compile(r"^([ \t]*(?:ROOT[ \t]+)?)(%?)([A-Za-z_][\w.-]*)[ \t]*=[ \t]*", re.MULTILINE)


def leading_lines(text: str) -> Iterator[str]:
    """The lines of `text.splitlines()`, split only as far as they are read: a reader after the first
    lines of a dump of megabytes (its header, its kind) does not split all of it."""
    head = text[:_HEAD_CHARS]
    if len(head) == len(text):
        yield from text.splitlines()
        return
    lines = head.splitlines()
    # All but the last line of `head` end inside it, with another line after them (so a "\r\n" is
    # not cut in two): they are lines of `text` as they are. The rest is split from `text` itself.
    yield from lines[:-1]
    yield from text.splitlines()[len(lines) - 1:]


_HEAD_CHARS = 1 << 16


def _instruction_lines(text: str) -> dict[str, int]:
    """Line of each `%name = ...` definition: an index for reports, not a parser of HLO."""
    lines: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        s = line.lstrip()
        if s.startswith("ROOT "):
            s = s[5:]
        if s.startswith("%") and " = " in s:
            lines.setdefault(s[1:s.index(" = ")], number)
        elif s and not s.startswith(("//", "/*")) and " = " in s and s[0].isalpha():
            # Newer XLA prints names without '%'.
            head = s[:s.index(" = ")]
            if " " not in head:
                lines.setdefault(head, number)
    return lines


def _shape_end(text: str, i: int) -> int:
    """End of the HLO shape starting at `text[i]`: a tuple `( ... )` (nested, with `/*index=5*/`
    comments) or one array shape such as `f32[2,4]{1,0}`, which has no spaces."""
    if not text.startswith("(", i):
        j = i
        while j < len(text) and not text[j].isspace():
            j += 1
        return j
    depth = 0
    j = i
    while j < len(text):
        if text.startswith("/*", j):
            j = text.index("*/", j) + 2
            continue
        c = text[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError("unbalanced tuple shape")


@functools.lru_cache(maxsize=1024)
def _tuple_elements(shape: str) -> tuple[str, ...]:
    """The element shapes of a tuple shape `(s32[], (f32[2]{0}, pred[]), /*index=2*/f32[])`."""
    body = re.sub(r"/\*.*?\*/", "", shape.strip())
    if not (body.startswith("(") and body.endswith(")")):
        raise ValueError(f"not a tuple shape: {shape}")
    parts, depth, start = [], 0, 1
    for j, c in enumerate(body[1:-1], start=1):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(body[start:j].strip())
            start = j + 1
    last = body[start:-1].strip()
    if last or parts:
        parts.append(last)
    return tuple(parts)


def expand_tuple_access(text: str) -> str:
    """`text` with every tuple access `%x#i` (nested: `%x#i#j`) replaced by a `get-tuple-element`.

    The instruction for `%x#1#0` is named `x_1_0` after the chain `x_1 = get-tuple-element(x), index=1`,
    `x_1_0 = get-tuple-element(x_1), index=0`: the names XLA's own parser (jax 0.11+) gives them, so a
    report names the same instruction whichever jaxlib read the dump. They are written at the end of the
    instruction that defines `%x` (the HLO parser does not care about line breaks), so every original
    line keeps its number for diagnostics and reports. The text is returned unchanged when it has no
    tuple access; a reference to an undefined or non-tuple name is left for XLA's parser to report."""
    if "#" not in text:
        return text
    # Operand uses outside strings and comments, e.g. (start, end, '%', 'param', (0,)).
    uses: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    pos = 0
    for skip in [*_SKIPPED.finditer(text), None]:
        end = skip.start() if skip is not None else len(text)
        for m in _TUPLE_ACCESS.finditer(text, pos, end):
            path = tuple(int(k) for k in m.group(3).split("#")[1:])
            uses.append((m.start(), m.end(), m.group(1), m.group(2), path))
        pos = skip.end() if skip is not None else len(text)
    if not uses:
        return text
    # Definitions: name → [(where it starts, where its line ends, its '%' or '', its shape)]. A name
    # defined twice (in two computations of hand-written text) resolves to the nearest one before the use.
    defs: dict[str, list[tuple[int, int, str, str]]] = {}
    taken: set[str] = set()
    for m in _DEFINITION.finditer(text):
        name = m.group(3)
        taken.add(name)
        try:
            shape = text[m.end():_shape_end(text, m.end())]
        except ValueError:
            continue
        line_end = text.find("\n", m.end())
        defs.setdefault(name, []).append((m.start(), len(text) if line_end < 0 else line_end, m.group(2), shape))
    appended: dict[int, list[str]] = {}  # line end → instructions written there
    made: dict[tuple[int, tuple[int, ...]], str] = {}  # (definition, access path) → name given
    replacements: list[tuple[int, int, str]] = []
    for start, end, percent, name, path in uses:
        before = [d for d in defs.get(name, ()) if d[0] < start]
        if not before:
            continue
        def_start, line_end, def_percent, shape = before[-1]
        parent = name
        for depth in range(1, len(path) + 1):
            key = (def_start, path[:depth])
            if key not in made:
                try:
                    element = _tuple_elements(shape)[path[depth - 1]]
                except (ValueError, IndexError):  # not a tuple, or no such element: XLA says which
                    break
                new = "_".join([name, *(str(k) for k in path[:depth])])
                while new in taken:  # the name is taken (XLA then picks another unique one, as we do)
                    new += "_"
                taken.add(new)
                made[key] = new
                appended.setdefault(line_end, []).append(
                    f"{def_percent}{new} = {element} get-tuple-element({def_percent}{parent}), "
                    f"index={path[depth - 1]}")
            parent = made[key]
            shape = _tuple_elements(shape)[path[depth - 1]]
        else:
            replacements.append((start, end, f"{percent}{parent}"))
    edits = sorted([(s, e, new) for s, e, new in replacements] +
                   [(at, at, "".join(f"  {inst}" for inst in insts)) for at, insts in appended.items()])
    out, pos = [], 0
    for s, e, new in edits:
        out.append(text[pos:s])
        out.append(new)
        pos = e
    out.append(text[pos:])
    return "".join(out)


def _hlo_error(err: Exception, text: str, path: str) -> ParseError:
    msg = str(err)  # XLA raises JaxRuntimeError("INVALID_ARGUMENT: ...") with line:col
    m = _XLA_ERROR.search(msg)
    if m:
        line, col = int(m.group(1)), int(m.group(2))
        lines = text.splitlines()
        src = lines[line - 1] if 0 < line <= len(lines) else None
        return ParseError(Span(path, line, col, src), f"not valid HLO text: {m.group(3)}")
    first = msg.strip().splitlines()[0] if msg.strip() else "cannot parse"
    return ParseError(Span(path), f"not valid HLO text: {first}")


def _span_at(text: str, offset: int, path: str) -> Span:
    line = text.count("\n", 0, offset) + 1
    start = text.rfind("\n", 0, offset) + 1
    end = text.find("\n", offset)
    return Span(path, line, offset - start + 1, text[start:end if end >= 0 else len(text)])


def _parse_text(text: str, path: str) -> Any:
    """XLA's parse of `text`; on failure, of `text` with its tuple accesses expanded (jaxlib < 0.11)."""
    bad = find_bad_tiles(text)
    if bad is not None:  # XLA would abort the process on it
        raise ParseError(_span_at(text, bad.offset, path), f"not valid HLO text: {bad.message}")
    try:
        return _jaxlib.hlo_module_from_text(text)
    except _jaxlib.XLA_ERRORS as err:
        expanded = expand_tuple_access(text)
        if expanded == text:
            raise _hlo_error(err, text, path) from None
        try:
            return _jaxlib.hlo_module_from_text(expanded)
        except _jaxlib.XLA_ERRORS as retry_err:
            # Original lines keep their numbers in the expanded text, so the position is right either way.
            raise _hlo_error(retry_err, text, path) from None


def _refuse_elided_constants(text: str, path: str) -> None:
    """Bad input: a constant whose values the file does not hold (reasoning on XLA's stand-in values
    could prove anything)."""
    # (re's search tries `\b` at every position of a dump of megabytes; `in` is a fast substring search.)
    m = _ELIDED.search(text) if _ELIDED_TEXT in text else None
    if m is None:
        return
    raise ParseError(_span_at(text, m.start(), path), "a constant elided by XLA's printer (`constant({...})`): its values "
                     "are not in the file; expected a dump written with --xla_dump_large_constants=true "
                     "(XLA_FLAGS), or compiled.as_text() of a program whose constants are small")


def parse_hlo(text: str, path: str) -> Module:
    _refuse_elided_constants(text, path)
    hlo = _parse_text(text, path)
    original = hlo.as_serialized_hlo_module_proto()
    proto = name_instructions(original)
    try:
        bytecode = _jaxlib.hlo_proto_to_stablehlo(proto)
    except _jaxlib.XLA_ERRORS as err:
        raise ParseError(Span(path), f"XLA could not convert this HLO to StableHLO: {err}") from None
    module = parse_mlir(bytecode, path, kind="hlo", name_sep=NAME_SEP, name_lines=_instruction_lines(text))
    header = next((ln for ln in leading_lines(text) if ln.startswith("HloModule")), "")
    extra: dict[str, int | str] = {k: int(v) for k, v in _HEADER_INT.findall(header)}
    extra["entry_computation"] = entry_computation_name(original)
    return dataclasses.replace(module, name=hlo.name, extra=Attrs.of(extra))
