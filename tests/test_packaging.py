"""The wheel (`python -m build --wheel`) installs what a training environment needs: every module, with
`parsers/` and `rules/` as `scalify_hlo.parsers` / `scalify_hlo.rules`, the `scalify-hlo` script and the
pytest plugin's entry point, and jax as a range (never a pin that would downgrade the user's jax).

Slow (a build in an isolated environment: setuptools is fetched by pip): `make test-slow`.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import REPO

SOURCES = {"scalify_hlo": "scalify_hlo", "parsers": "scalify_hlo/parsers", "rules": "scalify_hlo/rules"}


@pytest.mark.slow
def test_wheel_holds_every_module_and_entry_point(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves build/ behind, and a stale build/lib would hide a missing package.
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in SOURCES:
        shutil.copytree(REPO / folder, src / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    out = tmp_path / "dist"
    assert importlib.util.find_spec("build"), "needs the `build` package (the test extra: pip install -e '.[test]')"
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(src)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [wheel] = out.glob("scalify_hlo-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = {Path(n).name: z.read(n).decode() for n in names if ".dist-info/" in n}

    expected = {f"{SOURCES[folder]}/{p.relative_to(REPO / folder).as_posix()}"
                for folder in SOURCES for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts}
    assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"
    assert {"scalify_hlo/parsers/stablehlo.py", "scalify_hlo/rules/algebra.py",
            "scalify_hlo/pytest_plugin.py"} <= names
    assert not any(n.startswith(("parsers/", "rules/", "tests/", "tools/")) for n in names)

    entry_points = meta["entry_points.txt"]
    assert "[console_scripts]\nscalify-hlo = scalify_hlo.cli:main" in entry_points
    assert "[pytest11]\nscalify = scalify_hlo.pytest_plugin" in entry_points
    requires = [line for line in meta["METADATA"].splitlines() if line.startswith("Requires-Dist: jax")]
    assert sorted(requires) == ["Requires-Dist: jax<0.13,>=0.10.2", "Requires-Dist: jaxlib<0.13,>=0.10.2"], requires
