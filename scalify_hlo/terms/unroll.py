"""A reference loop of a few iterations, unrolled in the blockwise normal form.

`lax.map(f, x)` lowers to a while loop that slices row `i` of `x`, applies `f` and writes the result into
row `i` of a buffer. Under shard_map each device maps over its own rows: a loop of one iteration, which the
after side unrolls (`derive.unrolled`), against the reference's loop over all rows. A loop term whose
condition is decided at every step (a counter from a constant against a constant bound) is its bodies
applied in turn, the loop's variables replaced by the values they take: exactly what running it does, so
the rows of the reference meet the devices' rows (the buffer writes become concatenates: `slicing`).
"""

from __future__ import annotations

from collections.abc import Callable

from scalify_hlo.terms.ranges import bool_value
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

TRIPS = 16  # iterations unrolled at most; a longer loop stays a loop
NODES = 20_000  # terms rebuilt per loop at most


def unrolled(terms: Terms, loop: Term, normal: Callable[[Term], Term]) -> Term | None:
    """The value of `loop` (a `loop` term, see `derive.loop_term`) with its iterations unrolled, each
    step's values put in `normal` form (which must fold the condition to a constant); None when a condition
    is not decided or the loop runs longer than the limits above."""
    n = int(loop.attr("carried"))
    inits, names, cond, bodies = loop.args[:n], loop.args[n:2 * n], loop.args[2 * n], loop.args[2 * n + 1:]
    values = tuple(inits)
    budget = [NODES]
    for _ in range(TRIPS + 1):
        env = {v.id: x for v, x in zip(names, values, strict=True)}
        test = bool_value(normal(_substituted(terms, cond, env, {}, budget)))
        if test is None or budget[0] < 0:
            return None
        if not test:
            return values[int(loop.attr("index"))]
        memo: dict[int, Term] = {}
        values = tuple(normal(_substituted(terms, b, env, memo, budget)) for b in bodies)
    return None


def _substituted(terms: Terms, t: Term, env: dict[int, Term], memo: dict[int, Term], budget: list[int]) -> Term:
    """`t` with the variables in `env` replaced, rebuilt through `Terms.apply` (its canonical forms)."""
    if t.id in env:
        return env[t.id]
    if not t.args:
        return t
    hit = memo.get(t.id)
    if hit is not None:
        return hit
    budget[0] -= 1
    if budget[0] < 0:
        return t
    args = tuple(_substituted(terms, a, env, memo, budget) for a in t.args)
    out = t if all(a is b for a, b in zip(args, t.args, strict=True)) else terms.apply(t.op, args, t.attrs, t.type)
    memo[t.id] = out
    return out
