"""Keep HLO instruction names through XLA's HLO→StableHLO converter.

The converter names an op's MLIR location after its metadata `op_name` when there is one, and only
otherwise after the instruction (`%all-reduce.3`). Reports must name the instruction, so before
converting we prefix every instruction's `op_name` with its name and a separator, editing the
serialized `HloModuleProto` at the protobuf wire level (no protobuf dependency; the fields touched are
stable parts of xla/service/hlo.proto and xla/xla_data.proto).
"""

from __future__ import annotations

NAME_SEP = "\x1f"  # ASCII unit separator: never part of an HLO name or a JAX op_name

_MODULE_COMPUTATIONS = 3  # HloModuleProto.computations
_COMPUTATION_INSTRUCTIONS = 2  # HloComputationProto.instructions
_INSTRUCTION_NAME = 1  # HloInstructionProto.name
_INSTRUCTION_METADATA = 7  # HloInstructionProto.metadata
_METADATA_OP_NAME = 2  # OpMetadata.op_name
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


def _name_instruction(inst: bytes) -> bytes:
    fields = _fields(inst)
    name = next((p for n, w, _, p in fields if n == _INSTRUCTION_NAME and w == _LEN), b"")
    old_meta = next((p for n, w, _, p in fields if n == _INSTRUCTION_METADATA and w == _LEN), b"")
    meta_fields = _fields(old_meta)
    op_name = next((p for n, w, _, p in meta_fields if n == _METADATA_OP_NAME and w == _LEN), b"")
    kept = b"".join(raw for n, _, raw, _ in meta_fields if n != _METADATA_OP_NAME)
    meta = _len_field(_METADATA_OP_NAME, name + NAME_SEP.encode() + op_name) + kept
    rest = b"".join(raw for n, _, raw, _ in fields if n != _INSTRUCTION_METADATA)
    return rest + _len_field(_INSTRUCTION_METADATA, meta)


def name_instructions(module_proto: bytes) -> bytes:
    """The same module with each instruction's op_name prefixed by `<name><NAME_SEP>`."""
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
