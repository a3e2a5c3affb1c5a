"""Generate docs/ops.md: every op jaxlib's dialect bindings define, and what scalify-hlo does with it.

    python tools/gen_ops_table.py [--check]

The op set is discovered, not listed: every op class (`OPERATION_NAME`) of the `stablehlo`, `chlo`, `sdy`
and `func` dialect modules that `scalify_hlo.ir._jaxlib.dialects()` loads, the `mhlo` ops that have no
stablehlo/chlo namesake (XLA's HLO→StableHLO converter leaves those in mhlo form: `copy`, `fusion`, ...;
a namesake shares the opcode, hence the row), the ops recorded in `EXTRA_OPS` (seen only in newer
jaxlibs, so that the table is the same whichever supported jaxlib generates it), and one row per
custom-call target in `CUSTOM_CALL_TARGETS` or known to the numeric kernel or the transfer hook.

Each column is read from the code that decides it: `parse` from the dialect prefixes the MLIR reader
accepts (`parsers/stablehlo.py`), `numeric` from the records' kernels in `ops.registry.OPS`, `layout` from
`ops.registry.OPS`, the derivation's hooks (`prove.derive.Deriver.hooks`) and the ops `ir.inline`
inlines, `rules` from the typed constructors of `rules/algebra.py`, `fixture` from the ops in the
programs of `tests/fixtures/*/` (read through jaxlib, HLO text through XLA's converter). Custom-call
targets are read from the functions that dispatch on them. Only the reasons why an op is not supported
are written by hand (`REASONS`). `--check` compares with docs/ops.md instead of writing it.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import functools
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "ops.md"
FIXTURES = ROOT / "tests" / "fixtures"
OLDEST = ROOT / "constraints" / "oldest.txt"
COMMAND = "python tools/gen_ops_table.py"

DIALECTS = ("stablehlo", "chlo", "sdy", "func", "mhlo")  # an opcode belongs to the first that has it
OWNERS = ("stablehlo", "chlo")  # mhlo ops with a namesake here share its row

# Ops of newer jaxlibs than the oldest supported one (constraints/oldest.txt), with the jaxlib they were
# first seen in: the table lists them too, so it is the same whichever supported jaxlib generates it.
EXTRA_OPS: dict[str, str] = {
    "mhlo.collective_reduce": "0.12.0.1",
    "stablehlo.collective_reduce": "0.12.0.1",
    "stablehlo.exp2": "0.12.1",
    "stablehlo.fma": "0.12.1",
    "stablehlo.log2": "0.12.1",
}

# Ops of another dialect that share a stablehlo op's opcode *and* its meaning and attributes, so the
# stablehlo op's kernel and rule are right for them. Any other shared opcode is a collision (see `_status`).
ALIASES = frozenset({"chlo.constant", "chlo.tan", "sdy.constant"})

# Ops the reader consumes itself: they are the program's structure, not computations.
STRUCTURAL: dict[str, str] = {
    "func.func": "a function (the entry and its callees)",
    "func.return": "terminator of a function body",
    "sdy.mesh": "a mesh declaration, read into the program's mesh",
    "sdy.return": "terminator of a Shardy region",
    "stablehlo.return": "terminator of a region",
}

# Custom-call targets XLA and JAX emit around sharding and a few neighbours (jax/_src/interpreters/mlir.py,
# shard_map.py, debugging.py, custom_partitioning.py; XLA's Shardy round-trip through HLO).
CUSTOM_CALL_TARGETS = (
    "CustomSPMDPartitioning", "InspectSharding", "LayoutConstraint", "MoveToDevice", "MoveToHost",
    "SPMDFullToShardShape", "SPMDShardToFullShape", "Sharding", "TopK", "annotate_device_placement",
    "xla.sdy.FuncResultSharding", "xla.sdy.GlobalToLocalShape", "xla.sdy.LocalToGlobalShape",
    "xla.sdy.PropagationBarrier", "xla.sdy.ShardingGroup",
)

_INTERNAL_SDY = "internal to Shardy's propagation and partitioning, never in a module JAX exports"
_SDY_COLLECTIVE = "Shardy's explicit-collective form, produced inside its partitioner only"
_NOT_EMITTED = "not emitted by JAX"
_DYNAMIC = "dynamic shapes: JAX emits static shapes only"
_HOST = "host I/O with side effects: nothing to compare"

# Why an op without a kernel and a transfer rule is not supported (keyed by op; `@` rows by target).
REASONS: dict[str, str] = {
    "chlo._asin_acos_kernel": "internal helper of chlo's asin/acos decompositions",
    "chlo.acos": "inverse trigonometric op not modelled yet",
    "chlo.acosh": "inverse hyperbolic op not modelled yet",
    "chlo.atan": "inverse trigonometric op not modelled yet",
    "chlo.broadcast_add": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_and": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_atan2": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_compare": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_complex": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_divide": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_maximum": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_minimum": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_multiply": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_next_after": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_or": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_polygamma": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_power": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_remainder": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_select": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_shift_left": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_shift_right_arithmetic": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_shift_right_logical": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_subtract": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_xor": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.broadcast_zeta": "implicitly broadcasting chlo form; JAX emits explicit broadcasts",
    "chlo.constant_like": "shape-polymorphic constant: JAX emits static shapes only",
    "chlo.mulhi": "high half of a widening multiply: not modelled yet",
    "chlo.ragged_dot": "ragged (grouped) matmul: not modelled yet",
    "chlo.scan": "chlo's scan: JAX lowers lax.scan to stablehlo.while",
    "func.call_indirect": _NOT_EMITTED,
    "func.constant": f"a function-symbol constant, {_NOT_EMITTED}",
    "mhlo.add_dependency": "token ordering of XLA's scheduler (compiled modules only)",
    "mhlo.collective_reduce": "collective not modelled yet",
    "mhlo.minimum_broadcast_shapes": _DYNAMIC,
    "mhlo.stochastic_convert": "randomised rounding: not deterministic",
    "mhlo.trace": "a debugging trace with side effects",
    "mhlo.xla.rng_get_and_update_state": "XLA's RNG state (compiled modules only)",
    "sdy.all_gather": _SDY_COLLECTIVE,
    "sdy.all_reduce": _SDY_COLLECTIVE,
    "sdy.all_slice": _SDY_COLLECTIVE,
    "sdy.all_to_all": _SDY_COLLECTIVE,
    "sdy.collective_permute": _SDY_COLLECTIVE,
    "sdy.data_flow_edge": _INTERNAL_SDY,
    "sdy.func_data_flow_edge": _INTERNAL_SDY,
    "sdy.named_computation": _INTERNAL_SDY,
    "sdy.propagation_barrier": _INTERNAL_SDY,
    "sdy.reduce_scatter": _SDY_COLLECTIVE,
    "sdy.replicated_to_unreduced": _SDY_COLLECTIVE,
    "sdy.sharded_to_unreduced": _SDY_COLLECTIVE,
    "sdy.sharding_group": _INTERNAL_SDY,
    "stablehlo.after_all": "token joining (ordering of side effects): nothing to compare",
    "stablehlo.batch_norm_grad": "decomposed by JAX; XLA-builder op only",
    "stablehlo.batch_norm_inference": "decomposed by JAX; XLA-builder op only",
    "stablehlo.batch_norm_training": "decomposed by JAX; XLA-builder op only",
    "stablehlo.collective_reduce": "collective not modelled yet",
    "stablehlo.cross-replica-sum": f"legacy all-reduce spelling, {_NOT_EMITTED}",
    "stablehlo.dynamic_broadcast_in_dim": _DYNAMIC,
    "stablehlo.dynamic_conv": _DYNAMIC,
    "stablehlo.dynamic_gather": _DYNAMIC,
    "stablehlo.dynamic_iota": _DYNAMIC,
    "stablehlo.dynamic_pad": _DYNAMIC,
    "stablehlo.dynamic_reshape": _DYNAMIC,
    "stablehlo.einsum": f"deprecated op, {_NOT_EMITTED} (dot_general instead)",
    "stablehlo.fft": "FFT not modelled yet",
    "stablehlo.infeed": _HOST,
    "stablehlo.outfeed": _HOST,
    "stablehlo.real_dynamic_slice": _DYNAMIC,
    "stablehlo.recv": _HOST,
    "stablehlo.rng": "random numbers: not deterministic",
    "stablehlo.send": _HOST,
    "stablehlo.set_dimension_size": _DYNAMIC,
    "stablehlo.torch_index_select": f"deprecated op, {_NOT_EMITTED}",
    "stablehlo.unary_einsum": f"deprecated op, {_NOT_EMITTED}",
    "stablehlo.uniform_dequantize": "quantized types not modelled",
    "stablehlo.uniform_quantize": "quantized types not modelled",
    "stablehlo.custom_call @CustomSPMDPartitioning": "jax custom_partitioning: an opaque user kernel",
    "stablehlo.custom_call @InspectSharding": "jax.debug.inspect_array_sharding: a host callback",
    "stablehlo.custom_call @xla.sdy.GlobalToLocalShape": "Shardy round-trip through HLO: not modelled yet",
    "stablehlo.custom_call @xla.sdy.LocalToGlobalShape": "Shardy round-trip through HLO: not modelled yet",
    "stablehlo.custom_call @xla.sdy.PropagationBarrier": _INTERNAL_SDY,
    "stablehlo.custom_call @xla.sdy.ShardingGroup": _INTERNAL_SDY,
}

# Handled ops whose handling depends on more than the opcode.
PARTIAL: dict[str, str] = {
    "stablehlo.custom_call": "by call target (the `@` rows); any other target is unsupported",
    "stablehlo.sort": "operands laid out alike; along a split dim each device sorts its block (read as the "
                      "split moved onto another dim: XLA's all-to-all resharding around a sort is proven)",
    "chlo.top_k": "rows whole on every device, or a split last dim as the blocks' candidates; their merge "
                  "(offsets, gather in block order, top-k again, take_along_axis) is proven (terms/topk.py)",
    "mhlo.topk": "XLA's HLO `topk`, read as chlo.top_k (rows whole, or the blocks' candidates of a split dim)",
    "stablehlo.reduce_window": "windows along whole dims; along a split dim, windows inside each block, or "
                               "over a halo (XLA's pooling and prefix scans: rules/halo.py); other windows "
                               "across blocks are unknown",
    "stablehlo.reduce": "variadic bodies over a split dim only when JAX's argmax/argmin comparator",
}

UNTRIAGED = "not triaged: no kernel and no transfer rule (add a reason to REASONS in tools/gen_ops_table.py)"
NO = "no"
NONE = "—"
HEADER = ("op", "status", "parse", "numeric", "layout", "rules", "fixture")


@dataclass(frozen=True, slots=True)
class Row:
    op: str
    status: str
    parse: str
    numeric: str
    layout: str
    rules: str
    fixture: str

    def line(self) -> str:
        return "| " + " | ".join((f"`{self.op}`", self.status, self.parse, self.numeric, self.layout,
                                  self.rules, self.fixture)) + " |"


# -- the op set -------------------------------------------------------------------------------------------
def installed_ops() -> set[str]:
    """Every op the installed jaxlib's dialect bindings define (stablehlo, chlo, sdy, func, mhlo)."""
    from scalify_hlo.ir import _jaxlib

    found: set[str] = set()
    for name, module in _jaxlib.dialects().items():
        for obj in vars(module).values():
            op = getattr(obj, "OPERATION_NAME", None) if isinstance(obj, type) else None
            if isinstance(op, str) and op.startswith(name + "."):
                found.add(op)
    return found


def table_ops(installed: Iterable[str]) -> list[str]:
    """The table's op set: installed ∪ EXTRA_OPS, without mhlo ops that have a stablehlo/chlo namesake."""
    every = set(installed) | set(EXTRA_OPS)
    owned = {_opcode(op) for op in every if op.split(".", 1)[0] in OWNERS}
    return sorted(op for op in every if not (op.startswith("mhlo.") and _opcode(op) in owned))


def _opcode(op: str) -> str:
    """The opcode the common IR gives an op: its name without the dialect (parsers/stablehlo.py)."""
    from scalify_hlo.parsers.stablehlo import _PREFIXES

    return next((op[len(p):] for p in _PREFIXES if op.startswith(p)), op)


# -- what the code knows ------------------------------------------------------------------------------------
def _name(fn: Callable[..., Any]) -> str:
    return f"{fn.__module__.removeprefix('scalify_hlo.')}.{fn.__qualname__}"


def call_targets(fn: Callable[..., Any]) -> frozenset[str]:
    """The custom-call targets a function dispatches on: the strings (or module-level sets of strings)
    that its variable `target` is compared with."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    found: set[str] = set()

    def strings(node: ast.expr) -> Iterable[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            for elt in node.elts:
                yield from strings(elt)
        elif isinstance(node, ast.Name) and isinstance(fn.__globals__.get(node.id), frozenset | set | tuple):
            yield from (s for s in fn.__globals__[node.id] if isinstance(s, str))

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name) and node.left.id == "target":
            for comparator in node.comparators:
                found.update(strings(comparator))
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Knowledge:
    kernels: frozenset[str]
    layout: dict[str, str]  # opcode → the transfer rule (module.function)
    replicated_only: frozenset[str]
    algebra: dict[str, str]  # opcode → its typed egglog constructors
    numeric_targets: frozenset[str]
    layout_targets: frozenset[str]


@functools.cache
def knowledge() -> Knowledge:
    from scalify_hlo.rules import algebra
    from scalify_hlo.rules.indexing import replicated_only

    from scalify_hlo.ir import inline
    from scalify_hlo.layout.mesh import Mesh
    from scalify_hlo.numeric.kernels import KERNELS
    from scalify_hlo.ops.registry import OPS
    from scalify_hlo.prove.derive import Deriver
    from scalify_hlo.terms.table import Terms

    layout: dict[str, str] = {}
    for opcode in sorted(inline._INLINED):
        layout[opcode] = "ir.inline (inlined)"
    for opcode in sorted(inline._PASS_THROUGH):
        layout[opcode] = "ir.inline (passes its operand on)"
    for opcode, info in OPS.items():
        if info.transfer is not None:
            layout[opcode] = _name(info.transfer)
    hooks = Deriver(Terms(), Mesh(())).hooks  # checked before OPS by Deriver.op
    for opcode, hook in hooks.items():
        layout[opcode] = _name(hook) + " (hook)"
    constructors: dict[str, list[str]] = {}
    for domain in algebra.DOMAINS:
        for opcode, egg in algebra.TYPED[domain].items():
            constructors.setdefault(opcode, []).append(f"{domain} {egg}")
    return Knowledge(
        kernels=frozenset(KERNELS),
        layout=layout,
        replicated_only=frozenset(k for k, s in OPS.items() if s.transfer is replicated_only),
        algebra={k: "algebra: " + ", ".join(v) for k, v in constructors.items()},
        numeric_targets=call_targets(KERNELS["custom_call"]),
        layout_targets=call_targets(hooks["custom_call"]),
    )


# -- the fixtures -------------------------------------------------------------------------------------------
def _ops_of(module: Any, ir: Any) -> set[str]:
    found: set[str] = set()

    def visit(op: Any) -> Any:
        found.add(op.name)
        if op.name.endswith(".custom_call") and "call_target_name" in op.attributes:
            found.add(f"{op.name} @{ir.StringAttr(op.attributes['call_target_name']).value}")
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


def _program_ops(path: Path) -> set[str]:
    """The ops of one program file, read through jaxlib (HLO text through XLA's converter)."""
    from scalify_hlo.parsers.hlo import expand_tuple_access

    from scalify_hlo.ir import _jaxlib

    ir = _jaxlib.ir()
    text = path.read_text()
    data: str | bytes = text
    if path.suffix == ".hlo":
        try:
            hlo = _jaxlib.hlo_module_from_text(text)
        except Exception:  # newer XLA's tuple-access spelling (see parsers/hlo.py)
            hlo = _jaxlib.hlo_module_from_text(expand_tuple_access(text))
        data = _jaxlib.hlo_proto_to_stablehlo(hlo.as_serialized_hlo_module_proto())
    with _jaxlib.make_context():
        return _ops_of(ir.Module.parse(data), ir)


def fixture_ops(known: dict[str, list[str]] | None = None) -> dict[str, str]:
    """op (or `op @target`) → the first fixture, alphabetically, whose before/after program has it.

    `known` caches the ops of each program by jaxlib version and content hash (the test keeps it in
    pytest's cache); entries of the installed jaxlib for programs no longer there are dropped from it."""
    from hashlib import sha1
    from importlib import metadata

    version = metadata.version("jaxlib")
    used: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("before.*")) + sorted(folder.glob("after.*")):
            if path.suffix not in (".mlir", ".hlo"):
                continue
            key = f"jaxlib {version} {sha1(path.read_bytes()).hexdigest()}"
            ops = used[key] = (known or {}).get(key) or sorted(_program_ops(path))
            for op in ops:
                first.setdefault(op, folder.name)
    if known is not None:  # stale entries of this jaxlib go; other jaxlibs' stay (venvs share the cache)
        for key in [k for k in known if k.startswith(f"jaxlib {version} ") and k not in used]:
            del known[key]
        known.update(used)
    return first


# -- the table ----------------------------------------------------------------------------------------------
def _row(op: str, owner: dict[str, str], k: Knowledge, fixtures: dict[str, str]) -> Row:
    from scalify_hlo.parsers.stablehlo import _PREFIXES

    from scalify_hlo.ops.elementwise import ELEMENTWISE_CUSTOM_CALLS
    from scalify_hlo.ops.registry import IDENTITY_CUSTOM_CALLS

    base, _, target = op.partition(" @")
    opcode = _opcode(base)
    parse = "yes" if base.startswith(_PREFIXES) else NO
    if op in EXTRA_OPS:
        parse += f" (jaxlib {EXTRA_OPS[op]}+)"
    if target in ELEMENTWISE_CUSTOM_CALLS:  # the parser reads the call as the elementwise op
        opcode = ELEMENTWISE_CUSTOM_CALLS[target]
        numeric = "yes" if opcode in k.kernels else NO
        layout = k.layout.get(opcode, NO) + f" (read as `{opcode}`)"
        rules = k.algebra.get(opcode, NONE)
    elif target:
        numeric = "yes" if target in k.numeric_targets else NO
        layout = NO if target not in k.layout_targets else (
            "identity" if target in IDENTITY_CUSTOM_CALLS else "prove.derive._custom_call (a rule of its own)")
        rules = NONE
    else:
        numeric = "yes" if opcode in k.kernels else NO
        layout = k.layout.get(opcode, NO)
        rules = k.algebra.get(opcode, NONE)
    fixture = f"`{fixtures[op]}`" if op in fixtures else NONE
    collides = not target and owner[opcode] != op and op not in ALIASES and op not in STRUCTURAL
    if collides:
        numeric = "yes (collides)" if numeric == "yes" else numeric
        layout = f"{layout} (collides)" if layout != NO else layout
    return Row(op, _status(op, opcode, owner, numeric, layout, collides, k), parse, numeric, layout, rules,
               fixture)


def _status(op: str, opcode: str, owner: dict[str, str], numeric: str, layout: str, collides: bool,
            k: Knowledge) -> str:
    if op in STRUCTURAL:
        return f"structural: {STRUCTURAL[op]}"
    reason = REASONS.get(op, UNTRIAGED)
    if collides:
        return (f"unsupported: {reason}; its opcode `{opcode}` is `{owner[opcode]}`'s, whose kernel and rule "
                "would misread it")
    has_numeric, has_layout = numeric != NO, layout != NO
    if has_numeric and has_layout:
        if op in PARTIAL:
            return f"partial: {PARTIAL[op]}"
        if opcode in k.replicated_only and " @" not in op:
            return "partial: replicated operands only (sharded ones are unknown)"
        return "handled"
    if has_numeric or has_layout:
        missing = "no transfer rule" if has_numeric else "no numeric kernel"
        return f"partial: {missing}" + (f" ({REASONS[op]})" if op in REASONS else "")
    return f"unsupported: {reason}"


def rows(installed: Iterable[str] | None = None, known: dict[str, list[str]] | None = None) -> list[Row]:
    """One row per op of the table, sorted by op (custom-call targets right after `custom_call`); `installed`
    defaults to the installed jaxlib's ops, `known` is `fixture_ops`'s cache."""
    from scalify_hlo.ops.elementwise import ELEMENTWISE_CUSTOM_CALLS

    k = knowledge()
    ops = table_ops(installed_ops() if installed is None else installed)
    owner: dict[str, str] = {}
    for dialect in DIALECTS:
        for op in ops:
            if op.startswith(dialect + "."):
                owner.setdefault(_opcode(op), op)
    custom = "stablehlo.custom_call"
    targets = sorted(set(CUSTOM_CALL_TARGETS) | k.numeric_targets | k.layout_targets | set(ELEMENTWISE_CUSTOM_CALLS))
    names = sorted([*ops, *(f"{custom} @{t}" for t in targets)])
    fixtures = fixture_ops(known)
    return [_row(op, owner, k, fixtures) for op in names]


def summary(table: list[Row]) -> str:
    counts: dict[str, int] = {}
    for r in table:
        kind = r.status.split(":", 1)[0]
        counts[kind] = counts.get(kind, 0) + 1
    parts = [f"{counts.get(kind, 0)} {label}" for kind, label in (
        ("handled", "handled end to end"), ("partial", "partial"), ("structural", "structural"),
        ("unsupported", "unsupported"))]
    return f"**{len(table)} rows:** " + ", ".join(parts) + "."


def orphans(table: list[Row]) -> str:
    """The opcodes with a kernel or a transfer rule that no row of the table has (HLO-only spellings)."""
    k = knowledge()
    have = {_opcode(r.op) for r in table if " @" not in r.op}
    found = []
    for opcode in sorted((k.kernels | set(k.layout)) - have):
        what = [w for w, yes in (("kernel", opcode in k.kernels), ("rule", opcode in k.layout)) if yes]
        found.append(f"`{opcode}` ({', '.join(what)})")
    return ("Opcodes the code handles that no dialect above defines: " + ", ".join(found) + "."
            if found else "Every opcode the code handles is a row above.")


def oldest_jaxlib() -> str:
    m = re.search(r"^jaxlib==(\S+)", OLDEST.read_text(), re.MULTILINE)
    return m.group(1) if m else "?"


def render(table: list[Row]) -> str:
    head = f"""\
# Op coverage

Generated by `{COMMAND}` from jaxlib's own dialect bindings (on the oldest supported jaxlib,
{oldest_jaxlib()}, per `constraints/oldest.txt`); do not edit by hand. `tests/test_ops_table.py` fails when
this file and the code disagree, or when an installed jaxlib defines an op the table lacks.

Rows: every op of the `stablehlo`, `chlo`, `sdy` and `func` dialects; the `mhlo` ops without a
stablehlo/chlo namesake (XLA's HLO→StableHLO converter leaves those in mhlo form); ops seen only in newer
jaxlibs (`EXTRA_OPS` in the tool); and the custom-call targets XLA and JAX emit around sharding
(`stablehlo.custom_call @target`). The common IR drops the dialect (`chlo.square` is the opcode `square`).

- **status**: `handled` (a numeric kernel and a transfer rule), `partial` (what is missing),
  `structural` (read by the parser itself), `unsupported: <why>`. A non-stablehlo op whose opcode is also
  a stablehlo op's, with other attributes, *collides*: the stablehlo op's kernel and rule would misread it.
- **parse**: the MLIR reader accepts it (every op of the dialects above; ops of newer jaxlibs there only).
- **numeric**: the op's record in `scalify_hlo.ops.registry.OPS` names a kernel for the opcode (custom calls: for the
  target), so the interpreter and counterexample search can run it.
- **layout**: the transfer rule that carries sharding facts through the op: `scalify_hlo.ops.registry.OPS`,
  a hook of `prove.derive.Deriver`, or inlining by `ir.inline` (custom calls: `identity` when passed
  through unchanged, else a rule of the target's own that `prove.derive._custom_call` dispatches to).
- **rules**: the typed constructors of `rules/algebra.py` (the egglog algebra, per number domain) that the
  op is fed to the e-graph as; every other op is an opaque node there.
- **fixture**: the first fixture under `tests/fixtures/` (alphabetically) whose before/after program
  contains the op (HLO text read through XLA's converter), or —.

"""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += [r.line() for r in table]
    return head + "\n".join(lines) + "\n\n" + summary(table) + "\n\n" + orphans(table) + "\n"


def table_lines(text: str) -> dict[str, str]:
    """op → its row line, from a rendered table."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"\| `([^`]+)` \|", line)
        if m:
            out[m.group(1)] = line
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with docs/ops.md instead of writing it")
    args = ap.parse_args(argv)
    table = rows()
    text = render(table)
    from importlib import metadata

    installed = metadata.version("jaxlib")
    if installed != oldest_jaxlib():
        print(f"note: jaxlib {installed} is not the oldest supported ({oldest_jaxlib()}), for which the "
              "table is written; ops the oldest lacks come from EXTRA_OPS", file=sys.stderr)
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        if old == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                   str(OUT.relative_to(ROOT)), "generated"))
        return 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {summary(table)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
