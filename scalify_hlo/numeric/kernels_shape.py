"""Kernels of structure and control: constants, iota, broadcasts, reshapes, slices, concatenation,
padding, dot products, while/case/if/call/fusion, tuples, custom calls and device ids.

Shape ops shift their dimension numbers past the leading device axis and return views where NumPy can
(a replicated operand stays a stride-0 view). Control flow runs regions with the same machine; when
devices disagree (trip counts, branch indices), every needed path runs and each device keeps its own.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.inline import called_bodies
from scalify_hlo.ir.nodes import DotDims, Literal, Op
from scalify_hlo.numeric.kernels_index import int_attr as _ints
from scalify_hlo.numeric.kernels_index import pad_with
from scalify_hlo.numeric.kernels_index import top_k as top_k_kernel
from scalify_hlo.numeric.kernels_linalg import (
    GETRF_TARGETS,
    POTRF_TARGETS,
    TRSM_TARGETS,
    lapack_getrf,
    lapack_potrf,
    lapack_trsm,
)
from scalify_hlo.numeric.values import MAX_TRIPS, NumericUnsupported, Val, as_array, dtype_of, reinterprets
from scalify_hlo.ops.reducers import top_k_of_call

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine


def _shape(op: Op, i: int = 0) -> tuple[int, ...]:
    return op.results[i].tensor.shape


def constant(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    cached = m.cache.get(id(op))
    if cached is not None and cached[0] is op:
        value = cached[1]
    else:
        lit = op.attrs["value"]
        assert isinstance(lit, Literal)
        value = np.asarray(lit.array).astype(dtype_of(op.results[0])).reshape(_shape(op))
        m.cache[id(op)] = (op, value)
    return [np.broadcast_to(value, (m.devices, *value.shape))]


def iota(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    shape = _shape(op)
    dim = int(op.attrs["iota_dimension"])  # type: ignore[arg-type]
    line = np.arange(shape[dim]).astype(dtype_of(op.results[0]))
    line = line.reshape([shape[dim] if k == dim else 1 for k in range(len(shape))])
    return [np.broadcast_to(line, (m.devices, *shape))]


def broadcast_in_dim(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    dims = _ints(op, "broadcast_dimensions")
    order = sorted(range(len(dims)), key=lambda k: dims[k])  # dims may permute: transpose first
    x = x.transpose(0, *[k + 1 for k in order])
    shape = _shape(op)
    target = [x.shape[0]] + [1] * len(shape)
    for k, d in enumerate(sorted(dims)):
        target[d + 1] = x.shape[k + 1]
    return [np.broadcast_to(x.reshape(target), (x.shape[0], *shape))]


def broadcast(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    extra = len(_shape(op)) - (x.ndim - 1)
    return [np.broadcast_to(x.reshape(x.shape[0], *[1] * extra, *x.shape[1:]), (x.shape[0], *_shape(op)))]


def reshape(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x = as_array(args[0])
    return [x.reshape(x.shape[0], *_shape(op))]


def transpose(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [as_array(args[0]).transpose(0, *[p + 1 for p in _ints(op, "permutation")])]


def reverse(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [np.flip(as_array(args[0]), axis=tuple(d + 1 for d in _ints(op, "dimensions")))]


def slice_(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    starts, limits = _ints(op, "start_indices"), _ints(op, "limit_indices")
    strides = _ints(op, "strides") if "strides" in op.attrs else (1,) * len(starts)
    index = (slice(None), *(slice(a, b, s) for a, b, s in zip(starts, limits, strides, strict=True)))
    return [as_array(args[0])[index]]


def concatenate(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [np.concatenate([as_array(a) for a in args], axis=int(op.attrs["dimension"]) + 1)]  # type: ignore[arg-type]


def pad(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    x, value = as_array(args[0]), as_array(args[1])
    return [pad_with(x, value, _ints(op, "edge_padding_low"), _ints(op, "edge_padding_high"),
                       _ints(op, "interior_padding"))]


def _dot_dtype(a: np.dtype[Any], b: np.dtype[Any], out: np.dtype[Any]) -> np.dtype[Any]:
    if out.kind == "c" or a.kind == "c" or b.kind == "c":
        return np.dtype(np.complex128 if np.float64 in (a, b, out) or out == np.complex128 else np.complex64)
    if out.kind in "iub":
        return np.dtype(np.int64) if out == np.bool_ else out
    return np.dtype(np.float64 if np.float64 in (a, b, out) else np.float32)


def dot_general_arrays(lhs: np.ndarray, rhs: np.ndarray, dims: DotDims, out: np.dtype[Any]) -> np.ndarray:
    """`dot_general` with the device axis as an extra leading batch dim, as one batched matmul."""
    lb, rb = (0, *[d + 1 for d in dims.lhs_batch]), (0, *[d + 1 for d in dims.rhs_batch])
    lc, rc = [d + 1 for d in dims.lhs_contract], [d + 1 for d in dims.rhs_contract]
    lf = [d for d in range(lhs.ndim) if d not in lb and d not in lc]
    rf = [d for d in range(rhs.ndim) if d not in rb and d not in rc]
    cd = _dot_dtype(lhs.dtype, rhs.dtype, out)
    batch = [lhs.shape[d] for d in lb]
    lfs, rfs = [lhs.shape[d] for d in lf], [rhs.shape[d] for d in rf]
    k = math.prod(lhs.shape[d] for d in lc)
    a = lhs.transpose(*lb, *lf, *lc).astype(cd).reshape(*batch, math.prod(lfs), k)
    b = rhs.transpose(*rb, *rc, *rf).astype(cd).reshape(*batch, k, math.prod(rfs))
    return np.matmul(a, b).reshape(*batch, *lfs, *rfs).astype(out)


def dot_general(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    dims = op.attrs["dot_dimension_numbers"]
    assert isinstance(dims, DotDims)
    return [dot_general_arrays(as_array(args[0]), as_array(args[1]), dims, dtype_of(op.results[0]))]


def dot(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    lhs, rhs = as_array(args[0]), as_array(args[1])
    dims = DotDims((), (), (lhs.ndim - 2,), (0,))  # classic dot: lhs last dim · rhs first dim
    return [dot_general_arrays(lhs, rhs, dims, dtype_of(op.results[0]))]


# ---------------------------------------------------------------------------------------- control flow

def select_devices(mask: np.ndarray, a: Val, b: Val) -> Val:
    """Per device: `a` where `mask`, else `b` (tuples element by element)."""
    if isinstance(a, tuple):
        assert isinstance(b, tuple)
        return tuple(select_devices(mask, x, y) for x, y in zip(a, b, strict=True))
    x, y = as_array(a), as_array(b)
    return np.where(mask.reshape(mask.shape + (1,) * (x.ndim - 1)), x, y)


def while_(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    cond, body = op.regions
    state = list(args)
    for _ in range(MAX_TRIPS):
        go = as_array(m.region(cond, state)[0]).astype(bool)
        if not go.any():
            return state
        new = m.region(body, state)
        # Devices may leave the loop at different trips: the finished ones keep their state.
        state = new if go.all() else [select_devices(go, n, s) for n, s in zip(new, state, strict=True)]
    raise NumericUnsupported(op, f"the loop did not finish within {MAX_TRIPS} trips")


def _branches(m: Machine, op: Op, index: np.ndarray) -> list[Val]:
    n = len(op.regions)
    index = np.where((index < 0) | (index >= n), n - 1, index)  # XLA: out of range → last branch
    taken = np.unique(index)
    outs = m.region(op.regions[int(taken[0])], [])
    for b in taken[1:]:
        other = m.region(op.regions[int(b)], [])
        outs = [select_devices(index == b, o, r) for o, r in zip(other, outs, strict=True)]
    return outs


def case(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return _branches(m, op, as_array(args[0]).astype(np.int64))


def if_(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return _branches(m, op, np.where(as_array(args[0]), 0, 1))


def call(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return m.call(str(op.attrs["callee"]), args, op)


def composite(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return m.call(str(op.attrs["decomposition"]), args, op)  # its meaning is its decomposition


def region(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return m.region(op.regions[0], args)


def identity(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return list(args)


def manual(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return m.manual(op, args)


_SHAPE_NEUTRAL = frozenset({"Sharding", "MoveToHost", "MoveToDevice", "annotate_device_placement",
                            "LayoutConstraint", "xla.sdy.FuncResultSharding", "xla.sdy.Sharding"})


def custom_call(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    target = str(op.attrs.get("call_target_name", ""))
    if target == "SPMDFullToShardShape":
        return m.boundary(op, args, entering=True)  # a GSPMD shard_map's boundary
    if target == "SPMDShardToFullShape":
        return m.boundary(op, args, entering=False)
    if target in _SHAPE_NEUTRAL:
        if len(args) != len(op.results) or any(
                as_array(a).shape[1:] != r.tensor.shape for a, r in zip(args, op.results, strict=True)):
            raise NumericUnsupported(op, f"custom call {target} changes the shape (a manual region of a "
                                     "module that is not partitioned yet)")
        return list(args)
    if target in POTRF_TARGETS:
        return lapack_potrf(m, op, args)
    if target in TRSM_TARGETS:
        return lapack_trsm(m, op, args)
    if target in GETRF_TARGETS:
        return lapack_getrf(m, op, args)
    if target == "TopK":
        # (the machine runs the module as written: the comparator is still a function of the module)
        called = called_bodies(op, m.module)
        top_k = top_k_of_call(dataclasses.replace(op, regions=called) if called else op)
        if top_k is None:
            raise NumericUnsupported(op, "a TopK comparator that is not a total order of the values")
        out = top_k_kernel(m, top_k, args)
        return [tuple(out)] if len(op.results) == 1 else out
    if target == "X64Combine":
        lo, hi = (as_array(a).astype(np.uint64) for a in args)
        reinterprets(op, dtype_of(op.results[0]))
        return [((hi << np.uint64(32)) | lo).view(dtype_of(op.results[0]))]
    if target in ("X64SplitLow", "X64SplitHigh"):
        reinterprets(op, as_array(args[0]).dtype)
        u = np.ascontiguousarray(as_array(args[0])).view(np.uint64)
        part = u & np.uint64(0xFFFFFFFF) if target == "X64SplitLow" else u >> np.uint64(32)
        return [part.astype(np.uint32).view(dtype_of(op.results[0]))]
    raise NumericUnsupported(op, f"custom call target {target!r}")


def tuple_(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [tuple(args)]


def get_tuple_element(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    t = args[0]
    assert isinstance(t, tuple)
    return [t[int(op.attrs["index"])]]  # type: ignore[arg-type]


def token(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [np.zeros(m.devices, dtype=np.bool_)]


def partition_id(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [(np.arange(m.devices) % m.partitions).astype(np.uint32)]


def replica_id(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [(np.arange(m.devices) // m.partitions).astype(np.uint32)]


def get_dimension_size(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    size = as_array(args[0]).shape[int(op.attrs["dimension"]) + 1]  # type: ignore[arg-type]
    return [np.full(m.devices, size, dtype=dtype_of(op.results[0]))]
