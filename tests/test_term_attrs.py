"""Which attributes make an op's term: a physical layout (`result_layout`, `xla_shape`) is a hint, except
for `bitcast`, whose meaning is a reinterpretation of the buffer under those layouts.

(An optax AdamW update partitioned by XLA put a column-major layout on its `sqrt`s and divides: with the
layout in the term, the after program's sqrt was never the reference's sqrt of the very same operand.)
"""

from __future__ import annotations

import numpy as np

from scalify_hlo.ir.nodes import Attrs, AttrValue, Literal, Op, TensorType, Value
from scalify_hlo.ops.attrs import term_attrs

F32 = TensorType((8, 8), "f32")


def _op(opcode: str, **attrs: AttrValue) -> Op:
    return Op(opcode, (Value(F32, "%x"),), (Value(F32, "%y"),), Attrs.of(attrs))


def _layout(*dims: int) -> Literal:
    return Literal(np.array(dims, dtype=np.int64), "index")


def test_a_physical_layout_is_not_part_of_the_value() -> None:
    laid_out = _op("sqrt", result_layout=_layout(0, 1), xla_shape="f32[8,8]{0,1}")
    assert term_attrs(laid_out) == term_attrs(_op("sqrt")) == ()


def test_a_bitcast_keeps_its_layouts() -> None:
    cast = _op("bitcast", source_layout=_layout(1, 0), result_layout=_layout(0, 1))
    assert dict(term_attrs(cast)).keys() == {"source_layout", "result_layout"}
    assert term_attrs(cast) != term_attrs(_op("bitcast", source_layout=_layout(1, 0), result_layout=_layout(1, 0)))
