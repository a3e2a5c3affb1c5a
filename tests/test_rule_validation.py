"""Every rewrite the prover may use is checked numerically in every dtype class it may fire on.

- The egglog identities (`rules/algebra.IDENTITIES`) are evaluated side by side with NumPy: integers of
  every width, signed and unsigned, exactly with XLA's semantics (wrap-around, division truncating toward
  zero, x/0 = -1, INT_MIN/-1 = INT_MIN) and edge values; floats over the reals (float64 on values drawn
  from f16/bf16/f32). Each egglog ruleset holds exactly the rules built from that table, so a rule added
  by hand, without its validation case, fails here.
- The identities kept out of a domain really are false there (so the guard matters and this test can fail).
- The ops declared homogeneous (`algebra.HOMOGENEOUS`: a constant factor moves out of them) are, each with
  a NumPy example; the folding of float constants is exact rational arithmetic.
- The Python canonicalisation (`Terms.apply`: unit folding, operand order, constant folding, negation as
  scaling, movement sinking) keeps values: random expressions over every dtype class are evaluated before
  and after canonicalisation (hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from egglog import BigRat, EGraph, eq
from hypothesis import given, settings
from hypothesis import strategies as st
from scalify_hlo.rules import algebra

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.nodes import ConvDims, Literal, TensorType
from scalify_hlo.terms import unroll
from scalify_hlo.terms.blockwise import Normaliser
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

INT_DTYPES = ["i8", "i16", "i32", "i64", "ui8", "ui32", "ui64"]
FLOAT_DTYPES = ["f16", "bf16", "f32", "f64"]
N = 512


def _np(dtype: str) -> np.dtype[Any]:
    return numpy_dtype(dtype)


# --------------------------------------------------------------------------- integers, as XLA computes them


def _int_values(dtype: str, rng: np.random.Generator) -> np.ndarray:
    info = np.iinfo(_np(dtype))
    edges = [info.min, info.min + 1, -1 if info.min < 0 else 2, 0, 1, info.max - 1, info.max]
    random = rng.integers(info.min, int(info.max) + 1, size=N - len(edges), dtype=_np(dtype))
    return np.concatenate([np.array(edges, dtype=_np(dtype)), random])


def _int_ops(dtype: str) -> algebra.Ops:
    info = np.iinfo(_np(dtype))
    bits = info.bits

    def wrap(v: int) -> int:
        v %= 1 << bits
        return v - (1 << bits) if info.min < 0 and v >= 1 << (bits - 1) else v

    def lift(f: Callable[..., int]) -> Callable[..., np.ndarray]:
        def g(*xs: np.ndarray) -> np.ndarray:
            objs = np.broadcast_arrays(*(np.asarray(x).astype(object) for x in xs))
            out = np.frompyfunc(lambda *v: wrap(f(*(int(i) for i in v))), len(xs), 1)(*objs)
            return np.asarray(out.astype(object), dtype=object)

        return g

    def div(a: int, b: int) -> int:
        if b == 0:
            return -1  # XLA: x / 0 is all bits set
        q = abs(a) // abs(b)
        return q if (a < 0) == (b < 0) else -q  # truncation toward zero; INT_MIN / -1 wraps to INT_MIN

    return algebra.Ops(add=lift(lambda a, b: a + b), sub=lift(lambda a, b: a - b), mul=lift(lambda a, b: a * b),
                       div=lift(div), neg=lift(lambda a: -a), one=np.array(1, dtype=object),
                       zero=np.array(0, dtype=object))


def _float_ops() -> algebra.Ops:
    return algebra.Ops(add=np.add, sub=np.subtract, mul=np.multiply, div=np.divide, neg=np.negative,
                       one=np.float64(1.0), zero=np.float64(0.0))


def _float_values(dtype: str, rng: np.random.Generator, nonzero: bool) -> np.ndarray:
    v = (rng.standard_normal(N) * 10.0 ** rng.integers(-2, 3, N)).astype(_np(dtype)).astype(np.float64)
    if nonzero:
        v[np.abs(v) < 1e-3] = 1.0
    return v


def _holds(ident: algebra.Identity, domain: algebra.Domain, dtype: str, seed: int) -> bool:
    rng = np.random.default_rng(seed)
    if domain == "ring":
        ops = _int_ops(dtype)
        x, y, z = (_int_values(dtype, rng) for _ in range(3))
        rng.shuffle(y)
        lhs, rhs = ident.lhs(ops, x, y, z), ident.rhs(ops, x, y, z)
        return bool(np.all(np.asarray(lhs == rhs, dtype=bool)))
    ops = _float_ops()
    x, y, z = (_float_values(dtype, rng, nonzero=True) for _ in range(3))
    with np.errstate(all="ignore"):
        lhs, rhs = ident.lhs(ops, x, y, z), ident.rhs(ops, x, y, z)
    return bool(np.allclose(lhs, rhs, rtol=1e-9, atol=1e-12))


CASES = [(i, d, dt) for i in algebra.IDENTITIES for d in sorted(i.domains)
         for dt in (INT_DTYPES if d == "ring" else FLOAT_DTYPES)]


@pytest.mark.parametrize(("ident", "domain", "dtype"), CASES, ids=[f"{i.name}-{dt}" for i, _, dt in CASES])
def test_identity_holds_in_every_dtype_of_its_domain(ident: algebra.Identity, domain: algebra.Domain,
                                                     dtype: str) -> None:
    assert _holds(ident, domain, dtype, seed=hash((ident.name, dtype)) % 2**32), \
        f"{ident.name} is not an identity on {dtype}"


OUTSIDE = [(i, dt) for i in algebra.IDENTITIES if "ring" not in i.domains for dt in INT_DTYPES]


@pytest.mark.parametrize(("ident", "dtype"), OUTSIDE, ids=[f"{i.name}-{dt}" for i, dt in OUTSIDE])
def test_identities_kept_out_of_the_integers_are_false_there(ident: algebra.Identity, dtype: str) -> None:
    assert not _holds(ident, "ring", dtype, seed=7), f"{ident.name} holds on {dtype}: why is it real-only?"


def test_each_ruleset_holds_exactly_the_validated_identities() -> None:
    for domain, rs in algebra.RULESETS.items():
        rs._update_egg_decls()  # the rules of a generator-declared ruleset are built on first use
        declared = rs.__egg_ruleset__.rules  # type: ignore[attr-defined]
        expected = [i for i in algebra.IDENTITIES if domain in i.domains]
        assert len(declared) == len(expected), f"ruleset {domain}: {len(declared)} rules, {len(expected)} validated"


def test_domains_of_dtypes() -> None:
    assert [algebra.domain_of(d) for d in ("f32", "bf16", "i32", "ui64", "i1", "complex<f32>")] == \
        ["real", "real", "ring", "ring", None, None]


def test_exact_text_separates_what_float64_merges() -> None:
    assert algebra.exact_text(2**53) != algebra.exact_text(2**53 + 1)
    assert algebra.exact_text(2**64 - 1) != algebra.exact_text(2**64 - 2)
    assert algebra.exact_text(0.0) != algebra.exact_text(-0.0)


# --------------------------------------------------------------------------- the Python canonical forms

_BINARY = ["add", "subtract", "multiply", "divide", "maximum", "minimum"]
_DTYPES = ["f32", "f16", "i8", "i32", "i64", "ui32", "ui64"]


def _const(terms: Terms, dtype: str, value: int | float, shape: tuple[int, ...]) -> Term:
    nd = _np(dtype)
    if nd.kind in "iu":
        info = np.iinfo(nd)
        value = (int(value) - int(info.min)) % (int(info.max) - int(info.min) + 1) + int(info.min)  # wraps
    return terms.constant(Literal(np.full(shape, value, dtype=nd), dtype), TensorType(shape, dtype))


@st.composite
def _expressions(draw: Any) -> tuple[str, list[tuple[Any, ...]]]:
    dtype = draw(st.sampled_from(_DTYPES))
    steps = draw(st.lists(st.tuples(st.sampled_from([*_BINARY, "negate", "square", "const"]),
                                    st.integers(0, 6), st.integers(0, 6),
                                    st.sampled_from([0, 1, -1, 2, 3, 2**31 - 1, 2**53 + 1, 2**63, 0.5, -0.0]),
                                    st.booleans()),
                          min_size=1, max_size=6))
    return dtype, steps


def _build(terms: Terms, raw: bool, dtype: str, steps: list[tuple[Any, ...]]) -> Term:
    shape = (4,)
    ty = TensorType(shape, dtype)
    nodes: list[Term] = [terms.param(0, ty, "x"), terms.param(1, ty, "y")]
    make = terms.mk if raw else terms.apply
    for op, i, j, value, scalar_broadcast in steps:
        a, b = nodes[i % len(nodes)], nodes[j % len(nodes)]
        if op == "const":
            if scalar_broadcast:
                s = _const(terms, dtype, value, ())
                nodes.append(make("broadcast_in_dim", (s,), (("broadcast_dimensions", ()),), ty))
            else:
                nodes.append(_const(terms, dtype, value, shape))
        elif op in ("negate", "square"):
            nodes.append(make(op, (a,), (), ty))
        else:
            nodes.append(make(op, (a, b), (), ty))
    return nodes[-1]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind in "iub":
        return bool(np.array_equal(a, b))
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    with np.errstate(all="ignore"):
        close = np.isclose(a64, b64, rtol=1e-2, atol=1e-3) | (np.isnan(a64) & np.isnan(b64)) | (a64 == b64)
    return bool(np.all(close))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(_expressions(), st.integers(0, 2**32 - 1))
def test_canonical_forms_keep_values(expr: tuple[str, list[tuple[Any, ...]]], seed: int) -> None:
    dtype, steps = expr
    terms = Terms()
    canon = _build(terms, False, dtype, steps)
    plain = _build(terms, True, dtype, steps)
    rng = np.random.default_rng(seed)
    nd = _np(dtype)
    if nd.kind in "iu":
        xs = [rng.integers(-3 if nd.kind == "i" else 0, 4, size=4).astype(nd) for _ in range(2)]
    else:
        xs = [rng.standard_normal(4).astype(nd) for _ in range(2)]
    env = {terms.param(i, TensorType((4,), dtype), n).id: x for i, (n, x) in enumerate(zip("xy", xs, strict=True))}
    with np.errstate(all="ignore"):
        got, want = evaluate(canon, env), evaluate(plain, env)
    assert _same(np.asarray(got), np.asarray(want)), f"{dtype} {steps}: canonical {got} vs plain {want}"


_VALUES = [0, 1, -1, 2, 3, 0.5, -0.0, 2**31 - 1, 2**53 + 1, 2**63]
_SHAPES = [
    [("const", 0, 0, c, splat), (op, 0, 2, 0, False)] for op in _BINARY for c in _VALUES for splat in (True, False)
] + [
    [("const", 0, 0, c, True), (op, 2, 0, 0, False)] for op in _BINARY for c in _VALUES
] + [
    # two scalings in a row: what `_fold_scale` folds into one constant when it is exact
    [("const", 0, 0, a, True), (op1, 0, 2, 0, False), ("const", 0, 0, b, True), (op2, 3, 4, 0, False)]
    for op1 in ("multiply", "divide") for op2 in ("multiply", "divide") for a in (2, 3, 0.5) for b in (2, 3, 0.5)
] + [[("negate", 0, 0, 0, False)], [("negate", 0, 0, 0, False), ("negate", 2, 0, 0, False)],
      [("square", 0, 0, 0, False)], [("square", 0, 0, 0, False), ("multiply", 2, 0, 0, False)]]


@pytest.mark.parametrize("dtype", _DTYPES)
def test_canonical_forms_of_every_op_and_constant_keep_values(dtype: str) -> None:
    """Exhaustive over the shapes the canonicaliser folds: op(x, c), op(c, x), two scalings, negations."""
    for i, steps in enumerate(_SHAPES):
        test_canonical_forms_keep_values.hypothesis.inner_test((dtype, steps), i)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- linearity and constant folding

# op(…, c·x, …) and c·op(…, x, …) in NumPy, per `algebra.HOMOGENEOUS` entry (op, arg): x is that argument,
# `other` the other one (0 where the entry asks for it).
_RNG_IDX = np.array([3, 0, 2, 2])
_RNG_MASK = np.random.default_rng(7).standard_normal((8, 4)) > 0
_HOMOGENEOUS_EXAMPLES: dict[tuple[str, int], Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    ("reshape", 0): lambda x, _: x.reshape(4, 4, 2),
    ("transpose", 0): lambda x, _: x.transpose(1, 0),
    ("broadcast_in_dim", 0): lambda x, _: np.broadcast_to(x[None], (3, *x.shape)),
    ("slice", 0): lambda x, _: x[1:7:2, 1:3],
    ("reverse", 0): lambda x, _: x[::-1],
    ("gather", 0): lambda x, _: x[_RNG_IDX],
    ("pad", 0): lambda x, other: np.pad(x, ((1, 2), (0, 1)), constant_values=other.reshape(-1)[0]),
    ("convert", 0): lambda x, _: x.astype(np.float64),  # float → float: the identity over the reals
    ("dot_general", 0): lambda x, other: x @ other.T,
    ("dot_general", 1): lambda x, other: other.T @ x,
    ("reduce", 0): lambda x, other: np.sum(x, axis=0) + other.reshape(-1)[0],
    ("select", 1): lambda x, other: np.where(_RNG_MASK, x, other),
    ("select", 2): lambda x, other: np.where(_RNG_MASK, other, x),
}


@pytest.mark.parametrize("h", algebra.HOMOGENEOUS, ids=lambda h: f"{h.op}-{h.arg}")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_homogeneous_ops_commute_with_scaling(h: algebra.Homogeneous, dtype: str) -> None:
    assert (h.op, h.arg) in _HOMOGENEOUS_EXAMPLES, f"{h.op} (argument {h.arg}) has no validation example"
    example = _HOMOGENEOUS_EXAMPLES[(h.op, h.arg)]
    rng = np.random.default_rng(hash((h.op, h.arg, dtype)) % 2**32)
    for c in (0.25, 3.0, -0.1, 1e3):
        c = float(np.asarray(c).astype(_np(dtype)))
        x = rng.standard_normal((8, 4)).astype(_np(dtype)).astype(np.float64)
        other = np.zeros((8, 4)) if h.zero_other else rng.standard_normal((8, 4)).astype(_np(dtype)).astype(np.float64)
        assert np.allclose(example(c * x, other), c * example(x, other), rtol=1e-9, atol=1e-12)


def test_homogeneity_needs_a_zero_where_it_says_so() -> None:
    """A sum started at 1, or a pad with 1s, is not homogeneous: the guard of `zero_other` matters."""
    x, one = np.ones((8, 4)), np.ones((8, 4))
    for op in ("reduce", "pad"):
        example = _HOMOGENEOUS_EXAMPLES[(op, 0)]
        assert not np.allclose(example(2 * x, one), 2 * example(x, one))


def test_homogeneous_facts_only_for_real_ops_with_the_attrs() -> None:
    sum_attrs = (("dimensions", (0,)), ("reducer", "sum"))
    assert [h.arg for h in algebra.homogeneous_args("reduce", sum_attrs, ("f32", "f32"), "f32")] == [0]
    assert not algebra.homogeneous_args("reduce", (("dimensions", (0,)), ("reducer", "max")), ("f32", "f32"), "f32")
    assert not algebra.homogeneous_args("convert", (), ("f32",), "i32")  # truncation is not linear
    assert not algebra.homogeneous_args("dot_general", (), ("i32", "i32"), "i32")  # integers: no RConst
    assert [h.arg for h in algebra.homogeneous_args("dot_general", (), ("f32", "f32"), "f32")] == [0, 1]


def test_linear_ruleset_has_one_rule_per_kind_of_homogeneity() -> None:
    algebra.linear._update_egg_decls()
    kinds = {(h.arity, h.arg if not h.zero_other or h.arity == 3 else "zero") for h in algebra.HOMOGENEOUS}
    # three-argument kinds (a select's branches) have a second rule each: a constant the select keeps
    rules = sum(2 if arity == 3 else 1 for arity, _ in kinds)
    assert len(algebra.linear.__egg_ruleset__.rules) == rules == 8  # type: ignore[attr-defined]


def test_constant_folds_are_exact_rational_arithmetic() -> None:
    """The folding rules compute on the exact values of float constants: what `Fraction` computes."""
    ty = "f32[]"
    values = [Fraction(1, 4), Fraction(3), Fraction(-5, 8), Fraction(float(np.float32(0.1)))]
    ops: dict[str, Callable[..., Any]] = {
        "add": algebra.r_add, "subtract": algebra.r_sub, "multiply": algebra.r_mul, "divide": algebra.r_div}
    py: dict[str, Callable[[Fraction, Fraction], Fraction]] = {
        "add": lambda a, b: a + b, "subtract": lambda a, b: a - b, "multiply": lambda a, b: a * b,
        "divide": lambda a, b: a / b}
    assert set(algebra.FOLDS) == {*ops, "negate"}

    def const(q: Fraction) -> Any:
        return algebra.r_const(BigRat(q.numerator, q.denominator), ty)

    egraph = EGraph()
    for f in ops.values():
        for a in values:
            for b in values:
                egraph.register(f(const(a), const(b)))
    for a in values:
        egraph.register(algebra.r_neg(const(a)))
    egraph.run(algebra.folds.saturate())
    for name, f in ops.items():
        for a in values:
            for b in values:
                egraph.check(eq(f(const(a), const(b))).to(const(py[name](a, b))))
    for a in values:
        egraph.check(eq(algebra.r_neg(const(a))).to(const(-a)))


def test_identities_keep_their_tensor_variables() -> None:
    """No identity makes or drops a tensor variable (x·1 = x keeps x; only constants come and go): what
    `egraph.Heads` relies on to answer, without saturating, that two terms never meet."""
    sym = algebra.Ops(add=frozenset.union, sub=frozenset.union, mul=frozenset.union, div=frozenset.union,
                      neg=lambda a: a, one=frozenset(), zero=frozenset())
    xs = (frozenset("x"), frozenset("y"), frozenset("z"))
    for ident in algebra.IDENTITIES:
        assert ident.lhs(sym, *xs) == ident.rhs(sym, *xs), ident.name


@pytest.mark.parametrize("c", [float("inf"), float("-inf"), float("nan")])
@pytest.mark.parametrize("op", ["multiply", "divide"])
def test_scale_folding_leaves_non_finite_constants(op: str, c: float) -> None:
    """x·c·2 and x/c/2 with c infinite or NaN: no ratio to fold (XLA's special-function expansions carry
    such constants); the canonical form still computes what the program does."""
    terms = Terms()
    ty = TensorType((4,), "f32")
    x = terms.param(0, ty, "x")
    t = terms.apply(op, (terms.apply(op, (x, terms.splat(c, ty)), (), ty), terms.splat(2.0, ty)), (), ty)
    v = np.array([1.5, -2.0, 0.0, 3.0], np.float32)
    f = np.multiply if op == "multiply" else np.divide
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(evaluate(t, {x.id: v}), f(f(v, np.float32(c)), np.float32(2.0)))


# --------------------------------------------------------------------------------- one spelling per value


@pytest.mark.parametrize(("lhs_dims", "rhs_dims", "out_dims"), [((0, 1), (0, 1), (0, 1)), ((1, 0), (1, 0), (1, 0)),
                                                                ((0, 1), (1, 0), (1, 0))])
def test_a_convolution_without_spatial_dims_is_the_matmul_it_computes(
        lhs_dims: tuple[int, int], rhs_dims: tuple[int, int], out_dims: tuple[int, int]) -> None:
    """`conv_general_dilated` with no spatial dims, in any dim order, canonicalised to a dot_general (and a
    transpose): the same values as the convolution kernel gives."""
    n, c, o = 3, 5, 4
    dn = ConvDims(lhs_dims[0], lhs_dims[1], (), rhs_dims[0], rhs_dims[1], (), out_dims[0], out_dims[1], ())
    attrs = (("batch_group_count", 1), ("dimension_numbers", dn), ("feature_group_count", 1), ("lhs_dilation", ()),
             ("padding", ()), ("rhs_dilation", ()), ("window_reversal", ()), ("window_strides", ()))
    lshape, rshape, oshape = [0, 0], [0, 0], [0, 0]
    lshape[dn.input_batch], lshape[dn.input_feature] = n, c
    rshape[dn.kernel_input_feature], rshape[dn.kernel_output_feature] = c, o
    oshape[dn.output_batch], oshape[dn.output_feature] = n, o
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType(tuple(lshape), "f32"))
    w = terms.mk("param", (), (("index", 1),), TensorType(tuple(rshape), "f32"))
    out = TensorType(tuple(oshape), "f32")
    plain, canon = terms.mk("convolution", (x, w), attrs, out), terms.apply("convolution", (x, w), attrs, out)
    assert canon.op in ("dot_general", "transpose")
    rng = np.random.default_rng(0)
    env = {x.id: rng.standard_normal(lshape).astype(np.float32), w.id: rng.standard_normal(rshape).astype(np.float32)}
    np.testing.assert_allclose(evaluate(canon, env), evaluate(plain, env), rtol=1e-5)


def _roll_plain(terms: Terms, x: Term, s: int) -> Term:
    """`x` shifted cyclically by `s` rows along dim 0, built without canonicalisation."""
    n = x.type.shape[0]
    if s % n == 0:
        return x
    s %= n
    rest = x.type.shape[1:]
    z = (0,) * len(rest)

    def cut(a: int, b: int) -> Term:
        attrs = (("limit_indices", (b, *rest)), ("start_indices", (a, *z)), ("strides", (1, *(1 for _ in rest))))
        return terms.mk("slice", (x,), attrs, TensorType((b - a, *rest), x.type.dtype))

    return terms.mk("concatenate", (cut(n - s, n), cut(0, n - s)), (("dimension", 0),), x.type)


def _rebuilt(terms: Terms, t: Term) -> Term:
    """`t` built again bottom-up through `Terms.apply` (every canonical form applied)."""
    if t.op in ("param", "constant"):
        return t
    return terms.apply(t.op, tuple(_rebuilt(terms, a) for a in t.args), t.attrs, t.type)


@pytest.mark.parametrize("shifts", [[2, 4], [2, 2], [3, 5], [2, 4, 6, 8, 10, 12, 14], [14, 2, 4, 12, 6, 10, 8],
                                    [4, 8, 12], [4, 8], [2, 4, 6, 8, 10, 12, 14, 2]])
@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_rolls_and_their_sums_keep_values(shifts: list[int], dtype: str) -> None:
    """Shifts of shifts (a slice of a concatenate) and the sum of every shift by multiples of a block (a
    ring all-reduce, `slicing.sum_of_rolls`): the canonical terms evaluate as the plain ones."""
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((16, 3), dtype))
    acc = passing = x
    for s in shifts:
        passing = _roll_plain(terms, x, s)
        acc = terms.mk("add", (acc, passing), (), x.type)
    nested = x
    for s in shifts:  # a roll of a roll of ..
        nested = _roll_plain(terms, nested, s)
    rng = np.random.default_rng(1)
    value = rng.integers(-50, 50, (16, 3)) if dtype == "i32" else rng.standard_normal((16, 3))
    env = {x.id: value.astype(_np(dtype))}
    for plain in (acc, nested):
        canon = _rebuilt(terms, plain)
        np.testing.assert_allclose(evaluate(canon, env), evaluate(plain, env), rtol=1e-5, atol=1e-5)
    orbit = sorted(shifts) in ([2, 4, 6, 8, 10, 12, 14], [4, 8, 12])
    assert (_rebuilt(terms, acc).op != "add") == orbit  # a whole orbit is the tiling of the block sum
    assert _rebuilt(terms, nested).op in ("concatenate", "param")  # one shift, two slices


def test_untile_inverts_tile() -> None:
    terms = Terms()
    for shape, dim in (((4, 3), 0), ((4, 3), 1), ((2,), 0)):
        s = terms.mk("param", (), (("index", 0),), TensorType(shape, "f32"))
        assert terms.untile(terms.tile(s, dim, 4), dim, 4) is s
        assert terms.untile(s, dim, 2) is None  # a parameter is no tiling


def test_argmax_from_block_maxima_is_the_first_index_of_the_maximum() -> None:
    """`min_k select(max(x_k) == max(x), k·b + argmax(x_k), BIG)` (the pmax/pmin argmax over `n` blocks of
    `b`) canonicalised to `argmax(x)` (`topk.merge_argmax`): the same index on finite inputs with ties
    inside and across blocks; a sentinel below `n·b` is left alone."""
    n, b = 4, 3
    terms = Terms()
    f32, i32 = "f32", "i32"
    x = terms.mk("param", (), (("index", 0),), TensorType((n * b,), f32))
    ninf = terms.mk("constant", (), (("value", Literal(np.array(-np.inf, np.float32), f32)),), TensorType((), f32))
    zero = terms.mk("constant", (), (("value", Literal(np.array(0, np.int32), i32)),), TensorType((), i32))
    cut = terms.mk("reshape", (x,), (), TensorType((n, b), f32))
    block_max = terms.mk("reduce", (cut, ninf), (("dimensions", (1,)), ("reducer", "max")), TensorType((n,), f32))
    whole_max = terms.mk("reduce", (x, ninf), (("dimensions", (0,)), ("reducer", "max")), TensorType((), f32))
    ids = terms.iota(1, TensorType((n, b), i32))
    arg = terms.mk("reduce", (cut, ids, ninf, zero), (("computation", "argmax"), ("dimensions", (1,)), ("index", 1)),
                   TensorType((n,), i32))
    offsets = terms.mk("constant", (), (("value", Literal(np.arange(n, dtype=np.int32) * b, i32)),),
                       TensorType((n,), i32))
    for big in (2**30, n * b - 2):
        sentinel = terms.mk("constant", (), (("value", Literal(np.array(big, np.int32), i32)),), TensorType((), i32))
        pred = terms.mk("compare", (block_max, terms.mk("broadcast_in_dim", (whole_max,), (("broadcast_dimensions", ()),),
                                                        TensorType((n,), f32))),
                        (("comparison_direction", "EQ"),), TensorType((n,), "i1"))
        picked = terms.mk("add", (arg, offsets), (), TensorType((n,), i32))
        fill = terms.mk("broadcast_in_dim", (sentinel,), (("broadcast_dimensions", ()),), TensorType((n,), i32))
        sel = terms.mk("select", (pred, picked, fill), (), TensorType((n,), i32))
        top = terms.mk("constant", (), (("value", Literal(np.array(2**31 - 1, np.int32), i32)),), TensorType((), i32))
        plain = terms.mk("reduce", (sel, top), (("dimensions", (0,)), ("reducer", "min")), TensorType((), i32))
        canon = _rebuilt(terms, plain)
        assert (canon.attr("computation") == "argmax") == (big >= n * b)
        rng = np.random.default_rng(3)
        for _ in range(50):
            value = rng.integers(-3, 3, n * b).astype(np.float32)  # many ties
            env = {x.id: value}
            assert evaluate(canon, env) == evaluate(plain, env)
            assert big < n * b or evaluate(canon, env) == np.argmax(value)


def _rw(terms: Terms, x: Term, d: int, reducer: str, prefix: bool) -> Term:
    """The cumulative reduction of `x` along `d` (`jnp.cumsum`, `lax.cummax`, reversed with `prefix` off),
    spelt as JAX lowers it: a reduce_window as long as the dim, padded on one side."""
    n, rank = x.type.shape[d], x.type.rank
    pad = np.zeros((rank, 2), np.int64)
    pad[d] = (n - 1, 0) if prefix else (0, n - 1)
    init = {"sum": 0.0, "max": -np.inf}[reducer]
    ones = (1,) * rank
    attrs = (("base_dilations", ones), ("padding", Literal(pad, "i64")), ("window_dilations", ones),
             ("window_dimensions", tuple(n if k == d else 1 for k in range(rank))), ("window_strides", ones),
             ("computation", reducer))
    return terms.mk("reduce_window", (x, _scalar(terms, init, x.type.dtype)), attrs, x.type)


def _scalar(terms: Terms, v: float, dtype: str) -> Term:
    return terms.mk("constant", (), (("value", Literal(np.array(v, _np(dtype)), dtype)),), TensorType((), dtype))


def _slice(terms: Terms, x: Term, lo: tuple[int, ...], hi: tuple[int, ...], step: int = 1) -> Term:
    shape = tuple(-(-(b - a) // step) for a, b in zip(lo, hi, strict=True))
    return terms.mk("slice", (x,), (("limit_indices", hi), ("start_indices", lo), ("strides", (step,) * len(lo))),
                    TensorType(shape, x.type.dtype))


def _normalised_keeps_value(terms: Terms, plain: Term, env: dict[int, np.ndarray]) -> Term:
    canon = Normaliser(terms)(plain)
    np.testing.assert_allclose(evaluate(canon, env), evaluate(plain, env), rtol=1e-5, atol=1e-5)
    return canon


@pytest.mark.parametrize("reducer", ["sum", "max"])
@pytest.mark.parametrize("prefix", [True, False])
@pytest.mark.parametrize("d", [0, 1])
def test_windows_of_cumulative_reductions_keep_values(reducer: str, prefix: bool, d: int) -> None:
    """A window of a cumsum / cummax (either direction) is the window's own cumulative reduction combined
    with the reduction of the rows before (after) it (`reduce_form.cumulative_slice`)."""
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((8, 6), "f32"))
    env = {x.id: np.random.default_rng(4).standard_normal((8, 6)).astype(np.float32)}
    cum = _rw(terms, x, d, reducer, prefix)
    n = x.type.shape[d]
    for a, b in ((0, n), (0, 1), (1, 3), (2, n), (n - 1, n)):
        lo = (a, 0) if d == 0 else (1, a)
        hi = (b, 6) if d == 0 else (7, b)
        canon = _normalised_keeps_value(terms, _slice(terms, cum, lo, hi), env)
        if (a, b) != (0, n):  # split into the window's rows (and the rest's reduction); one row is itself
            assert cum not in canon.args and ("reduce_window" in {t.op for t in canon.walk()}) == (b - a > 1)


def test_masked_sums_rows_and_buffers_keep_values() -> None:
    """Sums of a select by a constant mask along the summed dim, of a concatenation of single rows, of rows
    added one at a time (contiguous, every s-th, a row twice), and a buffer written at constant offsets
    (clamped as XLA clamps them): each normal form evaluates as the plain term."""
    terms = Terms()
    f32 = "f32"
    x = terms.mk("param", (), (("index", 0),), TensorType((8, 4), f32))
    env = {x.id: np.random.default_rng(5).standard_normal((8, 4)).astype(np.float32)}
    zero = _scalar(terms, 0.0, f32)
    zeros = terms.mk("broadcast_in_dim", (zero,), (("broadcast_dimensions", ()),), x.type)
    sum0 = (("dimensions", (0,)), ("reducer", "sum"))
    for bits in ([1, 1, 0, 0, 1, 0, 1, 1], [0] * 8, [1] * 8, [0, 1, 1, 1, 1, 1, 1, 0]):
        mask = terms.mk("constant", (), (("value", Literal(np.repeat(np.array(bits, bool)[:, None], 4, 1), "i1")),),
                        TensorType((8, 4), "i1"))
        sel = terms.mk("select", (mask, x, zeros), (), x.type)
        _normalised_keeps_value(terms, terms.mk("reduce", (sel, zero), sum0, TensorType((4,), f32)), env)
    rows = [terms.mk("reshape", (terms.mk("reduce", (_slice(terms, x, (0, k), (8, k + 1)), zero), sum0,
                                          TensorType((1,), f32)),), (), TensorType((1, 1), f32)) for k in range(4)]
    cat = terms.mk("concatenate", tuple(rows), (("dimension", 0),), TensorType((4, 1), f32))
    _normalised_keeps_value(terms, terms.mk("reduce", (cat, zero), sum0, TensorType((1,), f32)), env)
    row_type = TensorType((1, 4), f32)
    for order, merged in (([3, 0, 2, 1], True), ([1, 3, 5, 7], True), ([0, 2, 3], False), ([2, 2, 3], False)):
        total = _slice(terms, x, (order[0], 0), (order[0] + 1, 4))
        for k in order[1:]:
            total = terms.mk("add", (total, _slice(terms, x, (k, 0), (k + 1, 4))), (), row_type)
        canon = _normalised_keeps_value(terms, total, env)
        assert (canon.op != "add") == merged
    buf = zeros
    for at, k in ((0, 5), (6, 1), (9, 2), (3, 0)):  # 9 is clamped to 7
        upd = _slice(terms, x, (k, 0), (k + 1, 4))
        i, j = (terms.mk("constant", (), (("value", Literal(np.array(v, np.int32), "i32")),), TensorType((), "i32"))
                for v in (at, 0))
        buf = terms.mk("dynamic_update_slice", (buf, upd, i, j), (), x.type)
    _normalised_keeps_value(terms, buf, env)


def test_a_map_loop_unrolled_keeps_its_value() -> None:
    """`lax.map`'s loop (row i sliced, transformed, written into row i of a buffer) unrolled in the blockwise
    normal form (`unroll.unrolled`, dynamic slices and updates at constant offsets as slices and
    concatenates) evaluates as the loop; a loop longer than the unrolling limit stays a loop."""
    terms = Terms()
    f32, i32 = "f32", "i32"
    for rows, unrolled in ((4, True), (unroll.TRIPS + 1, False)):
        x = terms.mk("param", (), (("index", 0),), TensorType((rows, 3), f32))
        env = {x.id: np.random.default_rng(6).standard_normal((rows, 3)).astype(np.float32)}
        i0, one, n, zero = (_scalar(terms, v, i32) for v in (0, 1, rows, 0))
        buf0 = terms.mk("broadcast_in_dim", (_scalar(terms, 0.0, f32),), (("broadcast_dimensions", ()),), x.type)
        vi = terms.fresh("i", TensorType((), i32))
        vbuf = terms.fresh("buf", x.type)
        cond = terms.mk("compare", (vi, n), (("comparison_direction", "LT"),), TensorType((), "i1"))
        row_t = TensorType((1, 3), f32)
        row = terms.mk("dynamic_slice", (x, vi, zero), (("slice_sizes", (1, 3)),), row_t)
        two = terms.mk("broadcast_in_dim", (_scalar(terms, 2.0, f32),), (("broadcast_dimensions", ()),), row_t)
        done = terms.mk("multiply", (terms.mk("exponential", (row,), (), row_t), two), (), row_t)
        bodies = (terms.mk("add", (vi, one), (), vi.type), terms.mk("dynamic_update_slice", (vbuf, done, vi, zero), (),
                                                                   x.type))
        loop = terms.mk("loop", (i0, buf0, vi, vbuf, cond, *bodies), (("carried", 2), ("index", 1)), x.type)
        canon = _normalised_keeps_value(terms, loop, env)
        assert (canon.op != "loop") == unrolled


@pytest.mark.parametrize("rows", [[2, 4, 3, 1, 0], [0, 1, 2], [3, 3, 9, -2], [1, 2, 4, 0]])
@pytest.mark.parametrize("k", [0, 1])
def test_a_take_at_constant_indices_keeps_its_value(rows: list[int], k: int) -> None:
    """`jnp.take(x, rows, axis=k)`'s gather is the concatenate of those rows (`slicing.take_as_concatenate`):
    permutations, repeats, runs merged into one slice, and indices out of range clamped as XLA does."""
    from scalify_hlo.ir.nodes import GatherDims

    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((5, 6), "f32"))
    env = {x.id: np.random.default_rng(8).standard_normal((5, 6)).astype(np.float32)}
    idx_lit = Literal(np.array(rows, np.int32).reshape(-1, 1), "i32")
    idx = terms.mk("constant", (), (("value", idx_lit),), TensorType((len(rows), 1), "i32"))
    dn = GatherDims(offset_dims=(1 - k,), collapsed_slice_dims=(k,), operand_batching_dims=(),
                    start_indices_batching_dims=(), start_index_map=(k,), index_vector_dim=1)
    sizes = (1, 6) if k == 0 else (5, 1)
    shape = (len(rows), 6) if k == 0 else (5, len(rows))
    attrs = (("dimension_numbers", dn), ("indices_are_sorted", False), ("slice_sizes", sizes))
    plain = terms.mk("gather", (x, idx), attrs, TensorType(shape, "f32"))
    canon = terms.apply("gather", (x, idx), attrs, plain.type)
    assert canon.op in ("concatenate", "slice", "param")
    np.testing.assert_array_equal(evaluate(canon, env), evaluate(plain, env))


@pytest.mark.parametrize(("lo", "hi"), [(0, 4), (2, 6), (5, 7), (1, 12), (3, 4)])
@pytest.mark.parametrize("d", [0, 1])
def test_a_window_of_a_tiling_keeps_its_value(lo: int, hi: int, d: int) -> None:
    """A slice of `jnp.tile(x, 3)` (a traced roll's doubled operand) is the rows of `x` it covers: one slice
    within a copy, the concatenate of pieces across copies (`slicing.slice_of_tile`)."""
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((4, 4), "f32"))
    env = {x.id: np.random.default_rng(9).standard_normal((4, 4)).astype(np.float32)}
    tiled = terms.tile(x, d, 3)
    assert tiled.op == "reshape"
    start = tuple(lo if i == d else 1 for i in range(2))
    limit = tuple(hi if i == d else 3 for i in range(2))
    plain = _slice(terms, tiled, start, limit)
    canon = terms.apply("slice", (tiled,), (("limit_indices", limit), ("start_indices", start), ("strides", (1, 1))),
                        plain.type)
    assert canon.op in ("slice", "concatenate")
    assert all(t.op == "slice" and t.args[0] is x for t in (canon.args if canon.op == "concatenate" else (canon,)))
    np.testing.assert_array_equal(evaluate(canon, env), evaluate(plain, env))


@pytest.mark.parametrize(("windows", "whole"), [(((0, 3), (3, 6)), True), (((0, 2), (2, 5)), False),
                                                (((4, 6), (0, 4)), True)])
def test_sums_over_all_dims_of_blocks_merge(windows: tuple[tuple[int, int], ...], whole: bool) -> None:
    """Sums over every dim of column blocks of one tensor (a psum of local totals) merge into the sum over
    their concatenation, which is the whole tensor's sum when the blocks tile it (`merge_parts.split_dim`)."""
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((4, 6), "f32"))
    env = {x.id: np.random.default_rng(10).standard_normal((4, 6)).astype(np.float32)}
    zero = _scalar(terms, 0.0, "f32")
    total: Term | None = None
    for a, b in windows:
        part = terms.mk("reduce", (_slice(terms, x, (0, a), (4, b)), zero),
                        (("dimensions", (0, 1)), ("reducer", "sum")), TensorType((), "f32"))
        total = part if total is None else terms.mk("add", (total, part), (), part.type)
    assert total is not None
    canon = _normalised_keeps_value(terms, total, env)
    assert (canon.op == "reduce" and canon.args[0] is x) == whole


def test_permuted_blocks_masked_and_reduced_keep_values() -> None:
    """A ppermute that leaves one device without a block, against a take masked to zero there: a select by
    a constant mask of a concatenation is the concatenation of the runs it keeps and drops
    (`reduce_form.select_runs`); a reduction of a concatenation is that of its blocks in order, zeros left
    out (`Normaliser.reordered`); rows of `x.reshape(6, 2)` are a range of `x` (`movement.slice_of_split`)."""
    terms = Terms()
    x = terms.mk("param", (), (("index", 0),), TensorType((12,), "f32"))
    env = {x.id: np.random.default_rng(11).standard_normal(12).astype(np.float32)}
    grid = terms.mk("reshape", (x,), (), TensorType((6, 2), "f32"))
    zero = _scalar(terms, 0.0, "f32")
    zeros = terms.mk("broadcast_in_dim", (zero,), (("broadcast_dimensions", ()),), TensorType((1, 2), "f32"))
    rows = [4, 1, 5, 0, 2, 3]
    blocks = tuple(zeros if k == 0 else _slice(terms, grid, (k, 0), (k + 1, 2)) for k in rows)
    permuted = terms.mk("concatenate", blocks, (("dimension", 0),), grid.type)
    keep = Literal(np.array([[k != 0] * 2 for k in rows]), "i1")
    mask = terms.mk("constant", (), (("value", keep),), TensorType((6, 2), "i1"))
    twos = terms.mk("broadcast_in_dim", (_scalar(terms, 2.0, "f32"),), (("broadcast_dimensions", ()),), grid.type)
    masked = terms.mk("select", (mask, terms.mk("multiply", (permuted, twos), (), grid.type),
                                 terms.mk("broadcast_in_dim", (zero,), (("broadcast_dimensions", ()),), grid.type)),
                      (), grid.type)
    assert _normalised_keeps_value(terms, masked, env).op == "concatenate"
    total = terms.mk("reduce", (permuted, zero), (("dimensions", (0, 1)), ("reducer", "sum")), TensorType((), "f32"))
    norm = Normaliser(terms)
    canon = norm.reordered(norm(total))
    np.testing.assert_allclose(evaluate(canon, env), evaluate(total, env), rtol=1e-5)
    window = canon.args[0]
    while window.op == "reshape":
        (window,) = window.args
    assert window.op == "slice" and window.args[0] is x and window.attr("start_indices") == (2,)


@pytest.mark.parametrize(("op", "a", "b", "folds"), [
    ("negate", 0.03125, None, True),  # -(1/32): how a bf16 cross-entropy's cotangent is folded by XLA
    ("multiply", 0.5, 3.0, True),
    ("add", 1.0, 2.0 ** -9, False),  # 1 + 2^-9 needs 10 mantissa bits: bf16 would round it, so no fold
    ("divide", 1.0, 3.0, False),
    ("maximum", -2.0, 0.25, True),
])
def test_bf16_scalars_fold_only_when_the_result_is_exact(op: str, a: float, b: float | None, folds: bool) -> None:
    terms = Terms()
    ty = TensorType((), "bf16")
    args = (terms.scalar(a, "bf16"),) if b is None else (terms.scalar(a, "bf16"), terms.scalar(b, "bf16"))
    out = terms.apply(op, args, (), ty)
    assert (out.op == "constant") == folds, out
    if folds:
        want = {"negate": -a, "multiply": a * (b or 0), "maximum": max(a, b or 0)}[op]
        assert out is terms.scalar(want, "bf16")
