"""Numeric evaluation of terms: constant folding for index arithmetic, and counterexamples.

A term is evaluated with the interpreter's kernels (`kernels.KERNELS`) on a single device, by dressing
each node as the op it stands for. Used to fold small constant terms (shard-offset tables, iotas) and to
evaluate the two sides of an unproven equality on random inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import UnsupportedError
from .ir import Attrs, Op, Region, TensorType, Value
from .terms import Term

_REDUCER_OPS = {"sum": "add", "max": "maximum", "min": "minimum", "prod": "multiply", "and": "and", "or": "or"}


class NotEvaluable(Exception):
    """A term with a free leaf (a parameter without a value) or an op no kernel covers."""


def _reducer_region(name: str, dtype: str) -> Region:
    t = TensorType((), dtype)
    a, b, r = Value(t, "%a"), Value(t, "%b"), Value(t, "%r")
    return Region((a, b), (Op(_REDUCER_OPS[name], (a, b), (r,)),), (r,))


def as_op(t: Term) -> Op:
    """The op a term node stands for (operands and result typed as the term's globals)."""
    operands = tuple(Value(a.type) for a in t.args)
    attrs = dict(t.attrs)
    regions: tuple[Region, ...] = ()
    computation = attrs.pop("computation", None)
    results: tuple[Value, ...] = (Value(t.type),)
    if t.op == "reduce":
        reducer = attrs.pop("reducer", computation)
        attrs.pop("index", None)
        if isinstance(reducer, tuple):  # a general body, as `semantics.region_key` spelled it
            k = len(t.args) // 2
            regions = (_region_of(reducer[0], [a.type.dtype for a in t.args[:k]] * 2),)
            results = tuple(Value(TensorType(t.type.shape, a.type.dtype)) for a in t.args[:k])
        else:
            regions = (_reducer_region(str(reducer), t.type.dtype),)
    elif isinstance(computation, str) and computation in _REDUCER_OPS:
        regions = (_reducer_region(computation, t.type.dtype),)
    elif computation is not None:
        raise NotEvaluable(f"{t.op} with a general body")
    return Op(t.op, operands, results, Attrs.of(attrs), regions)


def _region_of(key: tuple[Any, ...], arg_types: list[str]) -> Region:
    """The scalar body a `region_key` describes (result types: i1 for comparisons, else the operands')."""
    n_args, items, outs = key
    values = [Value(TensorType((), dtype), f"%a{i}") for i, dtype in enumerate(arg_types[:n_args])]
    ops: list[Op] = []
    for opcode, operands, attrs in items:
        ins = tuple(values[i] for i in operands)
        dtype = "i1" if opcode == "compare" else ins[1 if opcode == "select" else 0].tensor.dtype
        r = Value(TensorType((), dtype))
        ops.append(Op(opcode, ins, (r,), Attrs.of(dict(attrs)), ()))
        values.append(r)
    return Region(tuple(values[:n_args]), tuple(ops), tuple(values[i] for i in outs))


def evaluate(root: Term, env: Mapping[int, np.ndarray]) -> np.ndarray:
    """The value of `root`, with leaves (params, loop variables, shared subterms) taken from `env`."""
    from .kernels import KERNELS
    from .numeric import Machine

    machine = Machine(None, 1)
    values: dict[int, np.ndarray] = {}
    for t in root.walk():
        if t.id in env:
            values[t.id] = np.asarray(env[t.id])[None]
            continue
        args = [values[a.id] for a in t.args]
        if t.op in ("param", "var"):
            raise NotEvaluable(f"free {t.op} {dict(t.attrs)}")
        if t.op == "nothing_received":  # what a collective-permute leaves on a device nobody sends to
            from .parsers.stablehlo import numpy_dtype

            values[t.id] = np.zeros((1, *t.type.shape), dtype=numpy_dtype(t.type.dtype))
            continue
        if t.op == "tile":
            values[t.id] = np.concatenate([args[0]] * int(t.attr("n")), axis=int(t.attr("dim")) + 1)
            continue
        if t.op == "roll":
            values[t.id] = np.roll(args[0], int(t.attr("shift")), axis=int(t.attr("dim")) + 1)
            continue
        kernel = KERNELS.get(t.op)
        if kernel is None:
            raise NotEvaluable(f"no kernel for {t.op}")
        outs = kernel(machine, as_op(t), list[Any](args))
        values[t.id] = np.asarray(outs[int(t.attr("index", 0)) if len(outs) > 1 else 0])
    return values[root.id][0]


def evaluate_constant(t: Term) -> np.ndarray | None:
    try:
        return evaluate(t, {})
    except NotEvaluable:
        return None
    except (ValueError, TypeError, IndexError, KeyError, NotImplementedError, UnsupportedError):
        return None
