"""NumPy kernels of the linear-algebra ops: Cholesky factors and triangular solves, both spellings.

JAX lowers `jnp.linalg.cholesky` and `jax.scipy.linalg.solve_triangular` to `stablehlo.cholesky` and
`stablehlo.triangular_solve` for accelerators, and on CPU to LAPACK custom calls (`lapack_?potrf_ffi`,
`lapack_?trsm_ffi`) whose options sit in a backend config of character codes (`uplo = 76` is 'L'). Both
spellings run the same algorithms here, on leading batch dims (after the device axis), in float64 or
complex128 and rounded to the operand dtype:

- Cholesky is the unblocked column algorithm (LAPACK's potrf and XLA's CholeskyExpander in exact
  arithmetic), reading only the requested triangle of the operand. `info` is the order of the first
  leading minor that is not positive definite (LAPACK's, also for a NaN pivot). `stablehlo.cholesky`
  gives zeros in the other triangle and, where `info` is not 0, a matrix of NaNs (XLA CPU's expander
  does both). potrf leaves the operand's own values in the other triangle and returns `info`; where it
  is not 0 LAPACK leaves a partially computed factor that this kernel does not reproduce: its triangle is
  NaN, which is what JAX's lowering selects there anyway.
- An LU factorisation (`lapack_?getrf_ffi`) is Gaussian elimination with partial pivoting, in the
  operand dtype as LAPACK computes it: the pivot of column j is the first row at or below j of largest
  magnitude (|re| + |im| for complex, LAPACK's i?amax); the results are the packed factors (unit lower L
  below the diagonal, U on and above), the 1-based row swapped with each row, and `info`, the 1-based
  index of the first exactly zero pivot (0 if none; its column, zero below it, is left unscaled and
  elimination goes on).
- A triangular solve is substitution, row by row, in the order the triangle of `op(a)` demands, with
  IEEE division (a zero pivot gives infinities and NaNs, no error), reading only `a`'s triangle (and not
  its diagonal when it is a unit diagonal).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.nodes import Op, TupleType
from scalify_hlo.numeric.values import NumericUnsupported, Val, as_array

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine

# LAPACK custom calls of JAX's CPU lowering (jaxlib/cpu/lapack_kernels.cc), by element type.
POTRF_TARGETS = frozenset(f"lapack_{t}potrf_ffi" for t in "sdcz")
TRSM_TARGETS = frozenset(f"lapack_{t}trsm_ffi" for t in "sdcz")
GETRF_TARGETS = frozenset(f"lapack_{t}getrf_ffi" for t in "sdcz")


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def _adjoint(x: np.ndarray) -> np.ndarray:
    return np.conj(np.swapaxes(x, -1, -2))


def cholesky_lower(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L, info) of the lower triangles of `a` ([..., n, n], float64/complex128): L zero above the
    diagonal, NaN from the first pivot that is not positive on; info the 1-based index of that pivot, 0 if
    none."""
    n = a.shape[-1]
    lo = np.zeros_like(a)
    info = np.zeros(a.shape[:-2], dtype=np.int32)
    with np.errstate(all="ignore"):
        for j in range(n):
            row = lo[..., j, :j]
            d = (a[..., j, j] - np.sum(row * np.conj(row), axis=-1)).real
            info = np.where((info == 0) & ~(d > 0), j + 1, info).astype(np.int32)
            pivot = np.sqrt(d)
            lo[..., j, j] = pivot
            below = a[..., j + 1:, j] - np.einsum("...ik,...k->...i", lo[..., j + 1:, :j], np.conj(row))
            lo[..., j + 1:, j] = below / pivot[..., None]
    return lo, info


def _factor(a: np.ndarray, lower: bool) -> tuple[np.ndarray, np.ndarray]:
    """The factor of the `lower` (else upper: U = L^H of the adjoint) triangle, zero elsewhere, and info."""
    if lower:
        return cholesky_lower(a)
    lo, info = cholesky_lower(_adjoint(a))
    return _adjoint(lo), info


def _bool(op: Op, name: str, default: bool) -> bool:
    return bool(op.attrs.get(name, default))


def cholesky(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """`stablehlo.cholesky`: the factor of the `lower` (default false) triangle, zeros in the other, NaN
    everywhere in a matrix that is not positive definite."""
    x = as_array(args[0])
    factor, info = _factor(_wide(x), _bool(op, "lower", False))
    return [np.where((info != 0)[..., None, None], np.nan, factor).astype(x.dtype)]


def solve_triangular(a: np.ndarray, b: np.ndarray, *, left: bool, lower: bool, unit: bool, trans: str
                     ) -> np.ndarray:
    """X with op(a) X = b (left) or X op(a) = b, op per `trans` (N, T or C), from `a`'s `lower` (else
    upper) triangle; float64/complex128 operands."""
    m = a.shape[-1]
    tri = np.tril(a) if lower else np.triu(a)
    if unit:
        tri = tri * (1 - np.eye(m)) + np.eye(m)
    t = {"N": tri, "T": np.swapaxes(tri, -1, -2), "C": _adjoint(tri)}[trans]
    t_lower = lower == (trans == "N")
    if not left:  # X op(a) = b  ⇔  op(a)^T X^T = b^T
        t, b, t_lower = np.swapaxes(t, -1, -2), np.swapaxes(b, -1, -2), not t_lower
    x = np.zeros(np.broadcast_shapes(t.shape[:-2], b.shape[:-2]) + b.shape[-2:], dtype=np.result_type(t, b))
    with np.errstate(all="ignore"):
        for i in range(m) if t_lower else reversed(range(m)):
            done = slice(0, i) if t_lower else slice(i + 1, m)
            acc = b[..., i, :] - np.einsum("...k,...kn->...n", t[..., i, done], x[..., done, :])
            x[..., i, :] = acc if unit else acc / t[..., i, i][..., None]
    return x if left else np.swapaxes(x, -1, -2)


def triangular_solve(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    a, b = as_array(args[0]), as_array(args[1])
    trans = {"NO_TRANSPOSE": "N", "TRANSPOSE": "T", "ADJOINT": "C"}.get(str(op.attrs.get("transpose_a", "")))
    if trans is None:
        raise NumericUnsupported(op, f"transpose_a {op.attrs.get('transpose_a')!r}")
    x = solve_triangular(_wide(a), _wide(b), left=_bool(op, "left_side", False), lower=_bool(op, "lower", False),
                         unit=_bool(op, "unit_diagonal", False), trans=trans)
    return [x.astype(b.dtype)]


# ----------------------------------------------------------------------------- LAPACK custom calls


def lapack_config(op: Op) -> dict[str, str]:
    """A LAPACK custom call's options as characters (`{"uplo": "L"}`): `mhlo.backend_config` in StableHLO,
    `backend_config` in HLO text, both a dictionary of character codes."""
    for name in ("mhlo.backend_config", "backend_config"):
        cfg: Any = op.attrs.get(name)
        if isinstance(cfg, tuple) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in cfg):
            return {str(k): chr(int(v)) for k, v in cfg}
    raise NumericUnsupported(op, "a LAPACK custom call without its backend config")


def _option(op: Op, cfg: dict[str, str], key: str, allowed: str) -> str:
    v = cfg.get(key, "")
    if len(v) != 1 or v not in allowed:
        raise NumericUnsupported(op, f"LAPACK option {key}={v!r}")
    return v


def _results(op: Op, values: list[np.ndarray]) -> list[Val]:
    """One value per result; a single tuple-typed result (HLO's custom call) holds them all."""
    if len(op.results) == 1 and isinstance(op.results[0].type, TupleType):
        return [tuple(values)]
    return list[Val](values)


def lapack_potrf(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """(factor, info): the operand with its `uplo` triangle replaced by the factor (NaN where info != 0),
    and LAPACK's info per matrix."""
    x = as_array(args[0])
    lower = _option(op, lapack_config(op), "uplo", "LU") == "L"
    factor, info = _factor(_wide(x), lower)
    factor = np.where((info != 0)[..., None, None], np.nan, factor)
    n = x.shape[-1]
    mask = np.tril(np.ones((n, n), dtype=bool)) if lower else np.triu(np.ones((n, n), dtype=bool))
    out = np.where(mask, factor.astype(x.dtype), x)
    return _results(op, [out, info])


def lu_factor(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed LU, 1-based pivots, info) of `a` ([..., m, n]) by LAPACK getrf's algorithm, in a's dtype."""
    lu = a.copy()
    m, n = a.shape[-2:]
    k = min(m, n)
    pivots = np.zeros((*a.shape[:-2], k), dtype=np.int32)
    info = np.zeros(a.shape[:-2], dtype=np.int32)
    with np.errstate(all="ignore"):
        for j in range(k):
            col = lu[..., j:, j]
            size = np.abs(col.real) + np.abs(col.imag) if lu.dtype.kind == "c" else np.abs(col)
            p = j + np.argmax(size, axis=-1)  # the first of the largest, as i?amax
            pivots[..., j] = p + 1
            rows = np.take_along_axis(lu, p[..., None, None], axis=-2)
            here = lu[..., j:j + 1, :].copy()
            np.put_along_axis(lu, p[..., None, None], here, axis=-2)
            lu[..., j:j + 1, :] = rows
            pivot = lu[..., j, j]
            info = np.where((info == 0) & (pivot == 0), j + 1, info).astype(np.int32)
            # a zero pivot leaves its column as it is (all zeros below it), as LAPACK's getf2 does
            below = lu[..., j + 1:, j]
            lu[..., j + 1:, j] = np.where(pivot[..., None] == 0, below, below / pivot[..., None])
            lu[..., j + 1:, j + 1:] -= lu[..., j + 1:, j:j + 1] * lu[..., j:j + 1, j + 1:]
    return lu, pivots, info


def lapack_getrf(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """(packed factors, pivots, info) of LAPACK's LU factorisation with partial pivoting."""
    lu, pivots, info = lu_factor(as_array(args[0]))
    return _results(op, [lu, pivots, info])


def lapack_trsm(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    a, b = as_array(args[0]), as_array(args[1])
    cfg = lapack_config(op)
    x = solve_triangular(_wide(a), _wide(b), left=_option(op, cfg, "side", "LR") == "L",
                         lower=_option(op, cfg, "uplo", "LU") == "L", unit=_option(op, cfg, "diag", "NU") == "U",
                         trans=_option(op, cfg, "trans_x", "NTC"))
    return _results(op, [x.astype(b.dtype)])
