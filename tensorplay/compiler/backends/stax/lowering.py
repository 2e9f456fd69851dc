"""GraphLowering: the op-level graph -> loop-level IR (chapter §6).

Walks the graph once.  Placeholders become :class:`InputBuffer`s; each ``call_function`` node is
lowered by its rule in :data:`op_lowerings.LOWERINGS` (looked up by op name), which returns
:class:`TensorBox`es holding unrealized functions; views of realized buffers become
:class:`ReinterpretView`s whose (size, stride, offset) come from running the view op on a meta
tensor with the buffer's layout (``op_lowerings/view_rules.py``) — so every view op of the table
gets exact strides for free.

A node with no lowering (or whose lowering raises :class:`Unsupported`) becomes a **fallback**
kernel: the wrapper calls the op's eager kernel.  ``TP_STAX_LOWER_DEBUG=1`` (the knob
``stax.lower_debug``) lists them with the reason; ``strict_native=True`` makes any fallback an error.

Materialisation (§6.6): after a node is lowered, :func:`choices.should_realize` decides from its
number of readers and its price (loads, transcendental calls) whether its value is written to
memory or recomputed inside each reader.  Reductions, graph outputs and inputs of extern kernels
are always realized.
"""
from __future__ import annotations

import math
import operator
import sys
import types

import sympy
import torch

from ... import config
from ...capture.fakes import fake_mode_of, map_leaves
from ...graph.node import map_arg
from . import choices
from .sizevars import SizeVarAllocator, statically_known_lt
from .ir import (ComputedBuffer, ExternBuffer, FixedLayout, InputBuffer, Loops, Pointwise, Reduction,
                 ReinterpretView, TensorBox, Unsupported, contiguous_strides)

__all__ = ["GraphLowering", "StaxLoweringError"]


class StaxLoweringError(RuntimeError):
    pass


def _debug_enabled():
    return config.get("stax.lower_debug")


class GraphLowering:
    def __init__(self, gm, example_inputs):
        self.gm = gm
        self.example_inputs = list(example_inputs)
        self.inputs: list[InputBuffer] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.sizevars = SizeVarAllocator()   # the graph's size symbols (none while shapes are static)
        from .device import backend_for
        self.native_dtypes = backend_for(self.example_inputs).native_dtypes   # (of the device's backend)
        devs = {t.device for t in self.example_inputs if hasattr(t, "device") and t.device.type != "meta"}
        #: the graph's device: where a value whose meta is on "meta" (an AOT graph's) lives
        self.device = devs.pop() if len(devs) == 1 else torch.device("cpu")
        self.fake_mode = None            # a symbolic graph's FakeTensorMode (run: fake_mode_of)
        self.buffers: list = []          # ComputedBuffer / ExternBuffer in creation order
        self.env: dict = {}
        self.fallbacks: list[tuple[str, str]] = []
        self.outputs: list = []
        self.mutations: list[tuple[InputBuffer, object]] = []   # (input, value) write-backs
        self._n = 0
        self.current_node = None
        self._copies: dict = {}          # batched_matrix_copy: (id, layout) -> (source, copy)
        self._seed = None                # random_stream: the graph's seed buffer, drawn once per call
        self._streams = 0

    # -- naming / realization -----------------------------------------------------------------------
    def new_name(self, prefix="buf"):
        self._n += 1
        return f"{prefix}{self._n - 1}"

    def realize(self, box: TensorBox):
        """Materialise ``box`` (if it is an unrealized function) into a ComputedBuffer."""
        d = box.data
        if isinstance(d, Loops):
            size = d.get_size()
            layout = FixedLayout(d.dtype, d.device, tuple(size), contiguous_strides(size), 0)
            buf = ComputedBuffer(self.new_name(), layout, d)
            buf.flexible = True
            self.buffers.append(buf)
            box.data = buf
        return box.data

    def layout_of(self, box: TensorBox) -> FixedLayout:
        d = self.realize(box)
        return d.layout

    # -- the walk ---------------------------------------------------------------------------------
    def run(self):
        self.fake_mode = fake_mode_of(self.gm)
        if self.fake_mode is None:
            return self._run()
        # a symbolic graph (§10): every node's meta value is seen by the rules as a SymbolicValue
        # (sizes as this graph's expressions) while the graph is lowered
        saved = {n: n.meta["val"] for n in self.gm.graph.nodes if "val" in n.meta}
        try:
            for n, v in saved.items():
                n.meta["val"] = map_leaves(v, self.symbolic_value)
            return self._run()
        finally:
            for n, v in saved.items():
                n.meta["val"] = v

    @property
    def symbolic(self) -> bool:
        """Is the graph being lowered symbolic (sizes that are expressions of its inputs')?"""
        return self.fake_mode is not None

    def symbolic_value(self, v):
        """A fake tensor of the capture as a :class:`SymbolicValue`; other values unchanged
        (SymInts as expressions)."""
        if isinstance(v, torch.Tensor):
            return SymbolicValue(v, self.sizevars.from_torch)
        if isinstance(v, (torch.SymInt, sympy.Basic)):
            return self.sizevars.from_torch(v)
        return v

    def size_args(self, x):
        """Node arguments with every size (SymInt or a capture's sympy expression) as this graph's
        expression (lists, tuples and slices recursively)."""
        def leaf(v):
            if isinstance(v, (torch.SymInt, sympy.Basic)):
                e = self.sizevars.from_torch(v)
                return int(e) if e.is_Integer else e
            return v
        return map_leaves(x, leaf)

    def run_on_fakes(self, fn, layout, *args):
        """``fn(t, *args)`` on a tensor laid out as ``layout`` (size, stride, offset): a meta tensor
        while shapes are static, a fake of the capture's ShapeEnv when they are symbolic (``args``'
        expressions as SymInts); the result's tensors as (size, stride, offset) expressions."""
        if not self.symbolic:
            meta = torch.empty_strided((layout.storage_extent() or 1,), (1,), dtype=layout.dtype, device="meta")
            out = fn(meta.as_strided(layout.size, layout.stride, layout.offset), *args)
            return map_leaves(out, lambda t: (tuple(t.shape), tuple(t.stride()), t.storage_offset(), t._is_view())
                               if isinstance(t, torch.Tensor) else t)
        from torch._dispatch.python import enable_python_dispatcher
        sym = self._to_symint
        with self.fake_mode, enable_python_dispatcher():
            base = torch.empty_strided((sym(layout.storage_extent()),), (1,), dtype=layout.dtype, device="meta")
            t = base.as_strided([sym(e) for e in layout.size], [sym(e) for e in layout.stride], sym(layout.offset))
            out = fn(t, *map_leaves(list(args), sym))

        def back(v):
            if isinstance(v, torch.Tensor):
                f = self.sizevars.from_torch
                return (tuple(map(f, v.shape)), tuple(map(f, v.stride())), f(v.storage_offset()), v._is_view())
            return self.size_args(v)
        return map_leaves(out, back)

    def _to_symint(self, e):
        """A size expression of this graph as a SymInt of the capture's ShapeEnv (an int if static)."""
        if not isinstance(e, sympy.Basic):
            return e
        e = sympy.sympify(e)
        if e.is_Integer:
            return int(e)
        from .sizevars import to_torch_expr
        env = self.sizevars.shape_env
        return env.create_symintnode(to_torch_expr(e), hint=self.sizevars.size_hint(e))

    def _run(self):
        from .op_lowerings import LOWERINGS
        ex = iter(self.example_inputs)
        for node in self.gm.graph.nodes:
            self.current_node = node
            if node.op == "placeholder":
                t = next(ex)
                d = t._data if hasattr(t, "_data") else t
                val = node.meta.get("val")
                if isinstance(val, SymbolicValue):   # sizes and strides: expressions of the sizes
                    d = val
                # offsets are relative to data_ptr(), which already includes the storage offset
                # (and the offset is not part of the specialization key)
                buf = InputBuffer(f"arg{len(self.inputs)}", FixedLayout(d.dtype, d.device, tuple(d.shape),
                                                                        tuple(d.stride()), 0))
                self.inputs.append(buf)
                self.env[node] = TensorBox(buf)
            elif node.op == "get_attr":
                val = getattr(self.gm, node.target)
                d = val._data if hasattr(val, "_data") else val
                if not isinstance(d, torch.Tensor):
                    self.env[node] = d
                    continue
                name = f"const{len(self.constants)}"
                self.constants[name] = d
                self.env[node] = TensorBox(InputBuffer(name, FixedLayout(d.dtype, d.device, tuple(d.shape),
                                                                         tuple(d.stride()), 0)))
            elif node.op == "call_function":
                self.env[node] = self.lower_node(node, LOWERINGS)
            elif node.op == "output":
                for o in node.args[0]:
                    box = self.env[o]
                    if isinstance(box.data, Loops):
                        self.realize(box)
                    _take_eager_strides(box.data, o.meta.get("val") if hasattr(o, "meta") else None)
                    self.outputs.append(box.data)
        return self

    def lower_node(self, node, table):
        if node.target is operator.getitem:
            return self.env[node.args[0]][node.args[1]]
        d = node.opdef
        if d is None:
            return self.fallback(node, f"{node.target_name} is not an op-table entry")
        args = map_arg(node.args, self.env.__getitem__)
        if self.symbolic:
            args = self.size_args(args)
        rule = table.get(d.name)
        if rule is None:
            return self.fallback(node, "no lowering registered")
        if _touches_sparse(node):
            return self.fallback(node, "a sparse tensor has no loop form (ATen's kernel takes it)")
        if not _native_dtypes_ok(node, self.native_dtypes):
            return self.fallback(node, "dtype without native support on this device (DeviceBackend.native_dtypes)")
        try:
            out = rule(*args)
        except Unsupported as e:
            return self.fallback(node, str(e))
        if isinstance(out, TensorBox) and isinstance(out.data, Loops):
            self._check_meta(node, out)
            if isinstance(out.data, Reduction):
                self.realize(out)
            elif choices.should_realize(out.data, node):
                self.realize(out)
        return out

    def _check_meta(self, node, box):
        from .sizevars import statically_known_equals
        val = node.meta.get("val")
        if hasattr(val, "shape") and (len(val.shape) != len(box.get_size()) or val.dtype != box.dtype or not all(
                statically_known_equals(a, b) for a, b in zip(val.shape, box.get_size()))):
            raise StaxLoweringError(f"lowering of {node.format_node()} produced {box.dtype}{list(box.get_size())}, "
                                    f"meta says {val.dtype}{list(val.shape)}")

    # -- fallbacks and extern calls ---------------------------------------------------------------
    def fallback(self, node, reason, kind="fallback", prepare=None):
        """A kernel that calls the op's eager implementation (an ATen library kernel for
        ``kind="extern"``).  ``prepare(realized) -> realized`` may replace a tensor argument (e.g.
        by a contiguous copy the library kernel would otherwise make itself)."""
        d = node.opdef
        name = d.name if d is not None else node.target_name
        if kind == "fallback":
            self.fallbacks.append((name, reason))
            if _debug_enabled():
                print(f"[stax] fallback kernel for {name}: {reason}  ({node.format_node()})", file=sys.stderr)
        prep = prepare or (lambda r: r)
        args = map_arg(node.args, lambda n: prep(self._extern_arg(self.env[n])))
        if self.symbolic:
            args = self.size_args(args)
        val = node.meta.get("val")
        if d is not None and d.is_inplace:
            if "random" not in d.tags:
                raise Unsupported(f"in-place op {name} left after functionalisation")
            # a random fill (uniform_, ...) that functionalisation applied to a private clone: the
            # call fills the clone's buffer and returns it, so that buffer must never be reused
            base = args[0].data if isinstance(args[0], ReinterpretView) else args[0]
            base.aliased = True
        if isinstance(val, (tuple, list)):
            outs = []
            shared = types.SimpleNamespace(var=None)   # one call for all outputs: a random op draws once
            for i, v in enumerate(val):
                if hasattr(v, "shape"):
                    buf = ExternBuffer(self.new_name(), _layout_of_meta(v, self.device), d, args, kind, reason, index=i)
                    buf.shared = shared
                    self.buffers.append(buf)
                    outs.append(TensorBox(buf))
                else:
                    outs.append(v)
            return tuple(outs)
        buf = ExternBuffer(self.new_name(), _layout_of_meta(val, self.device), d, args, kind, reason)
        self.buffers.append(buf)
        return TensorBox(buf)

    def extern(self, reason="library kernel", prepare=None):
        return self.fallback(self.current_node, reason, kind="extern", prepare=prepare)

    def batched_matrix_copy(self, data):
        """A dense copy of a realized buffer or view, batch dims row-major and each trailing matrix
        in the source's own order (row- or column-major: a matmul reads either without a copy),
        as a Stax kernel; one per source per graph."""
        key = (id(data), data.layout)
        cache = self._copies     # the source is kept alive with its copy, so its id stays unique
        if key not in cache:
            box = TensorBox(data)
            size = tuple(data.layout.size)
            m, n = size[-2:]
            st = data.layout.stride
            col = st[-2] == 1 and st[-1] != 1 and statically_known_lt(1, n)
            strides = list(contiguous_strides(size[:-2] + (m * n,))[:-1]) + ([1, m] if col else [n, 1])
            buf = self.realize(TensorBox(Pointwise(data.dtype, data.device, list(size), box.make_loader())))
            buf.set_layout(FixedLayout(data.dtype, data.device, size, tuple(strides), 0))
            buf.freeze_layout()
            cache[key] = (data, buf)
        return cache[key][1]

    def random_stream(self):
        """``(seed buffer name, stream number)`` for one random op.  The first call adds an extern
        kernel that draws the graph's int64 seed from the global generator (op ``_random_seed``),
        so every call of the compiled graph gets fresh numbers; each random op gets its own
        stream of the Philox counter space."""
        if self._seed is None:
            from ....ops import OPS
            layout = FixedLayout(torch.int64, torch.device("cpu"), (), (), 0)
            self._seed = ExternBuffer(self.new_name("seed"), layout, OPS["_random_seed"], (), "extern",
                                      "seed of the graph's random streams")
            self.buffers.append(self._seed)
        self._streams += 1
        return self._seed.name, self._streams - 1

    def _extern_arg(self, v):
        if isinstance(v, TensorBox):
            return self.realize(v)
        return v


def _take_eager_strides(buf, val):
    """Outputs keep eager's strides (``x.t().exp()`` is column-major in eager, so it is here): a
    flexible buffer takes the meta value's strides when they are dense and non-overlapping."""
    if not (getattr(buf, "flexible", False) and isinstance(val, (torch.Tensor, SymbolicValue))):
        return
    stride = tuple(val.stride())
    if stride == buf.layout.stride or not _dense(val.shape, stride):
        return
    buf.set_layout(FixedLayout(buf.layout.dtype, buf.layout.device, buf.layout.size, stride, 0))
    buf.freeze_layout()


def _dense(size, stride) -> bool:
    """Is (size, stride) a permutation of a contiguous layout (size-1 dims ignored)?  Symbolic
    strides are ordered by their values at the hints; each must then equal the product."""
    from .sizevars import size_hint, statically_known_equals
    dims = sorted(((s, n) for n, s in zip(size, stride) if n != 1), key=lambda p: (size_hint(p[0]), size_hint(p[1])))
    acc = sympy.Integer(1)
    for s, n in dims:
        if not statically_known_equals(s, acc):
            return False
        acc = acc * n
    return True


def _layout_of_meta(v, device) -> FixedLayout:
    """The layout of an extern/fallback result: the meta value's size and strides, offset 0 -- the
    kernels address the result from its own data_ptr (runtime.as_layout), wherever in its storage
    it starts (a meta alias of an input has the input's offset, which is no offset of the result)."""
    dev = v.device if v.device.type != "meta" else device
    return FixedLayout(v.dtype, dev, tuple(v.shape), tuple(v.stride()), 0)


class SymbolicValue:
    """What a rule sees as a node's meta value in a symbolic graph: the capture's fake tensor
    with its sizes, strides and offset as this graph's expressions (sizevars.from_torch); every
    other attribute is the fake's."""

    def __init__(self, fake, conv):
        self.fake = fake
        self.shape = tuple(conv(s) for s in fake.shape)
        self._stride = tuple(conv(s) for s in fake.stride())
        self._offset = conv(fake.storage_offset())
        self.dtype, self.device = fake.dtype, fake.device

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def stride(self, dim=None):
        return self._stride if dim is None else self._stride[dim]

    def storage_offset(self):
        return self._offset

    def dim(self):
        return len(self.shape)

    ndim = property(dim)

    def numel(self):
        return math.prod(self.shape, start=sympy.Integer(1))

    def __getattr__(self, name):
        return getattr(self.fake, name)


def _touches_sparse(node) -> bool:
    """Whether the node reads or makes a sparse (non-strided) tensor, per the capture's metas."""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes if hasattr(a, "meta")]
    return any(getattr(v, "layout", torch.strided) != torch.strided for v in vals if isinstance(v, torch.Tensor))


def _native_dtypes_ok(node, native) -> bool:
    """Do the node's value and inputs have dtypes the device's kernels compute in (``native``:
    ``DeviceBackend.native_dtypes`` of the backend that runs for the graph's device)?"""
    vals = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    return all(t.dtype in native for v in vals for t in (v if isinstance(v, (tuple, list)) else (v,))
               if hasattr(t, "dtype"))
