"""The distributed top-k identities (`terms/topk.py`) hold on values with ties, NaNs and signed zeros, and
are not applied where they would be false: candidates out of block order, offsets missing or permuted,
too few candidates per block, another direction, indices of another top-k."""

from __future__ import annotations

import numpy as np
import pytest

from scalify_hlo.ir.nodes import GatherDims, Literal, TensorType
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import AttrKey, Term

ROWS = 6


def _top_k(terms: Terms, x: Term, k: int, index: int, largest: bool, canon: bool) -> Term:
    attrs: AttrKey = (("k", k),) if largest else (("k", k), ("largest", False))
    t = TensorType((*x.type.shape[:-1], k), x.type.dtype if index == 0 else "i32")
    make = terms.apply if canon else terms.mk
    return make("top_k", (x,), (*attrs, ("index", index)), t)


def _merged(terms: Terms, x: Term, n: int, k1: int, k2: int, *, largest: bool = True, canon: bool,
            offsets: np.ndarray | None = None, largest2: bool | None = None) -> tuple[Term, Term]:
    """The vocab-parallel merge of `x` ([rows, n·b]) as terms: block candidates, offsets added, the top k2
    of the candidates and the indices read at its positions."""
    make = terms.apply if canon else terms.mk
    rows, size = x.type.shape
    b = size // n
    blocks = make("reshape", (x,), (), TensorType((rows, n, b), "f32"))
    cands = [make("reshape", (_top_k(terms, blocks, k1, i, largest, canon),), (),
                  TensorType((rows, n * k1), "f32" if i == 0 else "i32")) for i in (0, 1)]
    if offsets is None:
        offsets = np.repeat(np.arange(n, dtype=np.int32) * b, k1)
    c = terms.constant(Literal(np.broadcast_to(offsets, (rows, n * k1)).astype(np.int32).copy(), "i32"),
                       TensorType((rows, n * k1), "i32"))
    ids = make("add", (cands[1], c), (), cands[1].type)
    second = largest if largest2 is None else largest2
    values = _top_k(terms, cands[0], k2, 0, second, canon)
    pos = _top_k(terms, cands[0], k2, 1, second, canon)
    pos3 = make("reshape", (pos,), (), TensorType((rows, k2, 1), "i32"))
    g = GatherDims(offset_dims=(), collapsed_slice_dims=(1,), operand_batching_dims=(0,),
                   start_indices_batching_dims=(0,), start_index_map=(1,), index_vector_dim=2)
    taken = make("gather", (ids, pos3), (("dimension_numbers", g), ("slice_sizes", (1, 1))),
                 TensorType((rows, k2), "i32"))
    return values, taken


def _tied(rng: np.random.Generator, size: int) -> np.ndarray:
    """Few distinct values (many ties), NaNs of both signs, both zeros and infinities among them."""
    pool = np.array([0.0, -0.0, 1.0, 1.0, 2.0, -1.0, np.inf, -np.inf, np.nan, -np.nan, 2.0, 1.0], np.float32)
    return rng.choice(pool, size=(ROWS, size)).astype(np.float32)


@pytest.mark.parametrize(("n", "b", "k1", "k2", "largest"), [
    (4, 4, 3, 3, True), (4, 4, 4, 2, True), (2, 8, 5, 5, False), (8, 2, 2, 1, True), (3, 5, 5, 4, False)])
def test_merge_equals_the_global_top_k(n: int, b: int, k1: int, k2: int, largest: bool) -> None:
    terms = Terms()
    x = terms.param(0, TensorType((ROWS, n * b), "f32"), "x")
    plain = _merged(terms, x, n, k1, k2, largest=largest, canon=False)
    canon = _merged(terms, x, n, k1, k2, largest=largest, canon=True)
    want = (_top_k(terms, x, k2, 0, largest, True), _top_k(terms, x, k2, 1, largest, True))
    assert canon == want  # the canonicaliser merges both outputs into the global top-k
    rng = np.random.default_rng(n * 100 + b)
    for _ in range(30):
        env = {x.id: _tied(rng, n * b)}
        for got, ref in zip(plain, want, strict=True):
            np.testing.assert_array_equal(evaluate(got, env).view(np.int32), evaluate(ref, env).view(np.int32))


def _differs(terms: Terms, x: Term, got: Term, ref: Term) -> bool:
    rng = np.random.default_rng(0)
    return any(not np.array_equal(evaluate(got, env := {x.id: _tied(rng, x.type.shape[1])}).view(np.int32),
                                  evaluate(ref, env).view(np.int32)) for _ in range(50))


@pytest.mark.parametrize("case", ["reversed offsets", "no offsets", "too few per block", "other direction"])
def test_merge_is_refused_where_it_is_false(case: str) -> None:
    n, b, k = 4, 4, 3
    terms = Terms()
    x = terms.param(0, TensorType((ROWS, n * b), "f32"), "x")
    kwargs: dict[str, object] = {}
    k1 = k
    if case == "reversed offsets":
        kwargs["offsets"] = np.repeat(np.arange(n)[::-1] * b, k)
    elif case == "no offsets":
        kwargs["offsets"] = np.zeros(n * k, np.int32)
    elif case == "too few per block":
        k1 = k - 1
    else:
        kwargs["largest2"] = False
    canon = _merged(terms, x, n, k1, k, canon=True, **kwargs)  # type: ignore[arg-type]
    plain = _merged(terms, x, n, k1, k, canon=False, **kwargs)  # type: ignore[arg-type]
    want = (_top_k(terms, x, k, 0, True, True), _top_k(terms, x, k, 1, True, True))
    merged = [c == w for c, w in zip(canon, want, strict=True)]
    assert merged[1] is False  # the indices are never merged
    if case in ("reversed offsets", "no offsets"):
        assert merged[0]  # the values do not depend on the offsets
    else:
        assert merged[0] is False
    # and rightly so: each refused identity is false on some input
    assert any(_differs(terms, x, p, w) for p, w, m in zip(plain, want, merged, strict=True) if not m)


def test_candidates_out_of_block_order_are_not_merged() -> None:
    """Candidates in another order than block by block (a permuted gather) are another term, left alone:
    their positions would break ties otherwise than the global indices do."""
    n, b, k = 4, 4, 2
    terms = Terms()
    x = terms.param(0, TensorType((ROWS, n * b), "f32"), "x")
    blocks = terms.apply("reshape", (x,), (), TensorType((ROWS, n, b), "f32"))
    values = _top_k(terms, blocks, k, 0, True, True)
    interleaved = terms.apply("transpose", (values,), (("permutation", (0, 2, 1)),), TensorType((ROWS, k, n), "f32"))
    cands = terms.apply("reshape", (interleaved,), (), TensorType((ROWS, n * k), "f32"))
    top = _top_k(terms, cands, k, 0, True, True)
    assert top.op == "top_k" and top.args[0] is cands
