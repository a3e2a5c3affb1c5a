"""Global terms: what a value means on the single-device program, hash-consed and canonicalised.

Both programs are read into one table of terms. A before-value is the term of its op; an after-value
*holds* a term under a layout (`facts.Holds`). When the partitioner kept the structure, the after
program's terms are the very same objects as the before program's, and no e-graph is needed. The smart
constructor `Terms.apply` normalises what is exactly equal and cheap to see (identity transposes and
reshapes, composed transposes/broadcasts, operand order of commutative ops, splat constants, HLO `dot`
as `dot_general`); everything else is left to egglog (`rules/algebra.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from scalify_hlo.ir.dtypes import LOW_FLOATS, numpy_dtype
from scalify_hlo.ir.nodes import ConvDims, DotDims, Literal, TensorType
from scalify_hlo.ops.elementwise import COMMUTATIVE, SHAPE_PRESERVING
from scalify_hlo.terms import arith, dots, padding, precision, ranges, reductions, slicing, topk
from scalify_hlo.terms.movement import normalize, reshape_groups, reshape_outward, without_new_dims
from scalify_hlo.terms.ranges import Interval
from scalify_hlo.terms.term import AttrKey, Term, peel, resplat, scalar_value

LEAVES = frozenset({"param", "var", "nothing_received"})  # the terms that are not functions of others
# op -> (its unit, the sides it may stand on): x + 0, x - 0, x · 1, x / 1; max(x, -inf) and min(x, inf) are
# x also where x is NaN (XLA's max and min propagate NaN)
_UNIT = {"add": (0.0, (0, 1)), "subtract": (0.0, (1,)), "multiply": (1.0, (0, 1)), "divide": (1.0, (1,)),
         "maximum": (-math.inf, (0, 1)), "minimum": (math.inf, (0, 1))}


class Terms:
    """The intern table. `mk` interns exactly; `apply` canonicalises first."""

    def __init__(self, assume: Mapping[str, Interval] | None = None, *, dot_views: bool = False,
                 excess_precision: bool = False) -> None:
        self._table: dict[tuple[Any, ...], Term] = {}
        self.assume = dict(assume or {})  # input name -> inclusive range its values are promised to lie in
        self.dot_views = dot_views  # read a dot's reshaped operands through the reshape (`dots._dot_views`)
        self.excess_precision = excess_precision  # low floats computed in f32, roundings dropped (`precision`)
        self.intervals: dict[int, Interval | None] = {}  # term id -> range (`ranges.interval`'s cache)
        self.notes: set[str] = set()  # what canonical forms assumed (a float sum regrouped): a proof says so
        self._leafless: dict[int, bool] = {}  # term id -> reads no leaf (`leafless`'s cache)
        self._leafless_seen: set[int] = set()  # its keys, as `Term.walk` extends them

    def __len__(self) -> int:
        return len(self._table)

    def mk(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term:
        key = (op, tuple(a.id for a in args), attrs, type)
        t = self._table.get(key)
        if t is None:
            t = Term(len(self._table), op, args, attrs, type)
            self._table[key] = t
        return t

    # -- leaves ---------------------------------------------------------------------------------------
    def leafless(self, t: Term) -> bool:
        """Whether `t` reads no leaf (a parameter, a loop variable, what a permute leaves unsent): it is
        built from constants and iotas. Each term of the table is looked at once, children first."""
        known = self._leafless
        for s in t.walk(self._leafless_seen):
            known[s.id] = s.op not in LEAVES and all(known[a.id] for a in s.args)
        return known[t.id]

    def param(self, index: int, type: TensorType, name: str = "") -> Term:
        t = self.mk("param", (), (("index", index), ("name", name)), type)
        if name in self.assume:
            self.intervals[t.id] = self.assume[name]
        return t

    def fresh(self, label: str, type: TensorType) -> Term:
        """A leaf that equals nothing else (loop variables of an induction step)."""
        return self.mk("var", (), (("label", label),), type)

    def constant(self, lit: Literal, type: TensorType) -> Term:
        if type.rank > 0 and lit.is_splat:
            scalar = Literal(lit.array.reshape(-1)[:1].reshape(()).copy(), lit.dtype)
            s = self.mk("constant", (), (("value", scalar),), TensorType((), type.dtype))
            return self.mk("broadcast_in_dim", (s,), (("broadcast_dimensions", ()),), type)
        return self.mk("constant", (), (("value", lit),), type)

    def scalar(self, value: float, dtype: str) -> Term:
        try:
            holder = np.dtype("float32") if dtype == "bf16" else numpy_dtype(dtype)
        except ValueError:
            holder = np.dtype("float64")
        return self.constant(Literal(np.array(value, dtype=holder), dtype), TensorType((), dtype))

    def splat(self, value: float, type: TensorType) -> Term:
        """`value` everywhere in a tensor of `type` (its scalar, broadcast)."""
        s = self.scalar(value, type.dtype)
        return self.apply("broadcast_in_dim", (s,), (("broadcast_dimensions", ()),), type) if type.rank else s

    # -- canonicalising constructor -----------------------------------------------------------------
    def apply(self, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term:
        if self.excess_precision and (lifted := precision.lifted(self, op, args, attrs, type)) is not None:
            return lifted
        rule = _CANON.get(op)
        if rule is not None:
            out = rule(self, args, dict(attrs), type)
            if out is not None:
                return out
        if op in SHAPE_PRESERVING and args:
            sunk = _sink_movement(self, op, args, attrs, type)
            if sunk is None:
                sunk = slicing.pull_elementwise(self, op, args, attrs, type)
            if sunk is not None:
                return sunk
        if op in _UNIT and len(args) == 2:
            unit, sides = _UNIT[op]
            for side in sides:
                if scalar_value(args[side]) == unit and args[1 - side].type == type:
                    return args[1 - side]
        if op in ("maximum", "minimum") and len(args) == 2 and args[0] is args[1]:
            return args[0]
        if op in COMMUTATIVE and len(args) == 2 and args[0].id > args[1].id:
            args = (args[1], args[0])
        return self.mk(op, args, attrs, type)

    def iota(self, dim: int, type: TensorType) -> Term:
        """An iota in its normal form: a one-dimensional iota broadcast along the other dims (so that it
        factors through elementwise ops like any broadcast)."""
        line = self.mk("iota", (), (("iota_dimension", 0),), TensorType((type.shape[dim],), type.dtype))
        if type.rank == 1:
            return line
        return self.apply("broadcast_in_dim", (line,), (("broadcast_dimensions", (dim,)),), type)

    def _resized_broadcast(self, t: Term, dim: int, out: TensorType) -> Term | None:
        """`t`, a broadcast whose operand does not vary along `dim`, at the size of `out` there."""
        if t.op != "broadcast_in_dim":
            return None
        (src,) = t.args
        dims = tuple(t.attr("broadcast_dimensions"))
        if dim in dims and src.type.shape[dims.index(dim)] != 1:
            return None
        return self.apply("broadcast_in_dim", (src,), (("broadcast_dimensions", dims),), out)

    def untile(self, t: Term, dim: int, n: int) -> Term | None:
        """The `s` with `t = tile(s, dim, n)`, read off the forms `tile` builds (a broadcast along `dim`, or a
        broadcast adding a dim of `n` copies before `dim`, merged into it); None for any other term."""
        shape = list(t.type.shape)
        if shape[dim] % n:
            return None
        shape[dim] //= n
        small = TensorType(tuple(shape), t.type.dtype)
        if t.op == "broadcast_in_dim":
            return self._resized_broadcast(t, dim, small)
        wide = (*small.shape[:dim], n, *small.shape[dim:])
        if t.op != "reshape" or t.args[0].op != "broadcast_in_dim" or t.args[0].type.shape != wide:
            return None
        (src,) = t.args[0].args
        dims = tuple(t.args[0].attr("broadcast_dimensions"))
        if dim in dims:
            return None  # the copies' dim comes from the operand: not copies
        kept = tuple(i if i < dim else i - 1 for i in dims)
        return self.apply("broadcast_in_dim", (src,), (("broadcast_dimensions", kept),), small)

    def tile(self, t: Term, dim: int, n: int) -> Term:
        """The global tensor made of `n` copies of `t` along `dim` (what a replicated local value is,
        seen as the shard of a tensor split over an axis of size `n`)."""
        if n == 1:
            return t
        shape = list(t.type.shape)
        shape[dim] *= n
        out = TensorType(tuple(shape), t.type.dtype)
        if (copies := self._resized_broadcast(t, dim, out)) is not None:
            return copies
        if t.op == "reshape" and t.type.shape[dim] == 1:
            (src,) = t.args
            kept = [i for i, m in enumerate(t.type.shape) if m != 1]
            core = tuple(m for m in src.type.shape if m != 1)
            if core == tuple(t.type.shape[i] for i in kept):
                # A reshape that only inserts unit dims is a broadcast; tiled along a unit dim it stays one.
                squeezed = self.apply("reshape", (src,), (), TensorType(core, src.type.dtype))
                return self.apply("broadcast_in_dim", (squeezed,), (("broadcast_dimensions", tuple(kept)),), out)
        # Otherwise as `jnp.tile` spells it: a broadcast adding a dim of `n` copies just before `dim`,
        # merged into it by a reshape (the copies major). One form with the reference's, and a data
        # movement every normal form sees through, where an opaque `tile` node would be neither.
        wide = TensorType((*t.type.shape[:dim], n, *t.type.shape[dim:]), t.type.dtype)
        where = tuple(i if i < dim else i + 1 for i in range(t.type.rank))
        copies = self.apply("broadcast_in_dim", (t,), (("broadcast_dimensions", where),), wide)
        return self.apply("reshape", (copies,), (), out)


def _transpose(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    if scalar_value(x) is not None:
        return resplat(terms, x, type.shape)  # a transposed splat is a splat
    if x.op == "broadcast_in_dim":
        # A transposed broadcast is a broadcast (of the operand transposed where its dims change order).
        perm = tuple(a["permutation"])
        at = [perm.index(d) for d in x.attr("broadcast_dimensions")]
        order = sorted(range(len(at)), key=at.__getitem__)
        y = x.args[0]
        if order != list(range(len(at))):
            y = terms.apply("transpose", (y,), (("permutation", tuple(order)),),
                            TensorType(tuple(y.type.shape[i] for i in order), y.type.dtype))
        return terms.apply("broadcast_in_dim", (y,), (("broadcast_dimensions", tuple(sorted(at))),), type)
    return normalize(terms, "transpose", x, a, type)


def _reshape(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    if x.type.shape == type.shape:
        return x
    if scalar_value(x) is not None:
        return resplat(terms, x, type.shape)  # a reshaped splat is a splat
    if x.op == "broadcast_in_dim" and 1 in x.type.shape:
        # Unit dims a broadcast adds carry nothing the reshape keeps: `jnp.tile(x, (1, 2))` broadcasts to
        # [1, m, 2, n] first, a tiling built dim by dim to [m, 2, n]; both are one term without them.
        dims = tuple(x.attr("broadcast_dimensions"))
        units = [i for i, n in enumerate(x.type.shape) if n == 1 and i not in dims]
        if units:
            return terms.apply("reshape", (without_new_dims(terms, x, units),), (), type)
    if x.op == "broadcast_in_dim" and (merged := _merge_new_dims(terms, x, type)) is not None:
        return merged
    if x.op == "broadcast_in_dim":
        through = _reshape_through_broadcast(terms, x, type)
        if through is not None:
            return through
    return reshape_outward(terms, x, type) or normalize(terms, "reshape", x, a, type)


def _merge_new_dims(terms: Terms, x: Term, type: TensorType) -> Term | None:
    """reshape(broadcast(y)) with neighbouring new dims that the reshape merges: the broadcast adds them as
    one dim (`jnp.repeat` of k heads by r, and the same repeat done as r/n per device and tiled over n, are
    then one term). Exact: a row-major reshape does not see how a run of dims it merges was cut."""
    groups = reshape_groups(x.type.shape, type.shape)
    if groups is None:
        return None
    dims = tuple(x.attr("broadcast_dimensions"))
    group_of = {d: g for g, (src, _) in enumerate(groups) for d in src}
    shape: list[int] = []
    at: dict[int, int] = {}  # old dim -> its dim in the merged broadcast
    prev: tuple[int, bool] | None = None  # (group, new?) of the previous dim
    for d, n in enumerate(x.type.shape):
        here = (group_of.get(d, -1), d not in dims)
        if here[1] and prev == here and here[0] >= 0:
            shape[-1] *= n
        else:
            at[d] = len(shape)
            shape.append(n)
        prev = here
    if len(shape) == x.type.rank:
        return None
    inner = terms.apply("broadcast_in_dim", x.args, (("broadcast_dimensions", tuple(at[d] for d in dims)),),
                        TensorType(tuple(shape), x.type.dtype))
    return terms.apply("reshape", (inner,), (), type)


def _reshape_through_broadcast(terms: Terms, x: Term, type: TensorType) -> Term | None:
    """reshape(broadcast(y)) where every run of dims the reshape maps onto each other is all y's or all
    new ones: the broadcast of y reshaped (a row statistic flattened and broadcast, then bitcast back to
    rows, as XLA writes it, is the statistic broadcast along the rows)."""
    (y,) = x.args
    dims = tuple(x.attr("broadcast_dimensions"))
    groups = reshape_groups(x.type.shape, type.shape)
    if groups is None or list(dims) != sorted(dims) or any(
            y.type.shape[i] != x.type.shape[d] for i, d in enumerate(dims)):
        return None
    shape: list[int] = []
    new_dims: list[int] = []
    for src, dst in groups:
        kinds = {d in dims for d in src}
        if len(kinds) != 1:
            return None
        if kinds.pop():
            shape += [type.shape[j] for j in dst]
            new_dims += dst
    inner = terms.apply("reshape", (y,), (), TensorType(tuple(shape), y.type.dtype))
    return terms.apply("broadcast_in_dim", (inner,), (("broadcast_dimensions", tuple(new_dims)),), type)


def _select(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    pred, on_true, on_false = args
    chosen = ranges.bool_value(pred)
    if chosen is not None and on_true.type == on_false.type == type:
        return on_true if chosen else on_false
    if type.dtype == "i1" and scalar_value(on_true) == 1.0 and scalar_value(on_false) == 0.0 and pred.type == type:
        return pred  # select(p, true, false) is p
    if on_true is on_false:
        return on_true
    return padding.masked_pad(on_true, on_false, pred) or padding.masked_window(terms, pred, on_true, on_false)


def _negate(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    if not type.dtype.startswith(("f", "bf")):
        return None
    # -x is x · (-1): one form for the scalings XLA's simplifier moves around (exact).
    return terms.apply("multiply", (x, terms.splat(-1.0, type)), (), type)


def _convert(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    if x.type.dtype == type.dtype:
        return x
    if x.op == "convert" and x.args[0].type.dtype == type.dtype and precision.widens(type.dtype, x.type.dtype):
        return x.args[0]  # widened and rounded back: itself
    if (terms.excess_precision and x.op == "convert" and x.args[0].type.dtype == type.dtype
            and x.type.dtype in LOW_FLOATS and type.dtype in ("f32", "f64")):
        return x.args[0]  # rounded and widened back: the rounding dropped
    # A splat converted to a dtype that holds its value exactly is that splat (`jnp.pad(x, 1)` pads with the
    # int 0 converted, a partitioner with 0.0): exact, dtype-checked folding.
    v = scalar_value(x)
    to_float = type.dtype in LOW_FLOATS or type.dtype in ("f32", "f64")
    to_int = type.dtype[:1] in ("i", "u") and type.dtype != "i1"
    if v is not None and v == v and (to_float or (to_int and float(v).is_integer())) and arith.is_exact(v, type.dtype):
        return terms.splat(v, type)
    return precision.narrowed(terms, x, type)


def _broadcast(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    dims = tuple(a["broadcast_dimensions"])
    if x.type.shape == type.shape and dims == tuple(range(len(dims))):
        return x
    if scalar_value(x) is not None:
        while x.op == "broadcast_in_dim":
            x = x.args[0]
        if x.type.rank == 0:  # a splat's one form: its scalar broadcast
            return terms.mk("broadcast_in_dim", (x,), (("broadcast_dimensions", ()),), type)
    expanded = [i for i, d in enumerate(dims) if x.type.shape[i] == 1]
    if expanded and x.type.rank > 0:
        # An operand's unit dim, stretched or not, carries nothing: broadcast the operand without it
        # (JAX broadcasts [b, s, 1] against [b, s, d]; XLA reshapes to [b, s] first).
        keep = [i for i in range(len(dims)) if i not in expanded]
        squeezed = terms.apply("reshape", (x,), (), TensorType(tuple(x.type.shape[i] for i in keep), x.type.dtype))
        return terms.apply("broadcast_in_dim", (squeezed,), (("broadcast_dimensions", tuple(dims[i] for i in keep)),),
                           type)
    if (list(dims) == sorted(dims) and all(type.shape[d] == n for d, n in zip(dims, x.type.shape, strict=True))
            and all(n == 1 for j, n in enumerate(type.shape) if j not in dims)):
        # Only unit dims are added (`x[:, None]`, keepdims): JAX spells it broadcast, XLA reshape.
        return terms.apply("reshape", (x,), (), type)
    if x.op == "broadcast_in_dim":
        inner = tuple(x.attr("broadcast_dimensions"))
        composed = tuple(dims[i] for i in inner)
        return terms.mk("broadcast_in_dim", x.args, (("broadcast_dimensions", composed),), type)
    return None


def _convolution(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """A convolution with no spatial dims and no groups is a matrix product (`conv_general_dilated` with
    dimension numbers ("NC", "IO", "NC")): one spelling for both."""
    dn = a.get("dimension_numbers")
    if (not isinstance(dn, ConvDims) or dn.input_spatial or a.get("feature_group_count", 1) != 1
            or a.get("batch_group_count", 1) != 1):
        return None
    lhs, rhs = args
    n, o = lhs.type.shape[dn.input_batch], rhs.type.shape[dn.kernel_output_feature]
    dot = terms.apply("dot_general", args, (
        ("dot_dimension_numbers", DotDims((), (), (dn.input_feature,), (dn.kernel_input_feature,))),),
        TensorType((n, o), type.dtype))
    if dn.output_batch == 0:
        return dot
    return terms.apply("transpose", (dot,), (("permutation", (1, 0)),), type)


def _constant(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return terms.constant(a["value"], type)


def _identity(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return args[0] if len(args) == 1 and args[0].type == type else None


def _slice(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    if x.type.shape == type.shape:
        return x
    strides = tuple(a.get("strides") or (1,) * type.rank)
    if x.op == "slice" and all(s == 1 for s in (*strides, *(x.attr("strides") or ()))):
        # a slice of a slice is one slice (a block of a block of a pipeline's weights)
        base = tuple(x.attr("start_indices"))
        lo = tuple(b + s for b, s in zip(base, a["start_indices"], strict=True))
        hi = tuple(b + s for b, s in zip(base, a["limit_indices"], strict=True))
        return slicing.slice_of(terms, x.args[0], lo, hi)
    if all(s == 1 for s in strides):
        lo, hi = tuple(a["start_indices"]), tuple(a["limit_indices"])
        if x.op == "concatenate":
            return slicing.slice_of_concatenate(terms, x, lo, hi)
        return (padding.slice_of_pad(terms, x, lo, hi) or slicing.slice_of_tile(terms, x, lo, hi)
                or padding.slice_of_broadcast(terms, x, lo, hi) or padding.slice_of_scatter(terms, x, lo, hi)
                or padding.through_pad(terms, x, lo, hi))
    return None


def _pad(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """A pad of nothing (no edge or interior padding, as a sliced pad may become) is its operand."""
    pads = (*a["edge_padding_low"], *a["edge_padding_high"], *a["interior_padding"])
    return args[0] if not any(pads) else None


def _reverse(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """Reverses in one normal form: unit dims dropped from the set, two reverses one (dims of both, less the
    dims reversed twice), and a reverse of whole reshape groups (all the dims a reshape made of some operand
    dims) is the reverse of those operand dims, reshaped: a block order and the rows within the blocks both
    reversed, as a partitioner does a split dim's `jnp.flip`, is the reverse of the dim."""
    (x,) = args
    dims = tuple(sorted(d for d in a.get("dimensions") or () if type.shape[d] != 1))
    if x.op == "reverse":
        dims = tuple(sorted(set(dims) ^ set(x.attr("dimensions"))))
        x = x.args[0]
    if not dims:
        return x
    if x.op == "reshape" and (groups := reshape_groups(x.args[0].type.shape, type.shape)) is not None:
        chosen = [g for g in groups if set(g[1]) <= set(dims)]
        if all(set(g[1]).isdisjoint(dims) or g in chosen for g in groups):
            (y,) = x.args
            inner_dims = tuple(sorted(d for g in chosen for d in g[0]))
            inner = terms.apply("reverse", (y,), (("dimensions", inner_dims),), y.type)
            return terms.apply("reshape", (inner,), (), type)
    if dims != tuple(a.get("dimensions") or ()) or args[0] is not x:
        return terms.apply("reverse", (x,), (("dimensions", dims),), type)
    return None


def _compare(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    # JAX spells the comparison type, XLA leaves out the default one: drop it only when it is the default
    # for the operands' element type (comparing unsigned values as SIGNED is another comparison).
    kind = a.get("compare_type")
    dtype = args[0].type.dtype
    default = "FLOAT" if dtype.startswith(("f", "bf")) else "UNSIGNED" if dtype.startswith(("ui", "i1")) else "SIGNED"
    if kind is not None and kind != default:
        return None
    unwidened = precision.unwidened(terms, "compare", args, tuple(a.items()), type)
    if unwidened is not None:
        return unwidened
    decided = ranges.fold_compare(terms, args, a["comparison_direction"], type)
    if decided is not None:
        return decided
    if dtype == "i1" and a["comparison_direction"] in ("EQ", "NE") and (flag := scalar_value(args[1])) is not None:
        # A boolean compared with a constant is itself or its negation (`jnp.asarray(p) != False`).
        same = (flag != 0) == (a["comparison_direction"] == "EQ")
        return args[0] if same else terms.apply("not", (args[0],), (), type)
    attrs = (("comparison_direction", a["comparison_direction"]),)
    # Like every elementwise op, broadcasts go outermost: a causal mask built at batch 1 and broadcast
    # (the partitioner's) and one built from iotas broadcast over the batch (the reference's) are one term.
    sunk = _sink_movement(terms, "compare", args, attrs, type)
    return sunk if sunk is not None else terms.mk("compare", args, attrs, type)


def _sink_movement(terms: Terms, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType) -> Term | None:
    """An elementwise op on equally broadcast (or equally reshaped) operands is the broadcast (reshape)
    of the op on the smaller operands: exact, and the form XLA's reshape mover and algebraic simplifier
    produce. Splat operands follow along at the smaller shape."""
    moved = [a for a in args if a.op in ("broadcast_in_dim", "reshape") and scalar_value(a) is None]
    if not moved:
        return arith.fold_scalars(terms, op, args, attrs, type)
    if all(a.op == "broadcast_in_dim" for a in moved) and len({a.attrs for a in moved}) > 1:
        return _factor_broadcasts(terms, op, args, attrs, type, moved)
    first = moved[0]
    src = first.args[0]
    if any(a.op != first.op or a.attrs != first.attrs or a.args[0].type.shape != src.type.shape for a in moved):
        return None
    if src.type.size >= type.size and first.op == "broadcast_in_dim":
        return None
    inner = peel(terms, args, moved, src.type.shape)
    if inner is None:
        return None
    small = terms.apply(op, inner, attrs, TensorType(src.type.shape, type.dtype))
    return terms.apply(first.op, (small,), first.attrs, type)


def _factor_broadcasts(terms: Terms, op: str, args: tuple[Term, ...], attrs: AttrKey, type: TensorType,
                       moved: list[Term]) -> Term | None:
    """op(bcast(a, dims_a), bcast(b, dims_b)) = bcast(op(bcast(a, ·), bcast(b, ·)) on the dims used, U)
    when the operands use only the dims U of the result: broadcasts go outermost, whatever order XLA's
    simplifier left them in."""
    used = sorted({d for a in moved for d in a.attr("broadcast_dimensions")})
    if len(used) == type.rank:
        return None
    small_shape = tuple(type.shape[d] for d in used)
    inner: list[Term] = []
    for a in args:
        if a in moved:
            dims = tuple(used.index(d) for d in a.attr("broadcast_dimensions"))
            inner.append(terms.apply("broadcast_in_dim", a.args, (("broadcast_dimensions", dims),),
                                     TensorType(small_shape, a.type.dtype)))
            continue
        splat = resplat(terms, a, small_shape)
        if splat is None:
            return None
        inner.append(splat)
    small = terms.apply(op, tuple(inner), attrs, TensorType(small_shape, type.dtype))
    return terms.apply("broadcast_in_dim", (small,), (("broadcast_dimensions", tuple(used)),), type)


def _square(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    (x,) = args
    return terms.apply("multiply", (x, x), (), type)  # chlo.square is x * x, exactly (one rounding either way)


def _fma(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    x, y, z = args  # stablehlo.fma (jax >= 0.12.1) is x * y + z rounded once: equal over the reals
    return terms.apply("add", (terms.apply("multiply", (x, y), (), type), z), (), type)


def _and(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return ranges.fold_logic(terms, "and", args, type)


def _or(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return ranges.fold_logic(terms, "or", args, type)


def _clamp(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return ranges.fold_clamp(terms, args, type)


def _concatenate(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    """n copies of one value side by side are its tiling (`jnp.concatenate([x] * n)`, `jnp.tile(x, n)`
    and a shard_map's out_specs over an axis it is replicated over are one term); else joined slices."""
    d = a.get("dimension")
    if d is not None and len(args) > 1 and all(t is args[0] for t in args) and type.rank > 0:
        return terms.tile(args[0], int(d), len(args))
    return slicing.join_slices(terms, args, a, type)


def _gather(terms: Terms, args: tuple[Term, ...], a: dict[str, Any], type: TensorType) -> Term | None:
    return (topk.merge_indices(terms, args, a, type) or ranges.fold_gather_clamp(terms, args, a, type)
            or ranges.gather_past_pad(terms, args, a, type) or slicing.take_as_concatenate(terms, args, a, type))


_CANON = {
    "add": lambda terms, args, a, type: slicing.sum_of_rolls(terms, args, type),
    "and": _and,
    "broadcast_in_dim": _broadcast,
    "clamp": _clamp,
    "compare": _compare,
    "concatenate": _concatenate,
    "constant": _constant,
    "convert": _convert,
    "convolution": _convolution,
    "copy": _identity,
    "divide": arith.divide,
    "dot": dots.dot,
    "dot_general": dots.dot_general,
    "fma": _fma,
    "gather": _gather,
    "is_finite": lambda terms, args, a, type: precision.unwidened(terms, "is_finite", args, tuple(a.items()), type),
    "multiply": arith.multiply,
    "negate": _negate,
    "optimization_barrier": _identity,
    "or": _or,
    "pad": _pad,
    "reduce": lambda terms, args, a, type: (ranges.fold_reduce_logic(terms, args, a, type)
                                            or topk.merge_argmax(terms, args, a, type)
                                            or reductions.added_units(terms, args, a, type)
                                            or reductions.over_broadcast(terms, args, a, type)
                                            or reductions.over_identity_pad(terms, args, a, type)),
    "reshape": _reshape,
    "reverse": _reverse,
    "scatter": slicing.scatter_window,
    "select": _select,
    "slice": _slice,
    "square": _square,
    "top_k": topk.merge_values,
    "transpose": _transpose,
}
