"""Bugs injected into partitioned programs for ``tools/bench.py``, and how to find an instruction's layer.

``inject_bug(after_text, layer, kind)`` breaks one layer of an unrolled after.hlo (kind ``replica_groups``: one
all-reduce of that layer reduces over the other mesh axis) and returns the text and the instruction name.
Replica groups are read and written in XLA's three spellings (explicit, iota, mesh); the other axis of a 2-D
mesh is the transpose of the groups.
"""

from __future__ import annotations

import re

_GROUPS = re.compile(r"replica_groups=(\{(?:\{[\d,]*\},?)*\}|\[[\d,]+\]<=\[[\d,]+\](?:T\([\d,]+\))?"
                     r"|mesh\[[^\]]*\]\s*\{[^}]*\})")


def parse_replica_groups(spelling: str, num_partitions: int) -> list[list[int]]:
    """Explicit ``{{0,1},{2,3}}``, iota ``[2,4]<=[4,2]T(1,0)`` or mesh ``mesh['a'=2,'b'=4] {'b'}`` → groups."""
    import numpy as np

    if spelling.startswith("{"):
        return [[int(v) for v in g.split(",") if v] for g in re.findall(r"\{([\d,]*)\}", spelling[1:-1])]
    if spelling.startswith("["):
        m = re.fullmatch(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", spelling)
        assert m, spelling
        shape = [int(v) for v in m.group(1).split(",")]
        dims = [int(v) for v in m.group(2).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(3):
            ids = ids.transpose([int(v) for v in m.group(3).split(",")])
        return ids.reshape(shape).tolist()
    m = re.fullmatch(r"mesh\[([^\]]*)\]\s*\{([^}]*)\}", spelling)
    assert m, spelling
    axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
    names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
    assert int(np.prod(sizes)) == num_partitions, spelling
    keep = [names.index(a) for a in re.findall(r"'([^']+)'", m.group(2))]
    rest = [i for i in range(len(names)) if i not in keep]
    ids = np.arange(num_partitions).reshape(sizes).transpose(rest + keep)
    return ids.reshape(-1, int(np.prod([sizes[i] for i in keep]))).tolist()


def spell_replica_groups(groups: list[list[int]]) -> str:
    """The shortest of XLA's spellings that is exact: iota ``[n,g]<=[N]`` / ``[n,g]<=[g,n]T(1,0)``, else explicit."""
    import numpy as np

    a = np.asarray(groups)
    n, g = a.shape
    total = n * g
    if np.array_equal(a, np.arange(total).reshape(n, g)):
        return f"[{n},{g}]<=[{total}]"
    if np.array_equal(a, np.arange(total).reshape(g, n).T):
        return f"[{n},{g}]<=[{g},{n}]T(1,0)"
    return "{" + ",".join("{" + ",".join(str(int(v)) for v in row) + "}" for row in a) + "}"


def other_axis_groups(groups: list[list[int]]) -> list[list[int]]:
    """Groups over the other axis of a 2-D mesh: one member of each original group (the transpose)."""
    if len({len(g) for g in groups}) != 1 or len(groups) < 2:
        raise ValueError(f"cannot move groups {groups[:2]}... to another axis: need >= 2 equal-sized groups")
    return [list(col) for col in zip(*groups, strict=True)]


def num_partitions_of(text: str) -> int:
    m = re.search(r"num_partitions=(\d+)", text.split("\n", 1)[0])
    if m:
        return int(m.group(1))
    ids = [int(v) for v in re.findall(r"<=\[(\d+)\]", text)]
    if not ids:
        raise ValueError("cannot tell the number of partitions from the HloModule header")
    return max(ids)


def entry_all_reduces(text: str) -> list[tuple[int, str]]:
    """(line index, instruction name) of every all-reduce in the ENTRY computation, in text order."""
    lines = text.split("\n")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("ENTRY "))
    out = []
    for i in range(start + 1, len(lines)):
        ln = lines[i]
        if ln.startswith("}"):
            break
        m = re.match(r"\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*\S+\s+all-reduce\(", ln)
        if m:
            out.append((i, m.group(1)))
    return out


def layers_in(text: str) -> int:
    """Number of unrolled layers, from the parameter names ``layers[k][...]`` JAX puts in the metadata."""
    ks = [int(k) for k in re.findall(r"op_name=\"layers\[(\d+)\]", text)]
    if not ks:
        raise ValueError("no layers[k] parameters: not an unrolled program")
    return max(ks) + 1


def layer_of_line(text: str, line: int, per_layer: int) -> int | None:
    """The layer an ENTRY line belongs to: layer k ends with its ``per_layer``-th all-reduce (plus the residual)."""
    ends = [i for j, (i, _) in enumerate(entry_all_reduces(text)) if j % per_layer == per_layer - 1]
    for k, end in enumerate(ends):
        if line <= end + 1:
            return k
    return None


def instruction_line(text: str, name: str) -> int | None:
    name = name.lstrip("%")
    m = re.search(rf"^\s*(?:ROOT\s+)?%{re.escape(name)} = ", text, re.M)
    return text.count("\n", 0, m.start()) if m else None


def inject_bug(after_text: str, layer: int, kind: str = "replica_groups", *, per_layer: int | None = None,
               which: int = 0, check: bool = True) -> tuple[str, str]:
    """Break layer ``layer`` (0-based) of an unrolled after.hlo; return (mutated text, instruction name).

    ``replica_groups``: the ``which``-th all-reduce of that layer (0: attention-out, 1: FFN-down for Llama) gets
    replica groups over the other mesh axis (tp groups -> fsdp groups). The layer's all-reduces are found by
    order: ENTRY's all-reduces come layer by layer, ``per_layer`` each (count them in a 1-layer program; by
    default total / layers). ``check`` re-parses the result with XLA's HLO parser."""
    if kind != "replica_groups":
        raise ValueError(f"unknown bug kind {kind!r}; supported: replica_groups")
    reduces = entry_all_reduces(after_text)
    n_layers = layers_in(after_text)
    if per_layer is None:
        if len(reduces) % n_layers:
            raise ValueError(f"{len(reduces)} all-reduces do not split evenly over {n_layers} layers")
        per_layer = len(reduces) // n_layers
    if not 0 <= layer < n_layers or not 0 <= which < per_layer:
        raise ValueError(f"layer {layer} / all-reduce {which}: the program has {n_layers} layers, "
                         f"{per_layer} all-reduces each")
    if len(reduces) != per_layer * n_layers:
        raise ValueError(f"{len(reduces)} all-reduces in ENTRY, expected {per_layer} x {n_layers} layers")
    index, name = reduces[layer * per_layer + which]
    lines = after_text.split("\n")
    line = lines[index]
    _check_layer_order(lines, index, layer)
    lines[index] = to_other_axis(line, num_partitions_of(after_text))
    text = "\n".join(lines)
    if check:
        import jaxlib._hlo as xla_hlo

        xla_hlo.hlo_module_from_text(text)
    return text, name


def to_other_axis(line: str, num_partitions: int) -> str:
    """A collective's instruction line with its replica groups moved to the other axis of the 2-D mesh."""
    m = _GROUPS.search(line)
    if not m:
        raise ValueError(f"no replica_groups in {line[:200]}")
    wrong = spell_replica_groups(other_axis_groups(parse_replica_groups(m.group(1), num_partitions)))
    return line[: m.start(1)] + wrong + line[m.end(1):]


def _check_layer_order(lines: list[str], index: int, layer: int) -> None:
    """Sanity: the nearest parameter above the all-reduce is one of layer ``layer``'s weights."""
    for ln in reversed(lines[:index]):
        m = re.search(r"parameter\(\d+\).*op_name=\"layers\[(\d+)\]", ln)
        if m:
            if int(m.group(1)) != layer:
                raise ValueError(f"all-reduce order does not follow the layers: the weight above is "
                                 f"layers[{m.group(1)}], expected layers[{layer}]")
            return
