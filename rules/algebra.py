"""The algebra rulesets: identities of +, −, ×, ÷ per number domain, so equal computations meet.

Every identity is declared once, as data (`IDENTITIES`): a name, the domains where it is exact, and its
two sides written against an abstract set of operations (`Ops`). The egglog rules are built from that
table (one ruleset per domain: `real`, `ring`), and the validation test evaluates the very same sides with
NumPy in every dtype of each domain — a rule cannot exist without its validation case.

Domains (the soundness issue's): `real` — floating-point types taken as the reals (reassociation is then
noted in the report, never silently accepted as a different op); `ring` — integers, signed or unsigned,
which are the ring of integers mod 2^k: + and × associate and commute, but division truncates and is *not*
the inverse of ×. Booleans and complex numbers take no algebra (their ops stay opaque).

Terms are fed to the e-graph through the low-level bindings by `scalify_hlo/egraph.py`, using the
`egg_fn` names fixed here. Constants are `Splat(exact text, type)`: the text is the exact value (an integer
in decimal, a float as `float.hex`), so 2**53 and 2**53 + 1 never meet. A finite float constant (other than
-0.0) is `RConst(rational, type)` instead: its exact value as a rational number, so that the real domain can
compute with it exactly (`FOLDS`: (x/4)/4 = x·(1/16), and x/10 never meets x·0.1f32, a different real).
Tripwires (`panic`) fire if two different constants end up in one e-class: a sign of a wrong rule.

Linearity (`HOMOGENEOUS`): ops that commute with scaling by a constant over the reals — reshape, dot,
a sum, ... — let a constant factor move out of them, so that a mean taken in two steps (a per-shard mean,
then the mean of those) meets the mean taken at once. The e-graph feeder asserts, per op it feeds, the
relation saying which of its arguments it is homogeneous in; the rules (`linear`) read that relation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from egglog import (
    BigRat,
    BigRatLike,
    Expr,
    Ruleset,
    String,
    StringLike,
    Unit,
    Vec,
    eq,
    function,
    i64,
    i64Like,
    ne,
    panic,
    relation,
    rewrite,
    rule,
    ruleset,
)

Domain = Literal["real", "ring"]
DOMAINS: tuple[Domain, ...] = ("real", "ring")


class Tensor(Expr, egg_sort="Tensor"):
    """A global tensor. Arithmetic is typed by domain; every other op is generic (name, type, attrs)."""


@function(egg_fn="Leaf")
def leaf(term_id: i64Like) -> Tensor:  # a subterm both programs share: opaque here
    ...


@function(egg_fn="Splat")
def splat(value: StringLike, ty: StringLike) -> Tensor:  # one exact value everywhere in a tensor of `ty`
    ...


@function(egg_fn="RConst")
def r_const(value: BigRatLike, ty: StringLike) -> Tensor:  # a finite float splat, as the exact rational it is
    ...


# -- the typed arithmetic, one constructor per (domain, operation) ---------------------------------------
@function(egg_fn="RAdd")
def r_add(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="RSub")
def r_sub(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="RMul")
def r_mul(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="RDiv")
def r_div(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="RNeg")
def r_neg(x: Tensor) -> Tensor: ...
@function(egg_fn="ZAdd")
def z_add(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="ZSub")
def z_sub(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="ZMul")
def z_mul(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="ZDiv")
def z_div(x: Tensor, y: Tensor) -> Tensor: ...
@function(egg_fn="ZNeg")
def z_neg(x: Tensor) -> Tensor: ...


# -- generic ops ------------------------------------------------------------------------------------------
@function(egg_fn="Op0")
def op0(name: StringLike, ty: StringLike, attrs: StringLike) -> Tensor: ...
@function(egg_fn="Op1")
def op1(name: StringLike, ty: StringLike, attrs: StringLike, a: Tensor) -> Tensor: ...
@function(egg_fn="Op2")
def op2(name: StringLike, ty: StringLike, attrs: StringLike, a: Tensor, b: Tensor) -> Tensor: ...
@function(egg_fn="Op3")
def op3(name: StringLike, ty: StringLike, attrs: StringLike, a: Tensor, b: Tensor, c: Tensor) -> Tensor: ...
@function(egg_fn="OpN")
def opn(name: StringLike, ty: StringLike, attrs: StringLike, args: Vec[Tensor]) -> Tensor: ...


# The typed constructors' egglog names, by domain and StableHLO opcode.
TYPED: dict[Domain, dict[str, str]] = {
    "real": {"add": "RAdd", "subtract": "RSub", "multiply": "RMul", "divide": "RDiv", "negate": "RNeg"},
    "ring": {"add": "ZAdd", "subtract": "ZSub", "multiply": "ZMul", "divide": "ZDiv", "negate": "ZNeg"},
}
NEGATE: dict[Domain, str] = {d: TYPED[d]["negate"] for d in DOMAINS}


def domain_of(dtype: str) -> Domain | None:
    """The number domain where the algebra of `dtype` is exact enough to rewrite (None: no algebra)."""
    if dtype.startswith(("f", "bf")):
        return "real"
    if dtype.startswith(("i", "ui")) and dtype != "i1":
        return "ring"
    return None  # booleans (i1), complex: their + and × stay opaque


@dataclass(frozen=True, slots=True)
class Ops:
    """The operations an identity is written against: egglog constructors, or NumPy for validation."""

    add: Callable[[Any, Any], Any]
    sub: Callable[[Any, Any], Any]
    mul: Callable[[Any, Any], Any]
    div: Callable[[Any, Any], Any]
    neg: Callable[[Any], Any]
    one: Any
    zero: Any


Side = Callable[[Ops, Any, Any, Any], Any]


@dataclass(frozen=True, slots=True)
class Identity:
    """`lhs = rhs` for all x, y, z of every dtype in `domains` (floats: over the reals).

    `constants` names the variables (of "x", "y", "z") the rule matches only as non-zero constants: the
    identity holds for all values (and is validated so), the rule is kept from firing on every term."""

    name: str
    domains: frozenset[Domain]
    lhs: Side
    rhs: Side
    constants: frozenset[str] = frozenset()


_BOTH = frozenset[Domain]({"real", "ring"})
_REAL = frozenset[Domain]({"real"})

IDENTITIES: tuple[Identity, ...] = (
    # + and × commute and associate in a commutative ring (the integers mod 2^k are one).
    Identity("add-commutes", _BOTH, lambda o, x, y, z: o.add(x, y), lambda o, x, y, z: o.add(y, x)),
    Identity("mul-commutes", _BOTH, lambda o, x, y, z: o.mul(x, y), lambda o, x, y, z: o.mul(y, x)),
    Identity("add-associates", _BOTH, lambda o, x, y, z: o.add(o.add(x, y), z),
             lambda o, x, y, z: o.add(x, o.add(y, z))),
    Identity("mul-associates", _BOTH, lambda o, x, y, z: o.mul(o.mul(x, y), z),
             lambda o, x, y, z: o.mul(x, o.mul(y, z))),
    # Subtraction and negation (two's complement negation wraps like the ring's).
    Identity("sub-is-add-neg", _BOTH, lambda o, x, y, z: o.sub(x, y), lambda o, x, y, z: o.add(x, o.neg(y))),
    Identity("neg-neg", _BOTH, lambda o, x, y, z: o.neg(o.neg(x)), lambda o, x, y, z: x),
    Identity("neg-mul", _BOTH, lambda o, x, y, z: o.neg(o.mul(x, y)), lambda o, x, y, z: o.mul(o.neg(x), y)),
    Identity("neg-add", _BOTH, lambda o, x, y, z: o.neg(o.add(x, y)),
             lambda o, x, y, z: o.add(o.neg(x), o.neg(y))),
    # Units.
    Identity("mul-one", _BOTH, lambda o, x, y, z: o.mul(x, o.one), lambda o, x, y, z: x),
    Identity("add-zero", _BOTH, lambda o, x, y, z: o.add(x, o.zero), lambda o, x, y, z: x),
    Identity("div-one", _BOTH, lambda o, x, y, z: o.div(x, o.one), lambda o, x, y, z: x),
    # Division is the inverse of × only over the reals: (a·b)/c is not a·(b/c) on integers.
    Identity("div-pulls-factor", _REAL, lambda o, x, y, z: o.div(o.mul(x, y), z),
             lambda o, x, y, z: o.mul(x, o.div(y, z))),
    Identity("neg-div", _REAL, lambda o, x, y, z: o.neg(o.div(x, y)), lambda o, x, y, z: o.div(o.neg(x), y)),
    # (x/y)/z = x/(y·z): XLA's simplifier merges two divisions so (Adam's bias-corrected update).
    Identity("div-div", _REAL, lambda o, x, y, z: o.div(o.div(x, y), z), lambda o, x, y, z: o.div(x, o.mul(y, z))),
    # Scaling by a constant z: it moves outward through × and +, so that scalings applied at different
    # depths meet as one outer factor (x·c + y·c is how a constant looks after it went through a sum).
    Identity("scale-out-of-mul", _BOTH, lambda o, x, y, z: o.mul(x, o.mul(y, z)),
             lambda o, x, y, z: o.mul(o.mul(x, y), z), constants=frozenset("z")),
    Identity("scale-factors-add", _BOTH, lambda o, x, y, z: o.add(o.mul(x, z), o.mul(y, z)),
             lambda o, x, y, z: o.mul(o.add(x, y), z), constants=frozenset("z")),
    Identity("scale-factors-sub", _BOTH, lambda o, x, y, z: o.sub(o.mul(x, z), o.mul(y, z)),
             lambda o, x, y, z: o.mul(o.sub(x, y), z), constants=frozenset("z")),
    # Division by a constant is multiplication by its reciprocal — over the reals only: in floats x/3 and
    # x·(1/3) round differently (x/4 = x·0.25 exactly, as 1/4 is a float; 1/3 is not, and stays the exact
    # rational here, which no float constant of a program equals). On integers division truncates.
    Identity("div-is-mul-reciprocal", _REAL, lambda o, x, y, z: o.div(x, y),
             lambda o, x, y, z: o.mul(x, o.div(o.one, y)), constants=frozenset("y")),
    Identity("scale-out-of-div", _REAL, lambda o, x, y, z: o.div(o.mul(x, z), y),
             lambda o, x, y, z: o.mul(o.div(x, y), z), constants=frozenset("z")),
)


@dataclass(frozen=True, slots=True)
class Homogeneous:
    """`op(…, c·x, …) = c·op(…, x, …)` over the reals for every constant c, x the argument `arg` of an op of
    `arity` arguments. `zero_other`: only when the other argument is 0 (a sum's initial value, a pad's
    padding value: c·0 = 0); `attrs`: only for ops with these attributes (a reduce whose reducer is a sum)."""

    op: str
    arity: int
    arg: int
    zero_other: bool = False
    attrs: tuple[tuple[str, Any], ...] = ()


HOMOGENEOUS: tuple[Homogeneous, ...] = (
    # data movement: each output element is one input element
    Homogeneous("reshape", 1, 0), Homogeneous("transpose", 1, 0), Homogeneous("broadcast_in_dim", 1, 0),
    Homogeneous("slice", 1, 0), Homogeneous("reverse", 1, 0), Homogeneous("gather", 2, 0),
    Homogeneous("pad", 2, 0, zero_other=True),
    # a float→float convert is the identity over the reals
    Homogeneous("convert", 1, 0),
    # sums of products: linear in each factor
    Homogeneous("dot_general", 2, 0), Homogeneous("dot_general", 2, 1),
    Homogeneous("reduce", 2, 0, zero_other=True, attrs=(("reducer", "sum"),)),
    # a select keeping c·x where it keeps anything else is 0 (the gradient of relu, of `where`, of abs):
    # `zero_other` is the other branch
    Homogeneous("select", 3, 1, zero_other=True), Homogeneous("select", 3, 2, zero_other=True),
)


def homogeneous_args(op: str, attrs: tuple[tuple[str, Any], ...], arg_dtypes: tuple[str, ...], dtype: str
                     ) -> tuple[Homogeneous, ...]:
    """The `HOMOGENEOUS` entries that apply to one op of the program (real types in and out)."""
    if domain_of(dtype) != "real":
        return ()
    have = dict(attrs)
    return tuple(h for h in HOMOGENEOUS
                 if h.op == op and h.arity == len(arg_dtypes) and domain_of(arg_dtypes[h.arg]) == "real"
                 and all(have.get(k) == v for k, v in h.attrs))


# (name, ty, attrs) of an op of one argument homogeneous in it; of two, in argument 0 or 1; in argument 0
# when argument 1 is 0; of three, in argument 1 or 2 when the other of them is 0. Asserted by the feeder for
# each op it feeds.
# (egglog's typing of `relation` takes an `egg_fn` only for one argument: the names are fixed for the feeder.)
_relation: Callable[..., Callable[..., Unit]] = relation
homogeneous1 = _relation("homogeneous1", String, String, String, egg_fn="Homogeneous1")
homogeneous2 = _relation("homogeneous2", String, String, String, i64, egg_fn="Homogeneous2")
homogeneous2_zero = _relation("homogeneous2_zero", String, String, String, egg_fn="Homogeneous2Zero")
homogeneous3_zero = _relation("homogeneous3_zero", String, String, String, i64, egg_fn="Homogeneous3Zero")


def exact_text(value: int | float | complex) -> str:
    """A constant's exact spelling in a `Splat`: integers (and booleans) in decimal, floats as
    `float.hex` (every float type up to f64 is exact in a Python float), so no two values share one."""
    if isinstance(value, bool | int):
        return str(int(value))
    if isinstance(value, float):
        return "nan" if value != value else value.hex()
    return repr(complex(value))


def egg_ops(domain: Domain, ty: Any) -> Ops:
    """The egglog constructors of `domain`, units as constants of any type `ty` (a pattern variable)."""
    if domain == "real":
        return Ops(r_add, r_sub, r_mul, r_div, r_neg, r_const(BigRat(1, 1), ty), r_const(BigRat(0, 1), ty))
    return Ops(z_add, z_sub, z_mul, z_div, z_neg, splat("1", ty), splat("0", ty))


def _domain_ruleset(domain: Domain) -> Ruleset:
    identities = [i for i in IDENTITIES if domain in i.domains]

    def rules(x: Tensor, y: Tensor, z: Tensor, t: String, qx: BigRat, qy: BigRat, qz: BigRat,
              sx: String, sy: String, sz: String) -> Any:
        o = egg_ops(domain, t)
        for ident in identities:
            # A variable matched only as a non-zero constant: `RConst` (reals) or `Splat` (integers) of `t`.
            bound = {"x": x, "y": y, "z": z}
            nonzero: list[Any] = []
            for name, q, s in (("x", qx, sx), ("y", qy, sy), ("z", qz, sz)):
                if name in ident.constants:
                    bound[name] = r_const(q, t) if domain == "real" else splat(s, t)
                    nonzero.append(ne(q).to(BigRat(0, 1)) if domain == "real" else ne(s).to(String("0")))
            xs = (bound["x"], bound["y"], bound["z"])
            yield rewrite(ident.lhs(o, *xs)).to(ident.rhs(o, *xs), *nonzero)

    return ruleset(rules, name=f"algebra_{domain}")


RULESETS: dict[Domain, Ruleset] = {d: _domain_ruleset(d) for d in DOMAINS}

# Arithmetic on the exact values of float constants: the reals' own (rational) arithmetic, no rounding.
FOLDS: tuple[str, ...] = ("add", "subtract", "multiply", "divide", "negate")


@ruleset
def folds(a: BigRat, b: BigRat, t: String) -> Any:
    yield rewrite(r_add(r_const(a, t), r_const(b, t))).to(r_const(a + b, t))
    yield rewrite(r_sub(r_const(a, t), r_const(b, t))).to(r_const(a - b, t))
    yield rewrite(r_mul(r_const(a, t), r_const(b, t))).to(r_const(a * b, t))
    yield rewrite(r_div(r_const(a, t), r_const(b, t))).to(r_const(a / b, t), ne(b).to(BigRat(0, 1)))
    yield rewrite(r_neg(r_const(a, t))).to(r_const(BigRat(0, 1) - a, t))


@ruleset
def linear(x: Tensor, y: Tensor, c: BigRat, n: String, ty: String, at: String, tx: String, tz: String) -> Any:
    """A constant factor moves out of an op homogeneous in that argument (`HOMOGENEOUS`), taking the op's
    type (a scalar splat is the same number at any shape)."""
    scaled = r_mul(x, r_const(c, tx))
    yield rewrite(op1(n, ty, at, scaled)).to(r_mul(op1(n, ty, at, x), r_const(c, ty)), homogeneous1(n, ty, at))
    yield rewrite(op2(n, ty, at, scaled, y)).to(r_mul(op2(n, ty, at, x, y), r_const(c, ty)),
                                                 homogeneous2(n, ty, at, i64(0)))
    yield rewrite(op2(n, ty, at, y, scaled)).to(r_mul(op2(n, ty, at, y, x), r_const(c, ty)),
                                                 homogeneous2(n, ty, at, i64(1)))
    zero = r_const(BigRat(0, 1), tz)
    yield rewrite(op2(n, ty, at, scaled, zero)).to(r_mul(op2(n, ty, at, x, zero), r_const(c, ty)),
                                                    homogeneous2_zero(n, ty, at))
    # Three arguments (a select: y its predicate), the other value 0. A constant kept by the select is its
    # factor too (`select(p, 1/64, 0)` is `select(p, 1, 0)·(1/64)`), so a mean's 1/n taken at two places meets.
    yield rewrite(op3(n, ty, at, y, scaled, zero)).to(r_mul(op3(n, ty, at, y, x, zero), r_const(c, ty)),
                                                       homogeneous3_zero(n, ty, at, i64(1)))
    yield rewrite(op3(n, ty, at, y, zero, scaled)).to(r_mul(op3(n, ty, at, y, zero, x), r_const(c, ty)),
                                                       homogeneous3_zero(n, ty, at, i64(2)))
    one = r_const(BigRat(1, 1), tx)
    kept = r_const(c, tx)
    yield rewrite(op3(n, ty, at, y, kept, zero)).to(r_mul(op3(n, ty, at, y, one, zero), r_const(c, ty)),
                                                     homogeneous3_zero(n, ty, at, i64(1)), ne(c).to(BigRat(1, 1)),
                                                     ne(c).to(BigRat(0, 1)))
    yield rewrite(op3(n, ty, at, y, zero, kept)).to(r_mul(op3(n, ty, at, y, zero, one), r_const(c, ty)),
                                                     homogeneous3_zero(n, ty, at, i64(2)), ne(c).to(BigRat(1, 1)),
                                                     ne(c).to(BigRat(0, 1)))


@ruleset
def tripwires(a: String, b: String, t: String, p: BigRat, q: BigRat) -> Any:
    yield rule(eq(splat(a, t)).to(splat(b, t)), ne(a).to(b)).then(
        panic("tripwire: two different constants were merged"))
    yield rule(eq(r_const(p, t)).to(r_const(q, t)), ne(p).to(q)).then(
        panic("tripwire: two different constants were merged"))
    yield rule(eq(splat(a, t)).to(r_const(p, t))).then(
        panic("tripwire: a non-finite constant was merged with a finite one"))


def declare_all() -> list[Expr]:
    """One expression per constructor, so the template e-graph declares every one of them."""
    x = leaf(-1)
    typed = [f(x, x) for f in (r_add, r_sub, r_mul, r_div, z_add, z_sub, z_mul, z_div)]
    return [
        splat("0", "()"), r_const(BigRat(0, 1), "()"), *typed, r_neg(x), z_neg(x),
        op0("", "", ""), op1("", "", "", x), op2("", "", "", x, x), op3("", "", "", x, x, x),
        opn("", "", "", Vec[Tensor](x)),
    ]
