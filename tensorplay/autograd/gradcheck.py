"""``gradcheck`` / ``gradgradcheck``: analytical against numerical Jacobians (chapter §5.6).

The numerical Jacobian uses central differences ``(f(x+eps e_i) - f(x-eps e_i)) / 2eps`` in float64,
whose truncation error is O(eps²) and rounding error O(u/eps); eps = 1e-6 balances both at about
1e-10 relative.  The analytical Jacobian is built row by row with ``grad`` (one vjp per output
element) and, with ``check_forward_ad``, column by column with forward-mode duals.
"""
from __future__ import annotations

import itertools

import torch

from .._tensor import Tensor, _wrap
from . import forward_ad, grad_mode
from .engine import grad as _grad

__all__ = ["gradcheck", "gradgradcheck", "GradcheckError"]


class GradcheckError(RuntimeError):
    pass


def _as_tuple(x):
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _outputs(fn, inputs):
    return [o for o in _as_tuple(fn(*inputs)) if isinstance(o, Tensor)]


def _numerical(fn, inputs, diff_idx, eps):
    outs0 = _outputs(fn, inputs)
    jac = [[torch.zeros(o.numel(), inputs[i].numel(), dtype=torch.float64) for i in diff_idx] for o in outs0]
    with grad_mode.no_grad():
        for k, i in enumerate(diff_idx):
            d = inputs[i]._data
            # perturb element by element through its multi-index: works for any strides
            for j, idx in enumerate(itertools.product(*[range(n) for n in d.shape])):
                orig = d[idx].item()
                d[idx] = orig + eps
                plus = [o._data.detach().clone().reshape(-1).double() for o in _outputs(fn, inputs)]
                d[idx] = orig - eps
                minus = [o._data.detach().clone().reshape(-1).double() for o in _outputs(fn, inputs)]
                d[idx] = orig
                for m, (p, q) in enumerate(zip(plus, minus)):
                    jac[m][k][:, j] = (p - q) / (2 * eps)
    return jac


def _analytical(fn, inputs, diff_idx):
    with grad_mode.enable_grad():
        outs = _outputs(fn, inputs)
        jac = [[torch.zeros(o.numel(), inputs[i].numel(), dtype=torch.float64) for i in diff_idx] for o in outs]
        for m, o in enumerate(outs):
            if not o.requires_grad:
                continue
            for r in range(o.numel()):
                u = torch.zeros(o.numel(), dtype=o.dtype)
                u[r] = 1
                gs = _grad([o], [inputs[i] for i in diff_idx], [_wrap(u.view(o.shape))], retain_graph=True,
                           allow_unused=True)
                for k, g in enumerate(gs):
                    if g is not None:
                        jac[m][k][r] = g._data.reshape(-1).double()
    return jac


def _forward(fn, inputs, diff_idx):
    outs0 = _outputs(fn, inputs)
    jac = [[torch.zeros(o.numel(), inputs[i].numel(), dtype=torch.float64) for i in diff_idx] for o in outs0]
    for k, i in enumerate(diff_idx):
        n = inputs[i].numel()
        for c in range(n):
            v = torch.zeros(n, dtype=inputs[i].dtype)
            v[c] = 1
            with forward_ad.dual_level():
                args = list(inputs)
                args[i] = forward_ad.make_dual(inputs[i], _wrap(v.view(inputs[i].shape)))
                outs = _outputs(fn, args)
                for m, o in enumerate(outs):
                    t = o._fw_grad
                    if t is not None:
                        jac[m][k][:, c] = t._data.reshape(-1).double()
    return jac


def gradcheck(fn, inputs, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True, check_forward_ad=False,
              check_backward_ad=True, nondet_tol=0.0, fast_mode=False):
    inputs = _as_tuple(inputs)
    diff_idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    for i in diff_idx:
        if inputs[i].dtype != torch.float64:
            import warnings
            warnings.warn(f"gradcheck: input {i} is {inputs[i].dtype}, not float64; the check may fail from rounding")
    num = _numerical(fn, inputs, diff_idx, eps)
    checks = []
    if check_backward_ad:
        checks.append(("backward", _analytical(fn, inputs, diff_idx)))
    if check_forward_ad:
        checks.append(("forward", _forward(fn, inputs, diff_idx)))
    for mode, ana in checks:
        for m, (nrow, arow) in enumerate(zip(num, ana)):
            for k, (n, a) in enumerate(zip(nrow, arow)):
                if not torch.allclose(a, n, rtol=rtol, atol=atol):
                    if raise_exception:
                        err = (a - n).abs().max().item()
                        raise GradcheckError(
                            f"gradcheck ({mode} mode): Jacobian mismatch for output {m} w.r.t. input "
                            f"{diff_idx[k]} (max abs difference {err:.3g})\nnumerical:\n{n}\nanalytical:\n{a}")
                    return False
    return True


def gradgradcheck(fn, inputs, grad_outputs=None, *, eps=1e-6, atol=1e-5, rtol=1e-3, raise_exception=True):
    """Check second derivatives: gradcheck of (inputs, v) -> vjp(fn)(inputs, v)."""
    inputs = _as_tuple(inputs)
    outs = _outputs(fn, inputs)
    if grad_outputs is None:
        g = torch.Generator().manual_seed(0)
        grad_outputs = [_wrap(torch.randn(o.shape, dtype=o.dtype, generator=g)).requires_grad_() for o in outs]
    diff_idx = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
    n_in = len(inputs)

    def vjp_fn(*args):
        ins, gos = args[:n_in], args[n_in:]
        with grad_mode.enable_grad():
            os_ = _outputs(fn, ins)
            gs = _grad(os_, [ins[i] for i in diff_idx], list(gos), create_graph=True, allow_unused=True)
        return tuple(g for g in gs if g is not None)

    return gradcheck(vjp_fn, tuple(inputs) + tuple(grad_outputs), eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)
