"""Text mutations of partitioned HLO for the mutant part of the differential fuzzer (tools/fuzz_mutants.py).

`parse_instructions` splits an HLO module's text into instructions (enough to rewrite them),
`mutation_sites` lists where each kind of mutation (MUTATION_KINDS: replica groups, collective-permute
pairs, offset tables, scalar constants, operand order, dims, all-reduce/reduce-scatter reducers, while trip
counts) can apply, and `mutate` makes one random mutation at one site. Nothing here runs XLA: whether a
mutant really computes something else is decided by running it (tools/fuzz_mutants.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

_COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "all-reduce-start", "all-gather-start")
_NON_COMMUTATIVE = ("subtract", "divide", "power", "remainder", "atan2", "compare")
_REDUCERS = {"add": ["maximum", "multiply"], "maximum": ["add", "minimum"], "minimum": ["maximum", "add"],
             "multiply": ["add"]}
MUTATION_KINDS = ("replica_groups", "permute_pairs", "offset_table", "scalar_constant", "swap_operands", "dims",
                  "reducer", "trip_count")


@dataclass
class Instr:
    """One HLO instruction line, split: enough to rewrite it."""

    line: int
    name: str
    type: str
    opcode: str
    operands: list[str]
    attrs: str
    computation: str


_HEAD_RE = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*")
_COMP_RE = re.compile(r"^(?:ENTRY\s+)?(%[\w.\-]+)\s")


def parse_instructions(text: str) -> list[Instr]:
    out, comp = [], ""
    for i, line in enumerate(text.split("\n")):
        if not line.startswith(" "):
            m = _COMP_RE.match(line)
            if m and line.rstrip().endswith("{"):
                comp = m.group(1)
            continue
        head = _HEAD_RE.match(line)
        if not head:
            continue
        rest = line[head.end():]
        op = re.search(r"(?<=[\s}\]])([a-z][a-z0-9\-]*)\(", " " + rest)
        if not op:
            continue
        start = op.end() - 1  # the "(" in " " + rest
        depth, j = 0, start
        s = " " + rest
        for j in range(start, len(s)):
            if s[j] == "(":
                depth += 1
            elif s[j] == ")":
                depth -= 1
                if depth == 0:
                    break
        args = s[start + 1:j]
        operands = [a.strip() for a in _split_top(args)] if args.strip() else []
        out.append(Instr(i, head.group(1), s[1:op.start()].strip(), op.group(1), operands, s[j + 1:], comp))
    return out


def _split_top(s: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "({[":
            depth += 1
        elif ch in ")}]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _groups_of(line: str) -> list[list[int]] | None:
    """A collective's replica groups as explicit lists, whatever the spelling (explicit, iota, mesh)."""
    import gen_fixtures as gf

    if "replica_groups=mesh[" in line:
        line = gf._explicit_mesh_groups(line)
    m = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    if m:
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", m.group(1))]
        return groups if groups and all(groups) else None
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if m:
        g, s = int(m.group(1)), int(m.group(2))
        dims = [int(x) for x in m.group(3).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(4):
            ids = ids.transpose([int(x) for x in m.group(4).split(",")])
        return ids.reshape(g, s).tolist()
    return None


_GROUPS_SPELLING = re.compile(r"replica_groups=(?:mesh\[[^\]]*\](?:,\s*device_ids=\([^)]*\))?\s*\{[^}]*\}|"
                              r"\{(?:\{[\d,]*\},?)*\}|\[\d+,\d+\]<=\[[\d,]+\](?:T\([\d,]+\))?)")


def _with_groups(line: str, groups: list[list[int]]) -> str:
    spelled = "replica_groups={" + ",".join("{" + ",".join(map(str, g)) + "}" for g in groups) + "}"
    return _GROUPS_SPELLING.sub(lambda _m: spelled, line, count=1)


@dataclass
class Mutant:
    fixture: str
    kind: str
    what: str
    text: str
    changed: list[int]  # line numbers


def _replace_lines(text: str, changes: dict[int, str]) -> str:
    lines = text.split("\n")
    for i, new in changes.items():
        lines[i] = new
    return "\n".join(lines)


def mutation_sites(text: str) -> dict[str, list[Instr]]:
    instrs = parse_instructions(text)
    lines = text.split("\n")
    conds = {m.group(1) for ins in instrs if ins.opcode == "while"
             for m in [re.search(r"condition=(%[\w.\-]+)", ins.attrs)] if m}
    bodies = {m.group(1) for ins in instrs if ins.opcode == "while"
              for m in [re.search(r"body=(%[\w.\-]+)", ins.attrs)] if m}
    # A reduction's init must be its reducer's identity (XLA may drop it, e.g. over a size-1 dim): changing
    # the init, or the reducer under it, makes a program whose result XLA does not define.
    inits = {o for ins in instrs if ins.opcode in ("reduce", "reduce-window")
             for o in ins.operands[len(ins.operands) // 2:]}
    sites: dict[str, list[Instr]] = {k: [] for k in MUTATION_KINDS}
    for ins in instrs:
        line = lines[ins.line]
        if ins.opcode in _COLLECTIVES and "replica_groups=" in line and _groups_of(line):
            sites["replica_groups"].append(ins)
        if ins.opcode.startswith("collective-permute") and "source_target_pairs=" in line:
            sites["permute_pairs"].append(ins)
        if ins.opcode == "constant":
            if re.match(r"[su]\d+\[\d+\]", ins.type) and "{" in (ins.operands[0] if ins.operands else ""):
                sites["offset_table"].append(ins)
            elif re.match(r"(?:[fsu]\d+|bf16|pred)\[\]", ins.type):
                if ins.computation in conds and ins.type.startswith("s32"):
                    sites["trip_count"].append(ins)  # the bound: +-1 iteration
                elif ins.name not in inits and not (ins.computation in bodies and ins.type[0] in "su"):
                    # (an integer constant of a loop body may be the counter's step: 1 -> 0 never ends)
                    sites["scalar_constant"].append(ins)
        if ins.opcode in _NON_COMMUTATIVE and len(ins.operands) == 2:
            sites["swap_operands"].append(ins)
        if ins.opcode == "select" and len(ins.operands) == 3:
            sites["swap_operands"].append(ins)
        if ins.opcode in ("dynamic-slice", "dynamic-update-slice") and len(ins.operands) >= 3:
            sites["swap_operands"].append(ins)
        if ins.opcode == "concatenate" and len(ins.operands) >= 2:
            sites["swap_operands"].append(ins)
        if re.search(r"(?<![\w_])(dimensions|iota_dimension|lhs_contracting_dims|rhs_contracting_dims|"
                     r"lhs_batch_dims|rhs_batch_dims)=", ins.attrs):
            sites["dims"].append(ins)
        if ins.opcode in ("all-reduce", "reduce-scatter", "all-reduce-start") and "to_apply=" in ins.attrs:
            sites["reducer"].append(ins)
    return sites


def _rank(type_text: str) -> int:
    m = re.match(r"\w+\[([\d,]*)\]", type_text)
    return len([x for x in m.group(1).split(",") if x]) if m else 0


def mutate(name: str, text: str, kind: str, ins: Instr, rng: np.random.Generator) -> Mutant | None:
    """One random mutation of `kind` at `ins` (None when this site admits no change of this kind)."""
    lines = text.split("\n")
    line = lines[ins.line]

    def done(new_line: str, what: str) -> Mutant | None:
        if new_line == line:
            return None
        return Mutant(name, kind, f"{ins.name} ({ins.opcode}): {what}", _replace_lines(text, {ins.line: new_line}),
                      [ins.line])

    if kind == "replica_groups":
        groups = _groups_of(line)
        assert groups is not None
        g, s = len(groups), len(groups[0])
        flat = [d for grp in groups for d in grp]
        options = []
        if g >= 2 and s >= 1:
            options.append("swap_between")
        if s >= 2:
            options.append("permute_within")
        if g >= 2 and s >= 2 and ins.opcode.startswith("all-reduce"):
            options.append("transpose")
        if len(flat) >= 2:
            options.append("rotate")
        if not options:
            return None
        how = options[int(rng.integers(len(options)))]
        new = [list(grp) for grp in groups]
        if how == "swap_between":
            a, b = (int(x) for x in rng.choice(g, 2, replace=False))
            i, j = int(rng.integers(s)), int(rng.integers(s))
            new[a][i], new[b][j] = new[b][j], new[a][i]
        elif how == "permute_within":
            k = int(rng.integers(g))
            perm = rng.permutation(s)
            while s > 1 and (perm == np.arange(s)).all():
                perm = rng.permutation(s)
            new[k] = [new[k][int(p)] for p in perm]
        elif how == "transpose":
            new = np.array(groups).T.tolist()
        else:
            rolled = flat[1:] + flat[:1]
            new = [rolled[i * s:(i + 1) * s] for i in range(g)]
        return done(_with_groups(line, new), f"replica groups {groups} -> {new} ({how})")
    if kind == "permute_pairs":
        m = re.search(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}", line)
        if not m:
            return None
        pairs = [tuple(int(x) for x in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", m.group(1))]
        how = str(rng.choice(["reverse", "drop", "swap_targets"]))
        if how == "reverse":
            new = [(t, s_) for s_, t in pairs]
        elif how == "drop" and len(pairs) > 1:
            k = int(rng.integers(len(pairs)))
            new = pairs[:k] + pairs[k + 1:]
        elif len(pairs) >= 2:
            a, b = (int(x) for x in rng.choice(len(pairs), 2, replace=False))
            new = list(pairs)
            new[a], new[b] = (pairs[a][0], pairs[b][1]), (pairs[b][0], pairs[a][1])
        else:
            return None
        spelled = "source_target_pairs={" + ",".join(f"{{{s_},{t}}}" for s_, t in new) + "}"
        return done(line.replace(m.group(0), spelled), f"pairs {pairs} -> {new} ({how})")
    if kind == "offset_table":
        m = re.search(r"constant\(\{([-\d,\s]*)\}\)", line)
        if not m:
            return None
        values = [int(v) for v in m.group(1).split(",") if v.strip()]
        if len(values) < 2:
            return None
        how = str(rng.choice(["swap", "bump", "roll"]))
        new = list(values)
        if how == "swap":
            a, b = (int(x) for x in rng.choice(len(values), 2, replace=False))
            new[a], new[b] = new[b], new[a]
        elif how == "bump":
            k = int(rng.integers(len(values)))
            new[k] += int(rng.choice([-1, 1]))
            if ins.type.startswith("u") and new[k] < 0:
                new[k] = 1
        else:
            new = values[1:] + values[:1]
        if new == values:
            return None
        return done(line.replace(m.group(0), "constant({" + ", ".join(map(str, new)) + "})"),
                    f"table {values} -> {new} ({how})")
    if kind in ("scalar_constant", "trip_count"):
        m = re.search(r"constant\(([^()]*)\)", line)
        if not m:
            return None
        old = m.group(1).strip()
        if ins.type.startswith("pred"):
            new = "false" if old == "true" else "true"
        elif ins.type.startswith(("s", "u")):
            v = int(old)
            new = str(v + int(rng.choice([-1, 1])) if v > 0 or ins.type.startswith("s") else v + 1)
        else:
            try:
                v = float(old)
            except ValueError:
                return None
            choice = int(rng.integers(3))
            nv = 0.0 if not math.isfinite(v) else (v * 1.5 + 0.25 if choice == 0 else -v if choice == 1 and v else v + 1)
            with np.errstate(over="ignore"):  # FLT_MAX * 1.5 is inf: still a valid (and changed) constant
                new = repr(float(np.float32(nv)))
        return done(line.replace(m.group(0), f"constant({new})"), f"constant {old} -> {new}")
    if kind == "swap_operands":
        ops = list(ins.operands)
        if ins.opcode == "select":
            i, j = 1, 2
        elif ins.opcode in ("dynamic-slice", "dynamic-update-slice"):
            first = 1 if ins.opcode == "dynamic-slice" else 2
            idx = list(range(first, len(ops)))
            if len(idx) < 2:
                return None
            i, j = (int(x) for x in rng.choice(idx, 2, replace=False))
        elif ins.opcode == "concatenate":
            i, j = (int(x) for x in rng.choice(len(ops), 2, replace=False))
        else:
            i, j = 0, 1
        if ops[i] == ops[j]:
            return None
        ops[i], ops[j] = ops[j], ops[i]
        new_args = ", ".join(ops)
        head = line[:line.index(ins.opcode + "(", line.index("=")) + len(ins.opcode) + 1]
        return done(head + new_args + ")" + ins.attrs, f"operands {i} and {j} swapped")
    if kind == "dims":
        attrs = list(re.finditer(r"(?<![\w_])(dimensions|iota_dimension|lhs_contracting_dims|rhs_contracting_dims|"
                                 r"lhs_batch_dims|rhs_batch_dims)=(\{[\d,]*\}|\d+)", ins.attrs))
        if not attrs:
            return None
        m = attrs[int(rng.integers(len(attrs)))]
        values = [int(v) for v in m.group(2).strip("{}").split(",") if v]
        rank = max(_rank(ins.type), max(values, default=0) + 1, 1)
        if ins.opcode == "reduce":
            rank = _rank(ins.type) + len(values)
        if ins.opcode == "transpose" and len(values) >= 2:
            a, b = (int(x) for x in rng.choice(len(values), 2, replace=False))
            new = list(values)
            new[a], new[b] = new[b], new[a]
        elif values:
            k = int(rng.integers(len(values)))
            others = [d for d in range(rank) if d not in values]
            if not others:
                return None
            new = list(values)
            new[k] = int(rng.choice(others))
        else:
            return None
        spelled = "{" + ",".join(map(str, new)) + "}" if m.group(2).startswith("{") else str(new[0])
        new_attrs = ins.attrs[:m.start(2)] + spelled + ins.attrs[m.end(2):]
        return done(line[:len(line) - len(ins.attrs)] + new_attrs, f"{m.group(1)} {values} -> {new}")
    if kind == "reducer":
        m = re.search(r"to_apply=(%[\w.\-]+)", ins.attrs)
        if not m:
            return None
        comp = m.group(1)
        body = re.search(rf"^{re.escape(comp)} \(.*?^\}}\n", text, re.S | re.M)
        if not body:
            return None
        root = re.search(r"ROOT %[\w.\-]+ = \S+ (add|maximum|minimum|multiply)\(", body.group(0))
        if not root:
            return None
        new_op = str(rng.choice(_REDUCERS[root.group(1)]))
        clone = f"{comp}.{new_op}"  # deterministic: the same mutation twice is a duplicate
        new_body = body.group(0).replace(comp + " (", clone + " (", 1)
        new_body = re.sub(r"(ROOT %[\w.\-]+ = \S+ )" + root.group(1) + r"\(", rf"\g<1>{new_op}(", new_body, count=1)
        new_line = line.replace(f"to_apply={comp}", f"to_apply={clone}", 1)
        # The clone goes right before the first computation, so it is defined before any use.
        first = re.search(r"^%[\w.\-]+ \(", text, re.M)
        mutated = _replace_lines(text, {ins.line: new_line})
        if first is None:
            return None
        mutated = mutated[:first.start()] + new_body + "\n" + mutated[first.start():]
        return Mutant(name, kind, f"{ins.name} ({ins.opcode}): reducer {root.group(1)} -> {new_op}", mutated,
                      [ins.line])
    raise ValueError(kind)
