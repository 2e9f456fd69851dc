"""Capture: run the function on proxies and record every op into a graph (chapter §3.2–3.5).

``capture(fn, args, kwargs, execute=True)`` returns a :class:`Capture`:

* tensor leaves of the inputs become ``placeholder`` nodes (in flattening order);
* Python scalars and other non-tensor inputs are passed as they are — the graph is specialized to
  their values (they are part of the specialization key, §2.2);
* every eager op the function runs is recorded as a ``call_function`` node of its op-table entry
  with its canonical arguments (the dispatcher calls the tracer after each op);
* a tensor used by the function that is not a proxy is either a **free tensor** — reachable from
  the function's closure cells, its globals, or the state of the module being compiled — which is
  lifted to an extra placeholder and re-read at every call, or a **constant** (made inside the
  function without an op, e.g. ``tp.tensor([...])``), stored in the GraphModule as an attribute;
* ``bool``/``int``/``float``/``item``/``tolist`` on a proxy record **data gates** (proxy.py);
* ``dynamic=True``: a shadow run on fake tensors gives every node symbolic sizes (symbolic.py);
  ``dynamic={leaf index: dims}`` (``dynamic="auto"``, ``tp.mark_dynamic``): only those dims and the
  marked ones are symbols; an op whose output size depends on values (``x[mask]``, ``unique``)
  gets an *unbacked* symbol under ``dynamic=True`` (a Python branch on it is a CaptureError that
  says to state the fact with ``tp.check``), the sample's size and a shape gate otherwise.

Python side effects (prints, appends to lists, counters) happen once, during capture; the compiled
function replays only tensor operations.  Capture either succeeds for the whole function or raises
:class:`CaptureError` with the source line: there are no graph breaks (§11.3).
"""
from __future__ import annotations

import dataclasses
import types
from weakref import ref as weakref_ref

import torch

from ..._tensor import Tensor, _wrap
from ...autograd import grad_mode
from ...ops import registry
from ..graph import Graph, GraphModule
from .proxy import CaptureError, Proxy, where
from .pytree import tree_flatten

__all__ = ["capture", "Capture", "Gate", "FreeTensor", "find_sources", "TENSOR_LEAF"]


class _TensorLeaf:
    """Marks the positions of tensor outputs among the constant output leaves (a ``None``
    output is a constant like any other)."""

    def __repr__(self):
        return "TENSOR_LEAF"


TENSOR_LEAF = _TensorLeaf()


@dataclasses.dataclass
class Gate:
    node: object          # the graph node whose value was converted
    kind: str             # bool / item / int / float / index / tolist / shape / check
    value: object         # the recorded outcome
    where: str            # source line
    convert: object = None   # data -> value, for kinds not in _CONVERT (a tp.check of a data-dependent size)
    text: str = ""        # what is checked, in words (tp.check)

    def describe(self) -> str:
        if self.text:
            return f"{self.text} at {self.where}"
        return f"{self.kind}({self.node.name}) at {self.where}"


@dataclasses.dataclass
class FreeTensor:
    name: str             # human-readable source: "global 'w'", "closure 'k'", "self.fc.weight"
    get: object           # callable returning the current tensor
    tensor: object        # the tensor seen at capture


_to_meta = registry._to_meta   # (symbolic fake tensors stay fake: dynamic=True)


_CONVERT = {"bool": lambda d: bool(d), "item": lambda d: d.item(), "int": lambda d: int(d.item()),
            "float": lambda d: float(d.item()), "index": lambda d: int(d.item()), "tolist": lambda d: d.tolist(),
            "shape": lambda d: tuple(d.shape)}


def convert_gate(kind, tensor, convert=None):
    d = tensor._data if isinstance(tensor, Tensor) else tensor
    return (convert or _CONVERT[kind])(d)


def find_sources(fn, module=None, modules=None) -> dict:
    """id(tensor) -> (description, getter) for tensors reachable from fn's closure, globals and
    the module's parameters/buffers.  ``modules``: a list that receives ``(description, getter)``
    for the module and every module found in the closure or globals (their ``training`` flags are
    part of the specialization key)."""
    from ...nn import Module
    src = {}
    seen = set()

    def found(v, desc, get):
        _module_sources(src, v, desc, get)
        if modules is not None and id(v) not in seen:
            seen.add(id(v))
            modules.append((desc, get))
    if module is not None:
        found(module, "self", lambda m=module: m)
    f = fn.__func__ if isinstance(fn, types.MethodType) else fn
    code = getattr(f, "__code__", None)
    if code is not None:
        for name, cell in zip(code.co_freevars, getattr(f, "__closure__", None) or ()):
            try:
                v = cell.cell_contents
            except ValueError:
                continue
            if isinstance(v, Tensor) and id(v) not in src:
                src[id(v)] = (f"closure '{name}'", (lambda c=cell: c.cell_contents))
            elif isinstance(v, Module):
                found(v, f"closure '{name}'", lambda c=cell: c.cell_contents)
        g = getattr(f, "__globals__", {})
        for name in code.co_names:
            v = g.get(name)
            if isinstance(v, Tensor) and id(v) not in src:
                src[id(v)] = (f"global '{name}'", (lambda gl=g, n=name: gl[n]))
            elif isinstance(v, Module):
                found(v, f"global '{name}'", lambda gl=g, n=name: gl[n])
    return src


def _module_sources(src, module, desc, get_module):
    """Parameters and buffers of a module reachable as ``desc`` (re-read through ``get_module``
    on every call, so replaced or updated parameters are never stale)."""
    for items in (module.named_parameters(), module.named_buffers()):
        for qual, t in items:
            if id(t) not in src:
                path = qual.split(".")
                src[id(t)] = (f"{desc}.{qual}", lambda p=path: _attr_getter(get_module(), p)())


def _attr_getter(root, path):
    def get():
        o = root
        for p in path:
            o = getattr(o, p)
        return o
    return get


class Tracer:
    def __init__(self, execute=True, sources=None, dynamic=False, buckets=False):
        self.graph = Graph()
        # dynamic=True or {leaf index: dims}: the symbolic shadow run (symbolic.py); None: static shapes
        self.sym = None
        self._dims = dynamic if isinstance(dynamic, dict) else None   # (AOT sets .sym on a static tracer)
        if dynamic is True or isinstance(dynamic, dict):
            # (imported only then: a warm process imports neither sympy nor fake tensors)
            from .symbolic import SymbolicShapes
            self.sym = SymbolicShapes(unbacked=dynamic is True, buckets=buckets)
        self._fakes: dict = {}                 # id(lifted tensor) -> its static fake (dynamic only)
        self.execute = execute
        self.active = False
        self.gates: list[Gate] = []
        self.free: list[FreeTensor] = []
        self.constants: dict[str, Tensor] = {}
        self._lifted: dict[int, object] = {}   # id(tensor) -> node
        self._keepalive: list = []
        self.sources = sources or {}
        self.n_inputs = 0
        self._proxies: list = []

    # -- inputs --------------------------------------------------------------------------------------
    def placeholder(self, name: str, t: Tensor, index=None) -> Proxy:
        """A proxy for input ``t``.  With execute=True it shares ``t``'s storage and autograd
        identity, so the capture run *is* the first call: in-place updates happen once and
        gradients reach ``t``."""
        node = self.graph.placeholder(name)
        self.n_inputs += 1
        p = object.__new__(Proxy)
        if self.execute:
            p._data = t._data
            if t.requires_grad:
                from ...autograd.graph import accumulate_node
                import weakref
                p.requires_grad = True
                p.grad_fn, p._output_nr = t.grad_fn, t._output_nr
                if t.grad_fn is None:
                    acc = accumulate_node(t)   # the leaf's own sink: gradients reach t
                    self._keepalive.append(acc)
                    p._accumulate = weakref.ref(acc)
            p._base, p._view_src = t._base, t._view_src
        else:
            p._data = _to_meta(t._data)
        p._node = node
        p._tracer = self
        node.meta["val"] = _to_meta(t._data)
        if self.sym is not None:
            leaf = self.n_inputs - 1 if index is None else index
            dims = None if self._dims is None else self._dims.get(leaf, ())
            p._fake = self.sym.input_fake(t._data, node.name, leaf, name, dims=dims,
                                          marks=getattr(t, "_tp_dynamic_dims", None))
            node.meta["sym"] = p._fake
        self._proxies.append(weakref_ref(p))
        return p

    def _free_placeholder(self, name):
        """A placeholder for a lifted free tensor, after the existing placeholders."""
        first = next((n for n in self.graph.nodes if n.op != "placeholder"), None)
        if first is None:
            return self.graph.placeholder(name)
        with self.graph.inserting_before(first):
            return self.graph.placeholder(name)

    def node_of(self, t):
        """The graph node for a tensor argument, lifting non-proxies."""
        if isinstance(t, Proxy) and t._tracer is self:
            return t._node
        key = id(t)
        node = self._lifted.get(key)
        if node is not None:
            return node
        self._keepalive.append(t)
        src = self.sources.get(key)
        if src is not None:
            desc, get = src
            name = "free_" + desc.replace("self.", "").replace("'", "").replace("global ", "").replace("closure ", "")
            node = self._free_placeholder(name)
            self.free.append(FreeTensor(desc, get, t))
        elif t.requires_grad:
            # reachable some other way (a list, an attribute of an object): never freeze a tensor
            # that takes part in autograd into a constant — re-read the same object every call
            name = f"free_tensor_{len(self.free)}"
            node = self._free_placeholder(name)
            self.free.append(FreeTensor(f"a free tensor that requires grad ({name})", lambda t=t: t, t))
        else:
            # a constant: snapshot its value now — the capture run may still mutate it in place
            attr = f"const_{len(self.constants)}"
            self.constants[attr] = _wrap(t._data.clone()) if self.execute else t
            first = next((n for n in self.graph.nodes if n.op not in ("placeholder",)), None)
            if first is None:
                node = self.graph.get_attr(attr)
            else:
                with self.graph.inserting_before(first):
                    node = self.graph.get_attr(attr)
        node.meta["val"] = _to_meta(t._data)
        if self.sym is not None:
            node.meta["sym"] = self._fakes[key] = self.sym.static_fake(t._data)
        self._lifted[key] = node
        return node

    # -- the dispatcher hooks -----------------------------------------------------------------------
    def before_op(self, op, args, raw):
        """Before a kernel: a non-proxy tensor about to be mutated is lifted first (so a constant
        is snapshotted before the capture run changes it); with execute=False every tensor
        argument becomes a meta tensor."""
        if not self.active:
            return raw
        mp = op.schema.mutated_pos
        if mp is not None and isinstance(args[mp], Tensor):
            self.node_of(args[mp])
        if self.sym is not None:
            raw = self.sym.hints_of(raw)      # the sample run computes with the sample sizes (no guard)
        if not self.execute:
            return registry._to_meta_args(op.schema, raw)
        return raw

    def on_op(self, op, args, outs):
        if not self.active:
            return
        s = op.schema
        nargs = _map_tensor_args(s, args, self.node_of)
        if self.sym is not None:
            nargs = self.sym.args_to_exprs(nargs)
        node = self.graph.call_function(op, tuple(nargs))
        # (with execute=False such an op's meta function has already raised DataDependentShapeError)
        sample_args = args if self.sym is None else self.sym.hints_of(args)
        dynamic = s.mutated_pos is None and self.execute and op.output_shape_depends_on_data(*sample_args)
        if self.sym is not None:
            self._shadow(op, args, outs, node, dynamic)
        if s.mutated_pos is not None:
            node.meta["val"] = _to_meta(outs[0]._data)
            return
        tensors = [o for o in outs if isinstance(o, Tensor)]
        if len(outs) == 1 and not s.returns_list and not s.returns_tuple:
            self._become(outs[0], node)
        else:
            import operator
            node.meta["val"] = tuple(_to_meta(o._data) if isinstance(o, Tensor) else o for o in outs)
            for i, o in enumerate(outs):
                if isinstance(o, Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    self._become(o, g)
        if self.sym is not None and self.sym.env.pending_fresh_unbacked_symbols:
            # dynamic=True: the output sizes are unbacked symbols, read from the outputs when the
            # graph runs — no shape gate
            found = self.sym.bind_unbacked(node.meta["sym"], [o._node.name if isinstance(o, Proxy) else None for o in outs],
                                           op.name, where(), [o._data if isinstance(o, Tensor) else None for o in outs])
            dynamic = dynamic and not found
        if dynamic:
            # the graph is specialised to these output shapes: each is a data gate, checked by the
            # replay before every call (a call whose shapes differ recompiles)
            for t in tensors:
                self.record_gate(t, "shape", convert_gate("shape", t))

    # -- the symbolic shadow (dynamic=True, symbolic.py) -----------------------------------------------
    def fake_of(self, t):
        """The fake (symbolic) tensor of a tensor argument: a proxy's own, a lifted tensor's static one."""
        if isinstance(t, Proxy) and t._tracer is self:
            return t._fake
        self.node_of(t)
        return self._fakes[id(t)]

    def _shadow(self, op, args, outs, node, data_dependent):
        """Run ``op`` on the fakes of its arguments: ``meta["sym"]`` of the node (the outputs' fakes
        are read from it by _shadow_output).  ``data_dependent``: the op's output size depends on
        values — an unbacked symbol with dynamic=True, else the sample's size."""
        s = op.schema
        try:
            if data_dependent and not self.sym.unbacked:
                raise _KeepSampleSize
            dev = next((o._data.device for o in outs if isinstance(o, Tensor)), "cpu")
            res = self.sym.run(op, _map_tensor_args(s, args, self.fake_of), dev)
        except Exception:
            if not data_dependent:
                raise
            # a data-dependent output shape (x[mask], unique): the output's sizes are the sample's,
            # which the shape gates of on_op check before every call
            fakes = [self.sym.static_fake(o._data) if isinstance(o, Tensor) else o for o in outs]
            res = fakes[0] if len(outs) == 1 and not s.returns_list and not s.returns_tuple else tuple(fakes)
        if s.mutated_pos is not None:
            res = self.fake_of(args[s.mutated_pos])
        node.meta["sym"] = res

    def _become(self, t: Tensor, node):
        if not self.execute and t._data.device.type != "meta":
            t._data = _to_meta(t._data)
        t.__class__ = Proxy
        t._node = node
        t._tracer = self
        node.meta["val"] = _to_meta(t._data)
        if self.sym is not None:
            t._fake = self._shadow_output(node)
        self._proxies.append(weakref_ref(t))

    def _shadow_output(self, node):
        """The fake of the tensor ``node`` computes: the shadow result of its op (an output of a
        multi-result op through its getitem)."""
        import operator
        if node.target is operator.getitem:
            src, i = node.args
            node.meta["sym"] = src.meta["sym"][i]
        return node.meta["sym"]

    def release(self):
        """End of capture: every proxy still alive becomes a plain Tensor again (with execute=True
        they hold the real results of the first call)."""
        for r in self._proxies:
            p = r()
            if p is not None and isinstance(p, Proxy):
                p.__class__ = Tensor
                d = p.__dict__
                d.pop("_node", None)
                d.pop("_tracer", None)
                d.pop("_fake", None)
        self._proxies.clear()

    def reads_free_value(self, t) -> bool:
        """Is ``t`` (a plain tensor, not a proxy) a free tensor of this capture whose value changes
        between calls (a module buffer or parameter, a closure's tensor), so that reading its value
        in Python must become a data gate?  Constants are snapshotted instead."""
        key = id(t)
        if key in self.sources:
            return True
        node = self._lifted.get(key)
        return node is not None and node.op == "placeholder"

    def gate(self, t, kind, convert):
        """The value ``convert(t's data)`` of a proxy or free tensor, recorded as a data gate; with
        execute=False there is no value to record, which is an error."""
        if not self.execute:
            raise CaptureError(f"data-dependent control flow: `{kind}` of a traced tensor at {where()} needs a "
                               f"value, but capture runs with execute=False (symbolic shapes and dtypes only). "
                               f"Use execute=True, or rewrite the branch with tp.where.")
        value = convert(t._data)
        self.record_gate(t, kind, value)
        return value

    def record_gate(self, proxy, kind, value, convert=None, text="", src=None):
        """The gate reads the tensor's value *now*: an explicit (pure) clone node marks the point,
        so after functionalisation it reads the post-mutation value even if the tensor was
        modified in place before the gate.  DCE removes it from the main graph later.  ``src``:
        the graph node to read instead of ``proxy``'s (``convert``/``text``: see :class:`Gate`)."""
        from ...ops.registry import OPS
        src = self.node_of(proxy) if src is None else src
        node = self.graph.call_function(OPS["clone"], (src,), name=f"gate{len(self.gates)}")
        node.meta["val"] = src.meta.get("val")
        if "sym" in src.meta:
            node.meta["sym"] = src.meta["sym"]
        self.gates.append(Gate(node, kind, value, where(), convert, text))


class _KeepSampleSize(Exception):
    """(internal) a data-dependent output keeps the sample's size (no unbacked symbols)."""


def _map_tensor_args(schema, args, f) -> list:
    """``args`` (an op's canonical arguments) with ``f`` applied to every tensor among them."""
    out = list(args)
    for i in schema.tensor_pos:
        if isinstance(out[i], Tensor):
            out[i] = f(out[i])
    for i in schema.list_pos:
        if out[i] is not None:
            out[i] = [f(t) if isinstance(t, Tensor) else t for t in out[i]]
    for i in schema.index_pos:
        out[i] = _map_index(out[i], lambda t: f(t) if isinstance(t, Tensor) else t)
    return out


def _map_index(idx, f):
    if isinstance(idx, tuple):
        return tuple(_map_index(i, f) for i in idx)
    if isinstance(idx, list):
        return [_map_index(i, f) for i in idx]
    if isinstance(idx, slice):
        return slice(_map_index(idx.start, f), _map_index(idx.stop, f), _map_index(idx.step, f))
    return f(idx)


@dataclasses.dataclass
class Capture:
    gm: GraphModule
    gates: list
    free: list
    out_spec: object
    out_consts: list            # non-tensor output leaves (TENSOR_LEAF where the leaf is a tensor)
    n_inputs: int
    input_names: list
    result: object = None       # execute=True: the function's result on the capture inputs
    symbolic: object = None     # dynamic=True: the SymbolicShapes of the capture (symbolic.py)


def capture(fn, args, kwargs, *, execute=True, input_names=None, sources=None, name="captured",
            dynamic=False, buckets=False) -> Capture:
    """Run ``fn(*args, **kwargs)`` on proxies and return the captured graph (see module doc);
    ``dynamic=True``: input sizes are symbols (symbolic.py); ``{leaf index: dims}``: those dims and
    the ``tp.mark_dynamic`` ones; ``buckets``: each symbol ranges over its sample's power-of-two bucket."""
    leaves, spec = tree_flatten((args, kwargs))
    tr = Tracer(execute=execute, sources=sources, dynamic=dynamic, buckets=buckets)
    names = input_names or [f"arg{i}" for i in range(len(leaves))]
    proxied = []
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, Tensor):
            proxied.append(tr.placeholder(names[i] if i < len(names) else f"arg{i}", leaf, index=i))
        else:
            proxied.append(leaf)
    from .pytree import tree_unflatten
    p_args, p_kwargs = tree_unflatten(proxied, spec)
    registry.observers.append(tr.on_op)
    registry.pre_observers.append(tr.before_op)
    tr.active = True
    try:
        if execute:
            result = fn(*p_args, **p_kwargs)
        else:
            with grad_mode.no_grad():
                result = fn(*p_args, **p_kwargs)
    except (CaptureError, AssertionError):    # (an assert of the function, tp.check: as in eager)
        tr.release()
        raise
    except Exception as e:
        tr.release()
        if tr.sym is not None and type(e).__name__ == "GuardOnDataDependentSymNode":
            raise CaptureError(_data_dependent_branch_message(name, e, tr.sym)) from e
        raise CaptureError(f"capture of {name} failed at {where_from(e)}: {type(e).__name__}: {e}") from e
    finally:
        tr.active = False
        registry.observers.remove(tr.on_op)
        registry.pre_observers.remove(tr.before_op)
    out_leaves, out_spec = tree_flatten(result)
    out_nodes, consts = [], []
    for leaf in out_leaves:
        if isinstance(leaf, Tensor):
            out_nodes.append(tr.node_of(leaf))
            consts.append(TENSOR_LEAF)
        else:
            consts.append(leaf)
    tr.graph.output(tuple(out_nodes))
    if tr.sym is not None:
        tr.graph.size_symbols = dict(tr.sym.sources)
        for n in tr.graph.nodes:    # the passes and backends see the symbolic metadata
            if "sym" in n.meta:
                n.meta["val"] = n.meta["sym"]
    tr.graph.lint()
    gm = GraphModule(tr.graph, dict(tr.constants), name=name)
    tr.release()
    return Capture(gm, tr.gates, tr.free, out_spec, consts, tr.n_inputs, names,
                   result=result if execute else None, symbolic=tr.sym)


def _data_dependent_branch_message(name, e, sym) -> str:
    """Exercise 39: a Python decision on a data-dependent (unbacked) size cannot be evaluated on
    the sample and recorded as a shape guard — there is no sample value until the program runs."""
    import sympy
    cond = getattr(e, "cond", None)
    us = sorted((u for u in getattr(cond, "free_symbols", ()) if u in sym.sources and sym.sources[u].index is None),
                key=str)
    made = "; ".join(f"{u} is {sym.sources[u].origin()}" for u in us) or "a size that depends on tensor values"
    cond_text = "the condition" if cond is None else f"`{sympy.sstr(cond)}`"
    return (f"capture of {name}: a Python branch on a data-dependent size at {where_from(e, skip_torch=True)}: "
            f"{cond_text} reads a size known only when the program runs ({made}). It has no sample value to "
            f"decide on and record as a shape guard (the chapter, §10.2). If you know the fact holds for "
            f"every call, state it before the branch: tp.check(n > 0) (the compiled program assumes it and "
            f"checks it on every call, an assert in eager); or compute without the branch (tp.where, or "
            f"reductions that are correct for an empty tensor).")


def where_from(e: BaseException, skip_torch=False) -> str:
    """The innermost traceback frame outside tensorplay (and torch: ``skip_torch``), as
    file:line: `source`."""
    import linecache
    import os
    from .proxy import _internal
    tb = e.__traceback__
    best = None
    torch_dir = os.path.dirname(torch.__file__)
    while tb is not None:
        fn = tb.tb_frame.f_code.co_filename
        if not _internal(fn) and not (skip_torch and os.path.abspath(fn).startswith(torch_dir)):
            best = (fn, tb.tb_lineno)
        tb = tb.tb_next
    if best is None:
        return "<unknown>"
    return f"{os.path.basename(best[0])}:{best[1]}: `{linecache.getline(best[0], best[1]).strip()}`"


def _gate_free_tensor_read(t, kind, convert):
    """``Tensor.item()`` / ``bool`` / ``int`` / ``float`` of a plain tensor: inside an active capture
    that reads a free tensor's value (``1 / float(self.num_batches_tracked)``), record a data gate
    like a proxy's (otherwise the value would be baked into the graph silently).  Returns
    ``(True, value)`` when it gated, ``(False, None)`` otherwise."""
    for obs in registry.observers:
        tr = getattr(obs, "__self__", None)
        if isinstance(tr, Tracer) and tr.active and tr.reads_free_value(t):
            return True, tr.gate(t, kind, convert)
    return False, None


from ... import _tensor as _tensor_mod  # noqa: E402
_tensor_mod._value_read_hook = _gate_free_tensor_read
