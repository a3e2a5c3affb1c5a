"""NumPy kernels of the numeric interpreter, and `KERNELS`: opcode → kernel, as the op registry fills it.

A kernel takes the machine, the op and its operand values and returns the result values. Every array has
a leading device axis (`[D, *shape]`, see `numeric/machine.py`), so dimension numbers are shifted by one
and a per-device scalar is a `[D]` array. The ~50 elementwise ops share one generic kernel specialised
with `functools.partial` (as JAX's lowering registry does): operands are widened to their compute dtype
(float32 for bf16/f16, like XLA CPU), the NumPy function runs, the result is rounded to the result type.
Integer semantics follow XLA: arithmetic wraps, division truncates toward zero, x/0 = -1 (unsigned: all
ones), x%0 = x, oversized shifts give 0 (arithmetic right shift: the sign), float→int converts saturate
with NaN → 0. This module holds the elementwise kernels and those of the elementwise rows computed from
attributes (compare, convert, bitcasts, reduce_precision); shape ops, dots and control flow live in
`kernels_shape.py`, gather/scatter/sort/reduce in `kernels_index.py`, collectives in
`kernels_collective.py`, convolution in `kernels_conv.py`. Which opcode runs which kernel is written once,
in the op registry's records.
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from scalify_hlo.ir.dtypes import is_low_float, widen
from scalify_hlo.ir.nodes import Op
from scalify_hlo.numeric import kernels_index as X
from scalify_hlo.numeric.kernels_index import int_attr as _ints
from scalify_hlo.numeric.values import Val, as_array, dtype_of, reinterprets
from scalify_hlo.ops.elementwise import signed, unsigned

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


_DIRECTIONS: dict[str, Callable[..., Any]] = {
    "EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
    "GE": np.greater_equal,
}


def compare(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x, y = widen(as_array(args[0])), widen(as_array(args[1]))
    kind = str(op.attrs.get("compare_type", ""))
    if kind == "TOTALORDER" and x.dtype.kind == "f":
        x, y = X.total_key(x), X.total_key(y)
    elif kind == "UNSIGNED" and x.dtype.kind == "i":
        x, y = x.astype(unsigned(x.dtype)), y.astype(unsigned(y.dtype))
    elif kind == "SIGNED" and x.dtype.kind == "u":
        x, y = x.astype(signed(x.dtype)), y.astype(signed(y.dtype))
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


def convert(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    with np.errstate(all="ignore"):
        return [convert_array(as_array(args[0]), dtype_of(op.results[0]))]


def bitcast_convert(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = np.ascontiguousarray(as_array(args[0]))
    out = dtype_of(op.results[0])
    reinterprets(op, x.dtype, out)
    return [x.view(out).reshape((x.shape[0], *_shape(op)))]


def bitcast(m: Machine, op: Op, args: list[Val]) -> list[Val]:
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
    if y.dtype == out:
        return [y]
    reinterprets(op, y.dtype, out)
    return [np.ascontiguousarray(y).view(out)]


def reduce_precision(m: Machine, op: Op, args: list[Val]) -> list[Val]:
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


def elementwise(fn: Callable[..., Any]) -> Kernel:
    """The kernel of an elementwise op whose meaning is the NumPy function `fn` (a row of ops/elementwise.py)."""
    return functools.partial(_elementwise, fn)


# Filled by the op registry (`ops/registry.py`), whose one record per op names its kernel, as JAX's
# `mlir.register_lowering` fills the lowering table from the module that defines each primitive.
KERNELS: dict[str, Kernel] = {}


def register(kernels: Mapping[str, Kernel]) -> None:
    KERNELS.update(kernels)


def kernel_of(opcode: str) -> Kernel | None:
    """The numeric kernel of `opcode`, None when the interpreter has none."""
    if not KERNELS:
        raise RuntimeError("no numeric kernels registered: import scalify_hlo.ops.registry first")
    return KERNELS.get(opcode)
