"""How an after loop's carried values are paired with a reference loop's (`scalify_hlo.prove.carried`).

The scanned training-step fixtures (`llama_train_scan_shardy` and its twin) exercise the pairing end to end;
these pin down the pieces the fixtures cannot show on their own: a value carried twice, a tiling that must
equal the reference's value exactly, and a re-reading that keeps partial axes apart.
"""

from __future__ import annotations

from scalify_hlo.rules.facts import Holds

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.ops.reducers import Reducer
from scalify_hlo.prove import carried
from scalify_hlo.terms.table import Terms
from scalify_hlo.terms.term import Term

MESH = Mesh((("fsdp", 2), ("tp", 4)))


def _zeros(terms: Terms, shape: tuple[int, ...]) -> Term:
    return terms.apply("broadcast_in_dim", (terms.scalar(0.0, "f32"),), (("broadcast_dimensions", ()),),
                       TensorType(shape, "f32"))


def _rep(t: Term) -> Holds:
    return Holds(t, Layout.replicated(t.type.rank))


def test_zeros_built_per_device_are_a_tiling_of_the_reference_buffer() -> None:
    terms = Terms()
    lay = carried.tiling(MESH, terms, _rep(_zeros(terms, (3, 1, 4))), _zeros(terms, (3, 2, 4)))
    assert lay == Layout(((), ("fsdp",), ()))
    # Copies of a value that is not constant along the dim are not the reference's tensor.
    x = terms.param(0, TensorType((3, 1, 4), "f32"), "x")
    assert carried.tiling(MESH, terms, _rep(x), terms.param(1, TensorType((3, 2, 4), "f32"), "y")) is None
    # No mesh axes multiply to the ratio.
    assert carried.tiling(MESH, terms, _rep(_zeros(terms, (3, 1, 4))), _zeros(terms, (3, 3, 4))) is None


def test_a_value_carried_twice_shares_the_slot_of_its_first_copy() -> None:
    terms = Terms()
    a = _rep(terms.param(0, TensorType((4,), "f32"), "a"))
    b = _rep(terms.param(1, TensorType((4,), "f32"), "b"))
    pairing = carried.match(MESH, terms, [b, a, b], [a, b])
    assert pairing is not None
    assert pairing.sigma == (1, 0, 1) and pairing.share == (0, 1, 0)
    # Every reference slot must be held: an after loop carrying fewer values is not paired.
    c = _rep(terms.param(2, TensorType((4,), "f32"), "c"))
    assert carried.match(MESH, terms, [a, b], [a, b, c]) is None
    # A copy laid out differently is not the same fact: it needs a reference slot of its own.
    split = Holds(b.term, Layout((("tp",),)))
    assert carried.match(MESH, terms, [b, a, split], [a, b]) is None


def test_relaid_reads_a_buffer_as_split_only_when_the_partial_axes_agree() -> None:
    terms = Terms()
    h = _rep(_zeros(terms, (3, 1, 4)))
    out = terms.fresh("out", TensorType((3, 2, 4), "f32"))
    relaid = carried.relaid(MESH, terms, [h], [Holds(out, Layout(((), ("fsdp",), ())))])
    assert relaid is not None and relaid[0].term is _zeros(terms, (3, 2, 4))
    assert relaid[0].layout == Layout(((), ("fsdp",), ()))
    partial = Holds(out, Layout(((), ("fsdp",), ()), (("tp", Reducer.SUM),)))
    assert carried.relaid(MESH, terms, [h], [partial]) is None
    assert carried.relaid(MESH, terms, [h], [h]) is None
