"""HLO text → common IR: XLA's own parser, XLA's HLO→StableHLO converter, then the StableHLO walk.

Reads XLA dumps (`*.before_optimizations.txt`, `*.after_spmd-partitioning.*.txt`, any pass dump) and
`compiled.as_text()`. Instruction names survive the conversion (see `_hloproto`), and each op knows its
line in the dump so a report can point into it.
"""

from __future__ import annotations

import dataclasses
import re

from scalify_hlo import _jaxlib
from scalify_hlo.errors import ParseError, Span
from scalify_hlo.ir import Attrs, Module

from ._hloproto import NAME_SEP, entry_computation_name, name_instructions
from .stablehlo import parse_mlir

_XLA_ERROR = re.compile(r"(\d+):(\d+): error: ([^\n]*)")
_HEADER_INT = re.compile(r"\b(num_partitions|replica_count)=(\d+)")


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


def parse_hlo(text: str, path: str) -> Module:
    try:
        hlo = _jaxlib.hlo_module_from_text(text)
    except Exception as err:  # XLA raises JaxRuntimeError("INVALID_ARGUMENT: ...") with line:col
        msg = str(err)
        m = _XLA_ERROR.search(msg)
        if m:
            line, col = int(m.group(1)), int(m.group(2))
            lines = text.splitlines()
            src = lines[line - 1] if 0 < line <= len(lines) else None
            raise ParseError(Span(path, line, col, src), f"not valid HLO text: {m.group(3)}") from None
        first = msg.strip().splitlines()[0] if msg.strip() else "cannot parse"
        raise ParseError(Span(path), f"not valid HLO text: {first}") from None
    original = hlo.as_serialized_hlo_module_proto()
    proto = name_instructions(original)
    try:
        bytecode = _jaxlib.hlo_proto_to_stablehlo(proto)
    except Exception as err:
        raise ParseError(Span(path), f"XLA could not convert this HLO to StableHLO: {err}") from None
    module = parse_mlir(bytecode, path, kind="hlo", name_sep=NAME_SEP, name_lines=_instruction_lines(text))
    header = next((ln for ln in text.splitlines() if ln.startswith("HloModule")), "")
    extra: dict[str, int | str] = {k: int(v) for k, v in _HEADER_INT.findall(header)}
    extra["entry_computation"] = entry_computation_name(original)
    return dataclasses.replace(module, name=hlo.name, extra=Attrs.of(extra))
