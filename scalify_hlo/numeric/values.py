"""What the numeric interpreter computes with: per-device value stacks, their dtypes, and its error.

Every value carries a leading device axis (`[D, *shape]`, see `machine.py`); a tuple or async bundle is a
tuple of values.
"""

from __future__ import annotations

import functools
from typing import Any, TypeAlias

import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
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


@functools.cache
def np_dtype(element_type: str) -> np.dtype[Any]:
    """The NumPy dtype holding values of an MLIR element type (bf16/f8/i4 through ml_dtypes)."""
    try:
        return numpy_dtype(element_type)
    except ValueError as e:
        raise NumericUnsupported(None, f"element type {element_type} has no NumPy dtype here") from e


def dtype_of(v: Value) -> np.dtype[Any]:
    return np_dtype(v.tensor.dtype)


def as_array(v: Val) -> np.ndarray:
    if not isinstance(v, np.ndarray):
        raise TypeError(f"expected a tensor value, got a tuple of {len(v)}")
    return v
