"""Chains of reshapes and transposes in one normal form, so equal data movements meet as one term.

A chain of reshapes and transposes only permutes the elements of its root. We track that permutation
symbolically: the root's dims are cut into *digits* (mixed-radix factors, refined whenever a reshape
cuts through one), and every dim of the result is a run of digits. The normal form is

    reshape(transpose(reshape(root, digits), order), result shape)

with the digits coalesced wherever they stay adjacent, and trivial steps left out. Two chains that move
the same elements the same way get the same normal form; a chain that moves nothing is its root. The
cost is linear in the number of dims, never in the number of elements.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.terms import slicing
from scalify_hlo.terms.term import Term

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms

MOVEMENT = frozenset({"reshape", "transpose"})


@dataclass
class Chain:
    """A root's dims cut into digits (ids into `sizes`, unit dims none), and the current value's dims as
    runs of them: what a chain of reshapes and transposes (and, in `reduce_form`, reduces) has made of it."""

    root: Term
    sizes: dict[int, int]
    root_dims: list[list[int]]  # the root's dims as digit runs (refined as needed)
    dims: list[list[int]]  # the current value's dims as digit runs
    next_id: int

    @staticmethod
    def of(root: Term) -> Chain:
        sizes: dict[int, int] = {}
        root_dims: list[list[int]] = []
        for i, n in enumerate(root.type.shape):
            if n == 1:
                root_dims.append([])
            else:
                sizes[i] = n
                root_dims.append([i])
        return Chain(root, sizes, root_dims, [list(d) for d in root_dims], len(root.type.shape))

    def transpose(self, perm: tuple[int, ...]) -> None:
        self.dims = [self.dims[p] for p in perm]

    def _split(self, digit: int, major: int) -> tuple[int, int]:
        """Cut `digit` into a major part of size `major` and the minor rest, everywhere it occurs."""
        a, b = self.next_id, self.next_id + 1
        self.next_id += 2
        size = self.sizes.pop(digit)
        self.sizes[a], self.sizes[b] = major, size // major
        for runs in (self.root_dims, self.dims):
            for run in runs:
                if digit in run:
                    i = run.index(digit)
                    run[i:i + 1] = [a, b]
        return a, b

    def reshape(self, shape: tuple[int, ...]) -> bool:
        flat = [d for run in self.dims for d in run]
        out: list[list[int]] = []
        k = 0
        for n in shape:
            run: list[int] = []
            have = 1
            while have < n:
                if k >= len(flat):
                    return False
                d = flat[k]
                size = self.sizes[d]
                if have * size <= n:
                    run.append(d)
                    have *= size
                    k += 1
                    continue
                if n % have or size % (n // have):
                    return False
                a, b = self._split(d, n // have)
                flat[k:k + 1] = [a, b]
                run.append(a)
                have = n
                k += 1
            if have != n:
                return False
            out.append(run)
        if k != len(flat):
            return False
        self.dims = out
        return True

    def normal_form(self, terms: Terms, out: TensorType) -> Term:
        root = self.root
        order = [d for run in self.root_dims for d in run]
        flat = [d for run in self.dims for d in run]
        # Coalesce digits adjacent in the root, in the result, and inside one dim of each.
        root_dim_of = {d: i for i, run in enumerate(self.root_dims) for d in run}
        out_dim_of = {d: i for i, run in enumerate(self.dims) for d in run}
        groups: list[list[int]] = []
        for d in order:
            if groups:
                last = groups[-1][-1]
                pos = flat.index(last)
                if (pos + 1 < len(flat) and flat[pos + 1] == d and root_dim_of[last] == root_dim_of[d]
                        and out_dim_of[last] == out_dim_of[d]):
                    groups[-1].append(d)
                    continue
            groups.append([d])
        fine = [1] * len(groups)
        for i, g in enumerate(groups):
            for d in g:
                fine[i] *= self.sizes[d]
        first = {g[0]: i for i, g in enumerate(groups)}
        perm = tuple(first[d] for d in flat if d in first)
        if perm == tuple(range(len(perm))):
            if out.shape == root.type.shape:
                return root
            # through `apply`: a movement chain that ends in one reshape of a join is the join of reshapes,
            # as that reshape written alone is
            return terms.apply("reshape", (root,), (), out)
        dtype = root.type.dtype
        x = root
        if tuple(fine) != root.type.shape:
            x = terms.mk("reshape", (x,), (), TensorType(tuple(fine), dtype))
        moved = TensorType(tuple(fine[p] for p in perm), dtype)
        x = terms.mk("transpose", (x,), (("permutation", perm),), moved)
        if moved.shape != out.shape:
            x = terms.mk("reshape", (x,), (), out)
        return x


def _chain(t: Term) -> Chain | None:
    """The chain of movements ending in `t` (whose root is the first non-movement term)."""
    steps: list[Term] = []
    x = t
    while x.op in MOVEMENT:
        steps.append(x)
        x = x.args[0]
    chain = Chain.of(x)
    for s in reversed(steps):
        if s.op == "transpose":
            chain.transpose(tuple(s.attr("permutation")))
        elif not chain.reshape(s.type.shape):
            return None
    return chain


def normalize(terms: Terms, op: str, x: Term, attrs: dict[str, object], out: TensorType) -> Term | None:
    """The normal form of `op(x)` (a reshape or transpose), or None to keep it as it is."""
    if op == "reshape" and x.op not in MOVEMENT:
        return None  # a reshape of a non-movement is its own normal form (`_reshape` moved what it could)
    chain = _chain(x)
    if chain is None:
        return None
    if op == "transpose":
        chain.transpose(tuple(attrs["permutation"]))  # type: ignore[arg-type]
    elif not chain.reshape(out.shape):
        return None
    return chain.normal_form(terms, out)



def _rows_dim(shape: tuple[int, ...], dim: int, out: tuple[int, ...], offsets: list[int]) -> int | None:
    """The dim `e` of `out` that a reshape from `shape` maps the rows of `dim` to, when rows starting at each of
    `offsets` stay whole rows of `e`: the dims before `dim` make the dims before `e` (equal products) and the
    elements of a row-run from each offset start a row of `e`. None when no such dim exists."""
    pre, post = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    prefix = 1
    for e, n in enumerate(out):
        if prefix == pre:
            q = math.prod(out[e + 1:])
            if all((o * post) % q == 0 for o in offsets):
                return e
        prefix *= n
        if prefix > pre:
            return None
    return None


def reshape_outward(terms: Terms, x: Term, out: TensorType) -> Term | None:
    """`reshape(x)` with the slice or concatenate `x` (along one dim) moved outside it, where the rows of that
    dim stay whole rows of a result dim: `jnp.roll(x.reshape(n, -1), k, 0).reshape(-1)` (a join of row
    blocks, reshaped) is then the rows of `x` rolled, both spellings one term. Slices and joins outermost is
    the normal form (`slicing.py`); a slice moves out only where its reshape then cancels another (a slice
    of a batch dim, reshaped to drop it, stays: `slicing` pulls it out of the ops that treat it as a batch
    dim). None when `x` is neither or its rows do not stay whole."""
    if x.op == "slice" and all(s == 1 for s in (x.attr("strides") or ())):
        (y,) = x.args
        lo, hi = tuple(x.attr("start_indices")), tuple(x.attr("limit_indices"))
        cut = [d for d, (a, b, n) in enumerate(zip(lo, hi, y.type.shape, strict=True)) if (a, b) != (0, n)]
        if len(cut) != 1:
            return None
        (d,) = cut
        n = y.type.shape[d]
        e = _rows_dim(y.type.shape, d, out.shape, [lo[d], n])
        if e is None:
            return None
        post, q = math.prod(y.type.shape[d + 1:]), math.prod(out.shape[e + 1:])
        full = tuple(n * post // q if k == e else m for k, m in enumerate(out.shape))
        whole = terms.apply("reshape", (y,), (), TensorType(full, out.dtype))
        if whole.op == "reshape":
            return None  # only where the reshapes cancel: a slice of a dim a reshape made is a slice of its rows
        return slicing.slice_along(terms, whole, e, lo[d] * post // q, hi[d] * post // q)
    if x.op == "concatenate" and len(x.args) > 1:
        d = int(x.attr("dimension"))
        sizes = [p.type.shape[d] for p in x.args]
        e = _rows_dim(x.type.shape, d, out.shape, sizes)
        if e is None:
            return None
        post, q = math.prod(x.type.shape[d + 1:]), math.prod(out.shape[e + 1:])
        parts = tuple(terms.apply("reshape", (p,), (), TensorType(
            tuple(m * post // q if k == e else o for k, o in enumerate(out.shape)), out.dtype))
            for p, m in zip(x.args, sizes, strict=True))
        return terms.apply("concatenate", parts, (("dimension", e),), out)
    return None


def reverse_blocks(terms: Terms, t: Term, d: int, n: int, *, within: bool) -> Term:
    """`t` with dim `d` cut into `n` blocks and either the rows of each block reversed (`within`) or the
    order of the blocks reversed: a reverse of the split dims `(n, block)`, as `jnp.flip` of a reshape."""
    shape = t.type.shape
    split = TensorType((*shape[:d], n, shape[d] // n, *shape[d + 1:]), t.type.dtype)
    cut = terms.apply("reshape", (t,), (), split)
    flipped = terms.apply("reverse", (cut,), (("dimensions", (d + 1 if within else d,)),), split)
    return terms.apply("reshape", (flipped,), (), t.type)



def without_new_dims(terms: Terms, x: Term, drop: Iterable[int]) -> Term:
    """The broadcast `x` without the dims in `drop`, each one it adds (not its operand's): the same broadcast,
    narrower."""
    gone = set(drop)
    keep = [d for d in range(x.type.rank) if d not in gone]
    at = {d: i for i, d in enumerate(keep)}
    return terms.apply("broadcast_in_dim", x.args,
                       (("broadcast_dimensions", tuple(at[d] for d in x.attr("broadcast_dimensions"))),),
                       TensorType(tuple(x.type.shape[d] for d in keep), x.type.dtype))


def reshape_groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """The minimal runs (source dims, result dims) of equal size that a reshape maps onto each other, in order,
    unit dims left out; None when the sizes differ."""
    a = [i for i, n in enumerate(src) if n != 1]
    b = [j for j, n in enumerate(dst) if n != 1]
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        gi, gj, p, q = [a[i]], [b[j]], src[a[i]], dst[b[j]]
        i, j = i + 1, j + 1
        while p != q:
            if p < q and i < len(a):
                gi.append(a[i])
                p *= src[a[i]]
                i += 1
            elif q < p and j < len(b):
                gj.append(b[j])
                q *= dst[b[j]]
                j += 1
            else:
                return None
        groups.append((gi, gj))
    return groups if i == len(a) and j == len(b) else None


def slice_of_split(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...]) -> Term | None:
    """A window of `reshape(src)` that cuts, in each group of dims the reshape splits one source dim
    into, only the group's major dim (the others whole): the reshape of that window of `src` (rows of
    `x.reshape(6, 2)` are a range of `x`'s elements). None for any other window."""
    if x.op != "reshape":
        return None
    (src,) = x.args
    groups = reshape_groups(src.type.shape, x.type.shape)
    if groups is None:
        return None
    cut = {d for d in range(x.type.rank) if (lo[d], hi[d]) != (0, x.type.shape[d])}
    slo, shi = [0] * src.type.rank, list(src.type.shape)
    for gi, gj in groups:
        touched = cut & set(gj)
        if not touched:
            continue
        if len(gi) != 1 or touched != {gj[0]}:
            return None
        inner = math.prod(x.type.shape[j] for j in gj[1:])
        slo[gi[0]], shi[gi[0]] = lo[gj[0]] * inner, hi[gj[0]] * inner
    if not cut <= {j for _, gj in groups for j in gj}:
        return None
    window = slicing.slice_of(terms, src, tuple(slo), tuple(shi))
    shape = tuple(b - a for a, b in zip(lo, hi, strict=True))
    return terms.apply("reshape", (window,), (), TensorType(shape, x.type.dtype))
