"""Numeric evaluation of terms: constant folding for index arithmetic, and counterexamples.

A term is evaluated with the interpreter's kernels (`numeric.kernels`) on a single device, by dressing
each node as the op it stands for. Used to fold small constant terms (shard-offset tables, iotas) and to
evaluate the two sides of an unproven equality on random inputs. A `loop` term (`derive.loop_term`) runs
its iterations, its condition and bodies evaluated with its variables bound, within a budget of iterations
(folding runs none). A `case` term (`prove.branches`) evaluates its branches and picks the index's.
"""

from __future__ import annotations

from collections.abc import Container, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.errors import UnsupportedError
from scalify_hlo.ir.nodes import Attrs, Literal, Op, Region, TensorType, Value
from scalify_hlo.numeric.kernels import kernel_of
from scalify_hlo.numeric.machine import Machine
from scalify_hlo.ops.reducers import ARG_REDUCERS, OP_OF_REDUCER, arg_reducer_region
from scalify_hlo.terms.term import Term, scalar_exact

_REDUCER_OPS = {r.value: op for r, op in OP_OF_REDUCER.items()}  # a term names its reducer by value


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
        if reducer in ARG_REDUCERS:  # JAX's argmax/argmin comparator of (values, indices)
            regions = (arg_reducer_region(str(reducer), t.args[0].type.dtype, t.args[1].type.dtype),)
            results = tuple(Value(TensorType(t.type.shape, a.type.dtype)) for a in t.args[:2])
        elif isinstance(reducer, tuple):  # a general body, as `semantics.region_key` spelled it
            k = len(t.args) // 2
            regions = (_region_of(reducer[0], [a.type.dtype for a in t.args[:k]] * 2),)
            results = tuple(Value(TensorType(t.type.shape, a.type.dtype)) for a in t.args[:k])
        else:
            regions = (_reducer_region(str(reducer), t.type.dtype),)
    elif t.op == "sort" and isinstance(computation, tuple):  # a comparator of (lhs, rhs) per operand
        attrs.pop("index", None)
        regions = (_region_of(computation[0], [a.type.dtype for a in t.args for _ in (0, 1)]),)
        results = tuple(Value(TensorType(t.type.shape, a.type.dtype)) for a in t.args)
    elif t.op == "top_k":  # (values, indices); the values do not depend on the indices' dtype
        index = int(attrs.pop("index", 0))
        results = (Value(TensorType(t.type.shape, t.args[0].type.dtype)),
                   Value(TensorType(t.type.shape, t.type.dtype if index == 1 else "i32")))
    elif "result_types" in attrs:  # one result of a multi-result op (rules/linalg.py): all of them, typed
        results = tuple(Value(TensorType(tuple(s), str(d))) for s, d in attrs.pop("result_types"))
    elif isinstance(computation, str) and computation in _REDUCER_OPS:
        regions = (_reducer_region(computation, t.type.dtype),)
    elif computation is not None:
        raise NotEvaluable(f"{t.op} with a general body")
    return Op(t.op, operands, results, Attrs.of(attrs), regions)


# Body ops whose result has the first operand's dtype (select: the second's; compare: i1).
_SAME_DTYPE = frozenset({"compare", "select", "and", "or", "xor", "not", "add", "subtract", "multiply", "divide",
                         "maximum", "minimum", "negate", "abs"})


def _region_of(key: tuple[Any, ...], arg_types: list[str]) -> Region:
    """The scalar body a `region_key` describes (result types: i1 for comparisons, else the operands')."""
    n_args, items, outs = key
    values = [Value(TensorType((), dtype), f"%a{i}") for i, dtype in enumerate(arg_types[:n_args])]
    ops: list[Op] = []
    for opcode, operands, attrs in items:
        ins = tuple(values[i] for i in operands)
        literal = dict(attrs).get("value")
        if opcode == "constant" and isinstance(literal, Literal):
            dtype = literal.dtype
        elif opcode in _SAME_DTYPE and ins:
            dtype = "i1" if opcode == "compare" else ins[1 if opcode == "select" else 0].tensor.dtype
        else:  # the result dtype is not read off the key
            raise NotEvaluable(f"a body with {opcode}")
        r = Value(TensorType((), dtype))
        ops.append(Op(opcode, ins, (r,), Attrs.of(dict(attrs)), ()))
        values.append(r)
    return Region(tuple(values[:n_args]), tuple(ops), tuple(values[i] for i in outs))


LOOP_TRIPS = 1 << 14  # iterations of `loop` terms (nested ones included) one evaluation may run


def evaluate(root: Term, env: Mapping[int, np.ndarray], max_trips: int = LOOP_TRIPS) -> np.ndarray:
    """The value of `root`, with leaves (params, loop variables, shared subterms) taken from `env`. A
    `loop` term runs its iterations (at most `max_trips` in all, else NotEvaluable)."""
    run = _Evaluation({k: np.asarray(v)[None] for k, v in env.items()}, max_trips)
    return run.values([root], {})[0][0]


class _Evaluation:
    def __init__(self, env: dict[int, np.ndarray], max_trips: int) -> None:
        self.machine = Machine(None, 1)
        self.trips = max_trips
        self.ops: dict[int, Op] = {}  # term id -> the op it stands for (a loop body runs its terms again)
        # Values of the leaves given and of the terms without variables: the same in every iteration of
        # every loop, computed once.
        self.fixed = env
        self.totals: dict[int, int | None] = {}  # loop term id -> `_total_trips`

    def values(self, roots: Sequence[Term], bound: Mapping[int, np.ndarray]) -> list[np.ndarray]:
        """The roots' values (leading device axis of 1) where the loop variables in `bound` have the given
        values."""
        values: dict[int, np.ndarray] = {}
        runs: dict[tuple[int, ...], list[np.ndarray]] = {}  # the results of each loop run here, by its args
        for t in _walk_scope(roots, bound, self.fixed):
            if t.id in bound:
                values[t.id] = bound[t.id]
            elif t.id in self.fixed:
                values[t.id] = self.fixed[t.id]
            elif t.op == "loop":
                key = tuple(a.id for a in t.args)
                if key not in runs:
                    runs[key] = self._loop(t, values, bound)
                values[t.id] = runs[key][int(t.attr("index"))]
            else:
                values[t.id] = self._node(t, [values[a.id] for a in t.args])
                if all(a.id in self.fixed for a in t.args):
                    self.fixed[t.id] = values[t.id]
        return [values[r.id] for r in roots]

    def _loop(self, t: Term, values: Mapping[int, np.ndarray], bound: Mapping[int, np.ndarray]
              ) -> list[np.ndarray]:
        """`loop(inits, vars, cond, bodies)` (`derive.loop_term`): the variables' values when `cond` fails."""
        n = int(t.attr("carried"))
        loop_vars, cond, bodies = t.args[n:2 * n], t.args[2 * n], t.args[2 * n + 1:]
        if t.id not in self.totals:
            self.totals[t.id] = _total_trips(t)
        total = self.totals[t.id]
        if total is not None and total > self.trips:  # a nest plainly too long: say so before running it
            raise NotEvaluable(f"loops that run {total} iterations")
        state = [values[a.id] for a in t.args[:n]]
        while True:
            inner = {**bound, **{v.id: x for v, x in zip(loop_vars, state, strict=True)}}
            if not bool(np.asarray(self.values([cond], inner)[0]).reshape(-1)[0]):
                return state
            if self.trips <= 0:
                raise NotEvaluable("a loop that runs longer than the evaluation may")
            self.trips -= 1
            state = self.values(bodies, inner)

    def _node(self, t: Term, args: list[np.ndarray]) -> np.ndarray:
        if t.op in ("param", "var"):
            raise NotEvaluable(f"free {t.op} {dict(t.attrs)}")
        if t.op == "nothing_received":  # what a collective-permute leaves on a device nobody sends to
            return np.zeros((1, *t.type.shape), dtype=numpy_dtype(t.type.dtype))
        if t.op == "tile":
            return np.concatenate([args[0]] * int(t.attr("n")), axis=int(t.attr("dim")) + 1)
        if t.op == "roll":
            return np.roll(args[0], int(t.attr("shift")), axis=int(t.attr("dim")) + 1)
        if t.op == "case":  # `branches.conditional`: case(index, b_0, ..., b_n), the last branch when out of range
            k = int(np.asarray(args[0]).reshape(-1)[0])
            n = len(args) - 1
            return args[1 + (k if 0 <= k < n else n - 1)]
        kernel = kernel_of(t.op)
        if kernel is None:
            raise NotEvaluable(f"no kernel for {t.op}")
        op = self.ops.get(t.id)
        if op is None:
            op = self.ops[t.id] = as_op(t)
        outs = kernel(self.machine, op, list[Any](args))
        return np.asarray(outs[int(t.attr("index", 0)) if len(outs) > 1 else 0])


def _total_trips(t: Term) -> int | None:
    """The iterations a `loop` term runs, the loops in its body included, when every one is a counted
    loop (`fori_loop`: `i < n`, `i + step`, from a constant); else None."""
    n = int(t.attr("carried"))
    loop_vars, cond, bodies = t.args[n:2 * n], t.args[2 * n], t.args[2 * n + 1:]
    if cond.op != "compare" or cond.attr("comparison_direction") != "LT" or cond.args[0] not in loop_vars:
        return None
    k = loop_vars.index(cond.args[0])
    body = bodies[k]
    if body.op != "add" or loop_vars[k] not in body.args:
        return None
    step = scalar_exact(body.args[1] if body.args[0] is loop_vars[k] else body.args[0])
    lo, hi = scalar_exact(t.args[k]), scalar_exact(cond.args[1])
    if not isinstance(step, int) or not isinstance(lo, int) or not isinstance(hi, int) or step <= 0:
        return None
    trips = max(0, -(-(hi - lo) // step))
    inner = 0
    seen: set[int] = set()
    stack = [cond, *bodies]
    while stack:
        u = stack.pop()
        if u.id in seen:
            continue
        seen.add(u.id)
        if u.op == "loop":
            count = _total_trips(u)
            if count is None:
                return None
            inner += count
            stack.extend(u.args[:int(u.attr("carried"))])
        else:
            stack.extend(u.args)
    return trips * (1 + inner)


def _walk_scope(roots: Sequence[Term], bound: Container[int], known: Container[int]) -> Iterator[Term]:
    """Every subterm of the roots, children first, except below a bound or known term and inside a
    loop's variables, condition and bodies (evaluated per iteration, with the variables bound)."""
    seen: set[int] = set()
    for root in roots:
        stack: list[tuple[Term, bool]] = [(root, False)]
        while stack:
            t, expanded = stack.pop()
            if t.id in seen:
                continue
            if expanded or t.id in bound or t.id in known:
                seen.add(t.id)
                yield t
                continue
            stack.append((t, True))
            args = t.args[:int(t.attr("carried"))] if t.op == "loop" else t.args
            stack.extend((a, False) for a in reversed(args) if a.id not in seen)


def evaluate_constant(t: Term) -> np.ndarray | None:
    try:
        return evaluate(t, {}, max_trips=0)  # folding never runs loops
    except NotEvaluable:
        return None
    except (ValueError, TypeError, IndexError, KeyError, NotImplementedError, UnsupportedError):
        return None
