"""Linear-algebra ops (mm, bmm, addmm, baddbmm, linear, einsum, outer, dot, matmul) against PyTorch:
forward bit-identical (one ATen kernel), gradients vs torch.autograd, gradcheck in float64,
double backward, layouts, size-0 dims and error messages naming the op and the shapes."""
import pytest
import torch

import tensorplay as tp
from harness import check_op, layouts, to_tp


def r(*s, dtype=torch.float32):
    return torch.randn(*s, dtype=dtype)


# ---- mm / bmm / addmm / baddbmm ------------------------------------------------------------------
@pytest.mark.parametrize("a", layouts((3, 4)))
def test_mm_layouts(a):
    b = r(4, 5)
    check_op(tp.mm, torch.mm, a, b)
    check_op(lambda x, y: x.mm(y), lambda x, y: x.mm(y), a, b.t().contiguous().t())
    check_op(tp.mm, torch.mm, a[:, :0].contiguous(), r(0, 5))  # size-0 contraction


@pytest.mark.parametrize("a", layouts((2, 3, 4)))
def test_bmm_layouts(a):
    b = r(2, 4, 2)
    check_op(tp.bmm, torch.bmm, a, b, gradcheck=True)


def test_addmm_baddbmm():
    s, m1, m2 = r(3, 5), r(3, 4), r(4, 5)
    check_op(tp.addmm, torch.addmm, s, m1, m2, gradcheck=True)
    check_op(lambda a, b, c: tp.addmm(a, b, c, beta=0.5, alpha=2.0),
             lambda a, b, c: torch.addmm(a, b, c, beta=0.5, alpha=2.0), s, m1, m2, gradcheck=True)
    check_op(tp.addmm, torch.addmm, r(5), m1, m2)  # broadcast self
    b, b1, b2 = r(2, 3, 2), r(2, 3, 4), r(2, 4, 2)
    check_op(lambda a, x, y: tp.baddbmm(a, x, y, beta=2, alpha=-1),
             lambda a, x, y: torch.baddbmm(a, x, y, beta=2, alpha=-1), b, b1, b2, gradcheck=True)
    check_op(tp.baddbmm, torch.baddbmm, r(1, 2), b1, b2)


def test_outer_dot_matmul():
    check_op(tp.outer, torch.outer, r(3), r(4), gradcheck=True)
    check_op(tp.dot, torch.dot, r(5), r(5), gradcheck=True)
    check_op(lambda a, b: a @ b, lambda a, b: a @ b, r(2, 1, 3, 4), r(5, 4, 2))
    check_op(lambda a, b: a @ b, lambda a, b: a @ b, r(4), r(3, 4, 2))


# ---- linear -------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(3,), (4, 3), (2, 4, 3), (0, 3)])
def test_linear(shape):
    x, w, b = r(*shape), r(5, 3), r(5)
    check_op(tp.linear, torch.nn.functional.linear, x, w, b)
    check_op(tp.linear, torch.nn.functional.linear, x, w)
    check_op(lambda x, w: tp.linear(x, w.t()), lambda x, w: torch.nn.functional.linear(x, w.t()), x,
             r(3, 5))  # transposed weight


def test_linear_gradcheck_and_double_backward():
    x, w, b = r(2, 3, dtype=torch.float64), r(4, 3, dtype=torch.float64), r(4, dtype=torch.float64)
    check_op(tp.linear, torch.nn.functional.linear, x, w, b, gradcheck=True)
    xs = [to_tp(t, True) for t in (x, w, b)]
    assert tp.autograd.gradgradcheck(lambda a, b_, c: tp.linear(a, b_, c) * tp.linear(a, b_, c), tuple(xs))
    check_op(tp.linear, torch.nn.functional.linear, r(3, dtype=torch.float64), r(3, dtype=torch.float64),
             gradcheck=True)  # 1-d weight


def test_mm_double_backward():
    a, b = to_tp(r(2, 3, dtype=torch.float64), True), to_tp(r(3, 2, dtype=torch.float64), True)
    assert tp.autograd.gradgradcheck(lambda x, y: tp.mm(x, y) * tp.mm(x, y), (a, b))


# ---- einsum -------------------------------------------------------------------------------------
EINSUM_CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(2, 2, 3), (2, 3, 2)]),
    ("ij->ji", [(2, 3)]),
    ("ij->", [(2, 3)]),
    ("ij->j", [(2, 3)]),
    ("i,j->ij", [(3,), (2,)]),
    ("i,i->", [(4,), (4,)]),
    ("bhqd,bhkd->bhqk", [(1, 2, 3, 2), (1, 2, 2, 2)]),
    ("...ij,...jk->...ik", [(2, 2, 3), (3, 2)]),
    ("...ij,jk", [(2, 1, 2, 3), (3, 2)]),
    ("ij,jk", [(2, 3), (3, 2)]),  # implicit output
    ("Ab,ab", [(2, 3), (4, 3)]),  # implicit, uppercase sorts first
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # broadcast size-1 dim
    ("abc,cd,de->ae", [(2, 2, 2), (2, 3), (3, 2)]),
    ("i ,j -> ij", [(2,), (3,)]),  # spaces
]


@pytest.mark.parametrize("eq,shapes", EINSUM_CASES)
def test_einsum(eq, shapes):
    ins = [r(*s) for s in shapes]
    check_op(lambda *a: tp.einsum(eq, *a), lambda *a: torch.einsum(eq, *a), *ins, gradcheck=False)
    check_op(lambda *a: tp.einsum(eq, list(a)), lambda *a: torch.einsum(eq, *a), *ins, grad=False)
    d = [t.double() for t in ins]
    assert tp.autograd.gradcheck(lambda *a: tp.einsum(eq, *a), tuple(to_tp(t, True) for t in d))


def test_einsum_double_backward_and_forward_ad():
    a, b = to_tp(r(2, 3, dtype=torch.float64), True), to_tp(r(3, 2, dtype=torch.float64), True)
    assert tp.autograd.gradgradcheck(lambda x, y: tp.einsum("ij,jk->ik", x, y) * tp.einsum("ij,jk->ik", x, y), (a, b))
    assert tp.autograd.gradcheck(lambda x, y: tp.einsum("ij,jk->ik", x, y), (a, b), check_forward_ad=True)


def test_einsum_mixed_requires_grad():
    a = to_tp(r(2, 3), True)
    b = to_tp(r(3, 4))
    tp.einsum("ij,jk->ik", a, b).sum().backward()
    torch.testing.assert_close(a.grad.torch(), b.torch().sum(1).expand(2, 3))
    assert b.grad is None


def test_einsum_errors():
    x = tp.randn(3, 3, requires_grad=True)
    # diagonal forward works, its backward raises clearly
    y = tp.einsum("ii->i", x)
    torch.testing.assert_close(y.torch(), torch.einsum("ii->i", x.torch()))
    with pytest.raises(NotImplementedError, match=r"tp\.einsum.*repeated subscript 'i'"):
        y.sum().backward()
    with pytest.raises(RuntimeError, match=r"tp\.einsum"):
        tp.einsum("ij,jk->ik", tp.randn(2, 3), tp.randn(4, 2))
    with pytest.raises(RuntimeError, match=r"tp\.einsum"):
        tp.einsum("ij,jk->ik", tp.randn(2, 3))


# ---- errors ---------------------------------------------------------------------------------------
def test_shape_errors_name_op_and_shapes():
    with pytest.raises(RuntimeError, match=r"tp\.mm\(self: float32\[2, 3\], mat2: float32\[4, 5\]\)"):
        tp.mm(tp.randn(2, 3), tp.randn(4, 5))
    with pytest.raises(RuntimeError, match=r"tp\.bmm\(self: float32\[2, 3, 4\]"):
        tp.bmm(tp.randn(2, 3, 4), tp.randn(3, 4, 5))
    with pytest.raises(RuntimeError, match=r"tp\.linear\(input: float32\[2, 3\], weight: float32\[4, 5\]"):
        tp.linear(tp.randn(2, 3), tp.randn(4, 5))
    with pytest.raises(RuntimeError, match=r"tp\.addmm"):
        tp.addmm(tp.randn(3, 3), tp.randn(3, 4), tp.randn(3, 4))
    with pytest.raises(RuntimeError, match=r"tp\.dot"):
        tp.dot(tp.randn(3), tp.randn(4))
    with pytest.raises(RuntimeError, match=r"tp\.mm"):
        tp.mm(tp.randn(2, 3), tp.randn(3, 2, dtype=tp.float64))


def test_integer_mm():
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    check_op(tp.mm, torch.mm, a, b)
    check_op(lambda x, y: tp.einsum("ij,jk->ik", x, y), lambda x, y: torch.einsum("ij,jk->ik", x, y), a, b)
