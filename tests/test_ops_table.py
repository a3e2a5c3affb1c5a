"""docs/ops.md is what `tools/gen_ops_table.py` generates: the op coverage is discovered, not listed.

The table is regenerated in memory from the installed jaxlib's dialect bindings and the code (kernels,
transfer rules, algebra, fixtures). On the oldest supported jaxlib (constraints/oldest.txt), the one the
table is written for, the whole file must match. On a newer jaxlib the rows of the ops both know must
match, and every op the installed bindings define must have a row: a new JAX version's new op fails here
by name, as does an op gaining a kernel or a rule. Fix: `python tools/gen_ops_table.py` (after recording a
newer jaxlib's op in `EXTRA_OPS`, with a reason in `REASONS` when it is not supported).

Run alone: `python -m pytest tests/test_ops_table.py`.
"""

from __future__ import annotations

import difflib
import importlib.util
import sys
from importlib import metadata
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "gen_ops_table.py"
REGENERATE = "python tools/gen_ops_table.py"
CACHE_KEY = "scalify/ops_table_fixture_ops"  # the ops of each fixture program, by jaxlib and content hash


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ops_table", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gen = _load_tool()


@pytest.fixture(scope="module")
def generated(request: pytest.FixtureRequest) -> str:
    """The table as the code and the installed jaxlib make it. Reading the fixture programs through jaxlib
    is most of the time, so their ops are kept in pytest's cache, keyed by jaxlib and content hash."""
    cache = getattr(request.config, "cache", None)  # None under `-p no:cacheprovider`
    known = cache.get(CACHE_KEY, {}) if cache is not None else {}
    if not isinstance(known, dict):
        known = {}
    text = str(gen.render(gen.rows(known=known)))
    if cache is not None:
        cache.set(CACHE_KEY, known)
    return text


@pytest.fixture(scope="module")
def written() -> str:
    assert gen.OUT.exists(), f"{gen.OUT.relative_to(ROOT)} is missing; run `{REGENERATE}`"
    return gen.OUT.read_text()


def _oldest() -> bool:
    return bool(metadata.version("jaxlib") == gen.oldest_jaxlib())


def test_every_installed_op_has_a_row(written: str) -> None:
    rows = gen.table_lines(written)
    missing = sorted(set(gen.table_ops(gen.installed_ops())) - rows.keys())
    if missing:
        pytest.fail(f"jaxlib {metadata.version('jaxlib')} defines ops docs/ops.md lacks:\n  " + "\n  ".join(missing)
                    + "\nRecord them in EXTRA_OPS of tools/gen_ops_table.py (and in REASONS when they are not "
                    f"supported), then run `{REGENERATE}`", pytrace=False)


def test_table_matches_the_code(generated: str, written: str) -> None:
    if _oldest():
        if generated != written:
            diff = difflib.unified_diff(written.splitlines(), generated.splitlines(), "docs/ops.md",
                                        "generated", lineterm="", n=0)
            pytest.fail("docs/ops.md is out of date (a new op, or an op gaining or losing a kernel, rule or "
                        "fixture):\n" + "\n".join(diff) + f"\nRegenerate it: `{REGENERATE}`", pytrace=False)
        return
    # A newer jaxlib: the rows of the ops both know (ops it dropped keep their rows; new ones fail above).
    old, new = gen.table_lines(written), gen.table_lines(generated)
    differing = [f"- {old[op]}\n+ {new[op]}" for op in sorted(old.keys() & new.keys()) if old[op] != new[op]]
    if differing:
        pytest.fail(f"docs/ops.md disagrees with the code on jaxlib {metadata.version('jaxlib')}:\n"
                    + "\n".join(differing) + f"\nRegenerate it (on jaxlib {gen.oldest_jaxlib()}): "
                    f"`{REGENERATE}`", pytrace=False)


def test_every_unsupported_op_says_why(generated: str) -> None:
    untriaged = [op for op, line in gen.table_lines(generated).items() if gen.UNTRIAGED in line]
    if untriaged:
        pytest.fail("ops with neither a kernel nor a transfer rule and no reason recorded:\n  "
                    + "\n  ".join(untriaged)
                    + f"\nAdd each to REASONS in tools/gen_ops_table.py (or support it), then run `{REGENERATE}`",
                    pytrace=False)
