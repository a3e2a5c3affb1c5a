"""Element types: the one table from MLIR element type names to the NumPy dtypes that hold them.

bf16, f8 and 4-bit integers come from ml_dtypes (a jax dependency). Arithmetic on low-precision floats is
done in float32 and rounded after every op, as XLA CPU does (`widen`).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

DTYPES: dict[str, Any] = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2,
    "i64": np.int64, "i32": np.int32, "i16": np.int16, "i8": np.int8, "i4": ml_dtypes.int4,
    "ui64": np.uint64, "ui32": np.uint32, "ui16": np.uint16, "ui8": np.uint8, "ui4": ml_dtypes.uint4,
    "i1": np.bool_, "complex<f32>": np.complex64, "complex<f64>": np.complex128,
}


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The NumPy dtype that holds values of an MLIR element type; ValueError naming the known ones."""
    if dtype not in DTYPES:
        raise ValueError(f"no NumPy dtype for element type {dtype} (known: {', '.join(DTYPES)})")
    return np.dtype(DTYPES[dtype])


LOW_FLOATS = frozenset(("f16", "bf16", "f8E4M3FN", "f8E5M2"))  # element types of the low-precision floats


_LOW_NUMPY = frozenset(np.dtype(DTYPES[t]) for t in LOW_FLOATS)


def is_low_float(dt: np.dtype[Any]) -> bool:
    """bf16, f16 and f8 types: computed in float32 and rounded after every op, as XLA CPU does."""
    return dt in _LOW_NUMPY


def widen(x: np.ndarray) -> np.ndarray:
    """`x` in the dtype its arithmetic is done in (float32 for low-precision floats, int8 for int4)."""
    if is_low_float(x.dtype):
        return x.astype(np.float32)
    if x.dtype in (ml_dtypes.int4, ml_dtypes.uint4):
        return x.astype(np.int8 if x.dtype == ml_dtypes.int4 else np.uint8)
    return x
