"""Layouts (§6.6) and the kernel order (§7.5): outputs keep eager's strides, intermediates are
flexible, and the scheduler orders kernels to keep the peak of live intermediate bytes low."""

import pytest
import torch

import tensorplay as tp


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _run(f, *args):
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    return cf, cf(*args), f(*args)


@pytest.mark.parametrize("f", [
    lambda x: x.t().exp(),                         # column-major in eager
    lambda x: x.t() * 2 + x.t().abs(),
    lambda x: (x.t() + 1, x.exp()),                # one transposed, one row-major output
    lambda x: x.permute(1, 0).sigmoid().sum(0, keepdim=True),
])
def test_outputs_keep_eager_strides(f):
    x = tp.randn(5, 7)
    _, out, ref = _run(f, x)
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        assert o.shape == r.shape and o.stride() == r.stride(), (o.stride(), r.stride())
        assert torch.allclose(o._data, r._data, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("f,shape", [
    (lambda x: (x.t() * 3).relu() + 1, (300, 257)),             # column-major in and out
    (lambda x: x.permute(2, 0, 1).exp() * x.permute(2, 0, 1), (6, 7, 40)),
    (lambda x: (x.t().sigmoid(), x.t() - 1), (33, 70)),         # two outputs, same permuted layout
])
def test_elementwise_kernels_run_in_memory_order(f, shape):
    """A purely elementwise kernel whose outputs keep a permuted (e.g. column-major) eager layout
    loops in memory order (kernel_plan._memory_order): plain vector loads and stores, no gathers or
    scatters, and the same values and strides as eager."""
    x = tp.randn(*shape)
    cf, out, ref = _run(f, x)
    src = cf._cache[0].artifact.source
    assert "tp_gather" not in src and "tp_scatter" not in src, src
    outs, refs = (out, ref) if isinstance(out, tuple) else ((out,), (ref,))
    for o, r in zip(outs, refs):
        assert o.stride() == r.stride()
        assert torch.allclose(o._data, r._data, rtol=1e-6, atol=1e-6)


def test_mixed_layouts_keep_the_output_order():
    """Input column-major, output row-major (.contiguous()): the stores decide the order."""
    x = tp.randn(40, 33).t()
    cf, out, ref = _run(lambda x: (x * 2).contiguous(), x)
    assert out.stride() == ref.stride() == (40, 1)
    assert torch.equal(out._data, ref._data)
    assert "tp_scatter" not in cf._cache[0].artifact.source


def test_output_read_by_a_later_kernel_uses_its_final_layout():
    # y is an output (takes eager's column-major strides) and is also reduced by another kernel:
    # the reduction's loads must index y with the final layout, not the one it had when lowered
    def f(x):
        y = x.t().exp()
        return y, y.sum(0) + y.amax(1).sum()
    x = tp.randn(6, 9)
    _, (y, s), (ry, rs) = _run(f, x)
    assert y.stride() == ry.stride()
    assert torch.allclose(y._data, ry._data, rtol=1e-6) and torch.allclose(s._data, rs._data, rtol=1e-5)


def _schedule(f, *args):
    from tensorplay.compiler.backends.stax import compile_graph
    cf = tp.compile(f, strict_native=True)
    cf(*args)
    e = cf._cache[0]
    _, _, sched, _ = compile_graph(e.lowered.graph_module, list(args))
    return cf, sched


def test_memory_order_runs_a_consumer_before_the_next_big_producer():
    def f(x, w1, w2):
        a = x @ w1                      # extern kernels: cannot fuse, must be materialised
        b = x @ w2
        return a.exp().sum(1), b.exp().sum(0)      # different row shapes: two kernels
    x, w1, w2 = tp.randn(64, 32), tp.randn(32, 256), tp.randn(32, 256)
    cf, sched = _schedule(f, x, w1, w2)
    big = 64 * 256 * 4
    assert sched.peak_bytes(sched.program_order) >= 2 * big      # a and b live together
    assert sched.peak_bytes() < 2 * big                           # a is reduced before b exists
    names = [g.nodes[0].name for g in sched.groups]
    assert len(names) == len(sched.program_order)
    for o, r in zip(cf(x, w1, w2), f(x, w1, w2)):
        assert torch.allclose(o._data, r._data, rtol=1e-5)


def test_memory_order_is_topological_and_never_worse_than_program_order():
    def f(x, y):
        a = (x * 2).sum(1, keepdim=True)
        b = x / a
        c = (y @ b.t()).relu()
        return c.sum(0) + 1, b.amax()
    x, y = tp.randn(16, 40), tp.randn(8, 40)
    cf, sched = _schedule(f, x, y)
    written = set()
    for g in sched.groups:
        produced_elsewhere = {n for h in sched.groups if h is not g for n in h.writes}
        assert (g.reads & produced_elsewhere) <= written, g
        written |= g.writes
    assert sched.peak_bytes() <= sched.peak_bytes(sched.program_order)
    out, ref = cf(x, y), f(x, y)
    for o, r in zip(out, ref):
        assert torch.allclose(o._data, r._data, rtol=1e-5, atol=1e-6)


def _heads(qkv):
    q, k, _ = qkv.split(64, 2)
    return q.reshape(4, 8, 4, 16).transpose(1, 2), k.reshape(4, 8, 4, 16).transpose(1, 2)


@pytest.mark.parametrize("f", [
    lambda qkv: (lambda q, k: q @ k.transpose(-1, -2))(*_heads(qkv)),      # attention scores
    lambda qkv: (lambda q, k: (q @ k.transpose(-1, -2)) @ q)(*_heads(qkv)),  # q copied once, used twice
])
def test_batched_matmul_operands_that_do_not_merge_are_copied_densely(f):
    """Head views of a fused qkv projection have batch dims that do not merge into one stride:
    Stax copies them in its own kernel (k transposed stays column-major: no gather) and ATen's
    matmul gets dense operands; values equal eager's."""
    qkv = tp.randn(4, 8, 192)
    cf, out, ref = _run(f, qkv)
    src = cf._cache[0].artifact.source
    assert "tp_gather" not in src and src.count("async_compile.cpp(") == 2, src
    assert torch.allclose(out._data, ref._data, rtol=1e-5, atol=1e-5)


def test_batched_matmul_operands_that_merge_are_passed_as_they_are():
    a, b = tp.randn(6, 5, 7), tp.randn(6, 7, 3)
    cf, out, ref = _run(lambda a, b: a @ b.transpose(-1, -2).transpose(-1, -2), a, b)
    assert "async_compile.cpp(" not in cf._cache[0].artifact.source
    assert torch.equal(out._data, ref._data)


# ---- extern results in the kernels' layout (runtime.as_layout) -----------------------------------------
def _expanded_alias(a):
    # einsum with an identity equation returns its operand: an expanded view with a storage offset
    return tp.einsum("ij->ij", a[1:, 2:3].expand(4, 5))


@pytest.mark.parametrize("offset", [0, 7])
@pytest.mark.parametrize("f", [lambda a: _expanded_alias(a) * 2, _expanded_alias,
                               lambda a: _expanded_alias(a).t().sum(0) + _expanded_alias(a)[:, 0]])
def test_extern_returning_an_expanded_view_with_offset(f, offset):
    """An extern kernel whose ATen result aliases its input (stride 0, a storage offset): the
    runtime's layout copy used to write into an overlapping layout and fail."""
    g = torch.Generator().manual_seed(offset)
    x = tp.from_torch(torch.randn(40, generator=g)[offset:offset + 30].view(5, 6))
    cf, out, ref = _run(f, x)
    assert cf.counters["captures"] == 1
    torch.testing.assert_close(out._data, ref._data)


_LAYOUTS = [((4, 5), (5, 1), 0), ((4, 5), (1, 4), 0), ((4, 5), (0, 1), 3), ((4, 5), (1, 0), 2),
            ((2, 3, 4), (0, 4, 1), 5), ((3, 3), (1, 1), 0), ((3, 4), (2, 1), 1), ((0, 3), (3, 1), 0),
            ((2, 1, 3), (3, 7, 1), 0)]


@pytest.mark.parametrize("size, stride, offset", _LAYOUTS)
@pytest.mark.parametrize("src", ["contiguous", "transposed", "offset_view"])
def test_as_layout_copies_into_any_strides_and_offset(size, stride, offset, src):
    """The copy writes each memory location of the target layout once; its values read back through
    (size, stride) from the result's data_ptr equal the source's (a source whose values disagree
    between aliased positions cannot be meant: here the source is made of the target's values)."""
    from tensorplay.compiler.backends.stax.runtime import as_layout
    g = torch.Generator().manual_seed(len(size) + offset)
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else offset + 1
    want = torch.randn(extent, generator=g, dtype=torch.float64).as_strided(size, stride, offset)
    if src == "contiguous":
        t = want.contiguous()
    elif src == "transposed":
        t = want.transpose(0, -1).contiguous().transpose(0, -1)
    else:
        t = torch.zeros(7 + want.numel(), dtype=torch.float64)[7:].view(size).copy_(want)
    out = as_layout(t, size, stride, offset)
    assert tuple(out.shape) == size and tuple(out.stride()) == stride
    assert torch.equal(out, want)
    if tuple(t.stride()) == stride:
        assert out is t        # the right strides at any storage offset: used as it is
