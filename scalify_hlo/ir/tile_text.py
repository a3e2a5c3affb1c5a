"""Tile assignments that would abort XLA's text parsers, found before XLA reads them.

XLA's HLO text parser and `HloSharding.from_string` CHECK-fail (abort the whole process, no exception)
on some malformed device lists: since jaxlib 0.12.1 a sharding whose explicit devices repeat or are
negative (`{devices=[2,2]0,0,1,1}`), and in every version an iota whose transpose is not a permutation
(`<=[2,2]T(0,0)`) or whose dims are negative, in a sharding or in iota `replica_groups`. Bad input must
be an error with a position (exit 3), never an abort, so the text is read here first and XLA sees only
tile assignments it can build.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# `devices=[2,4]` or `replica_groups=[2,4]`, then `<=[8]` or `<=[2,4]T(1,0)` (iota) or `0,1,2,...` (explicit).
# One pattern per kind: a literal prefix is searched fast (an alternation or `\b` first is 25x slower on MBs).
_TILES = {kind: re.compile(kind + r"=\[([^\]]*)\]") for kind in ("devices", "replica_groups")}
_IOTA = re.compile(r"<=\[([^\]]*)\](?:T\(([^)]*)\))?")
_EXPLICIT = re.compile(r"[-\d][-\d,]*")


@dataclass(frozen=True, slots=True)
class BadTiles:
    """A tile assignment XLA cannot build: where it starts in the text and what is wrong with it."""

    offset: int
    message: str


def _ints(text: str) -> list[int] | None:
    try:
        return [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        return None  # not a list of integers: XLA's own syntax error says where


def _check(kind: str, dims: list[int], text: str, at: int) -> str | None:
    spelled = f"{kind}=[{','.join(map(str, dims))}]"
    if not dims or min(dims) < 1:
        return f"{spelled}: expected positive tile dimensions"
    count = math.prod(dims)
    iota = _IOTA.match(text, at)
    if iota is not None:
        reshape, perm = _ints(iota.group(1)), _ints(iota.group(2) or "")
        if reshape is None or perm is None:
            return None
        if not reshape or min(reshape) < 1 or math.prod(reshape) != count:
            return f"{spelled}{iota.group(0)}: expected an iota of {count} devices in positive dims"
        if iota.group(2) is not None and sorted(perm) != list(range(len(reshape))):
            return (f"{spelled}{iota.group(0)}: the transpose T({iota.group(2)}) is not a permutation of "
                    f"0..{len(reshape) - 1}")
        return None
    explicit = _EXPLICIT.match(text, at) if kind == "devices" else None
    if explicit is None:
        return None
    devices = _ints(explicit.group(0))
    if devices is None:
        return None
    if len(devices) != count or min(devices, default=0) < 0 or len(set(devices)) != len(devices):
        shown = explicit.group(0) if len(explicit.group(0)) <= 60 else explicit.group(0)[:57] + "..."
        return f"{spelled}{shown}: expected {count} distinct non-negative device ids"
    return None


def find_bad_tiles(text: str) -> BadTiles | None:
    """The first tile assignment in `text` (HLO module text or one sharding) that XLA would abort on."""
    found: list[BadTiles] = []
    for kind, pattern in _TILES.items():
        if kind + "=[" not in text:
            continue
        for m in pattern.finditer(text):
            dims = _ints(m.group(1))
            message = None if dims is None else _check(kind, dims, text, m.end())
            if message is not None:
                found.append(BadTiles(m.start(), message))
                break
    return min(found, key=lambda b: b.offset, default=None)
