"""`pytest --scalify` on a user's test file (pytester, in this process: the 8 fake devices of conftest.py):
a correct sharded jit passes, a shard_map that forgets its psum or sums over the wrong axis fails with
the line, and the `scalify` fixture hands the test its session."""

from __future__ import annotations

import importlib.metadata

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = '''
import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
SPECS = (P("dp", None), P(None, "tp"), P("tp", None))


def inputs():
    shapes = [(8, 16), (16, 32), (32, 16)]
    return [jax.device_put(jnp.ones(s), NamedSharding(mesh, spec)) for s, spec in zip(shapes, SPECS)]


@jax.jit
def mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def tp_body(x, w1, w2):
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")


def missing_psum_body(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2  # BUG: missing psum


def wrong_axis_body(x, w1, w2):
    return jax.lax.psum(jax.nn.relu(x @ w1) @ w2, "dp")  # BUG: psum over the wrong axis


def step(body):
    @jax.jit
    def run(x, w1, w2):
        y = jax.shard_map(body, mesh=mesh, in_specs=SPECS, out_specs=P("dp", None), check_vma=False)(x, w1, w2)
        return 2.0 * y
    return run


def test_gspmd():
    mlp(*inputs())


def test_shard_map():
    step(tp_body)(*inputs())


def test_missing_psum():
    step(missing_psum_body)(*inputs())


def test_wrong_axis():
    step(wrong_axis_body)(*inputs())


def test_fixture(scalify):
    # (functions of their own: one compiled by an earlier test is not compiled again, so not captured again)
    jax.jit(lambda x, w1, w2: mlp(x, w1, w2) + 1.0)(*inputs())
    step(tp_body)(*inputs())
    done = scalify.flush()
    assert [r.verdict for r in done] == ["equivalent", "equivalent"], scalify.summary()
'''


@pytest.fixture(scope="module", autouse=True)
def _loaded_before_pytester() -> None:
    """Everything a verification imports, loaded before pytester snapshots sys.modules: it drops the modules
    an inner run imported when that run ends, and a native extension imported twice aborts the process."""
    namespace: dict[str, object] = {}
    exec(compile(USER_TESTS, "<warm-up>", "exec"), namespace)
    from scalify_hlo.jax import verifying

    with verifying(raise_on=()) as session:
        namespace["test_gspmd"]()  # type: ignore[operator]
        namespace["test_shard_map"]()  # type: ignore[operator]
    assert [r.verdict for r in session.results] == ["equivalent", "equivalent"], session.summary()


def _plugin_args() -> list[str]:
    # Installed (pip install -e . / the wheel), the entry point loads it; a checkout not reinstalled since
    # the entry point was added loads it by name.
    installed = any(e.value == "scalify_hlo.pytest_plugin" for e in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "scalify_hlo.pytest_plugin"]


def test_scalify_flag_fails_only_the_buggy_tests(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess("--scalify", "-p", "no:cacheprovider", "-p", "no:xdist", *_plugin_args())
    result.assert_outcomes(passed=3, failed=2)
    out = result.stdout.str()
    assert "FAILED test_user.py::test_missing_psum" in out and "FAILED test_user.py::test_wrong_axis" in out
    # The diagnostic names the buggy line of the user's file and the missing reduction.
    for marker in ("# BUG: missing psum", "# BUG: psum over the wrong axis"):
        line = next(n for n, text in enumerate(USER_TESTS.splitlines()) if marker in text)  # (from the \n)
        assert f'test_user.py:{line}: error: shard_map returns a value that is still partial over {{"tp"}}' in out
        assert marker in out
    assert "During handling" not in out  # the diagnostic alone


def test_without_the_flag_nothing_is_checked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", *_plugin_args(),
                                          "-k", "missing_psum or wrong_axis")
    result.assert_outcomes(passed=2)
