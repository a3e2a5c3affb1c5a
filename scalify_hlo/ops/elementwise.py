"""The elementwise ops: one table, one row per op, with the NumPy function that is its meaning.

Every stage reads this table: the numeric kernels run `fn` (on operands widened to their compute dtype,
see `ir.dtypes.widen`), the transfer rules give every row the one elementwise rule, the term table sinks
data movement through them and orders the operands of the commutative ones. Adding an elementwise op is
adding a row here (and its case in `tests/test_rule_validation.py`). A row whose `fn` is None computes
from its attributes or result type; its kernel is written out in `numeric/kernels.py`.

Integer semantics follow XLA: arithmetic wraps, division truncates toward zero, x/0 = -1 (unsigned: all
ones), x%0 = x, oversized shifts give 0 (arithmetic right shift: the sign).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np


def _scipy(name: str, *xs: np.ndarray) -> np.ndarray:
    from scipy import special  # optional heavy dependency: only the rare special functions need it

    return np.asarray(getattr(special, name)(*xs))


def signed(dt: np.dtype[Any]) -> np.dtype[Any]:
    return np.dtype(f"i{dt.itemsize}")


def unsigned(dt: np.dtype[Any]) -> np.dtype[Any]:
    return np.dtype(f"u{dt.itemsize}")


def _divide(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "iu":
        return np.asarray(x / y)
    zero = y == 0
    safe = np.where(zero, 1, y).astype(x.dtype)
    if x.dtype.kind == "u":
        return np.where(zero, np.iinfo(x.dtype).max, x // safe)
    overflow = (x == np.iinfo(x.dtype).min) & (safe == -1)
    safe = np.where(overflow, 1, safe)
    q = np.floor_divide(x, safe)
    q = np.where((x - q * safe != 0) & ((x < 0) != (safe < 0)), q + 1, q)  # floor → toward zero
    return np.where(zero, -1, q)  # INT_MIN / -1 stays INT_MIN: x // 1


def _remainder(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "iu":
        return np.fmod(x, y)
    # x % 0 = x; x % -1 = 0 (also for INT_MIN, which C leaves undefined).
    safe = np.where((y == 0) | ((y == -1) if x.dtype.kind == "i" else False), 1, y).astype(x.dtype)
    return np.where(y == 0, x, np.fmod(x, safe))


def _power(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    if x.dtype.kind not in "iu":
        return np.power(x, y)
    x, y = np.broadcast_arrays(x, y)
    result = np.ones_like(x)
    base = x.copy()
    e = np.where(y < 0, 0, y).astype(np.uint64)
    while e.any():
        result = np.where(e & 1, result * base, result)
        base = base * base
        e = e >> np.uint64(1)
    if x.dtype.kind == "i":  # negative exponents: only ±1 survive
        negative = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0)).astype(x.dtype)
        result = np.where(y < 0, negative, result)
    return result


def _shift(kind: str, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    amount = y.astype(unsigned(y.dtype))
    over = amount >= bits
    safe = np.where(over, 0, amount).astype(x.dtype)
    if kind == "left":
        return np.where(over, 0, np.left_shift(x, safe))
    if kind == "logical":
        r = np.right_shift(x.astype(unsigned(x.dtype)), safe.astype(unsigned(x.dtype))).astype(x.dtype)
        return np.where(over, 0, r)
    s = x.astype(signed(x.dtype))
    r = np.right_shift(s, np.minimum(safe.astype(s.dtype), bits - 1)).astype(x.dtype)
    return np.where(over, np.where(s < 0, -1, 0).astype(x.dtype), r)


def _popcnt(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x.astype(unsigned(x.dtype)) if x.dtype.kind == "i" else x)


def _clz(x: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    u = x.astype(unsigned(x.dtype))
    n = np.zeros(u.shape, dtype=np.int64)
    step = bits // 2
    while step:  # binary search for the highest set bit, all elements at once
        top_zero = (u >> np.array(bits - step, u.dtype)) == 0
        n += top_zero * step
        u = np.where(top_zero, u << np.array(step, u.dtype), u)
        step //= 2
    return n + ((u >> np.array(bits - 1, u.dtype)) == 0)


def _sign(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        mag = np.abs(x)
        return np.where(mag == 0, 0, x / np.where(mag == 0, 1, mag))
    return np.where(x == 0, x, np.sign(x))  # keeps -0.0 and NaN


def _round_afz(x: np.ndarray) -> np.ndarray:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.copysign(1, x), t)


# How an op computed in a wider float and rounded back (XLA's float normalization: `convert_bf16(add_f32(
# convert_f32(a), convert_f32(b)))` for a bf16 add) compares with the op in its own float type:
Narrows = Literal["exact", "reals"]
# the same value: for + - * / sqrt, double rounding through a format of at least 2p + 2 bits is
# innocuous (f32 for bf16 and f16, f64 for f32), and the others do not round (max, abs, floor, select);
EXACT: Narrows = "exact"
# the same over the reals (a transcendental function: its rounding is the library's in either type).
REALS: Narrows = "reals"


@dataclass(frozen=True, slots=True)
class Elementwise:
    """`fn` maps widened operand arrays to the result (None: the kernel reads attributes, see above);
    `commutative` ops have their operands ordered in terms; `same_shape` is False where the result's
    shape may differ from the operands' (a bitcast between widths); `narrows`: a float op's value
    computed in a wider float and rounded back (`terms.precision`), None for the others."""

    fn: Callable[..., Any] | None
    commutative: bool = False
    same_shape: bool = True
    narrows: Narrows | None = None


ELEMENTWISE: dict[str, Elementwise] = {
    "abs": Elementwise(np.abs, narrows=EXACT),
    "acos": Elementwise(np.arccos, narrows=REALS),
    "acosh": Elementwise(np.arccosh, narrows=REALS),
    "add": Elementwise(np.add, commutative=True, narrows=EXACT),
    "and": Elementwise(np.bitwise_and, commutative=True),
    "asin": Elementwise(np.arcsin, narrows=REALS),
    "asinh": Elementwise(np.arcsinh, narrows=REALS),
    "atan": Elementwise(np.arctan, narrows=REALS),
    "atan2": Elementwise(np.arctan2, narrows=REALS),
    "atanh": Elementwise(np.arctanh, narrows=REALS),
    "bessel_i1e": Elementwise(functools.partial(_scipy, "i1e"), narrows=REALS),
    "bitcast_convert": Elementwise(None, same_shape=False),  # a reinterpretation of the bits, width changes change the shape
    "cbrt": Elementwise(np.cbrt, narrows=REALS),
    "ceil": Elementwise(np.ceil, narrows=EXACT),
    "clamp": Elementwise(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi), narrows=EXACT),  # (min, operand, max), XLA order
    "compare": Elementwise(None),  # direction and compare type are attributes
    "complex": Elementwise(lambda x, y: x + 1j * y),
    "conj": Elementwise(np.conj),
    "convert": Elementwise(None),  # the result type says to what
    "cosh": Elementwise(np.cosh, narrows=REALS),
    "cosine": Elementwise(np.cos, narrows=REALS),
    "count_leading_zeros": Elementwise(_clz),
    "digamma": Elementwise(functools.partial(_scipy, "digamma"), narrows=REALS),
    "divide": Elementwise(_divide, narrows=EXACT),
    "erf": Elementwise(functools.partial(_scipy, "erf"), narrows=REALS),
    "erf_inv": Elementwise(functools.partial(_scipy, "erfinv"), narrows=REALS),
    "erfc": Elementwise(functools.partial(_scipy, "erfc"), narrows=REALS),
    "exp2": Elementwise(np.exp2, narrows=REALS),  # stablehlo.exp2, jax >= 0.12.1 (mhlo.exp2 from 0.12.0.1)
    "exponential": Elementwise(np.exp, narrows=REALS),
    "exponential_minus_one": Elementwise(np.expm1, narrows=REALS),
    "floor": Elementwise(np.floor, narrows=EXACT),
    "fma": Elementwise(lambda a, b, c: a * b + c, narrows=REALS),  # one rounding in XLA; in the widened dtype here
    "imag": Elementwise(np.imag),
    "is_finite": Elementwise(np.isfinite),
    "is_inf": Elementwise(np.isinf),
    "is_neg_inf": Elementwise(lambda x: np.isneginf(x)),
    "is_pos_inf": Elementwise(lambda x: np.isposinf(x)),
    "lgamma": Elementwise(functools.partial(_scipy, "gammaln"), narrows=REALS),
    "log": Elementwise(np.log, narrows=REALS),
    "log2": Elementwise(np.log2, narrows=REALS),  # stablehlo.log2, jax >= 0.12.1 (mhlo.log2 from 0.12.0.1)
    "log_plus_one": Elementwise(np.log1p, narrows=REALS),
    "logistic": Elementwise(lambda x: 1 / (1 + np.exp(-x)), narrows=REALS),
    "maximum": Elementwise(np.maximum, commutative=True, narrows=EXACT),
    "minimum": Elementwise(np.minimum, commutative=True, narrows=EXACT),
    "multiply": Elementwise(np.multiply, commutative=True, narrows=EXACT),
    "negate": Elementwise(np.negative, narrows=EXACT),
    "next_after": Elementwise(np.nextafter),
    "not": Elementwise(np.invert),
    "or": Elementwise(np.bitwise_or, commutative=True),
    "polygamma": Elementwise(functools.partial(_scipy, "polygamma"), narrows=REALS),
    "popcnt": Elementwise(_popcnt),
    "power": Elementwise(_power, narrows=REALS),
    "real": Elementwise(np.real),
    "reduce_precision": Elementwise(None),  # mantissa and exponent bits are attributes
    "remainder": Elementwise(_remainder, narrows=EXACT),
    "round_nearest_afz": Elementwise(_round_afz, narrows=EXACT),
    "round_nearest_even": Elementwise(np.rint, narrows=EXACT),
    "rsqrt": Elementwise(lambda x: 1 / np.sqrt(x), narrows=REALS),
    "select": Elementwise(np.where, narrows=EXACT),
    "shift_left": Elementwise(functools.partial(_shift, "left")),
    "shift_right_arithmetic": Elementwise(functools.partial(_shift, "arithmetic")),
    "shift_right_logical": Elementwise(functools.partial(_shift, "logical")),
    "sign": Elementwise(_sign, narrows=EXACT),
    "sine": Elementwise(np.sin, narrows=REALS),
    "sinh": Elementwise(np.sinh, narrows=REALS),
    "sqrt": Elementwise(np.sqrt, narrows=EXACT),
    "square": Elementwise(np.square, narrows=EXACT),
    "subtract": Elementwise(np.subtract, narrows=EXACT),
    "tan": Elementwise(np.tan, narrows=REALS),
    "tanh": Elementwise(np.tanh, narrows=REALS),
    "xor": Elementwise(np.bitwise_xor, commutative=True),
    "zeta": Elementwise(functools.partial(_scipy, "zeta"), narrows=REALS),
}

# JAX's FFI kernels of elementwise ops (jax >= 0.12.1 lowers lgamma and digamma to these on CPU, CUDA and
# ROCm): a call of one operand and one result of its type is the op itself.
ELEMENTWISE_CUSTOM_CALLS: dict[str, str] = {
    f"{platform}_{op}_ffi": op for platform in ("cpu", "cu", "hip") for op in ("digamma", "lgamma")}

COMMUTATIVE = frozenset(name for name, e in ELEMENTWISE.items() if e.commutative)
# The elementwise ops whose result has their operands' shape: data movement commutes with these.
SHAPE_PRESERVING = frozenset(name for name, e in ELEMENTWISE.items() if e.same_shape)
NARROWS: dict[str, Narrows] = {name: e.narrows for name, e in ELEMENTWISE.items() if e.narrows is not None}
