"""The shard_map corpus of issue 12: correct shard_map programs as a new user writes them, each with its jnp
reference, and a few deliberately wrong twins.

"Tried as a new user would on JAX's own tests/shard_map_test.py and the shard_map tutorial
(docs/notebooks/shard_map.md in jax-ml/jax)": the computations of both, re-expressed as pairs (not copied),
plus the patterns a user writes next. `REGISTRY` maps a program's name to its `Program` (reference, body,
mesh, in_specs, out_specs, input shapes and dtypes; see shard_map_corpus_spec.py). The programs live in
shard_map_corpus_tutorial.py, shard_map_corpus_tests.py and shard_map_corpus_patterns.py; the twins with
`bug=True` sit next to the program they break and carry a ``# BUG:`` line. tools/shard_map_corpus.py runs
them all (truth by running both with JAX, then the verifier) and prints the table.
"""

from __future__ import annotations

from programs import shard_map_corpus_patterns, shard_map_corpus_tests, shard_map_corpus_tutorial
from programs.shard_map_corpus_spec import Program

REGISTRY: dict[str, Program] = {}
for _part in (shard_map_corpus_tutorial, shard_map_corpus_tests, shard_map_corpus_patterns):
    for _prog in _part.PROGRAMS:
        assert _prog.name not in REGISTRY, f"two programs named {_prog.name}"
        REGISTRY[_prog.name] = _prog
