"""tp.profiler on a GPU (``-m gpu``; skips without CUDA): CUDA kernel spans timed on the device,
bound by flow events to the Stax kernel span that launched them, with model bytes and achieved
GB/s; CUDA memory in the timeline."""
import pytest
import torch

import tensorplay as tp
from tensorplay.profiler import ProfilerActivity, profile

from test_profiler import _check_trace_schema  # noqa: E402  (same directory)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_cuda_kernels_are_device_spans_linked_to_their_launch():
    cf = tp.compile(lambda x, w: (((x + w).relu() * 2).sum(-1), (x.t().exp() + 1)), strict_native=True)
    x = tp.from_torch(torch.randn(1024, 512, device="cuda"))
    w = tp.from_torch(torch.randn(512, device="cuda"))
    cf(x, w)
    cf(x, w)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], profile_memory=True) as prof:
        for _ in range(3):
            cf(x, w)
        torch.cuda.synchronize()
    host = [s for s in prof.events() if s.cat == "kernel"]
    dev = [s for s in prof.events() if s.cat == "gpu kernel" and "stax_kernel" in s.args]
    assert len(host) >= 3 * 2 and len(dev) == len(host)
    for s in dev:
        assert s.args["model_bytes"] > 0 and s.args["achieved_GBps"] > 0 and s.dur > 0
    trace = prof.trace()
    _check_trace_schema(trace)
    flows = [e for e in trace["traceEvents"] if e["ph"] == "s"]
    assert len(flows) >= len(dev)
    mt = prof.memory_timeline()
    assert any(b.device.startswith("cuda") for b in mt.blocks)
