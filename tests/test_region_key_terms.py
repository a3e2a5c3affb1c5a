"""The structural key of a body (`semantics.region_key`) tells apart bodies that use captured values in
other roles: a loop term keyed by it must not make two different loops one term."""

from __future__ import annotations

from scalify_hlo.ir.nodes import Op, Region, TensorType, Value
from scalify_hlo.ops.attrs import region_key

F32 = TensorType((4,), "f32")


def _body(first: Value, second: Value) -> Region:
    """x -> x * first + second: `first` and `second` come from outside the body."""
    x = Value(F32, "%x")
    m = Value(F32, "%m")
    r = Value(F32, "%r")
    return Region((x,), (Op("multiply", (x, first), (m,)), Op("add", (m, second), (r,))), (r,))


def test_captured_values_in_swapped_roles_give_different_keys() -> None:
    a, b = Value(F32, "%a"), Value(F32, "%b")
    captured = [a, b]  # the loop term's extra arguments, in this order
    assert region_key(_body(a, b), captured) != region_key(_body(b, a), captured)
    assert region_key(_body(a, b), captured) == region_key(_body(a, b), captured)


def test_nested_bodies_name_the_enclosing_values() -> None:
    a = Value(F32, "%a")

    def outer(inner_uses_argument: bool) -> Region:
        y = Value(F32, "%y")
        use = y if inner_uses_argument else a  # the enclosing body's argument, or the captured `a`
        inner = _body(use, use)
        out = Value(F32, "%o")
        return Region((y,), (Op("while", (y,), (out,), regions=(inner, inner)),), (out,))

    assert region_key(outer(True), [a]) != region_key(outer(False), [a])
