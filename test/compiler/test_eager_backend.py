"""The eager backend's raw path: Python scalars hoisted into 0-d constants on the inputs' device."""
import pytest
import torch

import tensorplay as tp


def _clamp_scale(x):
    return (x * 2.5 + 1).clamp(-1.0, 3.0)


def test_scalars_hoisted_on_cpu_match_eager():
    x = tp.randn(64)
    cf = tp.compile(_clamp_scale, backend="eager")
    cf(x)
    out = cf(x)
    ref = (x._data * 2.5 + 1).clamp(-1.0, 3.0)
    assert torch.equal(out._data, ref)
    assert "S_" in cf._cache[0].artifact.source       # the scalars were hoisted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_scalars_hoisted_on_cuda_stay_on_cuda():
    # regression: hoisted constants used to be created on the CPU, so clamp(cuda, cpu 0-d) failed
    x = tp.randn(64).cuda()
    cf = tp.compile(_clamp_scale, backend="eager")
    cf(x)
    out = cf(x)
    assert out.device.type == "cuda"
    assert torch.equal(out._data.cpu(), (x._data.cpu() * 2.5 + 1).clamp(-1.0, 3.0))
