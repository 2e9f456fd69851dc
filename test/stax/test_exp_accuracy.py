"""Large-sample accuracy of the float32 vector exp as compiled by Stax (docs/cpp_prelude.md †).

    python -m pytest -q -m slow test/stax/test_exp_accuracy.py      # ~12.7 M points, ~1 min
The default suite runs the same check on 2^16 points."""

import pytest
import torch

import tensorplay as tp


pytestmark = pytest.mark.usefixtures("stax_cache")   # conftest.py


def _max_ulp(n_bits, n_uniform):
    g = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 2**31 - 1, (n_bits,), dtype=torch.int64, generator=g).to(torch.int32)
    xb = bits.view(torch.float32)
    xb = torch.where(torch.rand(xb.shape, generator=g) < 0.5, xb, -xb)
    xb = xb[torch.isfinite(xb) & (xb > -104) & (xb < 89)]            # random bit patterns in the domain
    xs = torch.cat([xb, torch.empty(n_uniform).uniform_(-104, 89, generator=g)])
    y = tp.compile(lambda x: x.exp(), strict_native=True)(tp.from_torch(xs))._data.double()
    ref = xs.double().exp()
    r32 = ref.float()
    ulp = (torch.nextafter(r32, torch.tensor(float("inf"))) - r32).double()   # ulp above the result
    fin = ref < 3.4e38
    return ((y - ref).abs() / ulp)[fin].max().item()


def test_exp_float32_within_one_ulp():
    assert _max_ulp(1 << 15, 1 << 15) <= 1.0


@pytest.mark.slow
def test_exp_float32_within_one_ulp_large():
    assert _max_ulp(1 << 23, 1 << 23) <= 1.0
