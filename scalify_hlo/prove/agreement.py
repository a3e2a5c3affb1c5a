"""Numeric agreement: the after program's values, run, compared with the reference's (for `origin.py`).

Both programs run once on the same inputs with a `numeric.machine.Trace` (`run_both`): every execution of
every op is kept (`Recorder`: a loop's iterations, a shard_map body on every device, a branch with the
devices that took it). An after value AGREES (`Agreement`) when on every device it is the block of one
reference value under some layout over the mesh, or, summed over some mesh axes, that block (a partial
sum; a value the same on every device of those axes is no partial sum). `links_of` gives the data flow
through bodies (loops, calls, shard_maps) and `dependent_on_inputs` the values computed from an input.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from scalify_hlo.ir.errors import ScalifyError
from scalify_hlo.ir.nodes import Module, Op, Region, Value, walk
from scalify_hlo.layout.mesh import Layout, Mesh
from scalify_hlo.layout.program import Program
from scalify_hlo.numeric import machine as numeric
from scalify_hlo.numeric import trials
from scalify_hlo.numeric.values import Val
from scalify_hlo.prove.egraph import Deadline

MAX_EVENTS = 200_000  # op executions recorded per program; beyond, no comparison (a long loop)
MAX_INSTANCES = 256  # executions of one value kept (a loop's first iterations)
MAX_COMPARISONS = 400_000  # array comparisons of one search; beyond, it gives up
RTOL, ATOL = 1e-3, 1e-5
# Ops whose regions are a scalar combiner (a reducer, a comparator): their results come from their operands.
COMBINER = frozenset({"reduce", "reduce_window", "all_reduce", "reduce_scatter", "scatter", "sort",
                      "select_and_scatter", "map"})

Entry = tuple[np.ndarray, list[Value]]  # a reference array, and the reference values that held it


class GiveUp(Exception):
    """The search went over its budget."""


@dataclass(slots=True)
class Event:
    """One execution of an op: its operands, the machine's device count, the execution of the op whose body
    it ran in (a loop, a call, a shard_map), and when it finished (an op with a body after its body's ops)."""

    op: Op
    devices: int
    parent: int | None
    args: tuple[Val, ...] = ()
    done: int = -1


@dataclass
class Recorder:
    """Every op execution and region entry of one module's run (`numeric.machine.Trace`)."""

    module: Module
    events: list[Event] = field(default_factory=list)
    instances: dict[Value, list[tuple[int, Val, int]]] = field(default_factory=dict)  # (event, value, devices)
    entries: list[tuple[Region, int]] = field(default_factory=list)
    masks: dict[int, np.ndarray] = field(default_factory=dict)  # event → devices that took its branch
    running: list[int] = field(default_factory=list)  # the events begun and not finished, innermost last
    finished: int = 0
    overflow: bool = False

    def entered(self, machine: numeric.Machine, region: Region, args: Sequence[Val]) -> None:
        if machine.module is not self.module or self.overflow:
            return
        self.entries.append((region, len(self.events)))
        for v, a in zip(region.args, args, strict=True):
            self._keep(v, len(self.events), a, machine.devices)

    def began(self, machine: numeric.Machine, op: Op) -> None:
        if machine.module is not self.module or self.overflow:
            return
        if len(self.events) >= MAX_EVENTS:
            self.overflow = True
            return
        self.running.append(len(self.events))
        self.events.append(Event(op, machine.devices, self.running[-2] if len(self.running) > 1 else None))

    def ran(self, machine: numeric.Machine, op: Op, args: Sequence[Val], outs: Sequence[Val]) -> None:
        if machine.module is not self.module or self.overflow:
            return
        i = self.running.pop()
        event = self.events[i]
        assert event.op is op
        event.args, event.done = tuple(args), self.finished
        self.finished += 1
        for v, o in zip(op.results, outs, strict=True):
            self._keep(v, i, o, machine.devices)
        if op.opcode in ("case", "if") and machine.devices > 1 and args:
            self._mask_branches(op, np.asarray(args[0]))

    def _keep(self, v: Value, i: int, a: Val, devices: int) -> None:
        kept = self.instances.setdefault(v, [])
        if len(kept) < MAX_INSTANCES:
            kept.append((i, a, devices))

    def _mask_branches(self, op: Op, index: np.ndarray) -> None:
        """The events of each branch taken hold only on the devices that took it (the interpreter runs a
        branch on every device, then selects per device)."""
        n = len(op.regions)
        branch = np.where(index, 0, 1) if op.opcode == "if" else np.where((index < 0) | (index >= n), n - 1, index)
        taken = len(np.unique(branch))
        starts: list[tuple[int, int]] = []  # (first event, branch)
        for region, start in reversed(self.entries):
            if len(starts) == taken:
                break
            if any(region is r for r in op.regions):
                starts.append((start, next(b for b, r in enumerate(op.regions) if r is region)))
        bounds = [*sorted(starts), (len(self.events), -1)]
        for (start, b), (stop, _) in itertools.pairwise(bounds):
            took = branch.reshape(-1) == b
            for e in range(start, stop):
                self.masks[e] = self.masks[e] & took if e in self.masks else took


def links_of(module: Module) -> dict[Value, list[Value]]:
    """Each value's predecessors in the data flow: an op's operands, or the results of the body that makes
    it (loops, branches, shard_map bodies, called functions); a body argument's: what it is bound to."""
    calls: dict[str, list[Op]] = {}
    for f in module.funcs.values():
        for op in walk(f.body.ops):
            if op.opcode == "call":
                calls.setdefault(str(op.attrs.get("callee", "")), []).append(op)
    out: dict[Value, list[Value]] = {}
    for name, f in module.funcs.items():
        for k, p in enumerate(f.body.args):
            out[p] = [c.operands[k] for c in calls.get(name, []) if k < len(c.operands)]
        for op in walk(f.body.ops):
            inner = bodies(module, op)
            for k, r in enumerate(op.results):
                made = [b.results[k] for b in inner if len(b.results) == len(op.results)]
                out[r] = made + ([] if op.opcode == "while" else list(op.operands))
            if op.opcode == "while" and len(op.regions) == 2:
                for region in op.regions:
                    for k, a in enumerate(region.args):
                        out[a] = [op.operands[k], op.regions[1].results[k]]
            elif op.opcode == "manual_computation" and op.regions:
                for k, a in enumerate(op.regions[0].args):
                    out[a] = [op.operands[k]] if k < len(op.operands) else []
    return out


def bodies(module: Module, op: Op) -> list[Region]:
    """The regions computing `op`'s results (a loop's body; not a combiner)."""
    if op.opcode == "call":
        callee = module.funcs.get(str(op.attrs.get("callee", "")))
        return [callee.body] if callee is not None else []
    if op.opcode == "while":
        return [op.regions[1]] if len(op.regions) == 2 else []
    if op.opcode in COMBINER:
        return []
    return list(op.regions)


def dependent_on_inputs(module: Module, links: dict[Value, list[Value]]) -> set[Value]:
    """The values computed from an input of @main (the others are constants, iotas, device indices)."""
    dependent = set(module.main.body.args)
    changed = True
    while changed:
        changed = False
        for v, preds in links.items():
            if v not in dependent and any(p in dependent for p in preds):
                dependent.add(v)
                changed = True
    return dependent


class Reference:
    """The reference's values on the inputs (every execution), by element type and rank and by value, and its
    ops by opcode."""

    def __init__(self, rec: Recorder) -> None:
        self.by_kind: dict[tuple[str, int], list[Entry]] = {}
        self.of_value: dict[Value, list[Entry]] = {}
        self.ops: dict[str, list[Op]] = {}
        seen: dict[tuple[str, tuple[int, ...], int], Entry] = {}
        for v, kept in rec.instances.items():
            for _, a, _devices in kept:
                if not isinstance(a, np.ndarray) or a.ndim < 1 or a.shape[0] != 1:
                    continue
                x = np.ascontiguousarray(a[0])
                key = (x.dtype.str, x.shape, hash(x.tobytes()))
                entry = seen.get(key)
                if entry is None:
                    entry = seen[key] = (x, [])
                    self.by_kind.setdefault((x.dtype.str, x.ndim), []).append(entry)
                if v not in entry[1]:
                    entry[1].append(v)
                    self.of_value.setdefault(v, []).append(entry)
        for f in rec.module.funcs.values():
            for op in walk(f.body.ops):
                self.ops.setdefault(op.opcode, []).append(op)


class Agreement:
    """Whether an after value (one execution, `[devices, *local]`) is a reference value laid out over the mesh."""

    def __init__(self, ref: Reference, mesh: Mesh, deadline: Deadline | None = None) -> None:
        self.ref, self.mesh = ref, mesh
        self.deadline = deadline  # past it, the search gives up (`GiveUp`) like past MAX_COMPARISONS
        self.memo: dict[tuple[int, int], list[Value] | None] = {}
        self.comparisons = 0
        self._layouts: dict[tuple[int, ...], list[tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]]] = {}

    def of(self, a: Val, devices: int, mask: np.ndarray | None) -> list[Value] | None:
        """The reference values `a` is (None: none; an empty list: not comparable, taken as agreeing)."""
        if not isinstance(a, np.ndarray):
            return []
        key = (id(a), id(mask))
        if key not in self.memo:
            rank = a.ndim - 1
            self.memo[key] = self.match(a, devices, mask, [c for k in range(rank, rank + 1 + 2 * (devices > 1))
                                                           for c in self.ref.by_kind.get((a.dtype.str, k), ())])
        return self.memo[key]

    def match(self, a: np.ndarray, devices: int, mask: np.ndarray | None, candidates: Sequence[Entry]
              ) -> list[Value] | None:
        """The reference values of the first of `candidates` that `a` is laid out over the mesh (a block may
        drop dims of size 1 that the reference's value has: a value reshaped into its blocks)."""
        local = a.shape[1:]
        candidates = [c for c in candidates if c[0].dtype == a.dtype and c[0].ndim >= len(local)]
        if devices == 1:
            return next((vs for r, vs in candidates if r.shape == local and self._close(a[0], r)), None)
        if devices != self.mesh.size or 0 in local:
            return []
        rows = mask if mask is not None else np.ones(devices, dtype=bool)
        if not rows.any():
            return []
        first = int(np.argmax(rows))
        sums: dict[tuple[str, ...], np.ndarray | None] = {}
        for r, vs in candidates:
            for shape in _with_unit_dims(local, r.ndim):
                # A dim the blocks do not divide is padded at its end (XLA pads a dim a mesh axis does not
                # divide): only the reference's own entries are compared.
                parts = tuple(-(-g // n) for g, n in zip(r.shape, shape, strict=True))
                padding = [(0, p * n - g) for g, n, p in zip(r.shape, shape, parts, strict=True)]
                valid = None
                if any(hi for _, hi in padding):
                    if any(g < n and hi for g, n, (_, hi) in zip(r.shape, shape, padding, strict=True)):
                        continue  # (a block larger than the value: not a padded split)
                    valid = np.pad(np.ones(r.shape, dtype=bool), padding)
                    r = np.pad(r, padding)
                corner = r[tuple(slice(0, n) for n in shape)]
                for dims, free in self._layouts_of(parts):
                    for partial in _subsets(free if a.dtype.kind != "b" else ()):  # (a bool is no sum)
                        if partial not in sums:
                            sums[partial] = self._group_sum(a, partial)
                        summed = sums[partial]
                        if summed is None:
                            continue
                        held = summed.reshape((devices, *shape))
                        if first == 0 and valid is None and not self._close(held[0], corner):
                            continue
                        want = numeric.shard(r, Layout(dims, ()), self.mesh)
                        if valid is None:
                            if self._close(held[rows], want[rows]):
                                return vs
                            continue
                        keep = numeric.shard(valid, Layout(dims, ()), self.mesh)[rows]
                        if self._close(held[rows][keep], want[rows][keep]):
                            return vs
        return None

    def _close(self, a: np.ndarray, b: np.ndarray) -> bool:
        self.comparisons += 1
        if self.comparisons > MAX_COMPARISONS or (self.comparisons % 256 == 0 and self.deadline is not None
                                                  and self.deadline.passed()):
            raise GiveUp
        if a.shape != b.shape:
            return False
        if a.dtype.kind in "biu":
            return bool(np.array_equal(a, b))
        if a.dtype.kind == "f" and a.size:
            # Most candidates differ at once: the first element, compared as `isclose` would, settles those
            # without the cost of `allclose` (a search makes hundreds of thousands of comparisons).
            x, y = float(a.flat[0]), float(b.flat[0])
            if not (x == y or abs(x - y) <= ATOL + RTOL * abs(y) or (x != x and y != y)):
                return False
        with np.errstate(all="ignore"):
            return bool(np.allclose(a, b, rtol=RTOL, atol=ATOL, equal_nan=True))

    def _group_sum(self, a: np.ndarray, axes: tuple[str, ...]) -> np.ndarray | None:
        """Every device's value summed over its group along `axes` (a partial value's whole); None where every
        device of a group holds the same (a whole value: summed, it is the group size times too large)."""
        if not axes:
            return a
        coords = self.mesh.coords(np.arange(self.mesh.size))
        keep = [i for i, name in enumerate(self.mesh.names) if name not in axes]
        key = np.ravel_multi_index(tuple(coords[:, i] for i in keep), tuple(self.mesh.shape[i] for i in keep)) \
            if keep else np.zeros(self.mesh.size, dtype=np.int64)
        first = np.zeros(int(key.max()) + 1, dtype=np.int64)
        first[key[::-1]] = np.arange(len(key))[::-1]  # (each group's first device)
        if np.array_equal(a, a[first[key]]):
            return None
        total = np.zeros((int(key.max()) + 1, *a.shape[1:]), dtype=a.dtype)
        np.add.at(total, key, a)
        return total[key]

    def _layouts_of(self, parts: tuple[int, ...]) -> list[tuple[tuple[tuple[str, ...], ...], tuple[str, ...]]]:
        """Every way the mesh's axes split dims into `parts` pieces: the dims' axes, and the axes left over."""
        if parts not in self._layouts:
            axes = [a for a in self.mesh.names if self.mesh.axis_size(a) > 1]
            out = []
            for dims in _splits(self.mesh, parts, 0, tuple(axes)):
                used = {a for d in dims for a in d}
                out.append((dims, tuple(a for a in axes if a not in used)))
            self._layouts[parts] = out
        return self._layouts[parts]


def _splits(mesh: Mesh, parts: tuple[int, ...], i: int, left: tuple[str, ...]
            ) -> Iterator[tuple[tuple[str, ...], ...]]:
    if i == len(parts):
        yield ()
        return
    for k in range(len(left) + 1):
        for chosen in itertools.permutations(left, k):
            if mesh.size_of(chosen) != parts[i]:
                continue
            rest = tuple(a for a in left if a not in chosen)
            for tail in _splits(mesh, parts, i + 1, rest):
                yield (chosen, *tail)


def _with_unit_dims(shape: tuple[int, ...], rank: int) -> Iterator[tuple[int, ...]]:
    """`shape` with dims of size 1 put in to make it `rank` dims, every way."""
    for ones in itertools.combinations(range(rank), rank - len(shape)):
        rest = iter(shape)
        yield tuple(1 if k in ones else next(rest) for k in range(rank))


def _subsets(axes: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for k in range(len(axes) + 1):
        yield from itertools.combinations(axes, k)


@dataclass(frozen=True, slots=True)
class Both:
    """One trace for a run of both programs: each recorder keeps its own module's executions."""

    before: Recorder
    after: Recorder

    def began(self, machine: numeric.Machine, op: Op) -> None:
        self.before.began(machine, op)
        self.after.began(machine, op)

    def ran(self, machine: numeric.Machine, op: Op, args: Sequence[Val], outs: Sequence[Val]) -> None:
        self.before.ran(machine, op, args, outs)
        self.after.ran(machine, op, args, outs)

    def entered(self, machine: numeric.Machine, region: Region, args: Sequence[Val]) -> None:
        self.before.entered(machine, region, args)
        self.after.entered(machine, region, args)


def run_both(bp: Program, ap: Program, seed: int, bounds: dict[int, tuple[int, int]]
             ) -> tuple[Recorder, Recorder] | None:
    """Both programs run on the same random inputs (integer input i in `bounds[i]`, a promised half-open
    range), every execution recorded; None when they cannot be run or a loop runs too long."""
    bm, am = bp.module, ap.module
    inputs = trials.random_inputs(bm, seed, bounds)
    rb, ra = Recorder(bm), Recorder(am)
    token = numeric.TRACE.set(Both(rb, ra))
    try:
        numeric.run_pair(bm, am, inputs)
    except (ScalifyError, ValueError, TypeError, IndexError):
        return None
    finally:
        numeric.TRACE.reset(token)
    return None if rb.overflow or ra.overflow else (rb, ra)
