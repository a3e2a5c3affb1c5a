"""The prover's options: the e-graph budget, the seed and size limit of numeric checks, the mode, and the
input assumptions."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from scalify_hlo.prove.egraph import Budget


@dataclass(frozen=True, slots=True)
class Options:
    budget: Budget = field(default_factory=Budget)
    seed: int = 0
    numeric_limit: int = 1 << 24  # elements: term evaluation for counterexamples only below this
    plain: bool = False  # same-device-count equivalence (two per-device or two global programs, no layouts)
    progress: Callable[[str, int, int], None] | None = None  # (stage, ops done, ops in the stage)
    # Input name -> half-open range [lo, hi) its integer values are promised to lie in (token ids):
    # the verdict then holds for those inputs only, and the report says so.
    assume: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Runs of alike segments (unrolled layers) derived once and substituted (`prove/layers.py`); off, every
    # op is derived. A verdict other than `equivalent` reached with them is re-derived without.
    layers: bool = True
    # Seconds for the whole run: past them every value not yet read is left unread (`egraph.Deadline`) and
    # the verdict is `unknown`, naming the first. None: no limit.
    time_limit: float | None = 600.0
    # XLA's xla_allow_excess_precision (on by default): a bf16 op may be computed in f32 and its rounding to
    # bf16 dropped (`convert_f32(mul_bf16(x, y))` compiled as `mul_f32`). On, roundings to a narrower float
    # are not differences (`terms/precision.lifted`); off (the default of `diff`), they are.
    excess_precision: bool = False
