"""The convolution transfer rule (`rules/convolution.py`) on shard_map programs built here with JAX: the
splits it proves, the ones it refuses (`unknown`, naming the convolution), and the wrong ones
(`discrepancy` backed by a counterexample, or `unknown` — never `equivalent`). The fixtures under
`tests/fixtures/conv_*` cover XLA's own partitioning.
"""

from __future__ import annotations

from conftest import numeric_xla_flags

numeric_xla_flags()  # before jax is imported

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalify_hlo import parsers, verify  # noqa: E402
from scalify_hlo.ops.attrs import term_attrs  # noqa: E402

NHWC = ("NHWC", "HWIO", "NHWC")
X, W = np.zeros((4, 8, 8, 4), np.float32), np.zeros((3, 3, 4, 8), np.float32)


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    if jax.device_count() < 8:
        pytest.skip("jax was initialised with fewer than 8 devices")
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _conv(**kw: Any) -> Callable[[jax.Array, jax.Array], jax.Array]:
    def f(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(x, w, **{"window_strides": (1, 1), "padding": "SAME",
                                                 "dimension_numbers": NHWC, **kw})
    return f


def _verdict(mesh: jax.sharding.Mesh, ref: Callable[..., Any], body: Callable[..., Any], specs: tuple[P, P],
             out: P, args: tuple[np.ndarray, np.ndarray] = (X, W)) -> Any:
    before = jax.jit(ref).lower(*args).as_text(debug_info=True)
    impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False))
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, s)) for a, s in zip(args, specs, strict=True)]
    after = impl.lower(*sds).as_text(debug_info=True)
    return verify(before, after)


def test_batch_and_out_features(mesh: jax.sharding.Mesh) -> None:
    r = _verdict(mesh, _conv(), _conv(), (P("dp"), P(None, None, None, "tp")), P("dp", None, None, "tp"))
    assert r.name == "equivalent", r.render()


def test_contraction_split_with_psum(mesh: jax.sharding.Mesh) -> None:
    body = lambda x, w: lax.psum(_conv()(x, w), "tp")  # noqa: E731
    r = _verdict(mesh, _conv(), body, (P(None, None, None, "tp"), P(None, None, "tp")), P())
    assert r.name == "equivalent", r.render()


def test_contraction_split_differently_is_not_equivalent(mesh: jax.sharding.Mesh) -> None:
    """Input channels split over tp, the kernel's over dp (each device pairs other channels)."""
    body = lambda x, w: lax.psum(_conv()(x, w), ("dp", "tp"))  # noqa: E731
    w = np.zeros((3, 3, 16, 8), np.float32)
    x = np.zeros((4, 8, 8, 16), np.float32)
    r = _verdict(mesh, _conv(), body, (P(None, None, None, ("dp", "tp")), P(None, None, ("tp", "dp"))), P(),
                 (x, w))
    assert r.name != "equivalent", r.render()


def test_kernel_spatial_split_is_unknown(mesh: jax.sharding.Mesh) -> None:
    w = np.zeros((4, 3, 4, 8), np.float32)
    body = lambda x, w: lax.psum(_conv(padding="VALID")(x, w), "tp")  # noqa: E731
    r = _verdict(mesh, _conv(padding="VALID"), body, (P(), P("tp")), P(), (X, w))
    assert r.name == "unknown", r.render()
    assert "after:  convolution" in r.render()


def test_strided_patches_inside_blocks(mesh: jax.sharding.Mesh) -> None:
    """A 2x2 window with stride 2 over an image whose height is split in blocks of 2 rows."""
    f = _conv(window_strides=(2, 2), padding="VALID")
    w = np.zeros((2, 2, 4, 8), np.float32)
    r = _verdict(mesh, f, f, (P(None, "tp"), P()), P(None, "tp"), (X, w))
    assert r.name == "equivalent", r.render()


def test_windows_across_blocks_are_not_equivalent(mesh: jax.sharding.Mesh) -> None:
    """A 3x3 window with stride 2 (wider than the stride) over height blocks: windows straddle them."""
    f = _conv(window_strides=(2, 2), padding="VALID")
    r = _verdict(mesh, f, f, (P(None, "tp"), P()), P(None, "tp"), (np.zeros((4, 16, 8, 4), np.float32), W))
    assert r.name in ("discrepancy", "unknown"), r.render()


def test_depthwise_groups_split(mesh: jax.sharding.Mesh) -> None:
    f = _conv(feature_group_count=4)
    w = np.zeros((3, 3, 1, 8), np.float32)
    body = lambda x, w: _conv(feature_group_count=1)(x, w)  # noqa: E731  (one group per device)
    r = _verdict(mesh, f, body, (P(None, None, None, "tp"), P(None, None, None, "tp")), P(None, None, None, "tp"),
                 (X, w))
    assert r.name == "equivalent", r.render()


def test_grouped_split_mismatched_is_not_equivalent(mesh: jax.sharding.Mesh) -> None:
    """Output features split over tp but the input's channels whole: the local op mixes groups."""
    f = _conv(feature_group_count=4)
    w = np.zeros((3, 3, 1, 8), np.float32)
    r = _verdict(mesh, f, lambda x, w: _conv(feature_group_count=1)(x[..., :1], w), (P(), P(None, None, None, "tp")),
                 P(None, None, None, "tp"), (X, w))
    assert r.name != "equivalent", r.render()


def test_term_attrs_key_the_dimension_numbers() -> None:
    """Two convolutions that differ only in their dim layout are different ops to the term layer (the
    dimension numbers were once an opaque attribute, dropped from the key)."""
    x = np.zeros((4, 4, 4, 4), np.float32)
    ops = []
    for dn in (("NHWC", "HWIO", "NHWC"), ("NCHW", "OIHW", "NCHW")):
        text = jax.jit(_conv(dimension_numbers=dn)).lower(x, x).as_text()
        ops += [op for op in parsers.loads(text).main.body.ops if op.opcode == "convolution"]
    assert len(ops) == 2
    assert term_attrs(ops[0]) != term_attrs(ops[1])
    assert dict(term_attrs(ops[0]))["dimension_numbers"] != dict(term_attrs(ops[1]))["dimension_numbers"]
