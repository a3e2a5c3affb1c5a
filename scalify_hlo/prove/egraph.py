"""Equality of terms by equality saturation in egglog, one small e-graph per question.

The rulesets (`rules/algebra.py`) are declared once in a template e-graph; each question pushes a
scope, feeds the two term DAGs through the low-level `egglog.bindings` (one batch of `let` actions: the
high-level `register` costs milliseconds per expression, DESIGN §4), saturates within a budget,
compares the e-classes and pops. Subterms both sides share are fed as opaque leaves: they are equal by
construction and the rules need not look inside them. Finite float constants are fed as their exact
rationals (`RConst`), and each op homogeneous in an argument (`algebra.HOMOGENEOUS`) with the fact saying so.

Before any e-graph is built, a pair whose sides differ in what no rewrite changes (`Heads`: the opaque leaves
and the generic ops) is answered "not proven" outright: the answer saturation would give, whatever the
budget, at the price of one walk. A derivation that stays out of step (a difference the rules do not model)
asks at every later value; those questions stop there instead of saturating ever larger regions.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import egglog
import egglog.bindings as bindings

from scalify_hlo.ir.nodes import Literal
from scalify_hlo.rules import algebra
from scalify_hlo.terms.term import Term, scalar_exact

_SPAN = bindings.RustSpan("scalify", 0, 0)


@dataclass(frozen=True, slots=True)
class Budget:
    iterations: int = 12
    nodes: int = 50_000
    seconds: float = 5.0


@dataclass(frozen=True, slots=True)
class Deadline:
    """The end of a whole run's time (`Options.time_limit`): past it no e-graph is built and no op is read
    (`Deriver.op`), so a run that cannot finish ends `unknown` at the first value left unread."""

    at: float  # time.perf_counter() value
    seconds: float  # the limit it was made from, for messages

    def passed(self) -> bool:
        return time.perf_counter() > self.at

    @property
    def reason(self) -> str:
        return f"the run's time limit ({self.seconds:g} s) ran out: raise --time-limit"


@dataclass
class Stats:
    questions: int = 0
    egraph_calls: int = 0
    memo_hits: int = 0
    nodes_fed: int = 0
    max_nodes: int = 0
    seconds: float = 0.0
    exhausted: int = 0
    exhausted_nodes: int = 0  # e-nodes reached by the first question whose budget ran out
    ruled_out: int = 0  # questions answered "not provable" by `Heads`, without an e-graph


def _lit(v: Any) -> Any:
    if isinstance(v, bool):
        return bindings.Lit(_SPAN, bindings.Bool(v))
    if isinstance(v, int):
        return bindings.Lit(_SPAN, bindings.Int(v))
    if isinstance(v, float):
        return bindings.Lit(_SPAN, bindings.Float(v))
    return bindings.Lit(_SPAN, bindings.String(str(v)))


def _splat(v: int | float | complex, t: Term) -> Any:
    return _call("Splat", _lit(algebra.exact_text(v)), _lit(type_text(t)))


def _rational(v: int | float | complex, t: Term) -> tuple[int, int] | None:
    """A float constant's exact value as numerator and denominator, when the real domain computes with it:
    finite, and not -0.0 (a zero whose sign shows, 1/-0.0 = -inf: left opaque)."""
    if algebra.domain_of(t.type.dtype) != "real" or not isinstance(v, float) or not math.isfinite(v):
        return None
    if v == 0.0 and math.copysign(1.0, v) < 0:
        return None
    return v.as_integer_ratio()


def _constant(v: int | float | complex, t: Term) -> Any:
    q = _rational(v, t)
    if q is None:
        return _splat(v, t)
    big = [_call("from-string", _lit(str(n))) for n in q]
    return _call("RConst", _call("bigrat", *big), _lit(type_text(t)))


def _typed(t: Term) -> str | None:
    """The domain's own constructor for +, −, ×, ÷, negation (None: the op stays opaque)."""
    domain = algebra.domain_of(t.type.dtype)
    if domain is None or len(t.args) != (1 if t.op == "negate" else 2):
        return None
    if any(a.type.dtype != t.type.dtype for a in t.args):
        return None
    return algebra.TYPED[domain].get(t.op)


def _negated(v: int | float | complex, dtype: str) -> int | float | None:
    """`-v` in `dtype`: exact for floats, two's complement (wrapping) for integers."""
    if isinstance(v, float):
        return -v
    if not isinstance(v, int):
        return None
    bits = int("".join(ch for ch in dtype if ch.isdigit()) or 0)
    if not bits:
        return None
    wrapped = (-v) % (1 << bits)
    if dtype.startswith("i") and wrapped >= 1 << (bits - 1):
        wrapped -= 1 << bits
    return wrapped


def _call(f: str, *args: Any) -> Any:
    return bindings.Call(_SPAN, f, list(args))


def _var(i: int) -> Any:
    return bindings.Var(_SPAN, f"$t{i}")


def type_text(t: Term) -> str:
    return f"{t.type.dtype}[{','.join(map(str, t.type.shape))}]"


def attr_text(attrs: Iterable[tuple[str, Any]]) -> str:
    """Attributes as a canonical string; literals by content hash (their repr elides values)."""
    parts = []
    for k, v in attrs:
        if isinstance(v, Literal):
            digest = hashlib.sha1(v.array.tobytes() + str(v.array.shape).encode()).hexdigest()[:16]
            v = f"lit:{v.dtype}:{digest}"
        parts.append(f"{k}={v!r}")
    return ";".join(parts)


class EGraph:
    """The template e-graph (rules declared once) and the questions asked of it."""

    def __init__(self, budget: Budget | None = None, deadline: Deadline | None = None) -> None:
        self.budget = budget or Budget()
        self.deadline = deadline
        self.stats = Stats()
        high = egglog.EGraph()
        high.register(*algebra.declare_all())
        for rs in self._rulesets():  # registers each ruleset's rules
            high.run(rs.saturate())
        self._high = high  # keeps the declarations alive
        self.raw = high._egraph
        self._schedule_text = self._make_schedule()
        self._memo: dict[tuple[Any, ...], tuple[bool, ...]] = {}
        self._parsed_schedule: list[Any] | None = None

    @staticmethod
    def _rulesets() -> tuple[egglog.Ruleset, ...]:
        return (*algebra.RULESETS.values(), algebra.folds, algebra.linear, algebra.tripwires)

    def _make_schedule(self) -> str:
        trip = str(algebra.tripwires.ident)
        rules = " ".join(f"(run {rs.ident})" for rs in self._rulesets() if rs is not algebra.tripwires)
        return f"(run-schedule (saturate (run {trip})) {rules} (saturate (run {trip})))"

    # -- feeding terms -------------------------------------------------------------------------------------
    def _node(self, t: Term, leaves: frozenset[int]) -> Any:
        if t.id in leaves:
            return _call("Leaf", _lit(t.id))
        v = scalar_exact(t) if t.op in ("constant", "broadcast_in_dim") else None
        if v is not None:
            return _constant(v, t)
        args = [_var(a.id) for a in t.args]
        typed = _typed(t)
        if typed is not None:
            return _call(typed, *args)
        head = [_lit(t.op), _lit(type_text(t)), _lit(attr_text(t.attrs))]
        if len(args) <= 3:
            return _call(f"Op{len(args)}", *head, *args)
        return _call("OpN", *head, _call("vec-of", *args))

    def _negations(self, order: Sequence[Term]) -> list[Any]:
        """`-c` is the constant `-c` (computed exactly in the dtype: negation wraps on integers): a fact
        per constant fed as a `Splat`, so the rules that move negations onto constants meet the folded
        spelling (an `RConst` is negated by the folding rules)."""
        out = []
        for t in order:
            v = scalar_exact(t) if t.op in ("constant", "broadcast_in_dim") else None
            domain = algebra.domain_of(t.type.dtype)
            if v is None or domain is None or _rational(v, t) is not None:
                continue
            neg = _negated(v, t.type.dtype)
            if neg is None:
                continue
            lhs = _call(algebra.NEGATE[domain], _splat(v, t))
            out.append(bindings.ActionCommand(bindings.Union(_SPAN, lhs, _splat(neg, t))))
        return out

    def _homogeneous(self, order: Sequence[Term], leaves: frozenset[int]) -> list[Any]:
        """For each op fed whole, the facts saying in which arguments it is homogeneous (the `linear`
        rules move constant factors out through those)."""
        out = []
        for t in order:
            if t.id in leaves or not t.args or _typed(t) is not None:
                continue
            head = (_lit(t.op), _lit(type_text(t)), _lit(attr_text(t.attrs)))
            for h in algebra.homogeneous_args(t.op, t.attrs, tuple(a.type.dtype for a in t.args), t.type.dtype):
                fact = (_call("Homogeneous1", *head) if h.arity == 1
                        else _call("Homogeneous3Zero", *head, _lit(h.arg)) if h.arity == 3
                        else _call("Homogeneous2Zero", *head) if h.zero_other
                        else _call("Homogeneous2", *head, _lit(h.arg)))
                out.append(bindings.ActionCommand(bindings.Expr_(_SPAN, fact)))
        return out

    # -- questions -------------------------------------------------------------------------------------
    def equal(self, pairs: Sequence[tuple[Term, Term]], leaves: frozenset[int],
              key: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None,
              first: bool = False) -> tuple[bool, ...]:
        """For each pair, whether the rules prove both sides equal (leaves are opaque). `first`: the pairs
        are alternatives (candidates for one value), so saturation stops at the first one proven. `key`
        (or a function making it, called only when an e-graph would be built) memoizes the answer."""
        self.stats.questions += 1
        started = time.perf_counter()
        # What saturation could never prove is answered first (`Heads`): most failing questions stop here.
        heads = Heads(leaves)
        open_ = [i for i, (a, b) in enumerate(pairs) if a.id == b.id or heads.of(a) == heads.of(b)]
        if not open_:
            self.stats.ruled_out += 1
            self.stats.seconds += time.perf_counter() - started
            return tuple(False for _ in pairs)
        if callable(key):
            key = key()
        if key is not None and key in self._memo:
            self.stats.memo_hits += 1
            self.stats.seconds += time.perf_counter() - started
            return self._memo[key]
        if self.deadline is not None and self.deadline.passed():
            self.stats.exhausted += 1  # not proven for want of time, as a budget run out
            return tuple(False for _ in pairs)
        answers = [False] * len(pairs)
        self.stats.egraph_calls += 1
        self.raw.run_program(bindings.Push(1))
        try:
            asked = [pairs[i] for i in open_]  # only these are fed: the others cannot meet
            self.stats.nodes_fed += self._feed_pruned([t for pair in asked for t in pair], leaves)
            for i, proven in zip(open_, self._saturate_and_compare(asked, first), strict=True):
                answers[i] = proven
        finally:
            self.raw.run_program(bindings.Pop(_SPAN, 1))
        result = tuple(answers)
        self.stats.seconds += time.perf_counter() - started
        if key is not None:
            self._memo[key] = result
        return result

    def _feed_pruned(self, roots: Sequence[Term], leaves: frozenset[int]) -> int:
        order: list[Term] = []
        seen: set[int] = set()
        stack: list[tuple[Term, bool]] = [(r, False) for r in reversed(roots)]
        while stack:
            t, expanded = stack.pop()
            if t.id in seen:
                continue
            if expanded or t.id in leaves or not t.args or scalar_exact(t) is not None:
                seen.add(t.id)
                order.append(t)
                continue
            stack.append((t, True))
            stack.extend((a, False) for a in reversed(t.args) if a.id not in seen)
        actions = [bindings.ActionCommand(bindings.Let(_SPAN, f"$t{t.id}", self._node(t, leaves))) for t in order]
        self.raw.run_program(*actions, *self._negations(order), *self._homogeneous(order, leaves))
        return len(actions)

    def _saturate_and_compare(self, pairs: Sequence[tuple[Term, Term]], first: bool = False) -> tuple[bool, ...]:
        def same(a: Term, b: Term) -> bool:
            return bool(self.raw.eval_expr(_var(a.id))[1] == self.raw.eval_expr(_var(b.id))[1])

        def finished(done: list[bool]) -> bool:
            return any(done) if first else all(done)

        done = [a.id == b.id or same(a, b) for a, b in pairs]
        if finished(done):
            return tuple(done)
        deadline = time.perf_counter() + self.budget.seconds
        if self.deadline is not None:
            deadline = min(deadline, self.deadline.at)
        schedule = self._schedule()
        saturated = False
        for _ in range(self.budget.iterations):
            reports = self.raw.run_program(*schedule)
            done = [d or same(a, b) for d, (a, b) in zip(done, pairs, strict=True)]
            size = self.size()
            self.stats.max_nodes = max(self.stats.max_nodes, size)
            if finished(done) or not _changed(reports):
                saturated = True
                break
            if time.perf_counter() > deadline or size > self.budget.nodes:
                break
        if not finished(done) and not saturated:
            if not self.stats.exhausted_nodes:
                self.stats.exhausted_nodes = self.size()
            self.stats.exhausted += 1  # a budget ran out: "not proven" may just mean "not yet"
        return tuple(done)

    def _schedule(self) -> list[Any]:
        if self._parsed_schedule is None:
            self._parsed_schedule = self.raw.parse_program(self._schedule_text)
        return self._parsed_schedule

    def size(self) -> int:
        """Rows in every function of the e-graph (e-nodes, roughly)."""
        (report,) = self.raw.run_program(bindings.PrintSize(_SPAN, None))
        assert isinstance(report, bindings.PrintAllFunctionsSize)
        return sum(int(n) for _, n in report.sizes)


class Heads:
    """What no rewrite changes: the opaque leaves and the heads (name, type, attributes) of the generic ops
    in a term, as fed (`EGraph._node`).

    Every rule of `rules/algebra.py` keeps, from its left side to its right, the same pattern variables
    standing for tensors and the same generic heads: only typed arithmetic (+ − × ÷ negation) and
    constants appear or vanish (x·1 = x, x − y = x + (−y), op(c·x) = c·op(x), ...). Congruence and
    hash-consing keep it too, so all terms of one e-class have one set of these, and two terms with
    different sets are never proven equal, whatever the budget: such a question need not be asked
    (`tests/test_rule_validation.py` checks every identity keeps its variables)."""

    def __init__(self, leaves: frozenset[int]) -> None:
        self.leaves = leaves
        self._memo: dict[int, frozenset[Any]] = {}

    def of(self, root: Term) -> frozenset[Any]:
        if root.id in self._memo:
            return self._memo[root.id]
        out: set[Any] = set()
        seen: set[int] = set()
        stack = [root]
        while stack:
            t = stack.pop()
            if t.id in seen:
                continue
            seen.add(t.id)
            if t.id in self.leaves:
                out.add(("leaf", t.id))
            elif t.op in ("constant", "broadcast_in_dim") and scalar_exact(t) is not None:
                continue  # a constant: rules fold, make and drop them
            else:
                if _typed(t) is None:
                    out.add((t.op, type_text(t), attr_text(t.attrs)))
                stack.extend(t.args)
        self._memo[root.id] = result = frozenset(out)
        return result


def _changed(reports: Any) -> bool:
    for r in reports:
        report = getattr(r, "report", None)
        if report is not None and getattr(report, "updated", True):
            return True
    return False
