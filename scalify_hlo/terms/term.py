"""A term: one node of the hash-consed DAG both programs are read into (`table.Terms` interns them).

This module holds the node and the reads of constants every normal form needs; the table with its
canonicalising constructor is `table.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.nodes import Literal, TensorType

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms

AttrKey = tuple[tuple[str, Any], ...]


@dataclass(frozen=True, slots=True, eq=False)
class Term:
    """One node of the shared term DAG; identity is the object (the table interns them)."""

    id: int
    op: str
    args: tuple[Term, ...]
    attrs: AttrKey
    type: TensorType

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    def __repr__(self) -> str:
        return f"t{self.id}:{self.op}{list(self.type.shape)}"

    def walk(self, seen: set[int] | None = None) -> Iterator[Term]:
        """Every distinct subterm once, children before parents; subterms already in `seen` (which the
        walk extends) are skipped, so walking many roots with one `seen` visits each node once."""
        seen = set() if seen is None else seen
        if self.id in seen:
            return
        stack: list[tuple[Term, bool]] = [(self, False)]
        while stack:
            t, expanded = stack.pop()
            if t.id in seen:
                continue
            if expanded:
                seen.add(t.id)
                yield t
                continue
            stack.append((t, True))
            stack.extend((a, False) for a in reversed(t.args) if a.id not in seen)


def scalar_value(t: Term) -> float | None:
    """The value of a scalar constant or a broadcast of one (how JAX spells `x / 16`)."""
    while t.op == "broadcast_in_dim":
        t = t.args[0]
    if t.op == "constant":
        lit: Literal = t.attr("value")
        if lit.array.size == 1:
            return float(lit.array.reshape(-1)[0])
    return None


def scalar_exact(t: Term) -> int | float | complex | None:
    """The exact value of a scalar constant or a broadcast of one: a Python int for integer and boolean
    types (an int64 or uint64 constant does not fit a float), a float or complex otherwise."""
    while t.op == "broadcast_in_dim":
        t = t.args[0]
    if t.op != "constant":
        return None
    lit: Literal = t.attr("value")
    if lit.array.size != 1:
        return None
    item = lit.array.reshape(-1)[0].item()
    return int(item) if isinstance(item, bool) else item


def peel(terms: Terms, args: tuple[Term, ...], wrapped: list[Term], shape: tuple[int, ...]) -> tuple[Term, ...] | None:
    """The operands of an elementwise op with the wrapped ones unwrapped and the splats re-splatted at
    `shape` (None if another operand is neither)."""
    inner: list[Term] = []
    for a in args:
        if a in wrapped:
            inner.append(a.args[0])
            continue
        splat = resplat(terms, a, shape)
        if splat is None:
            return None
        inner.append(splat)
    return tuple(inner)


def resplat(terms: Terms, a: Term, shape: tuple[int, ...]) -> Term | None:
    """The splat constant `a` at another shape (None if `a` is not a splat)."""
    if scalar_value(a) is None:
        return None
    scalar = a
    while scalar.op == "broadcast_in_dim":
        scalar = scalar.args[0]
    if not shape:
        return scalar
    return terms.apply("broadcast_in_dim", (scalar,), (("broadcast_dimensions", ()),), TensorType(shape, a.type.dtype))
