"""tp.ragged_dot (jax.lax.ragged_dot) against a reference loop of torch.mm over the groups: forward
bit-identical (the kernel is that loop), meta, gradients vs torch.autograd on the loop, gradcheck and
gradgradcheck in float64 (finite differences), forward mode, dtypes, layouts, empty groups, a single
group, rows after the last group (zero), the seed's grouping of four rows, compiled (strict_native)
against eager, FLOPs, and the error messages."""
import pytest
import torch

import tensorplay as tp
from harness import check_op, to_tp
from tensorplay.compiler.cost import cost_analysis
from tensorplay.testing import assert_close

OPS = tp.ops.OPS


def reference(lhs, rhs, group_sizes):
    """The definition: group i (contiguous rows of lhs) times rhs[i]; rows after the groups zero."""
    m, n = lhs.shape[0], rhs.shape[2]
    pieces, start = [], 0
    for i, s in enumerate(group_sizes.tolist()):
        if s:
            pieces.append(torch.mm(lhs[start:start + s], rhs[i]))
        start += s
    pieces.append(torch.zeros(m - start, n, dtype=lhs.dtype))
    return torch.cat(pieces)


def rand(*shape, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return torch.randint(-9, 10, shape, generator=g, dtype=dtype)


def sizes(*s):
    return torch.tensor(s, dtype=torch.int64)


# (m, group sizes): empty groups at the start, middle and end, one group, rows after the last group,
# no rows at all in the groups, m = 0
PATTERNS = [(5, (2, 0, 3)), (4, (0, 0, 4)), (4, (4,)), (6, (0, 3, 0, 2, 1)), (5, (1, 2)), (3, (0, 0)),
            (0, (0, 0)), (7, (3, 4, 0))]


# ---- the seed's grouping --------------------------------------------------------------------------
def test_seed_grouping_of_four_rows_integer():
    """Rows a0..a3 with experts [1, 0, 1, 1]: grouped [a1 | a0, a2, a3], group sizes [1, 3]; the
    grouped outputs [o1, o0, o2, o3] restored to [o0, o1, o2, o3] by the saved positions."""
    a = to_tp(rand(4, 3, dtype=torch.int64, seed=1))
    w = to_tp(rand(2, 3, 5, dtype=torch.int64, seed=2))
    experts = tp.tensor([1, 0, 1, 1])
    order = tp.argsort(experts, stable=True)
    assert order.tolist() == [1, 0, 2, 3]
    grouped = a.index_select(0, order)
    assert torch.equal(grouped._data, a._data[[1, 0, 2, 3]])
    group_sizes = (experts.unsqueeze(1) == tp.arange(2)).sum(0)
    assert group_sizes.tolist() == [1, 3]
    o_grouped = tp.ragged_dot(grouped, w, group_sizes)
    o = [a._data[i] @ w._data[e] for i, e in enumerate([1, 0, 1, 1])]           # o_i = a_i W_{e_i}
    assert torch.equal(o_grouped._data, torch.stack([o[1], o[0], o[2], o[3]]))
    restored = tp.zeros(4, 5, dtype=torch.int64).index_add(0, order, o_grouped)
    assert torch.equal(restored._data, torch.stack(o))
    assert restored.dtype == torch.int64


# ---- against the reference loop -------------------------------------------------------------------
@pytest.mark.parametrize("m,gs", PATTERNS)
def test_against_reference_loop_float64(m, gs):
    k, n = 3, 4
    lhs, rhs = rand(m, k, seed=m), rand(len(gs), k, n, seed=7)
    check_op(tp.ragged_dot, reference, lhs, rhs, sizes(*gs), gradcheck=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32,
                                   torch.int64])
def test_dtypes(dtype):
    lhs, rhs = rand(6, 5, dtype=dtype, seed=3), rand(3, 5, 2, dtype=dtype, seed=4)
    gs = sizes(2, 0, 3)
    out = check_op(tp.ragged_dot, reference, lhs, rhs, gs, gradcheck=False, grad=dtype.is_floating_point)
    assert out.dtype == dtype and out.abs().sum().item() > 0
    assert not out._data[5:].any()                                            # the row after the groups
    check_op(tp.ragged_dot, reference, lhs, rhs, gs.to(torch.int32), grad=False)   # int32 sizes (JAX's)


def test_layouts():
    """Transposed and strided operands (the backward passes rhsᵀ, a view)."""
    gs = sizes(3, 1, 2)
    lhs_t = rand(4, 6, seed=5).t()
    rhs_t = rand(3, 2, 4, seed=6).transpose(1, 2)
    rhs_s = rand(3, 4, 4, seed=8)[:, :, ::2]
    check_op(tp.ragged_dot, reference, lhs_t, rhs_t, gs, gradcheck=True)
    check_op(tp.ragged_dot, reference, lhs_t.contiguous(), rhs_s, gs)


def test_rows_after_the_groups_are_zero_with_zero_gradient():
    lhs = tp.from_torch(rand(6, 3, seed=9)).requires_grad_()
    rhs = tp.from_torch(rand(2, 3, 4, seed=10)).requires_grad_()
    out = tp.ragged_dot(lhs, rhs, tp.tensor([1, 3]))
    assert not out._data[4:].any() and out._data[:4].abs().min() > 0
    out.backward(tp.from_torch(rand(6, 4, seed=11)))
    assert not lhs.grad._data[4:].any() and lhs.grad._data[:4].abs().sum() > 0
    assert rhs.grad._data.abs().min() > 0


def test_rhs_gradient_of_an_empty_group_is_zero():
    rhs = tp.from_torch(rand(3, 2, 2, seed=12)).requires_grad_()
    tp.ragged_dot(tp.from_torch(rand(4, 2, seed=13)), rhs, tp.tensor([2, 0, 2])).sum().backward()
    assert not rhs.grad._data[1].any() and rhs.grad._data[0].abs().min() > 0


def test_double_backward_and_forward_mode():
    lhs = tp.from_torch(rand(5, 3, seed=14)).requires_grad_()
    rhs = tp.from_torch(rand(3, 3, 2, seed=15)).requires_grad_()
    gs = tp.tensor([2, 0, 2])

    def f(a, b):
        return tp.ragged_dot(a, b, gs)
    assert tp.autograd.gradgradcheck(f, (lhs, rhs))
    assert tp.autograd.gradcheck(f, (lhs, rhs), check_forward_ad=True)
    # the weight-gradient op is differentiable too
    y = tp.from_torch(rand(5, 2, seed=16)).requires_grad_()
    assert tp.autograd.gradcheck(lambda a, g: OPS["_ragged_dot_rhs_backward"].fn(a, g, gs), (lhs, y))


def test_meta_needs_no_data():
    out = OPS["ragged_dot"].run_meta(torch.empty(7, 3, device="meta"), torch.empty(2, 3, 5, device="meta"),
                                     torch.empty(2, dtype=torch.int64, device="meta"))
    assert out.shape == (7, 5) and out.device.type == "meta"
    gw = OPS["_ragged_dot_rhs_backward"].run_meta(torch.empty(7, 3, device="meta"), torch.empty(7, 5, device="meta"),
                                                  torch.empty(4, dtype=torch.int64, device="meta"))
    assert gw.shape == (4, 3, 5)
    assert "linalg" in OPS["ragged_dot"].tags and "linalg" in OPS["_ragged_dot_rhs_backward"].tags


def test_flops_count_every_row():
    lhs, rhs = tp.from_torch(rand(6, 3)), tp.from_torch(rand(2, 3, 4))
    low = tp.compile(lambda a, b: tp.ragged_dot(a, b, tp.tensor([2, 4])), backend="eager").lower(lhs, rhs)
    assert cost_analysis(low.graph_module)["flops"] == 2 * 6 * 3 * 4


# ---- compiled graphs --------------------------------------------------------------------------------
def test_compiled_strict_native_equals_eager():
    """An extern kernel with fused neighbours; the second call of the compiled function (the first
    is its capture run), then new group sizes of the same shape: the same graph, the new grouping."""
    def f(a, b, gs):
        return (tp.ragged_dot(a * 2, b, gs) + 1).relu()
    cf = tp.compile(f, strict_native=True)
    a, b = tp.from_torch(rand(7, 5, dtype=torch.float32, seed=17)), tp.from_torch(rand(3, 5, 4, dtype=torch.float32))
    for gs in ([2, 0, 4], [2, 0, 4], [0, 7, 0], [1, 1, 1]):
        out = cf(a, b, tp.tensor(gs))
        assert_close(out, f(a, b, tp.tensor(gs)), exact=True, msg=str(gs))
        assert out._data.abs().sum() > 0
    assert len(cf.recompile_reasons) == 0


def test_compiled_symbolic_sizes_one_capture():
    """dynamic=True: one graph for every m (the meta function needs no data)."""
    def f(a, b, gs):
        return (tp.ragged_dot(a, b, gs) * 2 + 1).relu()
    cf = tp.compile(f, dynamic=True, strict_native=True)
    b = tp.from_torch(rand(3, 4, 5, dtype=torch.float32, seed=20))
    for m in (7, 11, 13):
        a, gs = tp.from_torch(rand(m, 4, dtype=torch.float32, seed=m)), tp.tensor([2, m - 4, 1])
        for _ in range(2):
            assert_close(cf(a, b, gs), f(a, b, gs), exact=True, msg=str(m))
    assert cf.counters["captures"] == 1


def test_compiled_backward_equals_eager():
    def loss(a, b, gs):
        return tp.ragged_dot(a, b, gs).tanh().sum()
    cf = tp.compile(loss, strict_native=True)
    gs = tp.tensor([3, 0, 2, 1])
    a0, b0 = rand(7, 4, seed=18), rand(4, 4, 3, seed=19)
    grads = []
    for fn in (cf, cf, loss):                        # capture run, compiled run, eager
        a, b = tp.from_torch(a0.clone()).requires_grad_(), tp.from_torch(b0.clone()).requires_grad_()
        out = fn(a, b, gs)
        out.backward()
        grads.append((out, a.grad, b.grad))
    assert grads[1][0].grad_fn.name() == "CompiledRegionFunctionBackward"
    for got, want in zip(grads[1], grads[2]):
        assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert not grads[2][1]._data[6:].any() and grads[2][2]._data[1].abs().sum() == 0


# ---- errors -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("lhs,rhs,gs,err,msg", [
    ((2, 3, 4), (2, 4, 5), [1, 1], ValueError, r"lhs must be 2-D \[m, k\], got 3-D"),
    ((4, 3), (3, 5), [4], ValueError, r"rhs must be 3-D \[g, k, n\], got 2-D"),
    ((4, 3), (2, 4, 5), [2, 2], ValueError, r"contraction sizes differ: lhs is \[m=4, k=3\] but rhs is \[g=2, k=4"),
    ((4, 3), (2, 3, 5), [1, 1, 2], ValueError, r"group_sizes has 3 entries but rhs has g=2 groups"),
    ((4, 3), (2, 3, 5), [[2, 2]], ValueError, r"group_sizes must be 1-D"),
    ((4, 3), (2, 3, 5), [3, -1], ValueError, r"group_sizes must be non-negative, got \[3, -1\]"),
    ((4, 3), (2, 3, 5), [3, 2], ValueError, r"sum\(group_sizes\) = 5 exceeds the 4 rows of lhs \(group_sizes \[3, 2\]\)"),
    ((4, 3), (2, 3, 5), [2.0, 2.0], TypeError, r"group_sizes must be an integer tensor, got float32"),
])
def test_errors_name_the_op_and_the_sizes(lhs, rhs, gs, err, msg):
    with pytest.raises(err, match=r"tp\.ragged_dot\(lhs: float32\[.*" + msg):
        tp.ragged_dot(tp.randn(*lhs), tp.randn(*rhs), tp.tensor(gs))


def test_dtype_mismatch_and_meta_errors():
    with pytest.raises(TypeError, match=r"tp\.ragged_dot.*lhs and rhs must have the same dtype, got float32 and float64"):
        tp.ragged_dot(tp.randn(4, 3), tp.randn(2, 3, 5, dtype=torch.float64), tp.tensor([2, 2]))
    with pytest.raises(ValueError, match="contraction sizes differ"):      # the meta function checks shapes too
        OPS["ragged_dot"].run_meta(torch.empty(4, 3, device="meta"), torch.empty(2, 2, 5, device="meta"),
                                   torch.empty(2, dtype=torch.int64, device="meta"))
