"""What one program of the shard_map corpus is (tools/programs/shard_map_corpus.py holds the registry).

A `Program` pairs a plain jnp reference (global arrays in, global arrays out) with a shard_map body (one
device's blocks in and out) and what shard_map needs to run the body: the mesh, in_specs and out_specs;
`inputs` gives the global shape and dtype of each argument of both functions. A program marked `bug` is a
deliberately wrong twin of a correct one: its body carries a ``# BUG: <what>`` comment on the wrong line,
and the verifier must call it a discrepancy there (never equivalent).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jax.sharding import PartitionSpec as P

# Meshes of the 8 fake CPU devices, as ((axis name, size), ...): 1-D, 2-D both ways, and the 2x2x2 mesh of
# shard_map_test.py's `create_inputs`.
M8 = (("i", 8),)
M8X = (("x", 8),)
M8B = (("batch", 8),)
M24 = (("x", 2), ("y", 4))
M42 = (("i", 4), ("j", 2))
M42XY = (("x", 4), ("y", 2))
M222 = (("x", 2), ("y", 2), ("z", 2))


@dataclass(frozen=True)
class Arg:
    """A global input: shape and dtype ("float32", "int32" or "bool")."""

    shape: tuple[int, ...]
    dtype: str = "float32"


@dataclass(frozen=True)
class Program:
    name: str
    ref: Callable[..., Any]  # jnp on global arrays
    body: Callable[..., Any]  # one device's view, under jax.shard_map
    mesh: tuple[tuple[str, int], ...]
    in_specs: tuple[Any, ...]  # one spec (or a pytree prefix of specs) per argument
    out_specs: Any
    inputs: tuple[Any, ...]  # one pytree of `Arg` per argument
    origin: str  # where the computation comes from: "tutorial: ..." / "shard_map_test: ..." / "pattern: ..."
    bug: bool = False  # a deliberately wrong twin: expected `discrepancy` at its `# BUG:` line


def f32(*shape: int) -> Arg:
    return Arg(tuple(shape), "float32")


def i32(*shape: int) -> Arg:
    return Arg(tuple(shape), "int32")


def b8(*shape: int) -> Arg:
    return Arg(tuple(shape), "bool")


__all__ = ["M8", "M8B", "M8X", "M24", "M42", "M42XY", "M222", "Arg", "P", "Program", "b8", "f32", "i32"]
