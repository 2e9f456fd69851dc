"""PyTorch's legacy constructors and keyword forms against torch: ``tp.Tensor(2, 3)``,
``tp.Tensor([1, 2])``, ``tp.Tensor()``, the typed ``FloatTensor``... classes (sizes, data,
``isinstance``), the ``size=`` keyword of factories and ``new_zeros``/``new_ones``/``new_full``/
``new_empty``/``new_tensor``."""
import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close


def _same_meta(a, b):
    assert tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and a.device == b.device


@pytest.mark.parametrize("args", [(2, 3), (4,), (0, 2), (torch.Size([3, 1]),), (np.int64(2), 2)])
def test_tensor_from_sizes(args):
    _same_meta(tp.Tensor(*args), torch.Tensor(*args))


@pytest.mark.parametrize("data", [[1, 2], [[1.5, 2], [3, 4]], (True, False), np.arange(6).reshape(2, 3), []])
def test_tensor_from_data(data):
    assert_close(tp.Tensor(data), torch.Tensor(data), exact=True)


def test_tensor_empty_default_dtype_and_wrapping():
    _same_meta(tp.Tensor(), torch.Tensor())
    torch.set_default_dtype(torch.float64)
    try:
        assert_close(tp.Tensor([1, 2]), torch.Tensor([1, 2]), exact=True)
        _same_meta(tp.Tensor(2), torch.Tensor(2))
    finally:
        torch.set_default_dtype(torch.float32)
    t = torch.arange(4)
    w = tp.Tensor(t)
    assert w._data is t                                       # a tensor is wrapped, not copied
    assert tp.Tensor(t, dtype=torch.float64).dtype == torch.float64
    assert tp.Tensor(3, dtype=torch.int64).shape == ()        # with a dtype keyword one int is data
    assert nn.Parameter(tp.Tensor(3, 4)).shape == (3, 4)
    with pytest.raises(TypeError, match="tp.Tensor"):
        tp.Tensor("abc")
    with pytest.raises(TypeError, match="tp.Tensor"):
        tp.Tensor([1], [2])
    with pytest.raises(RuntimeError, match="tp.Tensor"):
        tp.Tensor(2, -1)


TYPES = ["FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
         "CharTensor", "ByteTensor", "BoolTensor"]


@pytest.mark.parametrize("name", TYPES)
def test_typed_constructors(name):
    ours, theirs = getattr(tp, name), getattr(torch, name)
    _same_meta(ours(2, 3), theirs(2, 3))
    _same_meta(ours(), theirs())
    _same_meta(ours(torch.Size([4])), theirs(torch.Size([4])))
    data = [[1, 0, 3], [4, 5, 0]]
    assert_close(ours(data), theirs(data), exact=True)
    x = ours([1, 2])
    assert isinstance(x, ours) and not isinstance(x, tp.FloatTensor if name != "FloatTensor" else tp.LongTensor)
    assert not isinstance(torch.zeros(2), ours)                 # a torch tensor is not a tp one
    other = torch.zeros(2, dtype=torch.float64 if name != "DoubleTensor" else torch.float32)
    with pytest.raises(TypeError, match=f"tp.{name}"):
        ours(other)
    same = theirs([1, 1])
    assert ours(same)._data is same


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "rand", "randn"])
def test_size_keyword(name):
    torch.manual_seed(3)
    a = getattr(tp, name)(size=(2, 3), dtype=torch.float64)
    torch.manual_seed(3)
    b = getattr(torch, name)(size=(2, 3), dtype=torch.float64)
    _same_meta(a, b)
    if name != "empty":
        assert_close(a, b, exact=True)
    with pytest.raises(TypeError, match=f"tp.{name}"):
        getattr(tp, name)(2, size=(2,))


def test_full_randint_keywords():
    assert_close(tp.full(size=(2, 2), fill_value=1.5), torch.full(size=(2, 2), fill_value=1.5), exact=True)
    torch.manual_seed(0)
    a = tp.randint(0, 10, size=(5,))
    torch.manual_seed(0)
    assert_close(a, torch.randint(0, 10, size=(5,)), exact=True)


def test_new_methods():
    x = torch.randn(2, 3, dtype=torch.float64)
    p = tp.from_torch(x.clone())
    for ours, theirs in ((p.new_zeros(size=(4,)), x.new_zeros(size=(4,))), (p.new_zeros(2, 2), x.new_zeros(2, 2)),
                         (p.new_ones((3,), dtype=torch.int32), x.new_ones((3,), dtype=torch.int32)),
                         (p.new_ones(size=[1, 2]), x.new_ones(size=[1, 2])),
                         (p.new_full(size=(2,), fill_value=7), x.new_full(size=(2,), fill_value=7)),
                         (p.new_full((1, 2), -1.5), x.new_full((1, 2), -1.5)),
                         (p.new_tensor([1, 2]), x.new_tensor([1, 2])),
                         (p.new_tensor([1, 2], dtype=torch.int64), x.new_tensor([1, 2], dtype=torch.int64))):
        assert_close(ours, theirs, exact=True)
    _same_meta(p.new_empty(size=(2, 5)), x.new_empty(size=(2, 5)))
    _same_meta(p.new_empty(3), x.new_empty(3))
    assert p.new_zeros(2, requires_grad=True).requires_grad


def test_type_names_and_casts():
    for dtype in (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bool, torch.float16):
        x = torch.zeros(2, dtype=dtype)
        assert tp.from_torch(x).type() == x.type()
    x = torch.tensor([1.7, -2.2])
    p = tp.from_torch(x)
    for target in (torch.LongTensor, "torch.IntTensor", torch.float64):
        ours = p.type(getattr(tp, target.__name__) if isinstance(target, type) else target)
        assert_close(ours, x.type(target), exact=True)
    with pytest.raises(ValueError, match="tp.Tensor.type"):
        p.type("torch.NotATensor")
