"""Sorting, selection and sampling: sort, argsort, topk, kthvalue, unique, unique_consecutive,
multinomial, bernoulli and the in-place random fills (chapter §6.7).

Sorting and selection (tag ``sort``) follow PyTorch's signatures and return named tuples
``(values, indices)``.  The gradient of a selection is *value-selecting*: the output gradient is
scattered back to the positions the values came from (``zeros.scatter(dim, indices, g)``), which is
linear in ``g`` and therefore differentiable again.  ``argsort`` and the ``indices`` outputs are
integer tensors and carry no gradient.

``unique`` has a data-dependent output shape (tag ``dynamic_shape``); in the table it always
returns the triple ``(output, inverse_indices, counts)`` (unrequested parts are empty), and the
Python-level ``tp.unique`` / ``Tensor.unique`` return what was asked, like ``torch.unique``.

Sampling (tag ``random``) draws from the global generator (``tp.manual_seed``) or an explicit
``generator=``; a run is reproducible under the same seed and, since the kernels are ATen's, draws
the same numbers as PyTorch under the same seed.  Guarantees on bad input, checked before the
kernel runs (ATen would accept some of these silently or fail with an unhelpful message):

* ``multinomial``: probabilities must be 1-D or 2-D, finite and non-negative, each row with a
  positive sum; without replacement, ``num_samples`` may not exceed the number of categories with
  non-zero probability in any row (so the indices drawn are distinct and all have probability > 0);
* ``bernoulli``: probabilities must lie in [0, 1] (NaN rejected).

``normal(mean, std)`` (tensor mean and/or std, broadcast; ``tp.normal`` routes the numbers-and-size
form to the factory ``_normal``) is PyTorch's: its gradient is zero for both (PyTorch does not
reparameterise it).

The in-place fills ``bernoulli_``, ``uniform_``, ``normal_``, ``exponential_``, ``random_`` (used by
``nn.init``), ``cauchy_``, ``log_normal_``, ``geometric_`` are non-differentiable; on a leaf that
requires grad they must run under ``tp.no_grad()`` (as in PyTorch).
"""
from __future__ import annotations

import collections

import torch

from .reduction import _select_bwd
from .registry import OPS, _to_meta, register

__all__ = []

S = ("sort",)


def _named(opname, typename, fields=("values", "indices")):
    """Give an op's named tuple PyTorch's type name (``torch.return_types.sort`` -> ``sort``)."""
    OPS[opname].returns_named = collections.namedtuple(typename, fields)


# ---------------------------------------------------------------------------------------------
# sort, argsort, topk, kthvalue
# ---------------------------------------------------------------------------------------------
def _scatter_back(x_shape, g, idx, dim):
    """Gradient of a selection with ``keepdim`` layout: g scattered to ``idx`` along ``dim``."""
    if len(x_shape) == 0:
        return g.reshape(())
    return g.new_zeros(x_shape).scatter(dim, idx, g)


def _sort_kernel(self, dim, descending, stable):
    return tuple(torch.sort(self, dim=dim, descending=descending, stable=stable))


register("sort(Tensor self, int dim=-1, bool descending=False, *, bool? stable=False) -> (Tensor values, Tensor indices)",
         _sort_kernel, backward=lambda ctx, gv, gi: _scatter_back(ctx.self.shape, gv, ctx.result[1], ctx.dim),
         save=("result",), tags=S)
_named("sort", "sort")

register("argsort(Tensor self, int dim=-1, bool descending=False, *, bool stable=False) -> Tensor",
         lambda self, dim, descending, stable: torch.argsort(self, dim=dim, descending=descending, stable=stable),
         tags=S + ("nondifferentiable",))


def _topk_kernel(self, k, dim, largest, sorted):
    return tuple(torch.topk(self, k, dim, largest, sorted))


register("topk(Tensor self, int k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)",
         _topk_kernel, backward=lambda ctx, gv, gi: _scatter_back(ctx.self.shape, gv, ctx.result[1], ctx.dim),
         save=("result",), tags=S)
_named("topk", "topk")


register("kthvalue(Tensor self, int k, int dim=-1, bool keepdim=False) -> (Tensor values, Tensor indices)",
         lambda self, k, dim, keepdim: tuple(torch.kthvalue(self, k, dim, keepdim)),
         backward=lambda ctx, gv, gi: _select_bwd(ctx.self.shape, gv, ctx.result[1], ctx.dim, ctx.keepdim),
         save=("result",), tags=S)
_named("kthvalue", "kthvalue")


# ---------------------------------------------------------------------------------------------
# unique, unique_consecutive (dynamic output shapes)
# ---------------------------------------------------------------------------------------------
def _unique_parts(out, return_inverse, return_counts, like):
    out = list(out) if isinstance(out, (tuple, list)) else [out]
    values = out.pop(0)
    empty = torch.empty(0, dtype=torch.int64, device=like.device)
    inverse = out.pop(0) if return_inverse else empty
    counts = out.pop(0) if return_counts else empty
    return values, inverse, counts


def _unique_kernel(self, sorted, return_inverse, return_counts, dim):
    out = torch.unique(self, sorted=sorted, return_inverse=return_inverse, return_counts=return_counts, dim=dim)
    return _unique_parts(out, return_inverse, return_counts, self)


def _unique_consecutive_kernel(self, return_inverse, return_counts, dim):
    out = torch.unique_consecutive(self, return_inverse=return_inverse, return_counts=return_counts, dim=dim)
    return _unique_parts(out, return_inverse, return_counts, self)


_U = ("sort", "dynamic_shape", "nondifferentiable")
register("unique(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False, int? dim=None) "
         "-> (Tensor output, Tensor inverse_indices, Tensor counts)", _unique_kernel, tags=_U,
         function=False, method=False)
register("unique_consecutive(Tensor self, bool return_inverse=False, bool return_counts=False, int? dim=None) "
         "-> (Tensor output, Tensor inverse_indices, Tensor counts)", _unique_consecutive_kernel, tags=_U,
         function=False, method=False)


def _pick(res, return_inverse, return_counts):
    if not return_inverse and not return_counts:
        return res[0]
    out = [res[0]]
    if return_inverse:
        out.append(res[1])
    if return_counts:
        out.append(res[2])
    return tuple(out)


def unique(input, sorted=True, return_inverse=False, return_counts=False, dim=None):
    """The distinct elements of ``input`` (or distinct slices along ``dim``); with
    ``return_inverse`` also the index of each input element in the output, with ``return_counts``
    the number of occurrences.  Returns a Tensor or a tuple, like ``torch.unique``."""
    res = OPS["unique"].fn(input, sorted, return_inverse, return_counts, dim)
    return _pick(res, return_inverse, return_counts)


def unique_consecutive(input, return_inverse=False, return_counts=False, dim=None):
    """Like :func:`unique`, but only collapses runs of equal consecutive elements."""
    res = OPS["unique_consecutive"].fn(input, return_inverse, return_counts, dim)
    return _pick(res, return_inverse, return_counts)


for _f in (unique, unique_consecutive):
    _f.__module__ = "tensorplay"


# ---------------------------------------------------------------------------------------------
# multinomial, bernoulli
# ---------------------------------------------------------------------------------------------
R = ("random", "nondifferentiable")


def _multinomial_check(p, num_samples, replacement):
    if p.dim() not in (1, 2):
        raise RuntimeError(f"probabilities must be a 1-D or 2-D tensor, got shape {list(p.shape)}")
    if not (p.is_floating_point()):
        raise TypeError(f"probabilities must be a floating point tensor, got {p.dtype}")
    if num_samples <= 0:
        raise RuntimeError(f"num_samples must be positive, got {num_samples}")
    n = p.shape[-1]
    if n == 0:
        raise RuntimeError("probabilities have no categories (last dim has size 0)")
    if not replacement and num_samples > n:
        raise RuntimeError(f"cannot draw {num_samples} samples without replacement from {n} categories")
    rows = p.reshape(-1, n)
    if rows.shape[0] == 0:
        return
    bad = (~torch.isfinite(rows) | (rows < 0)).any(-1)
    nonpos = rows.sum(-1) <= 0
    nnz = (rows > 0).sum(-1)
    short = (nnz < num_samples) if not replacement else torch.zeros_like(bad)
    flags = torch.stack([bad.any(), nonpos.any(), short.any()]).tolist()
    if flags[0]:
        r = int(bad.nonzero()[0, 0])
        raise RuntimeError(f"invalid probability distribution: row {r} contains a negative, NaN or infinite "
                           f"probability ({rows[r].tolist()[:8]}{'...' if n > 8 else ''})")
    if flags[1]:
        r = int(nonpos.nonzero()[0, 0])
        raise RuntimeError(f"invalid probability distribution: the probabilities of row {r} sum to "
                           f"{float(rows[r].sum())} (they must have a positive sum)")
    if flags[2]:
        r = int(short.nonzero()[0, 0])
        raise RuntimeError(f"cannot draw {num_samples} samples without replacement: row {r} has only "
                           f"{int(nnz[r])} categories with non-zero probability")


def _multinomial_kernel(self, num_samples, replacement, generator):
    _multinomial_check(self, num_samples, replacement)
    return torch.multinomial(self, num_samples, replacement, generator=generator)


def _multinomial_meta(self, num_samples, replacement, generator):
    return torch.empty(tuple(self.shape[:-1]) + (num_samples,), dtype=torch.int64, device="meta")


register("multinomial(Tensor self, int num_samples, bool replacement=False, *, Generator? generator=None) -> Tensor",
         _multinomial_kernel, meta=_multinomial_meta, tags=R)


def _bernoulli_kernel(self, p, generator):
    if p is None:
        if self.numel() and not (self.is_floating_point()):
            raise TypeError(f"probabilities must be a floating point tensor, got {self.dtype}")
        if self.numel():
            lo, hi = torch.aminmax(self)
            ok = torch.stack([lo >= 0, hi <= 1]).all()   # False for NaN as well
            if not bool(ok):
                raise RuntimeError(f"probabilities must lie in [0, 1], got values in [{float(lo)}, {float(hi)}]"
                                   + (" (with NaN)" if bool(torch.isnan(self).any()) else ""))
        return torch.bernoulli(self, generator=generator)
    if not (0 <= p <= 1):
        raise RuntimeError(f"p must lie in [0, 1], got p={p}")
    return torch.bernoulli(self, p, generator=generator)


def _bernoulli_meta(self, p, generator):
    m = _to_meta(self)
    return torch.bernoulli(m) if p is None else torch.bernoulli(m, p)


register("bernoulli(Tensor self, float? p=None, *, Generator? generator=None) -> Tensor", _bernoulli_kernel,
         meta=_bernoulli_meta, tags=R)


def _normal_meta(mean, std, generator):
    return torch.normal(_to_meta(mean), _to_meta(std))


def _normal_bwd(ctx, g):
    n = ctx.needs_input_grad
    return (ctx.mean.new_zeros(ctx.mean.shape) if n[0] else None,
            ctx.std.new_zeros(ctx.std.shape) if len(n) > 1 and n[1] else None)


register("normal(Tensor mean, Tensor std=1.0, *, Generator? generator=None) -> Tensor",
         lambda mean, std, generator: torch.normal(mean, std, generator=generator), meta=_normal_meta,
         backward=_normal_bwd, save=("mean", "std"), tags=("random",), method=False, function=False,
         doc="Normal(mean, std) draws, a tensor mean and/or std broadcast; zero gradient (as PyTorch).")


# ---------------------------------------------------------------------------------------------
# in-place random fills
# ---------------------------------------------------------------------------------------------
RI = ("random", "inplace", "nondifferentiable")


def _bernoulli__kernel(self, p, generator):
    if not isinstance(p, torch.Tensor) and not (0 <= p <= 1):
        raise RuntimeError(f"p must lie in [0, 1], got p={p}")
    return self.bernoulli_(p, generator=generator)


def _fill_meta(self, *args):
    """An in-place fill's meta: its input's layout (no draw; the generator, perhaps a CPU
    generator next to meta tensors, is not consulted)."""
    return _to_meta(self)


def _random__kernel(self, from_, to, generator):
    if from_ is None and to is None:
        return self.random_(generator=generator)
    if to is None:  # random_(to)
        return self.random_(from_, generator=generator)
    return self.random_(from_, to, generator=generator)


def _fill(schema, kernel):
    register(schema, kernel, meta=_fill_meta, tags=RI, function=False)


_G = "*, Generator? generator=None) -> Tensor(a!)"
_fill(f"bernoulli_(Tensor(a!) self, Tensor p=0.5, {_G}", _bernoulli__kernel)
_fill(f"uniform_(Tensor(a!) self, float from_=0, float to=1, {_G}",
      lambda self, from_, to, generator: self.uniform_(from_, to, generator=generator))
_fill(f"normal_(Tensor(a!) self, float mean=0, float std=1, {_G}",
      lambda self, mean, std, generator: self.normal_(mean, std, generator=generator))
_fill(f"exponential_(Tensor(a!) self, float lambd=1, {_G}",
      lambda self, lambd, generator: self.exponential_(lambd, generator=generator))
_fill(f"random_(Tensor(a!) self, int? from_=None, int? to=None, {_G}", _random__kernel)
_fill(f"cauchy_(Tensor(a!) self, float median=0, float sigma=1, {_G}",
      lambda self, median, sigma, generator: self.cauchy_(median, sigma, generator=generator))
_fill(f"log_normal_(Tensor(a!) self, float mean=1, float std=2, {_G}",
      lambda self, mean, std, generator: self.log_normal_(mean, std, generator=generator))
_fill(f"geometric_(Tensor(a!) self, float p, {_G}", lambda self, p, generator: self.geometric_(p, generator=generator))

EXTRA_FUNCTIONS = {"unique": unique, "unique_consecutive": unique_consecutive}
EXTRA_METHODS = {"unique": unique, "unique_consecutive": unique_consecutive}
