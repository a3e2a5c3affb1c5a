"""The normal forms of padded splits (`terms/padding.py`, and the pad rules of `dots.py`, `reductions.py`,
`ranges.py`): each case builds a term as XLA computes it on a padded dim, once raw and once through the
canonicaliser, and checks that the canonical form drops the pad (the rule fired) and keeps the value (the
rule is exact), on random inputs. A variant where the padding is read (a fill that is not the reducer's
identity, a window that keeps padding, an index that may reach it) must keep its pad.

The real programs behind these are `uneven_vocab_and_hidden_train_step_shardy` and its bug twin.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from scalify_hlo.ir.nodes import DotDims, GatherDims, Literal, ScatterDims, TensorType
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

Make = Callable[[str, tuple[Term, ...], tuple[tuple[str, object], ...], TensorType], Term]
F32 = "f32"


def _t(*shape: int, dtype: str = F32) -> TensorType:
    return TensorType(shape, dtype)


def _scalar(terms: Terms, value: float, dtype: str = F32) -> Term:
    np_dtype = np.float32 if dtype == F32 else np.int32
    return terms.constant(Literal(np.array(value, dtype=np_dtype), dtype), _t(dtype=dtype))


def _splat(terms: Terms, make: Make, value: float, shape: tuple[int, ...], dtype: str = F32) -> Term:
    return make("broadcast_in_dim", (_scalar(terms, value, dtype),), (("broadcast_dimensions", ()),),
                _t(*shape, dtype=dtype))


def _pad(make: Make, x: Term, fill: Term, high: tuple[int, ...], low: tuple[int, ...] | None = None) -> Term:
    low = low or (0,) * len(high)
    shape = tuple(n + a + b for n, a, b in zip(x.type.shape, low, high, strict=True))
    return make("pad", (x, fill), (("edge_padding_high", high), ("edge_padding_low", low),
                                   ("interior_padding", (0,) * len(high))), _t(*shape, dtype=x.type.dtype))


def _slice(make: Make, x: Term, hi: tuple[int, ...]) -> Term:
    return make("slice", (x,), (("limit_indices", hi), ("start_indices", (0,) * len(hi)),
                                 ("strides", (1,) * len(hi))), _t(*hi, dtype=x.type.dtype))


def _mask(terms: Terms, make: Make, shape: tuple[int, ...], dim: int, bound: int) -> Term:
    """iota < bound along `dim`, as XLA masks a padded block."""
    iota = make("iota", (), (("iota_dimension", dim),), _t(*shape, dtype="i32"))
    return make("compare", (iota, _splat(terms, make, bound, shape, "i32")), (("comparison_direction", "LT"),),
                _t(*shape, dtype="i1"))


def _reduce_sum_of_pad(terms: Terms, make: Make, fill: float = 0.0, along: int = 1) -> Term:
    x = terms.param(0, _t(4, 6), "x")
    high = (0, 2) if along == 1 else (2, 0)
    p = _pad(make, x, _scalar(terms, fill), high)
    return make("reduce", (p, _scalar(terms, 0.0)), (("dimensions", (1,)), ("reducer", "sum")),
                _t(p.type.shape[0]))


def _elementwise_chain_cut(terms: Terms, make: Make, keep: int = 6) -> Term:
    """tanh(pad(x) * 2 - mean)[:, :keep], the mean a reduce over the unpadded dim, broadcast back."""
    x = terms.param(0, _t(4, 6), "x")
    p = _pad(make, x, _scalar(terms, 0.0), (0, 2))
    m = make("reduce", (p, _scalar(terms, 0.0)), (("dimensions", (0,)), ("reducer", "sum")), _t(8))
    mb = make("broadcast_in_dim", (m,), (("broadcast_dimensions", (1,)),), _t(4, 8))
    y = make("tanh", (make("subtract", (make("multiply", (p, _splat(terms, make, 2.0, (4, 8))), (), _t(4, 8)), mb),
                           (), _t(4, 8)),), (), _t(4, 8))
    return _slice(make, y, (4, keep))


def _dot_padded_free(terms: Terms, make: Make) -> Term:
    """dot(x, pad(w)) cut back to the real columns."""
    x, w = terms.param(0, _t(3, 5), "x"), terms.param(1, _t(5, 6), "w")
    d = make("dot_general", (x, _pad(make, w, _scalar(terms, 0.0), (0, 2))),
             (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),), _t(3, 8))
    return _slice(make, d, (3, 6))


def _masked(terms: Terms, make: Make, bound: int = 6) -> Term:
    """exp of a padded activation, masked to its first `bound` columns (6 real ones)."""
    h = terms.param(0, _t(3, 6), "h")
    hp = make("exponential", (_pad(make, h, _scalar(terms, 0.0), (0, 2)),), (), _t(3, 8))
    return make("select", (_mask(terms, make, (3, 8), 1, bound), hp, _splat(terms, make, 0.0, (3, 8))), (),
                _t(3, 8))


def _dot_padded_contracted(terms: Terms, make: Make) -> Term:
    """The second matmul of an MLP with a padded hidden dim: the activation masked to the real columns,
    contracted with the padded weights."""
    masked, w = _masked(terms, make), terms.param(1, _t(6, 4), "w")
    wp = _pad(make, w, _scalar(terms, 0.0), (2, 0))
    return make("dot_general", (masked, wp), (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),), _t(3, 4))


def _gather_of_padded_table(terms: Terms, make: Make, top: int = 5) -> Term:
    """Rows of a padded table at indices clamped to [0, top]."""
    table, ids = terms.param(0, _t(6, 3), "table"), terms.param(1, _t(4, dtype="i32"), "ids")
    clamped = make("clamp", (_splat(terms, make, 0, (4,), "i32"), ids, _splat(terms, make, top, (4,), "i32")), (),
                   _t(4, dtype="i32"))
    idx = make("reshape", (clamped,), (), _t(4, 1, dtype="i32"))
    dims = GatherDims((1,), (0,), (), (), (0,), 1)
    return make("gather", (_pad(make, table, _scalar(terms, 0.0), (2, 0)), idx),
                (("dimension_numbers", dims), ("slice_sizes", (1, 3))), _t(4, 3))


def _scatter_cut(terms: Terms, make: Make) -> Term:
    """A scatter-add into a zero padded block of rows, cut back to the real ones."""
    ids, upd = terms.param(0, _t(4, dtype="i32"), "ids"), terms.param(1, _t(4), "upd")
    dims = ScatterDims((), (0,), (), (), (0,), 1)
    idx = make("reshape", (ids,), (), _t(4, 1, dtype="i32"))
    s = make("scatter", (_splat(terms, make, 0.0, (8,)), idx, upd),
             (("computation", "sum"), ("scatter_dimension_numbers", dims)), _t(8))
    return _slice(make, s, (6,))


CASES: dict[str, tuple[Callable[..., Term], bool]] = {
    # name: (builder, whether the canonical form drops every pad: at most one is left, outermost, where the
    # value itself is padded)
    "reduce_sum_over_padding": (_reduce_sum_of_pad, True),
    "reduce_sum_fill_not_identity": (lambda t, m: _reduce_sum_of_pad(t, m, fill=1.0), False),
    "reduce_sum_padding_kept_dim": (lambda t, m: _reduce_sum_of_pad(t, m, along=0), False),
    "elementwise_chain_cut": (_elementwise_chain_cut, True),
    "elementwise_chain_cut_keeps_padding": (lambda t, m: _elementwise_chain_cut(t, m, keep=7), False),
    "dot_padded_free_dim": (_dot_padded_free, True),
    "dot_padded_contracted_dim": (_dot_padded_contracted, True),
    "mask_keeps_real_columns": (_masked, True),
    "mask_keeps_padding": (lambda t, m: _masked(t, m, bound=7), False),
    "gather_of_padded_table": (_gather_of_padded_table, True),
    "gather_index_may_reach_padding": (lambda t, m: _gather_of_padded_table(t, m, top=6), False),
    "scatter_cut": (_scatter_cut, True),
}


def _inputs(t: Term, rng: np.random.Generator) -> dict[int, np.ndarray]:
    env = {}
    for s in t.walk():
        if s.op == "param":
            if s.type.dtype == "i32":
                env[s.id] = rng.integers(-2, 9, s.type.shape).astype(np.int32)  # (some out of range)
            else:
                env[s.id] = rng.standard_normal(s.type.shape).astype(np.float32)
    return env


@pytest.mark.parametrize("name", sorted(CASES))
def test_padded_form_keeps_value(name: str) -> None:
    build, drops_pad = CASES[name]
    terms = Terms()
    raw = build(terms, terms.mk)
    canon = build(terms, terms.apply)
    inner = canon.args[0] if canon.op == "pad" else canon
    assert (not any(s.op == "pad" for s in inner.walk())) == drops_pad, (name, canon)
    for seed in range(5):
        env = _inputs(raw, np.random.default_rng(seed))
        with np.errstate(all="ignore"):
            want, got = np.asarray(evaluate(raw, env)), np.asarray(evaluate(canon, env))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
