"""The pytest plugin: `pytest --scalify` verifies every multi-device `jax.jit` function a test runs.

Registered through the `pytest11` entry point (pyproject.toml), so pytest loads it in any environment where
scalify-hlo is installed; it does nothing unless asked:

- `pytest --scalify`: each test runs inside `scalify_hlo.jax.verifying()` (from the start of its set-up to
  the end of its body); a discrepancy fails the test with the compiler-style diagnostic.
  `--scalify-strict` also fails a test on `unknown` (a program not proven, or not captured).
- the `scalify` fixture: the test's `Session` (started for that test even without `--scalify`), e.g.
  `scalify.flush()` to verify what ran so far and look at the verdicts.

Every pytest run loads this module, so it imports neither jax nor the prover until a test asks for them
(jax must see the test suite's XLA_FLAGS, such as a fake device count, before it starts).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from scalify_hlo.jax import Session

_SESSION = pytest.StashKey["Session"]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("scalify", "scalify-hlo: prove partitioned jax.jit programs equal to their reference")
    group.addoption("--scalify", action="store_true", default=False,
                    help="verify every jax.jit function a test runs on more than one device; a discrepancy "
                         "fails the test with the line where the programs differ")
    group.addoption("--scalify-strict", action="store_true", default=False,
                    help="with --scalify, also fail a test on 'unknown' (not proven or not captured)")


def _raise_on(config: pytest.Config) -> tuple[str, ...]:
    return ("discrepancy", "unknown") if config.getoption("scalify_strict") else ("discrepancy",)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    if item.config.getoption("scalify") or "scalify" in getattr(item, "fixturenames", ()):
        from scalify_hlo.jax import Session  # (jax loads here, once a test wants it)

        item.stash[_SESSION] = Session(_raise_on(item.config), {}).start()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    session = item.stash.get(_SESSION, None)
    if session is None:
        return (yield)
    try:
        result = yield
    except BaseException:
        session.finish(check=False)  # the test failed on its own: its own error is the one to show
        raise
    from scalify_hlo.jax import VerificationFailure

    try:
        session.finish()
    except VerificationFailure as err:
        failure = str(err)
    else:
        return result
    pytest.fail(failure, pytrace=False)  # (outside the except: the diagnostic alone, no chained traceback)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    session = item.stash.get(_SESSION, None)
    if session is not None:
        session.finish(check=False)  # (set-up failed or the body did not run: stop capturing)
    return (yield)


@pytest.fixture
def scalify(request: pytest.FixtureRequest) -> Session:
    """This test's verification session: every multi-device jit the test runs is captured; `flush()`
    verifies them now, `results` / `summary()` show the verdicts. A discrepancy fails the test at its end."""
    return request.node.stash[_SESSION]
