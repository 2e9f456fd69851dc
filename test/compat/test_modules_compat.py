"""pixel_shuffle / pixel_unshuffle ops (forward bit-identical to torch, meta, gradients, gradcheck,
the reshape/permute decomposition, compiled calls) and the PixelShuffle, padding, Identity, Flatten
and Unflatten modules against torch.nn on the same inputs."""
import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from harness import check_op, layouts, to_tp
from tensorplay.testing import assert_close

OPS = tp.ops.OPS


@pytest.mark.parametrize("shape,r", [((2, 8, 3, 5), 2), ((18, 2, 3), 3), ((2, 1, 4, 3, 2), 2), ((0, 4, 2, 2), 2),
                                     ((1, 1, 1), 1)])
def test_pixel_shuffle_op(shape, r):
    empty = 0 in shape
    for x in layouts(shape):
        check_op(lambda a: F.pixel_shuffle(a, r), lambda a: torch.nn.functional.pixel_shuffle(a, r), x,
                 grad=not empty)
        y = torch.nn.functional.pixel_shuffle(x, r)
        for z in layouts(tuple(y.shape)):
            if not empty:
                check_op(lambda a: F.pixel_unshuffle(a, r), lambda a: torch.nn.functional.pixel_unshuffle(a, r), z)
    if empty:
        # ATen's CPU pixel_unshuffle returns an empty input unchanged (so torch's backward of an empty
        # pixel_shuffle fails); tp gives the shape of ATen's meta function, and gradients of that shape
        x = tp.randn(*shape, requires_grad=True)
        y = F.pixel_shuffle(x, r)
        assert F.pixel_unshuffle(y, r).shape == x.shape == torch.pixel_unshuffle(y._data.to("meta"), r).shape
        y.sum().backward()
        assert x.grad.shape == x.shape


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.float64])
def test_pixel_shuffle_dtypes(dtype):
    for x in layouts((2, 9, 2, 3), dtype):
        check_op(lambda a: tp.pixel_shuffle(a, 3), lambda a: torch.pixel_shuffle(a, 3), x)
        check_op(lambda a: tp.pixel_unshuffle(a, 1), lambda a: torch.pixel_unshuffle(a, 1), x)


def test_pixel_shuffle_decompositions_equal_eager():
    x = torch.randn(3, 2, 12, 4, 5)
    for name, r, inp in (("pixel_shuffle", 2, x), ("pixel_unshuffle", 2, torch.randn(3, 2, 3, 4, 6))):
        op = OPS[name]
        assert_close(op.decomp(to_tp(inp), r), getattr(torch, name)(inp, r), exact=True, msg=name)
        assert op.decomp is not None and "shape" in op.tags


def test_pixel_shuffle_double_backward():
    x = tp.from_torch(torch.randn(1, 4, 2, 2, dtype=torch.float64)).requires_grad_()
    assert tp.autograd.gradgradcheck(lambda a: F.pixel_shuffle(a, 2).pow(2), (x,))


def test_pixel_shuffle_errors():
    with pytest.raises(RuntimeError, match="tp.pixel_shuffle"):
        tp.pixel_shuffle(tp.randn(4, 3), 2)
    with pytest.raises(RuntimeError, match="tp.pixel_shuffle"):
        tp.pixel_shuffle(tp.randn(1, 6, 2, 2), 2)         # 6 not divisible by 4
    with pytest.raises(RuntimeError, match="tp.pixel_unshuffle"):
        tp.pixel_unshuffle(tp.randn(1, 1, 3, 4), 2)
    with pytest.raises(RuntimeError, match="tp.pixel_unshuffle"):
        tp.pixel_unshuffle(tp.randn(1, 1, 4, 4), 0)


@pytest.mark.slow
def test_pixel_shuffle_compiled():
    def f(a):
        return (F.pixel_unshuffle(F.pixel_shuffle(a * 2, 2) + 1, 2)).relu()
    cf = tp.compile(f)
    x = tp.from_torch(torch.randn(2, 8, 3, 3))
    cf(x)                                           # the capture run
    y = torch.randn(2, 8, 3, 3)
    want = torch.pixel_unshuffle(torch.pixel_shuffle(y * 2, 2) + 1, 2).relu()
    assert_close(cf(tp.from_torch(y)), want, exact=True)


def test_pixel_shuffle_modules():
    x = torch.randn(2, 18, 4, 5)
    for ours, theirs in ((nn.PixelShuffle(3), torch.nn.PixelShuffle(3)),
                         (nn.PixelUnshuffle(2), torch.nn.PixelUnshuffle(2))):
        inp = x if isinstance(ours, nn.PixelShuffle) else x[:, :, :, :4]
        assert_close(ours(to_tp(inp)), theirs(inp), exact=True)
        assert repr(ours) == repr(theirs)
        assert ours.state_dict() == {}


PADS = [(kind, n) for kind in ("Constant", "Zero", "Reflection", "Replication", "Circular") for n in (1, 2, 3)]


@pytest.mark.parametrize("kind,n", PADS, ids=[f"{k}Pad{n}d" for k, n in PADS])
@pytest.mark.parametrize("padding", [2, "tuple"])
@pytest.mark.parametrize("batched", [True, False])
def test_padding_modules_match_torch(kind, n, padding, batched):
    if padding == "tuple":
        padding = tuple([1, 2, 0, 1, 2, 0][:2 * n])
    args = (padding, 1.5) if kind == "Constant" else (padding,)
    ours, theirs = getattr(nn, f"{kind}Pad{n}d")(*args), getattr(torch.nn, f"{kind}Pad{n}d")(*args)
    assert repr(ours) == repr(theirs)
    assert ours.padding == theirs.padding
    shape = ((2,) if batched else ()) + (3,) + (4, 5, 3)[:n]
    for x in layouts(shape, torch.float64):
        xt = x.clone().requires_grad_()
        xp = to_tp(x, requires_grad=True)
        out_t, out_p = theirs(xt), ours(xp)
        assert_close(out_p, out_t.detach(), exact=True)
        g = torch.randn(out_t.shape, dtype=torch.float64)
        out_t.backward(g)
        out_p.backward(tp.from_torch(g))
        assert_close(xp.grad, xt.grad, rtol=1e-12, atol=1e-12)


def test_padding_errors_and_integer_inputs():
    with pytest.raises(ValueError, match="nn.ReflectionPad2d"):
        nn.ReflectionPad2d(2)(tp.randn(5))
    with pytest.raises(ValueError, match="nn.ConstantPad1d"):
        nn.ConstantPad1d((1, 2, 3), 0.0)
    x = torch.randint(-5, 5, (2, 3, 4))
    assert_close(nn.ConstantPad1d(2, 7)(to_tp(x)), torch.nn.ConstantPad1d(2, 7)(x), exact=True)
    assert_close(nn.ReplicationPad1d(1)(to_tp(x.double())), torch.nn.ReplicationPad1d(1)(x.double()), exact=True)


def test_identity_flatten_unflatten_match_torch():
    x = torch.randn(2, 3, 4, 5)
    for ours, theirs in ((nn.Identity(3, k=1), torch.nn.Identity(3, k=1)), (nn.Flatten(), torch.nn.Flatten()),
                         (nn.Flatten(0, 2), torch.nn.Flatten(0, 2)),
                         (nn.Unflatten(2, (2, 2)), torch.nn.Unflatten(2, (2, 2)))):
        assert_close(ours(to_tp(x)), theirs(x), exact=True)


def test_data_parallel_is_a_pass_through():
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU())
    dp = nn.DataParallel(m, device_ids=[0])
    x = tp.randn(5, 3)
    assert dp.module is m
    assert_close(dp(x), m(x), exact=True)
    assert list(dp.state_dict()) == ["module." + k for k in m.state_dict()]
    assert nn.parallel.DataParallel is nn.DataParallel


def test_ddp_needs_a_process_group():
    import torch.distributed as dist
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    with pytest.raises(RuntimeError, match="DistributedDataParallel"):
        nn.parallel.DistributedDataParallel(nn.Linear(2, 2))


@pytest.mark.slow
def test_ddp_two_processes_average_gradients(tmp_path):
    """2 gloo processes (spawn, bounded by a timeout): rank 0's weights and buffers broadcast; after
    backward each rank's gradients equal the single-process gradient of the mean loss over both
    halves of the batch; no_sync accumulates locally and the next backward averages the sum."""
    import time

    import ddp_worker
    import torch.multiprocessing as mp
    from tensorplay.distributed.runtime import free_port

    ctx = mp.start_processes(ddp_worker.run, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + 240
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("DDP workers did not finish in 240 s (a hung all-reduce?)")
    recs = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    ref_model = ddp_worker.model(seed=10)
    for r in range(2):
        assert recs[r]["keys"] == ["module." + k for k in ref_model.state_dict()]
        assert torch.equal(recs[r]["marker"], ref_model.marker._data)
        for a, b in zip(recs[r]["params"], ref_model.parameters()):
            assert torch.equal(a, b._data)
    x, y = ddp_worker.batch()
    F.mse_loss(ref_model(x), y).backward()
    full = ddp_worker.grads(ref_model)
    local = []
    for part in (slice(0, 2), slice(4, 6)):      # what each rank holds inside no_sync
        ref_model.zero_grad()
        F.mse_loss(ref_model(x[part]), y[part]).backward()
        local.append(ddp_worker.grads(ref_model))
    ref_model.zero_grad()
    for part in (slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)):
        F.mse_loss(ref_model(x[part]), y[part]).backward()
    accumulated = [g / 2 for g in ddp_worker.grads(ref_model)]
    for r in range(2):
        for got, want in zip(recs[r]["sync"], full):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for got, want in zip(recs[r]["accumulated"], accumulated):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
        for got, want in zip(recs[r]["local_only"], local[r]):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
