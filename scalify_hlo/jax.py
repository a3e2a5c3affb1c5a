"""Verify JAX functions directly: `check` for GSPMD/Shardy-partitioned jits, `check_shard_map` for
hand-parallel code.

`check` lowers `jax.jit(fn, in_shardings, out_shardings)`, compiles it on the devices the shardings
name (fake CPU devices when `XLA_FLAGS=--xla_force_host_platform_device_count=N` was set before jax was
imported), captures the module right after XLA's SPMD partitioner (a per-compile dump into a temporary
directory: no global flags touched) and proves it equivalent to the unpartitioned program.
`check_shard_map` proves `jax.shard_map(impl, ...)` equivalent to a single-device `reference`.
Arguments may be arrays or `jax.ShapeDtypeStruct`s (nothing is computed, only lowered and compiled).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from scalify_hlo.api import verify
from scalify_hlo.ir.errors import UnsupportedError
from scalify_hlo.report.verdicts import Report


def _structs(args: tuple[Any, ...]) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)


def _after_partitioning(dump: Path, module_name: str) -> str:
    files = sorted(dump.glob(f"*{module_name}*after_spmd-partitioning*.txt")) or sorted(
        dump.glob("*after_spmd-partitioning*.txt"))
    if not files:
        raise UnsupportedError(None, f"XLA wrote no module after SPMD partitioning for {module_name} (is the "
                               "function sharded over more than one device?)")
    return files[-1].read_text()


def partitioned(fn: Callable[..., Any], *args: Any, in_shardings: Any = None, out_shardings: Any = None,
                **jit_kwargs: Any) -> tuple[str, str]:
    """(reference StableHLO with locations, per-device HLO right after the SPMD partitioner)."""
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, **jit_kwargs)
    lowered = jitted.lower(*_structs(args))
    before = lowered.as_text(debug_info=True)
    name = lowered.as_text().split("module @", 1)[-1].split(" ", 1)[0]
    with tempfile.TemporaryDirectory(prefix="scalify-hlo-") as d:
        # Every dump option is set here, so a user's own XLA_FLAGS (a module filter, say) cannot hide it.
        lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning",
                                          "xla_dump_hlo_module_re": ".*"})
        after = _after_partitioning(Path(d), name)
    return before, after


def check(fn: Callable[..., Any], *args: Any, in_shardings: Any = None, out_shardings: Any = None,
          jit_kwargs: dict[str, Any] | None = None, **options: Any) -> Report:
    """Prove XLA's partitioning of `jax.jit(fn, in_shardings, out_shardings)` equivalent to `fn`."""
    before, after = partitioned(fn, *args, in_shardings=in_shardings, out_shardings=out_shardings,
                                **(jit_kwargs or {}))
    return verify(before, after, **options)


def check_shard_map(reference: Callable[..., Any], impl: Callable[..., Any], *args: Any, mesh: Mesh,
                    in_specs: Any, out_specs: Any, check_vma: bool = False, **options: Any) -> Report:
    """Prove `jax.shard_map(impl, mesh=mesh, in_specs=..., out_specs=...)` equivalent to `reference`."""
    plain = _structs(args)
    before = jax.jit(reference).lower(*plain).as_text(debug_info=True)
    sharded = jax.tree.map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, spec)),
        plain, tuple(in_specs), is_leaf=lambda x: isinstance(x, PartitionSpec))
    mapped = jax.shard_map(impl, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma)
    after = jax.jit(mapped).lower(*sharded).as_text(debug_info=True)
    return verify(before, after, **options)
