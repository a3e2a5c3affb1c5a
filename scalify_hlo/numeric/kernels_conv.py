"""The `convolution` kernel (what `lax.conv_general_dilated` and flax `nn.Conv` lower to), and `ConvSpec`:
a convolution's attributes read once, with XLA's defaults filled in.

Full StableHLO semantics: any dim layout (`ConvDims`), window strides, edge padding (negative crops),
input (lhs) dilation, kernel (rhs) dilation, window reversal, feature groups and batch groups. The
arrays carry the interpreter's leading device axis. The input is dilated and padded once (`pad_with`),
then every kernel position adds its strided window times that kernel tap: a handful of small
contractions rather than an im2col copy, so the kernel stays exact to the accumulation order of a sum.

`ConvSpec.attrs` is the canonical attribute spelling the transfer rule (`rules/convolution.py`) puts on a
convolution term: HLO text converted by XLA omits defaults the lowered StableHLO spells out, and both must
give one term.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.nodes import AttrValue, ConvDims, Literal, Op
from scalify_hlo.numeric.kernels_index import pad_with
from scalify_hlo.numeric.kernels_shape import _dot_dtype
from scalify_hlo.numeric.values import Val, as_array, dtype_of

if TYPE_CHECKING:
    from scalify_hlo.numeric.machine import Machine


@dataclass(frozen=True, slots=True)
class ConvSpec:
    """A convolution's meaning apart from its operands: per spatial dim (window order) the stride, the
    (low, high) edge padding, the input and kernel dilations and whether the kernel is reversed."""

    dims: ConvDims
    strides: tuple[int, ...]
    padding: tuple[tuple[int, int], ...]
    lhs_dilation: tuple[int, ...]
    rhs_dilation: tuple[int, ...]
    reversal: tuple[bool, ...]
    feature_groups: int = 1
    batch_groups: int = 1

    def attrs(self) -> tuple[tuple[str, AttrValue], ...]:
        """The canonical attributes of a convolution term (sorted by name, as `Attrs` keeps them)."""
        return (("batch_group_count", self.batch_groups), ("dimension_numbers", self.dims),
                ("feature_group_count", self.feature_groups), ("lhs_dilation", self.lhs_dilation),
                ("padding", self.padding), ("rhs_dilation", self.rhs_dilation),
                ("window_reversal", self.reversal), ("window_strides", self.strides))

    def with_groups(self, feature_groups: int) -> ConvSpec:
        return ConvSpec(self.dims, self.strides, self.padding, self.lhs_dilation, self.rhs_dilation,
                        self.reversal, feature_groups, self.batch_groups)

    def out_shape(self, lhs: tuple[int, ...], rhs: tuple[int, ...]) -> tuple[int, ...] | None:
        """The result shape for operands of these shapes, None where XLA would reject them."""
        d, g, b = self.dims, self.feature_groups, self.batch_groups
        c, o = lhs[d.input_feature], rhs[d.kernel_output_feature]
        if (g > 1 and b > 1) or c != rhs[d.kernel_input_feature] * g or o % g or o % b or lhs[d.input_batch] % b:
            return None
        out = [0] * len(lhs)
        out[d.output_batch], out[d.output_feature] = lhs[d.input_batch] // b, o
        for i, (ld, kd, od) in enumerate(zip(d.input_spatial, d.kernel_spatial, d.output_spatial, strict=True)):
            size = self.window_out(i, lhs[ld], rhs[kd])
            if size is None:
                return None
            out[od] = size
        return tuple(out)

    def window_out(self, i: int, n: int, k: int) -> int | None:
        """Output size along spatial dim `i` for an input of size `n` and a kernel of size `k`."""
        lo, hi = self.padding[i]
        padded = (max(n - 1, 0) * self.lhs_dilation[i] + (1 if n else 0)) + lo + hi
        window = (k - 1) * self.rhs_dilation[i] + 1 if k else 0
        if padded < 0:
            return None
        return 0 if padded < window else (padded - window) // self.strides[i] + 1


def _ints(v: AttrValue, n: int, default: int) -> tuple[int, ...]:
    if v is None:
        return (default,) * n
    if isinstance(v, Literal):
        return tuple(int(x) for x in v.array.reshape(-1))
    assert isinstance(v, tuple)
    return tuple(int(x) for x in v)


def spec_of(op: Op) -> ConvSpec:
    """The spec of a `convolution` op (parsed or dressed from a term), XLA's defaults where omitted."""
    dims = op.attrs.get("dimension_numbers")
    if not isinstance(dims, ConvDims):
        raise ValueError(f"convolution without readable dimension numbers ({dims!r})")
    n = len(dims.input_spatial)
    pads = op.attrs.get("padding")
    flat = _ints(pads, 2 * n, 0) if not (isinstance(pads, tuple) and pads and isinstance(pads[0], tuple)) \
        else tuple(int(x) for pair in pads for x in pair)
    reversal = op.attrs.get("window_reversal")
    return ConvSpec(
        dims, _ints(op.attrs.get("window_strides"), n, 1), tuple(zip(flat[::2], flat[1::2], strict=True)),
        _ints(op.attrs.get("lhs_dilation"), n, 1), _ints(op.attrs.get("rhs_dilation"), n, 1),
        tuple(bool(r) for r in reversal) if isinstance(reversal, tuple) else (False,) * n,
        int(op.attrs.get("feature_group_count", 1) or 1),  # type: ignore[arg-type]
        int(op.attrs.get("batch_group_count", 1) or 1),  # type: ignore[arg-type]
    )


def convolution_arrays(lhs: np.ndarray, rhs: np.ndarray, spec: ConvSpec, out: np.dtype[Any]) -> np.ndarray:
    """The convolution of `[D, *lhs]` by `[D, *rhs]`, device by device."""
    d, dn = lhs.shape[0], spec.dims
    cd = _dot_dtype(lhs.dtype, rhs.dtype, out)
    x = lhs.transpose(0, dn.input_batch + 1, dn.input_feature + 1, *[s + 1 for s in dn.input_spatial]).astype(cd)
    w = rhs.transpose(0, dn.kernel_output_feature + 1, dn.kernel_input_feature + 1,
                      *[s + 1 for s in dn.kernel_spatial]).astype(cd)  # [D, O, I, *K]
    flips = tuple(3 + i for i, r in enumerate(spec.reversal) if r)
    if flips:
        w = np.flip(w, axis=flips)
    x = pad_with(x, np.zeros(d, cd), (0, 0, *(lo for lo, _ in spec.padding)), (0, 0, *(hi for _, hi in spec.padding)),
                 (0, 0, *(k - 1 for k in spec.lhs_dilation)))  # [D, N, C, *S]
    bg, fg = spec.batch_groups, spec.feature_groups
    n, c, o = x.shape[1], x.shape[2], w.shape[1]
    kernel = w.shape[3:]
    outs = tuple(0 if p < ((k - 1) * r + 1 if k else 0) else (p - ((k - 1) * r + 1 if k else 0)) // s + 1
                 for p, k, r, s in zip(x.shape[3:], kernel, spec.rhs_dilation, spec.strides, strict=True))
    x = x.reshape(d, bg, n // bg, fg, c // fg, *x.shape[3:])
    w = w.reshape(d, bg, fg, o // (bg * fg), w.shape[2], *kernel)
    acc = np.zeros((d, n // bg, bg, fg, o // (bg * fg), *outs), cd)
    if all(outs) and n and o:
        for tap in itertools.product(*(range(k) for k in kernel)):
            window = tuple(slice(t * r, t * r + (m - 1) * s + 1, s)
                           for t, r, m, s in zip(tap, spec.rhs_dilation, outs, spec.strides, strict=True))
            patch = x[(slice(None),) * 5 + window]  # [D, B, Nb, G, Cg, *out]
            acc += np.einsum("dbngc...,dbgoc->dnbgo...", patch, w[(slice(None),) * 5 + tap], optimize=True)
    y = acc.reshape(d, n // bg, o, *outs)
    rank = len(dn.output_spatial) + 2
    src = [1 if k == dn.output_batch else 2 if k == dn.output_feature else 3 + dn.output_spatial.index(k)
           for k in range(rank)]
    return y.transpose(0, *src).astype(out)


def convolution(m: Machine, op: Op, args: list[Val]) -> list[Val]:
    return [convolution_arrays(as_array(args[0]), as_array(args[1]), spec_of(op), dtype_of(op.results[0]))]
