"""The transfer rule of `convolution` (`lax.conv_general_dilated`, flax `nn.Conv`, and the transposed
convolutions of their gradients).

A convolution is bilinear in its input (lhs) and kernel (rhs), and each output element reads one batch
row of the input, one output feature of the kernel, every input feature and a window of spatial positions.
So a device's block of the result is the convolution of its blocks when:

- the input's batch dim is split: the output's batch dim is split alike (data parallelism);
- the kernel's output-feature dim is split: the output's feature dim is split alike;
- the input-feature dim is split alike on the input and the kernel (the contraction): each device holds a
  partial sum over those axes, as `dot_general`'s contracting split (the weight gradient of a
  batch-sharded convolution contracts the batch this way);
- a grouped convolution (depthwise) has its input features and the kernel's output features split over
  the same axes and the kernel's input features whole: each device holds whole groups, and its local op
  has `feature_group_count` divided by the number of blocks;
- a spatial dim of the input is split and every window lies inside one block (no padding or input
  dilation, a stride dividing the block, a window no wider than the stride: 1x1 and patchify convs): the
  output's spatial dim is split alike.

A window reaching across blocks of a split spatial dim, given the plain blocks, misses its neighbours'
rows: evidence of a discrepancy (backed by a counterexample or `unknown`). GSPMD's halo exchange (slices
of the blocks, collective-permutes to the neighbours, a concatenation, a mask) is not modelled: it stops
at the slice, `unknown`. Other splits (kernel spatial dims, a split batch under batch groups) are
`unknown` too. The term is the global convolution with the attributes spelled canonically
(`numeric.kernels_conv.ConvSpec.attrs`), so the reference's StableHLO and XLA's HLO (which omits
defaults) give one term; it is an opaque node to the algebra.
"""

from __future__ import annotations

import dataclasses

from scalify_hlo.rules import halo as H
from scalify_hlo.rules.facts import Ctx, Fact, Failed, Halo, Holds, Varying, upstream
from scalify_hlo.rules.spmd import axes_text

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import Op, TensorType
from scalify_hlo.layout.mesh import Layout, Reducer
from scalify_hlo.numeric.kernels_conv import spec_of


def _even(ctx: Ctx, size: int, axes: tuple[str, ...]) -> bool:
    return size % ctx.mesh.size_of(axes) == 0


def convolution(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    lhs, rhs = (ctx.lift(f) if isinstance(f, Varying) else f for f in facts)
    halo = lhs if isinstance(lhs, Halo) else None
    if halo is not None:
        lhs = halo.base  # its blocks, widened by the halo along one spatial dim (below)
    for f in (lhs, rhs):
        if isinstance(f, Failed):
            return (upstream(f, op),)
    if not isinstance(lhs, Holds) or not isinstance(rhs, Holds):
        return (ctx.not_tensors(op, (lhs, rhs)),)
    try:
        local = spec_of(op)
    except ValueError as e:
        return (ctx.unsupported(op, str(e)),)
    if lhs.layout.partial and rhs.layout.partial:
        return (ctx.fail(op, "convolution of two partial values: the products of partial sums are not the "
                         "product of the sums; a psum is missing", evidence=True, origin=lhs.origin, partial=True),)
    partial = dict(lhs.layout.partial or rhs.layout.partial)
    origin = lhs.origin if lhs.layout.partial else rhs.origin
    if any(r is not Reducer.SUM for r in partial.values()):
        return (ctx.fail(op, "convolution of a value partial under max/min; a collective is missing before it",
                         evidence=True, origin=origin, partial=True),)
    dn = local.dims
    ld, rd = lhs.layout.dims, rhs.layout.dims
    ls, rs = lhs.term.type.shape, rhs.term.type.shape
    batch, feature, out_feature = ld[dn.input_batch], ld[dn.input_feature], rd[dn.kernel_output_feature]
    kernel_in = rd[dn.kernel_input_feature]
    found = f"{ctx.describe(lhs.layout)} * {ctx.describe(rhs.layout)}"
    for name, size, axes in (("input batch", ls[dn.input_batch], batch), ("input feature", ls[dn.input_feature], feature),
                             ("kernel output feature", rs[dn.kernel_output_feature], out_feature),
                             ("kernel input feature", rs[dn.kernel_input_feature], kernel_in)):
        if axes and not _even(ctx, size, axes):
            return (ctx.unsupported(op, f"the {name} dim ({size}) is split unevenly over {axes_text(ctx, axes)}"),)
    spec = local
    contracted: tuple[str, ...] = ()
    if batch and local.batch_groups > 1:
        return (ctx.unsupported(op, f"the input batch is split over {axes_text(ctx, batch)} under "
                                f"batch_group_count={local.batch_groups}: not modelled"),)
    if out_feature and local.batch_groups > 1:
        return (ctx.unsupported(op, f"the kernel's output features are split over {axes_text(ctx, out_feature)} "
                                f"under batch_group_count={local.batch_groups}: not modelled"),)
    groups = local.feature_groups
    if feature and feature == kernel_in and groups == 1:
        contracted = feature
    elif feature and not kernel_in and feature == out_feature:
        # Whole groups on each device: the input's features and the kernel's output features in the same
        # blocks, each block a run of whole groups; the local op counts only its own groups (a depthwise
        # conv with one channel per device is a plain conv there).
        spec = local.with_groups(groups * ctx.mesh.size_of(feature))
    elif (feature or kernel_in) and groups == 1:
        return (ctx.fail(op, f"convolution contracts input features split differently: input dim "
                         f"{dn.input_feature} over {axes_text(ctx, feature)}, kernel dim "
                         f"{dn.kernel_input_feature} over {axes_text(ctx, kernel_in)}", evidence=True, found=found),)
    elif feature or kernel_in or (out_feature and groups > 1):
        return (ctx.unsupported(op, f"a grouped convolution (feature_group_count={groups}) with input features "
                                f"split over {axes_text(ctx, feature)}, the kernel's input features over "
                                f"{axes_text(ctx, kernel_in)} and its output features over "
                                f"{axes_text(ctx, out_feature)}: not modelled"),)
    out_dims: list[tuple[str, ...]] = [()] * (len(dn.output_spatial) + 2)
    out_dims[dn.output_batch], out_dims[dn.output_feature] = batch, out_feature
    sides = {d for d, _, _ in halo.sides} if halo is not None else set()
    if not sides <= set(dn.input_spatial):
        return (ctx.unsupported(op, f"a convolution of halo rows along non-spatial dims {sorted(sides)}"),)
    padding = list(spec.padding)
    for i, (d, k, o) in enumerate(zip(dn.input_spatial, dn.kernel_spatial, dn.output_spatial, strict=True)):
        axes = ld[d]
        if rd[k]:
            # The kernel's rows split too (a weight gradient: the kernel is the output gradient): each
            # device sums its rows' products, a partial sum of the global convolution.
            if rd[k] != axes:
                return (ctx.unsupported(op, f"the kernel's spatial dim {k} is split over {axes_text(ctx, rd[k])} "
                                        f"and the input's dim {d} over {axes_text(ctx, axes)}"),)
            pad = H.contracted_window(ctx, op, H.as_halo(halo or lhs), d, rs[k], local.padding[i],
                                      local.lhs_dilation[i], local.rhs_dilation[i])
            if isinstance(pad, Failed):
                return (pad,)
            padding[i] = pad
            for a in axes:
                partial[a] = Reducer.SUM
            contracted = (*contracted, *axes)
            continue
        if not axes:
            continue
        if halo is not None and d in sides:
            window = (rs[k] - 1) * local.rhs_dilation[i] + 1
            pad = H.window_padding(ctx, op, halo, d, local.padding[i], local.lhs_dilation[i], local.strides[i],
                                   window, 0.0)
            if isinstance(pad, Failed):
                return (pad,)
            padding[i], out_dims[o] = pad, axes
            continue
        n = ctx.mesh.size_of(axes)
        if ls[d] % n:
            return (ctx.unsupported(op, f"the input's spatial dim {d} ({ls[d]}) is split unevenly over "
                                    f"{axes_text(ctx, axes)}"),)
        block, window = ls[d] // n, (rs[k] - 1) * local.rhs_dilation[i] + 1
        # Each block yields whole outputs from its own rows: no padding or dilation between blocks, a
        # stride dividing the block and a window no wider than the stride (1x1 convs, patchify convs).
        inside = (local.padding[i] == (0, 0) and local.lhs_dilation[i] == 1
                  and block % local.strides[i] == 0 and 0 < window <= local.strides[i])
        if not inside:
            # A window reaching across blocks reads the neighbours' rows: the local op, given only its own
            # block, pads where the reference reads them (GSPMD first exchanges halo rows; a value that is
            # the plain block has had none). Evidence, for the counterexample search to back or refute.
            return (ctx.fail(op, f"convolution's window ({rs[k]} taps, stride {local.strides[i]}, padding "
                             f"{local.padding[i]}) reaches across the blocks of the input's spatial dim {d}, split "
                             f"over {axes_text(ctx, axes)}: each device convolves its own rows only, without its "
                             "neighbours' (a halo exchange is missing)", evidence=True, found=found),)
        out_dims[o] = axes
    for a in contracted:
        partial[a] = Reducer.SUM
    try:
        layout = Layout(tuple(out_dims), tuple(partial.items()))
    except ShardingError:
        return (ctx.fail(op, "convolution's result would use one mesh axis twice (both operands split over it "
                         "in dims that are not contracted): each device computes blocks no layout describes",
                         evidence=False, found=found),)
    spec = dataclasses.replace(spec, padding=tuple(padding))
    gshape = spec.out_shape(ls, rs)
    if gshape is None or layout.local_shape(gshape, ctx.mesh) != op.result.tensor.shape:
        return (ctx.unsupported(op, f"operands of global shapes {list(ls)} * {list(rs)} laid out as {found} do "
                                f"not give the local result {list(op.result.tensor.shape)}"),)
    term = ctx.terms.apply("convolution", (lhs.term, rhs.term), spec.attrs(), TensorType(gshape, op.result.tensor.dtype))
    return (Holds(term, layout, op if contracted else origin),)

