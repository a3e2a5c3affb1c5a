"""How the values an after-program loop carries line up with a reference loop's (for `engine._induction`).

The partitioner carries each value as its shard. Where that shard was built per device (a scan's buffer of
zeros, a mask broadcast inside the loop's operands), its fact may hold a smaller global tensor than the
reference's: the zeros `[32, 1, ...]` held replicated where the reference starts from `[32, 8, ...]`.
Both readings are true of the same local data (`view`: a replicated value is the shard of its tiling),
so the loop may be read under either:

- `relaid`: a carried value that leaves an iteration more split than it entered (a slot of the buffer
  written with a batch-split update) is read again from the start as its view under that layout;
- `match`: an initial value is paired with a reference loop's initial value it is a tiling of: the
  reference body is then read over the tiled loop variable, and the after loop's step compared through
  the same view. Tiling names no axis (only how many copies), so the pairing does not depend on which
  axes the copies are taken to lie along. A value the partitioner carries twice shares its first copy's
  reference slot and loop variable;
- `invariant`: a slot the body returns unchanged holds its initial value on every iteration, and is read
  as that (XLA's body may recompute such a value rather than read it: a mask, RoPE tables).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from scalify_hlo.ir.nodes import Op
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.rules.facts import Fact, Holds, view
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


def invariant(op: Op) -> frozenset[int]:
    """The slots a loop's body returns unchanged (its block argument itself): on every iteration they hold
    their initial value, so the loop may be read with that value in place of a variable."""
    body = op.regions[1]
    return frozenset(i for i, (r, a) in enumerate(zip(body.results, body.args, strict=True)) if r is a)


def relaid(mesh: Mesh, terms: Terms, hs: Sequence[Holds], carried: Sequence[Fact]) -> list[Holds] | None:
    """`hs` with each carried value that left an iteration more split than it entered (same partial axes)
    read as its view under that layout; None when there is none to re-read."""
    out = list(hs)
    for i, (h, a) in enumerate(zip(hs, carried, strict=True)):
        if not isinstance(a, Holds) or a.layout == h.layout or a.layout.partial != h.layout.partial:
            continue
        seen = view(h.term, h.layout, a.layout.dims, mesh, terms)
        if seen is not None:
            out[i] = Holds(seen, a.layout, h.origin)
    return None if all(o is h for o, h in zip(out, hs, strict=True)) else out


def tiling(mesh: Mesh, terms: Terms, h: Holds, g: Term) -> Layout | None:
    """A layout adding mesh axes `h` does not use in front of its dims under which `h` holds exactly `g`
    (`view(h.term, h.layout, ...)` is `g`), or None. Any such layout will do: the tiling depends only on
    the number of copies along each dim."""
    t = h.term.type
    if g.type.dtype != t.dtype or g.type.rank != t.rank:
        return None
    ratios = [b // a if a and b % a == 0 else 0 for a, b in zip(t.shape, g.type.shape, strict=True)]
    if 0 in ratios:
        return None
    used = h.layout.split_axes() | h.layout.partial_axes()
    free = [a for a in mesh.names if a not in used]
    dims = _assign(mesh, ratios, free)
    if dims is None:
        return None
    want = tuple((*extra, *have) for extra, have in zip(dims, h.layout.dims, strict=True))
    if view(h.term, h.layout, want, mesh, terms) is not g:
        return None
    return Layout(want, h.layout.partial)


def _assign(mesh: Mesh, ratios: Sequence[int], free: Sequence[str]) -> list[tuple[str, ...]] | None:
    """Disjoint groups of `free` axes, one per dim, whose sizes multiply to that dim's ratio."""
    if not ratios:
        return []
    r, rest = ratios[0], ratios[1:]
    options = [()] if r == 1 else [c for k in range(1, len(free) + 1) for c in itertools.combinations(free, k)
                                   if mesh.size_of(c) == r]
    for axes in options:
        tail = _assign(mesh, rest, [a for a in free if a not in axes])
        if tail is not None:
            return [tuple(axes), *tail]
    return None


@dataclass(frozen=True, slots=True)
class Pairing:
    """How an after loop's carried values stand for a reference loop's: after slot `i` holds reference
    slot `sigma[i]`'s value as its shard under `layouts[i]`. The partitioner may carry one value twice
    (once per layout its uses want): such slots start alike and share one loop variable, `share[i]` being
    the first slot of the value (`i` itself for most). Every reference slot is held by some after slot."""

    sigma: tuple[int, ...]
    layouts: tuple[Layout, ...]
    share: tuple[int, ...]


def match(mesh: Mesh, terms: Terms, hs: Sequence[Holds], inits: Sequence[Holds]) -> Pairing | None:
    """Each after initial fact paired with a reference initial value it holds exactly or as a tiling (a
    distinct one, or the one an identical earlier fact holds); None when some value is left unpaired."""
    sigma: list[int] = []
    layouts: list[Layout] = []
    share: list[int] = []
    for i, h in enumerate(hs):
        k, lay = next(((k, h.layout) for k, g in enumerate(inits) if g.term is h.term and k not in sigma),
                      (None, None))
        if k is None:
            k, lay = next(((k, tiled) for k, g in enumerate(inits)
                           if k not in sigma and (tiled := tiling(mesh, terms, h, g.term)) is not None), (None, None))
        first = i
        if k is None:
            # A second copy of a value already carried: the same fact, the same reference slot.
            first = next((j for j in range(i) if share[j] == j and hs[j].term is h.term and hs[j].layout == h.layout), i)
            if first == i:
                return None
            k, lay = sigma[first], layouts[first]
        assert lay is not None
        sigma.append(k)
        layouts.append(lay)
        share.append(first)
    if set(sigma) != set(range(len(inits))):
        return None
    return Pairing(tuple(sigma), tuple(layouts), tuple(share))
