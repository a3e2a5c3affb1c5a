"""chlo ops without an HLO opcode, expanded the way XLA expands them, for a reference checked against HLO.

JAX lowers `jnp.arcsin`, `jax.scipy.special.gammaln`, `erfinv` and their kin to single `chlo` ops; XLA has
no such instructions and turns each into its own expansion (polynomials, selects on the input's range)
when it converts the module to HLO. A partitioned HLO dump therefore holds the expansion where the
reference holds one op, and the two never meet as terms. This module asks XLA itself for the expansion of
each such op of the reference (a one-op module through XLA's StableHLO→HLO→StableHLO converters, once per
op and signature) and puts it in place of the op as a call of a function holding it: the inliner then
gives its ops the op's source line, and both programs compute the same ops.

Ops XLA keeps (an HLO opcode of the same name: `erf`, `tan`, `top_k`), ops with attributes or bodies,
and any op the converters refuse are left as they are.
"""

from __future__ import annotations

import dataclasses
import functools

from scalify_hlo.parsers.stablehlo import parse_mlir

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.errors import ScalifyError
from scalify_hlo.ir.nodes import Attrs, Func, Module, Op, Region, TensorType, walk

_PREFIX = "xla_expansion."  # names of the functions holding expansions (no user function starts so)


@functools.cache
def chlo_opcodes() -> frozenset[str]:
    """The chlo dialect's op names (without the prefix), as this jaxlib defines them."""
    chlo = _jaxlib.dialects()["chlo"]
    names = (getattr(c, "OPERATION_NAME", None) for c in vars(chlo).values())
    return frozenset(n.removeprefix("chlo.") for n in names if isinstance(n, str) and n.startswith("chlo."))


def _mlir_type(t: TensorType) -> str:
    return f"tensor<{''.join(f'{n}x' for n in t.shape)}{t.dtype}>"


def _signature(op: Op) -> tuple[str, tuple[TensorType, ...], tuple[TensorType, ...]] | None:
    if op.regions or len(op.attrs) or not op.operands or op.opcode not in chlo_opcodes():
        return None
    types = [v.type for v in (*op.operands, *op.results)]
    if not all(isinstance(t, TensorType) for t in types):
        return None
    return op.opcode, tuple(v.tensor for v in op.operands), tuple(v.tensor for v in op.results)


@functools.cache
def _expansion(opcode: str, ins: tuple[TensorType, ...], outs: tuple[TensorType, ...]) -> Func | None:
    """XLA's expansion of `chlo.<opcode>` on these types, or None where XLA keeps the op (or refuses)."""
    args = ", ".join(f"%a{i}: {_mlir_type(t)}" for i, t in enumerate(ins))
    res = ", ".join(_mlir_type(t) for t in outs)
    text = (f"module @expansion {{\n  func.func public @main({args}) -> ({res}) {{\n"
            f"    %0 = \"chlo.{opcode}\"({', '.join(f'%a{i}' for i in range(len(ins)))}) : "
            f"({', '.join(_mlir_type(t) for t in ins)}) -> ({res})\n    return %0 : {res}\n  }}\n}}")
    refused: tuple[type[Exception], ...] = (*_jaxlib.mlir_errors(), ScalifyError, RuntimeError, TypeError)
    try:
        converted = _jaxlib.hlo_proto_to_stablehlo(_jaxlib.stablehlo_to_hlo_proto(text))
        module = parse_mlir(converted, f"<XLA's expansion of chlo.{opcode}>")
    except refused:
        return None
    body = module.main.body
    if len(module.funcs) != 1 or any(op.regions or op.opcode == "call" for op in walk(body.ops)):
        return None
    if len(body.ops) == 1 and body.ops[0].opcode == opcode:
        return None  # XLA keeps it: the dump holds the op itself
    name = f"{_PREFIX}{opcode}.{'.'.join(_mlir_type(t) for t in ins)}"
    return dataclasses.replace(module.main, name=name)


def expand_for_hlo(module: Module) -> Module:
    """`module` with each chlo op XLA expands replaced by a call of XLA's expansion (same operands, results
    and location); the module itself when there is none."""
    chlo = chlo_opcodes()
    if not any(op.opcode in chlo for f in module.funcs.values() for op in walk(f.body.ops)):
        return module  # (most programs: one pass over the ops, nothing rebuilt)
    funcs: dict[str, Func] = {}

    def region(reg: Region) -> Region:
        ops: list[Op] = []
        for op in reg.ops:
            sig = _signature(op)
            f = _expansion(*sig) if sig is not None else None
            if f is not None:
                funcs[f.name] = f
                ops.append(Op("call", op.operands, op.results, Attrs.of({"callee": f.name}), (), op.loc))
            elif op.regions:
                ops.append(dataclasses.replace(op, regions=tuple(region(r) for r in op.regions)))
            else:
                ops.append(op)
        return Region(reg.args, tuple(ops), reg.results)

    bodies = {name: dataclasses.replace(f, body=region(f.body)) for name, f in module.funcs.items()}
    if not funcs:
        return module
    return dataclasses.replace(module, funcs={**bodies, **funcs})
