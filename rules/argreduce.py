"""Transfer rules for argmax/argmin over a split dim: block results, gathered, combined again.

`jnp.argmax` is a variadic `reduce` of the values and an iota of indices with JAX's comparator body
(`ops.reducers.arg_reducer_of`). Along a dim split over mesh axes `A`, XLA's partitioner (and hand-written
code in its style) reduces each device's block with *global* indices, puts the block result in a new unit
dim (reshape), all-gathers it over `A` and reduces the gathered blocks with the same body. The body picks
the better of two (value, index) pairs (ties: the smaller index), a selection, so combining the blocks'
best pairs gives the best pair of the whole, whatever the grouping, and the init pair taken in again at
each level changes nothing (a selection is idempotent). Two NaNs tie too: which one wins is the order XLA
combines them in, which it leaves open in the reference as well (as it does for the order of a sum).

Until the combine no device holds a shard of any global tensor: the steps are tracked as `Blocks` facts
(facts.py), exact per device. A shard_map may also return the block results as they are, given a block dim
that its out spec splits over the blocks' axes (`x.argmax(-1, keepdims=True)` of a column block under
`P(..., "y")`): that is the tensor of every block's result, the reduce of the operands cut into their
blocks (`leaving`). Any other use of a block result is not modelled (`unknown`); a combine that
does not gather every block, or combines them with another body or init, is evidence of a discrepancy
(checked by running the programs before it is reported). Written by hand in a shard_map, the combine is often
a pmax of the block maxima and a pmin of the global indices of the blocks that attain it (`offset`, `best`,
`pick`, `least` below, through `Best` facts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scalify_hlo.rules.facts import Best, Blocks, Ctx, Fact, Holds, PerBlock, Varying

from scalify_hlo.ir.nodes import Op, TensorType
from scalify_hlo.layout.mesh import Layout
from scalify_hlo.ops.attrs import term_attrs
from scalify_hlo.ops.reducers import Reducer, arg_reducer_of, is_identity
from scalify_hlo.terms.term import Term


def block_reduce(ctx: Ctx, op: Op, xs: Sequence[Holds], inits: Sequence[Holds], layout: Layout,
                 red: tuple[int, ...]) -> tuple[Fact, ...]:
    """The local reduce of operands laid out as `layout` (already viewed alike) over `red`, some of them
    split: each device's block result, when the body is JAX's argmax/argmin comparator."""
    kind = arg_reducer_of(op.regions[0]) if len(op.regions) == 1 else None
    split = [d for d in red if layout.dims[d]]
    if kind is None or len(xs) != 2:
        return tuple(ctx.unsupported(op, "a variadic reduce over a split dim whose body is not JAX's argmax/"
                                     "argmin comparator") for _ in op.results)
    if len(split) != 1:
        return tuple(ctx.unsupported(op, "an argmax/argmin over several split dims") for _ in op.results)
    (d,) = split
    axes = layout.dims[d]
    if xs[0].term.type.shape[d] % ctx.mesh.size_of(axes):
        # The last blocks would carry padding, which the local reduce would read.
        return tuple(ctx.unsupported(op, f"an argmax/argmin over the unevenly split dim {d}") for _ in op.results)
    out_layout = Layout(tuple(a for i, a in enumerate(layout.dims) if i not in red))
    args = (*(h.term for h in xs), *(h.term for h in inits))
    shape = tuple(s for i, s in enumerate(args[0].type.shape) if i not in red)
    whole = tuple(ctx.terms.mk("reduce", args, (*term_attrs(op), ("index", i)), TensorType(shape, r.tensor.dtype))
                  for i, r in enumerate(op.results))
    return tuple(Blocks(whole, i, out_layout, axes, kind, tuple(h.term for h in inits), op, d)
                 for i in range(len(op.results)))


def reshape(ctx: Ctx, op: Op, b: Blocks) -> Fact:
    """A reshape (or broadcast_in_dim) inserting one unit dim into a block result: the dim that indexes
    the block."""
    if b.dim is not None or b.gathered:
        return ctx.unsupported(op, "a reshape of argmax/argmin block results already given a block dim")
    local = list(b.layout.local_shape(b.whole[b.index].type.shape, ctx.mesh))
    out = list(op.result.tensor.shape)
    places = [p for p in range(len(out)) if out[p] == 1 and out[:p] + out[p + 1:] == local]
    if op.opcode == "broadcast_in_dim":  # the operand's dims must keep their order around the new one
        kept = list(op.attrs["broadcast_dimensions"])  # type: ignore[arg-type]
        places = [p for p in places if kept == [j for j in range(len(out)) if j != p]]
    elif op.opcode != "reshape":
        return ctx.unsupported(op, f"{op.opcode} of argmax/argmin block results")
    if len(places) != 1:  # (next to another unit dim the block dim's place is ambiguous)
        return ctx.unsupported(op, "a reshape of argmax/argmin block results other than inserting one unit dim")
    return dataclasses.replace(b, dim=places[0])


def all_gather(ctx: Ctx, op: Op, b: Blocks, axes: tuple[str, ...], dim: int) -> Fact:
    """An all-gather of block results along their block dim: every device gets every block when it
    gathers over the axes the blocks are split over (in any order: the combine is a selection)."""
    if b.dim is None or b.gathered or dim != b.dim:
        return ctx.unsupported(op, "an all-gather of argmax/argmin block results along another dim than "
                               "the block's")
    if set(axes) != set(b.axes):
        return ctx.fail(op, f"an all-gather over {sorted(axes)} of argmax/argmin block results split over "
                        f"{sorted(b.axes)}: the combine sees other blocks than the whole dim's", evidence=True,
                        origin=b.origin, expected=str(sorted(b.axes)), found=str(sorted(axes)))
    return dataclasses.replace(b, gathered=True)


def combine(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> tuple[Fact, ...]:
    """A variadic reduce reading block results: the global argmax/argmin when it reduces exactly the
    gathered block dim of both outputs of one block reduce, with the same body and inits."""
    k = len(op.results)
    xs, inits = facts[:k], facts[k:]
    red = tuple(op.attrs["dimensions"])  # type: ignore[arg-type]
    first = xs[0]
    if not isinstance(first, Blocks) or not all(isinstance(x, Blocks) for x in xs):
        return tuple(ctx.unsupported(op, "a variadic reduce of argmax/argmin block results and other values")
                     for _ in op.results)
    blocks = [x for x in xs if isinstance(x, Blocks)]
    if not all(b.gathered for b in blocks):
        return tuple(ctx.unsupported(op, "a reduce of argmax/argmin block results not gathered along their "
                                     "block dim") for _ in op.results)
    same = all(b.whole == first.whole and b.dim == first.dim for b in blocks)
    if not same or [b.index for b in blocks] != list(range(len(first.whole))) or red != (first.dim,):
        return tuple(ctx.fail(op, "a reduce of argmax/argmin block results that is not the combine of one "
                              "block reduce's values and indices over the block dim", evidence=True,
                              origin=first.origin) for _ in op.results)
    kind = arg_reducer_of(op.regions[0]) if len(op.regions) == 1 else None
    lifted = [ctx.lift(f) for f in inits]
    init_terms = tuple(f.term if isinstance(f, Holds) and not f.layout.split_axes() and not f.layout.partial
                       else None for f in lifted)
    if kind != first.kind or init_terms != first.inits:
        found = kind or "another body"
        return tuple(ctx.fail(op, f"{first.kind} block results combined by {found} or with other initial "
                              "values", evidence=True, origin=first.origin, expected=first.kind, found=found)
                     for _ in op.results)
    return tuple(Holds(t, first.layout) for t in first.whole)


def _block_results(ctx: Ctx, b: Blocks) -> tuple[Term, int]:
    """Every block's result as one tensor: the reduce of the operands with the reduced dim cut into
    (block, row), over the rows; and where the block dim is among the result's dims."""
    whole = b.whole[b.index]
    red = tuple(dict(whole.attrs)["dimensions"])
    k = len(b.whole)
    xs, inits = whole.args[:k], whole.args[k:]
    shape, n = xs[0].type.shape, ctx.mesh.size_of(b.axes)
    cut = (*shape[:b.reduced], n, shape[b.reduced] // n, *shape[b.reduced + 1:])
    blocks = tuple(ctx.terms.apply("reshape", (x,), (), TensorType(cut, x.type.dtype)) for x in xs)
    within = tuple(sorted(r + (r >= b.reduced) for r in red))  # the reduced dim's place: its within-block digit
    kept = [i for i in range(len(cut)) if i not in within]
    keys = tuple((key, within if key == "dimensions" else v) for key, v in whole.attrs)
    out = TensorType(tuple(cut[i] for i in kept), whole.type.dtype)
    return ctx.terms.mk("reduce", (*blocks, *inits), keys, out), kept.index(b.reduced)


def per_device(ctx: Ctx, op: Op, f: Fact) -> Fact:
    """A scalar block result read per device (an elementwise op: `axis_index(a) * n + jnp.argmax(x)`, a
    compare): element `b_A(c)` of every block's result, a `PerBlock`. Anything else as it is."""
    if not isinstance(f, Blocks) or f.dim is not None or f.gathered or f.layout.rank:
        return f
    term, _ = _block_results(ctx, f)
    return PerBlock(term, f.axes, ctx.not_tensors(op, (f,)))


def leaving(ctx: Ctx, b: Blocks, declared: Layout) -> Holds | None:
    """Block results leaving a shard_map under out spec `declared`: when it splits their block dim over
    the blocks' axes (in their order) and lays out the other dims as the results are, the tensor of every
    block's result, whose block `k` along that dim is the reduce of the operands' block `k` (None
    otherwise)."""
    if (b.dim is None or b.gathered or declared.partial or declared.rank != b.layout.rank + 1
            or declared.dims[b.dim] != b.axes or declared.dims[:b.dim] + declared.dims[b.dim + 1:] != b.layout.dims):
        return None
    term, at = _block_results(ctx, b)
    if at != b.dim:
        out = term.type.shape
        perm = [i for i in range(len(out)) if i != at]
        perm.insert(b.dim, at)
        term = ctx.terms.apply("transpose", (term,), (("permutation", tuple(perm)),),
                               TensorType(tuple(out[i] for i in perm), term.type.dtype))
    return Holds(term, declared, b.origin)


# ---- argmax by hand: best value by pmax, the first index where it is attained by pmin --------------------
#
# In a shard_map the block result holds *local* indices. `jnp.argmax(x) + axis_index(A) * n` makes them
# global (`offset`); `lm == pmax(lm, A)` with `lm = jnp.max(x)` says which devices' blocks attain the global
# max (`best`); `where(that, index, BIG)` keeps their candidates (`pick`); `pmin(.., A)` takes the first
# (`least`): the devices' blocks are in index order along the split dim, so the smallest candidate is the
# global first best index, JAX's argmax. Exact for values without NaN (as every reduction identity here is):
# a NaN block max equals nothing, where the reference's argmax points at the first NaN.

def offset(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Blocks | None:
    """Block indices of a local iota plus each device's block start: the blocks of the argmax/argmin over
    the global iota. None when the operands are not exactly that."""
    if op.opcode != "add" or len(facts) != 2:
        return None
    b = next((f for f in facts if isinstance(f, Blocks)), None)
    v = next((f for f in facts if isinstance(f, Varying)), None)
    if b is None or v is None or b.index != 1 or b.dim is not None or b.gathered or len(b.whole) != 2:
        return None
    whole = b.whole[1]
    x, idx, *inits = whole.args
    n_all = x.type.shape[b.reduced]
    n = n_all // ctx.mesh.size_of(b.axes)
    local = ctx.fold(idx)
    rank = idx.type.rank
    if local is None or local.shape != idx.type.shape:
        return None
    line = (np.arange(n_all) % n).reshape([-1 if i == b.reduced else 1 for i in range(rank)])
    if not np.array_equal(local, np.broadcast_to(line, local.shape)):
        return None
    starts = ctx.mesh.block_indices(b.axes) * n
    values = np.asarray(v.values)
    if values.shape[0] != len(starts) or not all(np.all(values[c] == s) for c, s in enumerate(starts)):
        return None
    glob = ctx.terms.iota(b.reduced, idx.type)
    attrs = tuple((k, a) for k, a in whole.attrs if k != "index")
    new = tuple(ctx.terms.mk("reduce", (x, glob, *inits), (*attrs, ("index", i)), w.type)
                for i, w in enumerate(b.whole))
    return dataclasses.replace(b, whole=new)


def best(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Best | None:
    """`block_max == pmax(block_max)` (or min/pmin): where each device's block attains the global max."""
    if op.opcode != "compare" or str(op.attrs.get("comparison_direction")) != "EQ" or len(facts) != 2:
        return None
    if not all(isinstance(f, Holds) for f in facts):
        return None
    a, c = facts
    assert isinstance(a, Holds) and isinstance(c, Holds)
    part, full = (a, c) if a.layout.partial else (c, a)
    if part.term != full.term or full.layout.partial or Layout(part.layout.dims) != full.layout:
        return None
    reducers = {r for _, r in part.layout.partial}
    if reducers not in ({Reducer.MAX}, {Reducer.MIN}):
        return None
    t = part.term
    if t.op != "reduce" or len(t.args) != 2:
        return None
    attrs = dict(t.attrs)
    red = tuple(attrs.get("dimensions", ()))
    (reducer,) = reducers
    init = ctx.fold(t.args[1])
    if len(red) != 1 or attrs.get("reducer") != reducer.value or init is None \
            or not is_identity(init.item() if init.size == 1 else None, reducer, t.args[1].type.dtype):
        return None
    axes = tuple(a for a, _ in part.layout.partial)
    kind = "argmax" if reducer is Reducer.MAX else "argmin"
    return Best(t, t.args[0], red[0], axes, full.layout, kind, op)


def pick(ctx: Ctx, op: Op, facts: tuple[Fact, ...]) -> Best | None:
    """`where(best, index, BIG)`: each device's candidate index, BIG where its block is not the best."""
    if op.opcode != "select" or len(facts) != 3:
        return None
    m, b, fill = facts
    if not isinstance(m, Best) or m.pick is not None or not isinstance(b, Blocks) or not isinstance(fill, Holds):
        return None
    if b.index != 1 or b.dim is not None or b.gathered or b.kind != m.kind or b.layout != m.layout:
        return None
    x, idx, *_ = b.whole[1].args
    n_all = x.type.shape[m.reduced]
    if x != m.operand or set(b.axes) != set(m.axes) or idx != ctx.terms.iota(m.reduced, idx.type):
        return None
    values = ctx.fold(fill.term) if not fill.layout.partial else None
    if values is None or values.size == 0 or not np.all(values == values.flat[0]) or values.flat[0] < n_all - 1:
        return None
    return dataclasses.replace(m, pick=b.whole[1])


def least(ctx: Ctx, op: Op, m: Best, axes: tuple[str, ...], reducer: Reducer) -> Fact:
    """`pmin` of the candidates over the blocks' axes: the global first best index."""
    if m.pick is None or reducer is not Reducer.MIN or set(axes) != set(m.axes):
        return ctx.unsupported(op, f"an all-reduce of where the blocks attain their {m.kind[3:]} other than "
                               f"a min of their candidate indices over {list(m.axes)}")
    return Holds(m.pick, m.layout)
