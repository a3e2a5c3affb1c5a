"""Readers: any supported file → `scalify_hlo.ir.Module`, the kind sniffed from the content."""

from __future__ import annotations

from pathlib import Path

from scalify_hlo.errors import ParseError, Span
from scalify_hlo.ir import Module

MLIR_BYTECODE_MAGIC = b"ML\xefR"


def sniff(data: bytes, path: str) -> str:
    """'mlir-bytecode', 'mlir' or 'hlo', from the bytes themselves (the extension is only a hint)."""
    if not data.strip():
        raise ParseError(Span(path, 1, 1, ""), "the file is empty; expected StableHLO (MLIR) or HLO text")
    if data.startswith(MLIR_BYTECODE_MAGIC):
        return "mlir-bytecode"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        where = data[: err.start].count(b"\n") + 1
        raise ParseError(
            Span(path, where), "binary data that is neither UTF-8 text nor MLIR bytecode; "
            "expected StableHLO (.mlir text or bytecode) or HLO text") from None
    for number, line in enumerate(text.splitlines(), start=1):
        s = line.strip()
        if not s or s.startswith(("//", "/*", "*", "#loc")):
            continue
        if s.startswith("HloModule"):
            return "hlo"
        if s.startswith(("module", "func.func", '"builtin.module"', "#", "sdy.mesh")):
            return "mlir"
        raise ParseError(
            Span(path, number, 1, line),
            "unrecognised content; expected an MLIR `module` (StableHLO) or an `HloModule` header (HLO text)")
    raise ParseError(Span(path, 1, 1), "only comments; expected StableHLO (MLIR) or HLO text")


def load(path: str | Path) -> Module:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ParseError(Span(str(path)), "no such file") from None
    except IsADirectoryError:
        raise ParseError(Span(str(path)), "is a directory; expected a .mlir or HLO text file") from None
    except OSError as err:
        raise ParseError(Span(str(path)), f"cannot read: {err.strerror}") from None
    return loads(data, str(path))


def loads(data: bytes | str, path: str = "<string>") -> Module:
    raw = data.encode() if isinstance(data, str) else data
    kind = sniff(raw, path)
    if kind == "hlo":
        from .hlo import parse_hlo

        return parse_hlo(raw.decode("utf-8"), path)
    from .stablehlo import parse_mlir

    return parse_mlir(raw if kind == "mlir-bytecode" else raw.decode("utf-8"), path)
