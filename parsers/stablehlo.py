"""StableHLO (text or bytecode) → common IR, by walking jaxlib's MLIR bindings.

Every op is read through the MLIR Python API: types, attributes and locations are converted into the
immutable values of `scalify_hlo.ir.nodes`. Nothing here knows what an op means; that is `semantics.py`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np

from scalify_hlo.ir import _jaxlib
from scalify_hlo.ir.dtypes import numpy_dtype
from scalify_hlo.ir.errors import ParseError, Span
from scalify_hlo.ir.nodes import (
    EMPTY_ATTRS,
    UNKNOWN_LOC,
    Attrs,
    AttrValue,
    ChannelHandle,
    ConvDims,
    DotDims,
    Frame,
    Func,
    GatherDims,
    Literal,
    Module,
    Op,
    Opaque,
    OpaqueType,
    Region,
    ScatterDims,
    SourceLoc,
    TensorType,
    TokenType,
    TupleType,
    Type,
    Value,
)
from scalify_hlo.layout.inference import mesh_axes_of, refine_for_axes
from scalify_hlo.layout.sharding import mesh_from_sdy
from scalify_hlo.ops.elementwise import ELEMENTWISE_CUSTOM_CALLS

# Dialect prefixes dropped from opcodes: the common IR speaks StableHLO, and mhlo/chlo ops that the
# converter or JAX emit keep their own names (`fusion`, `copy`, `top_k`) in the same namespace.
_PREFIXES = ("stablehlo.", "mhlo.", "chlo.", "func.", "sdy.")
_TERMINATORS = frozenset({"return", "sdy.return"})
_TERMINATOR_NAMES = frozenset({"stablehlo.return", "mhlo.return", "sdy.return"})
_by_name = itemgetter(0)
_NO_LOCATION = object()  # a block argument without a location (older bindings)


def _op_kind(name: str) -> tuple[str, bool, bool]:
    """(opcode, is a region terminator, is of a dialect we read) of an op name."""
    opcode = _short(name)
    return opcode, opcode in _TERMINATORS or name in _TERMINATOR_NAMES, name.startswith(_PREFIXES)


class _Reader:
    """One module walk; caches locations (MLIR uniques them, so many ops share one).

    Every property read through the MLIR bindings crosses into C++ and builds a Python object, so the
    per-op path reads each one once, and everything MLIR uniques (types, attributes, locations) is
    converted once per module and then looked up.
    """

    def __init__(self, path: str, *, name_prefix_sep: str | None = None,
                 name_lines: dict[str, int] | None = None) -> None:
        self.path = path
        self.name_lines = name_lines or {}
        self.values: dict[Any, Value] = {}
        self.loc_cache: dict[Any, SourceLoc] = {}
        self.name_sep = name_prefix_sep
        d = _jaxlib.dialects()
        self.ir = _jaxlib.ir()
        self.shlo, self.mhlo = d["stablehlo"], d["mhlo"]
        self.counter = 0
        self.meshes: dict[str, str] = {}  # sdy.mesh symbol → text, for mesh-spelled replica groups
        self.type_cache: dict[Any, Type] = {}
        self.decoded: dict[Any, tuple[tuple[Frame, ...], tuple[str, ...]]] = {}
        self.attr_cache: dict[Any, AttrValue] = {}
        # An op's attributes as (name, attribute) pairs → their Attrs: ops repeat the same few.
        self.op_attrs_cache: dict[tuple[tuple[str, Any], ...], Attrs] = {}
        self.op_kinds: dict[str, tuple[str, bool, bool]] = {}  # op name → `_op_kind`
        self.dict_attrs_cache: dict[Any, Attrs] = {}

    # -- types ---------------------------------------------------------------------------------------
    def type_of(self, t: Any) -> Type:
        # MLIR uniques types (and attributes): their Python wrappers hash by identity of the storage.
        cached = self.type_cache.get(t)
        if cached is None:
            cached = self.type_cache[t] = self._type_of(t)
        return cached

    def _type_of(self, t: Any) -> Type:
        ir = self.ir
        if isinstance(t, ir.RankedTensorType):
            return TensorType(tuple(int(s) for s in t.shape), str(t.element_type))
        if isinstance(t, ir.TupleType):
            return TupleType(tuple(self.type_of(t.get_type(i)) for i in range(t.num_types)))
        text = str(t)
        if text.endswith(".token"):
            return TokenType()
        return OpaqueType(text)

    # -- locations -------------------------------------------------------------------------------------
    def loc_of(self, loc: Any) -> SourceLoc:
        # Location wrappers hash by object; their attribute form is uniqued, so key the cache by that.
        key = loc.attr
        cached = self.loc_cache.get(key)
        if cached is None:
            # (Not through `_decode`'s memo: loc_cache keeps this, and in an HLO dump every instruction has
            # a location of its own.)
            frames, names = self._decode_new(loc, None)
            op_name = names[0] if names else None
            inst = None
            if op_name is not None and self.name_sep is not None and self.name_sep in op_name:
                inst, op_name = op_name.split(self.name_sep, 1)
                op_name = op_name or None
            line = self.name_lines.get(inst) if inst is not None else None
            cached = SourceLoc(frames, op_name, inst, self.path if line else None, line)
            self.loc_cache[key] = cached
        return cached

    def arg_loc(self, arg: Any) -> SourceLoc:
        loc = getattr(arg, "location", _NO_LOCATION)  # one read: each crosses into the bindings
        return UNKNOWN_LOC if loc is _NO_LOCATION else self.loc_of(loc)

    def _decode(self, loc: Any, fn: str | None) -> tuple[tuple[Frame, ...], tuple[str, ...]]:
        """(frames innermost first, op names) of a location; memoized per sub-location, since the
        instructions of an HLO dump share their call stacks but not their (named) locations."""
        key = (loc.attr, fn)
        hit = self.decoded.get(key)
        if hit is None:
            hit = self.decoded[key] = self._decode_new(loc, fn)
        return hit

    def _decode_new(self, loc: Any, fn: str | None) -> tuple[tuple[Frame, ...], tuple[str, ...]]:
        ir = self.ir
        frames: tuple[Frame, ...] = ()
        names: tuple[str, ...] = ()
        if isinstance(loc, ir.NameLoc):
            name = loc.name_str
            child = loc.child_loc
            if isinstance(child, ir.FileLineColLoc):
                frames, names = self._decode(child, name)  # JAX spells a frame loc("fn"("file":line:col))
            else:
                frames, inner = self._decode(child, fn)
                names = (name, *inner)
        elif isinstance(loc, ir.CallSiteLoc):
            f1, n1 = self._decode(loc.callee, fn)
            f2, n2 = self._decode(loc.caller, fn)
            frames, names = (*f1, *f2), (*n1, *n2)
        elif isinstance(loc, ir.FileLineColLoc):
            if loc.filename not in ("-", ""):
                frames = (Frame(loc.filename, int(loc.start_line), int(loc.start_col), fn),)
        elif isinstance(loc, ir.FusedLoc):
            for sub in loc.locations:
                f, n = self._decode(sub, fn)
                frames, names = (*frames, *f), (*names, *n)
        return frames, names

    # -- attributes ------------------------------------------------------------------------------------
    def attr(self, a: Any) -> AttrValue:
        try:
            if a in self.attr_cache:
                return self.attr_cache[a]
        except TypeError:  # an attribute without a hash
            return self._attr(a)
        value = self.attr_cache[a] = self._attr(a)
        return value

    def _attr(self, a: Any) -> AttrValue:
        ir, sh, mh = self.ir, self.shlo, self.mhlo
        if isinstance(a, ir.BoolAttr):
            return bool(a.value)
        if isinstance(a, ir.IntegerAttr):
            return int(a.value)
        if isinstance(a, ir.FloatAttr):
            return float(a.value)
        if isinstance(a, ir.StringAttr):
            return str(a.value)
        if isinstance(a, ir.UnitAttr):
            return True
        if isinstance(a, ir.FlatSymbolRefAttr):
            return str(a.value)
        if isinstance(a, ir.DenseI64ArrayAttr | ir.DenseI32ArrayAttr | ir.DenseBoolArrayAttr):
            return tuple(a)
        if isinstance(a, ir.DenseElementsAttr):
            return dense_literal(a)
        if isinstance(a, ir.ArrayAttr):
            return tuple(self.attr(x) for x in a)
        if isinstance(a, ir.TypeAttr):
            return self.type_of(a.value)
        if isinstance(a, ir.DictAttr):
            return self.attrs_of(a).items_
        for mod in (sh, mh):
            if mod.DotDimensionNumbers.isinstance(a):
                d = mod.DotDimensionNumbers(a)
                return DotDims(tuple(d.lhs_batching_dimensions), tuple(d.rhs_batching_dimensions),
                               tuple(d.lhs_contracting_dimensions), tuple(d.rhs_contracting_dimensions))
            if mod.GatherDimensionNumbers.isinstance(a):
                g = mod.GatherDimensionNumbers(a)
                return GatherDims(tuple(g.offset_dims), tuple(g.collapsed_slice_dims),
                                  tuple(g.operand_batching_dims), tuple(g.start_indices_batching_dims),
                                  tuple(g.start_index_map), int(g.index_vector_dim))
            if mod.ScatterDimensionNumbers.isinstance(a):
                s = mod.ScatterDimensionNumbers(a)
                return ScatterDims(tuple(s.update_window_dims), tuple(s.inserted_window_dims),
                                   tuple(s.input_batching_dims), tuple(s.scatter_indices_batching_dims),
                                   tuple(s.scattered_dims_to_operand_dims), int(s.index_vector_dim))
            if mod.ConvDimensionNumbers.isinstance(a):
                c = mod.ConvDimensionNumbers(a)
                return ConvDims(int(c.input_batch_dimension), int(c.input_feature_dimension),
                                tuple(c.input_spatial_dimensions), int(c.kernel_input_feature_dimension),
                                int(c.kernel_output_feature_dimension), tuple(c.kernel_spatial_dimensions),
                                int(c.output_batch_dimension), int(c.output_feature_dimension),
                                tuple(c.output_spatial_dimensions))
            if mod.ChannelHandle.isinstance(a):
                c = mod.ChannelHandle(a)
                return ChannelHandle(int(c.handle), int(c.channel_type))
            for enum in (mod.ComparisonDirectionAttr, mod.ComparisonTypeAttr, mod.PrecisionAttr,
                         mod.TransposeAttr, mod.RngAlgorithmAttr):
                if enum.isinstance(a):
                    return str(enum(a).value)
        if sh.ReplicaGroupMeshAxesAttr.isinstance(a):
            return self.mesh_groups(sh.ReplicaGroupMeshAxesAttr(a))
        if mh.FusionKindAttr.isinstance(a):
            return str(mh.FusionKindAttr(a).value)
        return Opaque(str(a))

    def mesh_groups(self, attr: Any) -> Literal:
        """XLA's mesh spelling of replica groups (`mesh['axis_0'=2,...] {'axis_0'}`) as explicit groups:
        every group is the devices that differ only along the named axes, in their order."""
        name = str(self.ir.FlatSymbolRefAttr(attr.mesh).value)
        if name not in self.meshes:
            raise ParseError(Span(self.path), f"replica groups name mesh @{name}, which the module does not define")
        names = []
        for ref in attr.axes:
            axis = self.shlo.AxisRefAttr(ref)
            info = axis.sub_axis_info
            names.append(str(axis.name) if info is None else
                         f"{axis.name}:({int(info.pre_size)}){int(info.size)}")
        mesh = refine_for_axes(mesh_from_sdy(self.meshes[name]), names)
        listed = [a for n in names for a in mesh_axes_of(n, mesh)]
        others = [a for a in mesh.names if a not in listed]
        order = [mesh.axis_index(a) for a in (*others, *listed)]
        grid = mesh.device_array().transpose(order).reshape(mesh.size_of(others), mesh.size_of(listed))
        return Literal(np.ascontiguousarray(grid, dtype=np.int64), "i64")

    def attrs_of(self, named: Any) -> Attrs:
        if len(named) == 0:
            return EMPTY_ATTRS
        pairs = []
        for item in named:  # op attributes iterate as names, dictionary attributes as NamedAttributes
            if isinstance(item, str):
                pairs.append((item, self.attr(named[item])))
            else:
                pairs.append((item.name, self.attr(item.attr)))
        return Attrs(tuple(sorted(pairs, key=_by_name)))

    def dict_attrs(self, d: Any) -> Attrs:
        """`attrs_of` a dictionary attribute, memoized (the arguments of a module's functions repeat a
        few dictionaries)."""
        return _memoized(self.dict_attrs_cache, d, lambda: self.attrs_of(d))

    def op_attrs(self, attributes: Any) -> Attrs:
        """`attrs_of` an op's attribute map, read in one call (`items()`) and memoized by its
        (uniqued) attributes."""
        items = attributes.items()
        if not items:
            return EMPTY_ATTRS
        return _memoized(self.op_attrs_cache, tuple(items), lambda: self._op_attrs(items))

    def _op_attrs(self, items: list[tuple[str, Any]]) -> Attrs:
        attr = self.attr
        return Attrs(tuple(sorted([(name, attr(a)) for name, a in items], key=_by_name)))

    # -- structure -------------------------------------------------------------------------------------
    def new_value(self, v: Any, name: str) -> Value:
        out = Value(self.type_of(v.type), name)
        self.values[v] = out
        return out

    def region(self, reg: Any) -> Region:
        blocks = list(reg.blocks)
        if len(blocks) != 1:
            raise ParseError(Span(self.path), f"a region with {len(blocks)} blocks; expected exactly one")
        block = blocks[0]
        args = tuple(self.new_value(a, f"%arg{i}") for i, a in enumerate(block.arguments))
        ops: list[Op] = []
        results: tuple[Value, ...] = ()
        kinds = self.op_kinds
        for mop in block.operations:
            o = mop.operation
            name = o.name
            kind = kinds.get(name)
            if kind is None:
                kind = kinds[name] = _op_kind(name)
            if kind[1]:
                results = tuple(map(self.values.__getitem__, o.operands))
                continue
            if not kind[2]:
                raise ParseError(Span(self.path, *_line_col(o.location)),
                                 f"op '{name}' is not StableHLO; expected ops of the stablehlo, mhlo, chlo, func "
                                 "and sdy dialects (a JAX/XLA program)")
            ops.append(self.op(o, kind[0]))
        return Region(args, tuple(ops), results)

    def op(self, o: Any, opcode: str) -> Op:
        loc = self.loc_of(o.location)
        values = self.values
        operands = tuple(map(values.__getitem__, o.operands))
        regions = tuple(map(self.region, o.regions))  # before the results: they number values too
        results = o.results
        single = len(results) == 1
        named = loc.name
        types = self.type_cache
        out = []
        for i, r in enumerate(results):
            self.counter += 1
            base = named or f"%{self.counter}"
            t = r.type
            ty = types.get(t)
            if ty is None:
                ty = self.type_of(t)
            value = values[r] = Value(ty, base if single else f"{base}#{i}")
            out.append(value)
        attrs = self.op_attrs(o.attributes)
        if opcode == "custom_call" and len(operands) == 1 and len(out) == 1 and operands[0].type == out[0].type:
            target = str(attrs.get("call_target_name", ""))
            op = ELEMENTWISE_CUSTOM_CALLS.get(target)
            if op is not None:  # an FFI kernel of an elementwise op: read as the op. The target stays as an
                # attribute: it tells the kernel's op from chlo's, which XLA expands (`parsers.chlo`).
                return Op(op, operands, tuple(out), Attrs.of({"call_target_name": target}), regions, loc)
        return Op(opcode, operands, tuple(out), attrs, regions, loc)

    def func(self, f: Any) -> Func:
        region = f.regions[0]
        body = self.region(region)
        attrs = f.attributes
        arg_attrs = _per_index(self, attrs, "arg_attrs", len(body.args))
        res_attrs = _per_index(self, attrs, "res_attrs", len(body.results))
        arg_locs = tuple(self.arg_loc(a) for a in region.blocks[0].arguments)
        return Func(str(self.ir.StringAttr(attrs["sym_name"]).value), body, arg_attrs, res_attrs, arg_locs)


def _memoized(cache: dict[Any, Attrs], key: Any, make: Callable[[], Attrs]) -> Attrs:
    try:
        hit = cache.get(key)
    except TypeError:  # an attribute without a hash
        return make()
    if hit is None:
        hit = cache[key] = make()
    return hit


def _line_col(loc: Any) -> tuple[int | None, int | None]:
    m = re.search(r":(\d+):(\d+)", str(loc))
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _per_index(reader: _Reader, attrs: Any, key: str, n: int) -> tuple[Attrs, ...]:
    if key not in attrs:
        return tuple(EMPTY_ATTRS for _ in range(n))
    return tuple(map(reader.dict_attrs, reader.ir.ArrayAttr(attrs[key])))


def _short(name: str) -> str:
    for p in _PREFIXES:
        if name.startswith(p):
            return name[len(p):]
    return name


def dense_literal(a: Any) -> Literal:
    """A DenseElementsAttr as an immutable array (via the buffer protocol, or its printed form for bf16)."""
    t = a.type
    dtype = str(t.element_type)
    shape = tuple(int(s) for s in t.shape)
    try:
        if a.is_splat:
            v = a.get_splat_value()
            scalar = np.array(_scalar(v), dtype=_holder(dtype))
            return Literal(np.broadcast_to(scalar, shape).copy(), dtype)
        return Literal(np.array(a).astype(_holder(dtype), copy=False).reshape(shape), dtype)
    except (TypeError, ValueError, RuntimeError):
        return Literal(_from_text(str(a), dtype, shape), dtype)


def _holder(dtype: str) -> np.dtype[Any]:
    try:
        nd = numpy_dtype(dtype)
    except ValueError:
        return np.dtype("float64")
    # Low-precision floats are held as float32: the interpreter rounds on convert, not on storage.
    return np.dtype("float32") if nd.kind == "V" or (nd.itemsize < 4 and nd.kind == "f") else nd


def _scalar(v: Any) -> Any:
    ir = _jaxlib.ir()
    if isinstance(v, ir.BoolAttr):
        return bool(v.value)
    if isinstance(v, ir.IntegerAttr):
        return int(v.value)
    if isinstance(v, ir.FloatAttr):
        return float(v.value)
    raise TypeError(f"unsupported splat element {v}")


_TOKEN = re.compile(r"0x[0-9A-Fa-f]+|true|false|[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)")


def _from_text(text: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decode MLIR's printed dense literal (only for element types NumPy cannot take a buffer of).

    The printed nesting is the shape in row-major order, so the element tokens alone suffice.
    """
    body = text[text.index("<") + 1: text.rindex(">")]
    holder = _holder(dtype)
    width = {"bf16": 2, "f16": 2, "f8E4M3FN": 1, "f8E5M2": 1}.get(dtype, 4)
    if body.startswith('"0x'):
        bits = np.frombuffer(bytes.fromhex(body[3:-1]), dtype=f"<u{width}")
        return bits.view(numpy_dtype(dtype)).astype(holder).reshape(shape)
    values: list[float] = []
    for tok in _TOKEN.findall(body):
        if tok.startswith("0x"):  # a bit pattern: how MLIR prints non-finite floats
            values.append(float(np.array([int(tok, 16)], dtype=f"<u{width}").view(numpy_dtype(dtype))[0]))
        else:
            values.append(float(tok == "true") if tok in ("true", "false") else float(tok))
    return np.broadcast_to(np.array(values, dtype=holder), shape).copy()


def read_mlir_module(mod: Any, path: str, kind: str = "stablehlo", name_sep: str | None = None,
                     name_lines: dict[str, int] | None = None) -> Module:
    """Walk a parsed `ir.Module` into the common IR."""
    reader = _Reader(path, name_prefix_sep=name_sep, name_lines=name_lines)
    ir = reader.ir
    for top in mod.body.operations:
        if top.operation.name == "sdy.mesh":
            o = top.operation
            reader.meshes[str(ir.StringAttr(o.attributes["sym_name"]).value)] = str(o.attributes["mesh"])
    funcs: dict[str, Func] = {}
    meshes: list[tuple[str, str]] = []
    entry = None
    for top in mod.body.operations:
        o = top.operation
        if o.name == "func.func":
            f = reader.func(o)
            funcs[f.name] = f
            vis = o.attributes["sym_visibility"] if "sym_visibility" in o.attributes else None
            if f.name == "main" or (entry is None and vis is not None and str(vis) == '"public"'):
                entry = f.name
        elif o.name == "sdy.mesh" and kind != "hlo":
            # (In converted HLO the meshes only spell replica groups; they are resolved above.)
            name = str(ir.StringAttr(o.attributes["sym_name"]).value)
            text = str(o.attributes["mesh"])
            # jax 0.12 lowers a shard_map's collectives with mesh-spelled replica groups on a second
            # mesh, `@mesh_0`, identical to `@mesh` (the groups are resolved above): one device
            # arrangement under two names is one mesh, so only the first name is kept.
            if all(text != seen for _, seen in meshes):
                meshes.append((name, text))
    if not funcs:
        raise ParseError(Span(path), "no func.func in the module; expected a StableHLO module with a @main")
    if entry is None:
        entry = "main" if "main" in funcs else next(iter(funcs))
    op = mod.operation
    name_attr = op.attributes["sym_name"] if "sym_name" in op.attributes else None
    name = str(ir.StringAttr(name_attr).value) if name_attr is not None else "module"
    return Module(name, entry, funcs, path, kind, reader.attrs_of(op.attributes), tuple(meshes))


def _diagnostic(err: Any, path: str, text: str | None) -> ParseError:
    diags = getattr(err, "error_diagnostics", None) or []
    line = col = None
    message = str(err).strip().splitlines()[-1] if str(err).strip() else "cannot parse"
    if diags:
        d = diags[0]
        message = d.message
        m = re.search(r":(\d+):(\d+)", str(d.location))
        if m:
            line, col = int(m.group(1)), int(m.group(2))
    src = text.splitlines()[line - 1] if text is not None and line and line <= len(text.splitlines()) else None
    return ParseError(Span(path, line, col, src), f"not valid StableHLO/MLIR: {message}")


def parse_mlir(data: str | bytes, path: str, *, kind: str = "stablehlo", name_sep: str | None = None,
               name_lines: dict[str, int] | None = None) -> Module:
    """Parse StableHLO text or bytecode with jaxlib's MLIR bindings, then walk it."""
    ir = _jaxlib.ir()
    with _jaxlib.make_context():
        try:
            mod = ir.Module.parse(data)
        except _jaxlib.mlir_errors() as err:  # a diagnostic with a location
            raise _diagnostic(err, path, data if isinstance(data, str) else None) from None
        return read_mlir_module(mod, path, kind, name_sep, name_lines)
