"""Transfer rules for `sort` and top-k (`chlo.top_k`, XLA's HLO `topk`), along whole and split dims.

Along a dim whole on every device both act row by row, shard by shard along the other dims (top-k works
on the last dim; the indices it returns are positions in a whole row, so global).

Along a split dim a device sorts, or takes the top k of, its own block only; what that computes is still
exactly a global tensor:
- `sort`: the split of the sorted dim is moved onto another dim as its major part (the same local
  values read as the shards of a moved tensor, `facts.regroup`), and the moved tensor is sorted along a
  whole dim. Every choice of that other dim is exact; the one whose sort the reference computes is taken
  (XLA moves the sorted dim's split onto the rows with an all-to-all before it sorts, and the reshape
  rule may have read the rows' digits into the sorted dim).
- top-k: the block candidates, `reshape(top_k(reshape(x, [..., n, b]), k), [..., n·k])` laid out like
  `x` (the values, and the indices *within* the block). That they merge into the global top-k (values
  and indices, once the block offsets are added) is an identity of terms, checked where the merge
  happens (`terms/topk.py`).
XLA's HLO `topk(largest=true)` is `chlo.top_k` (what `lax.top_k` lowers to): one term for both.
"""

from __future__ import annotations

from scalify_hlo.rules.facts import Ctx, Fact, Failed, Holds, join, regroup, view
from scalify_hlo.rules.indexing import replicated_only
from scalify_hlo.rules.layout import holds_operands

from scalify_hlo.ir.nodes import Op, TensorType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.terms.term import AttrKey, Term


def _unsupported(ctx: Ctx, op: Op, what: str) -> tuple[Fact, ...]:
    return tuple(ctx.unsupported(op, what) for _ in op.results)


def _keyed(attrs: AttrKey, op: Op, i: int) -> AttrKey:
    return (*attrs, ("index", i)) if len(op.results) > 1 else attrs


def sort(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """`sort` of operands laid out alike (the keys and the values sorted with them)."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    if not any(h.layout.split_axes() for h in ops) or any(h.layout.partial for h in ops):
        return replicated_only(ctx, op, facts)
    rank = ops[0].layout.rank
    dim = int(op.attrs.get("dimension", -1))  # type: ignore[arg-type]
    dim = dim + rank if dim < 0 else dim
    layout = join([h.layout for h in ops])
    viewed = None if layout is None else [view(h.term, h.layout, layout.dims, ctx.mesh, ctx.terms) for h in ops]
    if layout is None or viewed is None or any(t is None for t in viewed):
        return _unsupported(ctx, op, "sort of operands laid out differently")
    args = tuple(t for t in viewed if t is not None)
    attrs = term_attrs(op)
    if not layout.dims[dim]:
        return _sorted(ctx, op, args, attrs, layout)
    axes = layout.dims[dim]
    if args[0].type.shape[dim] % ctx.mesh.size_of(axes):
        return _unsupported(ctx, op, f"sort along the unevenly split dim {dim}")
    options = []
    for e in (e for e in range(rank) if e != dim):
        moved = tuple(_move_split(ctx, t, layout, dim, e) for t in args)
        dims = list(layout.dims)
        dims[e], dims[dim] = (*axes, *dims[e]), ()
        out = _sorted(ctx, op, moved, attrs, Layout(tuple(dims), layout.partial))
        options.append(out)
        if all(isinstance(f, Holds) and ctx.known(f.term) == 2 for f in out):
            return out
    if not options:
        return _unsupported(ctx, op, f"sort of a rank-1 value along its split dim {dim}")
    return options[0]


def _move_split(ctx: Ctx, t: Term, layout: Layout, dim: int, e: int) -> Term:
    """`t`, split along `dim` over its axes, as the tensor whose dim `e` has those blocks as its major
    part and whose `dim` is one block long: the same local values on every device."""
    axes = layout.dims[dim]
    n = ctx.mesh.size_of(axes)
    digits = [[(f"_{i}", s)] for i, s in enumerate(t.type.shape)]
    digits[dim] = [("_blocks", n), (f"_{dim}", t.type.shape[dim] // n)]
    target = [[f"_{i}"] for i in range(t.type.rank)]
    target[e] = ["_blocks", f"_{e}"]
    return regroup(ctx.terms, t, digits, target)


def _sorted(ctx: Ctx, op: Op, args: tuple[Term, ...], attrs: AttrKey, layout: Layout) -> tuple[Fact, ...]:
    out: list[Fact] = []
    for i, r in enumerate(op.results):
        gtype = TensorType(args[0].type.shape, r.tensor.dtype)
        out.append(Holds(ctx.terms.apply("sort", args, _keyed(attrs, op, i), gtype), layout))
    return tuple(out)


def _top_k_attrs(op: Op) -> AttrKey:
    """The term attributes of a top-k: `k`, and `largest` only when false (HLO `topk` spells the
    default, `chlo.top_k` has no such attribute)."""
    k = int(op.attrs["k"])  # type: ignore[arg-type]
    return (("k", k),) if bool(op.attrs.get("largest", True)) else (("k", k), ("largest", False))


def top_k(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """The top k along the last dim: (values, indices)."""
    ops = holds_operands(ctx, op, facts)
    if isinstance(ops, Failed):
        return tuple(ops for _ in op.results)
    (x,) = ops
    if x.layout.partial:
        return _unsupported(ctx, op, "top-k of a partial value")
    attrs = _top_k_attrs(op)
    k = int(op.attrs["k"])  # type: ignore[arg-type]
    last = x.layout.rank - 1
    axes = x.layout.dims[last]
    gshape = list(x.term.type.shape)
    arg = x.term
    if axes:
        n = ctx.mesh.size_of(axes)
        size = gshape[last]
        if size % n or k > size // n:
            return _unsupported(ctx, op, f"top-{k} of the unevenly split dim {last}, or of blocks shorter than k")
        # The block candidates: each block's top k, side by side in block order.
        arg = ctx.terms.apply("reshape", (x.term,), (), TensorType((*gshape[:-1], n, size // n), x.term.type.dtype))
    out: list[Fact] = []
    for i, r in enumerate(op.results):
        shape = (*arg.type.shape[:-1], k)
        t = ctx.terms.apply("top_k", (arg,), (*attrs, ("index", i)), TensorType(shape, r.tensor.dtype))
        if axes:
            t = ctx.terms.apply("reshape", (t,), (), TensorType((*gshape[:-1], n * k), r.tensor.dtype))
        out.append(Holds(t, x.layout))
    return tuple(out)
