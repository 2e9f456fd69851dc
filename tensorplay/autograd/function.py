"""Custom autograd functions: ``tp.autograd.Function`` (chapter §5.1).

``forward(ctx, *args)`` runs with grad mode off on tp tensors; ``backward(ctx, *grads)`` returns one
gradient per forward argument (None for non-tensors).  ``ctx.save_for_backward`` keeps tensors with
their versions (an in-place change before backward raises); ``ctx.mark_dirty`` declares inputs
modified in place (their history is rebased); ``ctx.mark_non_differentiable`` marks outputs that get
no gradient; ``once_differentiable`` makes backward run without building a graph.
"""
from __future__ import annotations

import functools

from .._tensor import Tensor, _wrap
from . import grad_mode
from .graph import Node, edge_of

__all__ = ["Function", "FunctionCtx", "once_differentiable"]


class FunctionCtx:
    def __init__(self):
        self._saved = ()
        self._saved_versions = ()
        self._dirty = ()
        self._non_diff = ()
        self.needs_input_grad = ()
        self.materialize_grads = True
        self._released = False

    def save_for_backward(self, *tensors):
        for t in tensors:
            if t is not None and not isinstance(t, Tensor):
                raise TypeError(f"save_for_backward: expected Tensors or None, got {type(t).__name__}")
        self._saved = tensors
        self._saved_versions = tuple(t._version if t is not None else None for t in tensors)

    @property
    def saved_tensors(self):
        if self._released:
            raise RuntimeError("Function backward: trying to backward through the graph a second time; "
                               "specify retain_graph=True")
        for i, (t, v) in enumerate(zip(self._saved, self._saved_versions)):
            if t is not None and t._version != v:
                raise RuntimeError(f"Function backward: saved tensor {i} ({list(t.shape)}) has been modified by "
                                   f"an in-place operation (version {v} -> {t._version})")
        return self._saved

    def mark_dirty(self, *tensors):
        self._dirty = tensors

    def mark_non_differentiable(self, *tensors):
        self._non_diff = tensors

    def set_materialize_grads(self, value: bool):
        self.materialize_grads = value


class _FunctionNode(Node):
    __slots__ = ("cls", "ctx", "n_args", "arg_tensor_pos")

    def __init__(self, cls, ctx, edges, arg_tensor_pos, out_meta):
        super().__init__(edges, out_meta)
        self.cls, self.ctx, self.arg_tensor_pos = cls, ctx, arg_tensor_pos

    def name(self):
        return f"{self.cls.__name__}Backward"

    def apply(self, grads):
        res = self.cls.backward(self.ctx, *grads)
        if not isinstance(res, tuple):
            res = (res,)
        n_args = self.n_args
        if len(res) < n_args:
            raise RuntimeError(f"{self.cls.__name__}.backward returned {len(res)} gradients, but forward took "
                               f"{n_args} arguments")
        out = []
        for pos, e in zip(self.arg_tensor_pos, self.next_edges):
            g = res[pos]
            if g is not None and not isinstance(g, Tensor):
                raise TypeError(f"{self.cls.__name__}.backward must return Tensors or None, got {type(g).__name__}")
            out.append(g)
        return out

    def release(self):
        self.ctx._released = True
        self.ctx._saved = ()


class Function:
    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError

    @classmethod
    def apply(cls, *args, **kwargs):
        ctx = FunctionCtx()
        tpos = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        with grad_mode.no_grad():
            out = cls.forward(ctx, *args, **kwargs)
        record = grad_mode.is_grad_enabled() and any(ctx.needs_input_grad)
        single = not isinstance(out, tuple)
        outs = (out,) if single else out
        if not record:
            return out
        inputs = {id(args[i]) for i in tpos}
        dirty = {id(t) for t in ctx._dirty}
        for t in ctx._dirty:
            if t.requires_grad and t.is_leaf:
                raise RuntimeError(f"{cls.__name__}: a leaf Tensor that requires grad has been marked dirty "
                                   f"(modified in place)")
        edges = tuple(edge_of(args[i]) for i in tpos)
        meta = tuple((o._data.shape, o._data.dtype, o._data.device) if isinstance(o, Tensor) else None for o in outs)
        node = _FunctionNode(cls, ctx, edges, tpos, meta)
        node.n_args = len(args)
        non_diff = {id(t) for t in ctx._non_diff}
        new_outs = []
        for i, o in enumerate(outs):
            if isinstance(o, Tensor):
                if id(o) in inputs and id(o) not in dirty:
                    o = _wrap(o._data)  # an input returned as is: alias it, keep the input's history
                if id(o) not in non_diff and (o.is_floating_point() or o.is_complex()):
                    o.grad_fn, o._output_nr, o.requires_grad = node, i, True
            new_outs.append(o)
        return new_outs[0] if single else tuple(new_outs)


def once_differentiable(fn):
    @functools.wraps(fn)
    def wrapper(ctx, *grads):
        with grad_mode.no_grad():
            return fn(ctx, *grads)
    return wrapper
