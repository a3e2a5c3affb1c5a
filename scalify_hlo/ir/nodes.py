"""The common IR every input is read into: StableHLO ops as frozen Python values, nothing tied to MLIR.

One road: StableHLO text/bytecode is walked as it is; HLO text goes through XLA's parser and XLA's
HLO→StableHLO converter first (see `parsers/`). Opcodes are StableHLO names without the dialect prefix
(`add`, `dot_general`, `all_reduce`, `manual_computation`, `fusion`, `call`, ...). Attribute values are
immutable (ints, floats, strings, tuples, `Literal` arrays, small frozen records) so that a module can be
hashed, memoized and sent to worker processes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np

# --- types -------------------------------------------------------------------------------------------

PARSER_NUMBERING = re.compile(r"%(?:arg)?\d+(?:#\d+)?")  # the StableHLO parser's own value names


@dataclass(frozen=True, slots=True)
class TensorType:
    """A ranked tensor type; `dtype` is MLIR's element-type spelling (`f32`, `bf16`, `i32`, `ui32`, `i1`)."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def __str__(self) -> str:
        return f"tensor<{'x'.join(map(str, (*self.shape, self.dtype)))}>"


@dataclass(frozen=True, slots=True)
class TokenType:
    def __str__(self) -> str:
        return "!stablehlo.token"


@dataclass(frozen=True, slots=True)
class TupleType:
    elements: tuple[Type, ...]

    def __str__(self) -> str:
        return f"tuple<{', '.join(map(str, self.elements))}>"


@dataclass(frozen=True, slots=True)
class OpaqueType:
    """A type we carry but do not interpret (e.g. `!stablehlo.future`); ops on it are unsupported."""

    text: str

    def __str__(self) -> str:
        return self.text


Type: TypeAlias = TensorType | TokenType | TupleType | OpaqueType

# --- attribute values ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Literal:
    """An immutable array attribute (constants, replica groups, dense index lists)."""

    array: np.ndarray
    dtype: str  # MLIR element type spelling; the NumPy dtype may be wider (bf16 is held as float32)

    def __post_init__(self) -> None:
        self.array.setflags(write=False)

    def _key(self) -> tuple[Any, ...]:
        return (self.dtype, self.array.shape, self.array.dtype.str, self.array.tobytes())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Literal) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        flat = self.array.reshape(-1)
        body = ", ".join(map(str, flat[:8].tolist())) + (", ..." if flat.size > 8 else "")
        return f"Literal<{self.dtype}{list(self.array.shape)}: {body}>"

    @property
    def is_splat(self) -> bool:
        flat = self.array.reshape(-1)
        return flat.size > 0 and bool(np.all(flat == flat[0]))


@dataclass(frozen=True, slots=True)
class DotDims:
    lhs_batch: tuple[int, ...]
    rhs_batch: tuple[int, ...]
    lhs_contract: tuple[int, ...]
    rhs_contract: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GatherDims:
    offset_dims: tuple[int, ...]
    collapsed_slice_dims: tuple[int, ...]
    operand_batching_dims: tuple[int, ...]
    start_indices_batching_dims: tuple[int, ...]
    start_index_map: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True, slots=True)
class ScatterDims:
    update_window_dims: tuple[int, ...]
    inserted_window_dims: tuple[int, ...]
    input_batching_dims: tuple[int, ...]
    scatter_indices_batching_dims: tuple[int, ...]
    scattered_dims_to_operand_dims: tuple[int, ...]
    index_vector_dim: int


@dataclass(frozen=True, slots=True)
class ConvDims:
    """A convolution's dimension numbers: which dim of the input, kernel and output is the batch, the
    feature and each spatial dim (spatial dims listed in window order)."""

    input_batch: int
    input_feature: int
    input_spatial: tuple[int, ...]
    kernel_input_feature: int
    kernel_output_feature: int
    kernel_spatial: tuple[int, ...]
    output_batch: int
    output_feature: int
    output_spatial: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ChannelHandle:
    handle: int
    type: int


@dataclass(frozen=True, slots=True)
class Opaque:
    """An attribute kept as its MLIR text (sharding attributes are parsed on demand by `mesh`)."""

    text: str

    def __str__(self) -> str:
        return self.text


AttrValue: TypeAlias = (
    bool | int | float | str | tuple[Any, ...] | Literal | DotDims | GatherDims | ScatterDims
    | ConvDims | ChannelHandle | Opaque | Type | None
)


@dataclass(frozen=True, slots=True)
class Attrs(Mapping[str, AttrValue]):
    """An immutable, hashable attribute dictionary (sorted by name)."""

    items_: tuple[tuple[str, AttrValue], ...] = ()

    @staticmethod
    def of(pairs: Mapping[str, AttrValue] | None = None) -> Attrs:
        return Attrs(tuple(sorted((pairs or {}).items())))

    def __getitem__(self, key: str) -> AttrValue:
        for k, v in self.items_:
            if k == key:
                return v
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        return (k for k, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def replace(self, **changes: AttrValue) -> Attrs:
        merged = dict(self.items_)
        merged.update(changes)
        return Attrs.of(merged)


EMPTY_ATTRS = Attrs()

# --- source locations -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Frame:
    file: str
    line: int
    column: int | None = None
    function: str | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where an op came from: the user's source frame (innermost first) and JAX's op_name.

    `name` is the HLO instruction name when the input was HLO text; `ir_line` is the op's line in the
    input file itself, when known (HLO text), so a report can point into the dump too.
    """

    frames: tuple[Frame, ...] = ()
    op_name: str | None = None
    name: str | None = None
    ir_file: str | None = None
    ir_line: int | None = None

    @property
    def frame(self) -> Frame | None:
        return self.frames[0] if self.frames else None

    @property
    def site(self) -> str | None:
        """`file:line` of the innermost user frame, the line a JAX engineer would edit."""
        return str(self.frames[0]) if self.frames else None


UNKNOWN_LOC = SourceLoc()

# --- values, ops, regions, functions, modules ---------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Value:
    """An SSA value. Identity is the object: two ops share a value iff they hold the same `Value`."""

    type: Type
    name: str = ""

    def __repr__(self) -> str:
        return f"{self.name or '%?'}: {self.type}"

    @property
    def tensor(self) -> TensorType:
        if not isinstance(self.type, TensorType):
            raise TypeError(f"{self.name} is {self.type}, not a tensor")
        return self.type


@dataclass(frozen=True, slots=True, eq=False)
class Region:
    args: tuple[Value, ...]
    ops: tuple[Op, ...]
    results: tuple[Value, ...]  # operands of the terminator


@dataclass(frozen=True, slots=True, eq=False)
class Op:
    opcode: str
    operands: tuple[Value, ...]
    results: tuple[Value, ...]
    attrs: Attrs = EMPTY_ATTRS
    regions: tuple[Region, ...] = ()
    loc: SourceLoc = UNKNOWN_LOC

    @property
    def result(self) -> Value:
        (r,) = self.results
        return r

    def describe(self) -> str:
        """`add.3 = add at model.py:12`: the op by the names a user can find (HLO instruction or named
        location, and the source line), never the StableHLO parser's own numbering (`%89`)."""
        name = self.loc.name or (self.results[0].name if self.results else "")
        if name and PARSER_NUMBERING.fullmatch(name):
            name = ""
        text = f"{name} = {self.opcode}" if name else self.opcode
        return f"{text} at {self.loc.site}" if self.loc.site else text


@dataclass(frozen=True, slots=True, eq=False)
class Func:
    name: str
    body: Region
    arg_attrs: tuple[Attrs, ...]
    result_attrs: tuple[Attrs, ...]
    arg_locs: tuple[SourceLoc, ...] = ()

    @property
    def params(self) -> tuple[Value, ...]:
        return self.body.args

    @property
    def outputs(self) -> tuple[Value, ...]:
        return self.body.results


@dataclass(frozen=True, slots=True, eq=False)
class Module:
    name: str
    entry: str
    funcs: Mapping[str, Func]
    path: str
    kind: str  # "stablehlo" | "hlo"
    attrs: Attrs = EMPTY_ATTRS
    meshes: tuple[tuple[str, str], ...] = ()  # sdy.mesh symbol → its `#sdy.mesh<...>` text
    extra: Attrs = field(default=EMPTY_ATTRS)  # reader-specific facts (HLO: spmd shardings, num_partitions)

    @property
    def main(self) -> Func:
        return self.funcs[self.entry]

    @property
    def num_replicas(self) -> int:
        v = self.attrs.get("mhlo.num_replicas", self.extra.get("replica_count", 1))
        return int(v) if isinstance(v, int) else 1

    @property
    def num_partitions(self) -> int:
        v = self.attrs.get("mhlo.num_partitions", self.extra.get("num_partitions", 1))
        return int(v) if isinstance(v, int) else 1


def walk(ops: tuple[Op, ...]) -> Iterator[Op]:
    """Every op in `ops` and, depth first, in their regions."""
    for op in ops:
        yield op
        for region in op.regions:
            yield from walk(region.ops)
