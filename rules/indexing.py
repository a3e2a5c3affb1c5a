"""Transfer rules for ops that index: dynamic slices, gathers, scatters and windows.

A dynamic-slice whose offsets are `k · (index of the device along mesh axes A)` on every device *creates*
a split over `A` (how GSPMD and `axis_index` code take their shard of a replicated value); with the same
offset everywhere it is a plain slice. A gather or scatter keeps its batch dims' splits as long as the
indexed dims are whole on every device (indices are global positions there).
"""

from __future__ import annotations

import numpy as np
from scalify_hlo.rules import halo as H
from scalify_hlo.rules.collectives import blocks_in_order
from scalify_hlo.rules.facts import Ctx, Fact, Failed, Halo, Holds, Varying, join, view
from scalify_hlo.rules.layout import holds_operands

from scalify_hlo.ir.errors import ShardingError
from scalify_hlo.ir.nodes import GatherDims, Literal, Op, ScatterDims, TensorType
from scalify_hlo.layout.groups import block_table, match_axis_index, match_axis_permutation
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.ops.reducers import COLLECTIVE_NAME, Reducer, reducer_of
from scalify_hlo.terms.term import Term, scalar_value


def start_offsets(ctx: Ctx, f: Fact) -> int | np.ndarray | Term | None:
    """A start index: an int (the same on all devices), a per-device vector, or a global term."""
    if isinstance(f, Varying):
        vals = np.asarray(f.values).reshape(f.values.shape[0])
        return vals.astype(np.int64) if not np.all(vals == vals[0]) else int(vals[0])
    if isinstance(f, Holds) and not f.layout.partial:
        folded = ctx.fold(f.term)
        if folded is not None and folded.size == 1:
            return int(folded.reshape(-1)[0])
        return f.term
    return None


def dynamic_slice(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    operand, *starts = facts
    if isinstance(operand, Varying) or (isinstance(operand, Holds) and ctx.fold(operand.term) is not None
                                        and any(isinstance(s, Varying) for s in starts)):
        v = ctx.varying(op, facts)
        if v is not None:
            return (v,)
    ops = holds_operands(ctx, op, (operand,))
    if isinstance(ops, Failed):
        return (ops,)
    (x,) = ops
    sizes = list(op.attrs["slice_sizes"])  # type: ignore[arg-type]
    xlocal = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    dims = list(x.layout.dims)
    gshape = list(x.term.type.shape)
    term_starts: list[Term | int] = []
    orders: dict[int, np.ndarray] = {}  # dim -> the order of its sub-blocks, where not the devices' own
    static = True
    for d, s in enumerate(starts):
        off = start_offsets(ctx, s)
        if off is None:
            return (ctx.unsupported(op, f"start index {d} is not known on every device"),)
        if sizes[d] == xlocal[d]:
            term_starts.append(0)
            continue
        if isinstance(off, np.ndarray):
            clamped = np.clip(off, 0, xlocal[d] - sizes[d])
            found = _block_table(ctx, clamped, sizes[d]) if np.array_equal(clamped, off) else None
            window = _window_of_blocks(ctx, x, d, off, sizes[d]) if found is None else None
            if window is not None:  # the blocks of a window of the dim: c + size × a block index
                dims[d], (start, gshape[d]) = window
                term_starts.append(start)
                continue
            if found is None:
                window = H.dynamic_window(ctx, x, d, off, sizes, op)
                if window is not None:
                    return (window,)
                if _distinct_blocks(ctx, clamped, sizes[d]):
                    # Each device reads a block of its own, not in the devices' order (the bidirectional
                    # collective matmul's half blocks 2·((i ± k) mod n) + h): no layout, yet legal, so the case
                    # split by device may follow it.
                    return (ctx.unsupported(op, f"dynamic-slice offsets along dim {d} ({off[:8].tolist()}...) "
                                            "pick a different block on each device, not in the devices' order"),)
                return (ctx.fail(op, f"dynamic-slice offsets along dim {d} ({off[:8].tolist()}...) are not "
                                 f"{sizes[d]} × a block index of the device along any mesh axes: not a shard",
                                 evidence=True),)
            axes, perm = found
            if set(axes) & x.layout.partial_axes():
                # Each device's block of its own partial sum: no layout. Named after the op that left the value
                # partial (a gradient all-reduced over the wrong axes, say), where the fix goes. Where nothing
                # else reads the value, the other blocks of every partial sum are lost, so a whole value was
                # needed here (a ring reduce-scatter reads its partial sums block by block: not this).
                sole = ctx.uses(op.operands[0]) == 1
                partial = dict(x.layout.partial)
                missing = COLLECTIVE_NAME[next(partial[a] for a in axes if a in partial)]
                reason = f"{op.opcode}: a dynamic-slice taking a shard over {list(axes)} of a value still partial " \
                    "over them" + (f"; a {missing} over them is missing before it" if sole else "")
                return (ctx.fail(op, reason, evidence=sole, origin=x.origin, partial=sole),)
            if set(axes) & {a for ds in dims for a in ds}:
                # Legal and no layout (the collective matmul's lhs column block (i - k) mod n of rows split
                # over the same axis): not evidence, so the case split by device may still follow it.
                return (ctx.unsupported(op, f"a dynamic-slice taking a shard over {list(axes)} of a value "
                                        "already split over them"),)
            n = ctx.mesh.size_of(axes)
            covered = sizes[d] * n * ctx.mesh.size_of(dims[d])
            if covered != gshape[d]:
                return (ctx.unsupported(op, f"shards along dim {d} cover {covered} of {gshape[d]} elements"),)
            if perm is not None:
                # Device (b, a) (b its index over the dim's axes so far) holds sub-block b·n + perm[a].
                outer = ctx.mesh.size_of(dims[d])
                orders[d] = np.concatenate([b * n + perm for b in range(outer)])
            dims[d] = (*dims[d], *axes)
            term_starts.append(0)
            continue
        if dims[d]:
            return (ctx.unsupported(op, f"a dynamic slice inside dim {d}, which is split over {list(dims[d])}"),)
        gshape[d] = sizes[d]
        if isinstance(off, int):
            term_starts.append(int(np.clip(off, 0, xlocal[d] - sizes[d])))
        else:
            static = False
            term_starts.append(off)
    gtype = TensorType(tuple(gshape), op.result.tensor.dtype)
    layout = Layout(tuple(dims), x.layout.partial)
    if static:
        lo = tuple(int(s) for s in term_starts)  # type: ignore[arg-type]
        hi = tuple(a + b for a, b in zip(lo, gshape, strict=True))
        attrs = (("limit_indices", hi), ("start_indices", lo), ("strides", (1,) * len(lo)))
        term = ctx.terms.apply("slice", (x.term,), attrs, gtype)
    else:
        idx = tuple(s if isinstance(s, Term) else ctx.terms.scalar(float(s), _index_dtype(starts))
                    for s in term_starts)
        term = ctx.terms.apply("dynamic_slice", (x.term, *idx), (("slice_sizes", tuple(gshape)),), gtype)
    for d, order in orders.items():  # dim d is whole in `term` (start 0): its blocks reorder alike
        moved = blocks_in_order(ctx.terms, term, d, order)
        if moved is None:
            return (ctx.unsupported(op, f"dim {d} does not divide into {len(order)} blocks"),)
        term = moved
    return (Holds(term, layout, x.origin),)


def _window_of_blocks(ctx: Ctx, x: Holds, d: int, offsets: np.ndarray, size: int
                      ) -> tuple[tuple[str, ...], tuple[int, int]] | None:
    """(axes, (start, length)) when each device reads, of a dim no axis splits, the block at `start + size ×`
    its index along `axes`, all within the dim (no clamping): then the devices hold the blocks of the window
    `[start, start + length)` (positions after a BOS slot: a RoPE table read at `axis_index · n + 1`)."""
    if x.layout.dims[d]:
        return None
    start = int(offsets.min())
    if start < 0:
        return None  # (clamped to 0 by the op)
    found = _block_table(ctx, offsets - start, size)
    if found is None or found[1] is not None:
        return None
    axes = found[0]
    length = size * ctx.mesh.size_of(axes)
    if (start == 0 and length == x.term.type.shape[d]) or start + length > x.term.type.shape[d] \
            or set(axes) & (x.layout.split_axes() | x.layout.partial_axes()):
        return None  # (the whole dim is the ordinary reading, below)
    return axes, (start, length)


def _block_table(ctx: Ctx, offsets: np.ndarray, size: int) -> tuple[tuple[str, ...], np.ndarray | None] | None:
    """(axes, None) when the offsets are `size` × the device's index along `axes` (its own block); (axes, perm)
    when they are `size` × perm[index] for a permutation `perm` (another device's block, e.g. `(i + k) mod n`);
    else None."""
    match = match_axis_index(offsets, ctx.mesh)
    if match is not None and match[1] == size and match[0]:
        return match[0], None
    return match_axis_permutation(offsets, ctx.mesh, size)


def _distinct_blocks(ctx: Ctx, offsets: np.ndarray, size: int) -> bool:
    """Whether the devices along some axes read distinct, aligned blocks of `size` (the same on the others)."""
    table = block_table(offsets, ctx.mesh, size)
    return table is not None and len(np.unique(table[1])) == table[1].size


def _index_dtype(starts: list[Fact]) -> str:
    for s in starts:
        if isinstance(s, Holds):
            return s.term.type.dtype
        if isinstance(s, Varying):
            return s.type.dtype
    return "i32"


def dynamic_update_slice(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    operand, update, *starts = facts
    ops = holds_operands(ctx, op, (operand, update))
    if isinstance(ops, Failed):
        return (ops,)
    x, u = ops
    if x.layout.partial != u.layout.partial:
        return (ctx.fail(op, "dynamic-update-slice of values with different partial axes", evidence=True),)
    # Both are seen under the most split layout either can be viewed as: a replicated operand is the shard
    # of its tiling, so a slot written with an update split over `A` (a scan stacking per-layer values
    # batch-split over fsdp into a buffer made of zeros) makes a result split over `A` alike.
    layout = x.layout if view(u.term, u.layout, x.layout.dims, ctx.mesh, ctx.terms) is not None else \
        join([x.layout, u.layout])
    xt = None if layout is None else view(x.term, x.layout, layout.dims, ctx.mesh, ctx.terms)
    ut = None if layout is None else view(u.term, u.layout, layout.dims, ctx.mesh, ctx.terms)
    if layout is None or xt is None or ut is None:
        return (ctx.fail(op, "dynamic-update-slice of an update laid out unlike its operand", evidence=True),)
    # Local shapes are the same under either view: only the global reading changes.
    xlocal = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    ulocal = u.layout.local_shape(u.term.type.shape, ctx.mesh)
    offsets = [start_offsets(ctx, s) for s in starts]
    if (placed := _own_block_in_zeros(ctx, x, u, offsets, xlocal, ulocal)) is not None:
        return (placed,)
    idx: list[Term] = []
    for d, off in enumerate(offsets):
        if isinstance(off, np.ndarray) or off is None:
            return (ctx.unsupported(op, f"device-dependent update offsets along dim {d}"),)
        if layout.dims[d] and ulocal[d] != xlocal[d]:
            # (Where the update covers the whole local dim, XLA clamps the offset to 0 on every device.)
            return (ctx.unsupported(op, f"an update inside dim {d}, which is split"),)
        idx.append(off if isinstance(off, Term) else ctx.terms.scalar(float(0 if layout.dims[d] else off),
                                                                      _index_dtype(starts)))
    term = ctx.terms.apply("dynamic_update_slice", (xt, ut, *idx), (), xt.type)
    return (Holds(term, layout, x.origin),)


def _own_block_in_zeros(ctx: Ctx, x: Holds, u: Holds, offsets: list[int | np.ndarray | Term | None],
                        xlocal: tuple[int, ...], ulocal: tuple[int, ...]) -> Holds | None:
    """Each device writing its own block of `u` (split along one dim) at that block's place in a buffer of
    zeros as long as the whole dim (an all-gather spelt as the psum of one-hot buffers): on every device one
    summand of `u`, the zeros elsewhere, so the result is `u` partial (a sum) over the axes `u` is split
    over. None for any other update."""
    varying = [d for d, off in enumerate(offsets) if isinstance(off, np.ndarray)]
    if len(varying) != 1 or x.layout != Layout.replicated(x.term.type.rank) or u.layout.partial:
        return None
    (d,) = varying
    axes = u.layout.dims[d]
    if (scalar_value(x.term) != 0 or x.term.type.dtype == "i1" or not axes
            or any(u.layout.dims[k] or off != 0 for k, off in enumerate(offsets) if k != d)
            or any(ulocal[k] != xlocal[k] for k in range(len(xlocal)) if k != d)
            or xlocal[d] != u.term.type.shape[d]):
        return None
    table = _block_table(ctx, offsets[d], ulocal[d])  # type: ignore[arg-type]
    if table is None or table[1] is not None or table[0] != axes:  # (a permuted table: another device's block)
        return None
    return Holds(u.term, Layout(((),) * u.term.type.rank, tuple((a, Reducer.SUM) for a in axes)), u.origin)


def gather(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A gather whose indexed operand dims are whole on every device (indices are global positions):
    output batch dims carry the indices' splits, offset dims the operand's; batching dims (the
    `take_along_axis` form) must be split alike on operand and indices."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return (ops,)
    w, idx = ops
    g = op.attrs["dimension_numbers"]
    if not isinstance(g, GatherDims) or w.layout.partial or idx.layout.partial:
        return (ctx.unsupported(op, "a gather of partial values or without dimension numbers"),)
    sizes = list(op.attrs["slice_sizes"])  # type: ignore[arg-type]
    wlocal = w.layout.local_shape(w.term.type.shape, ctx.mesh)
    for d in g.start_index_map:
        if w.layout.dims[d]:
            return (ctx.unsupported(op, f"gathering along operand dim {d}, which is split over "
                                    f"{list(w.layout.dims[d])} (a sharded lookup needs masking)"),)
    # A batching dim replicated on one side and split on the other: the replicated side is its tiled copies
    # (local rows still pair with local rows), as scatter reads its batching dims.
    want_w, want_idx = list(w.layout.dims), list(idx.layout.dims)
    for od, idim in zip(g.operand_batching_dims, g.start_indices_batching_dims, strict=True):
        want_w[od] = want_w[od] or want_idx[idim]
        want_idx[idim] = want_idx[idim] or want_w[od]
    if tuple(want_w) != w.layout.dims and (seen := view(w.term, w.layout, tuple(want_w), ctx.mesh, ctx.terms)):
        w = Holds(seen, Layout(tuple(want_w)))
    if tuple(want_idx) != idx.layout.dims and (
            seen := view(idx.term, idx.layout, tuple(want_idx), ctx.mesh, ctx.terms)):
        idx = Holds(seen, Layout(tuple(want_idx)))
    for od, idim in zip(g.operand_batching_dims, g.start_indices_batching_dims, strict=True):
        if w.layout.dims[od] != idx.layout.dims[idim]:
            return (ctx.unsupported(op, f"batching dims split differently: operand dim {od} over "
                                    f"{list(w.layout.dims[od])}, indices dim {idim} over {list(idx.layout.dims[idim])}"),)
    removed = set(g.collapsed_slice_dims) | set(g.operand_batching_dims)
    offset_src = [d for d in range(len(sizes)) if d not in removed]
    for d in offset_src:
        if w.layout.dims[d] and sizes[d] != wlocal[d]:
            return (ctx.unsupported(op, f"a partial slice of split operand dim {d}"),)
    batch_idx = [d for d in range(idx.term.type.rank) if d != g.index_vector_dim]
    out_dims: list[tuple[str, ...]] = []
    gshape: list[int] = []
    bi = oi = 0
    for j in range(op.result.tensor.rank):
        if j in g.offset_dims:
            d = offset_src[oi]
            oi += 1
            out_dims.append(w.layout.dims[d])
            gshape.append(w.term.type.shape[d] if w.layout.dims[d] else sizes[d])
        else:
            d = batch_idx[bi]
            bi += 1
            out_dims.append(idx.layout.dims[d])
            gshape.append(idx.term.type.shape[d])
    try:
        layout = Layout(tuple(out_dims))
    except ShardingError:
        return (ctx.unsupported(op, "a gather whose output would use a mesh axis twice"),)
    gsizes = tuple(w.term.type.shape[d] if w.layout.dims[d] and d not in g.operand_batching_dims else sizes[d]
                   for d in range(len(sizes)))
    attrs = (("dimension_numbers", g), ("slice_sizes", gsizes))
    term = ctx.terms.apply("gather", (w.term, idx.term), attrs, TensorType(tuple(gshape), op.result.tensor.dtype))
    return (Holds(term, layout),)


def replicated_only(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Ops understood only on whole (replicated) values: the global op itself (sort, scatter, top-k, ...).
    Enough for every reference program and for after-programs that compute them redundantly."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    if any(h.layout.split_axes() or h.layout.partial for h in ops):
        return tuple(ctx.unsupported(op, "this op on sharded or partial values") for _ in op.results)
    args = tuple(h.term for h in ops)
    attrs = term_attrs(op)
    out: list[Fact] = []
    for i, r in enumerate(op.results):
        t = r.tensor
        key = (*attrs, ("index", i)) if len(op.results) > 1 else attrs
        out.append(Holds(ctx.terms.apply(op.opcode, args, key, t), Layout.replicated(t.rank)))
    return tuple(out)


def reduce_window(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """Windows that span only whole dims act shard by shard along the others (cumsum over the sequence
    of a batch-split tensor). Along a split dim, a device's windows are those of its block when each lies
    inside the block (2x2 pooling with stride 2), or when the operand is a halo (rules/halo.py) padded
    with the init value outside the tensor (SAME max / average pooling after XLA's halo exchange)."""
    halo = facts[0] if len(op.results) == 1 and isinstance(facts[0], Halo) else None
    if halo is not None:
        facts = (halo.base, *facts[1:])
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    k = len(op.results)
    xs, inits = ops[:k], ops[k:]
    rank = xs[0].layout.rank
    window = tuple(op.attrs.get("window_dimensions", (1,) * rank))
    strides = tuple(op.attrs.get("window_strides", (1,) * rank) or (1,) * rank)
    pad = op.attrs.get("padding")
    pads = np.asarray(pad.array).reshape(rank, 2) if isinstance(pad, Literal) else np.zeros((rank, 2))
    touched = [d for d in range(rank) if window[d] != 1 or strides[d] != 1 or pads[d].any()]
    layouts = {h.layout for h in xs}
    if len(layouts) != 1 or any(h.layout.partial for h in ops) or any(i.layout.split_axes() for i in inits):
        return replicated_only(ctx, op, facts)
    layout = next(iter(layouts))
    attrs = term_attrs(op)
    if any(layout.dims[d] for d in touched) or halo is not None:
        padding = _split_windows(ctx, op, layout, halo, inits[0].term, window, strides, pads, touched)
        if isinstance(padding, Failed):
            return tuple(padding for _ in op.results)
        dtype = pad.dtype if isinstance(pad, Literal) else "i64"
        shape = pad.array.shape if isinstance(pad, Literal) else (rank, 2)
        literal = Literal(np.asarray(padding, dtype=np.int64).reshape(shape), dtype)
        items = [(k, literal if k == "padding" else v) for k, v in attrs]
        if "padding" not in op.attrs:  # where the parser puts it: among the op's attributes, by name
            at = next((i for i, (k, _) in enumerate(items) if k > "padding" and k in op.attrs), len(items))
            items.insert(at, ("padding", literal))
        attrs = tuple(items)
    args = tuple(h.term for h in ops)
    out: list[Fact] = []
    for i, r in enumerate(op.results):
        gshape = tuple(n * ctx.mesh.size_of(d) for n, d in zip(r.tensor.shape, layout.dims, strict=True))
        key = (*attrs, ("index", i)) if k > 1 else attrs
        out.append(Holds(ctx.terms.apply("reduce_window", args, key, TensorType(gshape, r.tensor.dtype)), layout))
    return tuple(out)


def _split_windows(ctx: Ctx, op: Op, layout: Layout, halo: Halo | None, init: Term, window: tuple[int, ...],
                   strides: tuple[int, ...], pads: np.ndarray, touched: list[int]) -> list[list[int]] | Failed:
    """The global op's padding, when each device's windows along split dims are its block's."""
    rank = layout.rank
    base = tuple(op.attrs.get("base_dilations", (1,) * rank) or (1,) * rank)  # type: ignore[arg-type]
    dilation = tuple(op.attrs.get("window_dilations", (1,) * rank) or (1,) * rank)  # type: ignore[arg-type]
    sides = {d for d, _, _ in halo.sides} if halo is not None else set()
    if not sides <= set(touched):
        return ctx.unsupported(op, "a window op that keeps a halo's rows")
    fill = scalar_value(init)
    padding = [[int(lo), int(hi)] for lo, hi in pads]
    for d in touched:
        if not layout.dims[d]:
            continue
        span = (window[d] - 1) * dilation[d] + 1
        if halo is not None and d in sides:
            if fill is None:
                return ctx.unsupported(op, "a window over halo rows with an init value that is not a constant")
            pad = H.window_padding(ctx, op, halo, d, (padding[d][0], padding[d][1]), base[d], strides[d], span, fill)
            if isinstance(pad, Failed):
                return pad
            padding[d] = list(pad)
            continue
        block = op.operands[0].tensor.shape[d]
        if base[d] != 1:
            return ctx.unsupported(op, f"a window with base dilation {base[d]} over dim {d}, which is split")
        if padding[d] != [0, 0] or block % strides[d] or span > strides[d]:
            # Not evidence: the reference may window each block alike (a vmapped cumsum over groups).
            return ctx.unsupported(op, f"a window ({window[d]} wide, stride {strides[d]}, padding "
                                   f"{tuple(padding[d])}) across the blocks of dim {d}, which is split over "
                                   f"{list(layout.dims[d])}")
    return padding


def scatter(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A scatter into whole (unsplit) scattered dims: the update rows land on the devices that hold their
    batch; the result keeps the operand's layout. (The gradient of `take_along_axis`.)"""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    if len(op.results) != 1 or len(ops) != 3:
        return replicated_only(ctx, op, facts)
    x, idx, upd = ops
    g = op.attrs.get("scatter_dimension_numbers")
    if not isinstance(g, ScatterDims) or any(h.layout.partial for h in ops):
        return replicated_only(ctx, op, facts)
    if not (x.layout.split_axes() or idx.layout.split_axes() or upd.layout.split_axes()):
        return replicated_only(ctx, op, facts)
    if any(x.layout.dims[d] for d in (*g.inserted_window_dims, *g.scattered_dims_to_operand_dims)):
        return (ctx.unsupported(op, "a scatter into a split dim"),)
    idx_batch = [d for d in range(idx.layout.rank) if d != g.index_vector_dim]
    upd_scatter = [d for d in range(upd.layout.rank) if d not in g.update_window_dims]
    window_src = [d for d in range(x.layout.rank) if d not in g.inserted_window_dims and d not in g.input_batching_dims]
    want = list(upd.layout.dims)
    for d_idx, d_upd in zip(idx_batch, upd_scatter, strict=True):
        want[d_upd] = idx.layout.dims[d_idx]
    want_x = list(x.layout.dims)
    for od, idim in zip(g.input_batching_dims, g.scatter_indices_batching_dims, strict=True):
        want_x[od] = idx.layout.dims[idim]
    # A window dim split on one side only: the replicated side is its tiled copies. Either way a split
    # window must span the device's whole block (it starts at 0, the dim not being indexed): a window of
    # part of each block is not the same part of the global tensor.
    xlocal = x.layout.local_shape(x.term.type.shape, ctx.mesh)
    ulocal = upd.layout.local_shape(upd.term.type.shape, ctx.mesh)
    for d_op, d_upd in zip(window_src, g.update_window_dims, strict=True):
        if want_x[d_op] or want[d_upd]:
            if xlocal[d_op] != ulocal[d_upd]:
                # Evidence, for the counterexample search to back or refute: the reference may write the
                # same part of each block (a reshaped tensor), not of the whole.
                return (ctx.fail(op, f"a scatter writing {ulocal[d_upd]} of the {xlocal[d_op]} rows of each device's "
                                 f"block along operand dim {d_op}, which is split: the same rows of every block, "
                                 "not those of the whole tensor", evidence=True),)
            want_x[d_op] = want_x[d_op] or want[d_upd]
            want[d_upd] = want[d_upd] or want_x[d_op]
    if tuple(want) != upd.layout.dims:
        # Updates replicated where the indices are split (a constant cotangent) are their tiled copies.
        seen = view(upd.term, upd.layout, tuple(want), ctx.mesh, ctx.terms)
        if seen is None:
            return (ctx.unsupported(op, "scatter indices and updates split differently"),)
        upd = Holds(seen, Layout(tuple(want), upd.layout.partial))
    if tuple(want_x) != x.layout.dims:
        seen = view(x.term, x.layout, tuple(want_x), ctx.mesh, ctx.terms)
        if seen is None:
            return (ctx.unsupported(op, "scatter batching dims split differently"),)
        x = Holds(seen, Layout(tuple(want_x), x.layout.partial))
    split_batch = {a for d in idx_batch for a in idx.layout.dims[d]}
    batched = {a for d in g.input_batching_dims for a in x.layout.dims[d]}
    summed = split_batch - batched
    if summed and (not _sums_into_zeros(op, x) or summed & x.layout.split_axes()):
        return (ctx.unsupported(op, "scatter updates split over axes the operand is not"),)
    for d_op, d_upd in zip(window_src, g.update_window_dims, strict=True):
        if x.layout.dims[d_op] != upd.layout.dims[d_upd]:
            return (ctx.unsupported(op, "scatter windows split unlike the operand"),)
    term = ctx.terms.apply("scatter", (x.term, idx.term, upd.term), term_attrs(op), x.term.type)
    if summed:
        # Each device adds its own updates into zeros: the partial sums of the whole scatter-add over the
        # axes its updates are split over (the gradient of an embedding lookup of a batch-split batch).
        return (Holds(term, x.layout.with_partial(sorted(summed), Reducer.SUM)),)
    return (Holds(term, x.layout),)


def _sums_into_zeros(op: Op, x: Holds) -> bool:
    """A scatter-add (the combiner adds) into a tensor of zeros."""
    return bool(op.regions) and reducer_of(op.regions[0]) is Reducer.SUM and scalar_value(x.term) == 0
