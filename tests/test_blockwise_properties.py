"""Properties of the block machinery, checked by evaluating terms on random inputs.

- `push_slice` / `push_take` are exact: on random terms (elementwise ops, broadcasts, transposes,
  reshapes, dot_general, reductions, concatenations, slices) and random windows, the pushed term
  evaluates to the window of the term.
- The normaliser preserves values: whatever it rewrites a term to evaluates the same.
- Online softmax over any blocking: two to four key blocks of any sizes, visited in any order, are proven
  equal to the whole softmax; and a variant with one step broken is never called equal when the numbers
  differ.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from scalify_hlo.ir.nodes import DotDims, TensorType
from scalify_hlo.terms.block_equality import equal
from scalify_hlo.terms.blockwise import Normaliser
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.pushing import push_slice, push_take
from scalify_hlo.terms.slicing import slice_of
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

F32 = "f32"


def _t(*shape: int) -> TensorType:
    return TensorType(tuple(shape), F32)


def _random_term(terms: Terms, rng: np.random.Generator, params: list[Term], depth: int) -> Term:
    """A random float term over `params` (shapes of rank 2-3)."""
    if depth == 0:
        return params[int(rng.integers(len(params)))]
    x = _random_term(terms, rng, params, depth - 1)
    shape = x.type.shape
    kind = int(rng.integers(9))
    if kind == 0:  # elementwise with another term of the same shape, or a splat
        y = _random_term(terms, rng, params, depth - 1)
        if y.type.shape != shape:
            y = terms.splat(float(rng.integers(1, 3)), x.type)
        return terms.apply(["add", "multiply", "maximum", "subtract"][int(rng.integers(4))], (x, y), (), x.type)
    if kind == 1:
        return terms.apply(["exponential", "tanh", "negate"][int(rng.integers(3))], (x,), (), x.type)
    if kind == 2:
        perm = tuple(int(p) for p in rng.permutation(len(shape)))
        return terms.apply("transpose", (x,), (("permutation", perm),), _t(*(shape[p] for p in perm)))
    if kind == 3 and len(shape) < 4:  # broadcast: a new dim somewhere
        at = int(rng.integers(len(shape) + 1))
        out = (*shape[:at], 2, *shape[at:])
        dims = tuple(k if k < at else k + 1 for k in range(len(shape)))
        return terms.apply("broadcast_in_dim", (x,), (("broadcast_dimensions", dims),), _t(*out))
    if kind == 4 and len(shape) >= 2:  # reshape: merge the first two dims
        return terms.apply("reshape", (x,), (), _t(shape[0] * shape[1], *shape[2:]))
    if kind == 5 and len(shape) >= 2:  # reduce one dim
        d = int(rng.integers(len(shape)))
        how = ["sum", "max"][int(rng.integers(2))]
        init = terms.scalar(0.0 if how == "sum" else -np.inf, F32)
        out = tuple(n for k, n in enumerate(shape) if k != d)
        return terms.apply("reduce", (x, init), (("dimensions", (d,)), ("reducer", how)), _t(*out))
    if kind == 6:  # dot with a parameter-free weight over the last dim
        w = params[-1]
        if w.type.rank == 2 and w.type.shape[0] == shape[-1]:
            dims = (("dot_dimension_numbers", DotDims((), (), (len(shape) - 1,), (0,))),)
            return terms.apply("dot_general", (x, w), dims, _t(*shape[:-1], w.type.shape[1]))
    if kind == 7:  # concatenate with itself, transformed
        d = int(rng.integers(len(shape)))
        y = terms.apply("exponential", (x,), (), x.type)
        out = tuple(n * 2 if k == d else n for k, n in enumerate(shape))
        return terms.apply("concatenate", (x, y), (("dimension", d),), _t(*out))
    if kind == 8 and max(shape) > 1:  # slice
        d = int(np.argmax(shape))
        lo = tuple(1 if k == d else 0 for k in range(len(shape)))
        return slice_of(terms, x, lo, shape)
    return x


def _random_case(seed: int, depth: int) -> tuple[Terms, Term, dict[int, np.ndarray], np.random.Generator]:
    """(terms, a random term of up to `depth` ops over three parameters, random inputs, the generator)."""
    rng = np.random.default_rng(seed)
    terms = Terms()
    params = [terms.param(0, _t(4, 3), "a"), terms.param(1, _t(4, 3), "b"), terms.param(2, _t(3, 2), "w")]
    t = _random_term(terms, rng, params, int(rng.integers(1, depth + 1)))
    env = {p.id: rng.standard_normal(p.type.shape).astype(np.float32) * 0.5 for p in params}
    return terms, t, env, rng


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_push_slice_and_take_are_exact(seed: int) -> None:
    terms, t, env, rng = _random_case(seed, 4)
    whole = evaluate(t, env)
    lo = tuple(int(rng.integers(n)) for n in t.type.shape)
    hi = tuple(int(rng.integers(a + 1, n + 1)) for a, n in zip(lo, t.type.shape, strict=True))
    np.testing.assert_allclose(evaluate(push_slice(terms, t, lo, hi), env), whole[tuple(map(slice, lo, hi))],
                               rtol=1e-5, atol=1e-6)
    d = int(rng.integers(t.type.rank))
    i = int(rng.integers(t.type.shape[d]))
    np.testing.assert_allclose(evaluate(push_take(terms, t, d, i), env), np.take(whole, i, axis=d),
                               rtol=1e-5, atol=1e-6)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_normal_form_keeps_the_value(seed: int) -> None:
    terms, t, env, _ = _random_case(seed, 5)
    with np.errstate(all="ignore"):
        a, b = evaluate(t, env), evaluate(Normaliser(terms)(t), env)
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)


# -- online softmax over any blocking -------------------------------------------------------------------

def _reduce(terms: Terms, x: Term, how: str) -> Term:
    init = terms.scalar(-np.inf if how == "max" else 0.0, F32)
    return terms.apply("reduce", (x, init), (("dimensions", (1,)), ("reducer", how)), _t(x.type.shape[0]))


def _op(terms: Terms, op: str, *args: Term) -> Term:
    return terms.apply(op, args, (), args[0].type)


def _bcast(terms: Terms, m: Term, cols: int) -> Term:
    return terms.apply("broadcast_in_dim", (m,), (("broadcast_dimensions", (0,)),), _t(m.type.shape[0], cols))


def _attention(terms: Terms, s: Term, v: Term, cuts: list[int], order: list[int], broken: str) -> Term:
    """softmax(s) @ v computed online over the key blocks `cuts`, visited in `order`; `broken` names a
    step done wrong ("" for none)."""
    rows = s.type.shape[0]
    d = v.type.shape[1]
    dims = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)
    m = terms.splat(float(np.finfo(np.float32).min), _t(rows))
    den = terms.splat(0.0, _t(rows))
    o = terms.splat(0.0, _t(rows, d))
    for step, b in enumerate(order):
        lo, hi = cuts[b], cuts[b + 1]
        blk = slice_of(terms, s, (0, lo), (rows, hi))
        vlo = lo
        if broken == "value" and step == 1 and cuts[order[0] + 1] - cuts[order[0]] == hi - lo:
            vlo = cuts[order[0]]  # the first block's values again
        vb = slice_of(terms, v, (vlo, 0), (vlo + hi - lo, d))
        m_new = _op(terms, "maximum", m, _reduce(terms, blk, "max"))
        corr = _op(terms, "exponential", _op(terms, "subtract", m, m_new))
        p = _op(terms, "exponential", _op(terms, "subtract", blk, _bcast(terms, m_new, hi - lo)))
        den = _op(terms, "add", den if broken == "denominator" else _op(terms, "multiply", den, corr),
                  _reduce(terms, p, "sum"))
        pv = terms.apply("dot_general", (p, vb), dims, _t(rows, d))
        o = _op(terms, "add", o if broken == "output" else _op(terms, "multiply", o, _bcast(terms, corr, d)), pv)
        m = m_new if broken != "max" else m
    return _op(terms, "divide", o, _bcast(terms, den, d))


def _whole(terms: Terms, s: Term, v: Term) -> Term:
    rows, keys = s.type.shape
    m = _op(terms, "maximum", _reduce(terms, s, "max"), terms.splat(-np.inf, _t(rows)))
    e = _op(terms, "exponential", _op(terms, "subtract", s, _bcast(terms, m, keys)))
    p = _op(terms, "divide", e, _bcast(terms, _reduce(terms, e, "sum"), keys))
    dims = (("dot_dimension_numbers", DotDims((), (), (1,), (0,))),)
    return terms.apply("dot_general", (p, v), dims, _t(rows, v.type.shape[1]))


def _ring_case(seed: int, broken: str) -> tuple[Terms, Term, Term, dict[int, np.ndarray], tuple[list[int], list[int]]]:
    """Two to four key blocks of 1 to 4 keys each, visited in a random order: (terms, online, whole,
    random inputs, (cuts, order))."""
    rng = np.random.default_rng(seed)
    sizes = [int(m) for m in rng.integers(1, 5, size=int(rng.integers(2, 5)))]
    cuts, order = [0, *np.cumsum(sizes).tolist()], [int(b) for b in rng.permutation(len(sizes))]
    keys = cuts[-1]
    terms = Terms()
    s, v = terms.param(0, _t(3, keys), "s"), terms.param(1, _t(keys, 2), "v")
    env = {s.id: rng.standard_normal((3, keys)).astype(np.float32) * 3,
           v.id: rng.standard_normal((keys, 2)).astype(np.float32)}
    return terms, _attention(terms, s, v, cuts, order, broken), _whole(terms, s, v), env, (cuts, order)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_online_softmax_over_any_blocking_is_proven(seed: int) -> None:
    terms, online, whole, _, blocking = _ring_case(seed, "")
    assert equal(terms, online, whole), blocking


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["denominator", "output", "max", "value"]))
def test_broken_online_softmax_is_never_equal_when_the_numbers_differ(seed: int, broken: str) -> None:
    terms, online, whole, env, _ = _ring_case(seed, broken)
    if equal(terms, online, whole):
        np.testing.assert_allclose(evaluate(online, env), evaluate(whole, env), rtol=1e-4, atol=1e-5)
