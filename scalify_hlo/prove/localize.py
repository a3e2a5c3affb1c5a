"""Localisation: the frontier where the two programs part ways (DESIGN §5).

Two kinds of failure reach here. A *layout* failure (`Failed` with evidence) already names the after op
where facts contradict, and often the op that made the value partial (where a collective is missing):
we add the before op that computes the same term. A *term* mismatch (every fact derived, but an output's
term is not the reference's) is located at the frontier: the earliest after op whose value has no
counterpart in the reference although its operands all do, and the earliest before op whose result the
after program never reproduces although it reproduces the operands.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from scalify_hlo.ir.nodes import Frame, Op, Value, walk
from scalify_hlo.layout.program import Program
from scalify_hlo.ops.reducers import COLLECTIVE_NAME
from scalify_hlo.prove.derive import Deriver
from scalify_hlo.prove.sync import Sync
from scalify_hlo.report.verdicts import Finding, Site
from scalify_hlo.rules.facts import Failed, Holds, Varying
from scalify_hlo.terms.blockwise import GAVE_UP, Normaliser
from scalify_hlo.terms.term import Term


def _producers(p: Program, d: Deriver) -> dict[int, Op]:
    """term id → the first op whose result holds that term (program order)."""
    out: dict[int, Op] = {}
    for op in walk(p.func.body.ops):
        for r in op.results:
            f = d.facts.get(r)
            if isinstance(f, Holds) and f.term.id not in out:
                out[f.term.id] = op
    return out


def _describe(f: Holds | None, p: Program) -> str | None:
    return f.layout.describe(p.mesh) if f is not None else None


def _fact(d: Deriver, op: Op) -> Holds | None:
    f = d.facts.get(op.results[0]) if op.results else None
    if not isinstance(f, Holds) and op.results:
        f = d.case_views.get(op.results[0])
    return f if isinstance(f, Holds) else None


def _frame_in_common_function(origin: Op, consumer: Op | None) -> Frame | None:
    """The origin's frame in the innermost function that also calls the consumer: where the value that
    lacks its collective is made, at the level of code that then uses it (for gradients from
    `value_and_grad`, the line calling it, not the model line autodiff attributes the backward op to)."""
    if consumer is None or not consumer.loc.frames:
        return None
    functions = {(fr.file, fr.function) for fr in consumer.loc.frames if fr.function}
    return next((fr for fr in origin.loc.frames if (fr.file, fr.function) in functions), None)


def _wrong_collective(f: Failed) -> bool:
    """The failure is a reduction with the wrong reducer (psum expected, pmax found): the collective is
    what was changed or mistyped, not the op that made its operand partial."""
    names = set(COLLECTIVE_NAME.values())
    return f.op is not None and f.op.opcode in _COLLECTIVES and f.expected in names and f.found in names


def localize_failure(f: Failed, j: int, bp: Program, bd: Deriver, ap: Program, ad: Deriver) -> Finding:
    # A reduction with the wrong reducer is named itself, then the op that made its operand partial;
    # otherwise the op that made the value wrong (the origin) first, then where it is consumed.
    primary = f.op if _wrong_collective(f) else f.origin or f.op
    second = f.origin if primary is f.op else f.op
    before_site = None
    if primary is not None:
        prod = _producers(bp, bd)
        held = _fact(ad, primary)
        terms = [held.term] if held is not None else []
        terms += [g.term for v in primary.operands if isinstance(g := ad.facts.get(v), Holds)]
        for t in terms:
            if t.id in prod:
                before_site = Site.of(prod[t.id], _describe(_fact(bd, prod[t.id]), bp))
                break
    frame = _frame_in_common_function(primary, f.op) if primary is not None and primary is not f.op else None
    after_site = Site.of(primary, _describe(_fact(ad, primary), ap), frame) if primary is not None else None
    also = (Site.of(second),) if second is not None and second is not primary else ()
    reason = f.reason if f.op is not None else f"output {j}: {f.reason}"
    return Finding(reason, before_site, after_site, also, f.expected, f.found)


def _subterms(t: Term) -> set[int]:
    return {s.id for s in t.walk()}


def _ops_in_order(p: Program) -> Iterator[Op]:
    return walk(p.func.body.ops)


def _what(op: Op) -> str:
    """The JAX primitive an op came from (its op_name's last part), else its opcode; a constant the
    partitioner folded from one (an offset table from an iota) says so."""
    name = op.loc.op_name.rsplit("/", 1)[-1] if op.loc.op_name else None
    if op.opcode == "constant" and op.loc.frames and name not in (None, "constant"):
        return f"a constant folded from {name}"
    return name or op.opcode


def _line(op: Op) -> tuple[str, int] | None:
    frame = op.loc.frame
    return (frame.file, frame.line) if frame is not None else None


def _cone(p: Program, j: int) -> set[int]:
    """id() of the ops output `j` is computed from. Result k of an op with a body (shard_map, a loop, a
    branch) comes from its body's result k, where the body has as many."""
    producer = {v: (op, k) for op in _ops_in_order(p) for k, v in enumerate(op.results)}
    out: set[int] = set()
    seen: set[int] = set()
    stack = [p.func.body.results[j]] if j < len(p.func.body.results) else []
    while stack:
        v = stack.pop()
        if id(v) in seen or v not in producer:
            continue
        seen.add(id(v))
        op, k = producer[v]
        out.add(id(op))
        stack.extend(op.operands)
        for r in op.regions:
            stack.extend((r.results[k],) if len(r.results) == len(op.results) else r.results)
    return out


def _use_site(p: Program, op: Op, toward: Callable[[Op], bool] = lambda _: True) -> Op | None:
    """Where `op`'s value is used: the first op computing from it (past data movement and conversions) at
    another source line, else the first op using it that has a source line at all (the consumer); only
    ops `toward` accepts (those on the way to the output that differs)."""
    line = _line(op)
    frontier = set(op.results)
    first: Op | None = None
    for other in _ops_in_order(p):
        if any(v in frontier for v in other.operands):
            if other.loc.frames and _computes(other) and toward(other):
                if _line(other) != line and other.opcode not in _MOVEMENT and other.opcode != "convert":
                    return other
                first = first or other
            frontier.update(other.results)
    return first


def _foreign_frontier(t: Term, sync: Sync) -> list[Term]:
    """The foreign subterms of `t` whose arguments are all reference terms (where the values part ways)."""
    out = []
    padded: set[int] = set()
    for node in t.walk():  # (operands first)
        if sync.synced(node):
            continue
        if node.op == "pad" and all(sync.synced(a) or a.id in padded for a in node.args):
            # a reference value padded to blocks a mesh axis divides: the same values, not a parting
            padded.add(node.id)
        elif all(sync.synced(a) or a.id in padded for a in node.args):
            out.append(node)
    return out


def _constant_like(t: Term) -> bool:
    """Built from constants and iotas only (no parameter, no loop variable)."""
    return not any(s.op in ("param", "var") for s in t.walk())


def _first_containing(ap: Program, ad: Deriver) -> dict[int, Op]:
    """For every term some op's value is made of, the first op (in program order) whose term contains it:
    one walk over all the ops' terms, each subterm visited once."""
    first: dict[int, Op] = {}
    seen: set[int] = set()
    for op in _ops_in_order(ap):
        if _computes(op) and (h := _fact(ad, op)) is not None:
            for s in h.term.walk(seen):
                first[s.id] = op
    return first


def _blame(node: Term, ap: Program, ad: Deriver, sync: Sync, order: dict[int, int],
           toward: Callable[[Op], bool], containing: Callable[[], dict[int, Op]]) -> Op | None:
    """The after op responsible for a frontier term: the op holding it (the first whose value is used on
    the way to the output, `toward`: one constant may be written twice); for a constant lifted from a
    device-varying value, the first op of that value's chain whose result is already foreign; else the
    op whose term uses it."""
    holders = [op for op in _ops_in_order(ap) if (h := _fact(ad, op)) is not None and h.term is node
               and (_computes(op) or _selects(op, h))]
    if holders:
        return next((op for op in holders if _use_site(ap, op, toward) is not None), holders[0])
    v = ad.lifted_from.get(node.id)
    if v is not None:
        op = ad.varying_op.get(id(v))
        while op is not None:
            earlier = _foreign_operand(op, ap, ad, sync)
            if earlier is None or earlier is op:
                return op
            op = earlier
    users = [op for op in _ops_in_order(ap) if _computes(op) and (h := _fact(ad, op)) is not None
             and any(a is node for a in h.term.args)]
    if users:
        return min(users, key=lambda o: order[id(o)])
    # An inner node of a normal form (a data movement's reshape to its digits, say): the first op whose
    # term contains it.
    inner = containing().get(node.id)
    if inner is not None:
        return inner
    # A term no op holds (the blocks of a shard_map result put in the order its out_specs declare): the
    # values part ways right after the last op computing one of its operands.
    makers = [op for op in _ops_in_order(ap) if _computes(op) and (h := _fact(ad, op)) is not None
              and any(h.term is a for a in node.args)]
    return max(makers, key=lambda o: order[id(o)]) if makers else None


def _foreign_operand(op: Op, ap: Program, ad: Deriver, sync: Sync) -> Op | None:
    """The op making an operand of `op` that is already foreign: a device-varying one first (an offset
    table, partition-id arithmetic: what partitioning adds, and what a wrong offset is made of), else one
    built from constants alone (a local iota, the same on every device). A table indexed by the device
    (`dynamic-slice(table, partition-id)`) is where per-device offsets are written down: the table itself."""
    if op.opcode in ("dynamic_slice", "gather") and op.operands:
        g = ad.facts.get(op.operands[0])
        if isinstance(g, Holds) and not sync.synced(g.term) and _constant_like(g.term):
            return next((o for o in _ops_in_order(ap) if op.operands[0] in o.results), None)
    for u in op.operands:
        g = ad.facts.get(u)
        if isinstance(g, Varying) and (source := ad.varying_op.get(id(g))) is not None and source.operands:
            lifted = ad.lift(g)  # (a device-varying scalar is the shard of no tensor: foreign too)
            if not isinstance(lifted, Holds) or not sync.synced(lifted.term):
                return source
    for u in op.operands:
        g = ad.facts.get(u)
        if isinstance(g, Holds) and not sync.synced(g.term) and _constant_like(g.term):
            return next((o for o in _ops_in_order(ap) if u in o.results), None)
    return None


# Ops whose regions are a combiner (a reducer, a comparator), not a body of ops that compute the result.
_WITH_COMBINER = frozenset({"reduce", "reduce_window", "all_reduce", "reduce_scatter", "scatter", "sort",
                            "select_and_scatter"})


def _computes(op: Op) -> bool:
    """The op computes its result itself (not through a body of other ops: loops, branches, shard_map)."""
    return not op.regions or op.opcode in _WITH_COMBINER


def _selects(op: Op, held: Holds) -> bool:
    """A conditional whose result is its own `case` term (`prove.branches`): the op that picks a branch
    computes it (branches in another order part ways there, not in any branch)."""
    return op.opcode in ("case", "if") and held.term.op == "case"


def localize_mismatch(j: int, after_term: Term, before_term: Term, bp: Program, bd: Deriver,
                      ap: Program, ad: Deriver, sync: Sync) -> Finding:
    """The earliest after op where output `j`'s term leaves the reference's terms (its frontier)."""
    order = {id(op): k for k, op in enumerate(_ops_in_order(ap))}
    cone = _cone(ap, j)

    def toward(o: Op) -> bool:
        """`o` computes part of the output that differs."""
        return id(o) in cone

    containing = functools.cache(lambda: _first_containing(ap, ad))  # (built only if a node needs it)
    blamed = [(op, n) for n in _foreign_frontier(after_term, sync)
              if (op := _blame(n, ap, ad, sync, order, toward, containing)) is not None]
    after_op, node = min(blamed, key=lambda b: order[id(b[0])]) if blamed else (None, None)
    # A block of a value the reference computes whole is no difference yet: the after program goes on
    # block by block (online softmax, blockwise scans) in a way the prover does not follow.
    blockwise = (node is not None and node.op == "slice" and sync.synced(node.args[0])
                 and all(k == 1 for k in node.attr("strides") or ()))  # (every k-th row is no block)
    covered: set[int] = set()
    for f in ad.facts.values():
        if isinstance(f, Holds) and sync.synced(f.term):
            for _ in f.term.walk(covered):
                pass
    inside_before = _subterms(before_term)
    before_op: Op | None = None
    for op in _ops_in_order(bp):
        held = _fact(bd, op)
        if held is None or held.term.id not in inside_before or held.term.id in covered:
            continue
        operands = [bd.facts.get(v) for v in op.operands]
        if all(not isinstance(g, Holds) or g.term.id in covered or not g.term.args for g in operands):
            before_op = op
            break
    after_site: Site | None = None
    also: tuple[Site, ...] = ()
    if after_op is not None:
        # The origin itself, then where its value is used. An HLO constant XLA gave no metadata is still the
        # instruction to look at (named at the line of its first user that has one); a StableHLO one has
        # no name a user can find, so its user stands for it.
        use = _use_site(ap, after_op, toward)
        if use is not None and not after_op.loc.frames and Site.of(after_op).instruction is None:
            after_op, use = use, _use_site(ap, use, toward)
        frame = use.loc.frame if use is not None and not after_op.loc.frames else None
        after_site = Site.of(after_op, _describe(_fact(ad, after_op), ap), frame)
        also = (Site.of(use),) if use is not None else ()
    if before_op is not None and not before_op.loc.frames:  # (a reference constant: where it is used)
        before_op = _use_site(bp, before_op) or before_op
    before_site = Site.of(before_op, _describe(_fact(bd, before_op), bp)) if before_op is not None else None
    if after_op is not None and blockwise:
        reason = (f"output {j} differs from the reference, and the prover follows the program only up to "
                  f"{_what(after_op)} ({after_site.source if after_site else '?'}): from there it computes a block "
                  "of a value the reference computes whole and combines the blocks in a way not modelled")
    elif after_op is not None and before_op is not None:
        reason = (f"output {j} differs from the reference: the values part ways at {_what(after_op)} "
                  f"({after_site.source if after_site else '?'}), where the reference computes {_what(before_op)} "
                  f"({before_site.source if before_site else '?'})")
    elif after_op is not None:
        reason = (f"output {j} differs from the reference from {_what(after_op)} "
                  f"({after_site.source if after_site else '?'}) on: it has no counterpart there")
    elif (last := _last_computing(ap, cone)) is not None:
        # No frontier to name (the output is folded to a constant, say): the op that makes it, so that
        # a finding always points at a line.
        after_site = Site.of(last, _describe(_fact(ad, last), ap))
        reason = (f"output {j} differs from the reference: it is made at {_what(last)} "
                  f"({after_site.source or after_site.label()}), and no earlier op could be matched to the "
                  "reference's")
    else:
        reason = f"output {j}: could not prove it equal to the reference"
    return Finding(reason, before_site, after_site, also)


def _last_computing(p: Program, cone: set[int]) -> Op | None:
    """The last op, in program order, that computes part of an output (ids in `cone`) and has a source
    line or an instruction name."""
    last = None
    for op in _ops_in_order(p):
        if id(op) in cone and _computes(op) and (op.loc.frames or Site.of(op).instruction):
            last = op
    return last


_MOVEMENT = frozenset({"reshape", "transpose", "broadcast_in_dim", "slice", "concatenate", "copy"})
_COLLECTIVES = frozenset({"all_to_all", "all_gather", "all_reduce", "reduce_scatter", "collective_permute"})


def localize_blocks(j: int, ap: Program, ad: Deriver, norm: Normaliser) -> Finding | None:
    """Where a body derived case by case (`cases`, `per_device`) parts ways, after the block comparison
    (`blockwise.equal`, run with `norm`) failed: the first op computing an exp that overflows, or else whose
    blocks do not merge although its operands' do; else the op holding the first after-side term the
    comparison could not match. None when none applies (then the term frontier is used)."""
    if not ad.case_terms:
        return None
    try:
        return _localize_blocks(j, ap, ad, norm)
    except GAVE_UP:
        return None


def _localize_blocks(j: int, ap: Program, ad: Deriver, norm: Normaliser) -> Finding | None:
    ops = [op for op in _ops_in_order(ap) if not op.regions and op.results]
    producer = {v: op for op in _ops_in_order(ap) for v in op.results}

    def case_term(v: Value, c: int) -> Term | None:
        terms = ad.case_terms.get(v)
        if terms is not None:
            return terms[c]
        f = ad.facts.get(v)
        return f.term if isinstance(f, Holds) else None

    def first_making(has: Callable[[Term], object]) -> tuple[Op, object] | None:
        """The first op (program order) with a case whose term `has` something its operands' terms lack."""
        for op in ops:
            for c, t in enumerate(ad.case_terms.get(op.results[0]) or ()):
                if t is None or not (found := has(norm(t))):
                    continue
                if not any(has(norm(u)) for v in op.operands if (u := case_term(v, c)) is not None):
                    return op, found
        return None

    if (hit := first_making(norm.overflow_in)) is not None:
        site = Site.of(hit[0], _describe(_fact(ad, hit[0]), ap))
        reason = (f"output {j} differs from the reference: {_what(hit[0])} ({site.source}) computes exp(x - c) with c "
                  "the lowest finite float (a running max's initial value): it overflows to inf. A rescale factor "
                  "is exp(m_old - m_new), at most 1")
        return Finding(reason, None, site)
    if (hit := first_making(norm.unjoined_in)) is not None:
        return _blocks_finding(j, hit[0], str(hit[1]), ap, ad, producer)
    if norm.first_failure is None:
        return None
    a, b = norm.first_failure
    target = norm(a)
    for op in ops:
        terms = ad.case_terms.get(op.results[0]) or []
        hits = [c for c, t in enumerate(terms) if t is not None and (t is a or norm(t) is target)]
        if hits:
            if (extra := _extra_operand(op, hits[0], norm(b), case_term, norm, producer)) is not None:
                site = Site.of(extra, _describe(_fact(ad, extra), ap))
                reason = (f"output {j} differs from the reference: {_what(op)} ({Site.of(op).source}) combines the "
                          f"reference's value with what {_what(extra)} ({site.source}) makes, which the reference "
                          "does not add in there")
                return Finding(reason, None, site, (Site.of(op),))
            source: Op | None = op
            while source is not None and source.opcode in _MOVEMENT and source.operands:
                source = producer.get(source.operands[0])  # back through data movement to who made the data
            if source is not None and source.opcode in _COLLECTIVES:
                site = Site.of(source, _describe(_fact(ad, source), ap))
                reason = (f"output {j} differs from the reference: {_what(source)} ({site.source}) delivers the "
                          f"blocks arranged otherwise than the reference computes them (seen at {_what(op)}, "
                          f"{Site.of(op).source})")
                return Finding(reason, None, site, (Site.of(op),))
            if op.opcode in _MOVEMENT:
                # Data moved (a stack of a pipeline's stage outputs) that was already wrong when made: the
                # term frontier names where it went wrong, not where it was stacked.
                return None
            site = Site.of(op, _describe(_fact(ad, op), ap))
            reason = (f"output {j} differs from the reference: from {_what(op)} ({site.source}) on, the blocks "
                      "are not those of the reference's values")
            return Finding(reason, None, site)
    return None


def _extra_operand(op: Op, c: int, reference: Term, case_term: Callable[[Value, int], Term | None],
                   norm: Normaliser, producer: dict[Value, Op]) -> Op | None:
    """For `op` adding (subtracting, ...) two values of which one already is the reference's block, in
    case `c`: the op making the other (through data movement), which the reference has no counterpart of."""
    if op.opcode not in ("add", "subtract") or len(op.operands) != 2:
        return None
    got = [case_term(v, c) for v in op.operands]
    if any(t is None for t in got):
        return None
    same = [norm(t) is reference for t in got if t is not None]
    if same.count(True) != 1:
        return None
    source: Op | None = producer.get(op.operands[same.index(False)])
    while source is not None and source.opcode in _MOVEMENT and source.operands:
        source = producer.get(source.operands[0])
    return source


def _blocks_finding(j: int, op: Op, kind: str, ap: Program, ad: Deriver, producer: dict[Value, Op]) -> Finding:
    site = Site.of(op, _describe(_fact(ad, op), ap))
    if kind == "misplaced":
        moved = _last_permute(op, producer)
        if moved is not None:
            where = Site.of(moved, _describe(_fact(ad, moved), ap))
            reason = (f"output {j} differs from the reference: {_what(op)} ({site.source}) combines blocks of one "
                      f"tensor that are not its consecutive blocks (a block is used where another belongs); the "
                      f"blocks arrive through {_what(moved)} ({where.source})")
            return Finding(reason, None, where, (site,))
        reason = (f"output {j} differs from the reference: {_what(op)} ({site.source}) combines blocks of one "
                  "tensor that are not its consecutive blocks (a block is used where another belongs)")
        return Finding(reason, None, site)
    reason = (f"output {j} differs from the reference: {_what(op)} ({site.source}) adds up blockwise partial "
              "results that are not on a common scale, so they do not make one reduction over all blocks "
              "(a rescaling is missing or wrong)")
    return Finding(reason, None, site)


def _last_permute(op: Op, producer: dict[Value, Op]) -> Op | None:
    """The collective-permute (latest in program order) that `op`'s operands were computed from."""
    seen: set[int] = set()
    stack = list(op.operands)
    found: list[Op] = []
    while stack:
        v = stack.pop()
        src = producer.get(v)
        if src is None or id(src) in seen:
            continue
        seen.add(id(src))
        if src.opcode == "collective_permute":
            found.append(src)
        stack.extend(src.operands)
    order = {id(o): k for k, o in enumerate(producer.values())}
    return max(found, key=lambda o: order[id(o)]) if found else None
