"""Random ops and dropout: tp compiled (strict_native, Philox streams in the kernels) vs torch eager
(ATen's sequential generator) and torch.compile (Inductor's own in-kernel generator).

Cases, float32 on a 4096 x 1024 input (16 MiB): rand, randn, ``x + rand_like(x)``, dropout p = 0.1,
``relu -> dropout -> *2`` and native_dropout returning its mask too (the mask is written).

The numbers of the three variants differ (three generators), so a result is checked by its
statistics against eager's: mean within 1 % of eager's standard deviation, standard deviation
within 1 %.  Variants are timed interleaved in one run (chapter §13.1, ``compare``): median [95%
CI of the median] in ms; 'vs X' = t(X) / t(tp compiled) (> 1: Stax is faster).

    python benchmarks/random_ops.py [--repeats 15] [--quick] [--no-torch-compile]
"""
from __future__ import annotations

import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.ops.registry import OPS
from tensorplay.utils.benchmark import comparison_args, print_tp_vs_torch, tp_vs_torch_row


def cases():
    """name -> (tp function, torch function); both take the input x."""
    tf = torch.nn.functional
    return {
        "rand": (lambda a: tp.rand(*a.shape), lambda a: torch.rand(a.shape)),
        "randn": (lambda a: tp.randn(*a.shape), lambda a: torch.randn(a.shape)),
        "x + rand_like(x)": (lambda a: a + tp.rand_like(a), lambda a: a + torch.rand_like(a)),
        "dropout p=0.1": (lambda a: F.dropout(a, 0.1, True), lambda a: tf.dropout(a, 0.1, True)),
        "relu -> dropout -> *2": (lambda a: F.dropout(tp.relu(a), 0.1, True) * 2,
                                  lambda a: tf.dropout(a.relu(), 0.1, True) * 2),
        "native_dropout + mask": (lambda a: OPS["native_dropout"].fn(a, 0.1, True),
                                  lambda a: torch.native_dropout(a, 0.1, True)),
    }


def _check(name, got, want):
    got = got[0]._data if isinstance(got, tuple) else got._data
    want = (want[0] if isinstance(want, tuple) else want).double()
    got = got.double()
    sd = float(want.std())
    if abs(float(got.mean()) - float(want.mean())) > 0.01 * sd or abs(float(got.std()) / sd - 1) > 0.01:
        raise AssertionError(f"{name}: compiled mean/std {float(got.mean()):.4f}/{float(got.std()):.4f}, "
                             f"eager {float(want.mean()):.4f}/{sd:.4f}")


def main(argv=None):
    a = comparison_args(argv, "a 512 x 1024 input (smoke test)")
    t = torch.randn((512 if a.quick else 4096, 1024), generator=torch.Generator().manual_seed(0))
    pt = tp.from_torch(t)   # zero-copy: every variant reads the same memory (table13.py says why)
    rows = []
    for name, (f_tp, f_torch) in cases().items():
        cf = tp.compile(f_tp, strict_native=True)
        cf(pt)
        _check(name, cf(pt), f_torch(t))
        rows.append(tp_vs_torch_row(name, lambda: cf(pt), f_torch, t, opts=a))
    return print_tp_vs_torch(rows, a)


if __name__ == "__main__":
    main()
