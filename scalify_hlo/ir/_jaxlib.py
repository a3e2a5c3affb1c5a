"""The one adapter between scalify-hlo and jax/jaxlib, so that a JAX upgrade touches one file.

Public spellings first (`jax.extend.mlir`); private ones (`jaxlib._hlo`, `jaxlib.mlir.dialects.mhlo`,
`jax._src.interpreters.mlir.make_ir_context`) only for what has no public name. Every entry point is an
ordered list of spellings, each tried until one loads: first the one of the versions pyproject.toml allows
(jax/jaxlib 0.10.2 to 0.12.x, tested at both ends by `make test` and `make test-newest`), then where the
same object is re-exported or lived in older jaxlibs, and for the context maker our own construction, so
a move in a future jaxlib degrades to the next spelling instead of an ImportError deep in a parser. When
none works the caller gets a `JaxlibAdapterError` (a `ScalifyError`: one diagnostic, exit 3) naming the
entry point, every spelling tried and the installed versions. Imports are lazy: `scalify-hlo --help`
must not pay for importing jax.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from scalify_hlo.ir.errors import ScalifyError

# What pyproject.toml promises; named in the error when an entry point is missing.
SUPPORTED = "jax/jaxlib >=0.10.2,<0.13"


class JaxlibAdapterError(ScalifyError):
    """The installed jax/jaxlib has none of the spellings we know for an entry point we need."""

    def __init__(self, entry: str, tried: Sequence[str]) -> None:
        super().__init__(
            None,
            f"this jax/jaxlib ({_versions()}) has no {entry}; tried: {'; '.join(tried)}. "
            f"scalify-hlo supports {SUPPORTED}: install a version in that range "
            f"(pip install 'jax[cpu]>=0.10.2,<0.13'), or report the new spelling")
        self.entry = entry
        self.tried = tuple(tried)


def _versions() -> str:
    from importlib import metadata

    found = []
    for dist in ("jax", "jaxlib"):
        try:
            found.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} not installed")
    return ", ".join(found)


def _attr(module: str, path: str) -> Callable[[], Any]:
    """A loader for `module.path` (path may be dotted: attributes of attributes)."""

    def load() -> Any:
        obj: Any = importlib.import_module(module)
        for name in path.split(".") if path else ():
            obj = getattr(obj, name)
        return obj

    load.__qualname__ = f"{module}.{path}" if path else module
    return load


def _first(entry: str, loaders: Sequence[Callable[[], Any]]) -> Any:
    """The first spelling of `entry` that loads; a `JaxlibAdapterError` listing them all when none does."""
    _quiet_xla()
    tried = []
    for load in loaders:
        try:
            return load()
        except (ImportError, AttributeError) as err:  # moved or renamed: try the next spelling
            tried.append(f"{load.__qualname__} ({type(err).__name__}: {err})")
    raise JaxlibAdapterError(entry, tried)


def _quiet_xla() -> None:
    # XLA logs to stderr through absl before anything is configured; a CLI must not print that noise.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@functools.cache
def ir() -> ModuleType:
    """The MLIR Python bindings (`ir.Module`, attributes, types)."""
    return _first("MLIR bindings (ir)", [
        _attr("jax.extend.mlir.ir", ""),  # public
        _attr("jaxlib.mlir.ir", ""),  # where jax.extend re-exports it from
    ])


# What XLA's C++ entry points raise on bad input: jax's JaxRuntimeError (XlaRuntimeError before it) is a
# RuntimeError; argument conversion raises ValueError; absurd sizes MemoryError.
XLA_ERRORS: tuple[type[Exception], ...] = (RuntimeError, ValueError, MemoryError)


def mlir_errors() -> tuple[type[Exception], ...]:
    """What jaxlib's MLIR bindings raise on bad input: MLIRError (its text carries the diagnostic) and
    ValueError from argument conversion."""
    return (ir().MLIRError, ValueError)


@functools.cache
def dialects() -> dict[str, ModuleType]:
    """The MLIR dialect bindings we read: stablehlo, sdy, func, chlo (public) and mhlo (private)."""
    out = {name: _first(f"MLIR dialect bindings ({name})", [
        _attr(f"jax.extend.mlir.dialects.{name}", ""),  # public
        _attr(f"jaxlib.mlir.dialects.{name}", ""),
    ]) for name in ("stablehlo", "sdy", "func", "chlo")}
    # mhlo has no public spelling: XLA's HLO→StableHLO converter still leaves some ops and attributes
    # (fusion kinds, dot dimensions of mhlo ops) in mhlo form.
    out["mhlo"] = _first("MLIR dialect bindings (mhlo)", [
        _attr("jaxlib.mlir.dialects.mhlo", ""),  # jaxlib 0.10.2 - 0.12.0.1
        _attr("jax._src.lib.mlir.dialects", "mhlo"),  # jax's own re-export
    ])
    return out


def make_context() -> Any:
    """An MLIR context with every dialect JAX emits registered (stablehlo, sdy, mhlo, chlo, func).

    jax 0.12 hands out a per-thread context reused up to 10 times, 0.10.2 a fresh one; both suit us:
    we only parse into it and never register anything of our own."""
    return _context_maker()()


@functools.cache
def _context_maker() -> Callable[[], Any]:
    return _first("an MLIR context maker (make_ir_context)", [
        _attr("jax._src.interpreters.mlir", "make_ir_context"),  # jax 0.10.2 - 0.12.0.1
        _attr("scalify_hlo.ir._jaxlib", "_own_context"),
    ])


def _own_context() -> Any:
    """What `make_ir_context` builds, from the dialect modules: the fallback when jax moves it."""
    ir_, d = ir(), dialects()
    register_upstream = _first("the upstream MLIR dialect registry (func, ...)", [
        _attr("jaxlib.mlir._mlir_libs._jax_mlir_ext", "register_dialects"),  # jaxlib 0.10.2 - 0.12.0.1
    ])
    registry = ir_.DialectRegistry()
    register_upstream(registry)
    context = ir_.Context()
    context.append_dialect_registry(registry)
    context.load_all_available_dialects()
    d["sdy"].register_dialect(context)
    d["mhlo"].register_mhlo_dialect(context)
    d["chlo"].register_dialect(context)
    d["stablehlo"].register_dialect(context)
    return context


@functools.cache
def _hlo_module_from_text() -> Callable[[str], Any]:
    return _first("HLO text parser (hlo_module_from_text)", [
        _attr("jaxlib._hlo", "hlo_module_from_text"),  # jaxlib 0.10.2 - 0.12.0.1
        _attr("jaxlib.xla_client", "hlo.hlo_module_from_text"),  # xla_client's alias of the same module
        _attr("jaxlib.xla_extension", "hlo_module_from_text"),  # older jaxlib, before _hlo was split off
    ])


def hlo_module_from_text(text: str) -> Any:
    """XLA's own HLO text parser. Raises whatever XLA raises on malformed text (caught by the caller)."""
    return _hlo_module_from_text()(text)


@functools.cache
def _hlo_to_stablehlo() -> Callable[[bytes], Any]:
    return _first("HLO to StableHLO converter (hlo_to_stablehlo)", [
        _attr("jax.extend.mlir", "hlo_to_stablehlo"),  # public
        _attr("jaxlib._jax", "mlir.hlo_to_stablehlo"),  # where jax.extend takes it from
        _attr("jaxlib.xla_extension", "mlir.hlo_to_stablehlo"),  # older jaxlib
    ])


def hlo_proto_to_stablehlo(proto: bytes) -> bytes:
    """XLA's HLO→StableHLO converter; keeps op metadata as MLIR locations. Returns MLIR bytecode."""
    return bytes(_hlo_to_stablehlo()(proto))


@functools.cache
def _stablehlo_to_hlo() -> Callable[..., Any]:
    return _first("StableHLO to HLO converter (mlir_module_to_xla_computation)", [
        _attr("jaxlib._jax", "mlir.mlir_module_to_xla_computation"),  # jaxlib 0.10.2 - 0.12.0.1
        _attr("jaxlib.xla_extension", "mlir.mlir_module_to_xla_computation"),  # older jaxlib
    ])


def stablehlo_to_hlo_proto(text: str) -> bytes:
    """XLA's StableHLO→HLO converter (what compiling a JAX program starts with: chlo ops without an HLO
    opcode become their expansions). Returns the serialized HLO module."""
    computation = _stablehlo_to_hlo()(text, use_tuple_args=False, return_tuple=False)
    return bytes(computation.as_serialized_hlo_module_proto())


@functools.cache
def hlo_sharding_class() -> Any:
    """XLA's `HloSharding`, whose `from_string` parses every GSPMD sharding spelling."""
    return _first("HloSharding", [
        _attr("jaxlib._hlo", "HloSharding"),  # jaxlib 0.10.2 - 0.12.0.1
        _attr("jaxlib.xla_client", "HloSharding"),
        _attr("jaxlib.xla_extension", "HloSharding"),  # older jaxlib
    ])


def jax_version() -> str:
    import jax

    return str(jax.__version__)
