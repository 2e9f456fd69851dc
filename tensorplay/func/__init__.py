"""Function transforms in the style of ``torch.func`` / JAX: ``jvp``, ``vjp``, ``grad`` (chapter §5.7).

``jvp`` runs the function once with dual tensors (forward mode: cost ~ one evaluation per tangent
direction); ``vjp`` runs it once recording the TPX graph and returns a function that pulls
cotangents back (reverse mode: cost ~ one backward per cotangent).  ``grad`` is ``vjp`` with the
cotangent 1 for scalar functions.  The inputs are not modified and get no ``.grad``.
"""
from __future__ import annotations

from .._tensor import Tensor, _wrap
from ..autograd import forward_ad, grad_mode
from ..autograd.engine import grad as _grad

__all__ = ["jvp", "vjp", "grad", "grad_and_value"]


def _tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def jvp(func, primals, tangents):
    """Return ``(func(*primals), J·tangents)``."""
    primals, tangents = _tuple(primals), _tuple(tangents)
    if len(primals) != len(tangents):
        raise ValueError(f"jvp: {len(primals)} primals but {len(tangents)} tangents")
    with forward_ad.dual_level():
        duals = [forward_ad.make_dual(p.detach(), t) for p, t in zip(primals, tangents)]
        out = func(*duals)
        single = isinstance(out, Tensor)
        outs = _tuple(out)
        res, tans = [], []
        for o in outs:
            p, t = forward_ad.unpack_dual(o)
            res.append(p.detach())
            tans.append(t if t is not None else _wrap(o._data.new_zeros(o.shape)))
    if single:
        return res[0], tans[0]
    return tuple(res), tuple(tans)


def vjp(func, *primals, has_aux=False):
    """Return ``(func(*primals), vjp_fn)`` with ``vjp_fn(cotangents) -> grads w.r.t. primals``."""
    inputs = [_wrap(p._data).requires_grad_() if p.is_floating_point() else p.detach() for p in primals]
    with grad_mode.enable_grad():
        out = func(*inputs)
    aux = None
    if has_aux:
        out, aux = out
    single = isinstance(out, Tensor)
    outs = _tuple(out)

    def vjp_fn(*cotangents):
        cts = _tuple(cotangents[0]) if len(cotangents) == 1 and not single else cotangents
        if len(cts) != len(outs):
            raise ValueError(f"vjp_fn: expected {len(outs)} cotangents, got {len(cts)}")
        diff = [(o, c) for o, c in zip(outs, cts) if o.requires_grad]
        targets = [i for i in inputs if i.requires_grad]
        if not diff:
            return tuple(_wrap(i._data.new_zeros(i.shape)) for i in inputs)
        gs = _grad([o for o, _ in diff], targets, [c for _, c in diff], retain_graph=True,
                   create_graph=grad_mode.is_grad_enabled(), materialize_grads=True)
        it = iter(gs)
        return tuple(next(it) if i.requires_grad else None for i in inputs)

    outs_d = [o.detach() for o in outs]
    res = outs_d[0] if single else tuple(outs_d)
    return (res, vjp_fn, aux) if has_aux else (res, vjp_fn)


def grad_and_value(func, argnums=0, has_aux=False):
    def wrapper(*args):
        nums = _tuple(argnums)
        inputs = list(args)
        for n in nums:
            inputs[n] = _wrap(args[n]._data).requires_grad_()
        with grad_mode.enable_grad():
            out = func(*inputs)
            aux = None
            if has_aux:
                out, aux = out
            if not isinstance(out, Tensor) or out.numel() != 1:
                raise RuntimeError("grad: the function must return a scalar Tensor")
            gs = _grad(out, [inputs[n] for n in nums], allow_unused=True, materialize_grads=True)
        g = gs[0] if isinstance(argnums, int) else gs
        val = (out.detach(), aux) if has_aux else out.detach()
        return g, val
    return wrapper


def grad(func, argnums=0, has_aux=False):
    gv = grad_and_value(func, argnums, has_aux)

    def wrapper(*args):
        g, val = gv(*args)
        return (g, val[1]) if has_aux else g
    return wrapper
