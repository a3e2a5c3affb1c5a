"""The README's Python examples, run so they cannot rot: verify() on files and text, jax.check on a
GSPMD-partitioned jit, check_shard_map on hand-parallel code, and the pytest assertion helper."""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from conftest import FIXTURES
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import scalify_hlo
from scalify_hlo.jax import check, check_shard_map


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def mlp(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ w1) @ w2


ARGS = (jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 32), jnp.float32),
        jax.ShapeDtypeStruct((32, 16), jnp.float32))


def test_verify_files_and_text() -> None:
    d = FIXTURES / "megatron_mlp_shardy"
    report = scalify_hlo.verify(str(d / "before.mlir"), d / "after.hlo")
    assert report.name == "equivalent" and report.exit_code == 0
    report = scalify_hlo.verify((d / "before.mlir").read_text(), (d / "after.hlo").read_text())
    scalify_hlo.assert_equivalent(report)


def test_check_gspmd_partitioned_jit(mesh: jax.sharding.Mesh) -> None:
    shardings = (NamedSharding(mesh, P("dp", None)), NamedSharding(mesh, P(None, "tp")),
                 NamedSharding(mesh, P("tp", None)))
    report = check(mlp, *ARGS, in_shardings=shardings, out_shardings=NamedSharding(mesh, P("dp", None)))
    scalify_hlo.assert_equivalent(report)


def test_check_shard_map_catches_missing_psum(mesh: jax.sharding.Mesh) -> None:
    def good(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")

    def bad(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
        return jax.nn.relu(x @ w1) @ w2  # forgets the psum over "tp"

    specs = dict(mesh=mesh, in_specs=(P("dp", None), P(None, "tp"), P("tp", None)), out_specs=P("dp", None))
    scalify_hlo.assert_equivalent(check_shard_map(mlp, good, *ARGS, **specs))
    report = check_shard_map(mlp, bad, *ARGS, **specs)
    assert report.name == "discrepancy"
    with pytest.raises(AssertionError, match="psum"):
        scalify_hlo.assert_equivalent(report)
    site = report.findings[0].after
    lines = Path(__file__).read_text().splitlines()
    marker = next(n for n, line in enumerate(lines, start=1) if "forgets the psum" in line)
    assert site is not None and site.source == f"{__file__}:{marker}"
