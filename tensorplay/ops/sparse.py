"""Sparse COO tensors: conversions and constructors in the op table.

A tensorplay tensor may hold an ATen sparse COO tensor (``layout == torch.sparse_coo``): ATen's
kernels already take sparse operands for the ops sparse programs use (``mm`` of sparse @ dense,
``add`` of dense + sparse, ``sum``, ``t``, ``mul`` by a scalar, ``to``), so those ops go through the
ordinary table entries and their derivatives (the gradient of a dense operand of ``mm`` is dense;
a gradient reaching a sparse input is dense unless stated).  The entries here convert between
layouts and build sparse tensors:

* ``to_sparse`` (``to_sparse_coo``): dense -> COO; its derivative turns the gradient dense;
* ``to_dense``: COO -> dense (a dense input is returned as it is); its derivative keeps the
  gradient at the input's non-zero pattern (``sparse_mask``), PyTorch's rule;
* ``coalesce`` (sum duplicate indices), ``indices`` / ``values`` (of a coalesced tensor),
  ``_indices`` / ``_values`` / ``_nnz`` (raw, no coalescing): not differentiable here;
* ``sparse_coo_tensor(indices, values, size)``: a COO tensor from indices (2 x nnz) and values.

Compiled programs (``tp.compile``) do not lower sparse tensors: a call with a sparse argument
runs eagerly, and an op reading or making a sparse value inside a compiled graph is an ATen call
(a fallback kernel); ``strict_native=True`` raises for either.
"""
from __future__ import annotations

import torch

from .registry import OPS, register

_ND = ("nondifferentiable",)


def _dense(g):
    return OPS["to_dense"].fn(g) if g.layout == torch.sparse_coo else g


def _to_sparse_kernel(self, sparse_dim):
    if self.layout == torch.sparse_coo:
        return self
    return self.to_sparse() if sparse_dim is None else self.to_sparse(sparse_dim)


def _to_dense_bwd(ctx, g):
    x = ctx.self
    if x.layout != torch.sparse_coo:
        return g
    return OPS["sparse_mask"].fn(_dense(g), OPS["coalesce"].fn(x))


register("to_sparse(Tensor self, int? sparse_dim=None) -> Tensor", _to_sparse_kernel,
         backward=lambda ctx, g: _dense(g), save=(), function=False,
         doc="The COO sparse form of a dense tensor (sparse_dim leading dims sparse; all by default).")
register("to_sparse_coo(Tensor self) -> Tensor", lambda self: _to_sparse_kernel(self, None),
         backward=lambda ctx, g: _dense(g), save=(), function=False, doc="to_sparse with all dims sparse.")
register("to_dense(Tensor self, ScalarType? dtype=None) -> Tensor",
         lambda self, dtype: self.to_dense(dtype=dtype) if self.layout == torch.sparse_coo
         else (self if dtype is None else self.to(dtype)),
         backward=_to_dense_bwd, save=("self",), function=False,
         doc="The dense (strided) form of a sparse tensor; a dense tensor is returned as it is.")
register("sparse_mask(Tensor self, Tensor mask) -> Tensor", lambda self, mask: self.sparse_mask(mask), tags=_ND,
         function=False, doc="The values of dense `self` at the non-zero pattern of the coalesced sparse `mask`.")
register("coalesce(Tensor self) -> Tensor", lambda self: self.coalesce(), backward=lambda ctx, g: g, save=(), function=False,
         doc="The sparse tensor with duplicate indices summed and indices sorted.")
register("is_coalesced(Tensor self) -> bool", lambda self: self.is_coalesced(), tags=_ND, function=False)
register("indices(Tensor self) -> Tensor", lambda self: self.indices(), tags=_ND, function=False,
         doc="The (sparse_dim x nnz) indices of a coalesced sparse tensor.")
register("values(Tensor self) -> Tensor", lambda self: self.values(), tags=_ND, function=False,
         doc="The nnz values of a coalesced sparse tensor.")
register("_indices(Tensor self) -> Tensor", lambda self: self._indices(), tags=_ND, function=False)
register("_values(Tensor self) -> Tensor", lambda self: self._values(), tags=_ND, function=False)
register("_nnz(Tensor self) -> int", lambda self: self._nnz(), tags=_ND, function=False)
register("sparse_dim(Tensor self) -> int", lambda self: self.sparse_dim(), tags=_ND, function=False)
register("dense_dim(Tensor self) -> int", lambda self: self.dense_dim(), tags=_ND, function=False)


def _sparse_coo_kernel(indices, values, size, dtype, device, is_coalesced, check_invariants):
    if indices.dim() != 2:
        raise RuntimeError(f"tp.sparse_coo_tensor: indices must be 2-D (sparse_dim x nnz), got shape "
                           f"{list(indices.shape)}")
    if values.dim() < 1 or values.shape[0] != indices.shape[1]:
        raise RuntimeError(f"tp.sparse_coo_tensor: values must have nnz = {indices.shape[1]} rows, got shape "
                           f"{list(values.shape)}")
    kw = dict(dtype=dtype, device=device, is_coalesced=is_coalesced, check_invariants=check_invariants)
    return torch.sparse_coo_tensor(indices, values, **kw) if size is None else \
        torch.sparse_coo_tensor(indices, values, size, **kw)


register("_sparse_coo_tensor(Tensor indices, Tensor values, int[]? size=None, *, ScalarType? dtype=None, "
         "Device? device=None, bool? is_coalesced=None, bool? check_invariants=None) -> Tensor", _sparse_coo_kernel, tags=_ND + ("factory",),
         method=False, function=False, doc="A COO sparse tensor with `values` at the columns of `indices` (the "
                                           "size inferred from the largest index when not given).")


def sparse_coo_tensor(indices, values, size=None, *, dtype=None, device=None, requires_grad=False,
                      check_invariants=True, is_coalesced=None):
    """PyTorch's ``torch.sparse_coo_tensor``: indices and values may be tensors, arrays or lists.
    Unlike PyTorch the invariants (indices within ``size``) are checked by default, so a bad index
    is an error here rather than a crash later; ``check_invariants=False`` skips the check."""
    from .factories import as_tensor
    from .._tensor import Tensor
    i = indices if isinstance(indices, Tensor) else as_tensor(indices)
    v = values if isinstance(values, Tensor) else as_tensor(values)
    out = OPS["_sparse_coo_tensor"].fn(i, v, None if size is None else list(size), dtype=dtype, device=device,
                                       is_coalesced=is_coalesced, check_invariants=check_invariants)
    return out.requires_grad_() if requires_grad else out


register("spmm(Tensor self, Tensor mat2) -> Tensor", lambda self, mat2: torch.mm(self, mat2),
         backward=lambda ctx, g: OPS["mm"].backward(ctx, g), save=("self", "mat2"), tags=("linalg",), method=False,
         doc="mm with a sparse first operand (PyTorch's name; the same kernel as mm).")

EXTRA_FUNCTIONS = {"sparse_coo_tensor": sparse_coo_tensor}
