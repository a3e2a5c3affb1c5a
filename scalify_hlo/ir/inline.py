"""Inline `call`s, `fusion`s and async collective pairs so the verifier and interpreter see one function.

Each inlined body gets fresh `Value`s (a callee called twice must not share values between its two
copies), and an inlined op without a source frame of its own inherits the call site's frames: JAX
puts the user's line on the `call`, not on the ops of `@relu`.
"""

from __future__ import annotations

import dataclasses

from scalify_hlo.ir.nodes import Func, Module, Op, Region, SourceLoc, Value

_INLINED = frozenset({"call", "fusion", "async_start"})
# An async pair computes its wrapped op once: `start` is the op, `update`/`done` only pass the future on.
_PASS_THROUGH = frozenset({"async_update", "async_done"})


class _Inliner:
    def __init__(self, module: Module) -> None:
        self.module = module

    def region(self, reg: Region, env: dict[Value, Value], fresh: bool, site: SourceLoc | None,
               stack: tuple[str, ...]) -> Region:
        # Arguments of an inlined body are already bound to the call's operands; those of a nested region
        # (a reducer, a loop body) copied along with its op get fresh values.
        args = tuple(env[a] if a in env else (self._clone(a, env) if fresh else a) for a in reg.args)
        ops: list[Op] = []
        for op in reg.ops:
            operands = tuple(env.get(v, v) for v in op.operands)
            if op.opcode in _PASS_THROUGH and len(op.operands) == 1 and len(op.results) == 1:
                env[op.results[0]] = operands[0]
                continue
            if op.opcode in _INLINED:
                body, name = self._body(op)
                if name in stack:
                    raise RecursionError(f"recursive call to @{name}")
                inner_env = dict(zip(body.args, operands, strict=True))
                inner = self.region(body, inner_env, True, _merge(op.loc, site), (*stack, name))
                ops.extend(inner.ops)
                env.update(zip(op.results, inner.results, strict=True))
                continue
            called = called_bodies(op, self.module)
            if called:
                op = dataclasses.replace(op, regions=called)
            if not fresh and site is None and not op.regions and operands == op.operands:
                ops.append(op)  # nothing to rewrite: share the op (most ops of an entry function)
                continue
            regions = tuple(self.region(r, env, fresh or bool(called), site, stack) for r in op.regions)
            results = tuple(self._clone(r, env) for r in op.results) if fresh else op.results
            loc = _merge(op.loc, site) if site is not None else op.loc
            ops.append(dataclasses.replace(op, operands=operands, results=results, regions=regions, loc=loc))
        results = tuple(env.get(v, v) for v in reg.results)
        return Region(args, tuple(ops), results)

    def _body(self, op: Op) -> tuple[Region, str]:
        if op.opcode in ("fusion", "async_start"):
            return op.regions[0], f"{op.opcode}:{op.loc.name or id(op)}"
        callee = str(op.attrs["callee"])
        return self.module.funcs[callee].body, callee

    @staticmethod
    def _clone(v: Value, env: dict[Value, Value]) -> Value:
        new = Value(v.type, v.name)
        env[v] = new
        return new


def called_bodies(op: Op, module: Module | None) -> tuple[Region, ...]:
    """A custom call's called computations (XLA's TopK comparator), to become its regions as the bodies
    of the ops that have them; () for any other op, or where `module` lacks one."""
    names = op.attrs.get("called_computations") if op.opcode == "custom_call" and not op.regions else None
    if module is None or not isinstance(names, tuple) or not names or any(str(n) not in module.funcs for n in names):
        return ()
    return tuple(module.funcs[str(n)].body for n in names)


def _merge(inner: SourceLoc, site: SourceLoc | None) -> SourceLoc:
    if site is None or inner.frames:
        return inner
    return dataclasses.replace(inner, frames=site.frames, op_name=inner.op_name or site.op_name)


def inline(module: Module, func: Func | None = None) -> Func:
    """`func` (default: the entry) with every call and fusion replaced by the callee's ops."""
    f = func or module.main
    body = _Inliner(module).region(f.body, {}, False, None, (f.name,))
    return dataclasses.replace(f, body=body)
