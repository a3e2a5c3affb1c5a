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
from scalify_hlo.rules.facts import Holds, constant_term, join
from scalify_hlo.terms.table import Terms

_CANDIDATES = 256  # layouts tried at most


def lifted(values: np.ndarray, t: TensorType, mesh: Mesh, terms: Terms, like: Layout | None = None
           ) -> Holds | None:
    """The preferred constant tensor whose shards `values` (`[devices, *t.shape]`) are, or None. With `like`
    (the layout of the tensors the numbers meet), one whose layout joins it comes first, affine first."""
    first: Holds | None = None
    first_affine = False
    spread: Holds | None = None  # the first affine one with the axes on several dims
    joining: tuple[Holds, bool] | None = None  # (the first that joins `like`, affine)
    for layout in itertools.islice(_layouts(varying_axes(values, mesh), t.rank), _CANDIDATES):
        try:
            full = assemble(values, layout, mesh)
            again = shard(full, layout, mesh)
        except (ShardingError, ValueError):
            continue
        if again.shape != values.shape or not np.array_equal(again, values):
            continue
        held = Holds(constant_term(full, TensorType(full.shape, t.dtype), terms), layout)
        if held.term.op == "iota" and (like is None or join([like, layout]) is not None):
            return held
        if first is None:
            first, first_affine = held, _is_affine(full)
        elif spread is None and sum(1 for axes in layout.dims if axes) > 1 and _is_affine(full):
            spread = held
        if like is not None and join([like, layout]) is not None and (joining is None or not joining[1]):
            joining = (held, _is_affine(full))
    if joining is not None:
        return joining[0]
    return spread if spread is not None and not first_affine else first


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
