"""scalify-hlo: prove a distributed JAX/XLA program equivalent to its single-device reference.

    import scalify_hlo
    report = scalify_hlo.verify("before.mlir", "after.hlo")   # or text, jax Lowered/Compiled objects
    scalify_hlo.assert_equivalent(report)                    # pytest-friendly
    from scalify_hlo.jax import check, check_shard_map       # straight from JAX functions

Imports are lazy so that the command line starts without loading jax or egglog.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scalify_hlo.api import assert_equivalent, verify
    from scalify_hlo.ir.errors import ScalifyError
    from scalify_hlo.report.verdicts import Discrepancy, Equivalent, Report, Unknown

__all__ = ["Discrepancy", "Equivalent", "Report", "ScalifyError", "Unknown", "assert_equivalent", "verify"]

_WHERE = {"verify": "api", "assert_equivalent": "api", "Report": "report", "Equivalent": "report",
          "Discrepancy": "report", "Unknown": "report", "ScalifyError": "errors"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'scalify_hlo' has no attribute {name!r}")
