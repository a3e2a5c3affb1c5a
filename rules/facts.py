"""What the prover knows about one after-program value: the `Holds` relation and its companions.

`Holds(term, layout)` on an after-value `v` means: on every device `c`, `v[c]` is the shard at `c` of the
global tensor `term` under `layout` (DESIGN §3). `Varying` is a small integer-like value that depends only
on the device (shard offsets computed from `partition-id`, constant tables indexed by it), kept as one
vectorised row per device. `Failed` is a value about which nothing can be said, with the reason; it is
*evidence* of a discrepancy when layouts contradict each other, and only `unknown` otherwise.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Literal, Op, TensorType, Value
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.machine import assemble, shard
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term


@dataclass(frozen=True, slots=True)
class Holds:
    term: Term
    layout: Layout
    origin: Op | None = None  # the after-op that made the value partial: where a collective is missing
    # For a scalar partial over axes `A` made by a local reduce of a split tensor: the blockwise
    # reduction, element b_A(c) of which device `c` holds (its block's reduction), and `A` (`PerBlock`);
    # kept by a broadcast or reshape of that scalar, whose every element on `c` is then that value.
    blocks: tuple[Term, tuple[str, ...]] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class PerBlock:
    """A scalar that differs per device by its data (rules/perblock.py): on device `c`, element `b_A(c)`
    of `term` (shape `[n_A]`; `b_A(c)`: the mixed-radix index of `c`'s coordinates over `axes`, first
    major), e.g. the reduction of the device's block of a tensor split over `axes`. `failure` is what
    reading the value as a partial one found: reported wherever the value cannot be carried on."""

    term: Term
    axes: tuple[str, ...]
    failure: Failed


@dataclass(frozen=True, slots=True, eq=False)
class Varying:
    """`values[c]` is the local value on device `c` (values has shape [devices, *local shape])."""

    values: np.ndarray
    type: TensorType


@dataclass(frozen=True, slots=True)
class Failed:
    reason: str
    op: Op | None
    evidence: bool  # True: layouts contradict (a discrepancy); False: unsupported, so `unknown`
    origin: Op | None = None  # for partial values consumed wrongly: the op that made them partial
    expected: str | None = None
    found: str | None = None
    # The contradiction is a value still partial where a whole one is needed: a definite fact about the
    # program (no layout left unrecognised), so a case can be built at the op when the program is too big
    # to run.
    partial: bool = False


def upstream(f: Failed, op: Op) -> Failed:
    """`f` carried on through `op`, which consumes the value that failed (the failure stays `f`'s)."""
    return dataclasses.replace(f, op=op)


@dataclass(frozen=True, slots=True)
class TupleFact:
    elements: tuple[Fact, ...]


NEG, POS = -(1 << 62), 1 << 62  # a window's open ends: no bound below, none above


@dataclass(frozen=True, slots=True, eq=False)
class Window:
    """Per device `c`, the half-open range `[lo[c], hi[c])` of a base tensor's values (`NEG`/`POS`: open)."""

    lo: np.ndarray
    hi: np.ndarray

    def __and__(self, other: Window) -> Window:
        return Window(np.maximum(self.lo, other.lo), np.minimum(self.hi, other.hi))

    def within(self, other: Window) -> bool:
        """Every device's range lies inside `other`'s (empty ranges lie anywhere)."""
        empty = self.lo >= self.hi
        return bool(np.all(empty | ((self.lo >= other.lo) & (self.hi <= other.hi))))


@dataclass(frozen=True, slots=True, eq=False)
class Shifted:
    """An index shifted per device (`ids - axis_index * v_local`): on device `c`, `base[c] + shift[c]` at
    the positions where `base[c]` lies in `window`, and at the others a value in `outside`'s inclusive
    per-device bounds (None: any value)."""

    base: Holds
    shift: np.ndarray
    window: Window | None
    outside: tuple[np.ndarray, np.ndarray] | None
    origin: Op | None  # the op that computed the shift (where a wrong offset is made)


@dataclass(frozen=True, slots=True, eq=False)
class InWindow:
    """A mask: on device `c`, whether `base[c]` lies in `window` (or outside it, when `negated`)."""

    base: Holds
    window: Window
    negated: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Lookup:
    """A gather from a table split along the gathered dim over `axes`: on device `c`, the shard of `value`
    where the index `base[c]` lies in `window` (the rows that device holds), rows of its own shard elsewhere."""

    value: Holds
    base: Holds
    window: Window
    axes: tuple[str, ...]
    origin: Op


@dataclass(frozen=True, slots=True, eq=False)
class Blocks:
    """Output `index` of an argmax/argmin reduce over a dim split over `axes` (rules/argreduce.py): on device
    `c`, the best (value, index) pair of `c`'s block. `whole` are the global reduction's outputs, which
    combining every block with the same body and `inits` gives; `layout` lays the result out without the
    blocks; `reduced` is the operands' dim the blocks cut. `dim`: where a reshape put a unit dim for the
    block (None: not yet); `gathered`: an all-gather over `axes` along it collected every block on every
    device."""

    whole: tuple[Term, ...]
    index: int
    layout: Layout
    axes: tuple[str, ...]
    kind: str  # "argmax" | "argmin"
    inits: tuple[Term, ...]
    origin: Op
    reduced: int
    dim: int | None = None
    gathered: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Best:
    """Where each device's block attains a max/min over a dim split over `axes` (rules/argreduce.py): on
    device `c`, element `i` is whether `c`'s block reduction equals `value[i]`, the global one (`value` is
    the reduction of `operand` over dim `reduced`; `layout` lays it out). With `pick` (the global
    argmax/argmin's index term) it is the device's candidate instead: the global index of the first best
    element of its block where the block attains the best, elsewhere a fill no index exceeds."""

    value: Term
    operand: Term
    reduced: int
    axes: tuple[str, ...]
    layout: Layout
    kind: str  # "argmax" | "argmin"
    origin: Op
    pick: Term | None = None


# What a halo holds outside the tensor: a value, the rows at the other end ("wrap"), or unknown (None).
Fill: TypeAlias = float | typing.Literal["wrap"] | None


@dataclass(frozen=True, slots=True, eq=False)
class Halo:
    """Rows of split dims around each device's block (rules/halo.py). For each `(dim, lo, hi)` of `sides`
    (a dim of `base` split over some axes, in blocks of `block` rows), device `c` holds the global rows
    `[b(c)·block − lo, b(c)·block + block + hi)` of `base.term` along `dim`; along the other dims it holds
    what `base` says. At positions outside the tensor it holds `fill` (None: unknown values; "wrap": the
    rows at the other end, as a cyclic shift brings them). Negative extents are a slice of the block; positive
    ones rows received from the neighbours."""

    base: Holds
    sides: tuple[tuple[int, int, int], ...]  # (dim, lo, hi), by dim
    fill: Fill
    origin: Op | None  # the op that last placed the rows (a slice, permute or concatenate)


# Entries of a `Rows` table that are not positions of the tensor.
OUT_ROW = -(1 << 40)  # the row holds the fill value (a row of padding)
JUNK_ROW = -(1 << 41)  # the row holds values no rule knows (padding of another value than the fill)


@dataclass(frozen=True, slots=True, eq=False)
class Rows:
    """Rows of one dim held per device by table (rules/rows.py): device `c` holds, at local position `r`
    along `dim`, the global row `table[c, r]` of `base.term`; along the other dims it holds what `base`
    says (its layout leaves `dim` whole). A row outside the tensor, or `OUT_ROW`, holds `fill` (None:
    unknown values); a `JUNK_ROW` holds unknown values."""

    base: Holds
    dim: int
    table: np.ndarray  # [devices, local rows] of int64
    fill: float | None
    origin: Op | None  # the op that last placed the rows


@dataclass(frozen=True, slots=True, eq=False)
class Written:
    """A dynamic-update-slice into a dim split over some axes at an index shifted to each device's block
    (rules/masking.py): on device `c`, its block of `x` with `update` written at `index` on it, clamped into
    the block as the op clamps (right only where the index lies in the block)."""

    x: Holds
    update: Holds
    index: Shifted
    dim: int
    origin: Op


Masked: TypeAlias = Shifted | InWindow | Lookup
Fact: TypeAlias = Holds | Varying | Failed | TupleFact | Masked | Blocks | Best | PerBlock | Halo | Rows | Written


def view(term: Term, have: Layout, want: tuple[tuple[str, ...], ...], mesh: Mesh, terms: Terms) -> Term | None:
    """`term` (held under `have`) seen as the global tensor held under the more split dims `want`.

    A value replicated over axes `A` is, on every device, the shard of the tensor made of `n_A` copies
    of it (`tile`, the added axes major), and not already used by `have` (split or partial). A dim split
    over the same axes in another order holds its blocks in another order: a data movement of the tensor
    (`permute_blocks`), so `want` may list a dim's axes in any order.
    """
    used = have.split_axes() | have.partial_axes()
    wanted = [a for w in want for a in w]
    if len(set(wanted)) != len(wanted):
        return None
    for d, (h, w) in enumerate(zip(have.dims, want, strict=True)):
        if h == w:
            continue
        extra = tuple(a for a in w if a not in h)
        if not set(h) <= set(w) or any(a in used for a in extra):
            return None
        if (*extra, *h) == w:
            term = terms.tile(term, d, mesh.size_of(extra))
            continue
        moved = permute_blocks(term, d, h, w, mesh, terms)
        if moved is None:
            return None
        term = moved
    return term


def permute_blocks(term: Term, d: int, have: tuple[str, ...], want: tuple[str, ...], mesh: Mesh,
                   terms: Terms) -> Term | None:
    """`term`, split along `d` over `have`, seen as split over `want` (`have`'s axes in any order, plus
    axes the value is replicated over).

    Device `c` holds block `b_have(c)` (the mixed-radix index of its coordinates over `have`, first axis
    major). The tensor whose block `b_want(c)` is that block is `term` with the block digits of `d`
    reordered from `have`'s order to `want`'s, repeated along the digits of the added axes: a data
    movement (and a broadcast). None for an uneven split."""
    assert set(have) <= set(want)
    n = mesh.size_of(have)
    size = term.type.shape[d]
    if size % n:
        return None
    digits = [[(f"_{i}", s)] for i, s in enumerate(term.type.shape)]
    digits[d] = [*((a, mesh.axis_size(a)) for a in have), ("_local", size // n)]
    target = [[f"_{i}"] for i in range(term.type.rank)]
    target[d] = [*want, "_local"]
    return regroup(terms, term, digits, target, [(a, mesh.axis_size(a)) for a in want if a not in have])


def regroup(terms: Terms, term: Term, digits: Sequence[Sequence[tuple[str, int]]],
            target: Sequence[Sequence[str]], new: Sequence[tuple[str, int]] = ()) -> Term:
    """`term` with each dim `i` cut into the named digits `digits[i]` (major first; their sizes multiply to
    the dim) and the digits regrouped into the dims of `target` (runs of digit names, major first, every
    digit used once): a pure data movement, reshape → transpose → reshape (normalised by `Terms.apply`).
    Digits in `new` (name, size) are not `term`'s: the value is repeated along them (a broadcast)."""
    fine = [dg for dim in digits for dg in dim]
    names = [nm for nm, _ in fine]
    sizes = dict([*fine, *new])
    order_all = [nm for run in target for nm in run]
    assert len(set(names) | {nm for nm, _ in new}) == len(names) + len(new) == len(order_all)
    assert set(order_all) == set(sizes)
    assert all(math.prod(s for _, s in dim) == n for dim, n in zip(digits, term.type.shape, strict=True))
    dtype = term.type.dtype
    kept = [nm for nm in order_all if nm in names]
    order = tuple(names.index(nm) for nm in kept)
    t = terms.apply("reshape", (term,), (), TensorType(tuple(s for _, s in fine), dtype))
    t = terms.apply("transpose", (t,), (("permutation", order),), TensorType(tuple(fine[o][1] for o in order), dtype))
    if new:
        where = tuple(order_all.index(nm) for nm in kept)
        t = terms.apply("broadcast_in_dim", (t,), (("broadcast_dimensions", where),),
                        TensorType(tuple(sizes[nm] for nm in order_all), dtype))
    return terms.apply("reshape", (t,), (), TensorType(tuple(math.prod(sizes[nm] for nm in run) for run in target),
                                                       dtype))


def join(layouts: list[Layout]) -> Layout | None:
    """The most split layout every operand layout can be viewed as (per dim: the others are suffixes)."""
    if not layouts:
        return None
    rank = layouts[0].rank
    dims = []
    for d in range(rank):
        best = max((lay.dims[d] for lay in layouts), key=len)
        if any(best[len(best) - len(lay.dims[d]):] != lay.dims[d] for lay in layouts):
            return None
        dims.append(best)
    partials = {lay.partial for lay in layouts if lay.partial}
    partial = next(iter(partials)) if len(partials) == 1 else ()
    if len(partials) > 1:
        return None
    try:
        return Layout(tuple(dims), partial)
    except ShardingError:
        return None  # the operands use one axis on different dims: their shards do not line up


def _digits(shape: Sequence[int], layout: Layout, mesh: Mesh) -> list[list[tuple[str, int]]] | None:
    """Each dim of `shape`, held under `layout`, as `regroup` digits: its axes (named by themselves, size-1
    axes left out), then its local size (`_k` for the k-th local size that is not 1; a 1 is left out).
    None where a split is uneven."""
    local = layout.local_shape(shape, mesh)
    out: list[list[tuple[str, int]]] = []
    k = 0
    for n, axes, ln in zip(shape, layout.dims, local, strict=True):
        if ln * mesh.size_of(axes) != n:
            return None
        dim = [(a, mesh.axis_size(a)) for a in axes if mesh.axis_size(a) > 1]
        if ln != 1:
            dim.append((f"_{k}", ln))
            k += 1
        out.append(dim)
    return out


def as_layout(h: Holds, layout: Layout, shape: Sequence[int], mesh: Mesh, terms: Terms) -> Term | None:
    """`h`'s value as the global tensor of `shape` held under `layout`, where every device holds the same
    numbers in the same order under both (XLA bitcasts away a unit dim that a split dim left on each
    device: `[1, s] -> [s]`, a row of the batch, then read as a block of the flattened `[b * s]`): the
    axes and the local sizes that are not 1, as digits, regrouped (`regroup`), `h` repeated along the axes
    it does not use. None where the local shapes differ, a split is uneven, a value is partial, or `h` uses
    an axis `layout` does not."""
    if h.layout.partial or layout.partial:
        return None
    have, want = _digits(h.term.type.shape, h.layout, mesh), _digits(shape, layout, mesh)
    if have is None or want is None:
        return None
    mine = {nm: n for dim in have for nm, n in dim}
    wanted = {nm: n for dim in want for nm, n in dim}
    local = {nm: n for nm, n in mine.items() if nm.startswith("_")}
    if not set(mine) <= set(wanted) or local != {nm: n for nm, n in wanted.items() if nm.startswith("_")}:
        return None
    new = [(nm, n) for nm, n in wanted.items() if nm not in mine]  # axes `h` is replicated over
    return regroup(terms, h.term, have, [[nm for nm, _ in dim] for dim in want], new)


def realigned(hs: Sequence[Holds], mesh: Mesh, terms: Terms) -> tuple[tuple[Term, ...], Layout] | None:
    """Operands of an elementwise op whose layouts split different dims, all as global tensors under the
    layout of one that uses every axis (`as_layout`); None where that cannot be."""
    used = {a for h in hs for a in h.layout.split_axes()}
    like = next((h for h in hs if h.layout.split_axes() == used), None)
    if like is None:
        narrowed = [_constant_dims_whole(h, mesh, terms) for h in hs]
        if narrowed == list(hs):
            return None
        return realigned(narrowed, mesh, terms)
    out: list[Term] = []
    for h in hs:
        t = h.term if h is like else as_layout(h, like.layout, like.term.type.shape, mesh, terms)
        if t is None:
            return None
        out.append(t)
    return tuple(out), like.layout


def _constant_dims_whole(h: Holds, mesh: Mesh, terms: Terms) -> Holds:
    """`h` read as whole along the dims its broadcast creates: every block of a value constant along a dim is
    the same, so a device holding one holds the broadcast to the block's size, whatever axes split the dim
    (XLA lays out adafactor's row factor, broadcast along the columns, over axes other than the gradient's:
    an elementwise op then re-reads it as split like its fellow operand). `h` itself where nothing changes."""
    t = h.term
    if t.op != "broadcast_in_dim" or h.layout.partial:
        return h
    kept = set(t.attr("broadcast_dimensions"))
    created = [d for d in range(t.type.rank) if d not in kept and h.layout.dims[d]]
    if not created:
        return h
    local = h.layout.local_shape(t.type.shape, mesh)
    shape = tuple(local[d] if d in created else n for d, n in enumerate(t.type.shape))
    dims = tuple(() if d in created else axes for d, axes in enumerate(h.layout.dims))
    narrow = terms.apply("broadcast_in_dim", t.args, t.attrs, TensorType(shape, t.type.dtype))
    return Holds(narrow, Layout(dims), h.origin)


def lift_as(ctx: Ctx, f: Varying, layout: Layout) -> Holds | None:
    """`f` as the shard under `layout` of a constant tensor, if it is one. (A device-varying value may be
    the shard of several tensors: `ctx.lift` takes the first layout that fits, this one the layout the
    value's fellow operands have.)"""
    values = np.asarray(f.values)
    try:
        full = assemble(values, layout, ctx.mesh)
        again = shard(full, layout, ctx.mesh)
    except (ShardingError, ValueError):
        return None
    if again.shape != values.shape or not np.array_equal(again, values):
        return None
    return Holds(constant_term(full, TensorType(full.shape, f.type.dtype), ctx.terms), layout)


def unshifted(ctx: Ctx, f: Fact) -> Fact:
    """A `Shifted` index without a window (`ids + axis_index * n` everywhere, no mask taken of it) as the
    plain tensor it is, `base + offsets` under the base's layout, when its offsets are the shards of a
    constant tensor there (the block offsets of indices into a split dim); anything else unchanged."""
    if not isinstance(f, Shifted) or f.window is not None or f.base.layout.partial:
        return f
    base = f.base
    local = base.layout.local_shape(base.term.type.shape, ctx.mesh)
    shift = np.asarray(f.shift).reshape((-1, *([1] * len(local))))
    offsets = Varying(np.broadcast_to(shift, (shift.shape[0], *local)), TensorType(local, base.term.type.dtype))
    held = lift_as(ctx, offsets, base.layout)
    if held is None:
        return f
    return Holds(ctx.terms.apply("add", (base.term, held.term), (), base.term.type), base.layout, base.origin)


def iota_dim(values: np.ndarray) -> int | None:
    """The dim along which `values` count 0, 1, 2, ... (the same along the others), if there is one."""
    if values.ndim >= 1 and values.size > 1:
        for d in range(values.ndim):
            iota = np.broadcast_to(
                np.arange(values.shape[d]).reshape([-1 if i == d else 1 for i in range(values.ndim)]), values.shape)
            if np.array_equal(values, iota):
                return d
    return None


def constant_term(values: np.ndarray, type: TensorType, terms: Terms) -> Term:
    """A term for a small constant tensor; an iota when it is one (GSPMD materialises offsets)."""
    if np.shape(values) == type.shape and (d := iota_dim(values)) is not None:
        return terms.iota(d, type)
    return terms.constant(Literal(np.ascontiguousarray(values), type.dtype), type)


@dataclass(eq=False)
class Ctx:
    """What a transfer rule may use besides its operands' facts."""

    terms: Terms
    mesh: Mesh
    fold: Callable[[Term], np.ndarray | None]  # the value of a small constant term, else None
    lift: Callable[..., Fact]  # a device-varying value as a Holds fact (like a given layout), or Failed
    varying: Callable[[Op, tuple[Fact, ...]], Fact | None]  # evaluate index arithmetic per device
    known: Callable[[Term], int] = lambda t: 0  # 2: the reference computes this term, 1: a like one
    source: Callable[[Varying], Op | None] = lambda v: None  # the op that computed a device-varying value
    uses: Callable[[Value], int] = lambda v: 2  # how often the program reads a value (2 where not counted)
    # Partial scalars re-read as per-device values (rules/perblock.py): the blockwise term and the failure
    # reading it as partial found. An output that reads the term and differs is reported as that failure.
    per_block: list[tuple[Term, Failed]] = dataclasses.field(default_factory=list)

    def fail(self, op: Op, reason: str, *, evidence: bool, origin: Op | None = None,
             expected: str | None = None, found: str | None = None, partial: bool = False) -> Failed:
        return Failed(reason, op, evidence, origin, expected, found, partial)

    def unsupported(self, op: Op, what: str) -> Failed:
        return Failed(f"{op.opcode}: {what}", op, False)

    def not_tensors(self, op: Op, facts: Sequence[Fact]) -> Failed:
        """`op` cannot read some of `facts` as tensors (argmax block results say what reads them)."""
        b = next((f for f in facts if isinstance(f, Blocks)), None)
        if b is not None:
            return self.unsupported(op, f"{b.kind} results of each device's block read by {op.opcode} (only an "
                                    "all-gather and the same reduce, or a shard_map's out_specs, read them)")
        return self.unsupported(op, "operands that are not tensors")

    def describe(self, layout: Layout) -> str:
        return layout.describe(self.mesh)

