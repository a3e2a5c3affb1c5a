"""What global tensor a shard_map output is (`rules.boundary.assemble`), checked against the interpreter.

For every pair of layouts over a 2 x 4 mesh: the term `assemble` builds for a value held under one layout
and declared under the other must evaluate to the tensor the devices' shards make under the declared one
(`numeric.machine.assemble`), and where it builds none, no tensor has those shards. Also the normal forms
that meet the reference's spelling of such outputs: `jnp.tile` and `jnp.concatenate` of copies.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scalify_hlo.rules.boundary import assemble as assemble_term

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.machine import assemble, shard
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms

MESH = Mesh((("x", 2), ("y", 4)))
SPLITS = ((), ("x",), ("y",), ("x", "y"), ("y", "x"))


def _layouts() -> list[Layout]:
    return [Layout((a, b)) for a, b in itertools.product(SPLITS, SPLITS) if not set(a) & set(b)]


@pytest.mark.parametrize("have", _layouts(), ids=lambda lay: lay.describe(MESH))
def test_assembled_output_is_the_tensor_of_the_shards(have: Layout) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 8)).astype(np.float32)
    local = shard(x, have, MESH)
    for want in _layouts():
        terms = Terms()
        p = terms.param(0, TensorType((8, 8), "f32"), "x")
        term = assemble_term(p, have, want, MESH, terms)
        whole = assemble(local, want, MESH)
        consistent = np.array_equal(shard(whole, want, MESH), local)  # some tensor has these shards
        if term is None:
            assert not consistent, f"{have.describe(MESH)} -> {want.describe(MESH)}: no term, yet a tensor fits"
            continue
        assert consistent, f"{have.describe(MESH)} -> {want.describe(MESH)}: a term where no tensor fits"
        np.testing.assert_array_equal(evaluate(term, {p.id: x}), whole)


def test_tile_is_the_reference_spelling() -> None:
    terms = Terms()
    x = terms.param(0, TensorType((3, 5), "f32"), "x")
    value = np.arange(15, dtype=np.float32).reshape(3, 5)
    for dim, n in ((0, 4), (1, 2)):
        t = terms.tile(x, dim, n)
        reps = [1, 1]
        reps[dim] = n
        np.testing.assert_array_equal(evaluate(t, {x.id: value}), np.tile(value, reps))
        # jnp.concatenate of n copies is the same term
        assert terms.apply("concatenate", (x,) * n, (("dimension", dim),), t.type) is t
    # jnp.tile(x, (1, 2)) broadcasts to [1, 3, 2, 5] before the reshape: the unit dim carries nothing
    wide = terms.apply("broadcast_in_dim", (x,), (("broadcast_dimensions", (1, 3)),), TensorType((1, 3, 2, 5), "f32"))
    assert terms.apply("reshape", (wide,), (), TensorType((3, 10), "f32")) is terms.tile(x, 1, 2)
