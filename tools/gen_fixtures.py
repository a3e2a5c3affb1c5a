#!/usr/bin/env python
"""Generate the before/after fixture pairs under ``tests/fixtures/`` from real JAX programs.

    python tools/gen_fixtures.py [--only NAME ...] [--list]

Each fixture directory holds
- ``before.mlir``   the single-device reference, ``jax.jit(ref).lower(...).as_text(debug_info=True)``
                    (with in/out shardings, hence ``sdy.sharding`` or ``mhlo.sharding``, for partitioned pairs);
- ``after.hlo``     the per-device HLO after SPMD partitioning (XLA dump), or ``compiled.as_text()``, or a
                    mutated copy of a correct ``after.hlo``; or ``after.mlir``: a shard_map implementation;
- ``expected.json`` verdict, expected bug line, after kind, mesh, generator and JAX version;
- ``oracle.npz``    the seeded inputs ``in_i``, XLA's ``before_out_i`` and ``after_out_i`` (the after program
                    run by XLA on 8 fake CPU devices and gathered to global arrays).

The programs live in ``tools/programs/``; bug lines carry a ``# BUG: <what>`` marker and are located from it.
Everything is deterministic: re-running reproduces the same bytes. No machine paths land in any file.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import glob
import importlib
import inspect
import io
import json
import os
import re
import shutil
import sys
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# Must precede the first `import jax`: 8 fake CPU devices.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from programs import (  # noqa: E402
    block_reductions,
    contrastive,
    control_flow,
    convergence,
    convolution,
    dp_mean,
    false_alarms,
    flax_models,
    head_groups,
    kv_cache,
    linalg_rng,
    llama,
    llama_train,
    localisation,
    loss_dp,
    loss_scaling,
    megatron,
    moe,
    nested_loops,
    norms,
    ops_coverage,
    optax_steps,
    pipeline,
    positions,
    prod_train,
    relayout,
    residual_grad,
    ring_attention,
    rmsnorm,
    rope_sp,
    shard_map_in_jit,
    sorting,
    soundness,
    summa,
    symbolic_layouts,
    token_shift,
    train,
    ulysses,
    uneven,
    vocab_parallel,
    vocab_softmax,
)


def _exclude_generator_frames() -> None:
    """Keep this script's own frames out of every recorded location / stack frame: the fixtures then name
    only ``tools/programs/*`` lines and do not change when the generator is edited or run with --only."""
    from jax._src import source_info_util  # private; the only knob JAX has for this

    for path in {__file__, str(Path(__file__).resolve())}:
        source_info_util.register_exclusion(path)
    import flax
    import optax  # a library's frames (like jax's own) name no line of the user's program

    source_info_util.register_exclusion(str(Path(optax.__file__).parent))
    source_info_util.register_exclusion(str(Path(flax.__file__).parent))


_exclude_generator_frames()

FIXTURES = REPO / "tests" / "fixtures"
GENERATOR = "tools/gen_fixtures.py"
JAX_VERSION = jax.__version__
# An absolute path (a slash that starts `/dir/...`), wherever the generating machine kept its files; and
# library frames, which only a machine's install has.
ABSOLUTE_PATH = re.compile(r"(?<![\w.)\]>/])/(?:[\w.+-]+/)+")
LIBRARY_FRAME = "site-packages"
MAX_FILE_BYTES = 200_000
RTOL, ATOL = 1e-4, 1e-5
N_DEVICES = 8


# =============================================================================================== helpers


def xla_hlo() -> Any:
    """jaxlib's private HLO bindings (XLA's HLO text parser); no public spelling exists."""
    return importlib.import_module("jaxlib._hlo")


def make_mesh(shape: tuple[int, ...], names: tuple[str, ...]) -> jax.sharding.Mesh:
    # jax 0.10's make_mesh defaults to Explicit axes (sharding in types); GSPMD/Shardy-style programs and
    # with_sharding_constraint want Auto axes.
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(names))
    ids = [d.id for d in mesh.devices.flat]
    assert ids == list(range(N_DEVICES)), f"mesh device order {ids} is not 0..7"
    return mesh


def mesh_dict(mesh: jax.sharding.Mesh) -> dict[str, int]:
    return {str(k): int(v) for k, v in mesh.shape.items()}


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def sds(args: Any, shardings: Any = None) -> Any:
    """ShapeDtypeStructs of a pytree of arrays (with matching NamedShardings when given)."""
    if shardings is None:
        return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), args)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), args, shardings)


def named(mesh: jax.sharding.Mesh, specs: Any) -> Any:
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def leaves_with_names(args: Sequence[Any], argnames: Sequence[str]) -> tuple[list[np.ndarray], list[str]]:
    arrays, names = [], []
    for arg, argname in zip(args, argnames, strict=True):
        for path, leaf in jax.tree_util.tree_flatten_with_path(arg)[0]:
            arrays.append(np.asarray(leaf))
            names.append(argname + jax.tree_util.keystr(path))
    return arrays, names


def to_numpy_list(out: Any) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(out)]


def bug_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The ``# BUG: <what>`` line inside ``fn``'s source: repo-relative file, 1-based line, what."""
    fn = inspect.unwrap(fn)
    lines, start = inspect.getsourcelines(fn)
    hits = [(start + i, ln) for i, ln in enumerate(lines) if "# BUG:" in ln]
    assert len(hits) == 1, f"{fn.__qualname__}: expected exactly one '# BUG:' line, found {len(hits)}"
    line, text = hits[0]
    path = Path(inspect.getsourcefile(fn) or "").resolve().relative_to(REPO).as_posix()
    return {"file": path, "line": line, "what": text.split("# BUG:", 1)[1].strip()}


def sanitize(text: str) -> str:
    """Repo-relative paths everywhere; fail loudly if any other machine path survives."""
    text = text.replace(str(REPO) + "/", "")
    bad = machine_paths(text)
    assert not bad, f"machine path(s) left in generated text: {bad}"
    return text


def machine_paths(text: str) -> list[str]:
    """The absolute paths and library frames in `text` (a few, sorted; none in a fixture)."""
    return sorted(set(ABSOLUTE_PATH.findall(text) + [LIBRARY_FRAME] * (LIBRARY_FRAME in text)))[:5]


def header(kind: str, description: str) -> str:
    assert kind in ("mlir", "hlo")
    return f"// generated by {GENERATOR} (jax {JAX_VERSION}): {description}\n"


def allclose(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and _close(x, y) for x, y in zip(a, b, strict=True))


def _close(x: np.ndarray, y: np.ndarray) -> bool:
    """Integers exactly (2**53 and 2**53 + 1 are close as floats), floats within the tolerances."""
    if np.asarray(x).dtype.kind in "iub" and np.asarray(y).dtype.kind in "iub":
        return bool(np.array_equal(x, y))
    return bool(np.allclose(x, y, rtol=RTOL, atol=ATOL))


def max_abs_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x.astype(np.float64) - y.astype(np.float64)))) for x, y in zip(a, b, strict=True))


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """np.savez_compressed, but byte-for-byte deterministic (fixed zip timestamps, sorted members)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in arrays:  # insertion order: in_*, before_out_*, after_out_*
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            arr_buf = io.BytesIO()
            arr = arrays[key]
            # np.ascontiguousarray turns a 0-d array into shape (1,). Inputs are fed back to the programs as
            # stored, so a 0-d input (an optimizer's step count) keeps its shape; 0-d outputs keep (1,).
            arr = np.asarray(arr) if arr.ndim == 0 and key.startswith("in_") else np.ascontiguousarray(arr)
            np.lib.format.write_array(arr_buf, arr, allow_pickle=False)
            zf.writestr(info, arr_buf.getvalue(), compresslevel=9)
    path.write_bytes(buf.getvalue())


# ------------------------------------------------------------------------------ XLA dumps and running HLO


def compile_with_spmd_dump(lowered: Any) -> tuple[Any, str]:
    """Compile ``lowered`` and return (compiled, the HLO text of its module after SPMD partitioning)."""
    d = tempfile.mkdtemp(prefix="scalify_dump_")
    try:
        compiled = lowered.compile(
            # every module: a module filter in XLA_FLAGS (the numeric tests set one) must not hide this one
            compiler_options={"xla_dump_to": d, "xla_dump_hlo_pass_re": "spmd-partitioning",
                              "xla_dump_hlo_module_re": ".*", "xla_dump_large_constants": True}
        )
        module_name = re.search(r"^module @(\S+)", lowered.as_text(), re.M)
        assert module_name, "no module name in the lowered text"
        pattern = os.path.join(d, f"*.{module_name.group(1)}.*after_spmd-partitioning*.txt")
        files = sorted(glob.glob(pattern))
        assert len(files) == 1, f"expected one after_spmd-partitioning dump for {module_name.group(1)}, got {files}"
        return compiled, Path(files[0]).read_text()
    finally:
        shutil.rmtree(d, ignore_errors=True)


_MESH_GROUPS_RE = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\((\[[\d,]+\](?:T\([\d,]+\))?|[\d,]+)\))?\s*\{([^}]*)\}"
)


def _device_ids(spelling: str | None, n: int) -> np.ndarray:
    """The flat device list of a mesh spelling's ``device_ids=(...)``: iota ``[2,4]T(1,0)`` or explicit."""
    if spelling is None:
        return np.arange(n)
    m = re.fullmatch(r"\[([\d,]+)\](?:T\(([\d,]+)\))?", spelling)
    if m is None:
        ids = np.array([int(v) for v in spelling.split(",")])
    else:
        dims = [int(v) for v in m.group(1).split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if m.group(2):
            ids = ids.transpose([int(v) for v in m.group(2).split(",")])
        ids = ids.ravel()
    assert sorted(ids.tolist()) == list(range(n)), f"device_ids {spelling} is not a permutation of 0..{n - 1}"
    return ids


def _explicit_mesh_groups(hlo_text: str) -> str:
    """Rewrite ``replica_groups=mesh['a'=2,'b'=4] {'b'}`` into explicit ``{{0,1,2,3},{4,5,6,7}}`` (also with
    ``, device_ids=([2,4]T(1,0))`` between the mesh and the axes: mesh coordinates index that device list).

    Needed only to *run* such modules: jax 0.10.2's HLO→StableHLO converter keeps them as
    ``#stablehlo.replica_group_mesh_axes<mesh = @mesh_k>`` with one ``sdy.mesh`` per distinct mesh, but when a
    module has two different meshes, compiling that StableHLO resolves every ``@mesh`` reference to the
    last mesh (wrong groups, wrong results). The committed fixtures keep XLA's own spelling."""

    def groups(m: re.Match[str]) -> str:
        axes = re.findall(r"'([^']+)'=(\d+)", m.group(1))
        assert ",".join(f"'{a}'={n}" for a, n in axes) == m.group(1).replace(" ", ""), m.group(0)
        names = [a for a, _ in axes]
        sizes = [int(n) for _, n in axes]
        picked = re.findall(r"'([^']+)'", m.group(3))
        assert picked and all(p in names for p in picked), f"unsupported mesh replica groups {m.group(0)}"
        ids = _device_ids(m.group(2), int(np.prod(sizes))).reshape(sizes)
        keep = [names.index(p) for p in picked]
        rest = [i for i in range(len(names)) if i not in keep]
        rows = ids.transpose(rest + keep).reshape(-1, int(np.prod([sizes[i] for i in keep])))
        return "replica_groups={" + ",".join("{" + ",".join(map(str, r)) + "}" for r in rows) + "}"

    out = _MESH_GROUPS_RE.sub(groups, hlo_text)
    left = re.search(r"replica_groups=mesh[^{]*\{[^}]*\}", out)
    assert left is None, f"unsupported mesh replica groups spelling: {left.group(0) if left else ''}"
    return out


def _manual_stablehlo(hlo_text: str) -> str:
    """HLO text of a partitioned (per-device) module → StableHLO whose entry params/results are {manual},
    so that XLA compiles it for 8 partitions without partitioning it again."""
    from jax._src.interpreters import mlir as jax_mlir
    from jax.extend.mlir import hlo_to_stablehlo, ir
    module = xla_hlo().hlo_module_from_text(_explicit_mesh_groups(hlo_text))
    mlir_bytes = hlo_to_stablehlo(module.as_serialized_hlo_module_proto())
    with jax_mlir.make_ir_context():
        mod = ir.Module.parse(mlir_bytes)
        mains = [op for op in mod.body.operations if ir.StringAttr(op.attributes["sym_name"]).value == "main"]
        assert len(mains) == 1
        main = mains[0]
        ftype = ir.FunctionType(ir.TypeAttr(main.attributes["function_type"]).value)
        manual = ir.DictAttr.get({"mhlo.sharding": ir.StringAttr.get("{manual}")})
        main.attributes["arg_attrs"] = ir.ArrayAttr.get([manual] * len(ftype.inputs))
        main.attributes["res_attrs"] = ir.ArrayAttr.get([manual] * len(ftype.results))
        i32 = ir.IntegerType.get_signless(32)
        mod.operation.attributes["mhlo.num_partitions"] = ir.IntegerAttr.get(i32, N_DEVICES)
        mod.operation.attributes["mhlo.num_replicas"] = ir.IntegerAttr.get(i32, 1)
        return str(mod)


def run_partitioned_hlo(hlo_text: str, inputs: Sequence[np.ndarray], in_shardings: Sequence[Any],
                        out_shardings: Sequence[Any], out_shapes: Sequence[tuple[int, ...]]) -> list[np.ndarray]:
    """Run a per-device (after SPMD partitioning) HLO module on the 8 fake devices; gather the outputs."""
    from jax._src.lib import xla_client as xc

    options = xc.CompileOptions()
    build = options.executable_build_options
    build.num_partitions = N_DEVICES
    build.num_replicas = 1
    build.use_spmd_partitioning = True
    build.device_assignment = xc.DeviceAssignment.create(np.arange(N_DEVICES).reshape(1, N_DEVICES))
    devices = jax.devices()[:N_DEVICES]
    client = devices[0].client
    exe = client.compile_and_load(_manual_stablehlo(hlo_text), xc.DeviceList(tuple(devices)), options)
    args = [jax.device_put(x, s) for x, s in zip(inputs, in_shardings, strict=True)]
    results = exe.execute_sharded(args).disassemble_into_single_device_arrays()
    outs = []
    for shards, sharding, shape in zip(results, out_shardings, out_shapes, strict=True):
        outs.append(np.asarray(jax.make_array_from_single_device_arrays(tuple(shape), sharding, shards)))
    return outs


# ------------------------------------------------------------------------------- HLO text inspection


_INSTR_RE = re.compile(r"^\s*(?:ROOT\s+)?(%[\w.\-]+)\s*=\s*(.*)$")


def hlo_instruction_line(text: str, name: str) -> tuple[int, str]:
    lines = text.split("\n")
    hits = [(i, ln) for i, ln in enumerate(lines) if (m := _INSTR_RE.match(ln)) and m.group(1) == name]
    assert len(hits) == 1, f"instruction {name}: {len(hits)} definitions"
    return hits[0]


def hlo_source_of(text: str, name: str) -> tuple[str, int, str] | None:
    """(file, line, function) of an instruction's metadata (innermost stack frame or source_file/line)."""
    _, line = hlo_instruction_line(text, name)
    md = re.search(r"metadata=\{([^}]*)\}", line)
    if not md:
        return None
    meta = md.group(1)
    sf = re.search(r'source_file="([^"]*)"\s+source_line=(\d+)', meta)
    if sf:
        return sf.group(1), int(sf.group(2)), ""
    fid = re.search(r"stack_frame_id=(\d+)", meta)
    if not fid:
        return None

    def section(title: str) -> str:
        m = re.search(rf"^{title}\n(.*?)(?:\n\n|\Z)", text, re.S | re.M)
        assert m, f"no {title} section"
        return m.group(1)

    files = dict(re.findall(r'^(\d+) "([^"]*)"', section("FileNames"), re.M))
    funcs = dict(re.findall(r'^(\d+) "([^"]*)"', section("FunctionNames"), re.M))
    locs = {
        k: (f, fn, int(ln))
        for k, f, fn, ln in re.findall(
            r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", section("FileLocations"), re.M
        )
    }
    frames = dict(re.findall(r"^(\d+) \{file_location_id=(\d+)", section("StackFrames"), re.M))
    f, fn, ln = locs[frames[fid.group(1)]]
    return files[f], ln, funcs[fn]


def hlo_users(text: str, name: str) -> list[str]:
    users = []
    for ln in text.split("\n"):
        m = _INSTR_RE.match(ln)
        if m and m.group(1) != name and re.search(re.escape(name) + r"(?![\w.\-])", m.group(2)):
            users.append(m.group(1))
    return users


def hlo_instructions(text: str, opcode: str) -> list[str]:
    out = []
    for ln in text.split("\n"):
        m = _INSTR_RE.match(ln)
        if m and re.match(r"\S+(?:\{[^}]*\})?\s+" + re.escape(opcode) + r"\(", m.group(2)):
            out.append(m.group(1))
    return out


def sole_instruction(text: str, opcode: str, pattern: str, what: str) -> tuple[str, int, str]:
    """(name, line index, line) of the one `opcode` instruction whose line matches `pattern`."""
    hits = [n for n in hlo_instructions(text, opcode) if re.search(pattern, hlo_instruction_line(text, n)[1])]
    assert len(hits) == 1, f"expected one {what}, got {hits}"
    return (hits[0], *hlo_instruction_line(text, hits[0]))


def replace_line(text: str, index: int, new_line: str) -> str:
    lines = text.split("\n")
    lines[index] = new_line
    return "\n".join(lines)


# =============================================================================================== fixtures


@dataclasses.dataclass
class Built:
    name: str
    description: str
    verdict: str
    after_kind: str  # spmd_hlo | compiled_hlo | shard_map_mlir | gspmd_shard_map_mlir | mutated_hlo
    mesh: dict[str, int]
    before_text: str
    after_text: str
    inputs: list[np.ndarray]
    input_names: list[str]
    before_out: list[np.ndarray]
    after_out: list[np.ndarray] | None
    bug: dict[str, Any] | None = None
    # inputs promised to lie in a half-open range (token ids), verified with --assume NAME=LO:HI
    assume: dict[str, list[int]] | None = None
    # verified with --excess-precision (roundings to bf16 that XLA's compiled code drops are no difference)
    excess_precision: bool = False
    # for mutations of a partitioned module
    in_shardings: list[Any] | None = None
    out_shardings: list[Any] | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def after_file(self) -> str:
        return "after.mlir" if self.after_kind in ("shard_map_mlir", "gspmd_shard_map_mlir") else "after.hlo"


REGISTRY: dict[str, tuple[str, Callable[[str], Built]]] = {}
_BUILT: dict[str, Built] = {}


def fixture(name: str, description: str) -> Callable[[Callable[[str], Built]], Callable[[str], Built]]:
    def register(fn: Callable[[str], Built]) -> Callable[[str], Built]:
        assert name not in REGISTRY
        REGISTRY[name] = (description, fn)
        return fn

    return register


def build(name: str) -> Built:
    if name not in _BUILT:
        _BUILT[name] = REGISTRY[name][1](name)
    return _BUILT[name]


def description_of(name: str) -> str:
    return REGISTRY[name][0]


# ------------------------------------------------------------------------------------ partitioned pairs


def partitioned_pair(name: str, fn: Callable[..., Any], mesh: jax.sharding.Mesh, args: Sequence[Any],
                     argnames: Sequence[str], in_specs: Sequence[Any], out_specs: Any, *,
                     shardy: bool = True, compiled_text: bool = False, keep_unused: bool = False) -> Built:
    """before = jit(fn, shardings).lower(); after = the module after SPMD partitioning (or compiled).
    ``keep_unused``: keep inputs the program never reads (optax.adafactor's placeholder moments) as parameters
    of both modules, so that they line up with the oracle's inputs."""
    previous = jax.config.jax_use_shardy_partitioner  # type: ignore[attr-defined]
    jax.config.update("jax_use_shardy_partitioner", shardy)
    try:
        in_sh = tuple(named(mesh, s) for s in in_specs)
        out_sh = named(mesh, out_specs)
        jitted = jax.jit(fn, in_shardings=in_sh, out_shardings=out_sh, keep_unused=keep_unused)
        lowered = jitted.lower(*sds(args))
        before_text = lowered.as_text(debug_info=True)
        compiled, spmd_text = compile_with_spmd_dump(lowered)
        after_text = compiled.as_text() if compiled_text else spmd_text
        inputs, input_names = leaves_with_names(args, argnames)
        before_out = to_numpy_list(jax.jit(fn)(*args))  # the single-device reference, unsharded
        after_out = to_numpy_list(compiled(*args))
        flat_in = list(jax.tree.leaves(compiled.input_shardings[0]))
        flat_out = list(jax.tree.leaves(compiled.output_shardings))
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)
    if shardy:
        assert "sdy.sharding" in before_text and "sdy.mesh" in before_text
    else:
        assert "mhlo.sharding" in before_text and "sdy." not in before_text
    # The dumped text is the program XLA ran: run it ourselves and compare (validates the HLO runner that
    # checks the mutations below).
    rerun = run_partitioned_hlo(spmd_text, inputs, flat_in, flat_out, [o.shape for o in after_out])
    assert allclose(rerun, after_out), f"{name}: re-running the dumped partitioned HLO disagrees with XLA"
    return Built(
        name=name, description=description_of(name), verdict="equivalent",
        after_kind="compiled_hlo" if compiled_text else "spmd_hlo", mesh=mesh_dict(mesh),
        before_text=before_text, after_text=after_text, inputs=inputs, input_names=input_names,
        before_out=before_out, after_out=after_out, in_shardings=flat_in, out_shardings=flat_out,
    )


def megatron_args(name: str) -> list[np.ndarray]:
    return megatron.init(megatron.TINY, rng_for("megatron_mlp"))


@fixture("megatron_mlp_shardy", "Megatron MLP relu(x@w1)@w2, x P(dp,None), w1 P(None,tp), w2 P(tp,None); "
         "jit with Shardy shardings vs the module after SPMD partitioning")
def _megatron_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = megatron.specs()
    return partitioned_pair(name, megatron.mlp, mesh, megatron_args(name), ["x", "w1", "w2"], in_specs, out_spec)


@fixture("megatron_mlp_gspmd", "Megatron MLP with jax_use_shardy_partitioner=False (mhlo.sharding "
         "annotations) vs the module after GSPMD partitioning")
def _megatron_gspmd(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = megatron.specs()
    return partitioned_pair(name, megatron.mlp, mesh, megatron_args(name), ["x", "w1", "w2"], in_specs, out_spec,
                            shardy=False)


@fixture("megatron_mlp_compiled", "Megatron MLP (Shardy) vs the fully optimised per-device HLO "
         "(compiled.as_text(): fusions, scheduled)")
def _megatron_compiled(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = megatron.specs()
    return partitioned_pair(name, megatron.mlp, mesh, megatron_args(name), ["x", "w1", "w2"], in_specs, out_spec,
                            compiled_text=True)


@fixture("megatron_mlp_bf16_compiled", "Megatron MLP in bfloat16 (Shardy) vs compiled.as_text(): XLA CPU computes "
         "every bf16 op in f32 and rounds back (float normalization), the tp all-reduce promoted to f32")
def _megatron_bf16_compiled(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = megatron.specs()
    # Quarters: every partial and total sum is exact in f32, so XLA's result does not depend on the order the
    # devices add in (the oracle compares with the single-device run to f32 tolerances).
    args = [(np.round(a * 4) / 4).astype(np.float32) for a in megatron_args(name)]
    built = partitioned_pair(name, megatron.mlp_bf16, mesh, args, ["x", "w1", "w2"], in_specs, out_spec,
                             compiled_text=True)
    assert "convert(" in built.after_text and "bf16" in built.after_text, f"{name}: no bf16 round trips to read"
    return built


def _rms_norm_batch_compiled(specs: tuple[P, P], dtype: Any = None) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("fsdp", "tp"))
        rng = rng_for(name)
        x = rng.standard_normal((2, 16, 32)).astype(np.float32)
        scale = (1 + 0.1 * rng.standard_normal(32)).astype(np.float32)
        norm = functools.partial(llama.rms_norm, eps=1e-6)
        if dtype is not None:  # computed in `dtype` from float32 inputs, the result widened back
            def norm(x: Any, scale: Any) -> Any:
                return llama.rms_norm(x.astype(dtype), scale.astype(dtype), 1e-6).astype(np.float32)
        built = partitioned_pair(name, norm, mesh, [x, scale], ["x", "scale"], list(specs), specs[0],
                                 compiled_text=True)
        assert re.search(r"f32\[16\]\{0\} bitcast\(", built.after_text), f"{name}: XLA no longer bitcasts the row statistic"
        return built

    return fn


def _rms_norm_bf16_compiled(name: str) -> Built:
    built = _rms_norm_batch_compiled((P("fsdp", None, "tp"), P("tp")), jax.numpy.bfloat16)(name)
    return dataclasses.replace(built, excess_precision=True)


fixture("rmsnorm_bf16_excess_precision_compiled", "Llama's RMSNorm in bfloat16 (batch on fsdp, hidden on tp) vs "
        "compiled.as_text(), verified with --excess-precision: XLA computes x * x in f32 and sums it without the "
        "rounding to bf16 the reference has (xla_allow_excess_precision)")(_rms_norm_bf16_compiled)
fixture("rmsnorm_batch_fsdp_compiled", "Llama's RMSNorm over a batch split on fsdp (one row per device) vs "
        "compiled.as_text(): XLA bitcasts the per-row statistic [1, s] to [s], read as a block of the "
        "flattened [b * s], and multiplies it into the rows")(_rms_norm_batch_compiled((P("fsdp"), P())))
fixture("rmsnorm_batch_fsdp_tp_compiled", "the same with the hidden dim split on tp as well (x and scale): the "
        "statistic meets rows split over two axes")(_rms_norm_batch_compiled((P("fsdp", None, "tp"), P("tp"))))


def llama_block_args(name: str) -> tuple[list[Any], Any]:
    rng = rng_for("llama_block")
    cfg = llama.TINY
    x = llama.init_activations(cfg, rng)
    p = llama.init_layer(cfg, rng)
    return [x, p], cfg


@fixture("llama_block_shardy", "Llama block (RMSNorm, RoPE, GQA causal attention, SwiGLU) FSDPxTP "
         "(MaxText-style specs), Shardy, vs the module after SPMD partitioning")
def _llama_block_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    args, cfg = llama_block_args(name)
    act = llama.activation_spec()
    return partitioned_pair(name, functools.partial(llama.block, cfg=cfg), mesh, args, ["x", "p"],
                            [act, llama.layer_specs()], act)


@fixture("llama_block_gspmd", "Llama block FSDPxTP with jax_use_shardy_partitioner=False (mhlo.sharding) "
         "vs the module after GSPMD partitioning")
def _llama_block_gspmd(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    args, cfg = llama_block_args(name)
    act = llama.activation_spec()
    return partitioned_pair(name, functools.partial(llama.block, cfg=cfg), mesh, args, ["x", "p"],
                            [act, llama.layer_specs()], act, shardy=False)


@fixture("llama_scan_shardy", "2 Llama blocks under lax.scan over layer-stacked params, FSDPxTP, Shardy, "
         "vs the module after SPMD partitioning (a while loop)")
def _llama_scan_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    rng = rng_for(name)
    cfg = llama.TINY
    x = llama.init_activations(cfg, rng)
    stacked = llama.init_stacked(cfg, rng)
    act = llama.activation_spec()
    return partitioned_pair(name, functools.partial(llama.blocks_scan, cfg=cfg), mesh, [x, stacked],
                            ["x", "stacked"], [act, llama.stacked_specs()], act)


@fixture("llama_sp_shardy", "Llama block with sequence parallelism (residual stream seq-sharded over tp, "
         "q/k/v head-sharded), Shardy: partition-id indexed shard-offset tables in the partitioned HLO")
def _llama_sp_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    args, cfg = llama_block_args(name)
    act = llama.activation_spec(seq="tp")
    constrain = llama.sequence_parallel_constraint(mesh)
    built = partitioned_pair(name, functools.partial(llama.block, cfg=cfg, constrain=constrain), mesh, args,
                             ["x", "p"], [act, llama.layer_specs()], act)
    assert "partition-id()" in built.after_text and "dynamic-slice(" in built.after_text, \
        "sequence-parallel block: no partition-id / dynamic-slice in the partitioned HLO"
    return built


# ----------------------------------------------------------------------------------------- shard_map pairs


def shard_map_pair(name: str, ref: Callable[..., Any], impl: Callable[..., Any], mesh: jax.sharding.Mesh,
                   args: Sequence[Any], argnames: Sequence[str], in_specs: Sequence[Any],
                   bug_fn: Callable[..., Any] | None, *, lower_sharded: bool = True) -> Built:
    """before = jit(ref) lowered without shardings; after = jit(shard_map impl) lowered on sharded inputs
    (`lower_sharded=False`: on unsharded ones, as a user often lowers it — JAX then lays scalars out on an
    `@empty_mesh` of its own)."""
    in_sh = tuple(named(mesh, s) for s in in_specs)
    before_text = jax.jit(ref).lower(*sds(args)).as_text(debug_info=True)
    after_text = jax.jit(impl).lower(*(sds(tuple(args), in_sh) if lower_sharded else sds(args))).as_text(
        debug_info=True)
    assert "sdy.manual_computation" in after_text, f"{name}: no sdy.manual_computation in the shard_map lowering"
    inputs, input_names = leaves_with_names(args, argnames)
    before_out = to_numpy_list(jax.jit(ref)(*args))
    placed = [jax.device_put(a, s) for a, s in zip(args, in_sh, strict=True)]
    after_out = to_numpy_list(jax.jit(impl)(*placed))
    bug = bug_of(bug_fn) if bug_fn is not None else None
    return Built(
        name=name, description=description_of(name), verdict="discrepancy" if bug else "equivalent",
        after_kind="shard_map_mlir", mesh=mesh_dict(mesh), before_text=before_text, after_text=after_text,
        inputs=inputs, input_names=input_names, before_out=before_out, after_out=after_out, bug=bug,
    )


def _megatron_shard_map(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = megatron.specs()
        return shard_map_pair(name, megatron.mlp, megatron.shard_map_mlp(mesh, variant), mesh, megatron_args(name),
                              ["x", "w1", "w2"], in_specs,
                              None if variant == "correct" else megatron.VARIANTS[variant])

    return fn


fixture("megatron_mlp_shard_map", "Megatron MLP hand-parallel with shard_map: column/row-parallel matmuls, "
        "psum over tp (correct)")(_megatron_shard_map("correct"))
fixture("megatron_mlp_shard_map_missing_psum", "Megatron MLP shard_map without the psum after the "
        "row-parallel matmul")(_megatron_shard_map("missing_psum"))
fixture("megatron_mlp_shard_map_psum_wrong_axis", "Megatron MLP shard_map with the psum over dp instead "
        "of tp")(_megatron_shard_map("psum_wrong_axis"))
fixture("megatron_mlp_shard_map_pmean", "Megatron MLP shard_map with pmean over tp where psum "
        "belongs")(_megatron_shard_map("pmean"))


def _rmsnorm(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        d = 32
        args = rmsnorm.init(8, d, rng_for("rmsnorm"))
        in_specs, _ = rmsnorm.specs()
        return shard_map_pair(name, rmsnorm.reference, rmsnorm.shard_map_rmsnorm(mesh, d, variant), mesh, args,
                              ["x", "scale"], in_specs,
                              None if variant == "correct" else rmsnorm.VARIANTS[variant])

    return fn


fixture("rmsnorm_shard_map", "RMSNorm with the hidden dim sharded over tp: psum of the local sum of "
        "squares, divided by the global d (correct)")(_rmsnorm("correct"))
fixture("rmsnorm_shard_map_local_stats", "RMSNorm with the hidden dim sharded over tp, statistics over the "
        "local shard only")(_rmsnorm("local_stats"))


def _rope(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "sp"))
        args = rope_sp.init(2, 16, 4, 8, rng_for("rope_sp"))
        in_specs, _ = rope_sp.specs()
        return shard_map_pair(name, rope_sp.reference, rope_sp.shard_map_rope(mesh, variant), mesh, args, ["x"],
                              in_specs, None if variant == "correct" else rope_sp.VARIANTS[variant])

    return fn


fixture("rope_sp_shard_map", "RoPE under sequence parallelism (seq over sp): positions = arange(s_local) "
        "+ axis_index(sp) * s_local (correct)")(_rope("correct"))
fixture("rope_sp_shard_map_no_offset", "RoPE under sequence parallelism with positions missing the shard "
        "offset")(_rope("no_offset"))


def _loss(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        args = loss_dp.init(8, 16, 10, rng_for("loss_dp"))
        in_specs, _ = loss_dp.specs()
        return shard_map_pair(name, loss_dp.reference, loss_dp.shard_map_loss(mesh, variant), mesh, args,
                              ["x", "w", "labels"], in_specs,
                              None if variant == "correct" else loss_dp.VARIANTS[variant])

    return fn


fixture("loss_dp_shard_map", "data-parallel softmax cross-entropy (int32 labels), batch over dp: pmean of "
        "per-shard means (correct)")(_loss("correct"))
fixture("loss_dp_shard_map_no_pmean", "data-parallel cross-entropy returning the per-shard mean without "
        "pmean (out_specs P(), check_vma=False)")(_loss("no_pmean"))


def _softmax(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        args = vocab_softmax.init(8, 32, rng_for("vocab_softmax"))
        in_specs, _ = vocab_softmax.specs()
        return shard_map_pair(name, vocab_softmax.reference, vocab_softmax.shard_map_softmax(mesh, variant), mesh,
                              args, ["logits"], in_specs,
                              None if variant == "correct" else vocab_softmax.VARIANTS[variant])

    return fn


fixture("vocab_softmax_shard_map", "vocab-parallel softmax (vocab over tp): pmax of the max, psum of the "
        "sum (correct)")(_softmax("correct"))
fixture("vocab_softmax_shard_map_local", "vocab-parallel softmax normalised by the local sum "
        "only")(_softmax("local"))


@fixture("llama_block_shard_map", "Llama block hand-parallel with shard_map: heads and FFN over tp, psum "
         "after attention-out and FFN-down, batch over dp (correct)")
def _llama_block_shard_map(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    args, cfg = llama_block_args(name)
    return shard_map_pair(name, functools.partial(llama.block, cfg=cfg), llama.shard_map_block_tp(mesh, cfg), mesh,
                          args, ["x", "p"], [P("dp", None, None), llama.tp_block_specs()], None)


# ------------------------------------------------------------------------------------------- mutations


def mutated(name: str, base_name: str, new_text: str, instruction: str, what: str,
            source_instruction: str | None = None) -> Built:
    """A discrepancy fixture: ``base``'s before, a text-mutated copy of its after.hlo.

    The expected bug line is the source line in the metadata of the mutated instruction (or, when XLA gave
    it none, e.g. constants, of ``source_instruction``: its nearest user that has one)."""
    base = build(base_name)
    assert base.after_kind == "spmd_hlo" and base.in_shardings is not None and base.out_shardings is not None
    assert new_text != base.after_text
    xla_hlo().hlo_module_from_text(new_text)  # must still parse
    src = hlo_source_of(new_text, source_instruction or instruction)
    assert src is not None, f"{name}: no source metadata on {source_instruction or instruction}"
    file, line, _func = src
    rel = Path(file).resolve().relative_to(REPO).as_posix() if file.startswith("/") else file
    assert rel.startswith("tools/programs/"), f"{name}: mutated instruction's source is {rel}"
    out = run_partitioned_hlo(new_text, base.inputs, base.in_shardings, base.out_shardings,
                              [o.shape for o in base.before_out])
    assert not allclose(out, base.before_out), f"{name}: the mutation does not change the result"
    bug = {"file": rel, "line": line, "what": what, "instruction": instruction}
    if source_instruction:
        bug["source_instruction"] = source_instruction
    return Built(
        name=name, description=description_of(name), verdict="discrepancy", after_kind="mutated_hlo",
        mesh=base.mesh, before_text=base.before_text, after_text=new_text, inputs=base.inputs,
        input_names=base.input_names, before_out=base.before_out, after_out=out, bug=bug,
        notes=[f"mutation of {base_name}/after.hlo; max |after-before| = {max_abs_diff(out, base.before_out):.3g}"],
    )


@fixture("mut_replica_groups_swapped", "megatron_mlp_shardy after.hlo with the all-reduce over tp groups "
         "{{0,1,2,3},{4,5,6,7}} changed to the dp groups {{0,4},{1,5},{2,6},{3,7}}")
def _mut_replica_groups(name: str) -> Built:
    base = build("megatron_mlp_shardy")
    text = base.after_text
    devices = np.arange(N_DEVICES).reshape(2, 4)

    def groups(rows: np.ndarray) -> str:
        return "{" + ",".join("{" + ",".join(str(int(d)) for d in row) + "}" for row in rows) + "}"

    tp_groups, dp_groups = groups(devices), groups(devices.T)
    target, idx, line = sole_instruction(text, "all-reduce", re.escape(f"replica_groups={tp_groups}"),
                                         f"all-reduce over {tp_groups}")
    new = replace_line(text, idx, line.replace(f"replica_groups={tp_groups}", f"replica_groups={dp_groups}"))
    return mutated(name, "megatron_mlp_shardy", new, target,
                   f"all-reduce {target}: replica_groups {tp_groups} (tp) swapped for {dp_groups} (dp)")


@fixture("mut_allreduce_reducer", "llama_block_shardy after.hlo with the FFN-down all-reduce's reducer "
         "changed from add to maximum (its to_apply computation cloned if shared)")
def _mut_allreduce_reducer(name: str) -> Built:
    base = build("llama_block_shardy")
    text = base.after_text
    reducers = [n for n in hlo_instructions(text, "all-reduce")
                if (src := hlo_source_of(text, n)) and src[2] == "ffn"]
    assert len(reducers) == 1, f"expected one all-reduce from ffn, got {reducers}"
    target = reducers[0]
    idx, line = hlo_instruction_line(text, target)
    comp = re.search(r"to_apply=(%[\w.\-]+)", line)
    assert comp
    comp_name = comp.group(1)
    # the computation's body
    m = re.search(rf"^{re.escape(comp_name)} \(.*?^\}}\n", text, re.S | re.M)
    assert m, f"computation {comp_name} not found"
    body = m.group(0)
    assert len(re.findall(r"ROOT %[\w.\-]+ = \S+ add\(", body)) == 1, f"{comp_name} is not a plain add"
    uses = len(re.findall(rf"(?:to_apply|calls|condition|body|branch_computations|called_computations)="
                          rf"\{{?(?:%[\w.\-]+, )*{re.escape(comp_name)}(?![\w.\-])", text))
    new_body = re.sub(r"(ROOT %[\w.\-]+ = \S+ )add\(", r"\1maximum(", body)
    if uses > 1:
        clone = comp_name + ".max"
        new_body = new_body.replace(comp_name + " (", clone + " (", 1)
        new = text.replace(body, body + "\n" + new_body, 1)
        idx, line = hlo_instruction_line(new, target)
        new = replace_line(new, idx, line.replace(f"to_apply={comp_name}", f"to_apply={clone}"))
    else:
        new = text.replace(body, new_body, 1)
    return mutated(name, "llama_block_shardy", new, target,
                   f"all-reduce {target} (FFN-down partial sums over tp): reducer add changed to maximum")


@fixture("mut_offset_table_permuted", "llama_sp_shardy after.hlo with the partition-id indexed shard-offset "
         "table of the RoPE positions (iota over the seq-sharded dim) permuted")
def _mut_offset_table(name: str) -> Built:
    base = build("llama_sp_shardy")
    text = base.after_text
    tables = []
    for n in hlo_instructions(text, "constant"):
        idx, line = hlo_instruction_line(text, n)
        if not re.search(r"= [su]32\[8\]\{0\} constant\(\{", line):
            continue
        users = hlo_users(text, n)
        if not any("partition-id" in hlo_instruction_line(text, u)[1] for u in users):
            continue
        src = hlo_source_of(text, n)
        if src and src[2] == "attention" and '/iota"' in line:
            tables.append(n)
    assert len(tables) == 1, f"expected one partition-id indexed iota offset table in attention, got {tables}"
    target = tables[0]
    idx, line = hlo_instruction_line(text, target)
    m = re.search(r"constant\(\{([^}]*)\}\)", line)
    assert m
    values = [int(v) for v in m.group(1).split(",")]
    assert values == [0, 1, 2, 3, 0, 1, 2, 3], f"unexpected offset table {values}"
    permuted = [values[(i + 1) % 4 + 4 * (i // 4)] for i in range(8)]  # rotate within each tp group
    new_line = line.replace(m.group(0), "constant({" + ", ".join(map(str, permuted)) + "})")
    new = replace_line(text, idx, new_line)
    return mutated(name, "llama_sp_shardy", new, target,
                   f"shard-offset table {target} (tp shard index per partition-id, scales the RoPE positions) "
                   f"permuted {values} -> {permuted}")


@fixture("mut_subtract_swapped", "llama_block_shardy after.hlo with the operands of the RoPE subtract "
         "(x1*cos - x2*sin of q) swapped")
def _mut_subtract_swapped(name: str) -> Built:
    base = build("llama_block_shardy")
    text = base.after_text
    subs = [n for n in hlo_instructions(text, "subtract") if (src := hlo_source_of(text, n)) and src[2] == "rope"]
    assert subs, "no subtract from rope"
    target = subs[0]
    idx, line = hlo_instruction_line(text, target)
    m = re.search(r"subtract\((%[\w.\-]+), (%[\w.\-]+)\)", line)
    assert m
    new = replace_line(text, idx, line.replace(m.group(0), f"subtract({m.group(2)}, {m.group(1)})"))
    return mutated(name, "llama_block_shardy", new, target,
                   f"subtract {target} (RoPE x1*cos - x2*sin): operands swapped")


@fixture("mut_constant_changed", "llama_block_shardy after.hlo with the 1/d constant of the first "
         "RMSNorm's mean (d_model) halved, for that RMSNorm only")
def _mut_constant_changed(name: str) -> Built:
    base = build("llama_block_shardy")
    text = base.after_text
    d = float(llama.TINY.d_model)
    const = sole_instruction(text, "constant", rf"= f32\[\] constant\({d:g}\)", f"f32[] constant({d:g})")[0]

    # Walk users (through metadata-less broadcasts) to the first divide in rms_norm.
    def first_divide(n: str) -> tuple[str, str] | None:
        for u in hlo_users(text, n):
            line = hlo_instruction_line(text, u)[1]
            if " divide(" in line and (src := hlo_source_of(text, u)) and src[2] == "rms_norm":
                return n, u
            if " broadcast(" in line:
                hit = first_divide(u)
                if hit:
                    return hit
        return None

    hit = first_divide(const)
    assert hit, "no rms_norm divide fed by the d constant"
    fed, divide = hit
    cidx, cline = hlo_instruction_line(text, const)
    new_const = const + ".mutated"
    clone_line = cline.replace(const + " =", new_const + " =", 1).replace(f"constant({d:g})", f"constant({d / 2:g})")
    if fed == const:
        didx, dline = hlo_instruction_line(text, divide)
        new = replace_line(text, didx, dline.replace(const, new_const))
        new = replace_line(new, cidx, cline + "\n" + clone_line)
        instruction = new_const
    else:
        # const -> broadcast (fed) -> divide: clone the broadcast too, so only this RMSNorm changes
        bidx, bline = hlo_instruction_line(text, fed)
        new_b = fed + ".mutated"
        b_clone = bline.replace(fed + " =", new_b + " =", 1).replace(f"({const})", f"({new_const})")
        didx, dline = hlo_instruction_line(text, divide)
        new = replace_line(text, didx, re.sub(re.escape(fed) + r"(?![\w.\-])", new_b, dline))
        new = replace_line(new, bidx, bline + "\n" + b_clone)
        cidx, cline = hlo_instruction_line(new, const)
        new = replace_line(new, cidx, cline + "\n" + clone_line)
        instruction = new_const
    return mutated(name, "llama_block_shardy", new, instruction,
                   f"constant {const} (d_model = {d:g}, the divisor of RMSNorm's mean of squares) changed to "
                   f"{d / 2:g} for the first RMSNorm (XLA gives constants no source metadata: line of {divide})",
                   source_instruction=divide)


# ------------------------------------------------------------------------------------------ training steps


def train_regression_args(name: str) -> list[Any]:
    return train.init_regression(train.TINY, rng_for("train_regression"))


@fixture("train_sgd_shardy", "SGD training step of a small MLP (value_and_grad of MSE, p - lr*g) returning "
         "(loss, new params); FSDPxTP params (w1 P(fsdp,tp), b1 P(tp), w2 P(tp,fsdp)), batch over fsdp, Shardy, "
         "vs the module after SPMD partitioning")
def _train_sgd_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    in_specs, out_specs = train.sgd_specs()
    return partitioned_pair(name, train.sgd_step, mesh, train_regression_args(name), ["params", "x", "y"],
                            in_specs, out_specs)


@fixture("rmsnorm_square_shardy", "RMSNorm written with jnp.square (chlo.square) over a hidden dim split on "
         "tp, batch on dp, Shardy, vs the module after SPMD partitioning (square expanded to a multiply)")
def _rmsnorm_square(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    rng = rng_for(name)
    args = [rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16,)).astype(np.float32)]
    in_specs, out_spec = norms.specs()
    return partitioned_pair(name, norms.rms_norm_square, mesh, args, ["x", "scale"], in_specs, out_spec)


@fixture("llama_train_adamw_fsdp_tp_shardy", "Llama block training step: value_and_grad of a mean-square loss "
         "through one decoder block, optax AdamW (weight decay) with the moments sharded like the params (FSDP x TP, "
         "MaxText specs), Shardy, vs the module after SPMD partitioning (weight gradients all-reduced over fsdp, "
         "then the device's FSDP shard taken by a dynamic-slice with offsets from a table)")
def _llama_train_adamw(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    args = llama_train.init(rng_for(name))
    in_specs, out_specs = llama_train.specs(args)
    return partitioned_pair(name, llama_train.train_step, mesh, args, ["params", "opt_state", "x"], in_specs,
                            out_specs)


@fixture("llama_train_scan_shardy", "training step of 2 single-head causal attention blocks under lax.scan over "
         "layer-stacked weights (q/k/v/o over fsdp x tp, batch over fsdp), SGD, Shardy, vs the module after SPMD "
         "partitioning (the forward loop stacks batch-split residuals into buffers of zeros, the backward loop each "
         "layer's weight gradients, all-reduced over fsdp)")
def _llama_train_scan(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    in_specs, out_specs = llama_train.scanned_specs()
    return partitioned_pair(name, llama_train.scan_train_step, mesh, llama_train.init_scanned(rng_for(name)),
                            ["params", "x"], in_specs, out_specs)


def _allreduces_at(text: str, groups: str, fn: Callable[..., Any], marker: str) -> list[str]:
    """The all-reduces over `groups` whose source line is the line of `fn` holding `marker`."""
    lines, first = inspect.getsourcelines(fn)
    line = next(i for i, ln in enumerate(lines, first) if marker in ln)
    return [n for n in hlo_instructions(text, "all-reduce")
            if f"replica_groups={groups}," in hlo_instruction_line(text, n)[1]
            and (src := hlo_source_of(text, n)) is not None and src[1] == line]


@fixture("mut_llama_train_scan_wo_grad_allreduce_wrong_axis", "llama_train_scan_shardy after.hlo with the all-reduce "
         "of the wo weight gradient inside the backward loop (partial sums over the fsdp-split batch) moved from "
         "the fsdp groups to the tp groups")
def _mut_llama_train_scan_wo_grad(name: str) -> Built:
    base = "llama_train_scan_shardy"
    text = build(base).after_text
    old, new = "[4,2]<=[2,4]T(1,0)", "[2,4]<=[8]"  # the fsdp groups, the tp groups
    targets = _allreduces_at(text, old, llama_train.scan_block, 'p["wo"]')
    assert len(targets) == 1, f"{name}: expected one all-reduce over fsdp from the wo line, got {targets}"
    idx, line = hlo_instruction_line(text, targets[0])
    new_text = replace_line(text, idx, line.replace(f"replica_groups={old},", f"replica_groups={new},"))
    return mutated(name, base, new_text, targets[0], f"all-reduce {targets[0]} (the wo weight gradient summed "
                   f"over fsdp, in the backward loop): replica_groups {old} changed to {new}")


@fixture("train_adam_shardy", "Adam training step (bias-corrected, int32 step count) of a small MLP with "
         "softmax cross-entropy (int32 labels) returning (loss, new params, new m/v/count); FSDPxTP params and "
         "moments, batch over fsdp, Shardy, vs the module after SPMD partitioning")
def _train_adam_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    in_specs, out_specs = train.adam_specs()
    args = train.init_classification_adam(train.TINY, rng_for(name))
    return partitioned_pair(name, train.adam_step, mesh, args, ["params", "opt_state", "x", "labels"],
                            in_specs, out_specs)


def _train_dp(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        in_specs, _ = train.dp_specs()
        return shard_map_pair(name, train.sgd_step, train.shard_map_dp_sgd(mesh, variant), mesh,
                              train_regression_args(name), ["params", "x", "y"], in_specs,
                              None if variant == "correct" else train.DP_BUG_SITES[variant])

    return fn


fixture("train_sgd_shard_map", "data-parallel SGD step in shard_map (params replicated, batch over dp of a "
        "4x2 dp x tp mesh): local loss = sum of per-example losses / global batch, value_and_grad, psum of "
        "grads and loss over dp (correct)")(_train_dp("correct"))
fixture("train_sgd_shard_map_no_grad_psum", "data-parallel SGD step applying the local gradients without "
        "the psum over dp")(_train_dp("no_grad_psum"))
fixture("train_sgd_shard_map_grad_psum_wrong_axis", "data-parallel SGD step with the gradient psum over tp "
        "(params replicated there) instead of dp")(_train_dp("grad_psum_wrong_axis"))
fixture("train_sgd_shard_map_grad_averaged_twice", "data-parallel SGD step whose loss is already divided by "
        "the global batch, with the gradients pmean'd over dp (divided by |dp| twice)")(_train_dp("grad_averaged_twice"))
fixture("train_sgd_shard_map_loss_local_batch", "data-parallel SGD step whose local loss is the mean over the "
        "local batch, then psum'd (loss and grads |dp| times too large)")(_train_dp("loss_local_batch"))


def _train_clip(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        in_specs, _ = train.fsdp_specs()
        return shard_map_pair(name, train.clip_sgd_step, train.shard_map_clip_sgd(mesh, variant), mesh,
                              train_regression_args(name), ["params", "x", "y"], in_specs,
                              None if variant == "correct" else train.CLIP_VARIANTS[variant])

    return fn


fixture("train_clip_shard_map", "FSDP SGD step with global-norm gradient clipping in shard_map: params split "
        "on dim 0 over dp, all_gather, value_and_grad, psum_scatter of the grads, norm = sqrt(psum over dp of "
        "the shards' squared norms) (correct)")(_train_clip("correct"))
fixture("train_clip_shard_map_local_norm", "FSDP SGD step with gradient clipping by the norm of the local "
        "gradient shard only (no psum over dp)")(_train_clip("local_norm"))


def _dp_mean_sgd(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        in_specs, _ = dp_mean.sgd_specs()
        return shard_map_pair(name, dp_mean.sgd_step, dp_mean.shard_map_sgd(mesh, variant), mesh,
                              train_regression_args(name), ["params", "x", "y"], in_specs,
                              None if variant == "correct" else dp_mean.SGD_VARIANTS[variant])

    return fn


fixture("dp_mean_sgd_shard_map", "textbook data-parallel SGD step in shard_map (params replicated, batch over dp "
        "of a 4x2 dp x tp mesh): value_and_grad of the local *mean* loss, pmean of grads and loss over dp "
        "(correct: the mean of equal-size shard means is the global mean)")(_dp_mean_sgd("correct"))
fixture("dp_mean_sgd_shard_map_pmean_wrong_axis", "data-parallel SGD step averaging the per-shard mean "
        "gradients over tp (params replicated there) instead of dp")(_dp_mean_sgd("pmean_wrong_axis"))
fixture("dp_mean_sgd_shard_map_psum_not_pmean", "data-parallel SGD step summing the per-shard mean gradients "
        "over dp with psum where pmean belongs (|dp| times too large)")(_dp_mean_sgd("psum_not_pmean"))


def _dp_mean_adamw(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        args = dp_mean.init_adamw(rng_for("dp_mean_adamw"))
        in_specs, _ = dp_mean.adamw_specs(args[1])
        return shard_map_pair(name, dp_mean.adamw_step, dp_mean.shard_map_adamw(mesh, args[1], variant), mesh,
                              args, ["params", "opt_state", "x", "y"], in_specs,
                              None if variant == "correct" else dp_mean.ADAMW_VARIANTS[variant])

    return fn


fixture("dp_mean_adamw_shard_map", "data-parallel optax AdamW step of a small MLP in shard_map (params and "
        "optimizer state replicated, batch over dp): pmean of the local mean loss's gradients, then the AdamW "
        "update (sqrt of the second moment) (correct)")(_dp_mean_adamw("correct"))
fixture("dp_mean_adamw_shard_map_local_grads", "data-parallel optax AdamW step feeding each shard's own "
        "gradients to the optimizer (no pmean over dp)")(_dp_mean_adamw("local_grads"))


def _dp_relu_adam(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        args = dp_mean.init_relu_adam(rng_for("dp_relu_adam"))
        in_specs, _ = dp_mean.adamw_specs(args[1])
        built = shard_map_pair(name, dp_mean.relu_adam_step, dp_mean.shard_map_relu_adam(mesh, args[1], variant),
                               mesh, args, ["params", "opt_state", "x", "y"], in_specs,
                               None if variant == "correct" else dp_mean.RELU_ADAM_VARIANTS[variant],
                               lower_sharded=False)
        assert "@empty_mesh" in built.after_text, f"{name}: expected JAX's empty mesh for Adam's count"
        return built

    return fn


fixture("dp_relu_adam_shard_map_unsharded_lowering", "data-parallel optax Adam step of a relu MLP in shard_map, "
        "lowered from unsharded inputs as a user does (Adam's scalar count on JAX's @empty_mesh): pmean of the "
        "local mean loss's gradients, whose 1/n sits in relu's select (correct)")(_dp_relu_adam("correct"))
fixture("dp_relu_adam_shard_map_psum_not_pmean", "data-parallel Adam step of a relu MLP summing the shards' "
        "mean gradients with psum where pmean belongs")(_dp_relu_adam("psum_not_pmean"))


# --------------------------------------------------------------------------------------- parallelism styles


VOCAB = 32


def embed_args(name: str) -> list[np.ndarray]:
    return vocab_parallel.embed_init(4, 8, VOCAB, 8, rng_for("embed_vocab"))


def _embed(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = vocab_parallel.embed_specs()
        built = shard_map_pair(name, vocab_parallel.embed_reference, vocab_parallel.shard_map_embed(mesh, variant),
                               mesh, embed_args(name), ["ids", "table"], in_specs,
                               None if variant == "correct" else vocab_parallel.EMBED_VARIANTS[variant])
        # Masking ids to the shard equals table[ids] only for ids in range (which table[ids] promises).
        return dataclasses.replace(built, assume={"ids": [0, VOCAB]})

    return fn


fixture("embed_vocab_shard_map", "vocab-parallel embedding lookup (table split on vocab over tp, int32 ids "
        "over dp): ids - axis_index(tp)*v_local masked to [0, v_local), gather, masked rows zeroed, psum over "
        "tp (correct)")(_embed("correct"))
fixture("embed_vocab_shard_map_no_mask", "vocab-parallel embedding lookup with the local ids clamped but "
        "not masked: every shard contributes a row to the psum")(_embed("no_mask"))
fixture("embed_vocab_shard_map_wrong_offset", "vocab-parallel embedding lookup with the shard offset "
        "axis_index(tp) not multiplied by v_local")(_embed("wrong_offset"))


@fixture("embed_vocab_shardy", "embedding lookup table[ids] with the table split on vocab over tp (P(tp,None)) "
         "and ids over dp, Shardy, vs the module after SPMD partitioning (partitioned gather)")
def _embed_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = vocab_parallel.embed_specs()
    return partitioned_pair(name, vocab_parallel.embed_reference, mesh, embed_args(name), ["ids", "table"],
                            in_specs, out_spec)


def xent_args(name: str) -> list[np.ndarray]:
    return vocab_parallel.xent_init(8, VOCAB, rng_for("xent_vocab"))


def _xent(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = vocab_parallel.xent_specs()
        built = shard_map_pair(name, vocab_parallel.xent_reference, vocab_parallel.shard_map_xent(mesh, variant),
                               mesh, xent_args(name), ["logits", "labels"], in_specs,
                               None if variant == "correct" else vocab_parallel.XENT_VARIANTS[variant])
        return dataclasses.replace(built, assume={"labels": [0, VOCAB]})

    return fn


fixture("xent_vocab_shard_map", "vocab-parallel per-token cross-entropy (logits split (dp, tp), int32 labels "
        "over dp): pmax of the max, psum of the sum of exponentials, target logit masked to its shard and "
        "psum'd (correct)")(_xent("correct"))
fixture("xent_vocab_shard_map_local_max", "vocab-parallel cross-entropy with the local max (no pmax): the "
        "psum'd exponentials use different shifts per shard")(_xent("local_max"))
fixture("xent_vocab_shard_map_local_sum_exp", "vocab-parallel cross-entropy with the sum of exponentials "
        "over the local vocab shard only (no psum)")(_xent("local_sum_exp"))


@fixture("xent_vocab_shardy", "per-token cross-entropy (max, sum-exp, take_along_axis of the label) with "
         "logits split (dp, tp) on (tokens, vocab), Shardy, vs the module after SPMD partitioning")
def _xent_shardy(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = vocab_parallel.xent_specs()
    return partitioned_pair(name, vocab_parallel.xent_reference, mesh, xent_args(name), ["logits", "labels"],
                            in_specs, out_spec)


def _ring(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "sp"))
        args = ring_attention.init(2, 16, 2, 4, rng_for("ring_attention"))
        in_specs, _ = ring_attention.specs()
        return shard_map_pair(name, ring_attention.reference, ring_attention.shard_map_ring_attention(mesh, variant),
                              mesh, args, ["q", "k", "v"], in_specs,
                              None if variant in ("correct", "fori") else ring_attention.VARIANTS[variant])

    return fn


fixture("ring_attention_shard_map", "causal ring attention (seq over sp): K/V blocks rotated i -> i+1 with "
        "ppermute for |sp| steps (unrolled), online softmax with running max / denominator rescaling "
        "(correct)")(_ring("correct"))
fixture("ring_attention_shard_map_fori", "causal ring attention as a lax.fori_loop (a while loop carrying the "
        "K/V blocks, ppermute i -> i+1 in the body) (correct)")(_ring("fori"))
fixture("ring_attention_shard_map_no_rescale", "ring attention whose accumulated output is not rescaled by "
        "exp(m_old - m_new) when the running max grows")(_ring("no_rescale"))
fixture("ring_attention_shard_map_inverted_rescale", "ring attention whose rescale factor is exp(m_new - m_old) "
        "instead of exp(m_old - m_new): inf on the first step, NaN everywhere")(_ring("inverted_rescale"))
fixture("ring_attention_shard_map_wrong_direction", "ring attention with K/V sent i -> i-1 while the causal "
        "mask assumes the block of device i - t at step t")(_ring("wrong_direction"))


def _ulysses(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "sp"))
        args = ulysses.init(2, 16, 8, 4, rng_for("ulysses"))
        in_specs, _ = ulysses.specs()
        return shard_map_pair(name, ulysses.reference, ulysses.shard_map_ulysses(mesh, variant), mesh, args,
                              ["q", "k", "v"], in_specs, None if variant == "correct" else ulysses.VARIANTS[variant])

    return fn


fixture("ulysses_attention_shard_map", "DeepSpeed-Ulysses attention (seq over sp): all_to_all trades the "
        "sequence split for a head split, causal attention on whole sequences, all_to_all back "
        "(correct)")(_ulysses("correct"))
fixture("ulysses_attention_shard_map_wrong_axis", "Ulysses attention exchanging over dp instead of sp: shapes "
        "still fit, attention sees the wrong half of the sequence")(_ulysses("wrong_axis"))


def _moe(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "ep"))
        args = moe.init(moe.TINY, rng_for("moe"))
        in_specs, _ = moe.specs()
        return shard_map_pair(name, moe.reference, moe.shard_map_moe(mesh, variant), mesh, args,
                              ["x", "wr", "w_in", "w_out"], in_specs,
                              None if variant == "correct" else moe.VARIANTS[variant])

    return fn


fixture("moe_all_to_all_shard_map", "mixture of experts with expert parallelism (16 experts over ep, tokens "
        "over (dp, ep)): top-1 routing, capacity 2 per expert per device group of 8 tokens (5 of 64 dropped), "
        "all_to_all dispatch and combine over ep (correct)")(_moe("correct"))
fixture("moe_all_to_all_shard_map_no_combine", "mixture of experts without the combine all_to_all: expert "
        "outputs used on the expert's device as if they were this device's tokens")(_moe("no_combine"))
fixture("moe_all_to_all_shard_map_combine_axes_swapped", "mixture of experts whose combine all_to_all "
        "concatenates on axis 1 instead of 0 (owner and local-expert dims transposed)")(_moe("combine_axes_swapped"))


@fixture("gqa_kv_heads_sub_axis_shardy", "grouped-query attention, 8 query heads over tp=4 and 2 KV heads: XLA "
         "gives each pair of tp devices one KV head (a sub-axis, tp:(1)2, read from partition-id tables)")
def _gqa_sub_axis(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = head_groups.gqa_specs()
    return partitioned_pair(name, head_groups.gqa_attention, mesh, head_groups.gqa_init(rng_for(name)),
                            ["x", "wq", "wk", "wv", "wo"], in_specs, out_spec)


@fixture("clip_contrastive_loss_shardy", "CLIP's symmetric contrastive loss with the batch split over 8 devices: the "
         "column loss reads the diagonal of a matrix whose columns are split, a masked lookup of constant indices")
def _clip(name: str) -> Built:
    mesh = make_mesh((8,), ("x",))
    in_specs, out_spec = contrastive.clip_specs()
    return partitioned_pair(name, contrastive.clip_loss, mesh, contrastive.clip_init(rng_for(name)),
                            ["img", "txt", "wi", "wt", "logit_scale"], in_specs, out_spec)


@fixture("mut_clip_diagonal_mask_inverted", "clip_contrastive_loss_shardy after.hlo with the select of the diagonal "
         "lookup's operands swapped: each device zeroes the diagonal entries it holds and keeps the others")
def _mut_clip_mask(name: str) -> Built:
    text = build("clip_contrastive_loss_shardy").after_text
    sel, idx, line = sole_instruction(text, "select", r"= f32\[32,1\]\{1,0\} select\(%\S+, %\S+, %gather",
                                      "the select zeroing the diagonal lookup")
    m = re.search(r"select\((%\S+), (%\S+), (%\S+)\)", line)
    assert m is not None
    new = replace_line(text, idx, line.replace(m.group(0), f"select({m.group(1)}, {m.group(3)}, {m.group(2)})"))
    return mutated(name, "clip_contrastive_loss_shardy", new, sel, f"{sel} keeps the rows outside the device's "
                   "columns")


@fixture("gqa_kv_projection_split_shardy", "grouped-query attention with the k/v projections split over tp = 4 like "
         "q's (2 KV heads, half a head per device): the half heads all-gathered over tp's minor half, then repeated "
         "only as far as the device's query heads need")
def _gqa_kv_split(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = head_groups.gqa_specs(kv_split=True)
    return partitioned_pair(name, head_groups.gqa_attention, mesh, head_groups.gqa_init(rng_for(name)),
                            ["x", "wq", "wk", "wv", "wo"], in_specs, out_spec)


@fixture("mut_gqa_kv_half_heads_gathered_over_tp_major", "gqa_kv_projection_split_shardy after.hlo with the first "
         "all-gather of half KV heads over tp's major half instead of its minor half: each device joins its half "
         "head to a half of the other KV head")
def _mut_gqa_kv_gather(name: str) -> Built:
    text = build("gqa_kv_projection_split_shardy").after_text
    gather = hlo_instructions(text, "all-gather")[0]
    idx, line = hlo_instruction_line(text, gather)
    assert "{'axis_3'}, dimensions={3}" in line
    new = replace_line(text, idx, line.replace("{'axis_3'}, dimensions={3}", "{'axis_2'}, dimensions={3}"))
    return mutated(name, "gqa_kv_projection_split_shardy", new, gather, f"{gather} gathers over the major half of tp")


@fixture("uneven_vocab_and_hidden_train_step_shardy", "gradients of a small language model whose vocabulary (50) "
         "and MLP width (30) tp = 4 does not divide: XLA pads them to blocks of 13 and 8, masks the padding in the "
         "softmax and before the second matmul, gathers embeddings from a padded block of the table and scatters "
         "the label gradient into a padded block")
def _uneven_lm(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_specs = uneven.specs()
    return partitioned_pair(name, functools.partial(uneven.grads, mesh=mesh), mesh, uneven.init(rng_for(name)),
                            ["ids", "labels", "emb", "w1", "w2", "out"], in_specs, out_specs)


@fixture("mut_uneven_vocab_mask_inverted", "uneven_vocab_and_hidden_train_step_shardy after.hlo with the mask of "
         "the logits' padded block compared GE instead of LT: the softmax's max and sum read the padding, not the "
         "vocabulary")
def _mut_uneven_mask(name: str) -> Built:
    text = build("uneven_vocab_and_hidden_train_step_shardy").after_text
    masks = [n for n in hlo_instructions(text, "compare")
             if re.search(r"= pred\[2,6,13\]\{2,1,0\} compare\(.*direction=LT", hlo_instruction_line(text, n)[1])]
    cmp = masks[0]  # the forward softmax's (the backward's comes after it)
    idx, line = hlo_instruction_line(text, cmp)
    return mutated(name, "uneven_vocab_and_hidden_train_step_shardy",
                   replace_line(text, idx, line.replace("direction=LT", "direction=GE")), cmp,
                   f"{cmp} keeps the padded columns of the logits and drops the vocabulary's")


@fixture("mut_gqa_kv_head_offsets_swapped", "gqa_kv_heads_sub_axis_shardy after.hlo with the table of KV-head "
         "offsets {0, 4} changed to {4, 0}: each device attends with the other group's keys and values")
def _mut_gqa_offsets(name: str) -> Built:
    text = build("gqa_kv_heads_sub_axis_shardy").after_text
    table, idx, line = sole_instruction(text, "constant", r"= s32\[2\]\{0\} constant\(\{0, 4\}\)",
                                        "s32[2] offset table {0, 4}")
    new = replace_line(text, idx, line.replace("constant({0, 4})", "constant({4, 0})"))
    return mutated(name, "gqa_kv_heads_sub_axis_shardy", new, table, f"offset table {table} of the KV heads' column "
                   "blocks reversed")


@fixture("moe_dense_dispatch_shardy", "dense top-1 mixture of experts, one expert per tp device: one_hot(argmax) "
         "computed per device as top == axis_index, a mask with one class per device")
def _moe_dense(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = head_groups.dense_dispatch_specs()
    return partitioned_pair(name, head_groups.dense_dispatch, mesh, head_groups.dense_dispatch_init(rng_for(name)),
                            ["x", "wr", "w"], in_specs, out_spec)


@fixture("loss_scaled_step_shardy", "step with dynamic loss scaling (loss x 1024, update only where "
         "all(isfinite(g))): XLA computes the broadcast gradient one column wide and tiles it")
def _loss_scaled(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = loss_scaling.specs()
    return partitioned_pair(name, loss_scaling.step, mesh, loss_scaling.init(rng_for(name)), ["w", "x", "y"],
                            in_specs, out_spec)


@fixture("token_shift_split_sequence_shardy", "RWKV's token shift (pad, drop the last row) and a roll over a "
         "sequence split over tp: neighbour rows by collective-permute, the rows from outside masked by a select")
def _token_shift(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = token_shift.specs()
    return partitioned_pair(name, token_shift.token_shift, mesh, token_shift.init(rng_for(name)), ["x", "mu"],
                            in_specs, out_spec)


@fixture("roll_both_ways_two_device_ring_shardy", "jnp.roll by +1 and -1 of a sequence split over dp, a ring of "
         "two devices: each cyclic collective-permute goes to the device that is both neighbours")
def _roll_both_ways(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    x = rng_for(name).standard_normal((16, 8)).astype(np.float32)
    return partitioned_pair(name, token_shift.roll_both_ways, mesh, [x], ["x"], [P("dp", "tp")], P("dp", "tp"))


@fixture("rope_kv_half_heads_shardy", "RoPE on the keys of 2 KV heads whose fused projection is split over tp = 4 "
         "(half a head per device): rotate_half's other half fetched by collective-permutes and a window per device")
def _rope_kv_half_heads(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    return partitioned_pair(name, head_groups.rope_kv_half_heads, mesh, head_groups.rope_kv_init(rng_for(name)),
                            ["x", "wk"], [P("dp"), P(None, "tp")], P("dp"))


@fixture("resplit_batch_shardy", "a batch split over (dp, tp) returned over tp, one over (tp, dp) returned over dp: "
         "blocks relaid by a collective-permute so that the dropped axis is the minor one, then all-gathered")
def _resplit(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_specs = relayout.resplit_specs()
    return partitioned_pair(name, relayout.resplit, mesh, relayout.resplit_init(rng_for(name)), ["x", "y"], in_specs,
                            out_specs)


@fixture("attention_dropout_heads_split_shardy", "dropout on attention probabilities with the batch over dp and "
         "the heads over tp, a raw threefry key: each device's counters from its offsets along both split dims")
def _attention_dropout(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = relayout.dropout_specs()
    return partitioned_pair(name, relayout.attention_dropout, mesh, relayout.dropout_init(rng_for(name)),
                            ["p", "key"], in_specs, out_spec)


def _kv_cache(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((8,), ("x",))
        in_specs, _ = kv_cache.specs()
        built = shard_map_pair(name, kv_cache.reference, kv_cache.shard_map_write(mesh, variant), mesh,
                               kv_cache.init(rng_for("kv_cache")), ["cache", "k", "pos"], in_specs,
                               None if variant == "correct" else kv_cache.VARIANTS[variant])
        # The write lands where the reference's does only for a position inside the cache (a decode step's).
        return dataclasses.replace(built, assume={"pos": [0, 32]})

    return fn


fixture("kv_cache_write_split_sequence_shard_map", "a decode step's KV-cache write by hand, the cache split over "
        "the sequence: the index shifted to each device's block, written, kept where it lies in the block")(
    _kv_cache("correct"))
fixture("kv_cache_write_split_sequence_shard_map_short_blocks", "the same with the index shifted by "
        "(block - 1) per device")(_kv_cache("short_blocks"))


def _positions(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = positions.specs()
        return shard_map_pair(name, positions.reference, positions.shard_map_positions(mesh, variant), mesh,
                              positions.init(rng_for("positions")), ["x"], in_specs,
                              None if variant == "correct" else positions.VARIANTS[variant])

    return fn


fixture("positions_split_tp_major_shard_map", "sinusoidal positions of a sequence split P(('tp', 'dp')) on the "
        "(dp, tp) mesh, computed in the body from tp * |dp| + dp")(_positions("correct"))
fixture("positions_split_tp_major_shard_map_mesh_order", "the same with the block index in the mesh's order, "
        "dp * |tp| + tp")(_positions("mesh_order"))


def _summa(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = summa.specs()
        return shard_map_pair(name, summa.reference, summa.shard_map_summa(mesh, variant), mesh,
                              summa.init(rng_for("summa")), ["a", "b"], in_specs,
                              None if variant == "correct" else summa.VARIANTS[variant])

    return fn


fixture("summa_matmul_shard_map", "SUMMA on the 2 x 4 grid by hand: each panel broadcast as a psum of "
        "where(axis_index == owner, panel, 0) with a scalar predicate")(_summa("correct"))
# (The twin taking b's panels from the wrong owner is caught, named at the accumulation one line below the
# mistake: it is in tools/programs/user_programs.py, which checks verdicts only.)


def _causal_conv1d(shardy: bool) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, out_spec = token_shift.specs()
        return partitioned_pair(name, token_shift.causal_conv1d, mesh, token_shift.conv_init(rng_for("causal_conv1d")),
                                ["x", "w"], in_specs, out_spec, shardy=shardy)

    return fn


fixture("causal_conv1d_split_sequence_shardy", "a depthwise causal conv1d written as pad + 4 slices over a sequence "
        "split over tp: the padded sequence resharded into longer blocks (pad, a window per device, a mask), then "
        "windows of it moved back by collective-permutes")(_causal_conv1d(True))
fixture("causal_conv1d_split_sequence_gspmd", "the same with jax_use_shardy_partitioner=False")(_causal_conv1d(False))


@fixture("mut_causal_conv1d_halo_sent_forward", "causal_conv1d_split_sequence_shardy after.hlo with the second "
         "collective-permute's pairs reversed: each device's edge rows go to the previous device, not the next")
def _mut_causal_conv1d(name: str) -> Built:
    text = build("causal_conv1d_split_sequence_shardy").after_text
    target = hlo_instructions(text, "collective-permute")[1]
    idx, line = hlo_instruction_line(text, target)
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    assert pairs is not None, f"{name}: no source_target_pairs on {target}"
    listed = re.findall(r"\{(\d+),(\d+)\}", pairs.group(0))
    reversed_pairs = "source_target_pairs={" + ",".join(f"{{{t},{s}}}" for s, t in listed) + "}"
    new_text = replace_line(text, idx, line.replace(pairs.group(0), reversed_pairs))
    return mutated(name, "causal_conv1d_split_sequence_shardy", new_text, target,
                   f"collective-permute {target}: the padded sequence's edge rows sent to the previous device")


def _shard_map_in_jit(partial_manual: bool, shardy: bool = True) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, out_spec = shard_map_in_jit.specs()
        return partitioned_pair(name, shard_map_in_jit.block(mesh, partial_manual), mesh,
                                shard_map_in_jit.init(rng_for("shard_map_in_jit")), ["x", "w1", "w2", "g"], in_specs,
                                out_spec, shardy=shardy)

    return fn


fixture("shard_map_in_jit_shardy", "a jitted block calling a shard_map (Megatron MLP by hand, manual over dp and "
        "tp) beside RMSNorm and a residual left to the partitioner: the reference holds a manual region")(
    _shard_map_in_jit(False))
fixture("shard_map_in_jit_gspmd", "the same with jax_use_shardy_partitioner=False (the shard_map as "
        "SPMDFullToShardShape custom calls in the reference)")(_shard_map_in_jit(False, shardy=False))
fixture("shard_map_partial_manual_in_jit_shardy", "the same block with the shard_map manual over tp only "
        "(axis_names={'tp'}): the batch split over dp stays with the partitioner inside it")(_shard_map_in_jit(True))


@fixture("mut_shard_map_partial_manual_psum_wrong_axis", "shard_map_partial_manual_in_jit_shardy after.hlo with "
         "the hand-written psum over tp moved to the dp groups")
def _mut_partial_manual_psum(name: str) -> Built:
    return _allreduce_groups_changed(name, "shard_map_partial_manual_in_jit_shardy", "psum", "{{0,1,2,3},{4,5,6,7}}",
                                     "{{0,4},{1,5},{2,6},{3,7}}", "the MLP's partial sums over tp")


@fixture("fixed_point_while_shardy", "a while loop iterating tanh(h @ w) / 2 until max |h| <= 1e-3 or 5 steps, "
         "batch over dp and w over tp: the condition's maximum all-reduced in the partitioned loop")
def _fixed_point(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_spec = convergence.specs()
    return partitioned_pair(name, convergence.iterate, mesh, convergence.init(rng_for(name)), ["x", "w"], in_specs,
                            out_spec)


@fixture("pooled_tokens_split_sequence_shardy", "the first token (CLS pooling) and the last (next-token logits) "
         "of a sequence split over tp: each kept on the device holding it, zeroed elsewhere, all-reduced")
def _pooled_tokens(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    in_specs, out_specs = token_shift.pooled_specs()
    return partitioned_pair(name, token_shift.pooled_tokens, mesh, token_shift.pooled_init(rng_for(name)),
                            ["x", "w_cls", "w_out"], in_specs, out_specs)


def _pipeline(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("pp", "dp"))
        args = pipeline.init(2, 8, 8, 2, rng_for("pipeline"))
        in_specs, _ = pipeline.specs()
        return shard_map_pair(name, pipeline.reference, pipeline.shard_map_pipeline(mesh, variant), mesh, args,
                              ["x", "w"], in_specs, None if variant == "correct" else pipeline.VARIANTS[variant])

    return fn


fixture("pipeline_ppermute_shard_map", "2-stage pipeline (stage weights split over pp, 2 microbatches, "
        "batch over dp): stage 0's outputs handed to stage 1 with ppermute (0, 1), last stage's outputs "
        "broadcast by a masked psum (correct)")(_pipeline("correct"))
fixture("pipeline_ppermute_shard_map_wrong_pairs", "2-stage pipeline whose ppermute sends stage outputs "
        "1 -> 0 instead of 0 -> 1")(_pipeline("wrong_pairs"))


# ------------------------------------------------------------------------- nested loops: proof by induction
# A loop nest is proven one level at a time, each body read once (a cost linear in the depth: once it was
# exponential, and `unknown`); a nest whose innermost body differs is found with a counterexample.
# Programs: tools/programs/nested_loops.py.

NESTED_DEPTH = 12  # 2 ** 12 innermost steps when run: XLA and the oracle's interpreter still run it quickly


def _nested_fori(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("dp", "tp"))
        in_specs, _ = nested_loops.specs()
        return shard_map_pair(name, functools.partial(nested_loops.reference, depth=NESTED_DEPTH),
                              nested_loops.shard_map_nest(mesh, NESTED_DEPTH, variant), mesh,
                              nested_loops.init(8, 16, rng_for("nested_fori")), ["x"], in_specs,
                              nested_loops.BUG_FUNCTIONS.get(variant))

    return fn


fixture("nested_fori_shard_map", f"{NESTED_DEPTH} nested lax.fori_loops (2 trips each) of x*0.5 + 1 + 0.25*i "
        "(i the innermost counter), the same nest on each (dp, tp) block in shard_map (correct)")(
    _nested_fori("correct"))
fixture("nested_fori_shard_map_inner_constant", f"{NESTED_DEPTH} nested lax.fori_loops in shard_map whose "
        "innermost update adds 2.0 where the reference adds 1.0")(_nested_fori("constant"))


# ------------------------------------------------------------------ soundness: once false `equivalent`s


def _sound_pair(ref: Callable[..., Any], body: Callable[..., Any], args: Sequence[np.ndarray],
                argnames: Sequence[str], specs: Sequence[Any], out_spec: Any,
                x64: bool = False, unit_axis: bool = False) -> Callable[[str], Built]:
    """A shard_map pair over one 8-device axis "x" (and a size-1 axis "y" with `unit_axis`) whose body
    carries a `# BUG:` line (or none)."""
    def fn(name: str) -> Built:
        mesh = make_mesh((8, 1), ("x", "y")) if unit_axis else make_mesh((8,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec))
        with jax.enable_x64(x64):
            return shard_map_pair(name, ref, impl, mesh, args, argnames, specs,
                                  body if "# BUG:" in inspect.getsource(body) else None)

    return fn


def _ints(name: str, shape: tuple[int, ...], lo: int, hi: int, dtype: Any = np.int32) -> np.ndarray:
    return rng_for(name).integers(lo, hi, shape).astype(dtype)


_DIV_ARGS = [_ints("int_div_a", (64, 2), -50, 50), _ints("int_div_b", (64, 2), -50, 50),
             _ints("int_div_c", (64, 2), 1, 9)]
fixture("int_div_reassociated_shard_map", "int32 (a*b)/c against a*(b/c) in a shard_map body: integer "
        "division is not real division (once a false equivalent)")(
    _sound_pair(soundness.int_div_ref, soundness.int_div_body, _DIV_ARGS, ["a", "b", "c"], [P("x")] * 3, P("x")))
fixture("int_div_shard_map", "int32 (a*b)/c computed the same way on every shard (correct)")(
    _sound_pair(soundness.int_div_ref, soundness.int_div_body_correct, _DIV_ARGS, ["a", "b", "c"],
                [P("x")] * 3, P("x")))
fixture("int64_constant_shard_map", "int64 x + 2**53 against x + (2**53 + 1): constants equal only as float64 "
        "(once a false equivalent)")(
    _sound_pair(soundness.int64_const_ref, soundness.int64_const_body, [_ints("int64_x", (64,), 0, 100, np.int64)],
                ["x"], [P("x")], P("x"), x64=True))
fixture("uint64_constant_shard_map", "uint64 x*2 + (2**64-1) against (2**64-2) + x*2: constants equal only as "
        "float64 (once a false equivalent)")(
    _sound_pair(soundness.uint64_const_ref, soundness.uint64_const_body,
                [_ints("uint64_x", (64,), 0, 100, np.uint64)], ["x"], [P("x")], P("x"), x64=True))


fixture("int_pmax_of_shards_shard_map", "int32 pmax of a value split over the axis: the shards are folded "
        "by a max whose identity is the type's least value (once a crash: -inf as an int32)")(
    _sound_pair(soundness.int_pmax_ref, soundness.int_pmax_body, [_ints("int_pmax_x", (32,), -100, 100)], ["x"],
                [P("x")], P()))


fixture("int_pmax_of_shards_unit_axis_shard_map", "the int32 pmax of shards on a mesh with a size-1 axis: "
        "the shard_map is manual over every axis, the size-1 one included (was unknown: 'manual over only "
        "some axes')")(
    _sound_pair(soundness.int_pmax_ref, soundness.int_pmax_body, [_ints("int_pmax_x", (32,), -100, 100)], ["x"],
                [P("x")], P(), unit_axis=True))


def _window_lookup(name: str) -> Built:
    table = rng_for(name).standard_normal((soundness.VOCAB, soundness.DIM)).astype(np.float32)
    ids = _ints(name, (64,), 0, soundness.VOCAB - 1)
    built = _sound_pair(soundness.window_lookup_ref, soundness.window_lookup_body, [table, ids], ["table", "ids"],
                        [P("x", None), P()], P())(name)
    return dataclasses.replace(built, assume={"ids": [0, soundness.VOCAB - 1]})


fixture("window_lookup_vocab_shard_map", "vocab-parallel lookup of two-row windows (dynamic_slice of size 2) "
        "masked to the shard and psum'd: windows crossing a shard edge are clamped inside the shard "
        "(once a false equivalent under --assume)")(_window_lookup)


def _set_column_args(name: str) -> list[np.ndarray]:
    rng = rng_for(name)
    return [rng.standard_normal(s).astype(np.float32) for s in ((32, 8), (16,))]


fixture("scatter_window_per_block_shard_map", "a scatter whose update window runs down the split dim, in a "
        "shard_map: each device writes the first rows of its own block, not the first rows of the tensor (once a "
        "false equivalent: a split window was taken for the global one)")(
    _sound_pair(soundness.set_column_ref, soundness.set_column_body, _set_column_args("scatter_window_per_block"),
                ["x", "v"], [P("x", None), P("x")], P("x", None)))


# ---------------------------------------------------------- control flow: lax.switch / lax.cond in shard_map
# Programs: tools/programs/control_flow.py. The `_gspmd` pairs lower the same shard_map with Shardy off:
# SPMDFullToShardShape / SPMDShardToFullShape custom calls around a plain call instead of a region.


def _control_flow(ref: Callable[..., Any], body: Callable[..., Any], switch: bool, *,
                  shardy: bool = True) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((control_flow.N,), ("x",))
        rng = rng_for("control_flow")
        args = control_flow.init(rng) if switch else control_flow.init(rng)[1:]
        names = ["step", "x"] if switch else ["x"]
        specs, out_spec = control_flow.switch_specs()
        specs = specs if switch else specs[1:]
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_spec,
                                     check_vma=switch))
        bug = body if "# BUG:" in inspect.getsource(body) else None
        previous = jax.config.jax_use_shardy_partitioner  # type: ignore[attr-defined]
        jax.config.update("jax_use_shardy_partitioner", shardy)
        try:
            if shardy:
                return shard_map_pair(name, ref, impl, mesh, args, names, specs, bug)
            built = _gspmd_shard_map_pair(name, ref, impl, mesh, args, names, specs, bug)
        finally:
            jax.config.update("jax_use_shardy_partitioner", previous)
        return built

    return fn


def _gspmd_shard_map_pair(name: str, ref: Callable[..., Any], impl: Callable[..., Any], mesh: jax.sharding.Mesh,
                          args: Sequence[Any], argnames: Sequence[str], in_specs: Sequence[Any],
                          bug_fn: Callable[..., Any] | None) -> Built:
    """`shard_map_pair` with Shardy off: the after program's shard_map is the GSPMD boundary custom calls."""
    in_sh = tuple(named(mesh, s) for s in in_specs)
    before_text = jax.jit(ref).lower(*sds(args)).as_text(debug_info=True)
    after_text = jax.jit(impl).lower(*sds(tuple(args), in_sh)).as_text(debug_info=True)
    assert "SPMDFullToShardShape" in after_text and "sdy." not in after_text, f"{name}: not a GSPMD shard_map"
    inputs, input_names = leaves_with_names(args, argnames)
    placed = [jax.device_put(a, s) for a, s in zip(args, in_sh, strict=True)]
    bug = bug_of(bug_fn) if bug_fn is not None else None
    return Built(
        name=name, description=description_of(name), verdict="discrepancy" if bug else "equivalent",
        after_kind="gspmd_shard_map_mlir", mesh=mesh_dict(mesh), before_text=before_text, after_text=after_text,
        inputs=inputs, input_names=input_names, before_out=to_numpy_list(jax.jit(ref)(*args)),
        after_out=to_numpy_list(jax.jit(impl)(*placed)), bug=bug,
    )


def _gspmd_body_pair(name: str, ref: Callable[..., Any], body: Callable[..., Any], mesh: jax.sharding.Mesh,
                     args: Sequence[Any], argnames: Sequence[str], in_specs: Sequence[Any], out_spec: Any) -> Built:
    """A jitted shard_map of `body` lowered with Shardy off (check_vma off), against `ref`."""
    impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(in_specs), out_specs=out_spec, check_vma=False))
    previous = jax.config.jax_use_shardy_partitioner  # type: ignore[attr-defined]
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        return _gspmd_shard_map_pair(name, ref, impl, mesh, args, argnames, in_specs,
                                     body if "# BUG:" in inspect.getsource(body) else None)
    finally:
        jax.config.update("jax_use_shardy_partitioner", previous)


CF = control_flow
fixture("switch_replicated_index_shard_map", "lax.switch on a replicated step index in a shard_map: x * 2, "
        "x / psum(local sum of squares), x - pmax(local max) (correct)")(
    _control_flow(CF.switch_ref, CF.switch_body, True))
fixture("switch_replicated_index_shard_map_pmin", "lax.switch in a shard_map whose third branch takes pmin "
        "of the local maxima where pmax belongs")(_control_flow(CF.switch_ref, CF.switch_body_pmin, True))
fixture("switch_branches_swapped_shard_map", "lax.switch in a shard_map with the same branches in another "
        "order (the same ops and collectives, another program)")(
    _control_flow(CF.switch_ref, CF.switch_body_swapped, True))
fixture("cond_psum_predicate_shard_map", "lax.cond on psum(local sum) > 0 in a shard_map against lax.cond on "
        "sum(x) > 0 (correct)")(_control_flow(CF.cond_ref, CF.cond_body, False))
fixture("cond_local_predicate_shard_map", "lax.cond in a shard_map on the local sum > 0: the devices take "
        "different branches")(_control_flow(CF.cond_ref, CF.cond_body_local, False))
fixture("switch_replicated_index_gspmd_shard_map", "the lax.switch shard_map with Shardy off: "
        "SPMDFullToShardShape / SPMDShardToFullShape custom calls around the body (correct)")(
    _control_flow(CF.switch_ref, CF.switch_body, True, shardy=False))
fixture("switch_replicated_index_gspmd_shard_map_pmin", "the lax.switch shard_map with Shardy off, pmin "
        "where pmax belongs in its third branch")(
    _control_flow(CF.switch_ref, CF.switch_body_pmin, True, shardy=False))


# ------------------------------------------------ false alarms: correct programs once called `discrepancy`
# A `discrepancy` needs a counterexample. Each pair below computes the same values as its reference (XLA says
# so: write_fixture compares the outputs, _fa_mutated reruns an edited module) but has a construct that once
# made the verifier report a layout contradiction; it must come out `equivalent` or `unknown`.
# Programs: tools/programs/false_alarms.py.


def _fa_normal(name: str, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = rng_for(name)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _fa_pair(ref: Callable[..., Any], body: Callable[..., Any], shapes: Sequence[tuple[int, ...]],
             argnames: Sequence[str], specs: Sequence[Any], out_spec: Any, *,
             mesh_shape: tuple[int, ...] = (false_alarms.N,), axes: tuple[str, ...] = ("x",),
             check_vma: bool = True) -> Callable[[str], Built]:
    """A shard_map pair on float32 normal inputs of `shapes` (a bug pair when `body` has a `# BUG:` line).
    ``check_vma=False`` where JAX cannot see that an ``out_specs=P()`` value is the same on every device (an
    all_gather's result, a ring of ppermutes)."""
    def fn(name: str) -> Built:
        mesh = make_mesh(mesh_shape, axes)
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec,
                                     check_vma=check_vma))
        return shard_map_pair(name, ref, impl, mesh, _fa_normal(name, *shapes), argnames, specs,
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


def _fa_mutated(name: str, base_name: str, new_text: str, what: str) -> Built:
    """An edit of ``base``'s after.hlo that XLA shows keeps its meaning: the edited module, run on the base's
    inputs, gives the reference's outputs. Verdict `equivalent` (after kind ``mutated_hlo``)."""
    base = build(base_name)
    assert base.after_kind == "spmd_hlo" and base.in_shardings is not None and base.out_shardings is not None
    assert new_text != base.after_text
    xla_hlo().hlo_module_from_text(new_text)  # must still parse
    out = run_partitioned_hlo(new_text, base.inputs, base.in_shardings, base.out_shardings,
                              [o.shape for o in base.before_out])
    assert allclose(out, base.before_out), \
        f"{name}: the edit changes the result (max diff {max_abs_diff(out, base.before_out):.3g})"
    return Built(
        name=name, description=description_of(name), verdict="equivalent", after_kind="mutated_hlo",
        mesh=base.mesh, before_text=base.before_text, after_text=new_text, inputs=base.inputs,
        input_names=base.input_names, before_out=base.before_out, after_out=out,
        notes=[f"meaning-preserving edit of {base_name}/after.hlo (unchanged outputs, run by XLA): {what}"],
    )


FA = false_alarms
fixture("fa_all_gather_untiled_reshape_shard_map", "all_gather(tiled=False) of row blocks ([n, rows/n, d]) "
        "reshaped to [rows, d], then tanh, out_specs P() (correct)")(
    _fa_pair(FA.gather_untiled_ref, FA.gather_untiled_body, [(64, 4)], ["x"], [P("x", None)], P(),
             check_vma=False))
fixture("fa_psum_scatter_untiled_reshape_shard_map", "matmul with the contracting dim split: psum_scatter("
        "tiled=False) of the [n, d] partial sums (drops the scattered dim), reshaped to [1, d] (correct)")(
    _fa_pair(FA.scatter_untiled_ref, FA.scatter_untiled_body, [(8, 64), (64, 4)], ["a", "b"],
             [P(None, "x"), P("x", None)], P("x", None)))
fixture("fa_transpose_unit_dims_shard_map", "swapaxes(x, 0, 1) of x [n, 1, d] split on dim 0: the local "
        "[1, 1, d] transpose swaps two size-1 dims, out_specs P(None, x) (correct)")(
    _fa_pair(FA.swap_unit_dims_ref, FA.swap_unit_dims_body, [(8, 1, 4)], ["x"], [P("x", None, None)],
             P(None, "x", None)))
fixture("fa_ring_allreduce_ppermute_shard_map", "all-reduce by hand: n-1 steps of ppermute i -> i+1 and add, "
        "out_specs P(), against the sum of the row blocks (correct)")(
    _fa_pair(FA.block_sum_ref, FA.ring_allreduce_body, [(64, 4)], ["x"], [P("x", None)], P(),
             check_vma=False))
fixture("fa_ring_allreduce_short_shard_map", "all-reduce by hand one step short: n-2 steps of ppermute and add, "
        "out_specs P(): one block never reaches each device")(
    _fa_pair(FA.block_sum_ref, FA.ring_allreduce_short_body, [(64, 4)], ["x"], [P("x", None)], P(),
             check_vma=False))
@fixture("fa_ring_allreduce_ppermute_gspmd", "all-reduce by hand (n-1 steps of ppermute and add), the shard_map "
         "lowered with Shardy off, out_specs P() (correct)")
def _fa_ring_gspmd(name: str) -> Built:
    return _gspmd_body_pair(name, FA.block_sum_ref, FA.ring_allreduce_body, make_mesh((false_alarms.N,), ("x",)),
                            _fa_normal(name, (64, 4)), ["x"], [P("x", None)], P())


fixture("fa_sum_all_gather_shard_map", "sum(all_gather(x), 0) (a psum spelled as gather + reduce), "
        "out_specs P(), against the sum of the row blocks (correct)")(
    _fa_pair(FA.block_sum_ref, FA.sum_all_gather_body, [(64, 4)], ["x"], [P("x", None)], P(),
             check_vma=False))
fixture("fa_cond_psum_any_shard_map", "lax.cond on psum(any(x > 0) per shard) > 0 against lax.cond on "
        "any(x > 0) (correct)")(
    _fa_pair(FA.cond_any_ref, FA.cond_any_body, [(64, 4)], ["x"], [P("x", None)], P("x", None)))
fixture("fa_collective_matmul_shard_map", "collective matmul from the shard_map tutorial: rhs blocks sent "
        "i -> i+1 by ppermute, lhs column block (idx - k) mod n at step k (correct)")(
    _fa_pair(FA.matmul_ref, FA.collective_matmul_body, [(16, 16), (16, 4)], ["lhs", "rhs"],
             [P("x", None), P("x", None)], P("x", None)))
fixture("fa_collective_matmul_offset_plus_shard_map", "collective matmul with rhs blocks sent i -> i-1, lhs "
        "column block (idx + k) mod n at step k (correct)")(
    _fa_pair(FA.matmul_ref, FA.collective_matmul_plus_body, [(16, 16), (16, 4)], ["lhs", "rhs"],
             [P("x", None), P("x", None)], P("x", None)))
fixture("fa_out_specs_yx_in_specs_xy_shard_map", "elementwise body with in_specs P(('x','y')) and out_specs "
        "P(('y','x')) on a 2x4 mesh, against a reference that transposes the block grid (correct)")(
    _fa_pair(FA.blocks_transposed_ref, FA.blocks_transposed_body, [(64, 4)], ["x"], [P(("x", "y"), None)],
             P(("y", "x"), None), mesh_shape=FA.MESH_XY, axes=("x", "y")))
fixture("fa_logsumexp_min_shift_shard_map", "vocab-parallel logsumexp shifted by pmin of the local minima "
        "(a valid shift, not the usual max) against jax.nn.logsumexp (correct)")(
    _fa_pair(FA.logsumexp_ref, FA.logsumexp_min_shift_body, [(8, 64)], ["x"], [P(None, "x")], P()))


@fixture("fa_cumsum_sharded_dim_shardy", "jnp.cumsum over the dim sharded over x (8 devices), Shardy, vs "
         "the module after SPMD partitioning (correct)")
def _fa_cumsum(name: str) -> Built:
    mesh = make_mesh((false_alarms.N,), ("x",))
    return partitioned_pair(name, FA.cumsum_rows, mesh, _fa_normal(name, (32, 4)), ["x"], [P("x", None)],
                            P("x", None))


@fixture("fa_scale_rows_replicated_in_shardy", "x * 2 with x replicated and the output rows split over y "
         "(2x4 mesh), Shardy: the partitioner slices with a partition-id indexed offset table (correct)")
def _fa_scale_rows(name: str) -> Built:
    mesh = make_mesh(FA.MESH_XY, ("x", "y"))
    return partitioned_pair(name, FA.scale_rows, mesh, _fa_normal(name, (32, 4)), ["x"], [P()], P("y", None))


@fixture("fa_allreduce_groups_permuted_mutated", "megatron_mlp_shardy after.hlo with the tp all-reduce's "
         "groups {{0,1,2,3},{4,5,6,7}} reordered within each group to {{2,0,3,1},{5,7,4,6}}: same sums")
def _fa_groups_permuted(name: str) -> Built:
    base = build("megatron_mlp_shardy")
    text = base.after_text
    old, new_groups = "{{0,1,2,3},{4,5,6,7}}", "{{2,0,3,1},{5,7,4,6}}"
    target, idx, line = sole_instruction(text, "all-reduce", re.escape(f"replica_groups={old}"),
                                         f"all-reduce over {old}")
    new = replace_line(text, idx, line.replace(f"replica_groups={old}", f"replica_groups={new_groups}"))
    return _fa_mutated(name, "megatron_mlp_shardy", new,
                       f"all-reduce {target}: replica_groups {old} -> {new_groups} (same members per group)")


@fixture("fa_offset_table_clamped_mutated", "fa_scale_rows_replicated_in_shardy after.hlo with the largest "
         "entry of the row-offset table raised past rows - rows_local: dynamic-slice clamps it back")
def _fa_offset_clamped(name: str) -> Built:
    base_name = "fa_scale_rows_replicated_in_shardy"
    text = build(base_name).after_text
    # The table is indexed (dynamic-slice + reshape) to give the row start of the dynamic-slice of the input.
    slices = [n for n in hlo_instructions(text, "dynamic-slice")
              if re.search(r"dynamic-slice\(%param, ", hlo_instruction_line(text, n)[1])]
    assert len(slices) == 1, f"expected one dynamic-slice of the input, got {slices}"
    line = hlo_instruction_line(text, slices[0])[1]
    m = re.search(r"dynamic-slice\(%param, (%[\w.\-]+), %[\w.\-]+\), dynamic_slice_sizes=\{(\d+),", line)
    assert m, line
    rows_local = int(m.group(2))
    rows = int(re.search(r"%param = f32\[(\d+),", text).group(1))  # type: ignore[union-attr]
    start_line = hlo_instruction_line(text, m.group(1))[1]  # reshape(dynamic-slice(table, index))
    pick = re.search(r"reshape\((%[\w.\-]+)\)", start_line)
    assert pick, start_line
    table = re.search(r"dynamic-slice\((%[\w.\-]+), ", hlo_instruction_line(text, pick.group(1))[1])
    assert table
    tidx, tline = hlo_instruction_line(text, table.group(1))
    values_m = re.search(r"constant\(\{([^}]*)\}\)", tline)
    assert values_m, tline
    values = [int(v) for v in values_m.group(1).split(",")]
    limit = rows - rows_local  # dynamic-slice clamps a start into [0, limit]
    assert max(values) == limit, f"table {values}: the last block does not start at {limit}"
    changed = [v if v != limit else limit + rows_local // 2 for v in values]
    new = replace_line(text, tidx, tline.replace(values_m.group(0),
                                                 "constant({" + ", ".join(map(str, changed)) + "})"))
    return _fa_mutated(name, base_name, new, f"offset table {table.group(1)} {values} -> {changed}: starts past "
                       f"{limit} are clamped to {limit} by dynamic-slice")


# ------------------------------------------ symbolic layouts (issue 12): blocks in another order than split
# Programs: tools/programs/symbolic_layouts.py. Correct pairs and their `# BUG:` twins (wrong axis order,
# wrong dim, out_specs that keep the blocks where the reference moves them).


def _sl_pair(ref: Callable[..., Any], body: Callable[..., Any], specs: Sequence[Any], out_spec: Any, *,
             two_axes: bool = True, shapes: Sequence[tuple[int, ...]] = ((64, 4),),
             argnames: Sequence[str] = ("x",)) -> Callable[[str], Built]:
    """A shard_map pair on a float32 normal input over the 2 x 4 mesh ("x", "y") (or 8 devices on "x");
    a bug pair when `body` has a `# BUG:` line. check_vma is off: JAX cannot see that a gathered value is
    the same on every device."""
    def fn(name: str) -> Built:
        mesh = make_mesh(SL.MESH_XY, ("x", "y")) if two_axes else make_mesh((SL.N,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec, check_vma=False))
        return shard_map_pair(name, ref, impl, mesh, _fa_normal(name, *shapes), list(argnames), specs,
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


SL = symbolic_layouts
fixture("sl_psum_major_axis_shard_map", "psum over x of rows split over (x, y), out_specs P(y): the blocks "
        "of the major axis summed, the minor axis's kept (correct)")(
    _sl_pair(SL.fold_major_ref, SL.fold_major_body, [P(("x", "y"), None)], P("y", None)))
fixture("sl_psum_minor_axis_shard_map", "psum over y (the minor axis of the rows' split) where the reference "
        "sums the blocks of x")(
    _sl_pair(SL.fold_major_ref, SL.fold_minor_body, [P(("x", "y"), None)], P("y", None)))
fixture("sl_gather_xy_untiled_shard_map", "all_gather(tiled=False) over (x, y) of rows split over (x, y), "
        "reshaped back to the whole (correct)")(
    _sl_pair(SL.tanh2_ref, SL.gather_xy_untiled_body, [P(("x", "y"), None)], P()))
fixture("sl_gather_yx_untiled_shard_map", "all_gather(tiled=False) over (y, x) of rows split over (x, y), "
        "reshaped as if the group order were the block order")(
    _sl_pair(SL.tanh2_ref, SL.gather_yx_untiled_body, [P(("x", "y"), None)], P()))
fixture("sl_gather_yx_untiled_reordered_shard_map", "all_gather(tiled=False) over (y, x) of rows split over "
        "(x, y), the gathered dim put back in (x, y) order before the merge (correct)")(
    _sl_pair(SL.tanh2_ref, SL.gather_yx_untiled_reordered_body, [P(("x", "y"), None)], P()))
fixture("sl_gather_y_untiled_shard_map", "all_gather(tiled=False) over the minor axis y of rows split over "
        "(x, y), merged: rows split over x, out_specs P(x) (correct)")(
    _sl_pair(SL.tanh2_ref, SL.gather_y_untiled_body, [P(("x", "y"), None)], P("x", None)))
fixture("sl_gather_untiled_swapped_shard_map", "all_gather(tiled=False) over x, the two leading dims swapped "
        "before the merge (rows interleaved)")(
    _sl_pair(SL.tanh2_ref, SL.gather_untiled_swapped_body, [P("x", None)], P(), two_axes=False))
fixture("sl_sum_gather_wrong_dim_shard_map", "sum of all_gather(x) over dim 1 (inside the blocks) where the "
        "block sum is over the gathered dim 0")(
    _sl_pair(SL.block_sum_ref, SL.sum_gather_wrong_dim_body, [P("x", None)], P(), two_axes=False))
fixture("sl_out_specs_yx_kept_shard_map", "sin with in_specs and out_specs P(('x','y')) against a reference "
        "that transposes the block grid (the out_specs P(('y','x')) were meant)")(
    _sl_pair(SL.blocks_transposed_sin_ref, SL.sin_blocks_kept_body, [P(("x", "y"), None)], P(("x", "y"), None)))
fixture("sl_out_specs_yx_replicated_x_shard_map", "x + 1 with x split over y alone and out_specs "
        "P(('y','x')): each y-block twice in a row (correct)")(
    _sl_pair(SL.repeat_y_blocks_ref, SL.plus_one_body, [P("y", None)], P(("y", "x"), None)))
fixture("sl_out_specs_xy_replicated_x_shard_map", "x + 1 with x split over y alone and out_specs "
        "P(('x','y')) (the whole x twice) against a reference repeating each block")(
    _sl_pair(SL.repeat_y_blocks_ref, SL.plus_one_tiled_body, [P("y", None)], P(("x", "y"), None)))
fixture("sl_out_specs_tile_shard_map", "tanh of rows split over x, out_specs P(('y','x')) over the copies "
        "held along y: jnp.tile of the whole (correct)")(
    _sl_pair(SL.tile_rows_ref, SL.tanh_body, [P("x", None)], P(("y", "x"), None), shapes=[(8, 4)]))
fixture("sl_out_specs_tile_repeated_shard_map", "tanh of rows split over x, out_specs P(('x','y')) repeat each "
        "block where the reference tiles the whole")(
    _sl_pair(SL.tile_rows_ref, SL.tanh_blocks_repeated_body, [P("x", None)], P(("x", "y"), None), shapes=[(8, 4)]))
fixture("sl_gather_out_specs_concat_shard_map", "all_gather over y of x split P(y, x), out_specs "
        "P(None, ('y','x')): jnp.concatenate of copies of x (correct)")(
    _sl_pair(SL.concat_columns_ref, SL.gather_rows_body, [P("y", "x")], P(None, ("y", "x")), shapes=[(8, 8)]))
fixture("sl_gather_out_specs_repeated_shard_map", "all_gather over y of x split P(y, x), out_specs "
        "P(None, ('x','y')) repeat each column block where the reference concatenates copies of x")(
    _sl_pair(SL.concat_columns_ref, SL.gather_rows_repeated_body, [P("y", "x")], P(None, ("x", "y")),
             shapes=[(8, 8)]))
fixture("sl_out_specs_swapped_transpose_shard_map", "blocks of P(x, y) transposed, out_specs P(y, x): the "
        "whole transpose (correct)")(
    _sl_pair(SL.sin_transposed_ref, SL.sin_transposed_body, [P("x", "y")], P("y", "x"), shapes=[(8, 8)]))
fixture("sl_out_specs_swapped_reshape_shard_map", "blocks of P(x, y) reshaped to the transposed shape, out_specs "
        "P(y, x), against the whole transpose")(
    _sl_pair(SL.sin_transposed_ref, SL.sin_reshaped_body, [P("x", "y")], P("y", "x"), shapes=[(8, 8)]))
fixture("sl_out_specs_swapped_grid_shard_map", "cos of x split P(x, y) returned with out_specs P(y, x): block "
        "(i, j) at block (j, i) of a [16, 4] tensor (correct)")(
    _sl_pair(SL.block_grid_swapped_ref, SL.cos_body, [P("x", "y")], P("y", "x"), shapes=[(8, 8)]))
fixture("sl_out_specs_swapped_grid_rows_shard_map", "cos of x split P(x, y) with each block's rows reversed, "
        "out_specs P(y, x), against the block permutation of cos(x)")(
    _sl_pair(SL.block_grid_swapped_ref, SL.cos_rows_swapped_body, [P("x", "y")], P("y", "x"), shapes=[(8, 8)]))
fixture("sl_collective_matmul_wrong_direction_shard_map", "collective matmul whose ring sends i -> i-1 while the "
        "lhs column blocks (idx - k) mod n are taken for i -> i+1")(
    _sl_pair(SL.matmul_ref, SL.collective_matmul_wrong_direction_body, [P("x", None), P("x", None)],
             P("x", None), two_axes=False, shapes=[(16, 16), (16, 4)], argnames=["lhs", "rhs"]))
fixture("sl_collective_matmul_step_two_shard_map", "collective matmul whose ring sends i -> i+2 while the "
        "lhs column blocks are taken for i -> i+1")(
    _sl_pair(SL.matmul_ref, SL.collective_matmul_step_two_body, [P("x", None), P("x", None)],
             P("x", None), two_axes=False, shapes=[(16, 16), (16, 4)], argnames=["lhs", "rhs"]))


# --------------------------------------------- corpus (issue 13): Flax models and optax steps as users write them
# Programs: tools/programs/flax_models.py, tools/programs/optax_steps.py. jit + Shardy pairs (a partitioner
# keeps a program's meaning whatever its sharding constraints, so their buggy twins are edits of after.hlo),
# and a data-parallel shard_map step with its missing-psum twin.

FM, OS = flax_models, optax_steps


@fixture("flax_nnx_lm_shardy", "Flax nnx language model: embedding, 2 pre-LayerNorm blocks (MultiHeadAttention, "
         "causal mask, GELU MLP), final LayerNorm, tied-embedding logits; heads, MLP and vocab over tp, batch over "
         "dp, Shardy, vs the module after SPMD partitioning")
def _flax_nnx_lm(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    args = FM.init_nnx(FM.TINY, rng_for(name))
    in_specs, out_spec = FM.nnx_specs(args[0])
    return partitioned_pair(name, FM.nnx_lm, mesh, args, ["params", "ids"], in_specs, out_spec)


@fixture("flax_linen_block_shardy", "Flax linen block: RMSNorm, MultiHeadDotProductAttention (causal), SiLU MLP; "
         "heads and MLP over tp, batch over dp, Shardy, vs the module after SPMD partitioning")
def _flax_linen_block(name: str) -> Built:
    mesh = make_mesh((2, 4), ("dp", "tp"))
    args = FM.init_linen(FM.TINY, rng_for(name))
    in_specs, out_spec = FM.linen_specs(args[0])
    return partitioned_pair(name, FM.linen_block, mesh, args, ["params", "x"], in_specs, out_spec)


def _optax_step(opt_name: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("fsdp", "tp"))
        args = OS.init(opt_name, rng_for(name))
        in_specs, out_specs = OS.specs(args)
        step = OS.mixed_step if opt_name == "mixed" else OS.step_of(opt_name)
        return partitioned_pair(name, step, mesh, args, ["params", "opt_state", "x", "y"], in_specs, out_specs,
                                keep_unused=opt_name == "adafactor")

    return fn


_OPTAX_STEP = ("training step of a small MLP (MSE, value_and_grad, opt.update, apply_updates) with FSDPxTP params "
               "and moments, batch over fsdp, Shardy, vs the module after SPMD partitioning: ")
fixture("optax_sgd_momentum_schedule_shardy", _OPTAX_STEP + "optax.sgd with momentum 0.9 and a cosine decay "
        "schedule (int32 step count)")(_optax_step("sgd_momentum_schedule"))
fixture("optax_adam_shardy", _OPTAX_STEP + "optax.adam")(_optax_step("adam"))
fixture("optax_adamw_masked_shardy", _OPTAX_STEP + "optax.adamw with weight decay masked to the "
        "kernels")(_optax_step("adamw_masked"))
fixture("optax_clip_adamw_shardy", _OPTAX_STEP + "optax.chain(clip_by_global_norm, adamw)")(_optax_step("clip_adamw"))
fixture("optax_lion_shardy", _OPTAX_STEP + "optax.lion with weight decay (sign of the interpolated "
        "moment)")(_optax_step("lion"))
fixture("optax_adafactor_shardy", _OPTAX_STEP + "optax.adafactor with factored second moments "
        "(min_dim_size_to_factor=4)")(_optax_step("adafactor"))
fixture("optax_mixed_precision_shardy", _OPTAX_STEP + "bf16 copies of f32 master weights, dots accumulating in "
        "f32, an f32 RMSNorm, adamw on the masters")(_optax_step("mixed"))


def _optax_lion_dp(variant: str) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((4, 2), ("dp", "tp"))
        args = OS.init("lion", rng_for("optax_lion_dp"))
        in_specs, _ = OS.dp_specs(args[1])
        return shard_map_pair(name, OS.step_of("lion"), OS.shard_map_lion(mesh, args[1], variant), mesh, args,
                              ["params", "opt_state", "x", "y"], in_specs,
                              None if variant == "correct" else OS.LION_VARIANTS[variant])

    return fn


fixture("optax_lion_dp_shard_map", "data-parallel optax.lion step in shard_map (params and state replicated, batch "
        "over dp of a 4x2 dp x tp mesh): local loss = sum of per-example losses / global batch, psum of grads and "
        "loss over dp, then the Lion update (correct)")(_optax_lion_dp("correct"))
fixture("optax_lion_dp_shard_map_no_grad_psum", "data-parallel optax.lion step feeding each shard's own gradients "
        "to the optimizer (no psum over dp)")(_optax_lion_dp("no_grad_psum"))


def _allreduce_groups_changed(name: str, base_name: str, op_name: str, old: str, new: str, what: str) -> Built:
    """``base``'s after.hlo with the one all-reduce from `op_name` over groups `old` moved to groups `new`."""
    text = build(base_name).after_text
    targets = [n for n in hlo_instructions(text, "all-reduce")
               if f"replica_groups={old}," in (line := hlo_instruction_line(text, n)[1]) and op_name in line]
    assert targets, f"{name}: no all-reduce from {op_name} over {old}"
    idx, line = hlo_instruction_line(text, targets[0])
    new_text = replace_line(text, idx, line.replace(f"replica_groups={old},", f"replica_groups={new},"))
    return mutated(name, base_name, new_text, targets[0], f"all-reduce {targets[0]} ({what}): replica_groups {old} "
                   f"changed to {new}")


@fixture("mut_optax_adamw_grad_allreduce_wrong_axis", "optax_adamw_masked_shardy after.hlo with the first weight "
         "gradient all-reduce (partial sums over the fsdp-split batch) moved from the fsdp groups to the tp groups")
def _mut_optax_grad_axis(name: str) -> Built:
    return _allreduce_groups_changed(name, "optax_adamw_masked_shardy", "transpose(jvp())/dot_general",
                                     "[4,2]<=[2,4]T(1,0)", "[2,4]<=[8]", "a weight gradient summed over fsdp")


@fixture("mut_optax_adamw_bias_grad_allreduce_wrong_axis", "optax_adamw_masked_shardy after.hlo with the hidden "
         "bias gradient's all-reduce (a sum over the fsdp-split batch) moved from the fsdp groups to the tp groups")
def _mut_optax_bias_grad_axis(name: str) -> Built:
    return _allreduce_groups_changed(name, "optax_adamw_masked_shardy", "transpose(jvp())/reduce_sum",
                                     "mesh['axis_0'=2,'axis_1'=4] {'axis_0'}", "mesh['axis_0'=2,'axis_1'=4] {'axis_1'}",
                                     "the hidden bias gradient summed over fsdp")


@fixture("mut_flax_linen_attn_allreduce_wrong_axis", "flax_linen_block_shardy after.hlo with the attention-output "
         "all-reduce (partial sums over the tp-split heads) moved from the tp groups to the dp groups")
def _mut_linen_attn_axis(name: str) -> Built:
    return _allreduce_groups_changed(name, "flax_linen_block_shardy", "attn/out/dot_general",
                                     "{{0,1,2,3},{4,5,6,7}}", "{{0,4},{1,5},{2,6},{3,7}}",
                                     "attention heads summed over tp")


# ------------------------------------------------ a production-shaped train step (tools/programs/prod_train.py)


def _prod_train(shardy: bool) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((2, 4), ("fsdp", "tp"))
        args = prod_train.init(rng_for("prod_train"))
        in_specs, out_specs = prod_train.specs(args[1])
        return partitioned_pair(name, prod_train.step, mesh, args, ["params", "opt_state", "ids", "labels"],
                                in_specs, out_specs, shardy=shardy)

    return fn


_PROD_TRAIN = ("a production-shaped train step (embedding lookup by ids, lax.scan over 3 decoder layers, tied "
               "logits, integer-label cross-entropy, AdamW; embedding vocab over tp and width over fsdp, "
               "column/row-parallel layers, ZeRO-1 moments, batch over fsdp on a 2x4 mesh) vs the module after "
               "SPMD partitioning, ")
fixture("prod_train_zero1_shardy", _PROD_TRAIN + "Shardy")(_prod_train(shardy=True))


@fixture("prod_embed_grad_scatter_shardy", "SGD on a tied-embedding LM without layers (logits = embed[ids] @ "
         "embed.T, integer-label cross-entropy), embedding width over tp, batch over fsdp on a 2x4 mesh, Shardy: "
         "the embedding gradient is each device's scatter-add of its batch rows into zeros, summed over fsdp")
def _prod_embed_grad(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    r = rng_for(name)
    tokens = (prod_train.BATCH, prod_train.SEQ)
    args = [(r.standard_normal((prod_train.VOCAB, prod_train.WIDTH)) * 0.1).astype(np.float32),
            r.integers(0, prod_train.VOCAB, tokens).astype(np.int32), r.integers(0, prod_train.VOCAB, tokens).astype(np.int32)]
    in_specs, out_specs = prod_train.lookup_specs()
    return partitioned_pair(name, prod_train.lookup_step, mesh, args, ["embed", "ids", "labels"], in_specs, out_specs)


@fixture("mut_prod_embed_grad_allreduce_wrong_axis", "prod_embed_grad_scatter_shardy after.hlo with the all-reduce "
         "of the embedding gradient's scatter-add (partial sums over the fsdp-split batch) moved to the tp groups")
def _mut_prod_embed_grad(name: str) -> Built:
    return _allreduce_groups_changed(name, "prod_embed_grad_scatter_shardy", "scatter-add", "[4,2]<=[2,4]T(1,0)",
                                     "[2,4]<=[8]", "the embedding gradient summed over fsdp")


@fixture("fused_glu_split_tp_shardy", "a SwiGLU MLP whose fused gate/up weight is split in two after the matmul, "
         "the fused dim over tp (2x4 fsdp x tp mesh), Shardy: XLA exchanges half-blocks with collective-permutes "
         "and selects")
def _fused_glu(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    r = rng_for(name)
    args = [r.standard_normal((8, 16)).astype(np.float32), r.standard_normal((16, 64)).astype(np.float32),
            r.standard_normal((32, 16)).astype(np.float32)]
    in_specs, out_specs = prod_train.fused_glu_specs()
    return partitioned_pair(name, prod_train.fused_glu_mlp, mesh, args, ["x", "w13", "w2"], in_specs, out_specs)


@fixture("mut_prod_train_relayout_permute_swapped", "prod_train_zero1_shardy after.hlo with two targets of the "
         "first collective-permute (the token ids moved from the fsdp-split batch to another layout before the "
         "embedding lookup) swapped: two devices keep their own ids")
def _mut_prod_train_permute(name: str) -> Built:
    text = build("prod_train_zero1_shardy").after_text
    target = hlo_instructions(text, "collective-permute")[0]
    idx, line = hlo_instruction_line(text, target)
    pairs = re.search(r"source_target_pairs=\{(.*?)\}\}", line)
    assert pairs is not None, f"{name}: no source_target_pairs on {target}"
    listed = [tuple(int(v) for v in p.split(",")) for p in re.findall(r"\{(\d+,\d+)", pairs.group(0))]
    # the first device that sends elsewhere, and the device it sends to, each keep their own block instead
    a = next(i for i, (s, t) in enumerate(listed) if s != t)
    b = next(i for i, (s, _) in enumerate(listed) if s == listed[a][1])
    listed[a], listed[b] = (listed[a][0], listed[b][1]), (listed[b][0], listed[a][1])
    new_pairs = "source_target_pairs={" + ",".join(f"{{{s},{t}}}" for s, t in listed) + "}"
    new_text = replace_line(text, idx, line.replace(pairs.group(0), new_pairs))
    return mutated(name, "prod_train_zero1_shardy", new_text, target,
                   f"collective-permute {target}: devices {listed[a][0]} and {listed[b][0]} keep their blocks instead of "
                   "exchanging them")


# ------------------------------------------------ op coverage (issue 14): argmax, pooling, cumsum
# Programs: tools/programs/ops_coverage.py. shard_map pairs with `# BUG:` twins, and XLA's partitioning of
# the same functions over a split dim (with a text mutation as the twin).


def _oc_pair(ref: Callable[..., Any], body: Callable[..., Any], shape: tuple[int, ...],
             spec: Any, out_spec: Any = None) -> Callable[[str], Built]:
    """A shard_map pair on one float32 normal input over 8 devices on "x"; a bug pair when `body` has a
    `# BUG:` line. check_vma is off: JAX cannot see that a reduce of gathered values is the same on every
    device."""
    def fn(name: str) -> Built:
        mesh = make_mesh((OC.N,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(spec,), out_specs=spec if out_spec is None else out_spec,
                                     check_vma=False))
        return shard_map_pair(name, ref, impl, mesh, _fa_normal(name, shape), ["x"], [spec],
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


def _oc_partitioned(ref: Callable[..., Any], shape: tuple[int, ...], spec: Any, out_spec: Any, *,
                    shardy: bool = True) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh(OC.MESH_2D, ("dp", "tp"))
        return partitioned_pair(name, ref, mesh, _fa_normal(name, shape), ["x"], [spec], out_spec, shardy=shardy)

    return fn


OC = ops_coverage
ROWS = P("x", None)
NHWC = P("x", None, None, None)
fixture("oc_argmax_rows_shard_map", "jnp.argmax over a dim whole on every device, rows split over x "
        "(correct)")(_oc_pair(OC.argmax_rows_ref, OC.argmax_rows_body, (16, 32), ROWS, P("x")))
fixture("oc_argmax_rows_argmin_shard_map", "argmin where the reference takes argmax, rows split over x")(
    _oc_pair(OC.argmax_rows_ref, OC.argmax_rows_argmin_body, (16, 32), ROWS, P("x")))
fixture("oc_argmax_split_dim_shard_map", "argmax over the dim split over x by hand: each device's best "
        "(value, global index), all_gather of both, the same lax.reduce over them (correct)")(
    _oc_pair(OC.argmax_cols_ref, OC.argmax_split_body, (16, 32), P(None, "x"), P()))
fixture("oc_argmax_split_dim_local_ids_shard_map", "argmax over the split dim by hand with local indices "
        "(the shard offset missing)")(
    _oc_pair(OC.argmax_cols_ref, OC.argmax_split_local_ids_body, (16, 32), P(None, "x"), P()))
fixture("oc_group_argmax_shard_map", "argmax of each device's own column block returned per device "
        "(keepdims, out_specs split like in_specs): the argmax inside each group of columns (correct)")(
    _oc_pair(OC.group_argmax_ref, OC.group_argmax_body, (16, 32), P(None, "x")))
fixture("oc_group_argmax_global_shard_map", "argmax of each device's own column block with the block's "
        "offset added: the global column where the reference wants the index inside the group")(
    _oc_pair(OC.group_argmax_ref, OC.group_argmax_global_body, (16, 32), P(None, "x")))
fixture("oc_odd_cols_shard_map", "x[:, 1::2] of columns split over x in blocks of even width (correct)")(
    _oc_pair(OC.odd_cols_ref, OC.odd_cols_body, (16, 32), P(None, "x")))
fixture("oc_odd_cols_even_shard_map", "x[:, ::2] where the reference takes x[:, 1::2], columns split over x")(
    _oc_pair(OC.odd_cols_ref, OC.odd_cols_even_body, (16, 32), P(None, "x")))
fixture("oc_odd_cols_gspmd", "x[:, 1::2] of columns split over tp (2x4 mesh), GSPMD: each device slices its "
        "block's odd columns (correct)")(
    _oc_partitioned(OC.odd_cols_ref, (8, 32), P("dp", "tp"), P("dp", "tp"), shardy=False))


fixture("oc_greedy_pmax_pmin_shard_map", "argmax of vocab-split logits by hand: the blocks' max and argmax, "
        "pmax of the maxima, pmin of the global indices where it is reached (correct)")(
    _oc_pair(OC.greedy_ref, OC.greedy_body, (64,), P("x"), P()))
fixture("oc_prefix_sum_split_cols_shard_map", "cumsum along columns split over x: each block's cumsum plus the "
        "totals of the blocks before it, gathered and masked by axis_index (correct)")(
    _oc_pair(OC.prefix_sum_ref, OC.prefix_sum_body, (4, 32), P(None, "x")))
fixture("oc_prefix_sum_inclusive_shard_map", "cumsum along split columns adding the totals of the blocks up to and "
        "including its own")(_oc_pair(OC.prefix_sum_ref, OC.prefix_sum_inclusive_body, (4, 32), P(None, "x")))
fixture("oc_scan_cumsum_rows_shard_map", "cumsum down the rows by lax.scan, columns split over x (correct)")(
    _oc_pair(OC.rows_cumsum_ref, OC.scan_cumsum_body, (8, 32), P(None, "x")))
fixture("oc_lax_map_rows_shard_map", "lax.map over rows split over x: each device's loop over its rows "
        "against the reference's loop over all (correct)")(_oc_pair(OC.map_rows, OC.map_rows, (16, 8), ROWS))
fixture("oc_lax_map_rows_max_shard_map", "lax.map over split rows adding the row max where the reference adds "
        "the row sum")(_oc_pair(OC.map_rows, OC.map_rows_body_shifted, (16, 8), ROWS))
fixture("oc_ppermute_permuted_blocks_shard_map", "a ppermute by an arbitrary permutation of the row blocks "
        "against jnp.take of the blocks (correct)")(_oc_pair(OC.permuted_blocks_ref, OC.permuted_blocks_body, (16, 8),
                                                             ROWS))
fixture("oc_ppermute_permuted_blocks_inverse_shard_map", "the inverse permutation where the reference takes the "
        "blocks")(_oc_pair(OC.permuted_blocks_ref, OC.permuted_blocks_inverse, (16, 8), ROWS))
fixture("oc_onehot_all_gather_shard_map", "an all-gather as the psum of zero buffers each device writes its block "
        "into (correct)")(_oc_pair(OC.onehot_gather_ref, OC.onehot_gather_body, (16, 8), ROWS, P()))
fixture("oc_onehot_all_gather_pmax_shard_map", "the zero buffers combined by pmax")(
    _oc_pair(OC.onehot_gather_ref, OC.onehot_gather_pmax, (16, 8), ROWS, P()))
fixture("oc_onehot_all_gather_shifted_shard_map", "each device's block written at the next device's place "
        "(the fuzzer's crash: a permuted offset table)")(
    _oc_pair(OC.onehot_gather_ref, OC.onehot_gather_shifted, (16, 8), ROWS, P()))
fixture("oc_ring_decay_fori_shard_map", "a ring of ppermutes in a fori_loop against a roll by a traced shift "
        "(correct)")(_oc_pair(OC.ring_decay_ref, OC.ring_decay_body, (16, 8), ROWS))


@fixture("oc_group_argmax_gspmd", "argmax of each device's own column block returned per device, the shard_map "
         "lowered with Shardy off: SPMDShardToFullShape reads the block results (correct)")
def _oc_group_argmax_gspmd(name: str) -> Built:
    return _gspmd_body_pair(name, OC.group_argmax_ref, OC.group_argmax_body, make_mesh((OC.N,), ("x",)),
                            _fa_normal(name, (16, 32)), ["x"], [P(None, "x")], P(None, "x"))


fixture("oc_argmax_split_dim_shardy", "jnp.argmax over the dim split over tp (2x4 mesh), Shardy: a local "
        "variadic reduce with global indices, all-gathers of the block results, the same reduce over them "
        "(correct)")(_oc_partitioned(OC.argmax_cols_ref, (8, 32), P("dp", "tp"), P("dp")))
fixture("oc_argmin_split_dim_shardy", "jnp.argmin over the dim split over tp (2x4 mesh), Shardy (correct)")(
    _oc_partitioned(OC.argmin_cols_ref, (8, 32), P("dp", "tp"), P("dp")))


@fixture("oc_argmax_split_dim_local_index_mutated", "oc_argmax_split_dim_shardy after.hlo with the block "
         "reduce's indices local (the iota without the shard offset)")
def _oc_argmax_local_index(name: str) -> Built:
    text = build("oc_argmax_split_dim_shardy").after_text
    bcast, idx, line = sole_instruction(text, "broadcast", r"s32\[4,8\]\{1,0\} broadcast\(%add\)",
                                        "broadcast of the offset iota")
    iotas = hlo_instructions(text, "iota")
    assert len(iotas) == 1, iotas
    new = replace_line(text, idx, line.replace("broadcast(%add)", f"broadcast({iotas[0]})"))
    return mutated(name, "oc_argmax_split_dim_shardy", new, bcast,
                   f"{bcast}: the block indices without the shard offset (local, not global)")


fixture("oc_avg_pool_shard_map", "2x2 average pooling (reduce_window add, stride 2) of NHWC, batch split "
        "over x (correct)")(_oc_pair(OC.avg_pool_ref, OC.avg_pool_body, (8, 8, 8, 4), NHWC))
fixture("oc_avg_pool_max_shard_map", "average pooling with a max window where the sum belongs")(
    _oc_pair(OC.avg_pool_ref, OC.avg_pool_max_body, (8, 8, 8, 4), NHWC))
fixture("oc_max_pool_shard_map", "3x3 max pooling, stride 1, SAME padding, batch split over x (correct)")(
    _oc_pair(OC.max_pool_ref, OC.max_pool_body, (8, 8, 8, 4), NHWC))
fixture("oc_max_pool_shifted_shard_map", "3x3 max pooling padded after the pixels instead of around "
        "them")(_oc_pair(OC.max_pool_ref, OC.max_pool_shifted_body, (8, 8, 8, 4), NHWC))
fixture("oc_cumsum_cols_shard_map", "jnp.cumsum along a dim whole on every device, rows split over x "
        "(correct)")(_oc_pair(OC.cumsum_cols_ref, OC.cumsum_cols_body, (16, 32), ROWS))
fixture("oc_cumsum_cols_reversed_shard_map", "a reversed cumsum where the reference takes prefix sums")(
    _oc_pair(OC.cumsum_cols_ref, OC.cumsum_cols_reversed_body, (16, 32), ROWS))
fixture("oc_sort_cols_shard_map", "jnp.sort along a dim whole on every device, rows split over x (correct)")(
    _oc_pair(OC.sort_cols_ref, OC.sort_cols_body, (16, 32), ROWS))
fixture("oc_sort_cols_descending_shard_map", "a descending sort where the reference sorts ascending")(
    _oc_pair(OC.sort_cols_ref, OC.sort_cols_descending_body, (16, 32), ROWS))
fixture("oc_top_k_rows_shard_map", "lax.top_k (k=4) of each whole row, rows split over x: values and "
        "indices (correct)")(_oc_pair(OC.top_k_ref, OC.top_k_body, (16, 32), ROWS, (ROWS, ROWS)))
fixture("oc_top_k_smallest_shard_map", "top_k of the negated rows: the 4 smallest where the largest are "
        "meant")(_oc_pair(OC.top_k_ref, OC.top_k_smallest_body, (16, 32), ROWS, (ROWS, ROWS)))
fixture("oc_cumsum_split_two_axes_shardy", "jnp.cumsum over rows split over dp and tp together (8 blocks), "
        "Shardy: a padded all-gather sliced at 4 × the device's index")(
    _oc_partitioned(OC.cumsum_rows_ref, (32, 6), P(("dp", "tp"), None), P(("dp", "tp"), None)))
@fixture("oc_special_functions_shardy", "erf, erf_inv, lgamma, digamma, tan, reduce_precision and an "
         "optimization barrier of a value split over dp x tp, Shardy")
def _oc_special(name: str) -> Built:
    built = _oc_partitioned(OC.special_functions_ref, (8, 16), P("dp", "tp"), P("dp", "tp"))(name)
    # (jax 0.12 computes gammaln itself, a table lookup and polynomials: no chlo.lgamma there)
    for op in ("chlo.erf ", "chlo.erf_inv", "chlo.digamma", "tan", "reduce_precision", "optimization_barrier"):
        assert op in built.before_text, f"{name}: {op} is not in the lowered reference"
    return built


@fixture("oc_fp8_matmuls_shardy", "an fp8 e4m3 matmul accumulating in f32 and an e5m2 round trip before a "
         "matmul, x rows over dp and its columns over tp (the contraction: partial sums), Shardy")
def _oc_fp8(name: str) -> Built:
    mesh = make_mesh(OC.MESH_2D, ("dp", "tp"))
    built = partitioned_pair(name, OC.fp8_matmuls_ref, mesh, _fa_normal(name, (16, 32), (32, 8)), ["x", "w"],
                             [P("dp", "tp"), P("tp", None)], (P("dp", None), P("dp", None)))
    assert "f8E4M3FN" in built.before_text and "f8E5M2" in built.before_text, f"{name}: no fp8 converts"
    return built


fixture("oc_cummax_split_dim_gspmd", "lax.cummax over rows split over tp, columns over dp, GSPMD")(
    _oc_partitioned(OC.cummax_rows_ref, (16, 6), P("tp", "dp"), P("tp", "dp"), shardy=False))
fixture("oc_roll_split_dim_gspmd", "jnp.roll by 3 rows of rows split over dp x tp (8 blocks of 4), GSPMD: "
        "edge rows sent cyclically to the next device")(
    _oc_partitioned(OC.roll_rows_ref, (32, 6), P(("dp", "tp"), None), P(("dp", "tp"), None), shardy=False))
@fixture("oc_scatter_add_split_rows_gspmd", "x.at[idx].add(v) into rows split over dp x tp (8 blocks), indices "
         "and updates replicated (some negative: counted from the end), GSPMD")
def _oc_scatter_rows(name: str) -> Built:
    mesh = make_mesh(OC.MESH_2D, ("dp", "tp"))
    rng = rng_for(name)
    x, v = rng.standard_normal((32, 6)).astype(np.float32), rng.standard_normal((10, 6)).astype(np.float32)
    idx = rng.integers(-32, 32, size=(10,)).astype(np.int32)
    return partitioned_pair(name, OC.scatter_add_rows_ref, mesh, [x, idx, v], ["x", "idx", "v"],
                            [P(("dp", "tp"), None), P(None), P(None, None)], P(("dp", "tp"), None), shardy=False)


fixture("oc_flip_split_dim_shardy", "jnp.flip of rows split over tp, Shardy: the blocks' order reversed by a "
        "collective-permute, each block reversed")(
    _oc_partitioned(OC.flip_rows_ref, (16, 6), P("tp", None), P("tp", None)))



# ------------------------------------------------------------ sort / top-k along a split dim (issue 14)
# Programs: tools/programs/sorting.py. XLA's partitioning of sort, argsort and top_k with the sorted dim
# split over tp (2 x 4 mesh), text mutations as twins; distributed top-k by hand in a shard_map with its
# `# BUG:` twins. Inputs are small integers as floats: many ties, which the merge must break as the
# reference does (the lower index first).

ST = sorting


def _st_ties(name: str, shape: tuple[int, ...]) -> list[np.ndarray]:
    return [rng_for(name).integers(0, 8, size=shape).astype(np.float32)]


def _st_partitioned(ref: Callable[..., Any], out_spec: Any, shardy: bool = True,
                    compiled: bool = False) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh(ST.MESH_2D, ("dp", "tp"))
        return partitioned_pair(name, ref, mesh, _st_ties(name, (8, 32)), ["x"], [P("dp", "tp")], out_spec,
                                shardy=shardy, compiled_text=compiled)

    return fn


def _st_shard_map(body: Callable[..., Any]) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((ST.N,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(None, "x"),), out_specs=(P(), P()),
                                     check_vma=False))
        return shard_map_pair(name, ST.top_k_ref, impl, mesh, _st_ties(name, (8, 64)), ["x"], [P(None, "x")],
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


fixture("sort_split_dim_shardy", "jnp.sort along the dim split over tp (2x4 mesh), Shardy: all-to-all onto "
        "the rows, sort of whole rows, all-to-all back (correct)")(
    _st_partitioned(ST.sort_ref, P("dp", "tp")))
fixture("sort_argsort_split_dim_gspmd", "jnp.argsort along the dim split over tp (2x4 mesh), GSPMD: the sort of "
        "(values, iota) resharded by all-to-alls (correct)")(
    _st_partitioned(ST.argsort_ref, P("dp", "tp"), shardy=False))
fixture("top_k_split_dim_shardy", "lax.top_k (k=4) along the dim split over tp (2x4 mesh), Shardy: "
        "all-gathers, HLO topk of whole rows, the device's rows sliced out (correct)")(
    _st_partitioned(ST.top_k_ref, (P("dp"), P("dp"))))


@fixture("top_k_split_dim_compiled_shardy", "the same, as compiled.as_text() gives it: XLA's TopK custom call "
         "(a total-order comparator of the values as its called computation)")
def _top_k_compiled(name: str) -> Built:
    built = _st_partitioned(ST.top_k_ref, (P("dp"), P("dp")), compiled=True)(name)
    assert 'custom_call_target="TopK"' in built.after_text, f"{name}: no TopK custom call in the compiled module"
    return built


@fixture("sort_split_dim_descending_mutated", "sort_split_dim_shardy after.hlo with the sort comparator's LT "
         "turned into GT (descending)")
def _st_sort_descending(name: str) -> Built:
    text = build("sort_split_dim_shardy").after_text
    hits = [n for n in hlo_instructions(text, "compare")
            if "direction=LT, type=TOTALORDER" in hlo_instruction_line(text, n)[1]]
    assert len(hits) == 1, f"expected one total-order LT compare, got {hits}"
    idx, line = hlo_instruction_line(text, hits[0])
    new = replace_line(text, idx, line.replace("direction=LT", "direction=GT"))
    sorts = hlo_instructions(text, "sort")
    assert len(sorts) == 1, sorts
    return mutated(name, "sort_split_dim_shardy", new, hits[0], f"{hits[0]}: the sort comparator LT turned into GT",
                   source_instruction=sorts[0])


@fixture("top_k_split_dim_rows_swapped_mutated", "top_k_split_dim_shardy after.hlo with the per-device row "
         "offsets {0, 4} swapped: each dp group keeps the other group's rows")
def _st_top_k_rows_swapped(name: str) -> Built:
    text = build("top_k_split_dim_shardy").after_text
    hits = [n for n in hlo_instructions(text, "constant") if "constant({0, 4})" in hlo_instruction_line(text, n)[1]]
    assert len(hits) == 1, f"expected one row-offset table, got {hits}"
    idx, line = hlo_instruction_line(text, hits[0])
    new = replace_line(text, idx, line.replace("constant({0, 4})", "constant({4, 0})"))
    return mutated(name, "top_k_split_dim_shardy", new, hits[0], f"{hits[0]}: row offsets {{0, 4}} swapped")


fixture("top_k_merged_shard_map", "distributed top-k (k=4) over the vocab split on x: local top_k, indices "
        "+ axis_index * block, tiled all_gathers, top_k of the candidates, take_along_axis (correct)")(
    _st_shard_map(ST.top_k_merged_body))
fixture("top_k_merged_stacked_shard_map", "distributed top-k with untiled all_gathers flattened into the "
        "candidates (correct)")(_st_shard_map(ST.top_k_merged_stacked_body))
fixture("top_k_merged_local_ids_shard_map", "distributed top-k whose candidate indices lack the shard "
        "offset")(_st_shard_map(ST.top_k_local_ids_body))
fixture("top_k_merged_too_few_shard_map", "distributed top-k (k=4) that keeps one candidate per device")(
    _st_shard_map(ST.top_k_too_few_body))


# ------------------------------------------------------------------------ convolution (issue 14)
# Programs: tools/programs/convolution.py. XLA's partitioning of a conv net (batch split, feature split,
# the weight gradient of a batch-split step, a spatial split with a halo exchange) and shard_map convs
# with their `# BUG:` twins, on a 2 x 4 ("dp", "tp") mesh.

CV = convolution
CV_X, CV_W1, CV_W2 = (4, 8, 4, 4), (3, 3, 4, 4), (3, 3, 4, 4)


def _cv_partitioned(ref: Callable[..., Any], shapes: Sequence[tuple[int, ...]], specs: Sequence[Any],
                    out_spec: Any) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh(CV.MESH_2D, ("dp", "tp"))
        return partitioned_pair(name, ref, mesh, _fa_normal(name, *shapes), ["x", "w1", "w2"][: len(shapes)],
                                specs, out_spec)

    return fn


def _cv_shard_map(ref: Callable[..., Any], body: Callable[..., Any], shapes: Sequence[tuple[int, ...]],
                  specs: Sequence[Any], out_spec: Any) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh(CV.MESH_2D, ("dp", "tp"))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_spec, check_vma=False))
        return shard_map_pair(name, ref, impl, mesh, _fa_normal(name, *shapes), ["x", "w"], specs,
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


CV_BATCH = P("dp", None, None, None)
fixture("conv_net_dp_shardy", "conv net (3x3 SAME conv, relu, strided 3x3 conv) NHWC, batch split over dp, "
        "kernels replicated, Shardy, vs the module after SPMD partitioning")(
    _cv_partitioned(CV.conv_net, (CV_X, CV_W1, CV_W2), (CV_BATCH, P(), P()), CV_BATCH))
fixture("conv_net_dp_tp_gspmd", "conv net, batch split over dp and the first conv's output features over tp "
        "(the second contracts them: partial sums, all-reduce), GSPMD")(
    lambda name: partitioned_pair(name, CV.conv_net, make_mesh(CV.MESH_2D, ("dp", "tp")),
                                  _fa_normal(name, CV_X, CV_W1, CV_W2), ["x", "w1", "w2"],
                                  (CV_BATCH, P(None, None, None, "tp"), P(None, None, "tp", None)), CV_BATCH,
                                  shardy=False))
fixture("conv_train_grad_dp_shardy", "kernel gradients of a squared loss of the conv net, batch split over dp "
        "(the weight-gradient convolutions contract the batch: all-reduce over dp), Shardy")(
    _cv_partitioned(CV.conv_train_loss_grad, (CV_X, CV_W1, CV_W2), (CV_BATCH, P(), P()), (P(), P())))
fixture("conv_spatial_halo_shardy", "3x3 SAME conv with the image height split over tp (XLA exchanges halo "
        "rows with collective-permutes), Shardy")(
    _cv_partitioned(CV.conv_same, (CV_X, CV_W1), (P("dp", "tp", None, None), P()), P("dp", "tp", None, None)))
CV_ROWS = P("dp", "tp", None, None)
fixture("conv_patchify_spatial_shardy", "patch embedding (2x2 window, stride 2, VALID) with the image height "
        "split over tp: every window inside a block, Shardy")(
    _cv_partitioned(CV.patchify, (CV_X, (2, 2, 4, 4)), (CV_ROWS, P()), CV_ROWS))
fixture("conv_pointwise_spatial_gspmd", "1x1 convolution with the image height split over tp, GSPMD")(
    lambda name: partitioned_pair(name, CV.pointwise, make_mesh(CV.MESH_2D, ("dp", "tp")),
                                  _fa_normal(name, CV_X, (1, 1, 4, 4)), ["x", "w1"], (CV_ROWS, P()), CV_ROWS,
                                  shardy=False))
fixture("conv_spatial_no_halo_shard_map", "shard_map 3x3 SAME conv of a height-split image, each device "
        "convolving its own rows without its neighbours'")(
    _cv_shard_map(CV.conv_same, CV.spatial_no_halo_body, (CV_X, CV_W1), (CV_ROWS, P()), CV_ROWS))
CV_TALL, CV_HW = (4, 16, 8, 4), P(None, "dp", "tp", None)
fixture("conv_spatial_halo_hw_gspmd", "3x3 conv with stride 2, the image height split over dp and its width "
        "over tp: XLA exchanges halo rows, then halo columns of the rows, GSPMD")(
    lambda name: partitioned_pair(name, CV.conv_strided, make_mesh(CV.MESH_2D, ("dp", "tp")),
                                  _fa_normal(name, (2, 16, 16, 4), CV_W1), ["x", "w1"], (CV_HW, P()), CV_HW,
                                  shardy=False))
fixture("conv_spatial_halo_grads_shardy", "input and kernel gradients of a height-split 3x3 SAME conv: halo "
        "rows of the output gradient, and a kernel gradient summing every device's rows, Shardy")(
    _cv_partitioned(CV.conv_same_grads, (CV_TALL, CV_W1), (CV_ROWS, P()), (CV_ROWS, P())))
fixture("conv_net_grads_spatial_shardy", "kernel gradients of the conv net (3x3 conv, relu, strided 3x3 conv) "
        "with the image height split over tp: halo rows forward and backward, the strided conv's input "
        "gradient a dilated conv over halo rows, Shardy")(
    _cv_partitioned(CV.conv_train_loss_grad, (CV_TALL, CV_W1, CV_W2), (CV_ROWS, P(), P()), (P(), P())))
fixture("pool_max_spatial_halo_shardy", "max pool (3x3, stride 2, SAME) of a height-split image: halo rows "
        "padded with -inf, Shardy")(
    _cv_partitioned(CV.max_pool, (CV_TALL,), (CV_ROWS,), CV_ROWS))
fixture("pool_avg_spatial_halo_gspmd", "average pool (3x3, stride 1, SAME) of a height-split image, GSPMD")(
    lambda name: partitioned_pair(name, CV.avg_pool, make_mesh(CV.MESH_2D, ("dp", "tp")),
                                  _fa_normal(name, CV_TALL), ["x"], (CV_ROWS,), CV_ROWS, shardy=False))
fixture("conv_halo_ppermute_shard_map", "shard_map 3x3 conv of a height-split image exchanging its halo rows "
        "with ppermute (zeros past the edges), VALID along the height")(
    _cv_shard_map(CV.conv_same, CV.halo_exchange_body, (CV_TALL, CV_W1), (CV_ROWS, P()), CV_ROWS))
fixture("conv_halo_ppermute_wrong_way_shard_map", "the same, each halo row sent to the wrong neighbour")(
    _cv_shard_map(CV.conv_same, CV.halo_exchange_wrong_way_body, (CV_TALL, CV_W1), (CV_ROWS, P()), CV_ROWS))


@fixture("xla_max_pool_grad_spatial_shardy", "gradient of a 3x3 SAME max pool of a height-split image: XLA's "
         "partitioned select-and-scatter leaves the first block of rows wrong (zeros) on jax 0.10.2 and 0.12 "
         "(CPU), a real discrepancy that is the partitioner's, named at the pooling line")
def _xla_max_pool_grad(name: str) -> Built:
    built = _cv_partitioned(CV.max_pool_grad, (CV_TALL,), (CV_ROWS,), CV_ROWS)(name)
    assert built.after_out is not None and not allclose(built.after_out, built.before_out), \
        f"{name}: XLA's partitioned gradient now agrees with the reference: XLA fixed it, the fixture is stale"
    return dataclasses.replace(built, verdict="discrepancy", bug=bug_of(CV.max_pool_grad))


@fixture("xla_residual_grad_3d_mesh_shardy", "weight gradient of a two-layer residual tanh network, batch over "
         "dp x fsdp and weights over fsdp x tp on a 2 x 2 x 2 mesh: XLA's partitioner computes it wrong on jax 0.10.2 "
         "and 0.12 (CPU), a real discrepancy that is the partitioner's, named at the residual layer's line")
def _xla_residual_grad(name: str) -> Built:
    mesh = make_mesh(*residual_grad.MESH)
    in_specs, out_spec = residual_grad.specs()
    built = partitioned_pair(name, residual_grad.grad, mesh, residual_grad.init(rng_for(name)), ["ws", "x"], in_specs,
                             out_spec)
    assert built.after_out is not None and not allclose(built.after_out, built.before_out), \
        f"{name}: XLA's partitioned gradient now agrees with the reference: XLA fixed it, the fixture is stale"
    return dataclasses.replace(built, verdict="discrepancy", bug=bug_of(residual_grad.loss))


@fixture("mut_conv_train_grad_allreduce_wrong_axis", "conv_train_grad_dp_shardy after.hlo with the first kernel "
         "gradient's all-reduce (partial sums over the dp-split batch) moved from the dp groups to the tp groups")
def _mut_conv_grad_axis(name: str) -> Built:
    mesh = "mesh['axis_0'=2,'axis_1'=1,'axis_2'=1,'axis_3'=1,'axis_4'=4]"
    return _allreduce_groups_changed(name, "conv_train_grad_dp_shardy", "transpose(jvp())/conv_general_dilated",
                                     f"{mesh} {{'axis_0'}}", f"{mesh} {{'axis_4'}}",
                                     "a kernel gradient summed over the dp-split batch")


CV_OUT, CV_IN = (P("dp", None, None, None), P(None, None, None, "tp")), (P("dp", None, None, "tp"),
                                                                        P(None, None, "tp", None))
fixture("conv_out_features_shard_map", "shard_map conv, batch split over dp, kernel output features over tp "
        "(correct)")(_cv_shard_map(CV.conv_same, CV.out_features_body, (CV_X, CV_W1), CV_OUT,
                                   P("dp", None, None, "tp")))
fixture("conv_in_features_shard_map", "shard_map conv with the input channels split over tp and a psum "
        "(correct)")(_cv_shard_map(CV.conv_same, CV.in_features_body, (CV_X, CV_W1), CV_IN, CV_BATCH))
fixture("conv_in_features_missing_psum_shard_map", "shard_map conv with the input channels split over tp "
        "and no psum")(_cv_shard_map(CV.conv_same, CV.in_features_missing_psum_body, (CV_X, CV_W1), CV_IN,
                                     CV_BATCH))
fixture("conv_in_features_psum_wrong_axis_shard_map", "shard_map conv with the input channels split over tp, "
        "summed over dp")(_cv_shard_map(CV.conv_same, CV.in_features_psum_wrong_axis_body, (CV_X, CV_W1),
                                        CV_IN, CV_BATCH))
CV_DW = (P("dp", None, None, "tp"), P(None, None, None, "tp"))
fixture("conv_depthwise_shard_map", "shard_map depthwise conv (feature_group_count = channels) with the "
        "channels split over tp (correct)")(_cv_shard_map(CV.depthwise_ref, CV.depthwise_body,
                                                          ((4, 8, 4, 8), (3, 3, 1, 8)), CV_DW, P("dp", None, None, "tp")))
fixture("conv_depthwise_shifted_shard_map", "shard_map depthwise conv with the output channels rotated")(
    _cv_shard_map(CV.depthwise_ref, CV.depthwise_shifted_body, ((4, 8, 4, 8), (3, 3, 1, 8)), CV_DW,
                  P("dp", None, None, "tp")))


# --------------------------------- linear algebra and random bits (issue 14): Cholesky solves, rbg dropout
# Programs: tools/programs/linalg_rng.py. Batch-split Cholesky + triangular solve (LAPACK custom calls on
# CPU), partitioned by XLA and by shard_map; dropout drawn with the rbg PRNG from a replicated key.

LR = linalg_rng
BATCH = P("x", None, None)


def _lr_chol_args(name: str) -> list[np.ndarray]:
    return _fa_normal(name, (16, 4, 3), (16, 4, 2))


def _lr_batch_pair(ref: Callable[..., Any], args_of: Callable[[str], list[np.ndarray]], names: list[str],
                   body: Callable[..., Any]) -> Callable[[str], Built]:
    """A shard_map pair of two batched operands, the batch split over "x"; a bug pair when `body` has a
    `# BUG:` line."""
    def fn(name: str) -> Built:
        mesh = make_mesh((LR.N,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(BATCH, BATCH), out_specs=BATCH))
        return shard_map_pair(name, ref, impl, mesh, args_of(name), names, [BATCH, BATCH],
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


def _lr_chol_pair(body: Callable[..., Any]) -> Callable[[str], Built]:
    return _lr_batch_pair(LR.chol_solve_ref, _lr_chol_args, ["x", "b"], body)


@fixture("lr_chol_solve_shardy", "jnp.linalg.cholesky of x x^T + n I and solve_triangular, the batch split over "
         "x (LAPACK potrf/trsm custom calls), Shardy, vs the module after SPMD partitioning (correct)")
def _lr_chol_shardy(name: str) -> Built:
    mesh = make_mesh((LR.N,), ("x",))
    return partitioned_pair(name, LR.chol_solve_ref, mesh, _lr_chol_args(name), ["x", "b"], [BATCH, BATCH], BATCH)


fixture("lr_chol_solve_shard_map", "Cholesky + triangular solve per device in a shard_map over the batch "
        "(correct)")(_lr_chol_pair(LR.chol_solve_body))
fixture("lr_chol_solve_upper_shard_map", "Cholesky + triangular solve reading the upper triangle of the lower "
        "factor")(_lr_chol_pair(LR.chol_solve_upper_body))


def _lr_dropout_args(name: str) -> list[np.ndarray]:
    key = np.asarray(rng_for(name).integers(0, 2**32, size=4, dtype=np.uint64), dtype=np.uint32)
    return [key, *_fa_normal(name, (16, 8))]


def _lr_dropout_pair(body: Callable[..., Any]) -> Callable[[str], Built]:
    def fn(name: str) -> Built:
        mesh = make_mesh((LR.N,), ("x",))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), ROWS), out_specs=ROWS, check_vma=False))
        return shard_map_pair(name, LR.dropout_ref, impl, mesh, _lr_dropout_args(name), ["key", "x"], [P(), ROWS],
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


@fixture("lr_rbg_dropout_shardy", "dropout with the rbg PRNG (rng_bit_generator), key replicated, rows split "
         "over x, Shardy: the partitioner draws the global mask on every device and slices it (correct)")
def _lr_dropout_shardy(name: str) -> Built:
    mesh = make_mesh((LR.N,), ("x",))
    return partitioned_pair(name, LR.dropout_ref, mesh, _lr_dropout_args(name), ["key", "x"], [P(), ROWS], ROWS)


fixture("lr_rbg_dropout_shard_map", "rbg dropout in a shard_map: the global mask drawn from the replicated "
        "key, each device's rows sliced by axis_index (correct)")(_lr_dropout_pair(LR.dropout_body))
fixture("lr_rbg_dropout_local_mask_shard_map", "rbg dropout in a shard_map drawing a local-shape mask: the same "
        "mask on every device")(_lr_dropout_pair(LR.dropout_local_mask_body))


def _lr_lu_args(name: str) -> list[np.ndarray]:
    a, b = _fa_normal(name, (16, 4, 4), (16, 4, 2))
    return [a + 4 * np.eye(4, dtype=a.dtype), b]  # well conditioned


def _lr_lu_pair(body: Callable[..., Any]) -> Callable[[str], Built]:
    return _lr_batch_pair(LR.lu_solve_ref, _lr_lu_args, ["a", "b"], body)


@fixture("lr_lu_solve_shardy", "jnp.linalg.solve of a batch of general systems (LAPACK getrf, pivots to a "
         "permutation, two trsm), the batch split over x, Shardy, vs the module after SPMD partitioning (correct)")
def _lr_lu_shardy(name: str) -> Built:
    mesh = make_mesh((LR.N,), ("x",))
    return partitioned_pair(name, LR.lu_solve_ref, mesh, _lr_lu_args(name), ["a", "b"], [BATCH, BATCH], BATCH)


fixture("lr_lu_solve_shard_map", "jnp.linalg.solve per device in a shard_map over the batch (correct)")(
    _lr_lu_pair(LR.lu_solve_body))
fixture("lr_lu_solve_transposed_shard_map", "jnp.linalg.solve per device of the transposed matrices")(
    _lr_lu_pair(LR.lu_solve_transposed_body))


# ============================================================================================ writing


def write_fixture(b: Built, out: Path = FIXTURES) -> dict[str, int]:
    assert b.verdict in ("equivalent", "discrepancy")
    assert (b.bug is None) == (b.verdict == "equivalent")
    if b.after_out is not None and b.after_kind != "mutated_hlo":
        same = allclose(b.after_out, b.before_out)
        if b.verdict == "equivalent":
            assert same, f"{b.name}: correct program but after_out != before_out " \
                         f"(max diff {max_abs_diff(b.after_out, b.before_out):.3g})"
        else:
            assert not same, f"{b.name}: buggy program but XLA's after_out == before_out for these inputs"
    out_dir = out / b.name
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    files: dict[str, bytes] = {}
    files["before.mlir"] = (header("mlir", b.description) + sanitize(b.before_text)).encode()
    after_text = sanitize(b.after_text)
    kind = "mlir" if b.after_file.endswith(".mlir") else "hlo"
    files[b.after_file] = (header(kind, b.description) + after_text).encode()
    if kind == "hlo":
        xla_hlo().hlo_module_from_text(files[b.after_file].decode())  # the header must not break XLA's parser
    expected = {
        "name": b.name,
        "description": b.description,
        "verdict": b.verdict,
        "bug": b.bug,
        "after_kind": b.after_kind,
        "mesh": b.mesh,
        "inputs": b.input_names,
        "generator": GENERATOR,
        "jax": JAX_VERSION,
    }
    if b.notes:
        expected["notes"] = b.notes
    if b.assume:
        expected["assume"] = b.assume
    if b.excess_precision:
        expected["excess_precision"] = True
    files["expected.json"] = (json.dumps(expected, indent=2) + "\n").encode()
    arrays: dict[str, np.ndarray] = {}
    for i, x in enumerate(b.inputs):
        assert x.dtype in (np.float32, np.int32, np.int64, np.uint32, np.uint64), \
            f"{b.name}: input {i} has dtype {x.dtype}"
        arrays[f"in_{i}"] = x
    for i, x in enumerate(b.before_out):
        arrays[f"before_out_{i}"] = x
    for i, x in enumerate(b.after_out or []):
        arrays[f"after_out_{i}"] = x
    buf_path = out_dir / "oracle.npz"
    write_npz(buf_path, arrays)
    for fname, data in files.items():
        text = data.decode()
        assert not machine_paths(text), f"{b.name}/{fname}: machine path(s) {machine_paths(text)}"
        (out_dir / fname).write_bytes(data)
    sizes = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}
    for fname, size in sizes.items():
        assert size < MAX_FILE_BYTES, f"{b.name}/{fname}: {size} bytes (budget {MAX_FILE_BYTES})"
    return sizes


# ------------------------------------ block reductions used per device (issue 12): tools/programs/block_reductions.py
BR = block_reductions
fixture("br_cond_on_block_sum_shard_map", "lax.cond on the sign of each device's block sum, against jnp.where "
        "on the blockwise sums (correct)")(
    _sl_pair(BR.cond_block_ref, BR.cond_block_body, [P("x", None)], P("x", None), two_axes=False, shapes=[(32, 4)]))
fixture("br_cond_on_summed_blocks_shard_map", "lax.cond on the psum of the block sums where the reference "
        "decides block by block")(
    _sl_pair(BR.cond_block_ref, BR.cond_block_summed_body, [P("x", None)], P("x", None), two_axes=False,
             shapes=[(32, 4)]))
fixture("br_count_blocks_shard_map", "psum of a per-device flag (block max > 1): how many blocks hold a large "
        "value (correct)")(
    _sl_pair(BR.count_blocks_ref, BR.count_blocks_body, [P("x", None)], P(), two_axes=False, shapes=[(32, 4)]))
fixture("br_count_blocks_pmax_shard_map", "pmax of the per-device flags where the reference counts the blocks")(
    _sl_pair(BR.count_blocks_ref, BR.count_blocks_pmax_body, [P("x", None)], P(), two_axes=False, shapes=[(32, 4)]))
fixture("br_sum_blocks_xy_shard_map", "psum over (x, y) of x split P(x, y), against the reference's reshape into "
        "the block grid and sum over both block dims (correct)")(
    _sl_pair(BR.sum_blocks_xy_ref, BR.sum_blocks_xy_body, [P("x", "y")], P(), shapes=[(8, 16)]))
fixture("br_mean_blocks_xy_shard_map", "pmean over (x, y) of x split P(x, y) where the reference sums the "
        "block grid")(
    _sl_pair(BR.sum_blocks_xy_ref, BR.mean_blocks_xy_body, [P("x", "y")], P(), shapes=[(8, 16)]))

fixture("br_pmean_fori_steps_shard_map", "three pmean steps in a fori_loop against the reference's unrolled "
        "Python loop over the block grid (correct)")(
    _sl_pair(BR.pmean_steps_ref, BR.pmean_steps_body, [P("x", None)], P("x", None), two_axes=False,
             shapes=[(32, 4)]))
fixture("br_pmean_fori_four_steps_shard_map", "four pmean steps in a fori_loop where the reference takes three")(
    _sl_pair(BR.pmean_steps_ref, BR.pmean_steps_four_body, [P("x", None)], P("x", None), two_axes=False,
             shapes=[(32, 4)]))
fixture("br_block_sums_rotated_shard_map", "each device's own block sums, rotated through a scan carry and "
        "returned under out_specs P(x): the tensors of block sums (correct)")(
    _sl_pair(BR.block_sums_ref, BR.block_sums_rotated_body, [P("x", None), P("x", None)], (P("x"), P("x")),
             two_axes=False, shapes=[(32, 4), (32, 4)], argnames=("x", "y")))
fixture("br_block_maxes_rotated_shard_map", "each device's own block sum of x and block max of y, rotated "
        "through a scan carry, where the reference sums the blocks of both")(
    _sl_pair(BR.block_sums_ref, BR.block_maxes_rotated_body, [P("x", None), P("x", None)], (P("x"), P("x")),
             two_axes=False, shapes=[(32, 4), (32, 4)], argnames=("x", "y")))


# ------------------------------------------- localisation (issue 16): tools/programs/localisation.py
def _loc_pair(ref: Callable[..., Any], body: Callable[..., Any], specs: Any,
              make: Callable[[np.random.Generator], list[np.ndarray]]) -> Callable[[str], Built]:
    """A shard_map pair over the mesh ("dp", "tp") = (2, 4) of tools/programs/localisation.py."""
    def fn(name: str) -> Built:
        mesh = make_mesh(tuple(n for _, n in localisation.MESH), tuple(a for a, _ in localisation.MESH))
        (ins, out), args = specs, make(rng_for(name.removesuffix("_bug")))
        impl = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=ins, out_specs=out))
        return shard_map_pair(name, ref, impl, mesh, args, ["x", "y"], ins,
                              body if "# BUG:" in inspect.getsource(body) else None)

    return fn


def _loc_mask_args(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((8, 2)).astype(np.float32), rng.integers(-4, 5, (8, 2)).astype(np.int32)]


def _loc_compare_args(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((4, 8)).astype(np.float32), rng.integers(-4, 5, (8, 8)).astype(np.int32)]


def _loc_loop_args(rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal((2, 8)).astype(np.float32), rng.standard_normal((8,)).astype(np.float32)]


LOC = localisation
fixture("loc_mask_constant_shard_map", "int mask of columns (iota + axis_index) % 3 == 0 applied per device, then "
        "a product and a row mask (correct)")(
    _loc_pair(LOC.mask_ref, LOC.mask_body, LOC.MASK_SPECS, _loc_mask_args))
fixture("loc_mask_constant_shard_map_bug", "the column mask keeps % 3 == 1 (once named at the product after it)")(
    _loc_pair(LOC.mask_ref, LOC.mask_body_bug, LOC.MASK_SPECS, _loc_mask_args))
fixture("loc_compare_gather_shard_map", "a 0/1 compare, rows picked by axis_index, all_gather over tp, matmul "
        "(correct)")(
    _loc_pair(LOC.compare_ref, LOC.compare_body, LOC.GATHER_SPECS, _loc_compare_args))
fixture("loc_compare_gather_shard_map_bug", "the compare flipped (<) before the gather")(
    _loc_pair(LOC.compare_ref, LOC.compare_body_bug, LOC.GATHER_SPECS, _loc_compare_args))
fixture("loc_loop_scale_shard_map", "fori_loop tanh(c) * 0.5 + x, then a bias and per-device column offsets "
        "(correct)")(
    _loc_pair(LOC.loop_ref, LOC.loop_body, LOC.LOOP_SPECS, _loc_loop_args))
fixture("loc_loop_scale_shard_map_bug", "the loop body scales the carry by 0.25 (once named at the add after the "
        "loop)")(
    _loc_pair(LOC.loop_ref, LOC.loop_body_bug, LOC.LOOP_SPECS, _loc_loop_args))


# ------------------------------------------------- layer memoization (issue 15): scalify_hlo/prove/layers.py
# A stack deep enough (over 512 ops) that alike layers are derived once and substituted; its twin breaks one
# layer in the middle of the run.
DEEP = llama.LlamaConfig(layers=5, d_model=16, n_heads=8, n_kv_heads=4, head_dim=2, ffn=32, seq=8, batch=2)


@fixture("llama_unrolled_deep_shardy", "5 Llama blocks unrolled (a Python loop over per-layer params; tiny widths), "
         "FSDPxTP, Shardy, vs the module after SPMD partitioning: long enough for layer memoization")
def _llama_unrolled_deep(name: str) -> Built:
    mesh = make_mesh((2, 4), ("fsdp", "tp"))
    rng = rng_for(name)
    x = llama.init_activations(DEEP, rng)
    layers = [llama.init_layer(DEEP, rng) for _ in range(DEEP.layers)]
    act = llama.activation_spec()
    return partitioned_pair(name, functools.partial(llama.blocks_unrolled, cfg=DEEP), mesh, [x, layers],
                            ["x", "layers"], [act, [llama.layer_specs()] * DEEP.layers], act)


@fixture("mut_llama_unrolled_deep_layer3_allreduce_wrong_axis", "llama_unrolled_deep_shardy after.hlo with the "
         "attention-output all-reduce of layer 3 of 5 (partial sums over the tp-split heads) moved from the tp groups "
         "to the fsdp groups: the layers around it alike, this one not")
def _mut_llama_unrolled_deep(name: str) -> Built:
    base = "llama_unrolled_deep_shardy"
    text = build(base).after_text
    old, new = "[2,4]<=[8]", "[4,2]<=[2,4]T(1,0)"  # the tp groups, the fsdp groups
    targets = _allreduces_at(text, old, llama.attention, 'p["wo"]')
    assert len(targets) == DEEP.layers, f"{name}: expected one attention-out all-reduce per layer, got {targets}"
    idx, line = hlo_instruction_line(text, targets[3])
    new_text = replace_line(text, idx, line.replace(f"replica_groups={old},", f"replica_groups={new},"))
    # Named where the partial heads meet the residual stream: the line of `block` calling `attention` (the
    # origin's frame in the function that also holds its consumer, `localize._frame_in_common_function`).
    uses = re.compile(rf"[(,]\s*{re.escape(targets[3])}[,)]")
    consumer = next(n for n in hlo_instructions(new_text, "add") if uses.search(hlo_instruction_line(new_text, n)[1]))
    return mutated(name, base, new_text, targets[3], f"all-reduce {targets[3]} (layer 3's attention heads summed "
                   f"over tp): replica_groups {old} changed to {new}", source_instruction=consumer)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", metavar="NAME", help="generate only these fixtures")
    ap.add_argument("--list", action="store_true", help="list the fixture names and exit")
    ap.add_argument("--out", type=Path, default=FIXTURES, metavar="DIR",
                    help="where to write them (tests/fixtures_newest: the text a newer jax writes, where it "
                         "differs)")
    ns = ap.parse_args(argv)
    if ns.list:
        for n, (desc, _) in REGISTRY.items():
            print(f"{n:42s} {desc}")
        return 0
    names = list(REGISTRY) if not ns.only else ns.only
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        ap.error(f"unknown fixture(s): {unknown}; see --list")
    t0 = time.perf_counter()
    rows = []
    for n in names:
        t = time.perf_counter()
        b = build(n)
        sizes = write_fixture(b, ns.out)
        bug = f"{b.bug['file']}:{b.bug['line']}" if b.bug else "-"
        rows.append((n, b.after_kind, b.verdict, bug, sizes, time.perf_counter() - t))
    total = sum(p.stat().st_size for p in ns.out.rglob("*") if p.is_file())
    print(f"{'fixture':40s} {'after kind':15s} {'verdict':12s} {'bug line':32s} "
          f"{'before':>7s} {'after':>7s} {'oracle':>7s} {'time':>6s}")
    for n, kind, verdict, bug, sizes, dt in rows:
        after = sizes.get("after.hlo", sizes.get("after.mlir", 0))
        print(f"{n:40s} {kind:15s} {verdict:12s} {bug:32s} {sizes['before.mlir'] / 1024:6.1f}K "
              f"{after / 1024:6.1f}K {sizes['oracle.npz'] / 1024:6.1f}K {dt:5.1f}s")
    print(f"{len(rows)} fixtures written in {time.perf_counter() - t0:.1f}s; {ns.out.name} total "
          f"{total / 1024:.0f} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

