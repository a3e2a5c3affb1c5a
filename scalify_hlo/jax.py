"""Verify JAX functions directly: `check` for GSPMD/Shardy-partitioned jits, `check_shard_map` for
hand-parallel code, `verifying()` for every multi-device jit a block of code runs.

`check` lowers `jax.jit(fn, in_shardings, out_shardings)`, compiles it on the devices the shardings
name (fake CPU devices when `XLA_FLAGS=--xla_force_host_platform_device_count=N` was set before jax was
imported), captures the module right after XLA's SPMD partitioner (a per-compile dump into a temporary
directory: no global flags touched) and proves it equivalent to the unpartitioned program.
`check_shard_map` proves `jax.shard_map(impl, ...)` equivalent to a single-device `reference`.
Arguments may be arrays or `jax.ShapeDtypeStruct`s (nothing is computed, only lowered and compiled).

`verifying()` hooks two private functions of jax's jit (`jax._src.pjit`: the trace and the compile-and-run
of a call its C++ cache misses) for the time of a `with` block, records each multi-device call, and checks
the recorded programs as `check` does when the block ends (`pytest_plugin.py` runs tests inside it). On a
jax without those hooks it refuses to start rather than check nothing.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import importlib
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec

from scalify_hlo.api import as_module, verify
from scalify_hlo.ir.errors import UnsupportedError
from scalify_hlo.report.verdicts import Report


def _structs(args: tuple[Any, ...]) -> Any:
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)


def _after_partitioning(dump: Path, module_name: str) -> str:
    files = sorted(dump.glob(f"*{module_name}*after_spmd-partitioning*.txt")) or sorted(
        dump.glob("*after_spmd-partitioning*.txt"))
    if not files:
        raise UnsupportedError(None, f"XLA wrote no module after SPMD partitioning for {module_name} (is the "
                               "function sharded over more than one device?)")
    return files[-1].read_text()


def partitioned(fn: Callable[..., Any], *args: Any, in_shardings: Any = None, out_shardings: Any = None,
                **jit_kwargs: Any) -> tuple[str, str]:
    """(reference StableHLO with locations, per-device HLO right after the SPMD partitioner)."""
    jitted = jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, **jit_kwargs)
    lowered = jitted.lower(*_structs(args))
    return lowered.as_text(debug_info=True), after_spmd(lowered)


def after_spmd(lowered: jax.stages.Lowered) -> str:
    """Compile `lowered` once more and return the module right after XLA's SPMD partitioner."""
    name = lowered.as_text().split("module @", 1)[-1].split(" ", 1)[0]
    with tempfile.TemporaryDirectory(prefix="scalify-hlo-") as d:
        # Every dump option is set here, so a user's own XLA_FLAGS (a module filter, say) cannot hide it; large
        # constants in full, since the verifier reads their values (a table of positions, of scales).
        lowered.compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning",
                                          "xla_dump_hlo_module_re": ".*", "xla_dump_large_constants": True})
        return _after_partitioning(Path(d), name)


def check(fn: Callable[..., Any], *args: Any, in_shardings: Any = None, out_shardings: Any = None,
          jit_kwargs: dict[str, Any] | None = None, **options: Any) -> Report:
    """Prove XLA's partitioning of `jax.jit(fn, in_shardings, out_shardings)` equivalent to `fn`."""
    before, after = partitioned(fn, *args, in_shardings=in_shardings, out_shardings=out_shardings,
                                **(jit_kwargs or {}))
    return verify(before, after, **options)


def check_shard_map(reference: Callable[..., Any], impl: Callable[..., Any], *args: Any,
                    mesh: Mesh | AbstractMesh | None = None, in_specs: Any, out_specs: Any,
                    axis_names: AbstractSet[Any] = frozenset(), check_vma: bool | None = None,
                    check_rep: bool | None = None, **options: Any) -> Report:
    """Prove `jax.shard_map(impl, mesh=mesh, in_specs=..., out_specs=...)` equivalent to `reference`.

    Takes what `jax.shard_map` takes: arguments that are pytrees (a params dict, lists of layers),
    `in_specs` / `out_specs` as pytree prefixes of the arguments / results (one `P()` for all of them, one
    spec for a whole dict), a `Mesh` or `AbstractMesh` (default: the mesh of `jax.set_mesh`), `axis_names`.
    `check_vma` (`check_rep` is its old name) defaults to False here, unlike in jax: a psum that is missing or
    over the wrong axes should reach the verifier, which names its line, instead of failing the trace."""
    if check_rep is not None and check_vma is not None and check_rep != check_vma:
        raise TypeError("check_shard_map: check_rep is the old name of check_vma; pass one of them")
    vma = bool(check_vma if check_vma is not None else check_rep if check_rep is not None else False)
    if mesh is None:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            raise ValueError("check_shard_map: no mesh; pass mesh=... or enter one with jax.set_mesh(mesh)")
    plain = _structs(args)
    before = jax.jit(reference).lower(*plain).as_text(debug_info=True)
    # The per-argument specs exactly as jax.shard_map reads them: `in_specs` is a prefix of the argument
    # tuple, and None (an argument passed through unmapped) is a leaf; such arguments are replicated.
    try:
        specs = jax.tree.broadcast(in_specs, plain, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))
    except ValueError as err:
        raise ValueError(f"check_shard_map: in_specs is not a pytree prefix of the arguments: {err}") from None
    sharded = jax.tree.map(
        lambda a, spec: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(
            mesh, spec if isinstance(spec, PartitionSpec) else PartitionSpec())),
        plain, specs, is_leaf=lambda x: x is None or isinstance(x, PartitionSpec))
    mapped = jax.shard_map(impl, mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=axis_names,
                           check_vma=vma)
    traced = jax.jit(mapped).trace(*sharded)
    # An AbstractMesh names no devices: jax then wants to be told the platform to lower for.
    lowered = (traced.lower(lowering_platforms=(jax.default_backend(),)) if isinstance(mesh, AbstractMesh)
               and jax.sharding.get_mesh().empty else traced.lower())
    return verify(before, lowered.as_text(debug_info=True), **options)


# ---- verifying(): every multi-device jit run inside a `with` block, checked when the block ends ----------

_RAISE_ON_DEFAULT = ("discrepancy",)
_MANUAL_MARKERS = ("sdy.manual_computation", "SPMDFullToShardShape")  # a shard_map, under Shardy / GSPMD


@dataclass(frozen=True)
class Verified:
    """One jitted function checked by `verifying()`: its name and verdict, and the report when there is one
    (an `unknown` with no report is a function that could not be captured; `reason` says why)."""

    name: str
    verdict: str  # "equivalent", "discrepancy" or "unknown"
    reason: str
    report: Report | None = None

    def line(self) -> str:
        return f"{self.name}: {self.verdict}" + ("" if self.verdict == "equivalent" else f" ({self.reason})")

    def diagnostic(self) -> str:
        return self.report.render() if self.report is not None else f"verdict: {self.verdict} — {self.reason}"


@dataclass(frozen=True)
class _Capture:
    """A jit call made inside the block: enough to lower the same program again (arguments kept as
    shapes, dtypes and shardings, not values)."""

    fun: Callable[..., Any]
    info: Any  # jax's PjitInfo of the jitted function: shardings, static and donated arguments
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    name: str


class VerificationFailure(AssertionError):
    """Raised when `verifying()` ends with a verdict in `raise_on`; the message has every diagnostic."""


class Session:
    """What `verifying()` yields: the captured calls, verified when the block ends (or on `flush()`)."""

    def __init__(self, raise_on: tuple[str, ...], options: dict[str, Any]) -> None:
        self.raise_on = raise_on
        self.options = options
        self.results: list[Verified] = []
        self._pending: list[_Capture] = []
        self._seen: set[tuple[int, int, str]] = set()
        self.not_checked = 0  # multi-device compiles of jax's own functions (eager ops), not user jits

    def flush(self) -> list[Verified]:
        """Verify every call captured so far; returns their results (also appended to `results`)."""
        pending, self._pending = self._pending, []
        done = [_verify_capture(c, self.options) for c in pending]
        self.results.extend(done)
        return done

    def failures(self) -> list[Verified]:
        return [r for r in self.results if r.verdict in self.raise_on]

    def summary(self) -> str:
        """One line per verified function: name and verdict (and why, when not equivalent)."""
        if not self.results:
            return "scalify-hlo: no jitted function ran on more than one device"
        return "\n".join(r.line() for r in self.results)

    def __str__(self) -> str:
        return self.summary()

    def start(self) -> Session:
        with _LOCK:
            if not _ACTIVE:
                _install()
            _ACTIVE.append(self)
        return self

    def finish(self, check: bool = True) -> None:
        """Stop capturing; with `check`, verify what was captured and raise `VerificationFailure` when a
        verdict is in `raise_on`."""
        with _LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
                if not _ACTIVE:
                    _uninstall()
        if not check:
            return
        self.flush()
        if failed := self.failures():
            body = "\n\n".join(f"{r.name}:\n{r.diagnostic()}" for r in failed)
            raise VerificationFailure(f"scalify-hlo: {len(failed)} of {len(self.results)} jitted functions "
                                      f"{'/'.join(self.raise_on)}\n{self.summary()}\n\n{body}")

    def _capture(self, fun: Callable[..., Any], info: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 signature: str) -> None:
        name = str(getattr(info, "fun_sourceinfo", None) or getattr(fun, "__qualname__", repr(fun)))
        key = (id(fun), id(info), signature)
        if key in self._seen:
            return
        self._seen.add(key)
        if info is None:  # (the hooks below could not pair the call with its jit: say so, never skip)
            self.results.append(Verified(name, "unknown", "not captured: the jit's parameters were not found"))
            return
        self._pending.append(_Capture(fun, info, _as_struct(args), _as_struct(kwargs), name))


@contextlib.contextmanager
def verifying(raise_on: Iterable[str] = _RAISE_ON_DEFAULT, **options: Any) -> Iterator[Session]:
    """Verify every `jax.jit` function called inside the block that runs on more than one device.

    Each call that compiles (a first call, a new shape) is captured; when the block ends, the program is
    lowered again, compiled once more with a dump of the module after XLA's SPMD partitioner (a per-compile
    option: no global flag changes), and proven equivalent to its unpartitioned program, as `check` does.
    A function that contains a `shard_map` is checked as written (its StableHLO) against the same code on a
    mesh whose axes all have size 1 (every collective then is the identity): what it computes on one device.
    Code that reads sizes off the mesh object in Python (`/ mesh.shape["dp"]`, not `jax.lax.axis_size`)
    computes something else there, and is reported as differing from it.

    The session yielded lists one `Verified` per function (`session.summary()`); a verdict in `raise_on`
    (default: discrepancy; add "unknown" to be strict) raises `VerificationFailure`, an AssertionError with
    every diagnostic. A call that could not be captured or lowered again is `unknown` with the reason. Calls
    compiled before the block are not compiled again, so not checked (`jax.clear_caches()` first to check
    them too); nor are ahead-of-time `.lower().compile()` (use `check`) or jax's own eager ops. Sessions nest:
    the innermost one gets the calls. `options` go to `verify`."""
    session = Session(tuple(raise_on), options).start()
    try:
        yield session
    except BaseException:
        session.finish(check=False)
        raise
    session.finish()


def _as_struct(tree: Any) -> Any:
    """Arrays as ShapeDtypeStructs (keeping a committed array's sharding), other leaves as they are."""
    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer):
            sharding = x.sharding if getattr(x, "committed", True) else None
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding, weak_type=getattr(getattr(x, "aval", None), "weak_type", False))
        return x
    return jax.tree.map(one, tree)


def _signature(values: Sequence[Any]) -> str:
    return ";".join(f"{getattr(v, 'dtype', type(v).__name__)}{getattr(v, 'shape', '')}"
                    f"@{getattr(v, 'sharding', '')}" for v in values)


def _devices(values: Sequence[Any]) -> int:
    sets = [getattr(getattr(v, "sharding", None), "device_set", ()) for v in values]
    return max((len(s) for s in sets), default=0)


def _verify_capture(c: _Capture, options: dict[str, Any]) -> Verified:
    _LOCAL.busy = True
    step = "lower it again"
    try:
        lowered = _JAX_INTERNALS["pjit"].jit_trace(_Jitted(c.fun, c.info), *c.args, **c.kwargs).lower()
        before = lowered.as_text(debug_info=True)
        if any(m in before for m in _MANUAL_MARKERS):
            # Hand-parallel code is checked as written (its StableHLO keeps the mesh axes' names and the
            # inputs' layouts, which XLA's dump of a manual computation may drop), against what the same code
            # computes on one device.
            step = "build its one-device reference"
            before, after = _one_device_reference(c), before
            sides = ("the same code on one device (mesh axes of size 1)", "as lowered, with its shard_map")
        else:
            step = "capture the module after SPMD partitioning"
            after = after_spmd(lowered)
            sides = ("the unpartitioned program", "after SPMD partitioning")
        step = "verify it"
        report = verify(as_module(before, f"<{c.name}: {sides[0]}>"), as_module(after, f"<{c.name}: {sides[1]}>"),
                        **options)
    except Exception as err:  # anything this could not redo is not proven, with the reason
        return Verified(c.name, "unknown", f"could not {step}: {type(err).__name__}: {err}".splitlines()[0])
    finally:
        _LOCAL.busy = False
    return Verified(c.name, report.name, report.reason, report)


@dataclass(frozen=True)
class _Jitted:
    """What jax's `jit_trace` reads of a jitted function."""

    _fun: Callable[..., Any]
    _jit_info: Any


def _one_device_reference(c: _Capture) -> str:
    """The StableHLO of `c.fun` with every shard_map's mesh replaced by one of the same axes of size 1 and
    no argument sharded: a psum is then the identity, and a missing one is no longer missing."""
    prim = _JAX_INTERNALS["shard_map"].shard_map_p
    bind = prim.bind

    def one_device_bind(*args: Any, **params: Any) -> Any:
        mesh = params["mesh"]
        first = mesh.devices.flat[0] if isinstance(mesh, Mesh) else jax.devices()[0]
        shape = (1,) * len(mesh.axis_names)
        params["mesh"] = Mesh(np.array([first]).reshape(shape), mesh.axis_names, axis_types=mesh.axis_types)
        return bind(*args, **params)

    # A new function object: jax caches traces per function, and the cached one has the real mesh.
    fresh = functools.wraps(c.fun)(lambda *a, **k: c.fun(*a, **k))
    jitted = jax.jit(fresh, static_argnums=c.info.static_argnums, static_argnames=c.info.static_argnames)
    plain = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, weak_type=x.weak_type)
                         if isinstance(x, jax.ShapeDtypeStruct) else x, (c.args, c.kwargs))
    with _LOCK:  # (the primitive is shared: one reference at a time)
        prim.bind = one_device_bind
        try:
            return jitted.lower(*plain[0], **plain[1]).as_text(debug_info=True)
        finally:
            del prim.bind


# The hooks: jax's jit calls `_infer_params` (trace) then `_run_python_pjit` (compile and run) on every
# call its C++ dispatch cannot serve from cache. Both are looked up as module globals at call time.
_LOCK = threading.RLock()
_LOCAL = threading.local()
_ACTIVE: list[Session] = []
_JAX_INTERNALS: dict[str, Any] = {}
_ORIGINALS: dict[str, Any] = {}


def _install() -> None:
    try:
        pjit = importlib.import_module("jax._src.pjit")
        shard_map = importlib.import_module("jax._src.shard_map")
        originals = {"_infer_params": pjit._infer_params, "_run_python_pjit": pjit._run_python_pjit}
        assert callable(pjit.jit_trace) and hasattr(shard_map, "shard_map_p")
    except (ImportError, AttributeError, AssertionError) as err:
        raise RuntimeError(f"scalify_hlo.jax.verifying: jax {jax.__version__} has no jit hook this version "
                           f"knows ({err}); use scalify_hlo.jax.check instead") from None
    if not _JAX_INTERNALS:
        # The hooks sit in the stack of every trace in the block: jax must not take them for the user's
        # code when it records source lines (it skips its own files the same way).
        with contextlib.suppress(ImportError, AttributeError):
            importlib.import_module("jax._src.source_info_util").register_exclusion(__file__)
    _JAX_INTERNALS.update(pjit=pjit, shard_map=shard_map)
    _ORIGINALS.update(originals)
    setattr(pjit, "_infer_params", _infer_params_hook)  # noqa: B010 (a module's private global)
    setattr(pjit, "_run_python_pjit", _run_python_pjit_hook)  # noqa: B010


def _uninstall() -> None:
    pjit = _JAX_INTERNALS["pjit"]
    for name, original in _ORIGINALS.items():
        setattr(pjit, name, original)


_RECENT = 64  # jits traced whose run may still be captured (per thread)


def _infer_params_hook(fun: Callable[..., Any], info: Any, args: Any, kwargs: Any) -> Any:
    out = _ORIGINALS["_infer_params"](fun, info, args, kwargs)
    # By the params' identity, the last few: jax may run jits of its own between a user jit's tracing and
    # its run (moving an uncommitted input to the jit's in_shardings), so "the last one traced" is not it.
    recent = getattr(_LOCAL, "recent", None)
    if recent is None:
        recent = _LOCAL.recent = collections.OrderedDict()
    recent[id(out[0])] = (out[0], info)
    while len(recent) > _RECENT:
        recent.popitem(last=False)
    return out


def _run_python_pjit_hook(p: Any, args_flat: Any, fun: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    result = _ORIGINALS["_run_python_pjit"](p, args_flat, fun, args, kwargs)
    if getattr(_LOCAL, "busy", False) or not _ACTIVE or not _JAX_INTERNALS["pjit"].core.trace_state_clean():
        return result  # (our own re-lowering, or a jit called while tracing another: not a compile)
    try:
        _capture_call(p, args_flat, result[1], fun, args, kwargs)
    except Exception as err:  # never break the user's program; the call is not proven, and says why
        with _LOCK:
            if _ACTIVE:
                name = str(getattr(fun, "__qualname__", fun))
                _ACTIVE[-1].results.append(Verified(name, "unknown", f"not captured: {type(err).__name__}: {err}"))
    return result


def _capture_call(p: Any, args_flat: Sequence[Any], out_flat: Sequence[Any], fun: Callable[..., Any], args: Any,
                  kwargs: Any) -> None:
    if _devices([*args_flat, *out_flat]) <= 1:
        return
    with _LOCK:
        if not _ACTIVE:
            return
        session = _ACTIVE[-1]
        if getattr(fun, "_apply_primitive", False) or (getattr(fun, "__module__", None) or "").split(".")[0] == "jax":
            session.not_checked += 1
            return
        traced = getattr(_LOCAL, "recent", {}).get(id(p))
        info = traced[1] if traced is not None and traced[0] is p else None
        session._capture(fun, info, args, kwargs, _signature(args_flat))
