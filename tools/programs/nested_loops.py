"""Nested ``lax.fori_loop``s: the same depth-``d`` loop nest in a reference and in a shard_map body.

The reference ``f(x)`` runs ``d`` nested ``fori_loop``s (each a ``stablehlo.while`` carrying its counter)
whose innermost body is the elementwise update ``x * 0.5 + 1.0 + 0.25 * i`` (``i`` the innermost counter);
the shard_map implementation runs the very same nest on each device's block of ``x`` (rows over "dp",
columns over "tp"). Elementwise, so the blocks put together are the reference's result: the verifier must
prove every loop by induction, with a cost linear in the depth (a loop nest must not be re-derived per
level or run iteration by iteration).

Variants of the implementation: "correct"; "constant" (the innermost update adds 2.0, not 1.0);
"trips" (the innermost loop runs one iteration more than the reference's); "late_start" (the outermost
loop starts from 1: it matches no loop of the reference, whose counter starts from 0).

    python tools/programs/nested_loops.py DEPTH OUT_DIR [--variant V]

writes ``before.mlir`` and ``after.mlir`` of that depth (for benchmarks and scale tests).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # 8 fake CPU devices: must precede the first `import jax`
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from collections.abc import Callable
from functools import partial
from pathlib import Path

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

TRIPS = 2  # iterations of every loop: the nest runs TRIPS ** depth innermost steps when executed
SCALE, SHIFT, STEP = 0.5, 1.0, 0.25


def _update(x: jax.Array, i: jax.Array) -> jax.Array:
    """The innermost step: a contraction, plus the innermost loop's counter (so that a different trip
    count moves the fixed point the nest converges to, rather than only the way there)."""
    return x * SCALE + SHIFT + i.astype(x.dtype) * STEP


def _update_constant(x: jax.Array, i: jax.Array) -> jax.Array:
    return x * SCALE + 2.0 + i.astype(x.dtype) * STEP  # BUG: innermost update adds 2.0 where the reference adds 1.0


def nest(x: jax.Array, depth: int, inner: Callable[[jax.Array, jax.Array], jax.Array] = _update,
         inner_trips: int = TRIPS) -> jax.Array:
    """``depth`` (at least 1) nested fori_loops of ``TRIPS`` iterations, the innermost of ``inner_trips``
    iterations applying ``inner`` (to the value and the innermost counter)."""
    if depth == 1:
        return jax.lax.fori_loop(0, inner_trips, lambda i, y: inner(y, i), x)
    return jax.lax.fori_loop(0, TRIPS, lambda _, y: nest(y, depth - 1, inner, inner_trips), x)


def _nest_more_trips(x: jax.Array, depth: int) -> jax.Array:
    return nest(x, depth, inner_trips=TRIPS + 1)  # BUG: innermost loop runs one iteration more than the reference's


def _nest_late_start(x: jax.Array, depth: int) -> jax.Array:
    return jax.lax.fori_loop(1, TRIPS, lambda _, y: nest(y, depth - 1), x)  # BUG: outermost loop starts at 1


def reference(x: jax.Array, depth: int) -> jax.Array:
    return nest(x, depth)


VARIANTS: dict[str, Callable[..., jax.Array]] = {  # (x, depth) -> the nest's result
    "correct": nest,
    "constant": lambda x, depth: nest(x, depth, _update_constant),
    "trips": _nest_more_trips,
    "late_start": _nest_late_start,
}
BUG_FUNCTIONS: dict[str, Callable[..., object]] = {"constant": _update_constant, "trips": _nest_more_trips,
                                                   "late_start": _nest_late_start}


def specs() -> tuple[tuple[P], P]:
    return (P("dp", "tp"),), P("dp", "tp")


def init(rows: int, cols: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((rows, cols)).astype(np.float32)]


def shard_map_nest(mesh: jax.sharding.Mesh, depth: int, variant: str = "correct") -> Callable[..., jax.Array]:
    in_specs, out_spec = specs()
    return jax.shard_map(partial(VARIANTS[variant], depth=depth), mesh=mesh, in_specs=in_specs, out_specs=out_spec,
                         check_vma=False)


def lower(depth: int, variant: str = "correct", shape: tuple[int, int] = (8, 16)) -> tuple[str, str]:
    """The (before, after) StableHLO texts of a depth-``depth`` nest on a (dp=2, tp=4) mesh."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto, AxisType.Auto))
    x = jax.ShapeDtypeStruct(shape, np.float32)
    before = jax.jit(partial(reference, depth=depth)).lower(x).as_text(debug_info=True)
    sharded = jax.ShapeDtypeStruct(shape, np.float32, sharding=NamedSharding(mesh, specs()[0][0]))
    after = jax.jit(shard_map_nest(mesh, depth, variant)).lower(sharded).as_text(debug_info=True)
    return before, after


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("depth", type=int)
    ap.add_argument("out", type=Path)
    ap.add_argument("--variant", default="correct", choices=sorted(VARIANTS))
    ns = ap.parse_args(argv)
    before, after = lower(ns.depth, ns.variant)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "before.mlir").write_text(before)
    (ns.out / "after.mlir").write_text(after)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
