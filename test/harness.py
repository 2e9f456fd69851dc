"""Shared op-test harness: one call checks an op against PyTorch in every way the issue asks.

``check_op(tp_fn, torch_fn, *inputs)``:
  1. forward: tp result vs torch result on the same inputs (bit-identical by default, since our
     eager kernel *is* the ATen kernel; ``exact=False`` for composite ops: dtype tolerance);
  2. meta: for every op the call dispatched, the table's meta function reproduces the real output's
     shape, dtype and strides (strides compared on dims of size > 1);
  3. gradients (``grad=True``): tp autograd vs torch.autograd with the same random upstream
     gradient, for every floating input;
  4. ``gradcheck=True``: tp.autograd.gradcheck in float64 (finite differences), for small inputs.
Inputs are torch tensors or Python numbers; tp copies are made with ``from_torch(clone)``.
"""
from __future__ import annotations

import torch

import tensorplay as tp
from tensorplay.testing import assert_close, record_ops


def _same_layout_copy(x):
    """A copy with exactly the strides of ``x`` (``clone`` makes non-dense slices contiguous,
    which would test tp on a different layout than torch)."""
    if x.numel() > 1 and 0 not in x.stride() and not x.is_contiguous():
        try:
            t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            t.copy_(x)
            return t
        except RuntimeError:   # overlapping strides
            pass
    return x.clone()


def to_tp(x, requires_grad=False):
    if isinstance(x, torch.Tensor):
        t = tp.from_torch(_same_layout_copy(x.detach()))
        if requires_grad:
            t.requires_grad_()
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(to_tp(v, requires_grad) for v in x)
    return x


def _flat(out):
    if isinstance(out, (list, tuple)):
        r = []
        for o in out:
            r.extend(_flat(o))
        return r
    return [out]


def _tensors(xs):
    return [x for x in _flat(xs) if isinstance(x, torch.Tensor)]


def check_meta(calls):
    for op, args, outs in calls:
        if "dynamic_shape" in op.tags:
            continue
        metas = op.run_meta(*args)
        metas = _flat(metas)
        reals = [o for o in outs if isinstance(o, tp.Tensor)]
        metas = [m for m in metas if isinstance(m, torch.Tensor)]
        assert len(metas) == len(reals), f"meta of {op.name}: {len(metas)} outputs, real {len(reals)}"
        for m, r in zip(metas, reals):
            assert tuple(m.shape) == tuple(r.shape), f"meta of {op.name}: shape {list(m.shape)} vs {list(r.shape)}"
            assert m.dtype == r.dtype, f"meta of {op.name}: dtype {m.dtype} vs {r.dtype}"
            ms = [s for s, n in zip(m.stride(), m.shape) if n > 1]
            rs = [s for s, n in zip(r.stride(), r.shape) if n > 1]
            if r.numel() > 1 and "view" not in op.tags:
                assert ms == rs, f"meta of {op.name}: strides {m.stride()} vs {r.stride()} (shape {list(r.shape)})"


def check_op(tp_fn, torch_fn, *inputs, grad=True, exact=True, gradcheck=None, rtol=None, atol=None,
             grad_rtol=None, grad_atol=None, meta=True, seed=0):
    # 1. forward + 2. meta
    tp_in = [to_tp(x) for x in inputs]
    with record_ops() as calls:
        out = tp_fn(*tp_in)
    ref = torch_fn(*inputs)
    assert_close(out, ref, exact=exact, rtol=rtol, atol=atol, msg="forward")
    if meta:
        check_meta(calls)
    # 3. gradients vs torch.autograd
    diff = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.is_floating_point()]
    if not grad or not diff:
        return out
    t_in = [x.detach().clone().requires_grad_() if i in diff else x for i, x in enumerate(inputs)]
    p_in = [to_tp(x, requires_grad=(i in diff)) for i, x in enumerate(inputs)]
    r = _tensors(torch_fn(*t_in))
    o = [x for x in _flat(tp_fn(*p_in)) if isinstance(x, tp.Tensor)]
    gen = torch.Generator().manual_seed(seed)
    pairs = [(a, b) for a, b in zip(o, r) if b.requires_grad]
    if pairs:
        gs = [torch.randn(b.shape, dtype=b.dtype, generator=gen) for _, b in pairs]
        torch.autograd.backward([b for _, b in pairs], gs)
        tp.autograd.backward([a for a, _ in pairs], [tp.from_torch(g.clone()) for g in gs])
        for i in diff:
            ref_g = t_in[i].grad
            got = p_in[i].grad
            if ref_g is None:
                assert got is None or bool((got._data == 0).all()), f"grad of input {i}: torch has none"
                continue
            assert got is not None, f"grad of input {i} missing"
            assert_close(got, ref_g, rtol=grad_rtol, atol=grad_atol, msg=f"grad of input {i}")
    # 4. gradcheck in float64 on small inputs
    if gradcheck is None:
        gradcheck = all(inputs[i].numel() <= 30 for i in diff)
    if gradcheck:
        g_in = [to_tp(x.double(), requires_grad=True) if i in diff else x for i, x in enumerate(inputs)]
        assert tp.autograd.gradcheck(tp_fn, tuple(g_in))
    return out


def layouts(shape, dtype=torch.float32, seed=0, low=None, high=None):
    """The same logical tensor in three layouts: contiguous, transposed storage, strided slice."""
    g = torch.Generator().manual_seed(seed)

    def make(s):
        if dtype.is_floating_point:
            x = torch.randn(s, generator=g, dtype=torch.float64)
            if low is not None:
                x = low + (high - low) * torch.rand(s, generator=g, dtype=torch.float64)
            return x.to(dtype)
        if dtype == torch.bool:
            return torch.rand(s, generator=g) > 0.5
        lo, hi = (low if low is not None else -9), (high if high is not None else 10)
        return torch.randint(lo, hi, s, generator=g, dtype=dtype)
    base = make(shape)
    out = [base]
    if len(shape) >= 2:
        out.append(make(tuple(reversed(shape))).transpose(0, -1) if len(shape) == 2 else
                   make(shape[:-2] + (shape[-1], shape[-2])).transpose(-1, -2))
    big = make(tuple(s * 2 if i == len(shape) - 1 else s for i, s in enumerate(shape))) if shape else make(shape)
    out.append(big[..., ::2] if shape else big)
    return out
