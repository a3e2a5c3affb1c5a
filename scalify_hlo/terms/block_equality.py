"""Equality of an after term with the reference's, block by block, under the blockwise normal form.

`equal` says two terms are equal when their normal forms (`blockwise.Normaliser`) are; or, where the
after term concatenates blocks (one per case of a case split, one per expert block an all_to_all brought
back), when each block equals that block of the reference (`pushing.push_slice`); or when they are the
same op on operands equal in turn (congruence; either pairing for a commutative op's two operands; a
reduction's blocks in order, `Normaliser.reordered`). It never makes two different values equal; when it
cannot decide (out of fuel or depth, a shape it does not expect) it says not proven.
"""

from __future__ import annotations

from scalify_hlo.ops.elementwise import COMMUTATIVE
from scalify_hlo.terms.blockwise import GAVE_UP, Normaliser
from scalify_hlo.terms.pushing import push_slice, squeeze_units
from scalify_hlo.terms.slicing import window_along
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

DEPTH = 64  # nested block splits and congruence steps per comparison


def equal(terms: Terms, after: Term, before: Term, norm: Normaliser | None = None) -> bool:
    """Whether the two terms are equal by the identities above. `after` may be built from blocks that
    `before` computes at once (one per coordinate of a case split, or per expert block): where `after`
    concatenates blocks, each block is compared with that block of `before` (`pushing.push_slice`)."""
    norm = Normaliser(terms) if norm is None else norm
    try:
        return _equal(terms, norm, after, before, DEPTH)
    except GAVE_UP:
        return False


def _equal(terms: Terms, norm: Normaliser, a: Term, b: Term, depth: int) -> bool:
    key = (a.id, b.id)
    known = norm.compared.get(key)
    if known is None:
        norm.compared[key] = False  # a cycle back here proves nothing
        known = norm.compared[key] = _compare(terms, norm, a, b, depth)
    return known


def _compare(terms: Terms, norm: Normaliser, a: Term, b: Term, depth: int) -> bool:
    if a is b or norm(a) is norm(b):
        return True
    if depth == 0 or a.type != b.type:
        if norm.first_failure is None:
            norm.first_failure = (a, b)
        return False
    if a.op == "reshape" and (taken := squeeze_units(terms, a)) is not None:
        return _equal(terms, norm, taken, b, depth - 1)
    if a.op != "concatenate" and norm(a).op == "concatenate":
        a = norm(a)  # blocks written into a buffer (dynamic_update_slice at constant offsets)
    if a.op == "concatenate" and b.op != "concatenate":
        d = int(a.attr("dimension"))
        start = 0
        for piece in a.args:
            m = piece.type.shape[d]
            block = push_slice(terms, b, *window_along(a.type.shape, d, start, start + m))
            if not _equal(terms, norm, piece, block, depth - 1):
                return False
            start += m
        return True
    # Congruence: the same op on equal operands (each pair compared the same way).
    na, nb = norm(a), norm(b)
    if na.op == nb.op and na.attrs == nb.attrs and len(na.args) == len(nb.args) and na.args:
        failure = norm.first_failure
        if all(_equal(terms, norm, x, y, depth - 1) for x, y in zip(na.args, nb.args, strict=True)):
            return True
        # Operands of a commutative op are ordered by term id, and the blocks of one side are terms made
        # in another order than the other side's: the crossed pairing is as good.
        if na.op in COMMUTATIVE and len(na.args) == 2 and all(
                _equal(terms, norm, x, y, depth - 1) for x, y in zip(na.args, reversed(nb.args), strict=True)):
            norm.first_failure = failure
            return True
    # A reduction's blocks in order, only now: the comparison above pairs a concatenation's blocks with the
    # reference's windows by position, which reordering them in the normal form would break.
    if na.op == nb.op == "reduce" and na.attrs == nb.attrs:
        ra, rb = norm.reordered(na), norm.reordered(nb)
        if ra is not na or rb is not nb:
            return _equal(terms, norm, ra, rb, depth - 1)
    if norm.first_failure is None:
        norm.first_failure = (a, b)
    return False

