"""Which global tensor numbers computed per device are the shards of (`Deriver.lift`).

Index arithmetic on partition ids (GSPMD's `iota + offset`, a random key's counters, a shard_map's
`axis_index` positions) is evaluated per device (`Varying`). Where it meets tensors it is read as the shard
of a constant tensor under some layout. Many layouts fit (any values are the shards of *some* tensor under a
layout that splits one dim over every axis they vary with), so the choice decides which constant the rules
see. Preferred, in order: where the numbers meet tensors, a layout that joins theirs (affine in its global
indices first: an index XLA computes per device from the global one, each axis on the dim it indexes,
`jax.random` counters of a 3-D shape split on two dims); an iota; the first that fits with all axes on one
dim, unless it is not affine and one spreading the axes over several dims is; else the first that fits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.layout.groups import varying_axes
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.machine import assemble, shard
from scalify_hlo.rules.facts import Holds, constant_term, iota_dim, join
from scalify_hlo.terms.table import Terms

_CANDIDATES = 256  # layouts tried at most


def lifted(values: np.ndarray, t: TensorType, mesh: Mesh, terms: Terms, like: Layout | None = None
           ) -> Holds | None:
    """The preferred constant tensor whose shards `values` (`[devices, *t.shape]`) are, or None. With `like`
    (the layout of the tensors the numbers meet), one whose layout joins it comes first: the first affine
    one, else the last tried."""
    first: tuple[Layout, np.ndarray, bool] | None = None  # (layout, tensor, affine)
    spread: tuple[Layout, np.ndarray] | None = None  # the first affine one with the axes on several dims
    joining: tuple[Layout, np.ndarray, bool] | None = None  # one that joins `like` (below)
    for layout in itertools.islice(_layouts(varying_axes(values, mesh), t.rank), _CANDIDATES):
        try:
            full = assemble(values, layout, mesh)
            again = shard(full, layout, mesh)
        except (ShardingError, ValueError):
            continue
        if again.shape != values.shape or not np.array_equal(again, values):
            continue
        joins = like is not None and join([like, layout]) is not None
        if (like is None or joins) and iota_dim(full) is not None:
            held = _held(full, layout, t, terms)
            if held.term.op == "iota":  # (a one-dim iota: the normal form spells others as its broadcast)
                return held
        affine = _is_affine(full)
        if first is None:
            first = (layout, full, affine)
        elif spread is None and affine and sum(1 for axes in layout.dims if axes) > 1:
            spread = (layout, full)
        if joins and (joining is None or not joining[2]):  # (until one is affine, the latest that joins)
            joining = (layout, full, affine)
    if joining is not None:
        return _held(joining[1], joining[0], t, terms)
    if spread is not None and first is not None and not first[2]:
        return _held(spread[1], spread[0], t, terms)
    return None if first is None else _held(first[1], first[0], t, terms)


def _held(full: np.ndarray, layout: Layout, t: TensorType, terms: Terms) -> Holds:
    return Holds(constant_term(full, TensorType(full.shape, t.dtype), terms), layout)


def _layouts(moving: Sequence[str], rank: int) -> Iterator[Layout]:
    """Every axis on one dim (each order), then the axes spread over dims (each dim's axes in each order)."""
    for d in range(rank):
        for order in itertools.permutations(moving):
            yield Layout(tuple(order if i == d else () for i in range(rank)))
    if len(moving) < 2:
        return
    for dims in itertools.product(range(rank), repeat=len(moving)):
        if len(set(dims)) == 1:
            continue  # (one dim: above)
        per_dim = [[a for a, d in zip(moving, dims, strict=True) if d == i] for i in range(rank)]
        for orders in itertools.product(*(itertools.permutations(axes) for axes in per_dim)):
            yield Layout(tuple(tuple(o) for o in orders))


def _is_affine(full: np.ndarray) -> bool:
    """`full[i] == full[0] + sum_d stride_d · i_d` for integer or float values."""
    if full.ndim == 0 or full.size < 2 or full.dtype == bool:
        return False
    v = full.astype(np.float64)
    origin = v[(0,) * v.ndim]
    expected = np.full(v.shape, origin)
    for d, n in enumerate(v.shape):
        if n < 2:
            continue
        step = v[tuple(1 if k == d else 0 for k in range(v.ndim))] - origin
        expected = expected + step * np.arange(n).reshape([n if k == d else 1 for k in range(v.ndim)])
    return bool(np.array_equal(expected, v))
