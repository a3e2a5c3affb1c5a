"""The algebra ruleset: identities that are exact over the reals, so equal computations meet.

Declared with egglog-python's high-level API (typed constructors, rules as functions whose typed
parameters are the pattern variables). Terms are fed to the same e-graph through the low-level bindings
by `scalify_hlo/egraph.py`, using the `egg_fn` names fixed here. Floating-point reassociation is not
exact; a proof that used these rules is reported with a note saying so (never as a different op).

Tripwires (`panic`) fire if two different constants end up in one e-class: a sign of a wrong rule.
"""

from __future__ import annotations

from egglog import (
    Expr,
    String,
    StringLike,
    Vec,
    eq,
    f64,
    f64Like,
    function,
    i64Like,
    method,
    ne,
    panic,
    rewrite,
    rule,
    ruleset,
)


class Tensor(Expr, egg_sort="Tensor"):
    """A global tensor. Elementwise arithmetic is typed; every other op is generic (name, type, attrs)."""

    @method(egg_fn="Leaf")
    @classmethod
    def leaf(cls, term_id: i64Like) -> Tensor:  # a subterm both programs share: opaque here
        ...

    @method(egg_fn="Splat")
    @classmethod
    def splat(cls, value: f64Like, ty: StringLike) -> Tensor:  # a constant with one value everywhere
        ...

    @method(egg_fn="Add")
    def __add__(self, other: Tensor) -> Tensor: ...

    @method(egg_fn="Sub")
    def __sub__(self, other: Tensor) -> Tensor: ...

    @method(egg_fn="Mul")
    def __mul__(self, other: Tensor) -> Tensor: ...

    @method(egg_fn="Div")
    def __truediv__(self, other: Tensor) -> Tensor: ...

    @method(egg_fn="Neg")
    def __neg__(self) -> Tensor: ...


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


# The typed constructors, by the StableHLO opcode they stand for.
TYPED_BINARY = {"add": "Add", "subtract": "Sub", "multiply": "Mul", "divide": "Div"}
TYPED_UNARY = {"negate": "Neg"}


@ruleset
def algebra(x: Tensor, y: Tensor, z: Tensor, a: f64, t: String) -> object:
    # Commutativity and associativity of + and × (exact over the reals; reassociation is noted).
    yield rewrite(x + y).to(y + x)
    yield rewrite(x * y).to(y * x)
    yield rewrite((x + y) + z).to(x + (y + z))
    yield rewrite((x * y) * z).to(x * (y * z))
    # Subtraction and negation.
    yield rewrite(x - y).to(x + (-y))
    minus_x = -x
    yield rewrite(-minus_x).to(x)
    yield rewrite(-(x * y)).to((-x) * y)
    yield rewrite(-(x / y)).to((-x) / y)
    yield rewrite(-(x + y)).to((-x) + (-y))
    # Units. (Folding constants is done by `terms.Terms.apply`, which can check that the folded
    # constant is exact in the program's dtype; f64 arithmetic here could not.)
    yield rewrite((x * y) / z).to(x * (y / z))
    yield rewrite(x / Tensor.splat(1.0, t)).to(x)
    yield rewrite(x * Tensor.splat(1.0, t)).to(x)
    yield rewrite(x + Tensor.splat(0.0, t)).to(x)
    yield rewrite(-Tensor.splat(a, t)).to(Tensor.splat(-a, t))


@ruleset
def tripwires(a: f64, b: f64, t: String) -> object:
    yield rule(eq(Tensor.splat(a, t)).to(Tensor.splat(b, t)), ne(a).to(b)).then(
        panic("tripwire: two different constants were merged"))


def declare_all() -> list[Expr]:
    """One expression per constructor, so the template e-graph declares every one of them."""
    leaf = Tensor.leaf(-1)
    return [
        Tensor.splat(0.0, "()") + leaf, leaf - leaf, leaf * leaf, leaf / leaf, -leaf,
        op0("", "", ""), op1("", "", "", leaf), op2("", "", "", leaf, leaf), op3("", "", "", leaf, leaf, leaf),
        opn("", "", "", Vec[Tensor](leaf)),
    ]
