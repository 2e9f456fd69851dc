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
  :class:`CopySlices` node, so ``y[0].mul_(w)`` differentiates correctly with respect to ``y`` and ``w``;
* views follow their base (PyTorch's view + in-place semantics): every view records its root base
  and the chain of view ops from it (:func:`mark_views`); after an in-place op on the base or on
  *any* view of it, every other view of that base re-derives its ``grad_fn`` from the base's current
  history the next time it is read (:func:`regenerate_view_grad_fn`, keyed on the shared version
  counter), so a gradient through an earlier view sees the write;
* in-place ops that PyTorch forbids raise before the kernel runs, with PyTorch's wording: on a leaf
  that requires grad, on a view of such a leaf, and on a view made in ``no_grad`` mode; reading the
  history of a no_grad view whose base was modified in place raises too.  One deliberate extension:
  outputs of multi-output view ops (split/chunk/unbind) may be modified in place (PyTorch forbids
  it); their replay is exact, so gradients are those of the equivalent narrow/select program.
"""
from __future__ import annotations

import itertools
import weakref

import torch

from .. import _tensor as _tensor_mod
from .._tensor import Tensor, _wrap
from . import grad_mode

__all__ = ["Node", "OpNode", "AccumulateGrad", "CopySlices", "TensorMeta", "SavedCtx",
           "record_op", "check_inplace", "mark_views", "view_replay", "regenerate_view_grad_fn",
           "register_tensor_hook", "add_retain_hook", "edge_of"]

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
    """The edge that a gradient w.r.t. ``t`` flows along, or None.  A view that requires grad only
    through its base and has no history (made under ``no_grad``) has no edge: like PyTorch, the
    gradient stops there."""
    if not isinstance(t, Tensor) or not t.requires_grad:
        return None
    fn = t.grad_fn
    if fn is not None:
        return (fn, t._output_nr)
    if t._base is not None and not t._requires_grad:
        return None
    return (accumulate_node(t), 0)


class _StaleSaved(Tensor):
    """A saved tensor that was modified in place after it was saved.  Its metadata (shape, dtype,
    device, strides) is still valid, so a formula may read it (``unbroadcast(g, ctx.self)``); using
    its values — any op, any conversion — raises the version error.  So backward raises exactly
    when a modified saved tensor is needed for a gradient that is computed, as in PyTorch (which
    raises when such a tensor is unpacked)."""

    def __init__(self, d, msg):
        self._meta = torch.empty_strided(d.shape, d.stride(), dtype=d.dtype, device="meta")
        self._dev = d.device
        self._msg = msg

    @property
    def _data(self):
        raise RuntimeError(self._msg)

    shape = property(lambda self: self._meta.shape)
    dtype = property(lambda self: self._meta.dtype)
    device = property(lambda self: self._dev)
    ndim = property(lambda self: self._meta.dim())

    def size(self, dim=None):
        return self._meta.shape if dim is None else self._meta.size(dim)

    def dim(self):
        return self._meta.dim()

    def numel(self):
        return self._meta.numel()

    def stride(self, dim=None):
        return self._meta.stride() if dim is None else self._meta.stride(dim)

    def __repr__(self):
        return f"<saved tensor {_fmt(self._meta)} modified in place>"


class SavedCtx:
    """What a derivative formula sees: ``ctx.<arg name>`` (saved tensors are version-checked: one
    modified in place since it was saved comes back as a :class:`_StaleSaved` whose values cannot
    be used), ``ctx.result``, ``ctx.needs_input_grad`` (one flag per tensor argument, schema order)."""

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
                return [self._check(name, t, tv) for t, tv in zip(v, ver)]
            return self._check(name, v, ver)
        return v

    def _check(self, name, t, ver):
        if isinstance(t, Tensor) and t._version != ver:
            return _StaleSaved(t._data, (
                f"tp.{self._op.name} backward: one of the tensors needed for gradient computation has been "
                f"modified by an in-place operation: argument '{name}' ({_fmt(t)}) was saved at version {ver} "
                f"and is now at version {t._version}. Clone it before modifying it in place (x = x.clone())."))
        return t

    def _unpack_result(self):
        if self._result is None:
            raise AttributeError(f"autograd formula of tp.{self._op.name}: 'result' was not saved; add it to save=")
        outs = []
        for i, (d, ver) in enumerate(zip(self._result, self._result_versions)):
            if d._version != ver:
                outs.append(_StaleSaved(d, (
                    f"tp.{self._op.name} backward: its output {i} ({_fmt(d)}), needed for the gradient, was "
                    f"modified by an in-place operation (version {ver} -> {d._version}). Clone it before "
                    f"modifying it in place.")))
                continue
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
            if g._data.is_complex() and not dtype.is_complex:   # a real input's gradient: the real part
                from ..ops.registry import OPS
                g = OPS["real"].fn(g)
            g = g.to(dtype) if g._data.dtype != dtype else g
        out.append(g)
    return out


class CopySlices(Node):
    """History of a base after an in-place op on one of its views (``base[idx].op_(...)``).

    grad(base_old) = g with the view region replaced by the op's gradient w.r.t. the old view;
    grads of the op's other inputs come from the op's formula applied to g[view].  The inner node's
    first edge is the old base's edge (see :func:`record_op`).  The view chain is replayed on a
    gradient laid out exactly like the base (sizes, strides, storage offset), as PyTorch does: the
    incoming gradient may have any layout, and a view such as ``view(-1)`` is defined by the
    base's."""
    __slots__ = ("inner", "replay", "geometry")

    def __init__(self, inner: OpNode, replay, base):
        bd = base._data
        super().__init__(tuple(inner.next_edges), ((bd.shape, bd.dtype, bd.device),))
        self.inner, self.replay = inner, replay
        self.geometry = (bd.stride(), bd.storage_offset())

    def name(self):
        return "CopySlices"

    def apply(self, grads):
        g = grads[0]
        d = g._data
        shape, stride, off = self.out_meta[0][0], self.geometry[0], self.geometry[1]
        g_read = g if d.stride() == stride and d.storage_offset() == off else relayout(g, shape, stride, off)
        g_view = self.replay(g_read)
        inner = self.inner.apply((g_view,))
        g_base = relayout(g_read, shape, stride, off)
        region = self.replay(g_base)
        if inner[0] is None:
            region.zero_()
        else:
            region.copy_(inner[0])
        return [g_base] + list(inner[1:])

    def release(self):
        self.inner.release()


def relayout(g, shape, stride, offset):
    """A copy of ``g`` (differentiable: ``copy_``) with the given sizes, strides and storage offset,
    so that a view chain recorded on a base replays on it exactly."""
    n = offset + (sum((s - 1) * st for s, st in zip(shape, stride)) + 1 if all(shape) else 0)
    buf = torch.empty(n, dtype=g._data.dtype, device=g._data.device)
    return _wrap(buf.as_strided(shape, stride, offset)).copy_(g)


# ---------------------------------------------------------------------------------------------
def _fmt(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}"


def _view_error(view, meta, who, indirect):
    """PyTorch's refusal to rebase a view made in no_grad mode (handle_view_on_rebase)."""
    _kind, vop = meta
    what = ("its base or another view of its base has been modified in-place" if indirect
            else "is being modified in-place")
    return RuntimeError(
        f"{who}: a view ({_fmt(view)}, made by tp.{vop}) was created in no_grad mode and {what} with grad "
        f"mode enabled. Given that this use case is ambiguous and error-prone, it is forbidden (as in "
        f"PyTorch). You can clarify your code by moving both the view and the in-place op either both "
        f"inside the no_grad block (if you don't want the in-place op to be tracked) or both outside (if "
        f"you want it to be tracked).")


def check_inplace(op, args, record):
    """Before an in-place kernel runs, with grad mode on and an input requiring grad: reject what
    PyTorch rejects (views made in no_grad mode, views of leaves that require grad, leaves that
    require grad), and clone the old value of ``self`` if the derivative formula will read it."""
    self_ = args[op.schema.mutated_pos]
    base = self_._base
    if base is not None:
        if self_._view_meta is not None:
            raise _view_error(self_, self_._view_meta, f"tp.{op.name}", indirect=False)
        if base._grad_fn is None and self_.requires_grad:
            raise RuntimeError(f"tp.{op.name}: a view of a leaf Variable that requires grad is being used in an "
                               f"in-place operation (the view {_fmt(self_)} of the leaf {_fmt(base)}); wrap the "
                               f"update in `with tp.no_grad():` or use the out-of-place op")
        src = self_._alias_src
        if (self_._grad_fn is None and self_.requires_grad and not self_._identity_alias
                and (src is None or src._grad_fn is None)):
            # PyTorch's check reads the view's stored node without re-deriving it: a view taken while
            # its base did not require grad, not used since the base gained history, is a "leaf"
            # (an identity alias is, for torch, the very object it aliases: either name counts)
            raise RuntimeError(f"tp.{op.name}: a leaf Variable that requires grad is being used in an in-place "
                               f"operation: the view {_fmt(self_)} was taken before its base {_fmt(base)} "
                               f"required grad and has no history of its own yet (PyTorch raises here too); "
                               f"take the view again, or read its .grad_fn first")
    elif self_._requires_grad and self_._grad_fn is None:
        raise RuntimeError(f"tp.{op.name}: a leaf Tensor that requires grad ({_fmt(self_)}) is being used in an "
                           f"in-place operation; wrap the update in `with tp.no_grad():` or use the out-of-place op")
    if self_.requires_grad and not op.differentiable:
        raise RuntimeError(f"tp.{op.name}: in-place op is not differentiable but its input requires grad")
    if not record:
        return None
    save = op.save
    old = None
    if save is None or "self" in save:
        old = _wrap(self_._data.clone())
        if self_.requires_grad:
            old._requires_grad = True
            old._grad_fn = self_.grad_fn
            old._output_nr = self_._output_nr
            old._accumulate = self_._accumulate
    # versions of the other saved inputs *before* the kernel: one that aliases the written storage
    # (x.mul_(x), v.mul_(other view of v's base)) is then caught at backward, as in PyTorch
    pre = {}
    mp = op.schema.mutated_pos
    for i in op._tensorish:
        if i == mp or not (save is None or op.schema.args[i].name in save):
            continue
        a = args[i]
        if isinstance(a, Tensor):
            pre[i] = a._version
        elif i in op.schema.list_pos and a is not None:
            pre[i] = [t._version if isinstance(t, Tensor) else None for t in a]
    # the edges too (PyTorch collects them before the kernel): a view among the inputs derives its
    # history at the version it was read, so the write makes it stale; for a view ``self`` the
    # first edge is its base's (the base is rebased on CopySlices afterwards)
    slots = _tensor_slots(op, args)
    edges = (edge_of(base if base is not None else self_),) + tuple(edge_of(t) for t in slots[1:])
    return (old, pre, edges)


def mark_views(op, args, outs):
    """Remember how each output of a view op was made from its root base: ``_base`` and the chain
    of (op, other args, output index) from it (the replay is built when it is needed).  A view made
    in no_grad mode is marked so that rebasing it raises; a view of such a view inherits the mark.
    Returns True when the output is an identity alias of a view that carries the view's autograd
    state as is (then no node is recorded for it)."""
    inp = args[0]
    if inp._base is not None:
        base, chain, meta = inp._base, inp._view_src, inp._view_meta
    else:
        base, chain, meta = inp, (), None
    rest = args[1:]
    multi = len(outs) > 1 or op.schema.returns_list
    no_grad = not grad_mode._state.enabled
    identity = False
    if op.name in _TORCH_RETURNS_SELF and len(outs) == 1:
        d, di = outs[0]._data, inp._data
        identity = d.shape == di.shape and d.stride() == di.stride() and d.storage_offset() == di.storage_offset()
    for i, o in enumerate(outs):
        d = o._data
        if d._is_view():
            o._base = base
            o._view_src = chain + ((op, rest, i if multi else None),)
            if identity:
                # torch hands back the input itself: the alias stands for it (no_grad or not) and
                # carries its autograd state as is; an alias of a leaf records a node to reach it
                if inp._base is None:
                    o._identity_alias = True
                    if inp._grad_fn is None:
                        return False
                else:
                    o._alias_src = inp._alias_src if inp._alias_src is not None else inp
                o._grad_fn, o._output_nr, o._requires_grad = inp._grad_fn, inp._output_nr, inp._requires_grad
                o._attr_version = inp._attr_version if inp._base is not None else d._version
                o._view_meta = meta
                return True
            if no_grad:
                o._view_meta = ("no_grad", op.name)
                o._attr_version = d._version
            elif meta is not None:
                o._view_meta = meta
    return False


#: view ops for which torch returns its input object when nothing changes (flatten with
#: start_dim == end_dim, contiguous of a contiguous tensor); ours return a fresh alias instead
#: (tensorplay/ops/view.py ``_alias``), which under no_grad stands for the input, not a no_grad view
_TORCH_RETURNS_SELF = frozenset({"flatten", "contiguous"})


class _Replay:
    """``base -> view``: the chain of view ops of a view, run with tp ops (differentiable)."""
    __slots__ = ("chain",)

    def __init__(self, chain):
        self.chain = chain

    def __call__(self, b):
        for op, rest, i in self.chain:
            r = op(b, *rest)
            b = r if i is None else r[i]
        return b


def view_replay(view):
    """A function ``base -> view`` replaying the chain of view ops from the root base."""
    return _Replay(view._view_src or ())


def regenerate_view_grad_fn(view):
    """Re-derive a view's ``grad_fn`` from its base's current history: replay the view chain on
    the base, recording one node per view op (kernels on the shared storage; no observers, no
    forward AD), and take the last node.  Raises for a view made in no_grad mode (PyTorch).
    A ``retain_grad()`` of the view moves to the new node."""
    meta = view._view_meta
    if meta is not None:
        raise _view_error(view, meta, "autograd", indirect=True)
    old_fn, old_nr = view._grad_fn, view._output_nr
    t = view._base
    for op, rest, i in view._view_src or ():
        args = (t,) + rest
        out = op.eager(t._data, *rest)
        outs = tuple(_wrap(o) for o in out) if i is not None else (_wrap(out),)
        record_op(op, args, outs)
        t = outs[0 if i is None else i]
    view._grad_fn, view._output_nr = t._grad_fn, t._output_nr
    view._attr_version = view._data._version
    if view._retains_grad:
        _move_retain_hook(view, old_fn, old_nr)
    return view._grad_fn


def record_op(op, args, outs, inplace_state=None):
    """Create the backward node of one op call and attach it to the outputs.  ``inplace_state`` is
    what :func:`check_inplace` returned before the kernel ran (the clone of the old ``self``, the
    pre-kernel versions of the saved inputs and the pre-kernel edges).  For an in-place op on a
    view, the node's first edge is the *base's* old edge and the base is rebased on a
    :class:`CopySlices` node (:func:`_rebase_view`)."""
    saved_self, pre, pre_edges = inplace_state if inplace_state is not None else (None, None, None)
    slots = _tensor_slots(op, args)
    mp = op.schema.mutated_pos
    mutated = args[mp] if mp is not None else None
    on_view = mutated is not None and mutated._base is not None
    if on_view and op.name == "setitem_" and _basic_index(args[1]) and args[1] is not Ellipsis:
        # ``view[idx] = value`` writes the sub-view ``view[idx]`` only (PyTorch): rebase through it,
        # so that a write into a non-overlapping part of an overlapping view (an expand) is exact
        sub = _wrap(mutated._data[args[1]])
        sub._base = mutated._base
        sub._view_src = (mutated._view_src or ()) + ((_ops()["getitem"], (args[1],), None),)
        record_op(op, (sub, Ellipsis, args[2]), (sub,), inplace_state)
        mutated._attr_version = -1     # re-derived from the rebased base when next read
        return
    if mutated is not None:
        if pre_edges is not None:
            edges = pre_edges
        else:   # (self is the first tensor slot of every in-place op)
            edges = (edge_of(mutated._base if on_view else mutated),) + tuple(edge_of(t) for t in slots[1:])
        d = mutated._data
        slot_meta = (((d.shape, d.dtype) if edges[0] is not None else None),) + tuple(
            (t._data.shape, t._data.dtype) if isinstance(t, Tensor) and t.requires_grad else None for t in slots[1:])
    else:
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
                versions[i] = pre[i] if pre else [t._version if isinstance(t, Tensor) else None for t in a]
                values[i] = list(a)
            else:
                values[i] = [TensorMeta(t, name, op.name) if isinstance(t, Tensor) else t for t in a]
        elif isinstance(a, Tensor):
            if keep:
                if saved_self is not None and i == mp:
                    a = saved_self
                    values[i] = a
                versions[i] = pre[i] if pre and i in pre else a._version
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
    if mutated is not None:
        if on_view:
            _rebase_view(node, mutated)
        else:
            old_fn, old_nr = mutated._grad_fn, mutated._output_nr
            mutated._grad_fn, mutated._output_nr, mutated._requires_grad = node, 0, True
            if mutated._retains_grad:
                _move_retain_hook(mutated, old_fn, old_nr)
        return
    for i, o in enumerate(outs):
        if isinstance(o, Tensor) and (o._data.is_floating_point() or o._data.is_complex()):
            o._grad_fn = node
            o._output_nr = i
            o._requires_grad = True
            if o._base is not None:
                o._attr_version = o._data._version


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
    cs = CopySlices(node, view_replay(view), base)
    old_fn, old_nr = base._grad_fn, base._output_nr
    base._grad_fn, base._output_nr, base._requires_grad = cs, 0, True
    if base._retains_grad:
        _move_retain_hook(base, old_fn, old_nr)
    regenerate_view_grad_fn(view)
    view._requires_grad = True


def _basic_index(idx):
    """ints, slices, None and Ellipsis only: ``x[idx]`` is a view."""
    for i in (idx if isinstance(idx, tuple) else (idx,)):
        if not (i is None or i is Ellipsis or isinstance(i, slice) or (isinstance(i, int) and not isinstance(i, bool))):
            return False
    return True


def _ops():
    from ..ops.registry import OPS   # noqa: PLC0415  (the op table imports this module)
    return OPS


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
    _retain._ref = ref
    register_tensor_hook(t, _retain)


def _move_retain_hook(t, old_fn, old_nr):
    """``retain_grad()`` follows the tensor onto its new node after an in-place op (PyTorch); other
    tensor hooks stay with the node they were registered on."""
    hooks = old_fn.pre_hooks.get(old_nr) if old_fn is not None and old_fn.pre_hooks else None
    if not hooks:
        return
    mine = [h for h in hooks if getattr(h, "_is_retain", False) and h._ref() is t]
    for h in mine:
        hooks.remove(h)
        register_tensor_hook(t, h)


_tensor_mod._regenerate_view_grad_fn = regenerate_view_grad_fn
