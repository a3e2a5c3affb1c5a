"""Every example in the README runs, so the documentation cannot rot: the ```python blocks are executed,
the ```console lines are run and must exit as their `# exit N` line says."""

from __future__ import annotations

import re

import pytest
from conftest import REPO, run_cli

README = (REPO / "README.md").read_text()
PYTHON = re.findall(r"```python\n(.*?)```", README, re.S)
CONSOLE = [
    (cmd, int(code))
    for block in re.findall(r"```console\n(.*?)```", README, re.S)
    for cmd, code in re.findall(r"^\$ (.*)\n# exit (\d+)$", block, re.M)
]


@pytest.mark.parametrize("code", PYTHON, ids=[f"python-{i}" for i in range(len(PYTHON))])
def test_python_example(code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})


@pytest.mark.parametrize(("command", "exit_code"), CONSOLE, ids=[c for c, _ in CONSOLE])
def test_console_example(command: str, exit_code: int) -> None:
    (REPO / "out").mkdir(exist_ok=True)
    args = command.split()
    assert args[0] == "scalify-hlo"
    proc = run_cli(*args[1:])
    assert proc.returncode == exit_code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_readme_has_examples() -> None:
    assert len(PYTHON) >= 1 and len(CONSOLE) >= 4
