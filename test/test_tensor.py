"""tp.Tensor: metadata, conversions, zero-copy interop, version counter, factories, repr."""
import numpy as np
import pytest
import torch

import tensorplay as tp
from tensorplay.testing import assert_close

DTYPES = [tp.float16, tp.bfloat16, tp.float32, tp.float64, tp.int8, tp.int16, tp.int32, tp.int64, tp.uint8, tp.bool]


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_and_metadata(dtype):
    t = tp.ones(2, 3, dtype=dtype)
    assert t.dtype == dtype and t.shape == (2, 3) and t.ndim == 2 and t.dim() == 2 and t.numel() == 6
    assert t.stride() == (3, 1) and t.storage_offset() == 0 and t.is_contiguous()
    assert t.device == tp.device("cpu")
    assert t.size(1) == 3 and t.size() == (2, 3) and len(t) == 2
    tt = t.t()
    assert tt.stride() == (1, 3) and not tt.is_contiguous()
    assert tt.contiguous().is_contiguous()


def test_item_tolist_numpy_and_errors():
    t = tp.tensor([[1.5, 2.0], [3.0, -4.0]])
    assert t.tolist() == [[1.5, 2.0], [3.0, -4.0]]
    assert t[1, 1].item() == -4.0
    with pytest.raises(RuntimeError, match="4 elements"):
        t.item()
    a = t.numpy()
    a[0, 0] = 7.0  # shares memory
    assert t[0, 0].item() == 7.0
    with pytest.raises(RuntimeError, match="requires grad"):
        tp.randn(2, requires_grad=True).numpy()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(t)
    assert float(tp.tensor(2.5)) == 2.5 and int(tp.tensor(3)) == 3


def test_zero_copy_interop_and_version_counter():
    base = torch.arange(6.0)
    t = tp.from_torch(base)
    assert t.torch() is base or t.torch().data_ptr() == base.data_ptr()
    v0 = t._version
    base.add_(1)
    assert t._version == v0 + 1
    n = np.arange(4, dtype=np.float32)
    tn = tp.from_numpy(n)
    n[0] = 10
    assert tn[0].item() == 10
    # DLPack both ways
    d = tp.from_dlpack(torch.arange(3))
    assert d.tolist() == [0, 1, 2]
    back = torch.from_dlpack(d)
    back[0] = 5
    assert d[0].item() == 5
    npd = np.from_dlpack(tp.arange(3, dtype=tp.float32))
    assert npd.tolist() == [0.0, 1.0, 2.0]
    # views share the version counter; in-place ops bump it
    x = tp.zeros(4)
    v = x[1:3]
    before = x._version
    v.add_(1)
    assert x._version == before + 1 and v._version == x._version
    assert x.tolist() == [0.0, 1.0, 1.0, 0.0]


def test_to_and_conversions():
    x = tp.randn(3)
    assert x.to(tp.float32) is x
    y = x.to(tp.float64)
    assert y.dtype == tp.float64 and y is not x
    assert x.double().dtype == tp.float64 and x.half().dtype == tp.float16 and x.int().dtype == tp.int32
    assert x.long().dtype == tp.int64 and x.bool().dtype == tp.bool and x.bfloat16().dtype == tp.bfloat16
    assert x.to("cpu") is x and x.to(x) is x
    assert x.to("cpu", copy=True) is not x
    z = x.clone()
    assert z._data.data_ptr() != x._data.data_ptr()
    assert_close(z, x)
    # gradient flows through dtype casts
    w = tp.randn(3, requires_grad=True)
    w.double().sum().backward()
    assert w.grad.dtype == tp.float32 and w.grad.tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(TypeError, match="Tensor.to"):
        x.to(3.5)


def test_repr():
    x = tp.tensor([1.0, 2.0])
    assert repr(x) == "tensor([1., 2.])"
    y = tp.tensor([1.0, 2.0], requires_grad=True)
    assert repr(y).endswith("requires_grad=True)")
    assert "grad_fn=<MulBackward>" in repr(y * 2)


def test_factories_match_torch():
    tp.manual_seed(3)
    a = tp.randn(2, 3)
    torch.manual_seed(3)
    b = torch.randn(2, 3)
    assert_close(a, b, exact=True)
    assert tp.zeros(2, 3).tolist() == [[0.0] * 3] * 2 and tp.ones((2,)).tolist() == [1.0, 1.0]
    assert tp.full((2, 2), 7).tolist() == [[7, 7], [7, 7]] and tp.full((2,), 7).dtype == tp.int64
    assert tp.arange(5).tolist() == [0, 1, 2, 3, 4] and tp.arange(1, 2, 0.5).tolist() == [1.0, 1.5]
    assert_close(tp.linspace(0, 1, 5), torch.linspace(0, 1, 5), exact=True)
    assert tp.eye(2, 3).tolist() == [[1, 0, 0], [0, 1, 0]]
    assert tp.empty(0, 3).shape == (0, 3)
    r = tp.randint(0, 5, (1000,))
    assert r.dtype == tp.int64 and 0 <= r.min().item() and r.max().item() < 5 if hasattr(r, "min") else True
    p = tp.randperm(10)
    assert sorted(p.tolist()) == list(range(10))
    u = tp.rand(10000)
    assert abs(u.mean().item() - 0.5) < 0.02
    x = tp.randn(2, 3, dtype=tp.float64)
    for f in (tp.zeros_like, tp.ones_like, tp.empty_like, tp.rand_like, tp.randn_like):
        y = f(x)
        assert y.shape == x.shape and y.dtype == tp.float64
    assert tp.full_like(x, 2.0).tolist() == [[2.0] * 3] * 2
    assert tp.tensor([[1, 2], [3, 4]]).dtype == tp.int64
    assert tp.tensor(np.ones(3, dtype=np.float32)).dtype == tp.float32
    assert tp.as_tensor(x) is x
    t = tp.randn(3, requires_grad=True)
    assert t.requires_grad and t.is_leaf


def test_factory_errors():
    with pytest.raises(RuntimeError, match="tp.zeros: negative dimension"):
        tp.zeros(2, -1)
    with pytest.raises(TypeError, match="tp.ones: sizes must be integers"):
        tp.ones(2.5)
    with pytest.raises(RuntimeError, match="tp.arange: step must be nonzero"):
        tp.arange(0, 1, 0)
    with pytest.raises(RuntimeError, match="tp.randint"):
        tp.randint(5, 5, (2,))


def test_empty_strided():
    t = tp.empty_strided((2, 3), (1, 2), dtype=tp.float64)
    ref = torch.empty_strided((2, 3), (1, 2), dtype=torch.float64)
    assert t.shape == ref.shape and t.stride() == ref.stride() and t.dtype == ref.dtype and not t.is_contiguous()
    assert tp.empty_strided([4], [1], requires_grad=True).requires_grad
    assert tp.empty_strided((0, 3), (3, 1)).numel() == 0
    with pytest.raises(RuntimeError, match="tp.empty_strided: size \\[2, 3\\] and stride \\[1\\]"):
        tp.empty_strided((2, 3), (1,))
    with pytest.raises(RuntimeError, match="tp.empty_strided: sizes and strides must be non-negative"):
        tp.empty_strided((2, -1), (1, 1))


def test_deepcopy_and_pickle():
    import copy
    import pickle
    x = tp.randn(3, requires_grad=True)
    y = copy.deepcopy(x)
    assert y.requires_grad and y._data.data_ptr() != x._data.data_ptr()
    assert_close(y, x)
    z = pickle.loads(pickle.dumps(x))
    assert z.requires_grad
    assert_close(z, x)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_device_roundtrip():
    x = tp.randn(4, 4, requires_grad=True)
    y = x.cuda()
    assert y.device.type == "cuda" and y.is_cuda
    (y * y).sum().backward()
    assert x.grad.device.type == "cpu"
    assert_close(x.grad, 2 * x.detach())


def test_torch_tensor_arguments_of_tp_ops():
    """A torch tensor handed to a tp op (torchvision's transforms make them) is taken as
    tp.from_torch takes it: views of it work (flatten, view, transpose), an in-place op writes it
    and returns a tp.Tensor over the same memory, and a compiled function may read one."""
    x = torch.randn(1, 4, 3)
    f = tp.flatten(x)
    assert isinstance(f, tp.Tensor) and torch.equal(f._data, torch.flatten(x))
    v = tp.ops.OPS["transpose"].fn(x, 1, 2)
    assert torch.equal(v._data, x.transpose(1, 2)) and v._data.data_ptr() == x.data_ptr()
    y = x.clone()
    r = tp.ops.OPS["mul_"].fn(y, 2.0)
    assert isinstance(r, tp.Tensor) and r._data is y and torch.equal(y, x * 2)
    w = tp.randn(3, 2)
    assert torch.allclose(tp.matmul(tp.flatten(x, 0, 1), w)._data, x.reshape(4, 3) @ w._data)

    def g(a):
        return tp.flatten(a) * 2 + tp.flatten(x)[:6]     # x: a torch tensor from the closure
    cg = tp.compile(g)
    a = tp.randn(2, 3)
    for _ in range(2):
        assert torch.allclose(cg(a)._data, a._data.flatten() * 2 + x.flatten()[:6])
