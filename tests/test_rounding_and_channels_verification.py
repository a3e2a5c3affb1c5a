"""Two mutations of real partitioned programs that once came out `equivalent` (found by a mutation sweep of
the fixtures): each still parses and runs under XLA's rules, and computes other numbers.

- A reducer body that rounds its f32 accumulator to bf16 (or fp8) at every step: another reduction, not the
  f32 sum it surrounds (`ops.reducers.reducer_of`).
- A collective-permute without a channel: cross-replica, so with one replica each device keeps its own value
  (pair (0, 0)) or receives zeros, whatever its other pairs say (`layout.groups.keeps_without_channel`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import FIXTURES

import scalify_hlo.ops.registry  # noqa: F401  (the numeric kernels)
from scalify_hlo import parsers
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric import trials
from scalify_hlo.prove.engine import prove


def _mutant(tmp_path: Path, fixture: str, old: str, new: str) -> tuple[Path, Path]:
    text = (FIXTURES / fixture / "after.hlo").read_text()
    assert text.count(old) == 1, f"{fixture}: expected one {old!r}"
    path = tmp_path / "after.hlo"
    path.write_text(text.replace(old, new))
    return FIXTURES / fixture / "before.mlir", path


def _differs(before: Path, after: Path) -> bool:
    b, a = parsers.load(before), parsers.load(after)
    ref, out = numeric.run_pair(b, a, trials.random_inputs(b, 0))
    return any(not np.allclose(x, y, rtol=1e-5, atol=1e-5) for x, y in zip(ref, out, strict=True))


ROUNDED = [
    ("rmsnorm_square_shardy", "ROOT %reduce_sum.2 = f32[] add(%reduce_sum.0, %reduce_sum.1)", "reduce_sum.2"),
    ("shard_map_in_jit_shardy", "ROOT %add.0 = f32[] add(%psum_invariant.0, %psum_invariant.1)", "add.0"),
]


@pytest.mark.parametrize("dtype", ["bf16", "f8e4m3fn"])
@pytest.mark.parametrize(("fixture", "root", "name"), ROUNDED)
def test_a_reducer_rounding_at_every_step_is_another_reduction(tmp_path: Path, fixture: str, root: str, name: str,
                                                              dtype: str) -> None:
    computed = root.replace(f"ROOT %{name}", f"%{name}.rr")
    rounded = f"{computed}\n  %{name}.rb = {dtype}[] convert(%{name}.rr)\n  ROOT %{name} = f32[] convert(%{name}.rb)"
    before, after = _mutant(tmp_path, fixture, root, rounded)
    assert _differs(before, after)
    assert prove(before, after).name != "equivalent"


@pytest.mark.parametrize(("fixture", "channel"), [("resplit_batch_shardy", "channel_id=1, "),
                                                   ("resplit_batch_shardy", "channel_id=3, "),
                                                   ("oc_flip_split_dim_shardy", "channel_id=1, ")])
def test_a_collective_permute_without_a_channel_is_cross_replica(tmp_path: Path, fixture: str, channel: str) -> None:
    line = next(ln for ln in (FIXTURES / fixture / "after.hlo").read_text().splitlines()
                if "collective-permute(" in ln and channel in ln)
    before, after = _mutant(tmp_path, fixture, line, line.replace(channel, ""))
    assert _differs(before, after)
    assert prove(before, after).name == "discrepancy"
