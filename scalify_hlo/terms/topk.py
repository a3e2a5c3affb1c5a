"""Distributed top-k: the top k of the blocks' top k is the top k (values, and indices once offset).

A top-k along a dim split in `n` blocks of `b` is taken per block (`rules/sorting.py`), which reads as
the block candidates `G = reshape(top_k(reshape(x, [..., n, b]), k1), [..., n·k1])`: each block's k1
best, side by side in block order, with indices *within* the block. Vocab-parallel sampling gathers
them and takes the top k2 again. Two identities of terms, exact for every input:

- values: `top_k(G_values, k2)[0] = top_k(x, k2)[0]` when `k2 <= k1`;
- indices: `take_along_axis(G_indices + offsets, top_k(G_values, k2)[1]) = top_k(x, k2)[1]` when
  `k2 <= k1` and the offsets are `j·b` throughout block `j`'s candidates.

Why. Order the elements of a row by (key descending, index ascending), the key being XLA's top-k key
(IEEE totalOrder, so NaNs and -0 are ordered too; ascending for `largest=false`): `top_k` returns the
first k of that strict total order, since it is stable (on equal keys the lower index first). An element
among the first k2 of the row has fewer than k2 elements before it in the row, so fewer than k1 in its
block: it is among its block's k1 candidates. Inside a block, positions order like global indices (the
block's offset is added to all of them). The second top-k orders the candidates by key and, on equal
keys, by position in `G`: block `j`'s candidates come before block `j+1`'s (blocks side by side in block
order), and inside a block in the first top-k's order, which on equal keys is index order. So position
in `G` orders equal keys as their global indices do, the second top-k takes the first k2 candidates in
the row's own order, and those are the row's first k2. The values are those elements; their global
indices are the block's offset plus the index within the block, read at the chosen positions.

The soundness trap is the block order: the candidates must lie in `G` in the order of their blocks'
offsets. Here that is not assumed but read off the terms: `G` is the block candidates of one `x` in
block order by construction (the rule that makes it), a gather over the split axes keeps that order
(an all-gather over the axes in another order permutes the blocks, another term), and the offsets are
checked to be `j·b` in that same order. Anything else is left as it is (and is not proven).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from scalify_hlo.ir.nodes import GatherDims, TensorType
from scalify_hlo.terms.evaluate import evaluate_constant
from scalify_hlo.terms.term import AttrKey, Term, scalar_value

if TYPE_CHECKING:
    from scalify_hlo.terms.table import Terms

_FOLD_LIMIT = 1 << 16  # elements of an offsets tensor evaluated to check it


def _order(t: Term) -> AttrKey:
    """A top-k term's attributes but its output index: k and direction."""
    return tuple((k, v) for k, v in t.attrs if k != "index")


def _largest(attrs: AttrKey) -> bool:
    return bool(dict(attrs).get("largest", True))


def _candidates(g: Term, index: int) -> tuple[Term, Term, int, int] | None:
    """(x, the blockwise top-k, n, b) when `g` is output `index` of x's block candidates
    `reshape(top_k(reshape(x, [..., n, b]), k1)[index], [..., n·k1])`."""
    if g.op != "reshape" or g.args[0].op != "top_k" or g.args[0].attr("index") != index:
        return None
    blockwise = g.args[0]
    split = blockwise.args[0]
    if split.op != "reshape" or split.type.rank != g.type.rank + 1:
        return None
    x = split.args[0]
    *batch, n, b = split.type.shape
    k1 = blockwise.type.shape[-1]
    if x.type.shape != (*batch, n * b) or g.type.shape != (*batch, n * k1):
        return None
    return x, blockwise, n, b


def merge_values(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    """`top_k(G_values, k2)[0]` → `top_k(x, k2)[0]` (module docstring)."""
    if a.get("index") != 0:
        return None
    (g,) = args
    found = _candidates(g, 0)
    if found is None:
        return None
    x, blockwise, _, _ = found
    k2 = int(a["k"])
    attrs = tuple(a.items())
    if k2 > blockwise.type.shape[-1] or _largest(blockwise.attrs) != _largest(attrs):
        return None
    return terms.apply("top_k", (x,), attrs, TensorType((*x.type.shape[:-1], k2), type.dtype))


def _take_along_last(g: GatherDims, sizes: Any, operand: Term, idx: Term) -> bool:
    """The gather is `take_along_axis(operand, idx[..., 0], axis=-1)` (JAX's spelling with batching dims)."""
    r = operand.type.rank
    batch = tuple(range(r - 1))
    return (g.offset_dims == () and g.collapsed_slice_dims == (r - 1,) and g.operand_batching_dims == batch
            and g.start_indices_batching_dims == batch and g.start_index_map == (r - 1,)
            and g.index_vector_dim == r and idx.type.shape[-1] == 1 and tuple(sizes or ()) == (1,) * r)


def _block_offsets(c: Term, n: int, k1: int, b: int) -> bool:
    """`c` is the constant whose block `j` of k1 candidates (along the last dim) is `j·b` throughout."""
    if c.type.size > _FOLD_LIMIT:
        return False
    values = evaluate_constant(c)
    if values is None:
        return False
    want = np.repeat(np.arange(n, dtype=np.int64) * b, k1)
    return bool(np.all(np.asarray(values).astype(np.int64).reshape(-1, n * k1) == want))


def _summands(terms: Terms, t: Term) -> tuple[Term, Term] | None:
    """The two operands of `t = a + c`, also through a reshape (`reshape(a + c)` is `reshape(a) +
    reshape(c)`: the offsets added before the gather's unit dim was taken out)."""
    if t.op == "add":
        return t.args[0], t.args[1]
    if t.op == "reshape" and t.args[0].op == "add":
        a, c = t.args[0].args
        return (terms.apply("reshape", (a,), (), TensorType(t.type.shape, a.type.dtype)),
                terms.apply("reshape", (c,), (), TensorType(t.type.shape, c.type.dtype)))
    return None


def merge_indices(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    """`take_along_axis(G_indices + offsets, top_k(G_values, k2)[1])` → `top_k(x, k2)[1]` (module
    docstring)."""
    operand, idx = args
    g = a.get("dimension_numbers")
    if not isinstance(g, GatherDims) or not _take_along_last(g, a.get("slice_sizes"), operand, idx):
        return None
    if idx.op != "reshape" or idx.args[0].op != "top_k" or idx.args[0].attr("index") != 1:
        return None
    second = idx.args[0]
    values = _candidates(second.args[0], 0)
    summands = _summands(terms, operand)
    if summands is None or values is None:
        return None
    x, blockwise, n, b = values
    for shifted, offsets in (summands, summands[::-1]):
        found = _candidates(shifted, 1)
        if found is None:
            continue
        xi, blockwise_i, ni, bi = found
        k1 = blockwise.type.shape[-1]
        k2 = second.type.shape[-1]
        # The indices of the very top-k whose values were merged (same blocks of the same x, same k1
        # and direction), the merge in the same direction and keeping no more than each block gave.
        same = (xi is x and (ni, bi) == (n, b) and blockwise_i.args == blockwise.args
                and _order(blockwise_i) == _order(blockwise) and _largest(second.attrs) == _largest(blockwise.attrs))
        if not same or k2 > k1 or blockwise_i.type.dtype != type.dtype or not _block_offsets(offsets, n, k1, b):
            continue
        attrs = (*_order(second), ("index", 1))
        return terms.apply("top_k", (x,), attrs, TensorType((*x.type.shape[:-1], k2), type.dtype))
    return None


# ------------------------------------------------- argmax from the blocks' maxima (pmax, then pmin)
# The distributed argmax written with `pmax` and `pmin` (greedy decoding over vocab-split logits): each
# device takes its block's max and argmax, the global max by pmax, and the smallest global index among the
# blocks whose max is the global max by pmin, other blocks offering a sentinel. For finite values that is
# the first index of the maximum, `jnp.argmax`'s: the first block reaching the max holds its first
# occurrence, at its own first occurrence. (A NaN makes the maxima NaN and no compare true: the sentinel,
# where argmax names the NaN; so the identity holds over the reals, and a proof using it says so.)

_FINITE_ONLY = ("the proof took the distributed argmax (pmax of the blocks' maxima, pmin of the indices "
                "where they are reached) for the first index of the maximum, which holds for finite values "
                "(a NaN gives the sentinel instead)")


def _max_of(t: Term, x: Term, dims: tuple[int, ...]) -> bool:
    """`t` reduces `x` by max over `dims` from -inf."""
    return (t.op == "reduce" and t.attr("reducer") == "max" and tuple(t.attr("dimensions")) == dims
            and len(t.args) == 2 and t.args[0] is x and scalar_value(t.args[1]) == float("-inf"))


def merge_argmax(terms: Terms, args: tuple[Term, ...], a: Mapping[str, Any], type: TensorType) -> Term | None:
    """`min_k select(max(x_k) == max(x), k·b + argmax(x_k), BIG)` over the `n` blocks `x_k` of a vector
    `x` → `argmax(x)` (the comment above), with `BIG` and the min's init at least `n·b`."""
    if a.get("reducer") != "min" or tuple(a.get("dimensions") or ()) != (0,) or len(args) != 2 or type.rank:
        return None
    sel, init = args
    if sel.op != "select" or sel.type.rank != 1:
        return None
    pred, picked, other = sel.args
    n = sel.type.shape[0]
    if pred.op != "compare" or pred.attr("comparison_direction") != "EQ" or picked.op != "add":
        return None
    lhs, rhs = pred.args
    block_max, whole_max = (lhs, rhs) if rhs.op == "broadcast_in_dim" else (rhs, lhs)
    if whole_max.op != "broadcast_in_dim" or block_max.op != "reduce" or not block_max.args:
        return None
    cut = block_max.args[0]
    if cut.op != "reshape" or cut.type.rank != 2 or cut.type.shape[0] != n or cut.args[0].type.rank != 1:
        return None
    x, b = cut.args[0], cut.type.shape[1]
    if not (_max_of(block_max, cut, (1,)) and _max_of(whole_max.args[0], x, (0,))):
        return None
    arg, offsets = picked.args if picked.args[1].op == "constant" else picked.args[::-1]
    if (arg.op != "reduce" or arg.attr("computation") != "argmax" or arg.attr("index") != 1
            or tuple(arg.attr("dimensions")) != (1,) or len(arg.args) != 4 or arg.args[0] is not cut):
        return None
    ids, v0, i0 = arg.args[1:]
    line = terms.iota(1, TensorType((n, b), ids.type.dtype))
    if ids is not line or scalar_value(v0) != float("-inf") or scalar_value(i0) != 0.0:
        return None
    big, floor = scalar_value(other), scalar_value(init)
    if big is None or floor is None or min(big, floor) < n * b or not _block_offsets(offsets, n, 1, b):
        return None
    keys = tuple((k, (0,) if k == "dimensions" else v) for k, v in arg.attrs)
    terms.notes.add(_FINITE_ONLY)
    return terms.mk("reduce", (x, terms.iota(0, TensorType(x.type.shape, ids.type.dtype)), v0, i0), keys, type)
