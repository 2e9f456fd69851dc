"""PyTorch's OpInfo database against tensorplay (harness: test/compat/opinfo.py): name resolution,
the harness catching a wrong result, an eager sweep of every entry, a compiled sample of entries,
and (slow) the full compiled sweep — each with a pass-rate floor."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest.importorskip("expecttest")   # torch's OpInfo modules import it (the [test] extra installs it)
import opinfo  # noqa: E402

import tensorplay as tp  # noqa: E402

#: entries of the compiled sample: pointwise, reductions, views, indexing, nn ops, a lambda entry
COMPILED_SAMPLE = ["abs", "add", "mul", "sub", "div.no_rounding_mode", "exp", "tanh", "sigmoid", "clamp",
                   "where", "sum", "mean", "amax", "softmax", "log_softmax", "cumsum", "transpose",
                   "permute", "cat", "gather", "nn.functional.relu", "nn.functional.gelu",
                   "nn.functional.linear", "nn.functional.layer_norm", "matmul", "flip", "view"]


def _info(entry):
    return next(i for i in opinfo.load_op_db() if opinfo.entry_id(i) == entry)


def test_resolution_of_functions_methods_namespaces_and_lambdas():
    assert opinfo.resolve(_info("abs")).how == "tp.abs"
    assert opinfo.resolve(_info("nn.functional.relu")).how == "tp.nn.functional.relu"
    assert opinfo.resolve(_info("__radd__")).how == "Tensor.__radd__"
    assert opinfo.resolve(_info("view")).how == "lambda"              # op_db's op is a lambda
    ns = opinfo._TpNamespace(tp)
    assert ns.float32 is torch.float32 and ns.abs is tp.abs
    with pytest.raises(AttributeError, match="tensorplay has no"):
        ns.certainly_not_an_op


def test_harness_catches_a_wrong_result_and_a_wrong_dtype():
    x = torch.randn(4, 3)
    with pytest.raises(AssertionError):
        opinfo.compare(x + 1e-3, x)
    with pytest.raises(AssertionError):
        opinfo.compare(x.double(), x)
    with pytest.raises(AssertionError, match="result is"):
        opinfo.compare([x], (x, x))
    opinfo.compare([x.clone()], (x,))


def test_entry_result_counts_real_comparisons(monkeypatch):
    res = opinfo.run_entry(_info("abs"), max_samples=4, grad_samples=1)
    assert res.exposed and res.eager_total > 0 and res.eager_pass == res.eager_total
    assert res.grad_total == 1 and res.grad_pass == 1
    # a deliberately wrong tp kernel is caught by the same path
    real = opinfo.resolve
    monkeypatch.setattr(opinfo, "resolve", lambda info: _wrong(real(info)))
    bad = opinfo.run_entry(_info("abs"), max_samples=4, grad_samples=0)
    assert bad.eager_pass == 0 and bad.eager_total > 0
    assert sum(m == "eager" for m, _ in bad.failures) == bad.eager_total


def _wrong(call):
    def f(*a, **k):
        return call(*a, **k) * 1.001 + 0.01
    f.how = call.how
    return f


def test_eager_sweep_of_every_fourth_entry():
    entries = [opinfo.entry_id(i) for i in opinfo.load_op_db()[::4]]
    results = opinfo.run_all(entries, max_samples=4, grad_samples=1, compiled=False)
    s = opinfo.summary(results)
    assert s["entries"] >= 170
    assert s["exposed"] >= 70, s              # floors measured on this branch; they only rise
    assert s["eager"][2] >= 0.93, opinfo.failure_groups(results, "eager")[:10]
    assert s["grad"][2] >= 0.9, opinfo.failure_groups(results, "grad")[:10]


def test_compiled_sample_of_entries():
    results = opinfo.run_all(COMPILED_SAMPLE, max_samples=3, grad_samples=0, compiled=True, batch=32)
    s = opinfo.summary(results)
    assert s["exposed"] >= len(COMPILED_SAMPLE) - 1
    assert s["compiled"][1] >= 60
    assert s["compiled"][2] >= 0.95, opinfo.failure_groups(results, "compiled")[:10]


@pytest.mark.slow
def test_full_sweep_eager_and_compiled():
    results = opinfo.run_all(max_samples=8, grad_samples=2, compiled=True)
    s = opinfo.summary(results)
    assert s["entries"] >= 650 and s["exposed"] >= 300, s
    assert s["eager"][2] >= 0.93 and s["compiled"][2] >= 0.9, s


def test_small_fixes_found_by_the_sweep():
    x = torch.randn(3, 4)
    t = tp.from_torch(x.clone())
    assert torch.equal(tp.flip(t, dims=[0]).torch(), torch.flip(x, dims=[0]))          # keyword form
    assert torch.equal(t.permute(dims=(1, 0)).torch(), x.permute(dims=(1, 0)))
    with pytest.raises(TypeError, match="tp.flip"):
        t.flip(axis=0)
    assert t.double(memory_format=torch.preserve_format).dtype == torch.float64
    assert t.long().dtype == torch.int64
    torch.manual_seed(3)
    want = torch.randint(10, (5,))
    torch.manual_seed(3)
    assert torch.equal(tp.randint(10, (5,)).torch(), want)                           # randint(high, size)
    s = tp.scalar_tensor(2.5, requires_grad=True)
    assert s.requires_grad and float(s) == 2.5


def test_cosine_similarity_broadcasts_before_the_norms():
    a, b = torch.randn(1, 2, 3), torch.randn(2, 1, 3)
    got = tp.nn.functional.cosine_similarity(tp.from_torch(a), tp.from_torch(b), dim=-2)
    torch.testing.assert_close(got.torch(), torch.nn.functional.cosine_similarity(a, b, dim=-2))


def test_random_sampler_with_replacement_is_lazy_and_torchs_stream():
    import itertools
    ds = list(range(10))
    for n in (45, int(1e10)):      # makemore and minGPT ask for 1e10 samples and read a few
        a = torch.utils.data.RandomSampler(ds, replacement=True, num_samples=n, generator=torch.Generator().manual_seed(5))
        b = tp.utils.data.RandomSampler(ds, replacement=True, num_samples=n, generator=torch.Generator().manual_seed(5))
        assert list(itertools.islice(iter(b), 45)) == list(itertools.islice(iter(a), 45))
