"""Float widths: an op computed in a wider float is the op in the narrower one, where that is its value.

XLA computes low-precision floats in float32 where a backend has no kernel for them (float
normalization on CPU, bf16 normalization, all-reduce promotion): a bf16 `add(a, b)` is compiled as
`convert_bf16(add_f32(convert_f32(a), convert_f32(b)))`. The normal form is the op in the narrower type:
- `narrowed`: a wide op on widened operands, rounded back, is the narrow op (`ops.elementwise.NARROWS` says
  whether that is exact or holds over the reals; a dot or a reduce accumulates in the wider type, equal
  over the reals: a note says the proof assumed it);
- `unwidened`: a comparison (`is_finite`) of widened operands is the comparison of the operands, and a
  dot of widened operands into the wide type is the mixed-precision dot of the operands: exact, since
  widening loses nothing and XLA computes a mixed dot in its result type.
Rounding that is not undone stays: `convert_f32(convert_bf16(x_f32))` is a rounding of x, and an op whose
operands are rounded to bf16 before it is not an op computed in float32 (computing in bf16 what the
reference computes in float32 is not normalised away).

XLA also drops roundings (xla_allow_excess_precision, on by default: `convert_f32(mul_bf16(x, x))` compiled
as `mul_f32`). Asked to read them away (`Terms.excess_precision`, `--excess-precision`), the normal form is
the other way round, `lifted`: low-precision ops computed in f32, a widened rounding the unrounded value;
`narrowed` and `unwidened` are then off (they would undo it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scalify_hlo.ir.dtypes import LOW_FLOATS
from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.ops.elementwise import EXACT, NARROWS, REALS, Narrows
from scalify_hlo.ops.reducers import Reducer
from scalify_hlo.terms import arith
from scalify_hlo.terms.term import Term, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms

# narrow float -> the floats holding each of its values and at least 2p + 2 significand bits
_WIDER: dict[str, frozenset[str]] = {
    **{low: frozenset({"f32", "f64"}) for low in LOW_FLOATS},
    "f32": frozenset({"f64"}),
}
_MOVES = frozenset({"broadcast_in_dim", "reshape", "transpose"})  # read through to the narrowed operand
_REDUCERS = frozenset({Reducer.SUM.value, Reducer.MAX.value, Reducer.MIN.value})
# Data movement rounds nothing: XLA's bf16 normalization also widens these (`convert_bf16(broadcast_f32(
# convert_f32(x)))`), and narrowed they are the movement in the narrow type, exactly.
_MOVEMENT = frozenset({"broadcast_in_dim", "concatenate", "copy", "dynamic_slice", "dynamic_update_slice", "gather",
                       "pad", "reshape", "reverse", "slice", "transpose"})
_EXCESS_NOTE = ("the proof read low-precision floats as computed in f32, roundings to them dropped where a "
                "program skips them (--excess-precision, XLA's xla_allow_excess_precision): results may differ "
                "by those roundings")
_NOTE = ("the proof read an op computed in a wider float and rounded back as the op in the narrower float "
         "(XLA's float normalization; equal over the reals, a sum or dot may round differently)")


def widens(narrow: str, wide: str) -> bool:
    """Whether float type `wide` holds every value of `narrow` with room for innocuous double rounding."""
    return wide in _WIDER.get(narrow, ())


def narrowed(terms: Terms, x: Term, type: TensorType) -> Term | None:
    """`convert(x)` to `type`, the narrower float, where x is an op computed in x's wider type on operands
    widened from `type`'s: that op in `type` (None otherwise)."""
    narrow, wide = type.dtype, x.type.dtype
    if terms.excess_precision or not widens(narrow, wide) or not x.args:
        return None
    how = EXACT if x.op in _MOVEMENT else NARROWS.get(x.op)
    if how is None:
        how = _accumulating(x)
        if how is None:
            return None
    args: list[Term] = []
    for a in x.args:
        if a.type.dtype != wide:  # a select's predicate, an index, a mixed dot's already narrow operand
            if a.type.dtype != narrow and _is_float(a.type.dtype):
                return None
            args.append(a)
            continue
        n = _narrow_operand(terms, a, narrow)
        if n is None:
            return None
        args.append(n)
    if how != EXACT:
        terms.notes.add(_NOTE)
    return terms.apply(x.op, tuple(args), x.attrs, TensorType(x.type.shape, narrow))


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("f", "bf"))


def _accumulating(x: Term) -> Narrows | None:
    """How a dot or a single-operand sum/max/min reduce narrows (over the reals), else None."""
    if x.op == "dot_general":
        return REALS
    if x.op == "reduce" and len(x.args) == 2 and dict(x.attrs).get("computation") in _REDUCERS:
        return REALS
    return None


def unwidened(terms: Terms, op: str, args: tuple[Term, ...], attrs: Any, type: TensorType) -> Term | None:
    """A comparison or `is_finite` of operands widened from one narrower float, or a dot of such operands
    into the wide type: the same op on the operands themselves (None otherwise)."""
    if not args or terms.excess_precision:
        return None
    wide = args[0].type.dtype
    if any(a.type.dtype != wide for a in args) or type.dtype not in ("i1", wide):
        return None
    narrow = _widened_from(args)
    if narrow is None or not widens(narrow, wide):
        return None
    inner = tuple(_narrow_operand(terms, a, narrow) for a in args)
    if any(a is None for a in inner):
        return None
    return terms.apply(op, tuple(a for a in inner if a is not None), attrs, type)


def _widened_from(args: tuple[Term, ...]) -> str | None:
    """The one type the operands that are converts were widened from (None: none is, or two types)."""
    found = set()
    for a in args:
        while a.op in _MOVES:
            a = a.args[0]
        if a.op == "convert":
            found.add(a.args[0].type.dtype)
    return found.pop() if len(found) == 1 else None


def _narrow_operand(terms: Terms, a: Term, narrow: str) -> Term | None:
    """The value `a` widens from `narrow`: a convert's operand, a splat `narrow` holds exactly, either of
    those moved (broadcast, reshape, transpose: moved again in `narrow`); None for anything else."""
    if a.op == "convert":
        inner = a.args[0]
        return inner if inner.type.dtype == narrow else None
    v = scalar_value(a)
    if v is not None:
        if not arith.is_exact(v, narrow):
            return None
        return terms.splat(v, TensorType(a.type.shape, narrow))
    if a.op in _MOVES and len(a.args) == 1:
        inner_n = _narrow_operand(terms, a.args[0], narrow)
        if inner_n is None:
            return None
        return terms.apply(a.op, (inner_n,), a.attrs, TensorType(a.type.shape, narrow))
    return None


def lifted(terms: Terms, op: str, args: tuple[Term, ...], attrs: Any, type: TensorType) -> Term | None:
    """With `Terms.excess_precision`: a float op on low-precision operands as the op computed in f32 on
    them widened (a widened rounding is the unrounded value: `table._convert`), rounded to the low type
    where its result is one. The normal form keeps low floats only at converts, leaves and data movement,
    so a program that drops a rounding XLA's float normalization would keep (`mul_f32(convert(x),
    convert(x))` for `convert_f32(mul_bf16(x, x))`) meets one that keeps it. None for other ops."""
    narrow = next((a.type.dtype for a in args if a.type.dtype in LOW_FLOATS), None)
    if narrow is None or op == "convert":
        return None
    if not (op in NARROWS or op in ("compare", "is_finite", "dot_general")
            or (op == "reduce" and len(args) == 2 and dict(attrs).get("computation") in _REDUCERS)):
        return None
    if type.dtype not in (narrow, "i1", "f32") or any(
            _is_float(a.type.dtype) and a.type.dtype not in (narrow, "f32") for a in args):
        return None
    wide = "f32"
    inner = terms.apply(op, tuple(terms.apply("convert", (a,), (), TensorType(a.type.shape, wide))
                                  if a.type.dtype == narrow else a for a in args),
                        attrs, TensorType(type.shape, wide if type.dtype == narrow else type.dtype))
    terms.notes.add(_EXCESS_NOTE)
    return inner if inner.type == type else terms.apply("convert", (inner,), (), type)
