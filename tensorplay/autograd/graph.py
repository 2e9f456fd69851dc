"""TPX autograd graph: nodes, edges, saved tensors, hooks, in-place rebasing (chapter §5.1–5.3).

Reverse mode keeps an explicit graph.  Each differentiable op call that sees an input requiring
grad creates one :class:`OpNode`; its ``next_edges`` point, one per tensor input (schema order,
``Tensor[]`` arguments flattened), at ``(producer node, output number)`` or at the
:class:`AccumulateGrad` node of a leaf, or are ``None`` for inputs that need no gradient.

Guarantees:

* a node keeps alive only what its derivative formula declared in ``save=`` (plus metadata —
  shape, dtype, device — of every tensor input), and frees it after backward unless
  ``retain_graph``; a second backward through freed nodes raises a clear error;
* a saved tensor modified in place afterwards is detected through its version counter and raises an
  error naming the op, the argument and both versions (never a silently wrong gradient);
* an in-place op on a tensor with history rebases it onto the new node (the old value is cloned
  first when the formula reads it); on a *view*, the base's history is rewritten with a
  :class:`CopySlices` node, so ``y[0].mul_(w)`` differentiates correctly with respect to ``y`` and ``w``.
"""
from __future__ import annotations

import itertools
import weakref

import torch

from .._tensor import Tensor, _wrap
from . import grad_mode

__all__ = ["Node", "OpNode", "AccumulateGrad", "CopySlices", "TensorMeta", "SavedCtx",
           "record_op", "check_inplace", "mark_views", "register_tensor_hook", "add_retain_hook", "edge_of"]

_seq = itertools.count()


class TensorMeta:
    """Shape/dtype/device of a tensor input the formula did not ask to save."""
    __slots__ = ("shape", "dtype", "device", "_name", "_op")

    def __init__(self, t, name, op):
        d = t._data
        self.shape, self.dtype, self.device = d.shape, d.dtype, d.device
        self._name, self._op = name, op

    def size(self, dim=None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self):
        return len(self.shape)

    @property
    def ndim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __getattr__(self, item):
        raise AttributeError(f"autograd formula of tp.{self._op}: input '{self._name}' was not saved for "
                             f"backward (only its shape/dtype/device are kept); add it to save=")


class Node:
    """A function in the backward graph: grads of its forward outputs -> grads of its inputs."""
    __slots__ = ("next_edges", "seq", "out_meta", "pre_hooks", "post_hooks", "__weakref__")

    def __init__(self, next_edges, out_meta=()):
        self.next_edges = next_edges
        self.seq = next(_seq)
        self.out_meta = out_meta   # per forward output: (shape, dtype, device)
        self.pre_hooks = None      # {output_nr: [hook]} tensor hooks of non-leaf outputs
        self.post_hooks = None

    def name(self) -> str:
        return type(self).__name__

    def apply(self, grads):
        raise NotImplementedError

    def release(self):
        pass

    def register_hook(self, fn):
        """``fn(grad_inputs, grad_outputs)`` after the node runs."""
        if self.post_hooks is None:
            self.post_hooks = []
        self.post_hooks.append(fn)
        return _Handle(self.post_hooks, fn)

    def __repr__(self):
        return f"<{self.name()} at {id(self):#x}>"


class _Handle:
    def __init__(self, lst, item):
        self._lst, self._item = lst, item

    def remove(self):
        try:
            self._lst.remove(self._item)
        except ValueError:
            pass


class AccumulateGrad(Node):
    """The sink for a leaf: runs the leaf's hooks, then accumulates into ``leaf.grad``."""
    __slots__ = ("variable",)

    def __init__(self, variable):
        d = variable._data
        super().__init__((), ((d.shape, d.dtype, d.device),))
        self.variable = variable

    def apply(self, grads):
        g = grads[0]
        v = self.variable
        if v._hooks:
            for h in list(v._hooks):
                r = h(g)
                if r is not None:
                    g = r
        if g is None:
            return ()
        if g._data.dtype != v._data.dtype:
            g = g.to(v._data.dtype)
        if grad_mode._state.enabled:  # create_graph: keep the graph of the gradient
            v._grad = g if v._grad is None else v._grad + g
        else:
            d = g._data
            if v._grad is None:
                if d._is_view() or d.stride() != v._data.stride():
                    # layout contract: .grad is a fresh tensor laid out like the parameter
                    d = torch.empty_like(v._data, dtype=d.dtype).copy_(d)
                v._grad = _wrap(d)
            elif v._grad.grad_fn is None and not v._grad.requires_grad:
                v._grad._data.add_(d)
            else:
                v._grad = v._grad.detach() + g
        return ()

    def name(self):
        return "AccumulateGrad"


def accumulate_node(t: Tensor) -> AccumulateGrad:
    ref = t._accumulate
    node = ref() if ref is not None else None
    if node is None:
        node = AccumulateGrad(t)
        t._accumulate = weakref.ref(node)
    return node


def edge_of(t):
    """The edge that a gradient w.r.t. ``t`` flows along, or None."""
    if not isinstance(t, Tensor) or not t.requires_grad:
        return None
    if t.grad_fn is not None:
        return (t.grad_fn, t._output_nr)
    return (accumulate_node(t), 0)


class SavedCtx:
    """What a derivative formula sees: ``ctx.<arg name>`` (saved tensors are version-checked),
    ``ctx.result``, ``ctx.needs_input_grad`` (one flag per tensor argument, schema order)."""

    def __init__(self, op, values, versions, result, result_versions, needs):
        self._op = op
        self._values = values
        self._versions = versions
        self._result = result
        self._result_versions = result_versions
        self.needs_input_grad = needs
        self._node = None
        self._released = False

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._released:
            raise RuntimeError(
                f"tp.{self._op.name} backward: trying to backward through the graph a second time (or "
                f"to read saved tensors after they were freed). Specify retain_graph=True on the first "
                f"backward() if you need to backward twice.")
        op = self._op
        if name == "result":
            return self._unpack_result()
        idx = op._argidx.get(name)
        if idx is None:
            raise AttributeError(f"autograd formula of tp.{op.name}: no argument named {name!r}")
        v = self._values[idx]
        ver = self._versions[idx]
        if ver is not None:
            if isinstance(v, list):
                for t, tv in zip(v, ver):
                    self._check(name, t, tv)
            else:
                self._check(name, v, ver)
        return v

    def _check(self, name, t, ver):
        if isinstance(t, Tensor) and t._version != ver:
            raise RuntimeError(
                f"tp.{self._op.name} backward: one of the tensors needed for gradient computation has been "
                f"modified by an in-place operation: argument '{name}' ({str(t.dtype).replace('torch.', '')}"
                f"{list(t.shape)}) was saved at version {ver} and is now at version {t._version}. "
                f"Clone it before modifying it in place (x = x.clone()).")

    def _unpack_result(self):
        if self._result is None:
            raise AttributeError(f"autograd formula of tp.{self._op.name}: 'result' was not saved; add it to save=")
        outs = []
        for i, (d, ver) in enumerate(zip(self._result, self._result_versions)):
            if d._version != ver:
                raise RuntimeError(
                    f"tp.{self._op.name} backward: its output {i} ({str(d.dtype).replace('torch.', '')}"
                    f"{list(d.shape)}), needed for the gradient, was modified by an in-place operation "
                    f"(version {ver} -> {d._version}). Clone it before modifying it in place.")
            t = _wrap(d)
            if d.is_floating_point() or d.is_complex():
                t.requires_grad = True
                t.grad_fn = self._node
                t._output_nr = i
            outs.append(t)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def release(self):
        self._values = self._result = None
        self._released = True


def _tensor_slots(op, args):
    """Flatten the tensor arguments in schema order: [(arg index, tensor or None)]."""
    out = []
    for i in op._tensorish:
        a = args[i]
        if i in op.schema.list_pos:
            for t in (a or ()):
                out.append(t)
        else:
            out.append(a)
    return out


class OpNode(Node):
    """Backward of one op-table entry; calls the entry's derivative formula."""
    __slots__ = ("op", "ctx", "slot_meta")

    def __init__(self, op, ctx, next_edges, out_meta, slot_meta):
        super().__init__(next_edges, out_meta)
        self.op, self.ctx = op, ctx
        self.slot_meta = slot_meta   # per flattened tensor input: (shape, dtype) or None
        ctx._node = self

    def name(self):
        n = self.op.name
        return "".join(p.capitalize() for p in n.strip("_").split("_")) + "Backward"

    def apply(self, grads):
        op = self.op
        res = op.backward(self.ctx, *grads)
        return _flatten_grads(op, res, self.slot_meta)

    def release(self):
        self.ctx.release()


def _flatten_grads(op, res, slot_meta):
    if not isinstance(res, (tuple, list)) or (len(op._tensorish) == 1 and op._tensorish[0] in op.schema.list_pos
                                                and res and isinstance(res[0], Tensor) and len(slot_meta) != 1):
        res = (res,)
    if len(res) != len(op._tensorish):
        raise RuntimeError(f"autograd formula of tp.{op.name} returned {len(res)} gradients for "
                           f"{len(op._tensorish)} tensor arguments")
    flat = []
    for i, r in zip(op._tensorish, res):
        if i in op.schema.list_pos:
            flat.extend(r if r is not None else [None] * 0)
        else:
            flat.append(r)
    if len(flat) < len(slot_meta):  # a None for a whole list argument
        flat.extend([None] * (len(slot_meta) - len(flat)))
    out = []
    for g, m in zip(flat, slot_meta):
        if g is None or m is None:
            out.append(None)
            continue
        if not isinstance(g, Tensor):
            raise RuntimeError(f"autograd formula of tp.{op.name} returned {type(g).__name__}, expected a Tensor")
        shape, dtype = m
        if g._data.shape != shape:
            raise RuntimeError(f"autograd formula of tp.{op.name} returned a gradient of shape {list(g.shape)} "
                               f"for an input of shape {list(shape)}")
        if g._data.dtype != dtype:
            g = g.to(dtype)
        out.append(g)
    return out


class CopySlices(Node):
    """History of a base after an in-place op on one of its views (``base[idx].op_(...)``).

    grad(base_old) = g with the view region replaced by the op's gradient w.r.t. the old view;
    grads of the op's other inputs come from the op's formula applied to g[view]."""
    __slots__ = ("inner", "replay")

    def __init__(self, inner: OpNode, base_edge, replay, base_meta):
        super().__init__((base_edge,) + tuple(inner.next_edges[1:]), (base_meta,))
        self.inner, self.replay = inner, replay

    def name(self):
        return "CopySlices"

    def apply(self, grads):
        g = grads[0]
        g_view = self.replay(g)
        inner = self.inner.apply((g_view,))
        g_base = g.clone()
        region = self.replay(g_base)
        if inner[0] is None:
            region.zero_()
        else:
            region.copy_(inner[0])
        return [g_base] + list(inner[1:])

    def release(self):
        self.inner.release()


# ---------------------------------------------------------------------------------------------
def check_inplace(op, args, record):
    """Before an in-place kernel runs: reject in-place on leaves that require grad, and clone the
    old value of ``self`` if the derivative formula will read it."""
    self_ = args[op.schema.mutated_pos]
    if self_.requires_grad and self_.grad_fn is None and self_._base is None:
        raise RuntimeError(f"tp.{op.name}: a leaf Tensor that requires grad ({str(self_.dtype).replace('torch.', '')}"
                           f"{list(self_.shape)}) is being used in an in-place operation; wrap the update in "
                           f"`with tp.no_grad():` or use the out-of-place op")
    base = self_._base
    if base is not None and base.requires_grad and base.grad_fn is None:
        raise RuntimeError(f"tp.{op.name}: a view of a leaf Tensor that requires grad is being used in an "
                           f"in-place operation; wrap the update in `with tp.no_grad():`")
    if self_.requires_grad and not op.differentiable:
        raise RuntimeError(f"tp.{op.name}: in-place op is not differentiable but its input requires grad")
    if record and (op.save is None or "self" in op.save):
        old = _wrap(self_._data.clone())
        old.requires_grad = self_.requires_grad
        old.grad_fn = self_.grad_fn
        old._output_nr = self_._output_nr
        old._accumulate = self_._accumulate
        return old
    return None


def mark_views(op, args, outs):
    """Remember how each output of a view op was made from its input (for CopySlices).
    Only a tuple is stored here; the replay function is built when an in-place op needs it."""
    inp = args[0]
    base = inp._base if inp._base is not None else inp
    rest = args[1:]
    multi = len(outs) > 1 or op.schema.returns_list
    for i, o in enumerate(outs):
        if o._data._is_view():
            o._base = base
            o._view_src = (inp, op, rest, i if multi else None)


def view_replay(view):
    """A function ``base -> view`` replaying the chain of view ops from the base."""
    chain = []
    t = view
    while t._view_src is not None:
        parent, op, rest, i = t._view_src
        chain.append((op, rest, i))
        t = parent
    chain.reverse()

    def replay(b):
        for op, rest, i in chain:
            r = op(b, *rest)
            b = r if i is None else r[i]
        return b
    return replay


def record_op(op, args, outs, saved_self=None):
    """Create the backward node of one op call and attach it to the outputs."""
    slots = _tensor_slots(op, args)
    edges = tuple(edge_of(t) for t in slots)
    slot_meta = tuple((t._data.shape, t._data.dtype) if isinstance(t, Tensor) and t.requires_grad else None
                      for t in slots)
    needs = tuple(e is not None for e in edges) if not op.schema.list_pos else _needs_by_arg(op, args)
    save = op.save
    values = list(args)
    versions = [None] * len(args)
    for i in op._tensorish:
        a = args[i]
        name = op.schema.args[i].name
        keep = save is None or name in save
        if i in op.schema.list_pos:
            if a is None:
                continue
            if keep:
                versions[i] = [t._version if isinstance(t, Tensor) else None for t in a]
                values[i] = list(a)
            else:
                values[i] = [TensorMeta(t, name, op.name) if isinstance(t, Tensor) else t for t in a]
        elif isinstance(a, Tensor):
            if keep:
                if saved_self is not None and i == op.schema.mutated_pos:
                    a = saved_self
                    values[i] = a
                versions[i] = a._version
            else:
                values[i] = TensorMeta(a, name, op.name)
    if save is None or "result" in save:
        result = [o._data for o in outs if isinstance(o, Tensor)]
        rvers = [d._version for d in result]
    else:
        result = rvers = None
    ctx = SavedCtx(op, values, versions, result, rvers, needs)
    out_meta = tuple((o._data.shape, o._data.dtype, o._data.device) if isinstance(o, Tensor) else None for o in outs)
    node = OpNode(op, ctx, edges, out_meta, slot_meta)
    mp = op.schema.mutated_pos
    if mp is not None and args[mp]._base is not None:
        _rebase_view(node, args[mp])
        return
    for i, o in enumerate(outs):
        if isinstance(o, Tensor) and (o._data.is_floating_point() or o._data.is_complex()):
            o.grad_fn = node
            o._output_nr = i
            o.requires_grad = True


def _needs_by_arg(op, args):
    out = []
    for i in op._tensorish:
        a = args[i]
        if i in op.schema.list_pos:
            out.append(any(isinstance(t, Tensor) and t.requires_grad for t in (a or ())))
        else:
            out.append(isinstance(a, Tensor) and a.requires_grad)
    return tuple(out)


def _rebase_view(node, view):
    base = view._base
    bd = base._data
    base_edge = edge_of(base)
    replay = view_replay(view)
    cs = CopySlices(node, base_edge, replay, (bd.shape, bd.dtype, bd.device))
    base.grad_fn = cs
    base._output_nr = 0
    base.requires_grad = True
    with grad_mode.enable_grad():
        nv = replay(base)
    view.grad_fn = nv.grad_fn
    view._output_nr = nv._output_nr
    view.requires_grad = True


# ---------------------------------------------------------------------------------------------
def register_tensor_hook(t, hook):
    if t.grad_fn is None:
        if t._hooks is None:
            t._hooks = []
        t._hooks.append(hook)
        accumulate_node(t)
        return _Handle(t._hooks, hook)
    node = t.grad_fn
    if node.pre_hooks is None:
        node.pre_hooks = {}
    lst = node.pre_hooks.setdefault(t._output_nr, [])
    lst.append(hook)
    return _Handle(lst, hook)


def add_retain_hook(t):
    ref = weakref.ref(t)

    def _retain(g):
        tt = ref()
        if tt is not None:
            gd = g.detach() if not grad_mode._state.enabled else g
            tt._grad = gd if tt._grad is None else tt._grad + gd
        return None
    _retain._is_retain = True
    register_tensor_hook(t, _retain)
