"""The numeric oracle against XLA on 8 fake CPU devices: a GSPMD/Shardy-partitioned program (the module
after XLA's SPMD partitioner, from an XLA dump), a jitted shard_map with every collective (as StableHLO
and after partitioning), and the committed fixtures against their stored XLA outputs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

from conftest import SLOW_RUNS, numeric_xla_flags, slow_if

numeric_xla_flags()  # before jax is imported

import functools  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from scalify_hlo import parsers  # noqa: E402
from scalify_hlo.ir.nodes import Module  # noqa: E402
from scalify_hlo.layout.mesh import Layout, Mesh  # noqa: E402
from scalify_hlo.numeric import machine as N  # noqa: E402
from scalify_hlo.numeric import trials  # noqa: E402

MESH = Mesh((("dp", 2), ("tp", 4)))
RTOL, ATOL = 1e-4, 1e-5
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _dump_dir() -> Path | None:
    m = re.search(r"--xla_dump_to=(\S+)", os.environ.get("XLA_FLAGS", ""))
    return Path(m.group(1)) if m else None


@pytest.fixture(scope="module")
def jax_mesh() -> jax.sharding.Mesh:
    if jax.device_count() < 8:
        pytest.skip("jax was initialised with fewer than 8 devices before this module set XLA_FLAGS")
    return jax.make_mesh((2, 4), ("dp", "tp"))


@functools.cache
def _fresh_dump() -> Path:
    """Compile the probes in a fresh process whose XLA dumps them (this file run as a script)."""
    out = Path(tempfile.mkdtemp(prefix="scalify_numeric_dump_"))
    atexit.register(shutil.rmtree, out, True)
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 --xla_dump_to={out} "
           "--xla_dump_hlo_pass_re=spmd-partitioning --xla_dump_hlo_module_re=.*numeric_probe.*"}
    subprocess.run([sys.executable, __file__], env=env, check=True, capture_output=True, timeout=300)
    return out


def _after_spmd(fn_name: str) -> Module:
    pattern = f"*{fn_name}*after_spmd-partitioning*.txt"
    d = _dump_dir()
    files = sorted(d.glob(pattern)) if d is not None and d.is_dir() else []
    if not files:  # XLA was configured before our flags: no dump in this process
        files = sorted(_fresh_dump().glob(pattern))
    assert files, f"no XLA dump of {fn_name} after spmd-partitioning"
    return parsers.load(files[-1])


BF16_RTOL = 2.0**-7


def _layout(spec: P, rank: int) -> Layout:
    dims = [() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in spec]
    return Layout(tuple(dims + [()] * (rank - len(dims))))


def _assert_close(expected: list[np.ndarray], got: list[np.ndarray], what: str, rtol: float = RTOL) -> None:
    assert [e.shape for e in expected] == [g.shape for g in got], what
    c = trials.compare(expected, got, rtol, ATOL)
    assert c.ok, f"{what}: {c.reason} (max abs errors {c.max_abs})"


# ------------------------------------------------------------------------------------ GSPMD / Shardy

def numeric_probe_spmd(x: jax.Array, w: jax.Array, i: jax.Array) -> tuple[jax.Array, ...]:
    y = jnp.tanh(x @ w)
    return (y, jnp.sum(y, axis=1), jnp.cumsum(y, axis=0), jax.nn.softmax(x, axis=-1).T,
            jnp.max(x, axis=0), lax.fori_loop(0, 3, lambda k, v: v * 0.5 + y, y) + i[0])


def numeric_probe_regroup(x: jax.Array, w: jax.Array, i: jax.Array) -> tuple[jax.Array, ...]:
    y = jnp.tanh(x @ w)
    return jnp.take(y, i, axis=0), jnp.sort(y, axis=0), y[:4] * 2


SPMD_IN = (P("dp", None), P(None, "tp"), P())
SPMD_OUT = (P("dp", "tp"), P("dp"), P(), P("tp", "dp"), P(None), P(None, "tp"))
REGROUP_OUT = (P(), P(), P("tp", None))


def _spmd_probe(mesh: jax.sharding.Mesh, fn: Any = numeric_probe_spmd,
                outs: tuple[P, ...] = SPMD_OUT) -> tuple[Any, list[np.ndarray]]:
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32),
              np.array([7, 0, 3, 3], np.int32)]
    jitted = jax.jit(fn, in_shardings=tuple(NamedSharding(mesh, s) for s in SPMD_IN),
                     out_shardings=tuple(NamedSharding(mesh, s) for s in outs))
    return jitted, inputs


def _spmd_case(mesh: jax.sharding.Mesh, fn: Any, outs: tuple[P, ...]) -> dict[str, Any]:
    jitted, inputs = _spmd_probe(mesh, fn, outs)
    expected = [np.asarray(o) for o in jitted(*inputs)]
    before = parsers.loads(jitted.lower(*inputs).as_text())
    return {"inputs": inputs, "expected": expected, "before": before, "after": _after_spmd(fn.__name__),
            "outs": outs}


@pytest.fixture(scope="module")
def spmd(jax_mesh: jax.sharding.Mesh) -> dict[str, Any]:
    return _spmd_case(jax_mesh, numeric_probe_spmd, SPMD_OUT)


@pytest.fixture(scope="module")
def regroup(jax_mesh: jax.sharding.Mesh) -> dict[str, Any]:
    return _spmd_case(jax_mesh, numeric_probe_regroup, REGROUP_OUT)


def test_spmd_reference_matches_xla(spmd: dict[str, Any], regroup: dict[str, Any]) -> None:
    _assert_close(spmd["expected"], N.run_before(spmd["before"], spmd["inputs"]), "before")
    _assert_close(regroup["expected"], N.run_before(regroup["before"], regroup["inputs"]), "before")


def _check_partitioned(case: dict[str, Any]) -> None:
    after: Module = case["after"]
    assert after.num_partitions == 8
    # Layouts passed in: XLA of jax 0.11+ keeps no sharding on the module after SPMD partitioning.
    ins = [_layout(s, x.ndim) for s, x in zip(SPMD_IN, case["inputs"], strict=True)]
    outs = [_layout(s, e.ndim) for s, e in zip(case["outs"], case["expected"], strict=True)]
    got = N.run_after(after, case["inputs"], MESH, in_layouts=ins, out_layouts=outs,
                      out_shapes=[e.shape for e in case["expected"]])
    _assert_close(case["expected"], got, "after spmd-partitioning")


def test_spmd_partitioned_matches_xla(spmd: dict[str, Any]) -> None:
    _check_partitioned(spmd)


def test_spmd_regrouped_collectives_match_xla(regroup: dict[str, Any]) -> None:
    # XLA's HLO→StableHLO converter drops the device_ids=(...) of mesh-spelled replica groups
    # (`mesh[...], device_ids=([2,4]T(1,0)) {'axis_1'}`); parsers/_hloproto.py writes them out first.
    _check_partitioned(regroup)


def test_spmd_pair_takes_output_layouts_from_before(spmd: dict[str, Any]) -> None:
    before, after = N.run_pair(spmd["before"], spmd["after"], spmd["inputs"])
    _assert_close(before, after, "run_pair")


def test_spmd_broken_collective_is_caught(spmd: dict[str, Any]) -> None:
    """The oracle is not vacuous: one all-reduce made to skip its partners changes the outputs."""
    import dataclasses

    from scalify_hlo.ir.nodes import Func, Region

    after: Module = spmd["after"]
    main = after.main
    ops = list(main.body.ops)
    k = next(i for i, op in enumerate(ops) if op.opcode == "all_reduce")
    ops[k] = dataclasses.replace(ops[k], attrs=ops[k].attrs.replace(channel_handle=None))  # now per-partition
    broken = dataclasses.replace(after, funcs={**after.funcs, main.name: Func(
        main.name, Region(main.body.args, tuple(ops), main.body.results), main.arg_attrs, main.result_attrs)})
    before, got = N.run_pair(spmd["before"], broken, spmd["inputs"])
    assert not trials.compare(before, got, RTOL, ATOL).ok


# ---------------------------------------------------------------------------------------- shard_map

def _collectives(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
    a = lax.psum(x, "tp")
    b = lax.all_gather(x, "tp", axis=1, tiled=True)
    c = lax.psum_scatter(y, "tp", scatter_dimension=0, tiled=True)
    d = lax.ppermute(x, "tp", perm=[(i, (i + 1) % 4) for i in range(4)])
    e = lax.all_to_all(y, "tp", 0, 1, tiled=True)
    f = (lax.axis_index("tp") + 10 * lax.axis_index("dp")).astype(jnp.float32) * jnp.ones_like(x)
    g = lax.pmax(x, ("dp", "tp"))
    h = lax.psum(jnp.sum(x * x), ("dp", "tp"))  # a scalar, replicated everywhere
    return a, b, c, d, e, f, g, h


SM_IN = (P("dp", "tp"), P("dp", "tp"))
SM_OUT = (P("dp", "tp"),) * 7 + (P(),)


def _shard_map_probe(mesh: jax.sharding.Mesh) -> tuple[Any, list[np.ndarray], list[jax.Array], list[Any]]:
    sm = jax.shard_map(_collectives, mesh=mesh, in_specs=SM_IN, out_specs=SM_OUT, check_vma=False)

    def numeric_probe_shard_map(x: jax.Array, y: jax.Array) -> tuple[jax.Array, ...]:
        return sm(x, y)

    spec = NamedSharding(mesh, P("dp", "tp"))
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)]
    placed = [jax.device_put(v, spec) for v in inputs]
    abstract = [jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=spec) for v in inputs]
    return jax.jit(numeric_probe_shard_map), inputs, placed, abstract


@pytest.fixture(scope="module")
def shard_map_case(jax_mesh: jax.sharding.Mesh) -> dict[str, Any]:
    jitted, inputs, placed, abstract = _shard_map_probe(jax_mesh)
    expected = [np.asarray(o) for o in jitted(*placed)]
    module = parsers.loads(jitted.lower(*abstract).as_text())
    return {"inputs": inputs, "expected": expected, "module": module,
            "after": _after_spmd("numeric_probe_shard_map")}


def test_shard_map_stablehlo_matches_xla(shard_map_case: dict[str, Any]) -> None:
    module = shard_map_case["module"]
    assert N.is_shard_map(module)
    _assert_close(shard_map_case["expected"], N.run_after(module, shard_map_case["inputs"]), "shard_map")


def test_shard_map_partitioned_matches_xla(shard_map_case: dict[str, Any]) -> None:
    expected = shard_map_case["expected"]
    ins = [_layout(s, x.ndim) for s, x in zip(SM_IN, shard_map_case["inputs"], strict=True)]
    outs = [_layout(s, e.ndim) for s, e in zip(SM_OUT, expected, strict=True)]
    got = N.run_after(shard_map_case["after"], shard_map_case["inputs"], MESH, in_layouts=ins, out_layouts=outs)
    _assert_close(expected, got, "shard_map after spmd-partitioning")


# ------------------------------------------------------------------------------------------- fixtures

FIXTURE_DIRS = sorted(p for p in FIXTURES.iterdir() if (p / "oracle.npz").is_file()) if FIXTURES.is_dir() else []


def _stored(z: Any, prefix: str) -> list[np.ndarray]:
    keys = sorted((k for k in z.files if re.fullmatch(prefix + r"\d+", k)), key=lambda k: int(k[len(prefix):]))
    return [z[k] for k in keys]


@pytest.mark.skipif(not FIXTURE_DIRS, reason="no fixtures under tests/fixtures (tools/gen_fixtures.py)")
@pytest.mark.parametrize("d", [pytest.param(d, id=d.name, marks=slow_if(d.name, SLOW_RUNS)) for d in FIXTURE_DIRS])
def test_fixture_against_stored_xla_outputs(d: Path) -> None:
    expected = json.loads((d / "expected.json").read_text())
    with np.load(d / "oracle.npz") as z:
        inputs, xla_before, xla_after = _stored(z, "in_"), _stored(z, "before_out_"), _stored(z, "after_out_")
    after_file = next(p for p in d.iterdir() if p.name.startswith("after."))
    before, after = N.run_pair(parsers.load(d / "before.mlir"), parsers.load(after_file), inputs)
    # (The generator stores 0-d outputs as shape [1].) A pair stated with excess precision: XLA drops roundings
    # to bf16 that the interpreter keeps, so they agree to a bf16 ulp (2**-8), not to f32's tolerance.
    rtol = BF16_RTOL if expected.get("excess_precision") else RTOL
    _assert_close([x.reshape(b.shape) for x, b in zip(xla_before, before, strict=True)], before, "before", rtol)
    if xla_after:
        _assert_close([x.reshape(a.shape) for x, a in zip(xla_after, after, strict=True)], after, "after", rtol)
    agree = trials.compare(before, after, rtol, ATOL).ok
    assert agree == (expected["verdict"] == "equivalent"), expected["description"]


if __name__ == "__main__":  # the fresh-process fallback of `_fresh_dump`: compile the probes once
    _mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    for _fn, _outs in ((numeric_probe_spmd, SPMD_OUT), (numeric_probe_regroup, REGROUP_OUT)):
        _jitted, _inputs = _spmd_probe(_mesh, _fn, _outs)
        _jitted(*_inputs)
    _sm, _, _placed, _ = _shard_map_probe(_mesh)
    _sm(*_placed)
