"""Normal forms of a broadcast moved again (`terms/table.py`): a transposed broadcast is a broadcast, and a
reshape of a broadcast whose runs of dims are all the operand's or all new is the operand reshaped and
broadcast. Each form keeps the value (evaluated before and after canonicalisation), and the forms meet the
spelling XLA's compiled text gives a row statistic (`[b, s] -> [b * s]`, broadcast, bitcast back to rows)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from scalify_hlo.ir.nodes import Literal, TensorType
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

F32 = "f32"


def _bcast(terms: Terms, make: Any, y: Term, dims: tuple[int, ...], shape: tuple[int, ...]) -> Term:
    return make("broadcast_in_dim", (y,), (("broadcast_dimensions", dims),), TensorType(shape, F32))


def _same_value(terms: Terms, canon: Term, plain: Term, y: Term) -> None:
    env = {y.id: np.random.default_rng(0).standard_normal(y.type.shape).astype(np.float32)}
    np.testing.assert_array_equal(evaluate(canon, env), evaluate(plain, env))


@pytest.mark.parametrize(("dims", "shape", "perm"), [
    ((0, 2), (2, 4, 3), (0, 2, 1)),  # the operand's dims keep their order
    ((0, 2), (2, 4, 3), (2, 1, 0)),  # they swap: the operand is transposed first
    ((1,), (4, 3, 5), (2, 0, 1)),
])
def test_a_transposed_broadcast_is_a_broadcast(dims: tuple[int, ...], shape: tuple[int, ...],
                                               perm: tuple[int, ...]) -> None:
    terms = Terms()
    y = terms.param(0, TensorType(tuple(shape[d] for d in dims), F32), "y")
    out = TensorType(tuple(shape[p] for p in perm), F32)
    attrs = (("permutation", perm),)
    canon = terms.apply("transpose", (_bcast(terms, terms.apply, y, dims, shape),), attrs, out)
    plain = terms.mk("transpose", (_bcast(terms, terms.mk, y, dims, shape),), attrs, out)
    assert canon.op == "broadcast_in_dim", canon
    _same_value(terms, canon, plain, y)


@pytest.mark.parametrize(("y_shape", "dims", "shape", "out"), [
    ((2, 16), (0, 1), (2, 16, 4, 8), (2, 16, 32)),  # only new dims merged
    ((32,), (0,), (32, 32), (2, 16, 32)),  # the operand's dim split: [b * s] back to [b, s]
    ((6,), (1,), (4, 6), (4, 2, 3)),
])
def test_a_reshaped_broadcast_is_a_broadcast_of_the_operand_reshaped(
        y_shape: tuple[int, ...], dims: tuple[int, ...], shape: tuple[int, ...], out: tuple[int, ...]) -> None:
    terms = Terms()
    y = terms.param(0, TensorType(y_shape, F32), "y")
    canon = terms.apply("reshape", (_bcast(terms, terms.apply, y, dims, shape),), (), TensorType(out, F32))
    plain = terms.mk("reshape", (_bcast(terms, terms.mk, y, dims, shape),), (), TensorType(out, F32))
    assert canon.op == "broadcast_in_dim", canon
    _same_value(terms, canon, plain, y)


def test_a_reshape_mixing_operand_and_new_dims_stays() -> None:
    terms = Terms()
    y = terms.param(0, TensorType((4,), F32), "y")
    b = terms.apply("broadcast_in_dim", (y,), (("broadcast_dimensions", (0,)),), TensorType((4, 3), F32))
    assert terms.apply("reshape", (b,), (), TensorType((12,), F32)).op == "reshape"


def test_the_flattened_row_statistic_meets_the_reference_broadcast() -> None:
    """What `rmsnorm_batch_fsdp_compiled` needs: XLA's `[2, 16] -> [32]`, broadcast along the hidden dim and
    read back as rows, is the reference's statistic broadcast along the hidden dim."""
    terms = Terms()
    r = terms.param(0, TensorType((2, 16), F32), "r")
    flat = terms.apply("reshape", (r,), (), TensorType((32,), F32))
    wide = terms.apply("broadcast_in_dim", (flat,), (("broadcast_dimensions", (0,)),), TensorType((32, 32), F32))
    rows = terms.apply("reshape", (wide,), (), TensorType((2, 16, 32), F32))
    assert rows is terms.apply("broadcast_in_dim", (r,), (("broadcast_dimensions", (0, 1)),),
                               TensorType((2, 16, 32), F32))


def _pad_rows(terms: Terms, low: int, high: int) -> tuple[Term, Term]:
    """(y [7, 3], y padded with zero rows to [8, 3]: `low` before, `high` after)."""
    y = terms.param(0, TensorType((7, 3), F32), "y")
    attrs = (("edge_padding_high", (high, 0)), ("edge_padding_low", (low, 0)), ("interior_padding", (0, 0)))
    return y, terms.apply("pad", (y, terms.scalar(0.0, F32)), attrs, TensorType((8, 3), F32))


def _masked_is_the_pad(terms: Terms, y: Term, padded: Term, pred: Term, folds: bool) -> None:
    """select(pred, padded, 0) is `padded` exactly when `folds`, and keeps the value either way."""
    out = padded.type
    canon = terms.apply("select", (pred, padded, terms.splat(0.0, out)), (), out)
    plain = terms.mk("select", (pred, padded, terms.splat(0.0, out)), (), out)
    assert (canon is padded) == folds, canon
    env = {y.id: np.random.default_rng(0).standard_normal((7, 3)).astype(np.float32) + 5}  # (no zeros in y)
    np.testing.assert_array_equal(evaluate(canon, env), evaluate(plain, env))


@pytest.mark.parametrize(("direction", "k", "low", "high", "folds"), [
    ("GE", 1, 1, 0, True),  # iota >= 1 masks exactly the row a low pad of 1 added
    ("GT", 0, 1, 0, True),
    ("GE", 0, 1, 0, True),  # masks nothing
    ("GE", 2, 1, 0, False),  # masks row 1 too, which holds data
    ("LT", 7, 0, 1, True),
    ("LT", 6, 0, 1, False),
])
def test_a_pad_masked_where_it_pads_is_the_pad(direction: str, k: int, low: int, high: int, folds: bool) -> None:
    """select(iota ⋈ k, pad(y, 0), 0): XLA's partitioner masks the rows a shift over a split dim brought in
    from outside the tensor, which the pad already fills."""
    terms = Terms()
    y, padded = _pad_rows(terms, low, high)
    test = terms.apply("compare", (terms.iota(0, TensorType((8,), "i32")), terms.splat(float(k), TensorType((8,), "i32"))),
                       (("comparison_direction", direction),), TensorType((8,), "i1"))
    pred = terms.apply("broadcast_in_dim", (test,), (("broadcast_dimensions", (0,)),), TensorType((8, 3), "i1"))
    _masked_is_the_pad(terms, y, padded, pred, folds)


@pytest.mark.parametrize(("rows", "folds"), [((1, 8), True), ((2, 8), False), ((0, 8), True)])
def test_a_pad_masked_by_a_constant_where_it_pads_is_the_pad(rows: tuple[int, int], folds: bool) -> None:
    """The same mask folded to a constant (a per-device mask lifted to the tensor of its shards)."""
    terms = Terms()
    y, padded = _pad_rows(terms, 1, 0)
    mask = np.zeros((8, 3), dtype=bool)
    mask[rows[0]:rows[1]] = True
    _masked_is_the_pad(terms, y, padded, terms.constant(Literal(mask, "i1"), TensorType((8, 3), "i1")), folds)
