"""Conditionals: `case` (`lax.switch`, `lax.cond`, HLO `conditional`) and `if`, in the forward derivation.

A branch index that folds to a constant takes its branch: the op is that branch's computation. An index
that is one global value (`Holds` under the replicated layout, not partial) is the same on every device,
so every device takes the same branch: each branch is derived on the same facts (the branches capture
the values they use), and result `j` holds `case(index, b_0j, ..., b_nj)` under the layout the branches'
results `b_kj` agree on. The term is uninterpreted, keyed by the branch terms: the reference's `case` is
read by the same rule on its one-device mesh, so the two meet when the index and every branch do.
`if(p, t, f)` is `case(convert(p): i32, f, t)` (a true predicate picks branch 1). An index that differs
per device is left to the shard_map body's case splits (`cases.py`, `per_device.py`), where it folds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from scalify_hlo.ir.nodes import Op, Region, TensorType, walk
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.rules import perblock
from scalify_hlo.rules.facts import Fact, Failed, Holds, PerBlock, join, view
from scalify_hlo.terms.term import Term

if TYPE_CHECKING:
    from scalify_hlo.prove.derive import Deriver

COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute",
                         "collective_broadcast"})


def ordered(op: Op) -> tuple[Region, ...]:
    """The branches in index order: `if` lists the true branch first, index 1 of `case` picks it."""
    return tuple(reversed(op.regions)) if op.opcode == "if" else op.regions


def taken(op: Op, value: int) -> int:
    """The branch a (folded) index or predicate value takes; XLA runs the last branch for an index out
    of range."""
    if op.opcode == "if":
        return 1 if value else 0
    n = len(op.regions)
    return value if 0 <= value < n else n - 1


def index_value(d: Deriver, op: Op, f: Fact) -> int | None:
    """The index's value, when it is one constant on every device."""
    g = d.lift(f)
    if not isinstance(g, Holds) or g.layout.partial:
        return None
    folded = d.fold(g.term)
    if folded is None or folded.size != 1:
        return None
    return int(folded.reshape(-1)[0])


def conditional(d: Deriver, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """The derivation hook of `case` and `if` (see the module docstring)."""
    value = index_value(d, op, facts[0])
    branches = ordered(op)
    if value is not None:
        return d.region(branches[taken(op, value)], ())
    g = d.lift(facts[0])
    if isinstance(g, PerBlock):
        return _per_device(d, op, g)
    if not isinstance(g, Holds):
        return tuple(d.ctx.unsupported(op, "a branch index that differs from device to device") for _ in op.results)
    if g.layout.partial:
        return tuple(d.ctx.unsupported(op, "a branch index that is still partial") for _ in op.results)
    index = g.term
    if op.opcode == "if":
        index = d.terms.apply("convert", (index,), (), TensorType((), "i32"))
    derived = [d.region(r, ()) for r in branches]
    return tuple(_result(d, op, index, [b[j] for b in derived]) for j in range(len(op.results)))


def _per_device(d: Deriver, op: Op, index: PerBlock) -> tuple[Fact, ...]:
    """An index that is a per-device scalar of the data (rules/perblock.py): every device runs every
    branch (they are pure) and selects its own result. Not where a branch communicates: devices taking
    different branches would not meet in its collective."""
    if any(inner.opcode in COLLECTIVES for r in op.regions for inner in walk(r.ops)):
        return tuple(d.ctx.unsupported(op, "a branch index that differs per device, around a collective")
                     for _ in op.results)
    derived = [d.region(r, (), keep_blocks=True) for r in ordered(op)]
    out: list[Fact] = []
    for j, r in enumerate(op.results):
        lifted = [d.lift(b[j]) for b in derived]
        failed = next((f for f in lifted if isinstance(f, Failed)), None)
        if failed is not None:  # as in `_result`: only a branch that runs makes it wrong
            out.append(dataclasses.replace(failed, partial=False))
            continue
        out.append(perblock.select_branches(d.ctx, op, index, lifted, r.tensor, op.opcode == "if"))
    return tuple(out)


def _result(d: Deriver, op: Op, index: Term, facts: Sequence[Fact]) -> Fact:
    """Result `j` of a conditional on a global index, from every branch's fact of it."""
    lifted = [d.lift(f) for f in facts]
    failed = next((f for f in lifted if isinstance(f, Failed) and f.evidence), None) or \
        next((f for f in lifted if isinstance(f, Failed)), None)
    if failed is not None:
        # Only a branch that runs makes it wrong: a contradiction in a branch must be shown by running the
        # programs, never by values built at the op (which assume the op's branch runs).
        return dataclasses.replace(failed, partial=False)
    holds = [f for f in lifted if isinstance(f, Holds)]
    if len(holds) != len(lifted):
        return d.ctx.unsupported(op, "a branch result that is not a tensor")
    layout = _common_layout([h.layout for h in holds])
    if layout is None:
        found = "; ".join(d.ctx.describe(h.layout) for h in holds)
        return d.ctx.unsupported(op, f"branches whose results are laid out differently ({found})")
    terms: list[Term] = []
    for h in holds:
        t = h.term if h.layout == layout else view(h.term, h.layout, layout.dims, d.mesh, d.terms)
        if t is None:
            return d.ctx.unsupported(op, "branches whose results are laid out differently")
        terms.append(t)
    origin = next((h.origin for h in holds if h.origin is not None), None)
    if all(t is terms[0] for t in terms):
        return Holds(terms[0], layout, origin)  # every branch computes the same value: the index is moot
    types = {t.type for t in terms}
    if len(types) != 1:
        return d.ctx.unsupported(op, "branches whose results are global tensors of different shapes")
    return Holds(d.terms.mk("case", (index, *terms), (), terms[0].type), layout, origin)


def _common_layout(layouts: list[Layout]) -> Layout | None:
    """The layout every branch result can be viewed as: theirs when they agree, else the most split one
    (a replicated result is a tiled copy), with the same partial axes on every branch."""
    if all(lay == layouts[0] for lay in layouts):
        return layouts[0]
    if len({lay.partial for lay in layouts}) != 1:
        return None
    return join(layouts)
