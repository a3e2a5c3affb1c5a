"""The readers' fast paths give what the plain code they replace gives: the wire-level naming of HLO
instructions (checked against a field-by-field reference, on XLA's own protos and on hand-made ones in
shapes XLA does not write), and the lazily split lines of a dump."""

from __future__ import annotations

import random

import pytest
from conftest import FIXTURES
from scalify_hlo.parsers import _hloproto as P
from scalify_hlo.parsers import hlo as H

from scalify_hlo.ir import _jaxlib


def _reference_named_metadata(name: bytes, meta: bytes) -> bytes:
    fields = P._fields(meta)
    op_name = next((p for n, w, _, p in fields if n == P._METADATA_OP_NAME and w == P._LEN), b"")
    kept = b"".join(raw for n, _, raw, _ in fields if n != P._METADATA_OP_NAME)
    return P._len_field(P._METADATA_OP_NAME, name + P.NAME_SEP.encode() + op_name) + kept


def _reference_instruction(inst: bytes) -> bytes:
    """The naming, field by field: what `_name_instruction` must equal byte for byte."""
    fields = P._fields(inst)
    mesh = next((p for n, w, _, p in fields if n == P._INSTRUCTION_MESH_GROUPS and w == P._LEN), None)
    name = next((p for n, w, _, p in fields if n == P._INSTRUCTION_NAME and w == P._LEN), b"")
    if mesh is not None or P._MESH_GROUPS_TAG in inst:
        # Taken apart: the other fields in order, the explicit groups, the (first) metadata named.
        meta = next((p for n, w, _, p in fields if n == P._INSTRUCTION_METADATA and w == P._LEN), b"")
        rest = b"".join(raw for n, _, raw, _ in fields if n not in (P._INSTRUCTION_METADATA, P._INSTRUCTION_MESH_GROUPS))
        if mesh is not None:
            rest += P._explicit_for(mesh)
        return rest + P._len_field(P._INSTRUCTION_METADATA, _reference_named_metadata(name, meta))
    # Edited in place: the metadata among the fields up to 7 is named where it is; without one, a named
    # empty one goes before the first later field (or at the end). Every other field stays as it is.
    i = next((k for k, (n, w, _, _) in enumerate(fields)
              if n > P._INSTRUCTION_METADATA or (n == P._INSTRUCTION_METADATA and w == P._LEN)), len(fields))
    out = [raw for _, _, raw, _ in fields[:i]]
    at_meta = i < len(fields) and fields[i][0] == P._INSTRUCTION_METADATA
    meta = fields[i][3] if at_meta else b""
    after = fields[i + 1:] if at_meta else fields[i:]
    named = P._len_field(P._INSTRUCTION_METADATA, _reference_named_metadata(name, meta))
    return b"".join(out) + named + b"".join(raw for _, _, raw, _ in after)


def _reference(module: bytes) -> bytes:
    def computation(comp: bytes) -> bytes:
        return b"".join(P._len_field(n, _reference_instruction(p)) if n == P._COMPUTATION_INSTRUCTIONS and w == P._LEN
                        else raw for n, w, raw, p in P._fields(comp))
    return b"".join(P._len_field(n, computation(p)) if n == P._MODULE_COMPUTATIONS and w == P._LEN else raw
                    for n, w, raw, p in P._fields(module))


def _varint_field(number: int, value: int) -> bytes:
    return P._encode_varint(number << 3) + P._encode_varint(value)


def _module(*instructions: bytes) -> bytes:
    comp = P._len_field(1, b"comp") + b"".join(P._len_field(P._COMPUTATION_INSTRUCTIONS, i) for i in instructions)
    return P._len_field(1, b"m") + P._len_field(2, b"comp") + P._len_field(P._MODULE_COMPUTATIONS, comp)


NAME = P._len_field(1, b"add.3")
OPCODE = P._len_field(2, b"add")
SHAPE = P._len_field(3, _varint_field(2, 11))
OP_NAME = P._len_field(P._METADATA_OP_NAME, b"jit(f)/add")
FRAME = _varint_field(15, 300)
LATER = _varint_field(35, 4) + P._len_field(68, b"\x08\x01")

HAND_MADE = {
    "xla order": NAME + OPCODE + SHAPE + P._len_field(7, OP_NAME + FRAME) + LATER,
    "no metadata": NAME + OPCODE + SHAPE + LATER,
    "no metadata, nothing later": NAME + OPCODE + SHAPE,
    "metadata without op_name": NAME + OPCODE + P._len_field(7, FRAME),
    "op_name after other fields": NAME + P._len_field(7, FRAME + P._len_field(1, b"add") + OP_NAME) + LATER,
    "op_name twice": NAME + P._len_field(7, OP_NAME + FRAME + P._len_field(2, b"second")),
    "empty op_name": NAME + P._len_field(7, P._len_field(2, b"")),
    "no name": OPCODE + P._len_field(7, OP_NAME),
    "long name and metadata": P._len_field(1, b"n" * 300) + P._len_field(7, P._len_field(2, b"o" * 20000)),
    "fixed-width fields": NAME + b"\x21" + bytes(8) + b"\x2d" + bytes(4) + P._len_field(7, OP_NAME),
    "metadata after a later field": NAME + LATER + P._len_field(7, OP_NAME),
}


@pytest.mark.parametrize("case", sorted(HAND_MADE))
def test_naming_matches_the_reference_on_hand_made_instructions(case: str) -> None:
    module = _module(HAND_MADE[case], HAND_MADE["xla order"])
    assert P.name_instructions(module) == _reference(module)


def test_naming_matches_the_reference_on_xla_protos() -> None:
    paths = sorted(FIXTURES.glob("*/*.hlo"))[:12]
    assert paths
    for path in paths:
        proto = _jaxlib.hlo_module_from_text(path.read_text()).as_serialized_hlo_module_proto()
        assert P.name_instructions(proto) == _reference(proto), path
        assert P.entry_computation_name(proto)


def test_naming_matches_the_reference_with_mesh_groups() -> None:
    text = """HloModule m, num_partitions=8

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %a = f32[] add(%x, %y)
}

ENTRY %main (p: f32[4,8]) -> f32[4,8] {
  %p = f32[4,8]{1,0} parameter(0)
  ROOT %ar = f32[4,8]{1,0} all-reduce(%p), channel_id=1, replica_groups=mesh['a'=2,'b'=4], device_ids=(7,6,5,4,3,2,1,0) {'b'}, use_global_device_ids=true, to_apply=%add
}
"""
    proto = _jaxlib.hlo_module_from_text(text).as_serialized_hlo_module_proto()
    assert P._MESH_GROUPS_TAG in proto
    assert P.name_instructions(proto) == _reference(proto)


def test_leading_lines_are_splitlines(monkeypatch: pytest.MonkeyPatch) -> None:
    pieces = ["HloModule m", "a", " ", "\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85",
              "\u2028", "\u2029", "xxxxx"]
    rng = random.Random(0)
    for _ in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        monkeypatch.setattr(H, "_HEAD_CHARS", rng.randint(1, 16))
        assert list(H.leading_lines(text)) == text.splitlines(), (text, H._HEAD_CHARS)
