"""The `convolution` kernel against XLA: `lax.conv_general_dilated` in many configurations (NHWC/NCHW,
1-D/2-D/3-D, strides, SAME/VALID/explicit and negative padding, both dilations, feature and batch groups,
the transposed convolutions of JAX's gradients), lowered to StableHLO, read with `parsers.loads`, run
with `numeric.run_before` and compared with what XLA computes. Also the HLO road (XLA's compiled text,
which omits default attributes) and the rule's shape function against XLA's result shapes.
"""

from __future__ import annotations

from conftest import numeric_xla_flags

numeric_xla_flags()  # before jax is imported

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402

from scalify_hlo import parsers  # noqa: E402
from scalify_hlo.numeric import kernels_conv as NV  # noqa: E402
from scalify_hlo.numeric import machine as N  # noqa: E402
from scalify_hlo.ops import registry  # noqa: E402, F401  (registers the kernels)

RNG = np.random.default_rng(0)


def _f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(**kw: Any) -> Callable[..., Any]:
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(x, w, **kw)
    return f


def _grad_lhs(x: jax.Array, w: jax.Array) -> jax.Array:
    """The input gradient: a transposed convolution (lhs dilation, window reversal)."""
    f = _conv(window_strides=(2, 2), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return jax.grad(lambda v: jnp.sum(f(v, w) ** 2))(x)


def _grad_rhs_grouped(x: jax.Array, w: jax.Array) -> jax.Array:
    """The kernel gradient of a grouped convolution: XLA's batch_group_count."""
    f = _conv(window_strides=(1, 1), padding="SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
              feature_group_count=2)
    return jax.grad(lambda k: jnp.sum(f(x, k) ** 2))(w)


NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")
CASES: dict[str, tuple[Callable[..., Any], list[np.ndarray]]] = {
    "nhwc_valid": (_conv(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC),
                   [_f32(2, 7, 6, 3), _f32(3, 2, 3, 5)]),
    "nhwc_same_stride": (_conv(window_strides=(2, 3), padding="SAME", dimension_numbers=NHWC),
                         [_f32(2, 9, 8, 4), _f32(3, 3, 4, 6)]),
    "nchw_explicit": (_conv(window_strides=(1, 2), padding=((1, 2), (0, 3)), dimension_numbers=NCHW),
                      [_f32(2, 3, 8, 7), _f32(5, 3, 3, 2)]),
    "negative_padding": (_conv(window_strides=(1, 1), padding=((-1, 2), (2, -2)), dimension_numbers=NHWC),
                         [_f32(1, 8, 8, 2), _f32(3, 3, 2, 2)]),
    "dilations": (_conv(window_strides=(2, 1), padding=((1, 2), (0, -1)), lhs_dilation=(1, 2),
                        rhs_dilation=(2, 1), dimension_numbers=NHWC, feature_group_count=2),
                  [_f32(2, 9, 8, 4), _f32(3, 3, 2, 6)]),
    "conv1d_nwc": (_conv(window_strides=(2,), padding="SAME", dimension_numbers=("NWC", "WIO", "NWC")),
                   [_f32(3, 11, 4), _f32(5, 4, 6)]),
    "conv1d_ncw_dilated": (_conv(window_strides=(1,), padding=((2, 2),), rhs_dilation=(2,),
                                 dimension_numbers=("NCW", "OIW", "NCW")), [_f32(2, 3, 10), _f32(4, 3, 3)]),
    "depthwise": (_conv(window_strides=(1, 1), padding="SAME", dimension_numbers=NHWC, feature_group_count=4),
                  [_f32(2, 6, 6, 4), _f32(3, 3, 1, 8)]),
    "batch_groups": (_conv(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC, batch_group_count=2),
                     [_f32(4, 5, 5, 3), _f32(2, 2, 3, 6)]),
    "odd_layout": (_conv(window_strides=(1, 1), padding="SAME", dimension_numbers=("HNCW", "WIOH", "CWHN")),
                   [_f32(6, 2, 3, 5), _f32(3, 3, 4, 2)]),
    "conv3d": (_conv(window_strides=(1, 2, 1), padding="SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC")),
               [_f32(1, 4, 5, 6, 2), _f32(2, 3, 2, 2, 3)]),
    "grad_lhs_transposed": (_grad_lhs, [_f32(2, 8, 8, 3), _f32(3, 3, 3, 4)]),
    "grad_rhs_batch_groups": (_grad_rhs_grouped, [_f32(2, 6, 6, 4), _f32(3, 3, 2, 6)]),
    "empty_output": (_conv(window_strides=(1, 1), padding="VALID", dimension_numbers=NHWC),
                     [_f32(1, 2, 2, 1), _f32(3, 3, 1, 1)]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_convolution_matches_xla(name: str) -> None:
    fn, inputs = CASES[name]
    text = jax.jit(fn).lower(*inputs).as_text()
    assert "stablehlo.convolution" in text
    got = N.run_before(parsers.loads(text), inputs)
    want = [np.asarray(o) for o in jax.tree.leaves(jax.jit(fn)(*inputs))]
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["nhwc_valid", "dilations", "batch_groups", "grad_lhs_transposed"])
def test_convolution_from_hlo_text(name: str) -> None:
    """XLA's HLO text spells only the attributes that differ from the defaults."""
    fn, inputs = CASES[name]
    text = jax.jit(fn).lower(*inputs).compile().as_text()
    got = N.run_before(parsers.loads(text), inputs)
    want = [np.asarray(o) for o in jax.tree.leaves(jax.jit(fn)(*inputs))]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_function(name: str) -> None:
    fn, inputs = CASES[name]
    module = parsers.loads(jax.jit(fn).lower(*inputs).as_text())
    convs = [op for op in module.main.body.ops if op.opcode == "convolution"]
    assert convs
    for op in convs:
        spec = NV.spec_of(op)
        shape = spec.out_shape(op.operands[0].tensor.shape, op.operands[1].tensor.shape)
        assert shape == op.result.tensor.shape


def test_integer_convolution_wraps() -> None:
    f = _conv(window_strides=(1,), padding="VALID", dimension_numbers=("NWC", "WIO", "NWC"))
    x = RNG.integers(-100, 100, (2, 6, 3)).astype(np.int32)
    w = RNG.integers(-100, 100, (2, 3, 2)).astype(np.int32)
    got = N.run_before(parsers.loads(jax.jit(f).lower(x, w).as_text()), [x, w])
    np.testing.assert_array_equal(got[0], np.asarray(jax.jit(f)(x, w)))


def test_window_reversal_flips_the_kernel() -> None:
    """JAX spells a flipped kernel as `rev`; StableHLO's `reverse` window flag means the same."""
    fn, (x, w) = CASES["nhwc_valid"]
    text = jax.jit(fn).lower(x, w).as_text()
    assert "reverse = [false, false]" in text
    got = N.run_before(parsers.loads(text.replace("reverse = [false, false]", "reverse = [true, false]")), [x, w])
    np.testing.assert_allclose(got[0], np.asarray(jax.jit(fn)(x, np.flip(w, 0).copy())), rtol=1e-4, atol=1e-4)
