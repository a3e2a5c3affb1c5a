"""A numeric trial: random inputs for a program (integer inputs kept inside the ranges its indices need)
and the comparison of two programs' outputs (floats within a tolerance, integers exactly)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from scalify_hlo.ir.nodes import Module, Op, Region, TensorType, Value
from scalify_hlo.numeric.values import np_dtype

# ------------------------------------------------------------------------------------------- inputs

_PASS_THROUGH = frozenset({
    "convert", "reshape", "broadcast_in_dim", "broadcast", "slice", "concatenate", "transpose", "select",
    "clamp", "add", "subtract", "copy", "get_tuple_element", "tuple", "optimization_barrier",
    "sharding_constraint", "reshard", "custom_call", "dynamic_slice", "gather", "remainder",
})


def _index_sinks(op: Op) -> list[tuple[int, int]]:
    """(operand position, exclusive bound) for each operand of `op` that indexes another operand."""
    t = [v.tensor.shape if isinstance(v.type, TensorType) else () for v in op.operands]
    a = op.attrs
    if op.opcode == "gather":
        dims = a["dimension_numbers"]
        return [(1, max(1, min((t[0][d] for d in dims.start_index_map), default=1)))]  # type: ignore[union-attr]
    if op.opcode == "scatter":
        n = (len(op.operands) - 1) // 2
        dims = a["scatter_dimension_numbers"]
        return [(n, max(1, min((t[0][d] for d in dims.scattered_dims_to_operand_dims), default=1)))]  # type: ignore[union-attr]
    if op.opcode in ("dynamic_slice", "dynamic_update_slice"):
        first = 1 if op.opcode == "dynamic_slice" else 2
        sizes = a["slice_sizes"] if first == 1 else t[1]
        return [(first + k, max(1, t[0][k] - int(sizes[k]) + 1)) for k in range(len(t[0]))]  # type: ignore[index]
    return []


def _index_bounds(module: Module) -> dict[int, int]:
    """Per integer parameter of @main that (through copies, converts, reshapes, arithmetic, calls and
    regions) reaches an index operand of gather/scatter/dynamic_slice/dynamic_update_slice: the smallest
    size of a dimension it indexes."""
    main = module.main
    origin: dict[Value, frozenset[int]] = {p: frozenset({i}) for i, p in enumerate(main.params)
                                           if isinstance(p.type, TensorType) and "i" in p.type.dtype}
    bounds: dict[int, int] = {}

    def into(region: Region, sources: Sequence[frozenset[int]]) -> None:
        for arg, s in zip(region.args, sources, strict=False):
            if s:
                origin[arg] = origin.get(arg, frozenset()) | s
        visit(region.ops, depth=1)

    def visit(ops: Sequence[Op], depth: int = 0) -> None:
        for op in ops:
            srcs = [origin.get(v, frozenset()) for v in op.operands]
            for pos, bound in _index_sinks(op):
                for i in srcs[pos]:
                    bounds[i] = min(bounds.get(i, bound), bound)
            if not any(srcs) or depth > 50:
                continue
            union = frozenset().union(*srcs)
            if op.opcode in _PASS_THROUGH:
                for r in op.results:
                    origin[r] = union
            elif op.opcode == "call" and str(op.attrs.get("callee")) in module.funcs:
                callee = module.funcs[str(op.attrs["callee"])]
                into(callee.body, srcs)
                for r, v in zip(op.results, callee.body.results, strict=False):
                    origin[r] = origin.get(v, frozenset())
            elif op.opcode in ("while", "manual_computation", "fusion", "case", "if"):
                for region in op.regions:
                    into(region, srcs[1:] if op.opcode in ("case", "if") else srcs)
                for r, v in zip(op.results, op.regions[-1].results if op.regions else (), strict=False):
                    origin[r] = origin.get(v, frozenset())

    visit(main.body.ops)
    return bounds


def random_inputs(module: Module, seed: int = 0, assumed: Mapping[int, tuple[int, int]] | None = None
                  ) -> list[np.ndarray]:
    """Global inputs for @main: standard-normal floats; booleans fair coins; integers that index something
    (see `_index_bounds`) uniform in [0, size of the smallest dimension they index); other integers
    uniform in [0, 8) (small and non-negative: safe as counts, shifts, labels and exponents). Integer
    input i is drawn instead from `assumed[i]`, a promised half-open range (`--assume`), when given."""
    rng = np.random.default_rng(seed)
    bounds = _index_bounds(module)
    out: list[np.ndarray] = []
    for i, p in enumerate(module.main.params):
        t = p.tensor
        dt = np_dtype(t.dtype)
        if dt == np.bool_:
            out.append(rng.random(t.shape) < 0.5)
        elif dt.kind in "iu" or dt in (ml_dtypes.int4, ml_dtypes.uint4):
            out.append(rng.integers(0, bounds.get(i, 8), size=t.shape).astype(dt))
        elif dt.kind == "c":
            out.append((rng.standard_normal(t.shape) + 1j * rng.standard_normal(t.shape)).astype(dt))
        else:
            out.append(rng.standard_normal(t.shape).astype(dt))
    promised = np.random.default_rng(seed + 1)
    for i, (lo, hi) in (assumed or {}).items():
        out[i] = promised.integers(lo, hi, size=out[i].shape).astype(out[i].dtype)
    return out


# ------------------------------------------------------------------------------------------ compare

@dataclass(frozen=True, slots=True)
class DifferingElement:
    output: int
    index: tuple[int, ...]
    before: Any
    after: Any


@dataclass(frozen=True, slots=True)
class Comparison:
    """Per output: the largest absolute error and the largest error relative to max(|before|, atol)
    (atol 0: the smallest normal float64)."""

    ok: bool
    max_abs: tuple[float, ...]
    max_rel: tuple[float, ...]
    counterexample: DifferingElement | None = None
    reason: str = ""


def compare(before_outs: Sequence[np.ndarray], after_outs: Sequence[np.ndarray], rtol: float = 1e-4,
            atol: float = 1e-5) -> Comparison:
    """Elementwise `|after - before| <= atol + rtol * |before|` for floats, equality for integers and
    booleans (an index off by one is a bug, not rounding); NaN matches NaN, inf matches itself."""
    if len(before_outs) != len(after_outs):
        return Comparison(False, (), (), None, f"{len(before_outs)} outputs before, {len(after_outs)} after")
    max_abs: list[float] = []
    max_rel: list[float] = []
    first: DifferingElement | None = None
    reason = ""
    for k, (b, a) in enumerate(zip(before_outs, after_outs, strict=True)):
        bb, aa = np.asarray(b), np.asarray(a)
        if bb.shape != aa.shape:
            max_abs.append(math.inf)
            max_rel.append(math.inf)
            if first is None:
                first = DifferingElement(k, (), None, None)
                reason = f"output {k}: shape {list(bb.shape)} before, {list(aa.shape)} after"
            continue
        wide = np.complex128 if np.iscomplexobj(bb) or np.iscomplexobj(aa) else np.float64
        bf, af = bb.astype(wide), aa.astype(wide)
        exact = bb.dtype.kind in "iub" and aa.dtype.kind in "iub"
        with np.errstate(all="ignore"):  # inf - inf and 0/0 are expected here
            same = (bf == af) | (np.isnan(bf) & np.isnan(af))
            diff = np.where(same, 0.0, np.abs(af - bf))
            diff = np.where(np.isnan(diff), np.inf, diff)
            close = same if exact else diff <= atol + rtol * np.abs(np.where(np.isfinite(bf), bf, 0.0))
            rel = diff / np.maximum(np.abs(bf), max(atol, np.finfo(np.float64).tiny))
        max_abs.append(float(diff.max(initial=0.0)))
        max_rel.append(float(rel.max(initial=0.0)))
        if first is None and not close.all():
            idx = tuple(int(i) for i in np.argwhere(~close)[0])
            first = DifferingElement(k, idx, bb[idx].item(), aa[idx].item())
            reason = f"output {k} at {list(idx)}: {first.before} before, {first.after} after"
    return Comparison(first is None, tuple(max_abs), tuple(max_rel), first, reason)

