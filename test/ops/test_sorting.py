"""Sorting, selection and sampling against PyTorch.

Deterministic ops (sort, argsort, topk, kthvalue, unique, unique_consecutive) are checked with the
harness (forward bit-identical, meta, gradients, gradcheck); random ops statistically with a fixed
seed (means within 4 sigma), for reproducibility under ``tp.manual_seed``, for identity with
PyTorch's draws under the same seed, and for clear errors on invalid distributions.
"""
import math

import pytest
import torch

import tensorplay as tp
from harness import check_op, layouts

NAN, INF = float("nan"), float("inf")


# ---------------------------------------------------------------------------------------------
# sort / argsort
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((4, 5)))
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_sort_argsort(x, dim):
    for desc in (False, True):
        out = check_op(lambda a: a.sort(dim, desc), lambda a: a.sort(dim, desc), x)
        assert type(out).__name__ == "sort" and out.values is out[0]
        check_op(lambda a: tp.sort(a, dim=dim, descending=desc, stable=True),
                 lambda a: torch.sort(a, dim=dim, descending=desc, stable=True), x)
        check_op(lambda a: tp.argsort(a, dim, desc), lambda a: torch.argsort(a, dim, desc), x)
    check_op(lambda a: a.sort().values, lambda a: a.sort().values, x)


def test_sort_ties_stable_nan_and_dtypes():
    ties = torch.tensor([[2.0, 1.0, 2.0, 1.0, 2.0], [0.0, -0.0, 0.0, NAN, -INF]])
    for desc in (False, True):
        check_op(lambda a: a.sort(1, desc, stable=True), lambda a: a.sort(dim=1, descending=desc, stable=True), ties,
                 gradcheck=False)
        check_op(lambda a: a.argsort(1, desc, stable=True), lambda a: a.argsort(dim=1, descending=desc, stable=True),
                 ties, grad=False)
    for x in (torch.randint(-5, 5, (3, 6)), torch.rand(3, 6) > 0.5, torch.randint(0, 100, (7,), dtype=torch.uint8)):
        check_op(lambda a: a.sort(-1, stable=True), lambda a: a.sort(dim=-1, stable=True), x)
        check_op(lambda a: a.argsort(stable=True), lambda a: torch.argsort(a, stable=True), x)


def test_sort_edge_shapes():
    for x in (torch.tensor(1.5), torch.randn(0, 3), torch.randn(3, 1), torch.randn(1)):
        check_op(lambda a: a.sort(0), lambda a: a.sort(0), x)
        check_op(lambda a: a.argsort(0), lambda a: a.argsort(0), x)
    with pytest.raises(IndexError, match=r"tp\.sort\("):
        tp.randn(3, 4).sort(2)
    with pytest.raises(IndexError, match=r"tp\.argsort\("):
        tp.randn(3, 4).argsort(-3)


def test_sort_grad_and_double_backward():
    x = tp.from_torch(torch.randn(3, 4, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: a.sort(1).values, (x,))
    assert tp.autograd.gradgradcheck(lambda a: a.topk(2, 0).values, (x,))
    assert not x.argsort().requires_grad and not x.sort().indices.requires_grad


# ---------------------------------------------------------------------------------------------
# topk / kthvalue
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", layouts((4, 6)))
def test_topk(x):
    for k, dim in ((1, -1), (3, 1), (6, 1), (2, 0), (4, 0), (0, 1)):
        for largest in (True, False):
            out = check_op(lambda a: a.topk(k, dim, largest), lambda a: a.topk(k, dim, largest), x)
            assert type(out).__name__ == "topk"
    check_op(lambda a: tp.topk(a, 3, sorted=True, largest=False), lambda a: torch.topk(a, 3, sorted=True, largest=False), x)
    # sorted=False: same set of values (order unspecified), compare after sorting
    v, i = tp.topk(tp.from_torch(x), 3, sorted=False)
    rv, _ = torch.topk(x, 3, sorted=False)
    assert torch.equal(v.torch().sort(-1).values, rv.sort(-1).values)


def test_topk_edges_and_errors():
    check_op(lambda a: a.topk(2), lambda a: a.topk(2), torch.randint(-9, 9, (3, 5)))
    check_op(lambda a: a.topk(1, 0), lambda a: a.topk(1, 0), torch.tensor(2.0))
    check_op(lambda a: a.topk(0, 0), lambda a: a.topk(0, 0), torch.randn(0, 3))
    check_op(lambda a: a.topk(2, 1), lambda a: a.topk(2, 1), torch.tensor([[1.0, NAN, 3.0], [2.0, 2.0, 2.0]]),
             gradcheck=False)
    with pytest.raises(RuntimeError, match=r"tp\.topk\("):
        tp.randn(3).topk(4)
    with pytest.raises(IndexError, match=r"tp\.topk\("):
        tp.randn(3).topk(1, 1)


@pytest.mark.parametrize("x", layouts((5, 4)))
def test_kthvalue(x):
    for k, dim in ((1, 0), (3, 0), (5, 0), (2, -1), (4, 1)):
        for keepdim in (False, True):
            out = check_op(lambda a: a.kthvalue(k, dim, keepdim), lambda a: a.kthvalue(k, dim, keepdim), x)
            assert type(out).__name__ == "kthvalue"
    check_op(lambda a: tp.kthvalue(a, 2), lambda a: torch.kthvalue(a, 2), x)


def test_kthvalue_edges_and_errors():
    check_op(lambda a: a.kthvalue(1, 0), lambda a: a.kthvalue(1, 0), torch.tensor(3.0))
    check_op(lambda a: a.kthvalue(2), lambda a: a.kthvalue(2), torch.randint(-5, 5, (3, 4)))
    with pytest.raises(RuntimeError, match=r"tp\.kthvalue\("):
        tp.randn(3, 4).kthvalue(5)
    with pytest.raises(IndexError, match=r"tp\.kthvalue\("):
        tp.randn(3, 4).kthvalue(1, 2)


# ---------------------------------------------------------------------------------------------
# unique / unique_consecutive
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("x", [torch.tensor([3, 1, 2, 1, 3, 3, 0]), torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.5, 2.0]]),
                               torch.rand(10) > 0.5, torch.randint(0, 4, (3, 5))[:, ::2], torch.empty(0)])
def test_unique(x):
    for inv in (False, True):
        for cnt in (False, True):
            out = check_op(lambda a: tp.unique(a, return_inverse=inv, return_counts=cnt),
                           lambda a: torch.unique(a, return_inverse=inv, return_counts=cnt), x, grad=False)
            assert isinstance(out, tp.Tensor) if not (inv or cnt) else (type(out) is tuple and len(out) == 1 + inv + cnt)
            check_op(lambda a: a.unique_consecutive(return_inverse=inv, return_counts=cnt),
                     lambda a: a.unique_consecutive(return_inverse=inv, return_counts=cnt), x, grad=False)
            if x.dim() >= 1 and x.numel():
                for d in range(x.dim()):
                    check_op(lambda a: a.unique(dim=d, return_inverse=inv, return_counts=cnt),
                             lambda a: a.unique(dim=d, return_inverse=inv, return_counts=cnt), x, grad=False)


def test_unique_no_grad_and_tags():
    x = tp.tensor([1.0, 2.0, 1.0], requires_grad=True)
    u, inv = x.unique(return_inverse=True)
    assert not u.requires_grad
    assert torch.equal(u.torch()[inv.torch()], x.torch().detach())
    assert {"dynamic_shape", "nondifferentiable"} <= tp.ops.OPS["unique"].tags
    with pytest.raises(IndexError, match=r"tp\.unique\("):
        tp.tensor([1, 2]).unique(dim=1)


# ---------------------------------------------------------------------------------------------
# multinomial
# ---------------------------------------------------------------------------------------------
def test_multinomial_statistics_with_replacement():
    tp.manual_seed(0)
    p = tp.tensor([0.1, 0.2, 0.3, 0.4])
    n = 20000
    s = tp.multinomial(p, n, replacement=True)
    assert s.dtype == tp.int64 and tuple(s.shape) == (n,)
    counts = torch.bincount(s.torch(), minlength=4).double()
    for c, q in zip(counts.tolist(), [0.1, 0.2, 0.3, 0.4]):
        assert abs(c - n * q) < 4 * math.sqrt(n * q * (1 - q))
    # unnormalised weights, 2-D input
    w = tp.tensor([[0.0, 2.0, 2.0], [5.0, 0.0, 0.0]])
    s2 = w.multinomial(1000, True)
    assert tuple(s2.shape) == (2, 1000)
    assert not (s2.torch()[0] == 0).any() and (s2.torch()[1] == 0).all()


def test_multinomial_without_replacement_distinct():
    tp.manual_seed(1)
    p = tp.rand(6, 10) + 0.01
    for k in (1, 5, 10):
        s = tp.multinomial(p, k).torch()
        assert tuple(s.shape) == (6, k)
        for row in s:
            assert len(set(row.tolist())) == k
    # zero-probability categories are never drawn
    q = tp.tensor([0.5, 0.0, 0.25, 0.0, 0.25])
    for _ in range(20):
        assert set(tp.multinomial(q, 3).tolist()) == {0, 2, 4}


def test_multinomial_reproducible_and_same_as_torch():
    p = torch.rand(3, 7)
    tp.manual_seed(123)
    a = tp.multinomial(tp.from_torch(p), 4)
    tp.manual_seed(123)
    b = tp.multinomial(tp.from_torch(p), 4)
    torch.manual_seed(123)
    c = torch.multinomial(p, 4)
    assert torch.equal(a.torch(), b.torch()) and torch.equal(a.torch(), c)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert torch.equal(tp.multinomial(tp.from_torch(p), 9, True, generator=g1).torch(),
                       torch.multinomial(p, 9, True, generator=g2))


@pytest.mark.parametrize("probs, n, repl, msg", [
    ([0.5, -0.1, 0.6], 1, True, "negative"),
    ([0.5, NAN, 0.5], 1, True, "NaN"),
    ([0.5, INF, 0.5], 1, True, "infinite"),
    ([[0.2, 0.8], [0.0, 0.0]], 1, True, "row 1"),
    ([0.5, 0.0, 0.5], 3, False, "non-zero probability"),
    ([0.5, 0.5], 3, False, "without replacement"),
    ([[[0.5]]], 1, True, "1-D or 2-D"),
    ([0.5, 0.5], 0, True, "positive"),
])
def test_multinomial_errors(probs, n, repl, msg):
    with pytest.raises((RuntimeError, ValueError), match=r"tp\.multinomial\(") as ei:
        tp.multinomial(tp.tensor(probs), n, repl)
    assert msg in str(ei.value)
    with pytest.raises(TypeError, match=r"tp\.multinomial\("):
        tp.multinomial(tp.tensor([1, 2]), 1)


def test_multinomial_meta_and_no_grad():
    from tensorplay.testing import record_ops
    from harness import check_meta
    p = tp.rand(4, 6, requires_grad=True)
    with record_ops() as calls:
        s = tp.multinomial(p, 3)
    check_meta(calls)
    assert not s.requires_grad


# ---------------------------------------------------------------------------------------------
# bernoulli
# ---------------------------------------------------------------------------------------------
def test_bernoulli_statistics_and_values():
    tp.manual_seed(0)
    n = 40000
    for q in (0.1, 0.5, 0.9):
        s = tp.bernoulli(tp.full((n,), q))
        assert s.dtype == tp.float32 and set(s.torch().unique().tolist()) <= {0.0, 1.0}
        assert abs(s.torch().mean().item() - q) < 4 * math.sqrt(q * (1 - q) / n)
        s2 = tp.bernoulli(tp.zeros(n, dtype=tp.float64), q)      # float p, shape of self
        assert s2.dtype == tp.float64
        assert abs(s2.torch().mean().item() - q) < 4 * math.sqrt(q * (1 - q) / n)
    # probabilities 0 and 1 are deterministic; non-contiguous input
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]).t()
    assert torch.equal(tp.bernoulli(tp.from_torch(p)).torch(), p)


def test_bernoulli_reproducible_same_as_torch_and_meta():
    p = torch.rand(5, 6)
    tp.manual_seed(7)
    a = tp.bernoulli(tp.from_torch(p))
    tp.manual_seed(7)
    b = tp.bernoulli(tp.from_torch(p))
    torch.manual_seed(7)
    c = torch.bernoulli(p)
    assert torch.equal(a.torch(), b.torch()) and torch.equal(a.torch(), c)
    tp.manual_seed(7)
    torch_seeded = (torch.manual_seed(7), torch.bernoulli(p.t(), 0.3))[1]
    tp.manual_seed(7)
    assert torch.equal(tp.bernoulli(tp.from_torch(p.t()), 0.3).torch(), torch_seeded)
    from tensorplay.testing import record_ops
    from harness import check_meta
    with record_ops() as calls:
        tp.bernoulli(tp.from_torch(p.t()))
        tp.bernoulli(tp.from_torch(p), p=0.5)
    check_meta(calls)


def test_bernoulli_no_grad_and_errors():
    p = tp.rand(3, requires_grad=True)
    assert not tp.bernoulli(p).requires_grad
    for bad in ([0.5, 1.5], [-0.1, 0.5], [0.5, NAN]):
        with pytest.raises(RuntimeError, match=r"tp\.bernoulli\(.*\[0, 1\]"):
            tp.bernoulli(tp.tensor(bad))
    with pytest.raises(RuntimeError, match=r"tp\.bernoulli\("):
        tp.bernoulli(tp.rand(3), 1.5)
    assert tuple(tp.bernoulli(tp.rand(0, 2)).shape) == (0, 2)


# ---------------------------------------------------------------------------------------------
# in-place random fills
# ---------------------------------------------------------------------------------------------
def test_inplace_fills_statistics():
    tp.manual_seed(0)
    n = 40000
    x = tp.empty(n)
    assert x.uniform_(-2, 3) is x
    u = x.torch()
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean().item() - 0.5) < 4 * 5 / math.sqrt(12 * n)
    x.normal_(1.5, 2.0)
    assert abs(x.torch().mean().item() - 1.5) < 4 * 2.0 / math.sqrt(n)
    assert abs(x.torch().std().item() - 2.0) < 0.05
    x.bernoulli_(0.25)
    assert abs(x.torch().mean().item() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / n)
    x.bernoulli_(tp.full((n,), 0.75))
    assert abs(x.torch().mean().item() - 0.75) < 4 * math.sqrt(0.25 * 0.75 / n)
    x.exponential_(2.0)
    assert x.torch().min() >= 0 and abs(x.torch().mean().item() - 0.5) < 4 * 0.5 / math.sqrt(n)
    y = tp.empty(n, dtype=tp.int64)
    y.random_(3, 7)
    assert set(y.torch().unique().tolist()) == {3, 4, 5, 6}
    y.random_(4)
    assert set(y.torch().unique().tolist()) == {0, 1, 2, 3}
    y.random_()
    assert (y.torch() >= 0).all()


def test_inplace_fills_match_torch_and_bump_version():
    for name, args in (("uniform_", (-1, 1)), ("normal_", (0.5, 3)), ("bernoulli_", (0.3,)),
                       ("exponential_", (1.5,))):
        x = tp.empty(4, 5).t()            # non-contiguous target
        v0 = x._version
        tp.manual_seed(11)
        getattr(x, name)(*args)
        ref = torch.empty(4, 5).t()
        torch.manual_seed(11)
        getattr(ref, name)(*args)
        assert torch.equal(x.torch(), ref), name
        assert x._version > v0
        g1 = torch.Generator().manual_seed(3)
        g2 = torch.Generator().manual_seed(3)
        assert torch.equal(getattr(tp.empty(6), name)(*args, generator=g1).torch(),
                           getattr(torch.empty(6), name)(*args, generator=g2))


def test_inplace_fills_on_leaf_requiring_grad():
    w = tp.empty(3, 4, requires_grad=True)
    with tp.no_grad():
        w.uniform_(-0.1, 0.1)
        w.normal_(0, 0.02)
        w.bernoulli_(0.5)
        w[0].normal_()                       # on a view of the leaf
    assert w.requires_grad and w.grad_fn is None
    (w * 2).sum().backward()
    assert torch.equal(w.grad.torch(), torch.full((3, 4), 2.0))
    for f in (lambda: w.uniform_(), lambda: w.normal_(), lambda: w.bernoulli_(0.5)):
        with pytest.raises(RuntimeError, match=r"tp\.(uniform_|normal_|bernoulli_)"):
            f()
    with pytest.raises(RuntimeError, match=r"tp\.normal_\("):
        tp.empty(3).normal_(0, -1)
    with pytest.raises(RuntimeError, match=r"tp\.uniform_\("):
        tp.empty(3).uniform_(1, 0)
    with pytest.raises(RuntimeError, match=r"tp\.bernoulli_\("):
        tp.empty(3).bernoulli_(1.5)


def test_nn_init_uses_fills():
    import tensorplay.nn.init  # noqa: F401
    tp.manual_seed(0)
    w = tp.empty(64, 32, requires_grad=True)
    tp.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    torch.manual_seed(0)
    ref = torch.empty(64, 32)
    torch.nn.init.kaiming_uniform_(ref, a=math.sqrt(5))
    assert torch.equal(w.torch().detach(), ref)


def test_sorting_tags():
    O = tp.ops.OPS
    for name in ("sort", "argsort", "topk", "kthvalue", "unique", "unique_consecutive"):
        assert "sort" in O[name].tags, name
    for name in ("multinomial", "bernoulli"):
        assert "random" in O[name].tags and O[name].backward is None
    for name in ("bernoulli_", "uniform_", "normal_", "exponential_", "random_"):
        assert {"random", "inplace"} <= O[name].tags and O[name].backward is None
