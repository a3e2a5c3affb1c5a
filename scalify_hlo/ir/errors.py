"""The error hierarchy: every way an input can be bad, with the place it was found.

Verdicts are values (see `report.py`); these exceptions are only for input that cannot be read at all.
The CLI turns any `ScalifyError` into one diagnostic on stderr and exit code 3, never a traceback; an
`UnsupportedError` (a legal program the tool does not model) is the exception: it is `unknown`, exit 2.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Span:
    """A place in an input file: 1-based line and column; `text` is that source line, when known."""

    file: str
    line: int | None = None
    column: int | None = None
    text: str | None = None

    def __str__(self) -> str:
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"


class ScalifyError(Exception):
    """Base of every error the tool reports as bad input (exit code 3)."""

    severity = "error"  # the word after the place in `render`

    def __init__(self, span: Span | None, message: str) -> None:
        super().__init__(message)
        self.span = span
        self.message = message

    def render(self) -> str:
        """The diagnostic as a compiler prints it: place, message, source line and caret."""
        head = f"{self.span}: {self.severity}: {self.message}" if self.span else f"{self.severity}: {self.message}"
        if self.span is None or self.span.text is None:
            return head
        line = self.span.text.rstrip("\n")
        caret = " " * max((self.span.column or 1) - 1, 0) + "^"
        return f"{head}\n  {line}\n  {caret}"

    def __str__(self) -> str:
        return self.render()


class ParseError(ScalifyError):
    """The file is not StableHLO/MLIR or HLO text we can read (empty, truncated, garbage, wrong dialect)."""


class InputFileError(ParseError):
    """The path names nothing we read as a program: missing, a directory, not a regular file (a FIFO or a
    device such as /dev/zero, which would block or never end), unreadable, or over the input size limit."""


class ShardingError(ScalifyError):
    """A sharding, replica group or device list that does not fit the module's mesh."""


class MismatchError(ScalifyError):
    """The two programs cannot be compared at all (different number of inputs/outputs, shapes, dtypes)."""


class UsageError(ScalifyError):
    """An option the tool cannot act on: an assumption about an input the program does not have."""


class UnsupportedError(ScalifyError):
    """A construct the reader understands but the tool cannot handle; surfaces as `unknown`, not exit 3."""

    severity = "unsupported"  # not an error of the input


class UnmodelledShardingError(ShardingError, UnsupportedError):
    """Legal device lists the mesh model cannot express: replica groups that are not the fibres of mesh
    axes (or of uneven sizes), tile assignments with no common mesh, maximal shardings. The program is
    valid, so this is `unknown` (exit 2), never bad input; it is still a `ShardingError`, so code that
    only asks whether a device list fits the mesh treats it like any other misfit."""
