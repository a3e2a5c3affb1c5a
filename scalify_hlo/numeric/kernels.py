"""NumPy kernels of the numeric interpreter: one registry, `KERNELS`, one entry per opcode.

A kernel takes the machine, the op and its operand values and returns the result values. Every array has
a leading device axis (`[D, *shape]`, see `numeric.py`), so dimension numbers are shifted by one and a
per-device scalar is a `[D]` array. The ~50 elementwise ops share one generic kernel specialised with
`functools.partial` (as JAX's lowering registry does): operands are widened to their compute dtype
(float32 for bf16/f16, like XLA CPU), the NumPy function runs, the result is rounded to the result type.
Integer semantics follow XLA: arithmetic wraps, division truncates toward zero, x/0 = -1 (unsigned: all
ones), x%0 = x, oversized shifts give 0 (arithmetic right shift: the sign), float→int converts saturate
with NaN → 0. Shape ops, dots and control flow live in `kernels_shape.py`, gather/scatter/sort/reduce in
`kernels_index.py`, collectives in `kernels_collective.py`; this module holds the elementwise kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from scalify_hlo.ir.dtypes import is_low_float, widen
from scalify_hlo.ir.nodes import Op
from scalify_hlo.numeric import kernels_collective as C
from scalify_hlo.numeric import kernels_index as X
from scalify_hlo.numeric import kernels_shape as S
from scalify_hlo.numeric.kernels_index import int_attr as _ints
from scalify_hlo.numeric.values import Val, as_array, dtype_of

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine

Kernel: TypeAlias = "Callable[[Machine, Op, list[Val]], list[Val]]"


def _shape(op: Op, i: int = 0) -> tuple[int, ...]:
    return op.results[i].tensor.shape


# ------------------------------------------------------------------------------------------ elementwise

def _elementwise(fn: Callable[..., Any], m: Machine, op: Op, args: list[Val]) -> list[Val]:
    rank = len(_shape(op))
    xs = []
    for a in args:
        x = widen(as_array(a))
        # Scalar operands of clamp/select broadcast against tensors: align them past the device axis.
        xs.append(x.reshape(x.shape + (1,) * (1 + rank - x.ndim)) if x.ndim < 1 + rank else x)
    with np.errstate(all="ignore"):  # also when called outside `run` (derive/termeval fold constants)
        return [np.asarray(fn(*xs)).astype(dtype_of(op.results[0]), copy=False)]


def _signed(dt: np.dtype[Any]) -> np.dtype[Any]:
    return np.dtype(f"i{dt.itemsize}")


def _unsigned(dt: np.dtype[Any]) -> np.dtype[Any]:
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
    amount = y.astype(_unsigned(y.dtype))
    over = amount >= bits
    safe = np.where(over, 0, amount).astype(x.dtype)
    if kind == "left":
        return np.where(over, 0, np.left_shift(x, safe))
    if kind == "logical":
        r = np.right_shift(x.astype(_unsigned(x.dtype)), safe.astype(_unsigned(x.dtype))).astype(x.dtype)
        return np.where(over, 0, r)
    s = x.astype(_signed(x.dtype))
    r = np.right_shift(s, np.minimum(safe.astype(s.dtype), bits - 1)).astype(x.dtype)
    return np.where(over, np.where(s < 0, -1, 0).astype(x.dtype), r)


def _popcnt(x: np.ndarray) -> np.ndarray:
    return np.bitwise_count(x.astype(_unsigned(x.dtype)) if x.dtype.kind == "i" else x)


def _clz(x: np.ndarray) -> np.ndarray:
    bits = x.dtype.itemsize * 8
    u = x.astype(_unsigned(x.dtype))
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


def _scipy(name: str, *xs: np.ndarray) -> np.ndarray:
    from scipy import special  # only for the rare special functions

    return np.asarray(getattr(special, name)(*xs))


_UNARY: dict[str, Callable[..., Any]] = {
    "abs": np.abs, "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
    "atan": np.arctan, "atanh": np.arctanh, "bessel_i1e": functools.partial(_scipy, "i1e"),
    "cbrt": np.cbrt, "ceil": np.ceil, "conj": np.conj, "cosh": np.cosh, "cosine": np.cos,
    "count_leading_zeros": _clz, "digamma": functools.partial(_scipy, "digamma"),
    "erf": functools.partial(_scipy, "erf"), "erf_inv": functools.partial(_scipy, "erfinv"),
    "erfc": functools.partial(_scipy, "erfc"), "exponential": np.exp, "exponential_minus_one": np.expm1,
    "floor": np.floor, "imag": np.imag, "is_finite": np.isfinite, "is_inf": np.isinf,
    "is_neg_inf": lambda x: np.isneginf(x), "is_pos_inf": lambda x: np.isposinf(x),
    "lgamma": functools.partial(_scipy, "gammaln"), "log": np.log, "log_plus_one": np.log1p,
    "logistic": lambda x: 1 / (1 + np.exp(-x)), "negate": np.negative, "not": np.invert,
    "popcnt": _popcnt, "real": np.real, "round_nearest_afz": _round_afz, "round_nearest_even": np.rint,
    "rsqrt": lambda x: 1 / np.sqrt(x), "sign": _sign, "sine": np.sin, "sinh": np.sinh, "sqrt": np.sqrt,
    "square": np.square, "tan": np.tan, "tanh": np.tanh,
}

_BINARY: dict[str, Callable[..., Any]] = {
    "add": np.add, "and": np.bitwise_and, "atan2": np.arctan2, "complex": lambda x, y: x + 1j * y,
    "divide": _divide, "maximum": np.maximum, "minimum": np.minimum, "multiply": np.multiply,
    "next_after": np.nextafter, "or": np.bitwise_or, "polygamma": functools.partial(_scipy, "polygamma"),
    "power": _power, "remainder": _remainder, "shift_left": functools.partial(_shift, "left"),
    "shift_right_arithmetic": functools.partial(_shift, "arithmetic"),
    "shift_right_logical": functools.partial(_shift, "logical"), "subtract": np.subtract,
    "xor": np.bitwise_xor, "zeta": functools.partial(_scipy, "zeta"),
    "clamp": lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi),  # (min, operand, max), XLA order
    "select": np.where,
}


_DIRECTIONS: dict[str, Callable[..., Any]] = {
    "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
    "GE": np.greater_equal,
}


def _compare(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x, y = widen(as_array(args[0])), widen(as_array(args[1]))
    kind = str(op.attrs.get("compare_type", ""))
    if kind == "TOTALORDER" and x.dtype.kind == "f":
        x, y = X.total_key(x), X.total_key(y)
    elif kind == "UNSIGNED" and x.dtype.kind == "i":
        x, y = x.astype(_unsigned(x.dtype)), y.astype(_unsigned(y.dtype))
    elif kind == "SIGNED" and x.dtype.kind == "u":
        x, y = x.astype(_signed(x.dtype)), y.astype(_signed(y.dtype))
    return [np.asarray(_DIRECTIONS[str(op.attrs["comparison_direction"])](x, y))]


def convert_array(x: np.ndarray, out: np.dtype[Any]) -> np.ndarray:
    """XLA's convert: float→int truncates, saturates and maps NaN to 0; complex→real keeps the real part."""
    if out == np.bool_:
        return np.asarray(x != 0)
    if x.dtype.kind == "c" and out.kind != "c":
        x = np.real(x)
    if (x.dtype.kind == "f" or is_low_float(x.dtype)) and out.kind in "iu":
        f = widen(x).astype(np.float64)
        info = np.iinfo(out)
        t = np.trunc(np.where(np.isnan(f), 0, f))
        big = t >= float(info.max) + 1  # a power of two, exact in float64 (info.max itself may not be)
        low = np.maximum(np.where(big, 0, t), info.min).astype(out)
        return np.where(big, info.max, low).astype(out)
    return x.astype(out)


def _convert(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    with np.errstate(all="ignore"):
        return [convert_array(as_array(args[0]), dtype_of(op.results[0]))]


def _bitcast_convert(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = np.ascontiguousarray(as_array(args[0]))
    return [x.view(dtype_of(op.results[0])).reshape((x.shape[0], *_shape(op)))]


def _bitcast(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """HLO `bitcast`: a reinterpretation of the physical buffer, so layouts (minor→major) matter."""
    x = as_array(args[0])
    out_shape = _shape(op)
    if "source_layout" in op.attrs and "result_layout" in op.attrs:
        src, res = _ints(op, "source_layout"), _ints(op, "result_layout")
        phys = x.transpose(0, *[d + 1 for d in reversed(src)])
        major = list(reversed(res))
        y = phys.reshape(x.shape[0], *[out_shape[d] for d in major])
        y = y.transpose(0, *[1 + major.index(d) for d in range(len(out_shape))])
    else:
        y = x.reshape(x.shape[0], *out_shape)
    out = dtype_of(op.results[0])
    return [y if y.dtype == out else np.ascontiguousarray(y).view(out)]


def _reduce_precision(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """Round to `mantissa_bits`/`exponent_bits` (nearest even, overflow → inf, underflow → 0), as XLA."""
    x = as_array(args[0])
    f = widen(x)
    mbits, ebits = int(op.attrs["mantissa_bits"]), int(op.attrs["exponent_bits"])  # type: ignore[arg-type]
    total_m, total_e = (52, 11) if f.dtype == np.float64 else (23, 8)
    it = np.dtype(np.uint64 if f.dtype == np.float64 else np.uint32)
    one = it.type(1)
    bits = np.ascontiguousarray(f).view(it).copy()
    if mbits < total_m:
        last = one << it.type(total_m - mbits)
        bias = (last >> one) - one + ((bits & last) >> it.type(total_m - mbits))
        bits = (bits + bias) & ~(last - one)
    if ebits < total_e:
        exp_mask = ((one << it.type(total_e)) - one) << it.type(total_m)
        sign = bits & (one << it.type(total_m + total_e))
        ebias, rbias = (1 << (total_e - 1)) - 1, (1 << (ebits - 1)) - 1
        exponent = bits & exp_mask
        bits = np.where(exponent > it.type((ebias + rbias) << total_m), sign | exp_mask,
                        np.where(exponent <= it.type((ebias - rbias) << total_m), sign, bits))
    y = np.where(np.isnan(f), f, bits.astype(it).view(f.dtype))
    return [y.astype(x.dtype)]


def _ew(name: str) -> Kernel:
    fn = _UNARY.get(name) or _BINARY[name]
    return functools.partial(_elementwise, fn)


KERNELS: dict[str, Kernel] = {
    "abs": _ew("abs"),
    "acos": _ew("acos"),
    "acosh": _ew("acosh"),
    "add": _ew("add"),
    "after_all": S.token,
    "all_gather": C.all_gather,
    "all_gather_done": S.identity,
    "all_gather_start": C.all_gather,
    "all_reduce": C.all_reduce,
    "all_reduce_done": S.identity,
    "all_reduce_start": C.all_reduce,
    "all_to_all": C.all_to_all,
    "and": _ew("and"),
    "asin": _ew("asin"),
    "asinh": _ew("asinh"),
    "async_done": C.async_done,
    "async_start": C.async_start,
    "async_update": S.identity,
    "atan": _ew("atan"),
    "atan2": _ew("atan2"),
    "atanh": _ew("atanh"),
    "bessel_i1e": _ew("bessel_i1e"),
    "bitcast": _bitcast,
    "bitcast_convert": _bitcast_convert,
    "broadcast": S.broadcast,
    "broadcast_in_dim": S.broadcast_in_dim,
    "call": S.call,
    "case": S.case,
    "cbrt": _ew("cbrt"),
    "ceil": _ew("ceil"),
    "clamp": _ew("clamp"),
    "collective_broadcast": C.collective_broadcast,
    "collective_permute": C.collective_permute,
    "collective_permute_done": S.identity,
    "collective_permute_start": C.collective_permute,
    "compare": _compare,
    "complex": _ew("complex"),
    "composite": S.composite,
    "concatenate": S.concatenate,
    "conj": _ew("conj"),
    "constant": S.constant,
    "convert": _convert,
    "copy": S.identity,
    "cosh": _ew("cosh"),
    "cosine": _ew("cosine"),
    "count_leading_zeros": _ew("count_leading_zeros"),
    "create_token": S.token,
    "custom_call": S.custom_call,
    "digamma": _ew("digamma"),
    "divide": _ew("divide"),
    "domain": S.identity,
    "dot": S.dot,
    "dot_general": S.dot_general,
    "dynamic_slice": X.dynamic_slice,
    "dynamic_update_slice": X.dynamic_update_slice,
    "erf": _ew("erf"),
    "erf_inv": _ew("erf_inv"),
    "erfc": _ew("erfc"),
    "exponential": _ew("exponential"),
    "exponential_minus_one": _ew("exponential_minus_one"),
    "floor": _ew("floor"),
    "fusion": S.region,
    "gather": X.gather,
    "get_dimension_size": S.get_dimension_size,
    "get_tuple_element": S.get_tuple_element,
    "if": S.if_,
    "imag": _ew("imag"),
    "iota": S.iota,
    "is_finite": _ew("is_finite"),
    "is_inf": _ew("is_inf"),
    "is_neg_inf": _ew("is_neg_inf"),
    "is_pos_inf": _ew("is_pos_inf"),
    "lgamma": _ew("lgamma"),
    "log": _ew("log"),
    "log_plus_one": _ew("log_plus_one"),
    "logistic": _ew("logistic"),
    "manual_computation": S.manual,
    "map": X.map_,
    "maximum": _ew("maximum"),
    "minimum": _ew("minimum"),
    "multiply": _ew("multiply"),
    "negate": _ew("negate"),
    "next_after": _ew("next_after"),
    "not": _ew("not"),
    "optimization_barrier": S.identity,
    "or": _ew("or"),
    "pad": S.pad,
    "partition_id": S.partition_id,
    "polygamma": _ew("polygamma"),
    "popcnt": _ew("popcnt"),
    "power": _ew("power"),
    "real": _ew("real"),
    "reduce": X.reduce,
    "reduce_precision": _reduce_precision,
    "reduce_scatter": C.reduce_scatter,
    "reduce_window": X.reduce_window,
    "remainder": _ew("remainder"),
    "replica_id": S.replica_id,
    "reshape": S.reshape,
    "reshard": S.identity,
    "reverse": S.reverse,
    "round_nearest_afz": _ew("round_nearest_afz"),
    "round_nearest_even": _ew("round_nearest_even"),
    "rsqrt": _ew("rsqrt"),
    "scatter": X.scatter,
    "select": _ew("select"),
    "select_and_scatter": X.select_and_scatter,
    "sharding_constraint": S.identity,
    "shift_left": _ew("shift_left"),
    "shift_right_arithmetic": _ew("shift_right_arithmetic"),
    "shift_right_logical": _ew("shift_right_logical"),
    "sign": _ew("sign"),
    "sine": _ew("sine"),
    "sinh": _ew("sinh"),
    "slice": S.slice_,
    "sort": X.sort,
    "sqrt": _ew("sqrt"),
    "square": _ew("square"),
    "subtract": _ew("subtract"),
    "tan": _ew("tan"),
    "tanh": _ew("tanh"),
    "top_k": X.top_k,
    "transpose": S.transpose,
    "tuple": S.tuple_,
    "while": S.while_,
    "xor": _ew("xor"),
    "zeta": _ew("zeta"),
}

assert list(KERNELS) == sorted(KERNELS), "keep KERNELS alphabetical"
