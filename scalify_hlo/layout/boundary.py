"""The boundary of a shard_map under GSPMD (`jax_use_shardy_partitioner=False`).

With Shardy off, JAX lowers a shard_map to no region at all: each operand goes through a `Sharding`
custom call (its `mhlo.sharding` says how the global value is split) and then `SPMDFullToShardShape`
(result sharding `{manual}`: from here on every device holds its shard), the body is a plain call, and
each result goes through `Sharding {manual}` and `SPMDShardToFullShape`, whose `mhlo.sharding` says how
the shards make the global result. This module reads those annotations into layouts; the transfer rules
are `rules/boundary.py`, the numeric kernels `numeric.kernels_shape.custom_call`.
"""

from __future__ import annotations

import functools

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Module, Op, Value, walk
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.layout.sharding import Manual, Tiled, layout_of, parse_gspmd

FULL_TO_SHARD = "SPMDFullToShardShape"
SHARD_TO_FULL = "SPMDShardToFullShape"


def target_of(op: Op) -> str:
    return str(op.attrs.get("call_target_name", "")) if op.opcode == "custom_call" else ""


def annotation(op: Op) -> str | None:
    """The `mhlo.sharding` a `Sharding` custom call puts on its result (None for any other op)."""
    if target_of(op) == "Sharding" and "mhlo.sharding" in op.attrs and len(op.results) == 1:
        return str(op.attrs["mhlo.sharding"])
    return None


@functools.lru_cache(maxsize=8)
def annotated_values(module: Module) -> dict[Value, str]:
    """Every value of the module made by a `Sharding` custom call, with its annotation (for the numeric
    kernels, which see an op and its operands' values only)."""
    out: dict[Value, str] = {}
    for func in module.funcs.values():
        for op in walk(func.body.ops):
            if (text := annotation(op)) is not None:
                out[op.results[0]] = text
    return out


def is_gspmd_manual(module: Module) -> bool:
    """Whether the module holds a shard_map in GSPMD form (a `SPMDFullToShardShape` custom call)."""
    return any(target_of(op) == FULL_TO_SHARD for f in module.funcs.values() for op in walk(f.body.ops))


def _layout(text: str, mesh: Mesh, rank: int, what: str) -> Layout:
    s = parse_gspmd(text)
    if isinstance(s, Tiled) and "manual" in s.subgroups:
        raise ShardingError(None, f"{what} {text} is manual over only some axes: not modelled")
    layout = layout_of(s, mesh, rank)
    if layout.partial:
        raise ShardingError(None, f"{what} {text} is unreduced: not modelled")
    return layout


def entering(op: Op, operand_sharding: str | None, mesh: Mesh) -> Layout:
    """The layout of the shards a `SPMDFullToShardShape` hands the body, read from its operand's
    annotation; ShardingError when it is missing or not modelled (a shard_map manual over some axes)."""
    if operand_sharding is None:
        raise ShardingError(None, f"{FULL_TO_SHARD} of a value without a Sharding annotation")
    result = parse_gspmd(str(op.attrs.get("mhlo.sharding", "")))
    if not isinstance(result, Manual):
        raise ShardingError(None, f"{FULL_TO_SHARD} to {op.attrs.get('mhlo.sharding')}: a shard_map manual over "
                            "only some axes is not modelled")
    return _layout(operand_sharding, mesh, op.operands[0].tensor.rank, "operand sharding")


def leaving(op: Op, mesh: Mesh) -> Layout:
    """The layout under which a `SPMDShardToFullShape`'s shards make its global result."""
    if "mhlo.sharding" not in op.attrs:
        raise ShardingError(None, f"{SHARD_TO_FULL} without a result sharding")
    return _layout(str(op.attrs["mhlo.sharding"]), mesh, op.results[0].tensor.rank, "result sharding")
