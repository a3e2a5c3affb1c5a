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
from collections.abc import Callable, Iterator

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
    if n < 0x80:  # most tags and lengths: no loop
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes((n & 0x7F | 0x80, n >> 7))
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


_ONE_BYTE = tuple(bytes((n,)) for n in range(0x80))


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
_METADATA_TAG = _encode_varint(_INSTRUCTION_METADATA << 3 | _LEN)
_OP_NAME_TAG = _encode_varint(_METADATA_OP_NAME << 3 | _LEN)
_NAME_SEP_BYTES = NAME_SEP.encode()


def _spans(buf: bytes, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, field start, payload start, field end) of every field of the message
    `buf[start:end]`; the payload is that of a length-delimited field (empty at the field's end otherwise).
    Bounds rather than slices, so a caller copies only what it keeps."""
    i = start
    while i < end:
        field_start = i
        tag = buf[i]
        i += 1
        if tag >= 0x80:  # (a one-byte tag or length needs no call)
            tag, i = _varint(buf, field_start)
        wire = tag & 7
        if wire == _LEN:
            n = buf[i]
            i += 1
            if n >= 0x80:
                n, i = _varint(buf, i - 1)
            yield tag >> 3, wire, field_start, i, i + n
            i += n
            continue
        if wire == 0:
            i = i + 1 if buf[i] < 0x80 else _varint(buf, i)[1]
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield tag >> 3, wire, field_start, i, i


def _edit_fields(buf: bytes, start: int, end: int, number: int,
                 edit: Callable[[bytes, int, int], bytes]) -> bytes:
    """The message `buf[start:end]` with each length-delimited field `number` replaced by
    `edit(buf, payload start, payload end)`; the other fields are copied unchanged, each run of them as
    one slice."""
    tag = _encode_varint(number << 3 | _LEN)
    parts: list[bytes] = []
    copied = start  # buf[copied:] up to the next edited field is kept as it is
    for num, wire, field_start, payload, field_end in _spans(buf, start, end):
        if num == number and wire == _LEN:
            new = edit(buf, payload, field_end)
            parts += (buf[copied:field_start], tag, _encode_varint(len(new)), new)
            copied = field_end
    parts.append(buf[copied:end])
    return b"".join(parts)


def _name_instruction(buf: bytes, start: int, end: int) -> bytes:
    """The instruction `buf[start:end]` with its op_name prefixed by its name (and mesh-spelled groups
    made explicit).

    This runs for every instruction, so it reads the wire format inline (a one-byte tag or length needs
    no call). The fast path copies the bytes around the metadata field (C++ serialises fields in number
    order, so name and metadata come early); only an instruction whose bytes may hold a mesh device
    list, or that has a field this path does not read, is taken apart completely."""
    if buf.find(_MESH_GROUPS_TAG, start, end) >= 0:
        return _name_instruction_slow(buf, start, end)
    i = start
    name = b""
    meta_start = meta_end = end  # where the metadata field is, or where a new one goes
    payload = end
    while i < end:
        field_start = i
        tag = buf[i]
        i += 1
        if tag >= 0x80:
            tag, i = _varint(buf, field_start)
        number, wire = tag >> 3, tag & 7
        if number > _INSTRUCTION_METADATA:
            meta_start = meta_end = payload = field_start
            break
        if wire == _LEN:
            n = buf[i]
            i += 1
            if n >= 0x80:
                n, i = _varint(buf, i - 1)
            if number == _INSTRUCTION_NAME:
                name = buf[i:i + n]
            elif number == _INSTRUCTION_METADATA:
                meta_start, payload, meta_end = field_start, i, i + n
                break
            i += n
        elif wire == 0:
            i = i + 1 if buf[i] < 0x80 else _varint(buf, i)[1]
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return _name_instruction_slow(buf, start, end)
    meta = _named_metadata(name, buf, payload, meta_end)
    return b"".join((buf[start:meta_start], _METADATA_TAG, _encode_varint(len(meta)), meta, buf[meta_end:end]))


def _named_metadata(name: bytes, buf: bytes, start: int, end: int) -> bytes:
    """The OpMetadata `buf[start:end]` with op_name `<name><NAME_SEP><op_name>` first and its other
    fields after it, in their order."""
    op_name = None
    kept = []
    copied = start  # buf[copied:] up to the next op_name field is kept
    for number, wire, field_start, payload, field_end in _spans(buf, start, end):
        if number == _METADATA_OP_NAME:
            if wire == _LEN and op_name is None:
                op_name = buf[payload:field_end]
            kept.append(buf[copied:field_start])
            copied = field_end
    named = name + _NAME_SEP_BYTES + (op_name or b"")
    kept.append(buf[copied:end])
    return b"".join((_OP_NAME_TAG, _encode_varint(len(named)), named, *kept))


def _name_instruction_slow(buf: bytes, start: int, end: int) -> bytes:
    """`_name_instruction` for any instruction: its fields but metadata and mesh groups, in order, then
    the explicit groups, then the named metadata."""
    name = None
    meta = mesh = None  # (payload start, end) of the first of each
    parts: list[bytes] = []
    copied = start  # buf[copied:] up to the next dropped field is kept
    for number, wire, field_start, payload, field_end in _spans(buf, start, end):
        if number in (_INSTRUCTION_METADATA, _INSTRUCTION_MESH_GROUPS):
            parts.append(buf[copied:field_start])
            copied = field_end
            if wire == _LEN and number == _INSTRUCTION_METADATA and meta is None:
                meta = (payload, field_end)
            elif wire == _LEN and number == _INSTRUCTION_MESH_GROUPS and mesh is None:
                mesh = (payload, field_end)
        elif number == _INSTRUCTION_NAME and wire == _LEN and name is None:
            name = buf[payload:field_end]
    parts.append(buf[copied:end])
    if mesh is not None:
        parts.append(_explicit_for(buf[mesh[0]:mesh[1]]))
    named = _named_metadata(name or b"", buf, *(meta or (0, 0)))
    parts += (_METADATA_TAG, _encode_varint(len(named)), named)
    return b"".join(parts)


def _name_computation(buf: bytes, start: int, end: int) -> bytes:
    return _edit_fields(buf, start, end, _COMPUTATION_INSTRUCTIONS, _name_instruction)


def name_instructions(module_proto: bytes) -> bytes:
    """The same module with each instruction's op_name prefixed by `<name><NAME_SEP>` and mesh-spelled
    replica groups written out as explicit groups."""
    return _edit_fields(module_proto, 0, len(module_proto), _MODULE_COMPUTATIONS, _name_computation)


_MODULE_ENTRY_NAME = 2  # HloModuleProto.entry_computation_name


def entry_computation_name(module_proto: bytes) -> str:
    """The ENTRY computation's name (the converter renames it `main`; XLA's `main.1_spmd` says the module
    was SPMD-partitioned)."""
    for number, wire, _, payload, end in _spans(module_proto, 0, len(module_proto)):
        if number == _MODULE_ENTRY_NAME and wire == _LEN:
            return module_proto[payload:end].decode("utf-8", "replace")
    return ""
