"""Two repairs to an `HloModuleProto` before XLA's HLO→StableHLO converter sees it.

1. Instruction names. The converter names an op's MLIR location after its metadata `op_name` when there
   is one, and only otherwise after the instruction (`%all-reduce.3`). Reports must name the
   instruction, so every instruction's `op_name` is prefixed with its name and a separator.
2. Mesh-spelled replica groups. `replica_groups=mesh['a'=4,'b'=2], device_ids=(...) {'a'}` reaches
   the converter as a mesh-axes device list, and the converter drops its `device_ids` (jaxlib 0.10.2):
   the groups it emits are then wrong. We rewrite such lists as the explicit groups they denote.

Both edit the serialized proto at the protobuf wire level (no protobuf dependency; the field numbers
are those of xla/service/hlo.proto and xla/xla_data.proto, checked against XLA's own serialisation in
tests/test_parse_hlo_names_and_groups.py).
"""

from __future__ import annotations

import functools
import itertools

import numpy as np

NAME_SEP = "\x1f"  # ASCII unit separator: never part of an HLO name or a JAX op_name

_MODULE_COMPUTATIONS = 3  # HloModuleProto.computations
_COMPUTATION_INSTRUCTIONS = 2  # HloComputationProto.instructions
_INSTRUCTION_NAME = 1  # HloInstructionProto.name
_INSTRUCTION_METADATA = 7  # HloInstructionProto.metadata
_METADATA_OP_NAME = 2  # OpMetadata.op_name
_INSTRUCTION_DEVICE_LIST = 87  # HloInstructionProto.collective_device_list (explicit groups)
_INSTRUCTION_MESH_GROUPS = 93  # HloInstructionProto: a MeshAxesReplicaGroupListProto
_LEN = 2  # wire type: length-delimited


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7


def _encode_varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _fields(buf: bytes) -> list[tuple[int, int, bytes, bytes]]:
    """(field number, wire type, raw bytes of the whole field, payload of a length-delimited field)."""
    out = []
    i = 0
    while i < len(buf):
        start = i
        tag, i = _varint(buf, i)
        number, wire = tag >> 3, tag & 7
        payload = b""
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == _LEN:
            n, i = _varint(buf, i)
            payload = buf[i:i + n]
            i += n
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        out.append((number, wire, buf[start:i], payload))
    return out


def _len_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(payload)) + payload


def _rewrite(buf: bytes, number: int, edit: object) -> bytes:
    parts = []
    for num, wire, raw, payload in _fields(buf):
        if num == number and wire == _LEN:
            parts.append(_len_field(num, edit(payload)))  # type: ignore[operator]
        else:
            parts.append(raw)
    return b"".join(parts)


def _packed(payload: bytes) -> list[int]:
    out, i = [], 0
    while i < len(payload):
        v, i = _varint(payload, i)
        out.append(v)
    return out


def _ints(fields: list[tuple[int, int, bytes, bytes]], number: int) -> list[int]:
    """A repeated integer field, packed or not."""
    out: list[int] = []
    for n, wire, raw, payload in fields:
        if n == number and wire == _LEN:
            out.extend(_packed(payload))
        elif n == number and wire == 0:
            _, i = _varint(raw, 0)  # skip the tag
            out.append(_varint(raw, i)[0])
    return out


def mesh_groups(list_proto: bytes) -> np.ndarray:
    """The [groups, size] device array a MeshAxesReplicaGroupListProto denotes: every group is the
    devices that differ only along the listed (sub-)axes, in their order."""
    fields = _fields(list_proto)
    mesh = _fields(next(p for n, _, _, p in fields if n == 1))
    axes = [_fields(p) for n, _, _, p in mesh if n == 1]
    sizes = [(_ints(a, 2) or [1])[0] for a in axes]
    n = int(np.prod(sizes))
    ids = np.array(_ints(mesh, 2), dtype=np.int64)
    iota = next((_fields(p) for k, _, _, p in mesh if k == 3), None)
    if ids.size == 0:
        ids = np.arange(n, dtype=np.int64)
        if iota is not None:
            dims, perm = _ints(iota, 1), _ints(iota, 2)
            ids = ids.reshape(dims).transpose(perm or range(len(dims))).reshape(-1)
    refs = []
    for k, _, _, p in fields:
        if k == 2:
            ref = _fields(p)
            axis = (_ints(ref, 1) or [0])[0]
            sub = next((_fields(q) for m, _, _, q in ref if m == 2), None)
            pre, size = ((_ints(sub, 1) or [1])[0], (_ints(sub, 2) or [sizes[axis]])[0]) if sub else (1, sizes[axis])
            refs.append((axis, pre, size))
    # Cut every axis at the sub-axis boundaries the groups mention, then move the listed parts last.
    cuts = [{1, s} for s in sizes]
    for axis, pre, size in refs:
        cuts[axis] |= {pre, pre * size}
    pieces: list[tuple[int, int]] = []  # (axis, pre-size) of every refined digit, major first
    shape: list[int] = []
    for axis, c in enumerate(cuts):
        bounds = sorted(c)
        for lo, hi in itertools.pairwise(bounds):
            pieces.append((axis, lo))
            shape.append(hi // lo)
    grid = ids.reshape(shape)
    listed = [i for axis, pre, size in refs for i, (a, lo) in enumerate(pieces)
              if a == axis and pre <= lo < pre * size]
    others = [i for i in range(len(pieces)) if i not in listed]
    group = int(np.prod([shape[i] for i in listed])) if listed else 1
    return grid.transpose(others + listed).reshape(-1, group)


@functools.lru_cache(maxsize=256)
def _explicit_for(mesh_list_proto: bytes) -> bytes:
    """The explicit device list of a mesh-spelled one; a module repeats a few of them many times."""
    return _explicit_device_list(mesh_groups(mesh_list_proto))


def _explicit_device_list(groups: np.ndarray) -> bytes:
    """A CollectiveDeviceListProto listing `groups` (ReplicaGroup.replica_ids, packed)."""
    body = b"".join(_len_field(1, _len_field(1, b"".join(_encode_varint(int(d)) for d in row))) for row in groups)
    return _len_field(_INSTRUCTION_DEVICE_LIST, body)


_MESH_GROUPS_TAG = _encode_varint(_INSTRUCTION_MESH_GROUPS << 3 | _LEN)


def _name_instruction(inst: bytes) -> bytes:
    """`inst` with its op_name prefixed by its name (and mesh-spelled groups made explicit).

    The fast path copies the bytes around the metadata field (C++ serialises fields in number order,
    so name and metadata come early); only an instruction whose bytes may hold a mesh device list
    is taken apart completely."""
    if _MESH_GROUPS_TAG in inst:
        return _name_instruction_slow(inst)
    i = 0
    name = b""
    meta_start = meta_end = None
    while i < len(inst):
        start = i
        tag, i = _varint(inst, i)
        number, wire = tag >> 3, tag & 7
        if number > _INSTRUCTION_METADATA:
            meta_start = meta_end = start
            break
        if wire == 0:
            _, i = _varint(inst, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == _LEN:
            n, i = _varint(inst, i)
            if number == _INSTRUCTION_NAME:
                name = inst[i:i + n]
            elif number == _INSTRUCTION_METADATA:
                meta_start, meta_end = start, i + n
                break
            i += n
        else:
            return _name_instruction_slow(inst)
    else:
        meta_start = meta_end = len(inst)
    old = inst[meta_start:meta_end]
    meta_payload = b"" if meta_start == meta_end else _fields(old)[0][3]
    return inst[:meta_start] + _len_field(_INSTRUCTION_METADATA, _named_metadata(name, meta_payload)) + inst[meta_end:]


def _named_metadata(name: bytes, meta: bytes) -> bytes:
    meta_fields = _fields(meta)
    op_name = next((p for n, w, _, p in meta_fields if n == _METADATA_OP_NAME and w == _LEN), b"")
    kept = b"".join(raw for n, _, raw, _ in meta_fields if n != _METADATA_OP_NAME)
    return _len_field(_METADATA_OP_NAME, name + NAME_SEP.encode() + op_name) + kept


def _name_instruction_slow(inst: bytes) -> bytes:
    fields = _fields(inst)
    name = next((p for n, w, _, p in fields if n == _INSTRUCTION_NAME and w == _LEN), b"")
    old_meta = next((p for n, w, _, p in fields if n == _INSTRUCTION_METADATA and w == _LEN), b"")
    rest = b"".join(raw for n, _, raw, _ in fields if n not in (_INSTRUCTION_METADATA, _INSTRUCTION_MESH_GROUPS))
    mesh = next((p for n, w, _, p in fields if n == _INSTRUCTION_MESH_GROUPS and w == _LEN), None)
    if mesh is not None:
        rest += _explicit_for(mesh)
    return rest + _len_field(_INSTRUCTION_METADATA, _named_metadata(name, old_meta))


def name_instructions(module_proto: bytes) -> bytes:
    """The same module with each instruction's op_name prefixed by `<name><NAME_SEP>` and mesh-spelled
    replica groups written out as explicit groups."""
    return _rewrite(
        module_proto,
        _MODULE_COMPUTATIONS,
        lambda comp: _rewrite(comp, _COMPUTATION_INSTRUCTIONS, _name_instruction),
    )


_MODULE_ENTRY_NAME = 2  # HloModuleProto.entry_computation_name


def entry_computation_name(module_proto: bytes) -> str:
    """The ENTRY computation's name (the converter renames it `main`; XLA's `main.1_spmd` says the module
    was SPMD-partitioned)."""
    for number, wire, _, payload in _fields(module_proto):
        if number == _MODULE_ENTRY_NAME and wire == _LEN:
            return payload.decode("utf-8", "replace")
    return ""
