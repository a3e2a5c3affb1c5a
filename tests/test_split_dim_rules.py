"""Transfer rules that reread a split dim, checked against per-device simulation: XLA's one-dim all-to-all
of a value whose dim is already split over other axes (how the partitioner takes a sorted dim whole), and
the sort of a block of the sorted dim (the split moved onto another dim)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scalify_hlo.rules import collectives, sorting
from scalify_hlo.rules.facts import Ctx, Holds

import scalify_hlo.ops.registry  # noqa: F401  (registers the kernels the term evaluation runs)
from scalify_hlo.ir.nodes import Attrs, Literal, Op, TensorType
from scalify_hlo.layout.groups import block_sources
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.machine import shard
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms

MESH = Mesh((("a", 2), ("b", 2), ("c", 2)))
NAMES = [n for n, _ in MESH.axes]
COORDS = list(itertools.product(*(range(s) for _, s in MESH.axes)))


def _ctx(terms: Terms) -> Ctx:
    return Ctx(terms, MESH, fold=lambda t: None, lift=lambda v: v, varying=lambda o, f: None)


def _all_to_all(local: np.ndarray, axes: tuple[str, ...], d: int) -> np.ndarray:
    """Chunk `p` of dim `d` to the group's member `p`; received chunks stacked along `d` by source."""
    out = np.zeros_like(local)
    for dev, co in enumerate(COORDS):
        members = []
        for p in itertools.product(*(range(MESH.axis_size(a)) for a in axes)):
            cc = list(co)
            for a, v in zip(axes, p, strict=True):
                cc[NAMES.index(a)] = v
            members.append(COORDS.index(tuple(cc)))
        pos = members.index(dev)
        m = local.shape[1 + d] // len(members)
        out[dev] = np.concatenate([np.take(local[s], range(pos * m, (pos + 1) * m), axis=d) for s in members], axis=d)
    return out


@pytest.mark.parametrize(("dims", "axes", "d", "shape"), [
    (((), ("a",), (), ("b",)), ("b",), 1, (1, 8, 1, 16)),
    (((), ("a",), (), ("b",)), ("b",), 1, (1, 4, 1, 16)),  # chunks of one: onto the next dim
    ((("c",), ("a",), (), ("b",)), ("b",), 1, (2, 4, 1, 16)),
    (((), ("a", "c"), (), ("b",)), ("b",), 1, (1, 8, 1, 16)),
    ((("c",), ("a",), ("b",)), ("b",), 1, (4, 16, 4)),
    ((("c",), ("a",), ("b",)), ("b",), 0, (8, 16, 4)),
    ((("a",), (), ("b", "c")), ("c",), 0, (8, 3, 8)),
    ((("a", "c"), (), ("b",)), ("b",), 0, (16, 3, 8)),
])
def test_all_to_all_along_a_split_dim(dims: tuple[tuple[str, ...], ...], axes: tuple[str, ...], d: int,
                                      shape: tuple[int, ...]) -> None:
    terms = Terms()
    layout = Layout(dims)
    x = terms.param(0, TensorType(shape, "f32"), "x")
    out = collectives._all_to_all_same_dim(_ctx(terms), None, Holds(x, layout), axes, d)  # type: ignore[arg-type]
    assert isinstance(out, Holds)
    value = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    want = _all_to_all(shard(value, layout, MESH), axes, d)
    np.testing.assert_array_equal(shard(evaluate(out.term, {x.id: value}), out.layout, MESH), want)


@pytest.mark.parametrize(("dims", "dim", "e"), [
    ((("a",), ("b", "c")), 1, 0), ((("a",), ("b",), ()), 1, 2), (((), ("c", "a"), ("b",)), 1, 2),
    (((), ("c", "a"), ("b",)), 1, 0)])
def test_sort_of_blocks_is_the_sort_of_the_moved_tensor(dims: tuple[tuple[str, ...], ...], dim: int, e: int) -> None:
    shape = tuple(4 * MESH.size_of(d) for d in dims)
    terms = Terms()
    layout = Layout(dims)
    x = terms.param(0, TensorType(shape, "f32"), "x")
    moved = sorting._move_split(_ctx(terms), x, layout, dim, e)
    new = list(dims)
    new[e], new[dim] = (*dims[dim], *dims[e]), ()
    value = np.random.default_rng(1).integers(0, 5, shape).astype(np.float32)
    np.testing.assert_array_equal(shard(evaluate(moved, {x.id: value}), Layout(tuple(new)), MESH),
                                  shard(value, layout, MESH))  # the same local values on every device


@pytest.mark.parametrize("shift", [0, 3, -5, 12, 17])
def test_a_cyclic_shift_term_is_jnp_roll(shift: int) -> None:
    """A permute that shifts blocks cyclically holds `jnp.roll` of the value, spelled as JAX lowers it (two
    slices, concatenated), so it meets the reference's roll."""
    terms = Terms()
    x = terms.param(0, TensorType((4, 12), "f32"), "x")
    t = collectives.rolled(terms, x, 1, shift)
    v = np.arange(48, dtype=np.float32).reshape(4, 12)
    np.testing.assert_array_equal(evaluate(t, {x.id: v}), np.roll(v, shift, axis=1))
    assert shift % 12 == 0 or t.op == "concatenate"


@pytest.mark.parametrize("pairs", [
    [(0, 4), (4, 0), (1, 5), (5, 1), (2, 6), (6, 2), (3, 7), (7, 3)],  # swap along "a"
    [(0, 6), (6, 0), (2, 4), (4, 2), (1, 7), (7, 1), (3, 5), (5, 3)],  # reverse over ("a", "b")
    [(0, 2), (4, 6), (1, 3), (5, 7)],  # half the blocks sent on along "b", the rest receive zeros
])
def test_block_permutations_by_collective_permute_hold_the_moved_blocks(pairs: list[tuple[int, int]]) -> None:
    """Any permutation of the blocks of a split dim (complete or not: a device sent nothing holds zeros),
    checked against what the devices hold after the permute, simulated pair by pair."""
    terms = Terms()
    x = terms.param(0, TensorType((8, 3), "f32"), "x")
    layout = Layout((("a", "b"), ()))
    op = Op("collective_permute", (), (), Attrs.of({"source_target_pairs": Literal(np.array(pairs), "i64")}))
    (out,) = collectives.collective_permute(_ctx(terms), op, (Holds(x, layout),))
    assert isinstance(out, Holds) and out.layout == layout
    v = np.arange(24, dtype=np.float32).reshape(8, 3)
    local = shard(v, layout, MESH)
    moved = np.zeros_like(local)
    for s, t in pairs:
        moved[t] = local[s]
    np.testing.assert_array_equal(shard(evaluate(out.term, {x.id: v}), layout, MESH), moved)


def test_block_sources_refuse_a_permutation_that_differs_between_fibres() -> None:
    # along "a": fibre c=0 swaps, fibre c=1 keeps (devices 1, 5 stay): not one permutation of the blocks
    pairs = np.array([(0, 4), (4, 0), (2, 6), (6, 2), (1, 1), (5, 5), (3, 3), (7, 7)])
    assert block_sources(pairs, MESH, ("a",)) is None
    assert block_sources(np.array([(0, 1), (1, 0)]), MESH, ("a",)) is None  # moves along "c"
