"""An elementwise op whose operands split a dim over different axes, where one operand is constant along that
dim (a broadcast creates it): every block of it is the same, so it is re-read as split like the other
(`rules.facts.realigned`). XLA lays out optax.adafactor's row factor, broadcast along the columns, over other
axes than the gradient it scales (`adafactor_step_with_factored_moments_on_a_2x2x2_mesh` in
`tools/programs/user_programs.py`, a real program, runs in `make test-slow`). Each case checks the claim
against the numbers: every device's block of the operands, as the facts say, combined, must be the block
the result's fact says it holds.
"""

from __future__ import annotations

import numpy as np
from scalify_hlo.rules.facts import Holds, realigned

from scalify_hlo.ir.nodes import TensorType
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.numeric.machine import shard
from scalify_hlo.terms.evaluate import evaluate
from scalify_hlo.terms.table import Terms

MESH = Mesh((("dp", 2), ("fsdp", 2), ("tp", 2)))


def _case() -> tuple[Holds, Holds, Terms, dict[int, np.ndarray]]:
    """g [4, 8] split (fsdp, tp); r [4, 8] = a row vector [4] broadcast along the columns, split (fsdp, dp):
    4 columns per device in both."""
    terms = Terms()
    g = terms.param(0, TensorType((4, 8), "f32"), "g")
    v = terms.param(1, TensorType((4,), "f32"), "v")
    r = terms.apply("broadcast_in_dim", (v,), (("broadcast_dimensions", (0,)),), TensorType((4, 8), "f32"))
    rng = np.random.default_rng(0)
    env = {g.id: rng.standard_normal((4, 8)).astype(np.float32), v.id: rng.standard_normal(4).astype(np.float32)}
    return (Holds(g, Layout((("fsdp",), ("tp",)))), Holds(r, Layout((("fsdp",), ("dp",)))), terms, env)


def test_a_broadcast_split_over_another_axis_is_reread_like_its_fellow() -> None:
    hg, hr, terms, env = _case()
    got = realigned([hg, hr], MESH, terms)
    assert got is not None
    (tg, tr), layout = got
    assert layout == hg.layout and tr.type.shape == tg.type.shape
    # The numbers: what each device holds of r under its own fact is its block of the re-read term.
    held = shard(np.asarray(evaluate(hr.term, env)), hr.layout, MESH)
    claimed = shard(np.asarray(evaluate(tr, env)), layout, MESH)
    np.testing.assert_array_equal(held, claimed)


def test_a_value_that_varies_along_the_dim_is_not_reread() -> None:
    hg, _, terms, _ = _case()
    w = terms.param(2, TensorType((4, 8), "f32"), "w")  # not a broadcast: its column blocks differ
    assert realigned([hg, Holds(w, Layout((("fsdp",), ("dp",))))], MESH, terms) is None
