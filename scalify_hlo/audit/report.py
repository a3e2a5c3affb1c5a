"""The audit as data: each collective with its axes and bytes, the totals, the byte model, and renderings
(text, JSON, a chart of bytes per layer by axis)."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

# Bytes one device sends per execution, by collective kind (ring algorithms); stated in every report.
BYTE_MODEL: dict[str, str] = {
    "all_reduce": "2·(n-1)/n·S (ring: reduce-scatter then all-gather)",
    "all_gather": "(n-1)/n·S_out (ring; S_out the gathered result)",
    "reduce_scatter": "(n-1)/n·S (ring)",
    "all_to_all": "(n-1)/n·S (each device keeps 1/n)",
    "collective_permute": "S (the operand moves once)",
    "collective_broadcast": "S (the operand moves once)",
}


@dataclass(frozen=True, slots=True)
class Collective:
    index: int
    kind: str
    instruction: str
    axes: tuple[str, ...]
    group_size: int
    bytes: int
    shape: tuple[int, ...]
    dtype: str
    source: str | None
    layer: int | None = 0  # the layer of an unrolled model; None when not in one (scanned models: see `loop`)
    executions: int = 1  # per step: the product of the static trip counts of the loops around it
    loops: tuple[str, ...] = ()  # the `while` loops around it, outermost first (instruction or source line)

    @property
    def step_bytes(self) -> int:
        return self.bytes * self.executions

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "bytes_per_step": self.step_bytes}


@dataclass
class Audit:
    path: str
    form: str
    mesh: str
    devices: int
    collectives: list[Collective] = field(default_factory=list)
    flags: list[dict[str, Any]] = field(default_factory=list)
    layers: int = 1
    layers_from: str | None = None  # "repeated collectives", or the scanned loop whose iterations are layers
    axis_names: str = "module"  # where the axis names come from: "module", "reference" or "positions"
    loops: list[dict[str, Any]] = field(default_factory=list)  # every while loop: where, trip count
    outputs: list[dict[str, Any]] = field(default_factory=list)  # every result: its type and sharding

    @property
    def total_bytes(self) -> int:
        return sum(c.step_bytes for c in self.collectives)

    def by_kind_and_axes(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for c in self.collectives:
            out[f"{c.kind} over {fmt_axes(c.axes)}"] += c.step_bytes
        return dict(out)

    def bytes_per_layer(self) -> list[int]:
        """Bytes per device of each layer: of an unrolled model, its collectives; of a scanned one, one
        iteration of the scanned loop (collectives outside it belong to no layer)."""
        per = [0] * self.layers
        for c in self.collectives:
            if c.layer is not None:
                per[c.layer] += c.step_bytes
            elif self.layers_from is not None and self.layers_from in c.loops:
                for k in range(self.layers):
                    per[k] += c.step_bytes // self.layers
        return per

    def bytes_per_layer_by_axes(self) -> dict[str, list[int]]:
        """`bytes_per_layer`, split by collective kind and mesh axes ("all_gather over {"fsdp"}")."""
        out: dict[str, list[int]] = {}
        for c in self.collectives:
            per = out.setdefault(f"{c.kind} over {fmt_axes(c.axes)}", [0] * self.layers)
            if c.layer is not None:
                per[c.layer] += c.step_bytes
            elif self.layers_from is not None and self.layers_from in c.loops:
                for k in range(self.layers):
                    per[k] += c.step_bytes // self.layers
        return {k: v for k, v in out.items() if any(v)}

    def byte_model(self) -> dict[str, str]:
        kinds = {c.kind for c in self.collectives}
        return {k: v for k, v in BYTE_MODEL.items() if k in kinds}

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "form": self.form, "mesh": self.mesh, "axis_names": self.axis_names,
                "devices": self.devices, "total_bytes_per_device": self.total_bytes,
                "by_kind_and_axes": self.by_kind_and_axes(),
                "byte_model": {"algorithm": "ring", "unit": "bytes one device sends per execution",
                               "S": "the per-device operand", "n": "the group size", "kinds": self.byte_model()},
                "layers": self.layers, "layers_from": self.layers_from, "bytes_per_layer": self.bytes_per_layer(),
                "loops": self.loops, "outputs": self.outputs, "collectives": [c.to_json() for c in self.collectives], "flags": self.flags}

    def render(self) -> str:
        how = ""
        if self.layers > 1 and self.layers_from is not None:
            scan = next((loop for loop in self.loops if loop["where"] == self.layers_from), None)
            at = f" at {scan['source']}" if scan and scan["source"] else ""
            how = f" (the iterations of loop {self.layers_from}{at})" if scan else f" ({self.layers_from})"
        lines = [f"{self.path}: {self.form} program on mesh {self.mesh} ({self.devices} devices), "
                 f"{len(self.collectives)} collectives, {self.layers} layer(s){how}"]
        if self.axis_names == "positions":
            lines.append("note: the module names no mesh axes (numbered by position here); pass --reference "
                         "with the program before partitioning to see yours")
        lines.append(f"{'#':>4} {'layer':>5} {'collective':<20} {'axes':<18} {'n':>4} {'bytes/device':>14} "
                     f"{'×':>4}  source")
        for c in self.collectives:
            layer = str(c.layer) if c.layer is not None else "each" if self.layers_from in c.loops else "-"
            lines.append(f"{c.index:>4} {layer:>5} {c.kind:<20} {fmt_axes(c.axes):<18} {c.group_size:>4} "
                         f"{c.bytes:>14,} {c.executions:>4}  {c.source or '?'} ({c.instruction})")
        for loop in self.loops:
            count = loop["trips"] if loop["trips"] is not None else "unknown (counted once)"
            if not loop["collectives"]:
                continue
            at = f" at {loop['source']}" if loop["source"] else ""
            lines.append(f"loop {loop['where']}{at}: {count} trip(s) per run, {loop['collectives']} collective(s) inside")
        lines.append("per device per step (× = executions per step):")
        for k, v in sorted(self.by_kind_and_axes().items()):
            lines.append(f"  {k:<40} {v:>14,} bytes")
        lines.append(f"  {'total':<40} {self.total_bytes:>14,} bytes")
        lines.append("byte model (ring; S the per-device operand, n the group size; per execution):")
        for kind, model in self.byte_model().items():
            lines.append(f"  {kind:<20} {model}")
        if self.outputs:
            lines.append("outputs (sharding on the mesh; [{axes} per dim]):")
            for o in self.outputs:
                lines.append(f"  {o['index']:>3} {o['type']:<28} {o['sharding']}")
        for f in self.flags:
            lines.append(f"flag: {f['kind']}: {f['message']}")
        return "\n".join(lines)

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)


def fmt_axes(axes: tuple[str, ...]) -> str:
    return "{" + ", ".join(f'"{a}"' for a in axes) + "}"


def plot(a: Audit, path: str) -> None:
    """A bar chart of bytes per device per layer, stacked by collective kind and axes (matplotlib, an optional
    extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise RuntimeError("--plot needs matplotlib: pip install 'scalify-hlo[plot]'") from err
    series = a.bytes_per_layer_by_axes()
    layers = range(a.layers)
    fig, ax = plt.subplots(figsize=(max(4, a.layers * 0.3), 3))
    bottom = [0] * a.layers
    for label, per in sorted(series.items()):
        ax.bar(layers, per, bottom=bottom, label=label)
        bottom = [b + x for b, x in zip(bottom, per, strict=True)]
    ax.set_xlabel("layer")
    ax.set_ylabel("bytes per device")
    ax.set_title(f"{a.path}: collectives per layer")
    if series:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
