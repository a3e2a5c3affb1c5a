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
in decimal, a float as `float.hex`), so 2**53 and 2**53 + 1 never meet. Tripwires (`panic`) fire if two
different constants end up in one e-class: a sign of a wrong rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from egglog import (
    Expr,
    Ruleset,
    String,
    StringLike,
    Vec,
    eq,
    function,
    i64Like,
    ne,
    panic,
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
    """`lhs = rhs` for all x, y, z of every dtype in `domains` (floats: over the reals)."""

    name: str
    domains: frozenset[Domain]
    lhs: Side
    rhs: Side


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
)


def exact_text(value: int | float | complex) -> str:
    """A constant's exact spelling in a `Splat`: integers (and booleans) in decimal, floats as
    `float.hex` (every float type up to f64 is exact in a Python float), so no two values share one."""
    if isinstance(value, bool | int):
        return str(int(value))
    if isinstance(value, float):
        return "nan" if value != value else value.hex()
    return repr(complex(value))


def egg_ops(domain: Domain, ty: Any) -> Ops:
    """The egglog constructors of `domain`, units as splats of any type `ty` (a pattern variable)."""
    if domain == "real":
        return Ops(r_add, r_sub, r_mul, r_div, r_neg, splat(exact_text(1.0), ty), splat(exact_text(0.0), ty))
    return Ops(z_add, z_sub, z_mul, z_div, z_neg, splat("1", ty), splat("0", ty))


def _domain_ruleset(domain: Domain) -> Ruleset:
    identities = [i for i in IDENTITIES if domain in i.domains]

    def rules(x: Tensor, y: Tensor, z: Tensor, t: String) -> Any:
        o = egg_ops(domain, t)
        for ident in identities:
            yield rewrite(ident.lhs(o, x, y, z)).to(ident.rhs(o, x, y, z))

    return ruleset(rules, name=f"algebra_{domain}")


RULESETS: dict[Domain, Ruleset] = {d: _domain_ruleset(d) for d in DOMAINS}


@ruleset
def tripwires(a: String, b: String, t: String) -> Any:
    yield rule(eq(splat(a, t)).to(splat(b, t)), ne(a).to(b)).then(
        panic("tripwire: two different constants were merged"))


def declare_all() -> list[Expr]:
    """One expression per constructor, so the template e-graph declares every one of them."""
    x = leaf(-1)
    typed = [f(x, x) for f in (r_add, r_sub, r_mul, r_div, z_add, z_sub, z_mul, z_div)]
    return [
        splat("0", "()"), *typed, r_neg(x), z_neg(x),
        op0("", "", ""), op1("", "", "", x), op2("", "", "", x, x), op3("", "", "", x, x, x),
        opn("", "", "", Vec[Tensor](x)),
    ]
