"""Core dispatch checks for the first ops (add, mul, div, exp, sum, mean, views, indexing)."""
import pytest
import torch

import tensorplay as tp
from harness import check_op, layouts


@pytest.mark.parametrize("x", layouts((3, 4)))
def test_add_mul_layouts(x):
    y = torch.randn(4)
    check_op(lambda a, b: a + b * 2, lambda a, b: a + b * 2, x, y)
    check_op(lambda a, b: tp.add(a, b, alpha=3), lambda a, b: torch.add(a, b, alpha=3), x, y)
    check_op(lambda a: 2 - a, lambda a: 2 - a, x)
    check_op(lambda a, b: a / b, lambda a, b: a / b, x, y)
    check_op(lambda a: (a * 0.5).exp().sum(), lambda a: (a * 0.5).exp().sum(), x, exact=False)


def test_size_zero_and_int():
    check_op(lambda a: (a + 1).sum(0), lambda a: (a + 1).sum(0), torch.randn(0, 3))
    check_op(lambda a, b: a * b, lambda a, b: a * b, torch.randint(-5, 5, (3, 2)), torch.randint(-5, 5, (2,)))
    check_op(lambda a: a.mean((0, 1), keepdim=True), lambda a: a.mean((0, 1), keepdim=True), torch.randn(2, 3, 4),
             exact=False)


def test_views_and_indexing():
    x = torch.randn(4, 5)
    check_op(lambda a: a[1:, ::2], lambda a: a[1:, ::2], x)
    check_op(lambda a: a.t()[0], lambda a: a.t()[0], x)
    check_op(lambda a: a.view(20).reshape(5, 4).permute(1, 0), lambda a: a.view(20).reshape(5, 4).permute(1, 0), x)
    check_op(lambda a: a.unsqueeze(1).expand(4, 3, 5), lambda a: a.unsqueeze(1).expand(4, 3, 5), x)


def test_bad_input_messages():
    a, b = tp.randn(3, 4), tp.randn(5)
    with pytest.raises(RuntimeError, match=r"tp\.add\(self: float32\[3, 4\], other: float32\[5\]\)"):
        a + b
    with pytest.raises(TypeError, match="tp.mul"):
        tp.mul(a, "x")
