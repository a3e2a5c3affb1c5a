"""Generate the XLA pass-pipeline dump fixtures used by `scalify-hlo passes` tests.

    python tools/gen_pass_dump.py

Compiles the tiny Llama block (FSDP×TP on 8 fake CPU devices) with a per-compile dump of every pass
(`xla_dump_hlo_pass_re=.*`), keeps the module's pass files (sanitised: repo-relative paths only) and
writes them as `tests/pass_dumps/llama_block.tar.gz`. A second archive, `llama_block_broken.tar.gz`,
is the same dump with one pass output broken by hand (the operands of one `subtract` swapped in the
output of the fusion pass), and `llama_block_broken.json` names that pass and instruction.

`train_step_algsimp.tar.gz` holds the two files around the first `algsimp` of a one-layer train step
(`tools/bench_programs.py gen-passes --layers 1`: loss, grad, AdamW, fsdp 2 x tp 4): what XLA's algebraic
simplifier writes (a division by a broadcast as a product with its reciprocal, `max(x, -inf)` dropped, a
reduce over added unit dims dropped, two divisions merged) against what it was written from.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tarfile
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from gen_fixtures import _exclude_generator_frames, make_mesh, sanitize  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from programs import llama  # noqa: E402

OUT = TOOLS.parent / "tests" / "pass_dumps"
BROKEN_PASS = "after_fusion.before_fusion-wrapper"


def dump() -> dict[str, str]:
    _exclude_generator_frames()
    cfg = llama.TINY
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    rng = np.random.default_rng(0)
    params, x = llama.init_layer(cfg, rng), llama.init_activations(cfg, rng)
    act = NamedSharding(mesh, llama.activation_spec())
    specs = jax.tree.map(lambda s: NamedSharding(mesh, s), llama.layer_specs())
    fn = jax.jit(lambda x, p: llama.block(x, p, cfg), in_shardings=(act, specs), out_shardings=act)
    structs = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), (x, params))
    with tempfile.TemporaryDirectory() as d:
        fn.lower(*structs).compile(compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": ".*"})
        files = {p.name: p.read_text() for p in Path(d).iterdir()
                 if p.suffix == ".txt" and re.match(r"module_\d+\.jit_", p.name)
                 and (".after_" in p.name or p.name.endswith(".before_optimizations.txt"))}
    return {re.sub(r"^module_\d+", "module_0000", name): sanitize(text) for name, text in sorted(files.items())}


def write_tar(path: Path, files: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=9) as tar:
        for name, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0  # reproducible archives
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())


def break_one(files: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    name = next(n for n in files if BROKEN_PASS in n)
    lines = files[name].splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"(\s*(?:ROOT )?%(\S+) = \S+ subtract\()(%[^,]+), (%[^)]+)(\).*)", line)
        if m:
            lines[i] = f"{m.group(1)}{m.group(4)}, {m.group(3)}{m.group(5)}"
            broken = dict(files)
            broken[name] = "\n".join(lines) + "\n"
            return broken, {"file": name, "instruction": m.group(2), "pass": "HLO_passes_after_layout_assignment/fusion"}
    raise RuntimeError(f"no subtract in {name}")


def train_step_algsimp() -> dict[str, str]:
    """The pass files before and after the first `algsimp` of the one-layer train step's dump."""
    import bench_programs

    with tempfile.TemporaryDirectory() as d:
        made = bench_programs.generate_pass_dump(bench_programs.PassDumpSpec(layers=1), d, force=True)
        names = sorted(p.name for p in made.dump.iterdir() if ".jit_step." in p.name)
        before = next(n for n in names if ".simplification.after_pipeline-start.before_algsimp" in n)
        after = names[names.index(before) + 1]
        assert ".after_algsimp." in after, after
        return {n: (made.dump / n).read_text() for n in (before, after)}


def main() -> None:
    write_tar(OUT / "train_step_algsimp.tar.gz", train_step_algsimp())
    files = dump()
    write_tar(OUT / "llama_block.tar.gz", files)
    broken, what = break_one(files)
    write_tar(OUT / "llama_block_broken.tar.gz", broken)
    (OUT / "llama_block_broken.json").write_text(json.dumps(what, indent=2) + "\n")
    print(f"{len(files)} pass files; broken: {what}")


if __name__ == "__main__":
    main()
