"""Normal forms of data movement checked against NumPy: each canonical term evaluates to what the plain
expression computes, on random shapes, cuts and orders (hypothesis).

- a reshape of a slice or join along one dim moves outside it where the rows stay whole
  (`movement.reshape_outward`: `jnp.roll(x.reshape(n, -1), k, 0).reshape(-1)` meets the rows of x rolled);
- a slice of a pad is a pad of a slice (`padding.slice_of_pad`), a pad of nothing is its operand;
- a splat converted to a dtype that holds it exactly is that splat;
- a dynamic-slice whose offsets name another device's block (`(i + k) mod n`) is the value with its blocks
  in that order (`rules/indexing.dynamic_slice`, `layout.groups.match_axis_permutation`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scalify_hlo.rules import indexing
from scalify_hlo.rules.facts import Ctx, Failed, Holds, Varying

import scalify_hlo.ops.registry  # noqa: F401  (registers the kernels the term evaluation runs)
from scalify_hlo.ir.nodes import Attrs, Op, TensorType, Value
from scalify_hlo.layout.groups import match_axis_permutation
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.slicing import slice_of
from scalify_hlo.terms.table import Terms


def _factorisations(n: int, rank: int) -> list[tuple[int, ...]]:
    if rank == 1:
        return [(n,)]
    return [(d, *rest) for d in range(1, n + 1) if n % d == 0 for rest in _factorisations(n // d, rank - 1)]


SHAPES = [s for r in (1, 2, 3) for s in _factorisations(24, r)]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.sampled_from(SHAPES), st.data())
def test_reshape_of_a_slice_or_join_keeps_values(shape: tuple[int, ...], data: st.DataObject) -> None:
    terms = Terms()
    x = terms.param(0, TensorType((24,), "f32"), "x")
    y = terms.apply("reshape", (x,), (), TensorType(shape, "f32"))
    d = data.draw(st.integers(0, len(shape) - 1))
    n = shape[d]
    xs = np.arange(24, dtype=np.float32)
    ys = xs.reshape(shape)
    if data.draw(st.booleans()):  # a slice along d
        a = data.draw(st.integers(0, n - 1))
        b = data.draw(st.integers(a + 1, n))
        lo = tuple(a if k == d else 0 for k in range(len(shape)))
        hi = tuple(b if k == d else m for k, m in enumerate(shape))
        cut, want = slice_of(terms, y, lo, hi), ys[tuple(slice(a, b) if k == d else slice(None) for k in range(len(shape)))]
    else:  # blocks of d joined in a random order
        bounds = sorted(set(data.draw(st.lists(st.integers(1, max(n - 1, 1)), max_size=3))) - {n})
        edges = [0, *bounds, n]
        order = data.draw(st.permutations(range(len(edges) - 1)))
        parts = []
        for i in order:
            lo = tuple(edges[i] if k == d else 0 for k in range(len(shape)))
            hi = tuple(edges[i + 1] if k == d else m for k, m in enumerate(shape))
            parts.append(slice_of(terms, y, lo, hi))
        cut = parts[0] if len(parts) == 1 else terms.apply("concatenate", tuple(parts), (("dimension", d),),
                                                           TensorType(shape, "f32"))
        want = np.concatenate([ys[tuple(slice(edges[i], edges[i + 1]) if k == d else slice(None)
                                        for k in range(len(shape)))] for i in order], axis=d)
    outs = [s for r in (1, 2, 3) for s in _factorisations(math.prod(cut.type.shape), r)]
    out = data.draw(st.sampled_from(outs))
    got = evaluate(terms.apply("reshape", (cut,), (), TensorType(out, "f32")), {x.id: xs})
    np.testing.assert_array_equal(got, want.reshape(out))


def test_roll_of_reshaped_rows_is_the_rows_rolled() -> None:
    """`jnp.roll(x.reshape(8, 2), 1, 0).reshape(16)` and the rows of x rolled by 2 are one term."""
    terms = Terms()
    x = terms.param(0, TensorType((16,), "f32"), "x")
    r = terms.apply("reshape", (x,), (), TensorType((8, 2), "f32"))
    rolled = terms.apply("concatenate", (slice_of(terms, r, (7, 0), (8, 2)), slice_of(terms, r, (0, 0), (7, 2))),
                         (("dimension", 0),), TensorType((8, 2), "f32"))
    spelled = terms.apply("reshape", (rolled,), (), TensorType((16,), "f32"))
    direct = terms.apply("concatenate", (slice_of(terms, x, (14,), (16,)), slice_of(terms, x, (0,), (14,))),
                         (("dimension", 0),), TensorType((16,), "f32"))
    assert spelled is direct


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=2), st.data())
def test_slice_of_a_pad_keeps_values(pads: list[tuple[int, int]], data: st.DataObject) -> None:
    terms = Terms()
    shape = (5, 3)[: len(pads)]
    x = terms.param(0, TensorType(shape, "f32"), "x")
    fill = terms.scalar(-7.0, "f32")
    padded_shape = tuple(m + a + b for m, (a, b) in zip(shape, pads, strict=True))
    attrs = (("edge_padding_high", tuple(b for _, b in pads)), ("edge_padding_low", tuple(a for a, _ in pads)),
             ("interior_padding", (0,) * len(pads)))
    p = terms.apply("pad", (x, fill), attrs, TensorType(padded_shape, "f32"))
    lo = tuple(data.draw(st.integers(0, m - 1)) for m in padded_shape)
    hi = tuple(data.draw(st.integers(a + 1, m)) for a, m in zip(lo, padded_shape, strict=True))
    xs = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    want = np.pad(xs, pads, constant_values=-7.0)[tuple(slice(a, b) for a, b in zip(lo, hi, strict=True))]
    got = evaluate(slice_of(terms, p, lo, hi), {x.id: xs})
    np.testing.assert_array_equal(got, want)


def test_jnp_pad_then_slice_meets_a_shifted_block() -> None:
    """`jnp.pad(x, 1)[:-2]` (pad value the int 0 converted) and x shifted down a row with 0.0 are one term."""
    terms = Terms()
    x = terms.param(0, TensorType((8,), "f32"), "x")
    zero_int = terms.scalar(0, "i32")
    zero = terms.apply("convert", (zero_int,), (), TensorType((), "f32"))
    attrs = (("edge_padding_high", (1,)), ("edge_padding_low", (1,)), ("interior_padding", (0,)))
    ref = slice_of(terms, terms.apply("pad", (x, zero), attrs, TensorType((10,), "f32")), (0,), (8,))
    attrs2 = (("edge_padding_high", (0,)), ("edge_padding_low", (1,)), ("interior_padding", (0,)))
    shifted = terms.apply("pad", (slice_of(terms, x, (0,), (7,)), terms.scalar(0.0, "f32")), attrs2,
                          TensorType((8,), "f32"))
    assert ref is shifted


@pytest.mark.parametrize(("value", "src", "dst", "folds"), [
    (0, "i32", "f32", True), (3, "i32", "bf16", True), (2**24 + 1, "i32", "f32", False), (1.5, "f32", "i32", False),
    (2.0, "f32", "i32", True), (2, "i32", "i1", False), (-1, "i32", "ui32", False), (0.1, "f64", "f32", False),
])
def test_converted_splats_fold_only_when_exact(value: float, src: str, dst: str, folds: bool) -> None:
    terms = Terms()
    c = terms.splat(value, TensorType((3,), src))
    got = terms.apply("convert", (c,), (), TensorType((3,), dst))
    assert (got.op != "convert") == folds, got


# -- dynamic-slice offsets naming another device's block -------------------------------------------------------

MESH = Mesh((("a", 2), ("b", 4)))


def _ctx(terms: Terms) -> Ctx:
    return Ctx(terms, MESH, fold=lambda t: None, lift=lambda v: v, varying=lambda o, f: None)


def _coords() -> list[tuple[int, int]]:
    return list(itertools.product(range(2), range(4)))


@pytest.mark.parametrize("table", ["next", "reversed", "a_major", "own"])
def test_dynamic_slice_of_a_permuted_block_table(table: str) -> None:
    """Per device, the rows the offsets name of a replicated value are the block the derived fact says."""
    perms = {"next": lambda a, b: (b + 1) % 4, "reversed": lambda a, b: 3 - b, "own": lambda a, b: b,
             "a_major": lambda a, b: (a * 4 + b + 3) % 8}
    blocks = 8 if table == "a_major" else 4
    size = 16 // blocks
    offsets = np.array([perms[table](a, b) * size for a, b in _coords()], dtype=np.int64)
    terms = Terms()
    x = terms.param(0, TensorType((16, 3), "f32"), "x")
    xs = np.arange(48, dtype=np.float32).reshape(16, 3)
    operand = Holds(x, Layout(((), ())))
    start0 = Varying(offsets.astype(np.int32), TensorType((), "i32"))
    start1 = Varying(np.zeros(8, dtype=np.int32), TensorType((), "i32"))
    op = Op("dynamic_slice", (Value(TensorType((16, 3), "f32")), Value(TensorType((), "i32")), Value(TensorType((), "i32"))),
            (Value(TensorType((size, 3), "f32")),), Attrs.of({"slice_sizes": (size, 3)}))
    (fact,) = indexing.dynamic_slice(_ctx(terms), op, (operand, start0, start1))
    assert isinstance(fact, Holds), fact
    value = evaluate(fact.term, {x.id: xs})
    for dev, (a, b) in enumerate(_coords()):
        idx = MESH.linear_index(np.array([a, b]), fact.layout.dims[0])
        got = value[int(idx) * size:(int(idx) + 1) * size]
        np.testing.assert_array_equal(got, xs[offsets[dev]:offsets[dev] + size], err_msg=f"device {dev}")


def test_offsets_that_repeat_a_block_are_not_a_permutation() -> None:
    assert match_axis_permutation([0, 1, 1, 3, 0, 1, 1, 3], MESH, 1) is None
    assert match_axis_permutation([1, 2, 3, 0, 1, 2, 3, 0], MESH, 1) == (("b",), pytest.approx([1, 2, 3, 0]))
    assert match_axis_permutation([2, 4, 6, 0, 2, 4, 6, 1], MESH, 2) is None  # not multiples of the block


def test_a_failed_operand_is_not_read() -> None:
    terms = Terms()
    op = Op("dynamic_slice", (Value(TensorType((4,), "f32")), Value(TensorType((), "i32"))),
            (Value(TensorType((1,), "f32")),), Attrs.of({"slice_sizes": (1,)}))
    (fact,) = indexing.dynamic_slice(_ctx(terms), op, (Failed("x", None, False), Varying(np.zeros(8, np.int32), TensorType((), "i32"))))
    assert isinstance(fact, Failed)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(SHAPES), st.sets(st.integers(0, 2), max_size=3)),
                min_size=1, max_size=4))
def test_reverses_and_reshapes_keep_values(steps: list[tuple[bool, tuple[int, ...], set[int]]]) -> None:
    """Any chain of reshapes and reverses: the canonical term (reverses merged, a reverse of every dim moved
    through a reshape) evaluates to what NumPy computes step by step."""
    terms = Terms()
    x = terms.param(0, TensorType((24,), "f32"), "x")
    t, want = x, np.arange(24, dtype=np.float32)
    for is_reshape, shape, dims in steps:
        if is_reshape:
            t, want = terms.apply("reshape", (t,), (), TensorType(shape, "f32")), want.reshape(shape)
        else:
            ds = tuple(sorted(d for d in dims if d < t.type.rank))
            t = terms.apply("reverse", (t,), (("dimensions", ds),), t.type)
            want = np.flip(want, ds) if ds else want
    np.testing.assert_array_equal(evaluate(t, {x.id: np.arange(24, dtype=np.float32)}), want)


def test_flip_of_blocks_and_rows_is_the_whole_flip() -> None:
    """A split dim flipped as a partitioner does it (the blocks' order reversed by a permute, then each block
    reversed on its device) is `jnp.flip` of the whole dim, as one term."""
    from scalify_hlo.terms.movement import reverse_blocks

    terms = Terms()
    x = terms.param(0, TensorType((16, 3), "f32"), "x")
    both = reverse_blocks(terms, reverse_blocks(terms, x, 0, 8, within=False), 0, 8, within=True)
    assert both is terms.apply("reverse", (x,), (("dimensions", (0,)),), x.type)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.data())
def test_scatter_of_one_window_keeps_values(data: st.DataObject) -> None:
    """`x.at[window].add/max/min/multiply(u)` at a constant in-bounds position, as the joined tensor the normal
    form makes, evaluates to what NumPy computes (inserted window dims included)."""
    from scalify_hlo.ir.nodes import Literal, ScatterDims

    shape = data.draw(st.sampled_from([(6,), (4, 5), (3, 4, 2)]))
    rank = len(shape)
    inserted = tuple(sorted(data.draw(st.sets(st.integers(0, rank - 1), max_size=1))))
    window = [1 if d in inserted else data.draw(st.integers(1, shape[d])) for d in range(rank)]
    start = [data.draw(st.integers(0, shape[d] - window[d])) for d in range(rank)]
    reducer, np_op = data.draw(st.sampled_from([("sum", np.add), ("max", np.maximum), ("min", np.minimum),
                                                 ("prod", np.multiply)]))
    terms = Terms()
    x = terms.param(0, TensorType(shape, "f32"), "x")
    upd_shape = tuple(w for d, w in enumerate(window) if d not in inserted)
    u = terms.param(1, TensorType(upd_shape, "f32"), "u")
    idx = terms.constant(Literal(np.array(start, dtype=np.int32), "i32"), TensorType((rank,), "i32"))
    dims = ScatterDims(tuple(range(len(upd_shape))), inserted, (), (), tuple(range(rank)), 1)
    attrs = (("scatter_dimension_numbers", dims), ("computation", reducer))
    t = terms.apply("scatter", (x, idx, u), attrs, x.type)
    assert t.op != "scatter"
    rng = np.random.default_rng(0)
    xs, us = rng.standard_normal(shape).astype(np.float32), rng.standard_normal(upd_shape).astype(np.float32)
    want = xs.copy()
    where = tuple(slice(s, s + w) for s, w in zip(start, window, strict=True))
    want[where] = np_op(want[where], us.reshape(window))
    np.testing.assert_allclose(evaluate(t, {x.id: xs, u.id: us}), want, rtol=1e-6)


def test_scatter_out_of_bounds_stays_opaque() -> None:
    from scalify_hlo.ir.nodes import Literal, ScatterDims

    terms = Terms()
    x = terms.param(0, TensorType((6,), "f32"), "x")
    u = terms.param(1, TensorType((3,), "f32"), "u")
    idx = terms.constant(Literal(np.array([5], dtype=np.int32), "i32"), TensorType((1,), "i32"))
    attrs = (("scatter_dimension_numbers", ScatterDims((0,), (), (), (), (0,), 1)), ("computation", "sum"))
    assert terms.apply("scatter", (x, idx, u), attrs, x.type).op == "scatter"


def test_nested_joins_and_runs_of_slices_flatten() -> None:
    terms = Terms()
    x = terms.param(0, TensorType((8,), "f32"), "x")
    y = terms.param(1, TensorType((2,), "f32"), "y")
    inner = terms.apply("concatenate", (slice_of(terms, x, (2,), (4,)), y), (("dimension", 0),), TensorType((4,), "f32"))
    t = terms.apply("concatenate", (slice_of(terms, x, (0,), (2,)), inner, slice_of(terms, x, (4,), (8,))),
                    (("dimension", 0),), TensorType((10,), "f32"))
    assert [a.op for a in t.args] == ["slice", "param", "slice"]
    assert t.args[0].attr("limit_indices") == (4,)
    xs, ys = np.arange(8, dtype=np.float32), np.array([-1, -2], dtype=np.float32)
    np.testing.assert_array_equal(evaluate(t, {x.id: xs, y.id: ys}), np.concatenate([xs[:4], ys, xs[4:]]))
