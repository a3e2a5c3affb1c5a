"""Readers: any supported file → `scalify_hlo.ir.nodes.Module`, the kind sniffed from the content.

`load` is the one place input files are read. It reads regular files only, or standard input when the
path is `-`: a FIFO would block forever and a device such as /dev/zero would never end. Input is capped
at `MAX_INPUT_BYTES` (2 GiB; the environment variable SCALIFY_MAX_INPUT_BYTES sets another cap), counted
while reading, so an endless stream on standard input stops too.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO

from scalify_hlo.parsers.hlo import leading_lines, parse_hlo
from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir.errors import InputFileError, ParseError, Span, UsageError
from scalify_hlo.ir.nodes import Module

MLIR_BYTECODE_MAGIC = b"ML\xefR"
UTF8_BOM = b"\xef\xbb\xbf"
STDIN = "-"  # the path that means standard input
STDIN_NAME = "<stdin>"  # how diagnostics and reports name it
MAX_INPUT_BYTES = 2 << 30
LIMIT_VARIABLE = "SCALIFY_MAX_INPUT_BYTES"
_CHUNK = 16 << 20  # read in pieces, so the cap is checked as bytes arrive

_EXPECTED_FILE = "expected a StableHLO (.mlir) or HLO text file, or '-' for standard input"


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
    for number, line in enumerate(leading_lines(text), start=1):
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


def input_limit() -> int:
    """The input size cap in bytes: SCALIFY_MAX_INPUT_BYTES when set, else `MAX_INPUT_BYTES`."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return MAX_INPUT_BYTES
    try:
        limit = int(text)
    except ValueError:
        limit = 0
    if limit < 1:
        raise UsageError(None, f"{LIMIT_VARIABLE}={text!r}: expected a positive number of bytes")
    return limit


def describe_size(n: int) -> str:
    """`n` bytes for a person: "2 GiB", "1.5 MiB", "100 bytes"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.4g} {unit}"
    return f"{n} bytes"


def _too_large(name: str, limit: int, size: int | None = None) -> InputFileError:
    size_text = f"is {describe_size(size)}, " if size is not None else ""
    return InputFileError(Span(name), f"{size_text}larger than the {describe_size(limit)} input limit; expected "
                          f"a program of at most that size (set {LIMIT_VARIABLE} to change the limit)")


def _read_capped(stream: BinaryIO, name: str, limit: int) -> bytes:
    """All of `stream`, or an error as soon as more than `limit` bytes have arrived."""
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = stream.read(min(_CHUNK, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        total += len(chunk)
        if total > limit:
            raise _too_large(name, limit)
        chunks.append(chunk)


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "some other kind of file"


def _not_regular(name: str, mode: int) -> InputFileError:
    if stat.S_ISDIR(mode):
        return InputFileError(Span(name), f"is a directory; {_EXPECTED_FILE}")
    return InputFileError(Span(name), f"not a regular file but {_kind(mode)}; {_EXPECTED_FILE}")


def read_input(path: str | Path, limit: int | None = None) -> bytes:
    """The bytes of one input: a regular file, or standard input for `-`, at most `limit` bytes (default
    `input_limit()`). Anything else is an `InputFileError` naming the file and what was expected."""
    cap = input_limit() if limit is None else limit
    name = str(path)
    if name == STDIN:
        if sys.stdin is None:  # (pythonw, or a daemon with stdin closed)
            raise InputFileError(Span(STDIN_NAME), f"there is no standard input; {_EXPECTED_FILE}")
        return _read_capped(sys.stdin.buffer, STDIN_NAME, cap)
    try:
        # stat before open: opening a FIFO blocks until a writer comes, and opening a device can act.
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise _not_regular(name, info.st_mode)
        if info.st_size > cap:
            raise _too_large(name, cap, info.st_size)
        # Non-blocking, and checked again on the open file: a FIFO put in its place since the stat must
        # neither block the open nor be read.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise _not_regular(name, mode)
            return _read_capped(f, name, cap)  # counted as read: the file may grow, /proc files say size 0
    except (FileNotFoundError, NotADirectoryError):
        raise InputFileError(Span(name), f"no such file; {_EXPECTED_FILE}") from None
    except IsADirectoryError:
        raise InputFileError(Span(name), f"is a directory; {_EXPECTED_FILE}") from None
    except OSError as err:
        raise InputFileError(Span(name), f"cannot read: {err.strerror or err}") from None


def load(path: str | Path, *, limit: int | None = None) -> Module:
    """Read and parse one program file (`-`: standard input); see `read_input` for what is read."""
    data = read_input(path, limit)
    return loads(data, STDIN_NAME if str(path) == STDIN else str(path))


def loads(data: bytes | str, path: str = "<string>") -> Module:
    """Parse a program from its bytes or text; `path` names it in diagnostics."""
    raw = data.encode() if isinstance(data, str) else data
    if raw.startswith(UTF8_BOM):
        raw = raw[len(UTF8_BOM):]  # editors on Windows write one; it is not part of the text
    kind = sniff(raw, path)
    if kind == "hlo":
        return parse_hlo(raw.decode("utf-8"), path)
    return parse_mlir(raw if kind == "mlir-bytecode" else raw.decode("utf-8"), path)
