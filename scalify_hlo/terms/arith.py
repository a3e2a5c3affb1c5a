"""Exact arithmetic canonical forms of the term table: scalar constants folded where the result is exact in
the dtype, constant scalings merged (x/a/b as x/(a·b), x·2⁻ᵏ as x/2ᵏ), and a product with a broadcast
reciprocal read as the division XLA's simplifier made it from. Folded here rather than in egglog because
only here can the folded constant be checked exactly representable in the program's dtype.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.dtypes import LOW_FLOATS, numpy_dtype
from scalify_hlo.ir.nodes import Literal, TensorType
from scalify_hlo.terms.term import AttrKey, Term, resplat, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms


_FOLDABLE = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
             "negate": np.negative, "maximum": np.maximum, "minimum": np.minimum, "sqrt": np.sqrt}


def fold_scalars(terms: Terms, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
    """Arithmetic on scalar constants, computed in the program's float type as XLA's constant folder
    does (these ops are correctly rounded in IEEE arithmetic, so the folded value is the program's)."""
    fn = _FOLDABLE.get(op)
    low = type.dtype in LOW_FLOATS and type.dtype != "f16"  # (bf16, f8: folded only where exact, below)
    if fn is None or not (low or type.dtype in ("f16", "f32", "f64")):
        return None
    if type.rank != 0:
        if not args or any(scalar_value(a) is None for a in args):
            return None
        cores = tuple(c for a in args if (c := resplat(terms, a, ())) is not None)
        folded = fold_scalars(terms, op, cores, attrs, TensorType((), type.dtype))
        return None if folded is None else resplat(terms, folded, type.shape)  # splats fold like scalars
    if not all(a.op == "constant" and a.type.rank == 0 for a in args):
        return None
    dt = numpy_dtype(type.dtype)
    if low:
        # Computed exactly in f64 and kept only if the result is a value of the dtype: then no rounding
        # happened, and any folder (XLA's included) gets it (-(1/32) in bf16 as the partitioner folds it).
        with np.errstate(all="ignore"):
            exact = fn(*(np.asarray(a.attr("value").array, dtype=dt).astype(np.float64) for a in args))
        if not np.isfinite(exact) or not is_exact(float(exact), type.dtype):
            return None
        return terms.scalar(float(exact), type.dtype)  # (held as the parsers hold such a constant)
    with np.errstate(all="ignore"):
        value = fn(*(np.asarray(a.attr("value").array, dtype=dt) for a in args))
    return terms.constant(Literal(np.asarray(value, dtype=dt), type.dtype), type)


def is_exact(value: float, dtype: str) -> bool:
    """Whether `value` is representable exactly in `dtype` (so folding it changes nothing)."""
    try:
        nd = numpy_dtype(dtype)
    except ValueError:
        return False
    if nd.kind in "iu":
        info = np.iinfo(nd)
        return float(value).is_integer() and info.min <= value <= info.max
    if nd.kind not in "fV":
        return float(value).is_integer()
    return bool(float(np.array(value).astype(nd).astype(np.float64)) == value)


def _fold_scale(terms: Terms, op: str, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """x/a/b → x/(a·b) and x·a·b → x·(a·b) when a·b is exact in the dtype; x·2⁻ᵏ → x/2ᵏ.

    Exact over the reals, and folded here rather than in egglog because only here can we check that
    the folded constant is exactly representable in the program's dtype."""
    x, c = args
    cv = scalar_value(c)
    if cv is None or not math.isfinite(cv) or not type.dtype.startswith(("f", "bf")):
        return None  # (inf and NaN are no ratio: x·inf·2 stays as written)
    if op == "multiply" and cv != 0 and abs(math.frexp(1.0 / cv)[0]) == 0.5 and abs(cv) < 1:
        return terms.apply("divide", (x, terms.splat(1.0 / cv, type)), (), type)
    if op == "divide" and x.op == "multiply" and cv != 0:
        inner, ic = x.args
        iv = scalar_value(ic)
        if iv is not None and math.isfinite(iv):  # (x · a) / b = x · (a / b) when a / b is exact
            ratio = Fraction(iv) / Fraction(cv)
            if is_exact(float(ratio), type.dtype) and Fraction(float(ratio)) == ratio:
                return terms.apply("multiply", (inner, terms.splat(float(ratio), type)), (), type)
    if x.op == op:
        inner, ic = x.args
        iv = scalar_value(ic)
        if iv is not None and math.isfinite(iv):
            exact = Fraction(iv) * Fraction(cv)
            if is_exact(float(exact), type.dtype) and Fraction(float(exact)) == exact:
                return terms.apply(op, (inner, terms.splat(float(exact), type)), (), type)
    return None


def divide(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return _fold_scale(terms, "divide", args, type)


def multiply(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    if scalar_value(args[0]) is not None and scalar_value(args[1]) is None:
        args = (args[1], args[0])
    return _fold_scale(terms, "multiply", args, type) or _reciprocal(terms, args, type)


_MOVES = frozenset({"broadcast_in_dim", "reshape", "transpose"})


def _reciprocal(terms: Terms, args: tuple[Term, ...], type: TensorType) -> Term | None:
    """x · m(1 / y) = x / m(y) for a movement m (broadcast, reshape, transpose): XLA's simplifier turns a
    division by a broadcast into a product with the broadcast reciprocal. Over the reals (floats only; on
    integers 1/y truncates); also where y is 0 (±inf and NaN alike)."""
    if not type.dtype.startswith(("f", "bf")):
        return None
    for side in (0, 1):
        moves: list[Term] = []
        r = args[side]
        while r.op in _MOVES:
            moves.append(r)
            r = r.args[0]
        if r.op != "divide" or scalar_value(r.args[0]) != 1.0:
            continue
        y = r.args[1]
        for m in reversed(moves):
            y = terms.apply(m.op, (y,), m.attrs, m.type)
        terms.notes.add("the proof read x · (1/y) as x / y (equal over the reals; they round differently)")
        return terms.apply("divide", (args[1 - side], y), (), type)
    return None
