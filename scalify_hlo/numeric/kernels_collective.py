"""Collective kernels: data exchanged along the device axis with one fancy index per op (`x[groups]`).

Which devices form a group follows XLA's collective group modes: `layout.groups.device_groups`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from scalify_hlo.ir.dtypes import widen
from scalify_hlo.ir.nodes import Literal, Op
from scalify_hlo.layout.groups import device_groups as groups_of
from scalify_hlo.layout.groups import has_channel
from scalify_hlo.numeric.kernels_index import UFUNCS, binop_of
from scalify_hlo.numeric.values import NumericUnsupported, Val, as_array, dtype_of

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine

def _listed(op: Op, name: str) -> np.ndarray | None:
    v = op.attrs.get(name)
    if isinstance(v, Literal) and v.array.size:
        return np.asarray(v.array, dtype=np.int64).reshape(v.array.shape[0], -1)
    return None


def device_groups(m: Machine, op: Op) -> np.ndarray:
    """`[G, S]` device indices: the groups of `op`, each in the order its members' data is combined."""
    out = groups_of(op, m.devices, m.replicas)
    if out.size and (out.min() < 0 or out.max() >= m.devices):
        raise NumericUnsupported(op, f"replica groups name devices outside 0..{m.devices - 1}")
    return out


def _reduce_groups(m: Machine, op: Op, xs: np.ndarray) -> np.ndarray:
    """Combine `[G, S, ...]` along S with the op's reducer body, in group order."""
    region = op.regions[0]
    name = binop_of(region)
    if name is not None:
        return np.asarray(UFUNCS[name].reduce(widen(xs), axis=1))
    acc = xs[:, 0]
    for k in range(1, xs.shape[1]):
        acc = m.scalar_region(region, [acc, xs[:, k]])[0]
    return acc


def all_reduce(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    groups = device_groups(m, op)
    outs: list[Val] = []
    for a, res in zip(args, op.results, strict=True):
        x = as_array(a)
        out = np.array(x, dtype=dtype_of(res), copy=True)  # a device in no group keeps its value
        out[groups] = _reduce_groups(m, op, x[groups])[:, None].astype(out.dtype)
        outs.append(out)
    return outs


def all_gather(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    groups = device_groups(m, op)
    dim = int(op.attrs["all_gather_dim"])  # type: ignore[arg-type]
    outs: list[Val] = []
    for a, res in zip(args, op.results, strict=True):
        x = as_array(a)
        g = groups.shape[0]
        gathered = np.moveaxis(x[groups], 1, 1 + dim)  # [G, ..., S, local_dim, ...]
        gathered = gathered.reshape(g, *res.tensor.shape)
        out = np.zeros((m.devices, *res.tensor.shape), dtype=dtype_of(res))
        out[groups] = gathered[:, None]
        outs.append(out)
    return outs


def reduce_scatter(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    groups = device_groups(m, op)
    dim = int(op.attrs["scatter_dimension"])  # type: ignore[arg-type]
    x = as_array(args[0])
    res = op.results[0]
    total = _reduce_groups(m, op, x[groups])  # [G, *full]
    g, s = groups.shape
    chunk = res.tensor.shape[dim]
    parts = total.reshape(g, *total.shape[1:1 + dim], s, chunk, *total.shape[2 + dim:])
    parts = np.moveaxis(parts, 1 + dim, 1)  # [G, S, *local]
    out = np.zeros((m.devices, *res.tensor.shape), dtype=dtype_of(res))
    out[groups] = parts.astype(out.dtype)
    return [out]


def all_to_all(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    groups = device_groups(m, op)
    split, concat = int(op.attrs["split_dimension"]), int(op.attrs["concat_dimension"])  # type: ignore[arg-type]
    g, s = groups.shape
    outs: list[Val] = []
    for a, res in zip(args, op.results, strict=True):
        x = as_array(a)
        local = x.shape[1:]
        xs = x[groups].reshape(g, s, *local[:split], s, local[split] // s, *local[split + 1:])
        xs = np.moveaxis(xs, 2 + split, 1)  # [G, dest, src, *chunk]
        chunk = xs.shape[3:]
        xs = np.moveaxis(xs, 2, 2 + concat)  # src next to the concat dim, major
        xs = xs.reshape(g, s, *chunk[:concat], s * chunk[concat], *chunk[concat + 1:])
        out = np.zeros((m.devices, *res.tensor.shape), dtype=dtype_of(res))
        out[groups] = xs
        outs.append(out)
    return outs


def collective_permute(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    pairs = _listed(op, "source_target_pairs")
    x = as_array(args[0])
    out = np.zeros(x.shape, dtype=dtype_of(op.results[0]))
    if pairs is None:
        return [out]
    reps, parts = m.replicas, m.partitions
    if has_channel(op):  # partition ids, in every replica
        src = (np.arange(reps)[:, None] * parts + pairs[None, :, 0]).reshape(-1)
        dst = (np.arange(reps)[:, None] * parts + pairs[None, :, 1]).reshape(-1)
    else:  # replica ids, in every partition; pairs naming absent replicas are dropped
        pairs = pairs[(pairs < reps).all(axis=1)]
        src = (pairs[None, :, 0] * parts + np.arange(parts)[:, None]).reshape(-1)
        dst = (pairs[None, :, 1] * parts + np.arange(parts)[:, None]).reshape(-1)
    if src.size and max(src.max(), dst.max()) >= m.devices:
        raise NumericUnsupported(op, f"source/target pairs name devices outside 0..{m.devices - 1}")
    out[dst] = x[src]
    return [out]


def collective_broadcast(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    groups = device_groups(m, op)
    x = as_array(args[0])
    out = np.array(x, dtype=dtype_of(op.results[0]), copy=True)
    out[groups] = x[groups[:, 0]][:, None]
    return [out]


def async_start(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    """`async_start` runs its wrapped computation (a region, or a called function) at once; the bundle
    carries operands and results until `async_done` unpacks them."""
    if op.regions:
        results = m.region(op.regions[0], args)
    else:
        results = m.call(str(op.attrs["called_computation"]), args, op)
    return [(tuple(args), tuple(results))]


def async_done(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    bundle = args[0]
    assert isinstance(bundle, tuple) and len(bundle) == 2
    results = bundle[1]
    assert isinstance(results, tuple)
    return list(results) if len(op.results) == len(results) else [results]
