"""scalify_hlo.jax beyond the README: `check_shard_map` takes what `jax.shard_map` takes (pytree arguments,
spec prefixes, an AbstractMesh or the context mesh, check_rep), and `verifying()` checks every multi-device
jit run in a block, names a bug's line, and reports what it could not capture as unknown."""

from __future__ import annotations

import importlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from scalify_hlo.jax import VerificationFailure, check, check_shard_map, verifying

AXES = ("dp", "tp")
PARAMS = {"w1": jax.ShapeDtypeStruct((16, 32), jnp.float32), "w2": jax.ShapeDtypeStruct((32, 16), jnp.float32)}
X = jax.ShapeDtypeStruct((8, 16), jnp.float32)
TP_SPECS = ({"w1": P(None, "tp"), "w2": P("tp", None)}, P("dp"))


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), AXES, axis_types=(AxisType.Auto,) * 2)


def mlp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jax.nn.relu(x @ params["w1"]) @ params["w2"]


def mlp_tp(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jax.lax.psum(mlp(params, x), "tp")


def mlp_tp_wrong_axis(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    return jax.lax.psum(mlp(params, x), "dp")  # BUG: sums over dp, the partial sums are over tp


def _line(marker: str) -> str:
    lines = Path(__file__).read_text().splitlines()
    return f"{__file__}:{next(n for n, text in enumerate(lines, start=1) if marker in text)}"


def test_specs_are_pytree_prefixes(mesh: jax.sharding.Mesh) -> None:
    # One spec for the whole params dict, one P() for every argument, a dict of specs.
    assert check_shard_map(mlp, mlp, PARAMS, X, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp")).name \
        == "equivalent"
    assert check_shard_map(mlp, mlp, PARAMS, X, mesh=mesh, in_specs=P(), out_specs=P()).name == "equivalent"
    assert check_shard_map(mlp, mlp_tp, PARAMS, X, mesh=mesh, in_specs=TP_SPECS, out_specs=P("dp"),
                           check_rep=True).name == "equivalent"
    report = check_shard_map(mlp, mlp_tp_wrong_axis, PARAMS, X, mesh=mesh, in_specs=TP_SPECS, out_specs=P("dp"))
    assert report.name == "discrepancy"
    site = report.findings[0].after
    assert site is not None and site.source == _line("# BUG: sums over dp")
    with pytest.raises(ValueError, match="prefix"):
        check_shard_map(mlp, mlp, PARAMS, X, mesh=mesh, in_specs=(P(), P(), P()), out_specs=P())


def test_abstract_and_context_meshes(mesh: jax.sharding.Mesh) -> None:
    abstract = AbstractMesh((2, 4), AXES, axis_types=(AxisType.Auto,) * 2)
    assert check_shard_map(mlp, mlp_tp, PARAMS, X, mesh=abstract, in_specs=TP_SPECS, out_specs=P("dp")).name \
        == "equivalent"
    with jax.set_mesh(mesh):
        assert check_shard_map(mlp, mlp_tp, PARAMS, X, in_specs=TP_SPECS, out_specs=P("dp")).name == "equivalent"
    with pytest.raises(ValueError, match="no mesh"):
        check_shard_map(mlp, mlp_tp, PARAMS, X, in_specs=TP_SPECS, out_specs=P("dp"))


def _sharded(mesh: jax.sharding.Mesh) -> tuple[dict[str, jax.Array], jax.Array]:
    def put(s: jax.ShapeDtypeStruct, spec: P) -> jax.Array:
        return jax.device_put(jnp.ones(s.shape, s.dtype), NamedSharding(mesh, spec))

    params = {k: put(v, spec) for (k, v), spec in zip(PARAMS.items(), TP_SPECS[0].values(), strict=True)}
    return params, put(X, P("dp"))


def _step(mesh: jax.sharding.Mesh, body: object) -> object:
    @jax.jit
    def step(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        y = jax.shard_map(body, mesh=mesh, in_specs=TP_SPECS, out_specs=P("dp"), check_vma=False)(params, x)
        return jnp.tanh(y)
    return step


def test_verifying_names_the_bug_and_restores_jax(mesh: jax.sharding.Mesh) -> None:
    pjit = importlib.import_module("jax._src.pjit")
    original = pjit._run_python_pjit
    params, x = _sharded(mesh)
    with verifying() as session:
        jax.jit(mlp)(params, x)
        _step(mesh, mlp_tp)(params, x)  # type: ignore[operator]
        jnp.sum(x)  # an eager op of jax's own: not a user jit
    assert [r.verdict for r in session.results] == ["equivalent", "equivalent"], session.summary()
    assert session.summary().splitlines()[0].startswith("mlp at ")
    assert pjit._run_python_pjit is original

    with pytest.raises(VerificationFailure) as failure, verifying():
        _step(mesh, mlp_tp_wrong_axis)(params, x)  # type: ignore[operator]
    assert f"{_line('# BUG: sums over dp')}: error:" in str(failure.value)
    assert pjit._run_python_pjit is original


def test_verifying_reports_what_it_cannot_redo_as_unknown(mesh: jax.sharding.Mesh) -> None:
    def rotate(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
        # Pairs of devices written out: no one-device reference exists, so no verdict but unknown.
        return jax.lax.ppermute(mlp_tp(params, x), "dp", [(0, 1), (1, 0)])

    params, x = _sharded(mesh)
    with verifying() as session:  # (unknown is not in raise_on by default)
        _step(mesh, rotate)(params, x)  # type: ignore[operator]
    [result] = session.results
    assert result.verdict == "unknown" and "one-device reference" in result.reason
    with pytest.raises(VerificationFailure, match="unknown"), verifying(raise_on=("discrepancy", "unknown")):
        _step(mesh, rotate)(params, jnp.ones((8, 16)))  # type: ignore[operator]


def test_an_error_in_the_block_propagates(mesh: jax.sharding.Mesh) -> None:
    params, x = _sharded(mesh)
    with pytest.raises(ZeroDivisionError), verifying() as session:
        _step(mesh, mlp_tp_wrong_axis)(params, x)  # type: ignore[operator]
        _ = 1 / 0
    assert session.results == []  # (not verified: the block's own error is the one that matters)


@pytest.mark.skipif(not hasattr(jax.lax, "fma"), reason="lax.fma (stablehlo.fma) is new in jax 0.12.1")
def test_fused_multiply_add_is_multiply_then_add(mesh: jax.sharding.Mesh) -> None:
    # stablehlo.fma rounds once, a * b + c twice: equal over the reals, where float programs are compared
    v = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    specs = dict(mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp"))

    def reference(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        return jnp.log2(jnp.exp2(a * b + c))

    def fused(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        return jnp.log2(jnp.exp2(jax.lax.fma(a, b, c)))

    def fused_wrong(a: jax.Array, b: jax.Array, c: jax.Array) -> jax.Array:
        return jnp.log2(jnp.exp2(jax.lax.fma(a, c, b)))  # BUG: a * c + b

    assert "stablehlo.fma" in jax.jit(fused).lower(v, v, v).as_text()
    assert check_shard_map(reference, fused, v, v, v, **specs).name == "equivalent"
    assert check_shard_map(reference, fused_wrong, v, v, v, **specs).name == "discrepancy"


def test_special_functions_lowered_to_ffi_kernels(mesh: jax.sharding.Mesh) -> None:
    # jax >= 0.12.1 lowers lgamma and digamma to FFI custom calls on CPU (cpu_lgamma_ffi, cpu_digamma_ffi);
    # older jax to chlo ops. Either way the proof reads them as the elementwise functions.
    v = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    specs = dict(mesh=mesh, in_specs=P("dp", "tp"), out_specs=P("dp", "tp"))

    def reference(a: jax.Array) -> jax.Array:
        return jax.scipy.special.gammaln(a) - jax.scipy.special.digamma(a)

    def swapped(a: jax.Array) -> jax.Array:
        return jax.scipy.special.digamma(a) - jax.scipy.special.gammaln(a)  # BUG: the other way round

    assert check_shard_map(reference, reference, v, **specs).name == "equivalent"
    assert check_shard_map(reference, swapped, v, **specs).name == "discrepancy"
    with verifying() as session:  # GSPMD: XLA's partitioned module keeps the calls (or chlo's expansions)
        jax.jit(reference)(jax.device_put(jnp.full((8, 16), 2.5, jnp.float32), NamedSharding(mesh, P("dp", "tp"))))
    assert [r.verdict for r in session.results] == ["equivalent"], session.summary()


def test_verifying_captures_a_jit_whose_input_jax_moves_first(mesh: jax.sharding.Mesh) -> None:
    # An uncommitted one-device input and explicit in_shardings: jax runs a jit of its own to move the input
    # between tracing the user's jit and running it. The call is still paired with its jit and proven.
    sharding = NamedSharding(mesh, P("dp", "tp"))

    def scale(a: jax.Array) -> jax.Array:
        return jnp.sin(a) * 2

    with verifying() as session:
        jax.jit(scale, in_shardings=sharding, out_shardings=sharding)(jnp.ones((8, 16), jnp.float32))
    assert [r.verdict for r in session.results] == ["equivalent"], session.summary()


def test_check_reads_large_constants_of_the_partitioned_module(mesh: jax.sharding.Mesh) -> None:
    # XLA's dump elides a constant of more than a few elements unless told otherwise; check() must ask for
    # them in full (it read its own dump as bad input before).
    table = np.linspace(0.5, 2.0, 16).astype(np.float32)  # a per-position scale table
    x = jax.ShapeDtypeStruct((4, 16, 8), jnp.float32)
    split = NamedSharding(mesh, P("dp", None, "tp"))
    assert check(lambda v: v * table[None, :, None], x, in_shardings=split, out_shardings=split).name == "equivalent"
