"""Sparse COO tensors (tensorplay/ops/sparse.py, tensorplay/sparse.py) against PyTorch: conversions,
construction from lists / arrays, sparse @ dense with the dense operand's gradient, the derivative
rules of to_sparse / to_dense, tp.sparse's functions, and compiled calls with sparse arguments
(eager, or an error under strict_native)."""
import numpy as np
import pytest
import torch

import tensorplay as tp
from tensorplay.testing import assert_close


def _sparse_pair(shape=(5, 4), seed=0):
    g = torch.Generator().manual_seed(seed)
    d = torch.randn(shape, generator=g) * (torch.rand(shape, generator=g) > 0.6)
    return d, tp.from_torch(d.clone())


def test_to_sparse_and_back():
    d, p = _sparse_pair()
    s = p.to_sparse()
    assert s.is_sparse and s.layout == tp.sparse_coo and not p.is_sparse and p.layout == tp.strided
    ts = d.to_sparse()
    assert s._nnz() == ts._nnz() and s.sparse_dim() == 2 and s.dense_dim() == 0
    assert_close(s.indices(), ts.indices(), exact=True)
    assert_close(s.values(), ts.values(), exact=True)
    assert_close(s.to_dense(), d, exact=True)
    assert p.to_dense()._data is p._data          # a dense tensor is its own dense form
    assert_close(p.to_sparse(1).to_dense(), d, exact=True)
    assert p.to_sparse_coo().is_sparse


def test_sparse_coo_tensor_from_lists_arrays_and_tensors():
    i = [[0, 1, 1, 2], [2, 0, 0, 1]]          # a duplicate index (1, 0): coalescing sums it
    v = [3.0, 4.0, 5.0, -1.0]
    t = torch.sparse_coo_tensor(i, v, (3, 3))
    for idx, val in ((i, v), (np.array(i), np.array(v, dtype=np.float32)), (tp.tensor(i), tp.tensor(v))):
        p = tp.sparse_coo_tensor(idx, val, (3, 3))
        assert p.is_sparse and p.shape == (3, 3)
        assert_close(p.to_dense(), t.to_dense(), exact=True)
        assert_close(p.coalesce().values(), t.coalesce().values(), exact=True)
    p = tp.sparse_coo_tensor(i, v, dtype=tp.float64)  # size inferred from the largest index
    assert p.shape == (3, 3) and p.dtype == tp.float64
    assert tp.sparse_coo_tensor(i, v, (3, 3), dtype=tp.int64).to_dense().dtype == tp.int64
    with pytest.raises(RuntimeError, match="tp.sparse_coo_tensor: indices must be 2-D"):
        tp.sparse_coo_tensor([0, 1], [1.0, 2.0], (3,))
    with pytest.raises(RuntimeError, match="tp.sparse_coo_tensor: values must have nnz = 4"):
        tp.sparse_coo_tensor(i, [1.0, 2.0], (3, 3))
    with pytest.raises(RuntimeError, match="sparse_coo_tensor"):     # an index outside size: checked
        tp.sparse_coo_tensor([[0, 5], [0, 1]], [1.0, 2.0], (3, 3))


def test_spmm_forward_and_dense_gradient():
    d, p = _sparse_pair((6, 5))
    w = torch.randn(5, 3, requires_grad=True)
    pw = tp.from_torch(w.detach().clone()).requires_grad_()
    out = torch.spmm(d.to_sparse(), w).tanh()
    pout = tp.spmm(p.to_sparse(), pw).tanh()
    assert_close(pout, out, rtol=1e-6, atol=1e-6)
    g = torch.randn_like(out)
    out.backward(g)
    pout.backward(tp.from_torch(g))
    assert_close(pw.grad, w.grad, rtol=1e-6, atol=1e-6)
    assert_close(tp.sparse.mm(p.to_sparse(), pw), torch.sparse.mm(d.to_sparse(), w), rtol=1e-6, atol=1e-6)
    assert_close(tp.mm(p.to_sparse(), pw), torch.mm(d.to_sparse(), w), rtol=1e-6, atol=1e-6)
    b = torch.randn(6, 3)
    assert_close(tp.sparse.addmm(tp.from_torch(b), p.to_sparse(), pw, beta=0.5, alpha=2.0),
                 torch.sparse.addmm(b, d.to_sparse(), w, beta=0.5, alpha=2.0), rtol=1e-6, atol=1e-6)


def test_conversion_derivatives_follow_pytorch():
    d, _ = _sparse_pair((4, 4), seed=2)
    x = d.clone().requires_grad_()
    px = tp.from_torch(d.clone()).requires_grad_()
    (x.to_sparse().to_dense() * torch.arange(16.0).reshape(4, 4)).sum().backward()
    (px.to_sparse().to_dense() * tp.arange(16.0).reshape(4, 4)).sum().backward()
    assert not px.grad.is_sparse
    assert_close(px.grad, x.grad.to_dense(), exact=True)
    # to_dense of a sparse leaf: the gradient keeps the input's pattern (sparse_mask)
    s = d.to_sparse().requires_grad_()
    ps = tp.from_torch(d.to_sparse()).requires_grad_()
    (s.to_dense() * 3.0).sum().backward()
    (ps.to_dense() * 3.0).sum().backward()
    assert ps.grad.is_sparse
    assert_close(ps.grad.to_dense(), s.grad.to_dense(), exact=True)


def test_mixed_dense_sparse_ops_and_tp_sparse_functions():
    d, p = _sparse_pair((5, 5), seed=3)
    e = torch.eye(5)
    assert_close(tp.eye(5) + p.to_sparse(), e + d.to_sparse(), exact=True)
    assert_close((p.to_sparse() * 2).to_dense(), (d.to_sparse() * 2).to_dense(), exact=True)
    assert_close(tp.sparse.sum(p.to_sparse()), torch.sparse.sum(d.to_sparse()), rtol=1e-6, atol=1e-6)
    assert_close(tp.sparse.sum(p.to_sparse(), dim=1).to_dense(), torch.sparse.sum(d.to_sparse(), dim=1).to_dense(),
                 rtol=1e-6, atol=1e-6)
    for fn in ("softmax", "log_softmax"):
        want = getattr(torch.sparse, fn)(d.to_sparse(), 1).to_dense()
        got = getattr(tp.sparse, fn)(p.to_sparse(), 1)
        assert_close(got, want, rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="tp.sparse.sum: expected a sparse COO tensor"):
        tp.sparse.sum(p)


def test_compiled_calls_with_sparse_arguments_run_eagerly_or_raise_under_strict():
    d, p = _sparse_pair((5, 5), seed=4)
    a = p.to_sparse()
    w = tp.randn(5, 5)
    fns = [lambda a, w: a * 2, lambda a, w: w + a, lambda a, w: tp.spmm(a, w).relu(), lambda a, w: a.to_dense().exp()]
    for f in fns:
        cf = tp.compile(f)
        with pytest.warns(UserWarning, match="sparse tensor arguments"):
            cf(a, w)
        r, e = cf(a, w), f(a, w)
        assert r.layout == e.layout
        assert_close(r.to_dense(), e.to_dense(), exact=True)
        assert cf.counters["sparse_eager_calls"] == 2 and cf.counters["captures"] == 0
        with pytest.raises(tp.compiler.BackendCompilerError, match="sparse tensor arguments"):
            tp.compile(f, strict_native=True)(a, w)
    # a sparse value made inside a compiled program: its ops run as ATen calls, results stay eager's
    # (its meta keeps the sparse layout, so no Stax kernel reads it as strided memory)
    x = tp.randn(4, 4)
    for f, tol in ((lambda x: tp.spmm((x * (x > 0)).to_sparse(), x).exp(), 1e-6),
                   (lambda x: (x.to_sparse() * 2).to_dense().exp(), 1e-5)):    # (Stax's exp after the fallbacks)
        cf = tp.compile(f)
        cf(x)
        assert_close(cf(x), f(x), rtol=tol, atol=tol)
