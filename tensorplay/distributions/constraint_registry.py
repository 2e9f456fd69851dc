"""``biject_to(constraint)`` and ``transform_to(constraint)``: a transform from unconstrained reals
onto a constraint's set (PyTorch's ``torch.distributions.constraint_registry``), plus the two
simplex transforms they need.

``biject_to`` returns a bijection (optimisers then work on the unconstrained value and the
log-Jacobian is defined); ``transform_to`` may return a cheaper non-bijective map.  Covered: real
(identity), positive / nonnegative / greater_than(_eq) (exp then shift), less_than (negated exp),
unit_interval and interval (sigmoid then affine), simplex (``StickBreakingTransform`` for
``biject_to``, ``SoftmaxTransform`` for ``transform_to``), independent constraints (their base's
transform over more event dims).  ``register`` adds a factory for another constraint type.
"""
from __future__ import annotations

import torch

import tensorplay as tp
import tensorplay.nn.functional as F

from . import constraints
from .transforms import AffineTransform, ComposeTransform, ExpTransform, SigmoidTransform, Transform

__all__ = ["biject_to", "transform_to", "ConstraintRegistry", "SoftmaxTransform", "StickBreakingTransform",
           "identity_transform"]

identity_transform = ComposeTransform([])


class SoftmaxTransform(Transform):
    """x -> softmax(x) along the last dim (not injective: its inverse is log)."""
    domain = constraints.real_vector
    codomain = constraints.simplex
    bijective = False

    def _call(self, x):
        probs = (x - x.amax(-1, keepdim=True)).exp()
        return probs / probs.sum(-1, keepdim=True)

    def _inverse(self, y):
        return y.log()


class StickBreakingTransform(Transform):
    """R^K -> the (K+1)-simplex by stick breaking: a bijection with a log-Jacobian."""
    domain = constraints.real_vector
    codomain = constraints.simplex

    def _call(self, x):
        k = x.shape[-1]
        offset = k + 1 - tp.ones(k, dtype=x.dtype, device=x.device).cumsum(-1)
        fi = torch.finfo(x.dtype)
        z = (x - offset.log()).sigmoid().clamp(min=fi.tiny, max=1.0 - fi.eps)
        z_cumprod = (1 - z).cumprod(-1)
        return F.pad(z, (0, 1), value=1.0) * F.pad(z_cumprod, (1, 0), value=1.0)

    def _inverse(self, y):
        y_crop = y[..., :-1]
        offset = y.shape[-1] - tp.ones(y_crop.shape[-1], dtype=y.dtype, device=y.device).cumsum(-1)
        sf = (1 - y_crop.cumsum(-1)).clamp(min=torch.finfo(y.dtype).tiny)
        return y_crop.log() - sf.log() + offset.log()

    def log_abs_det_jacobian(self, x, y):
        k = x.shape[-1]
        offset = k + 1 - tp.ones(k, dtype=x.dtype, device=x.device).cumsum(-1)
        x = x - offset.log()
        return (-x + F.logsigmoid(x) + y[..., :-1].log()).sum(-1)

    def forward_shape(self, shape):
        return tuple(shape[:-1]) + (shape[-1] + 1,)

    def inverse_shape(self, shape):
        return tuple(shape[:-1]) + (shape[-1] - 1,)


class _IndependentTransform(Transform):
    """A base transform whose rightmost ``n`` batch dims are event dims (log-Jacobian summed)."""

    def __init__(self, base, n, cache_size=0):
        super().__init__(cache_size=cache_size)
        self.base_transform, self.reinterpreted_batch_ndims = base, n

    domain = property(lambda self: constraints.independent(self.base_transform.domain, self.reinterpreted_batch_ndims))
    codomain = property(lambda self: constraints.independent(self.base_transform.codomain,
                                                             self.reinterpreted_batch_ndims))

    def _call(self, x):
        return self.base_transform(x)

    def _inverse(self, y):
        return self.base_transform.inv(y)

    def log_abs_det_jacobian(self, x, y):
        r = self.base_transform.log_abs_det_jacobian(x, y)
        n = self.reinterpreted_batch_ndims
        return r.reshape(tuple(r.shape[:r.dim() - n]) + (-1,)).sum(-1) if n else r


class ConstraintRegistry:
    def __init__(self):
        self._registry = {}

    def register(self, constraint, factory=None):
        if factory is None:
            return lambda factory: self.register(constraint, factory)
        key = constraint if isinstance(constraint, type) else type(constraint)
        self._registry[key] = factory
        return factory

    def __call__(self, constraint):
        try:
            factory = self._registry[type(constraint)]
        except KeyError:
            raise NotImplementedError(f"Cannot transform {type(constraint).__name__} constraints") from None
        return factory(constraint)


def _to_interval(c):
    if isinstance(c.lower_bound, (int, float)) and isinstance(c.upper_bound, (int, float)) and \
            c.lower_bound == 0 and c.upper_bound == 1:
        return SigmoidTransform()
    return ComposeTransform([SigmoidTransform(), AffineTransform(c.lower_bound, c.upper_bound - c.lower_bound)])


biject_to = ConstraintRegistry()
transform_to = ConstraintRegistry()

for _reg in (biject_to, transform_to):
    _reg.register(constraints.real, lambda c: identity_transform)
    _reg.register(constraints.positive, lambda c: ExpTransform())
    _reg.register(constraints.nonnegative, lambda c: ExpTransform())
    _reg.register(constraints.greater_than,
                  lambda c: ComposeTransform([ExpTransform(), AffineTransform(c.lower_bound, 1)]))
    _reg.register(constraints.greater_than_eq,
                  lambda c: ComposeTransform([ExpTransform(), AffineTransform(c.lower_bound, 1)]))
    _reg.register(constraints.less_than,
                  lambda c: ComposeTransform([ExpTransform(), AffineTransform(c.upper_bound, -1)]))
    _reg.register(constraints.interval, _to_interval)
    _reg.register(constraints.half_open_interval, _to_interval)
biject_to.register(constraints.simplex, lambda c: StickBreakingTransform())
transform_to.register(constraints.simplex, lambda c: SoftmaxTransform())
for _reg in (biject_to, transform_to):
    _reg.register(constraints.independent, lambda c, _r=_reg: _IndependentTransform(_r(c.base_constraint),
                                                                                    c.reinterpreted_batch_ndims))
    _reg.register(type(constraints.real_vector), lambda c: identity_transform)
