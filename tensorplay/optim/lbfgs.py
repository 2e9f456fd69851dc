"""L-BFGS (Nocedal 1980; Liu & Nocedal 1989): a quasi-Newton method that keeps the last
``history_size`` pairs (s, y) of parameter and gradient changes and applies the implied inverse
Hessian to the gradient with the two-loop recursion.

``step(closure)`` re-evaluates the loss through ``closure`` (which zeroes the gradients, computes the
loss and calls ``backward``) up to ``max_iter`` iterations / ``max_eval`` evaluations.  The first
direction is −g with step min(1, 1/‖g‖₁)·lr; afterwards the step is ``lr``, or, with
``line_search_fn="strong_wolfe"``, the step satisfying the strong Wolfe conditions (c₁ = 1e-4,
c₂ = 0.9) found by bracketing and cubic interpolation.  Iteration stops when max|g| ≤
``tolerance_grad``, or the step or the loss change falls below ``tolerance_change``.

Guarantees: one parameter group only (as in PyTorch); all parameters are treated as one flat
vector; the state (``d``, ``t``, ``old_dirs``, ``old_stps``, ``ro``, ``H_diag``, ``prev_flat_grad``,
``prev_loss``, ``n_iter``, ``func_evals``) is kept on the first parameter under PyTorch's names,
and the arithmetic follows PyTorch's order, so iterates agree with ``torch.optim.LBFGS``.
"""
from __future__ import annotations

import torch

from .._tensor import Tensor
from ..autograd.grad_mode import enable_grad, no_grad
from .optimizer import Optimizer

__all__ = ["LBFGS"]


def _raw(v):
    return v._data if isinstance(v, Tensor) else v


def _cubic_min(x1, f1, g1, x2, f2, g2, bounds=None):
    """Minimiser of the cubic through (x1, f1) and (x2, f2) with slopes g1, g2, clipped to ``bounds``
    (default: the interval between the points); the midpoint when the cubic has no minimum."""
    lo, hi = bounds if bounds is not None else ((x1, x2) if x1 <= x2 else (x2, x1))
    d1 = g1 + g2 - 3 * (f1 - f2) / (x1 - x2)
    disc = d1 ** 2 - g1 * g2
    if disc < 0:
        return (lo + hi) / 2.0
    d2 = disc.sqrt()
    if x1 <= x2:
        x = x2 - (x2 - x1) * ((g2 + d2 - d1) / (g2 - g1 + 2 * d2))
    else:
        x = x1 - (x1 - x2) * ((g1 + d2 - d1) / (g1 - g2 + 2 * d2))
    return min(max(x, lo), hi)


def _strong_wolfe(evaluate, t, d, f, g, gtd, c1=1e-4, c2=0.9, tolerance_change=1e-9, max_ls=25):
    """Line search along ``d`` from loss ``f``/gradient ``g`` (directional derivative ``gtd``):
    returns (loss, flat gradient, step, evaluations)."""
    d_norm = d.abs().max()
    g = g.clone(memory_format=torch.contiguous_format)
    f_new, g_new = evaluate(t)
    evals = 1
    gtd_new = g_new.dot(d)
    t_prev, f_prev, g_prev, gtd_prev = 0, f, g, gtd
    done, it = False, 0
    # bracketing phase: grow the step until an interval holds a point satisfying the conditions
    while it < max_ls:
        if f_new > (f + c1 * t * gtd) or (it > 1 and f_new >= f_prev):
            br, br_f, br_g, br_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        if abs(gtd_new) <= -c2 * gtd:
            br, br_f, br_g, done = [t], [f_new], [g_new], True
            break
        if gtd_new >= 0:
            br, br_f, br_g, br_gtd = [t_prev, t], [f_prev, f_new], [g_prev, g_new.clone()], [gtd_prev, gtd_new]
            break
        lo, hi = t + 0.01 * (t - t_prev), t * 10
        t_old = t
        t = _cubic_min(t_prev, f_prev, gtd_prev, t, f_new, gtd_new, bounds=(lo, hi))
        t_prev, f_prev, g_prev, gtd_prev = t_old, f_new, g_new.clone(), gtd_new
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        it += 1
    if it == max_ls:
        br, br_f, br_g = [0, t], [f, f_new], [g, g_new]
    # zoom phase: shrink the bracket by cubic interpolation
    insufficient = False
    low, high = (0, 1) if br_f[0] <= br_f[-1] else (1, 0)
    while not done and it < max_ls:
        if abs(br[1] - br[0]) * d_norm < tolerance_change:
            break
        t = _cubic_min(br[0], br_f[0], br_gtd[0], br[1], br_f[1], br_gtd[1])
        top, bot = max(br), min(br)
        eps = 0.1 * (top - bot)
        if min(top - t, t - bot) < eps:
            if insufficient or t >= top or t <= bot:
                t = top - eps if abs(t - top) < abs(t - bot) else bot + eps
                insufficient = False
            else:
                insufficient = True
        else:
            insufficient = False
        f_new, g_new = evaluate(t)
        evals += 1
        gtd_new = g_new.dot(d)
        it += 1
        if f_new > (f + c1 * t * gtd) or f_new >= br_f[low]:
            br[high], br_f[high], br_g[high], br_gtd[high] = t, f_new, g_new.clone(), gtd_new
            low, high = (0, 1) if br_f[0] <= br_f[1] else (1, 0)
        else:
            if abs(gtd_new) <= -c2 * gtd:
                done = True
            elif gtd_new * (br[high] - br[low]) >= 0:
                br[high], br_f[high], br_g[high], br_gtd[high] = br[low], br_f[low], br_g[low], br_gtd[low]
            br[low], br_f[low], br_g[low], br_gtd[low] = t, f_new, g_new.clone(), gtd_new
    return br_f[low], br_g[low], br[low], evals


class LBFGS(Optimizer):
    def __init__(self, params, lr: float = 1, max_iter: int = 20, max_eval: int | None = None,
                 tolerance_grad: float = 1e-7, tolerance_change: float = 1e-9, history_size: int = 100,
                 line_search_fn: str | None = None):
        if not 0.0 <= lr:
            raise ValueError(f"tp.optim.LBFGS: invalid learning rate: {lr}")
        if line_search_fn not in (None, "strong_wolfe"):
            raise ValueError(f"tp.optim.LBFGS: line_search_fn must be None or 'strong_wolfe', got {line_search_fn!r}")
        if max_eval is None:
            max_eval = max_iter * 5 // 4
        super().__init__(params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval, tolerance_grad=tolerance_grad,
                                      tolerance_change=tolerance_change, history_size=history_size,
                                      line_search_fn=line_search_fn))
        if len(self.param_groups) != 1:
            raise ValueError("tp.optim.LBFGS doesn't support per-parameter options (parameter groups)")
        self._params = self.param_groups[0]["params"]

    def _flat_grad(self):
        return torch.cat([p._data.new_zeros(p.numel()) if p._grad is None else p._grad._data.reshape(-1)
                          for p in self._params], 0)

    def _add_step(self, t, d):
        offset = 0
        for p in self._params:
            n = p.numel()
            p._data.add_(d[offset:offset + n].view_as(p._data), alpha=t)
            offset += n

    def _evaluate(self, closure):
        with enable_grad():
            loss = closure()
        return float(loss)

    def step(self, closure):
        if closure is None:
            raise RuntimeError("tp.optim.LBFGS.step needs a closure that re-evaluates the loss")
        with no_grad():
            return self._run(closure)

    def _run(self, closure):
        group = self.param_groups[0]
        lr, max_iter, max_eval = group["lr"], group["max_iter"], group["max_eval"]
        tol_grad, tol_change, history = group["tolerance_grad"], group["tolerance_change"], group["history_size"]
        state = self.state[self._params[0]]
        state.setdefault("func_evals", 0)
        state.setdefault("n_iter", 0)
        with enable_grad():
            orig_loss = closure()
        loss = float(orig_loss)
        evals = 1
        state["func_evals"] += 1
        g = self._flat_grad()
        if g.abs().max() <= tol_grad:
            return orig_loss
        d, t = _raw(state.get("d")), _raw(state.get("t"))
        old_dirs, old_stps, ro = state.get("old_dirs"), state.get("old_stps"), state.get("ro")
        old_dirs = None if old_dirs is None else [_raw(v) for v in old_dirs]
        old_stps = None if old_stps is None else [_raw(v) for v in old_stps]
        ro = None if ro is None else [_raw(v) for v in ro]
        h_diag, prev_g, prev_loss = _raw(state.get("H_diag")), _raw(state.get("prev_flat_grad")), state.get("prev_loss")
        n = 0
        while n < max_iter:
            n += 1
            state["n_iter"] += 1
            if state["n_iter"] == 1:
                d, old_dirs, old_stps, ro, h_diag = g.neg(), [], [], [], 1
            else:
                y = g.sub(prev_g)
                s = d.mul(t)
                ys = y.dot(s)
                if ys > 1e-10:
                    if len(old_dirs) == history:
                        old_dirs.pop(0), old_stps.pop(0), ro.pop(0)
                    old_dirs.append(y)
                    old_stps.append(s)
                    ro.append(1.0 / ys)
                    h_diag = ys / y.dot(y)
                al = state.setdefault("al", [None] * history)
                q = g.neg()
                for i in range(len(old_dirs) - 1, -1, -1):   # two-loop recursion
                    al[i] = old_stps[i].dot(q) * ro[i]
                    q.add_(old_dirs[i], alpha=-al[i])
                d = r = torch.mul(q, h_diag)
                for i in range(len(old_dirs)):
                    r.add_(old_stps[i], alpha=al[i] - old_dirs[i].dot(r) * ro[i])
            prev_g = g.clone(memory_format=torch.contiguous_format) if prev_g is None else prev_g.copy_(g)
            prev_loss = loss
            t = min(1.0, 1.0 / g.abs().sum()) * lr if state["n_iter"] == 1 else lr
            gtd = g.dot(d)
            if gtd > -tol_change:
                break
            ls_evals = 0
            if group["line_search_fn"] == "strong_wolfe":
                x0 = [p._data.clone(memory_format=torch.contiguous_format) for p in self._params]

                def evaluate(step, d=d, x0=x0):
                    self._add_step(step, d)
                    f_step = self._evaluate(closure)
                    g_step = self._flat_grad()
                    for p, x in zip(self._params, x0):
                        p._data.copy_(x)
                    return f_step, g_step
                loss, g, t, ls_evals = _strong_wolfe(evaluate, t, d, loss, g, gtd, max_ls=max_eval - evals)
                self._add_step(t, d)
                converged = g.abs().max() <= tol_grad
            else:
                self._add_step(t, d)
                converged = False
                if n != max_iter:
                    loss = self._evaluate(closure)
                    g = self._flat_grad()
                    converged = g.abs().max() <= tol_grad
                    ls_evals = 1
            evals += ls_evals
            state["func_evals"] += ls_evals
            if n == max_iter or evals >= max_eval or converged:
                break
            if d.mul(t).abs().max() <= tol_change or abs(loss - prev_loss) < tol_change:
                break
        state.update(d=d, t=t, old_dirs=old_dirs, old_stps=old_stps, ro=ro, H_diag=h_diag, prev_flat_grad=prev_g,
                     prev_loss=prev_loss)
        return orig_loss
