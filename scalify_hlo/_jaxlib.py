"""The one adapter between scalify-hlo and jax/jaxlib, so that a JAX upgrade touches one file.

Public spellings first (`jax.extend.mlir`); private ones (`jaxlib._hlo`, `jaxlib.mlir.dialects.mhlo`,
`jax._src.interpreters.mlir.make_ir_context`) only for what has no public name. Imports are lazy:
`scalify-hlo --help` must not pay for importing jax.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType
from typing import Any


def _quiet_xla() -> None:
    # XLA logs to stderr through absl before anything is configured; a CLI must not print that noise.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@functools.cache
def ir() -> ModuleType:
    _quiet_xla()
    from jax.extend.mlir import ir as _ir

    return _ir


@functools.cache
def dialects() -> dict[str, ModuleType]:
    """The MLIR dialect bindings we read: stablehlo, sdy, func, chlo (public) and mhlo (private)."""
    _quiet_xla()
    from jax.extend.mlir.dialects import chlo, func, sdy, stablehlo
    from jaxlib.mlir.dialects import mhlo

    return {"stablehlo": stablehlo, "sdy": sdy, "func": func, "chlo": chlo, "mhlo": mhlo}


def make_context() -> Any:
    """An MLIR context with every dialect JAX emits registered (stablehlo, sdy, mhlo, chlo, func)."""
    _quiet_xla()
    from jax._src.interpreters import mlir as jax_mlir

    return jax_mlir.make_ir_context()


def hlo_module_from_text(text: str) -> Any:
    """XLA's own HLO text parser. Raises whatever XLA raises on malformed text (caught by the caller)."""
    _quiet_xla()
    from jaxlib import _hlo  # type: ignore[attr-defined]

    return _hlo.hlo_module_from_text(text)


def hlo_proto_to_stablehlo(proto: bytes) -> bytes:
    """XLA's HLO→StableHLO converter; keeps op metadata as MLIR locations. Returns MLIR bytecode."""
    _quiet_xla()
    from jax.extend.mlir import hlo_to_stablehlo

    return bytes(hlo_to_stablehlo(proto))


def hlo_sharding_class() -> Any:
    """XLA's `HloSharding`, whose `from_string` parses every GSPMD sharding spelling."""
    _quiet_xla()
    from jaxlib import _hlo  # type: ignore[attr-defined]

    return _hlo.HloSharding


def jax_version() -> str:
    import jax

    return str(jax.__version__)
