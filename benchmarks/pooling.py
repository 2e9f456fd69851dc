"""Pooling and nearest upsampling: tp compiled (strict_native) vs torch eager and torch.compile.

Cases (float32, a ResNet-stem-sized 32 x 64 x 56 x 56 input unless noted), each with a relu
producer that fuses into the pooling kernel:

  max_pool2d 3/2/1 (values; and with indices), avg_pool2d 3/2/1 and 2/2/0, adaptive_avg_pool2d to
  7 x 7 (equal bins) and to 1 x 1 (global), nearest 2x upsampling (16 x 64 x 56 x 56), and the
  backward ops avg_pool2d_backward 3/1/1 and upsample_nearest2d_backward 2x.

Variants are timed interleaved in one run (chapter §13.1, ``compare``): median [95% CI of the median]
in ms; 'vs X' = t(X) / t(tp compiled) (> 1: Stax is faster).  Every tp compiled result is checked
bitwise against eager first (these lowerings are exact).

    python benchmarks/pooling.py [--repeats 15] [--quick] [--no-torch-compile]
"""
from __future__ import annotations

import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.ops.registry import OPS
from tensorplay.utils.benchmark import comparison_args, print_tp_vs_torch, tp_vs_torch_row

aten = torch.ops.aten


def cases(s):
    """name -> (tp function, torch function, input shape)."""
    N, C, H = 32 // s, 64, 56
    x = (N, C, H, H)
    tf = torch.nn.functional
    return {
        "max_pool2d 3/2/1": (lambda a: F.max_pool2d(tp.relu(a), 3, 2, 1), lambda a: tf.max_pool2d(a.relu(), 3, 2, 1), x),
        "max_pool2d 3/2/1 + indices": (lambda a: F.max_pool2d(tp.relu(a), 3, 2, 1, return_indices=True),
                                       lambda a: tf.max_pool2d(a.relu(), 3, 2, 1, return_indices=True), x),
        "avg_pool2d 3/2/1": (lambda a: F.avg_pool2d(tp.relu(a), 3, 2, 1), lambda a: tf.avg_pool2d(a.relu(), 3, 2, 1), x),
        "avg_pool2d 2/2/0": (lambda a: F.avg_pool2d(tp.relu(a), 2), lambda a: tf.avg_pool2d(a.relu(), 2), x),
        "adaptive_avg_pool2d 7x7": (lambda a: F.adaptive_avg_pool2d(tp.relu(a), 7),
                                    lambda a: tf.adaptive_avg_pool2d(a.relu(), 7), x),
        "adaptive_avg_pool2d 1x1": (lambda a: F.adaptive_avg_pool2d(tp.relu(a), 1),
                                    lambda a: tf.adaptive_avg_pool2d(a.relu(), 1), x),
        "nearest 2x": (lambda a: F.interpolate(tp.relu(a), scale_factor=2, mode="nearest"),
                       lambda a: tf.interpolate(a.relu(), scale_factor=2, mode="nearest"), (N // 2, C, H, H)),
        "avg_pool2d_backward 3/1/1": (
            lambda g: OPS["avg_pool2d_backward"].fn(g, list(x), [3, 3], [1, 1], [1, 1], False, True, None),
            lambda g: aten.avg_pool2d_backward(g, torch.empty(x), [3, 3], [1, 1], [1, 1], False, True, None), x),
        "nearest 2x backward": (
            lambda g: OPS["upsample_nearest2d_backward"].fn(g, [2 * H, 2 * H], [N // 2, C, H, H], None, None),
            lambda g: aten.upsample_nearest2d_backward(g, [2 * H, 2 * H], [N // 2, C, H, H], None, None),
            (N // 2, C, 2 * H, 2 * H)),
    }


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    return all(torch.equal(x._data, y) for x, y in zip(a, b))


def main(argv=None):
    a = comparison_args(argv, "1/8 of the batch (smoke test)")
    rows = []
    g = torch.Generator().manual_seed(0)
    for name, (f_tp, f_torch, shape) in cases(8 if a.quick else 1).items():
        t = torch.randn(shape, generator=g)
        pt = tp.from_torch(t)   # zero-copy: every variant reads the same memory (table13.py says why)
        cf = tp.compile(f_tp, strict_native=True)
        if not _same(cf(pt), f_torch(t)):
            raise AssertionError(f"{name}: the compiled result differs from eager")
        rows.append(tp_vs_torch_row(name, lambda: cf(pt), f_torch, t, opts=a))
    return print_tp_vs_torch(rows, a)


if __name__ == "__main__":
    main()
