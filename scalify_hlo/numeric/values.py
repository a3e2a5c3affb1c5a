"""What the numeric interpreter computes with: per-device value stacks, their dtypes, and its error.

Every value carries a leading device axis (`[D, *shape]`, see `machine.py`); a tuple or async bundle is a
tuple of values.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeAlias

import numpy as np

from scalify_hlo.ir.dtypes import is_low_float, numpy_dtype
from scalify_hlo.ir.errors import Span, UnsupportedError
from scalify_hlo.ir.nodes import Op, Value

Val: TypeAlias = "np.ndarray | tuple[Val, ...]"  # a tensor stack, or a tuple/async bundle of values

MAX_TRIPS = 10_000_000  # a `while` that runs longer than this is reported, not waited for


class NumericUnsupported(UnsupportedError):
    """An op the interpreter has no kernel for, or an attribute/case its kernel does not handle."""

    def __init__(self, op: Op | None, reason: str) -> None:
        what = f"`{op.opcode}` ({op.describe()})" if op is not None else "the program"
        site = op.loc.site if op is not None else None
        span = Span(op.loc.ir_file, op.loc.ir_line) if op is not None and op.loc.ir_file else None
        super().__init__(span, f"numeric interpreter cannot run {what} at {site or 'an unknown site'}: "
                         f"{reason}")
        self.op = op
        self.reason = reason


# Set by `widened`: every float held in float64 (complex in complex128).
WIDE: ContextVar[bool] = ContextVar("scalify_numeric_wide", default=False)


@contextmanager
def widened() -> Iterator[None]:
    """Run the interpreter with every float computed in float64: the real-number reading of the program
    that the proofs use, with float32's rounding (and bf16's) taken out. Two programs that differ in
    float32 but agree here differ by rounding in another order (a reassociated sum, a fused transpose,
    amplified by a deep network on random inputs), not in meaning. Reinterpreting a float's bits has no
    such reading: those kernels refuse (`reinterprets`)."""
    token = WIDE.set(True)
    try:
        yield
    finally:
        WIDE.reset(token)


def np_dtype(element_type: str) -> np.dtype[Any]:
    """The NumPy dtype holding values of an MLIR element type (bf16/f8/i4 through ml_dtypes); float64 for
    every float (complex128 for complex) inside `widened`."""
    return _wide_dtype(element_type) if WIDE.get() else _dtype(element_type)


@functools.cache
def _dtype(element_type: str) -> np.dtype[Any]:
    try:
        return numpy_dtype(element_type)
    except ValueError as e:
        raise NumericUnsupported(None, f"element type {element_type} has no NumPy dtype here") from e


@functools.cache
def _wide_dtype(element_type: str) -> np.dtype[Any]:
    dt = _dtype(element_type)
    if dt.kind == "c":
        return np.dtype(np.complex128)
    return np.dtype(np.float64) if dt.kind == "f" or is_low_float(dt) else dt


def reinterprets(op: Op, *dtypes: np.dtype[Any]) -> None:
    """A kernel that reads a float's bits (bitcast_convert, X64Combine) cannot run widened."""
    if WIDE.get() and any(d.kind in "fc" for d in dtypes):
        raise NumericUnsupported(op, "it reinterprets a float's bits, which has no float64 reading")


def dtype_of(v: Value) -> np.dtype[Any]:
    return np_dtype(v.tensor.dtype)


def as_array(v: Val) -> np.ndarray:
    if not isinstance(v, np.ndarray):
        raise TypeError(f"expected a tensor value, got a tuple of {len(v)}")
    return v
