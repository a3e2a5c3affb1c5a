"""JAX programs the fixture generator (`tools/gen_fixtures.py`) lowers; config-driven so that benchmarks can
build big versions of the same code.

Every module is importable on its own (``from programs import llama`` with ``tools/`` on ``sys.path``).
Lines carrying a deliberate bug end with a ``# BUG: <what>`` comment; the generator locates them by that
marker (never by hard-coded line numbers) and records them as the expected source line of a discrepancy.
"""
