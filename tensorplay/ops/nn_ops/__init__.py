"""Neural-network ops: softmax, normalization, dropout, embedding, convolution, pooling,
resampling, losses and attention (chapter §1.2; used by ``tensorplay.nn``).

Every entry's eager kernel is ATen's, so forward results are bit-identical to PyTorch.  The
derivative formulas come in two kinds:

* **formulas in tp ops** — softmax/log_softmax (from the saved result), the normalizations
  (layer/RMS/batch/group norm recompute their statistics from the saved input with tp ops, so their
  gradients are themselves differentiable), dropout (the mask that the forward drew is an *output*
  of ``native_dropout``, so reverse and forward mode reuse it), the losses, attention (recomputed
  with matmul + softmax);
* **dedicated backward ops** in the table where no short tp formula exists (convolution, pooling,
  resampling, embedding, nll_loss).  Each backward op is linear in the incoming gradient and its own
  derivative is again a table op (the transpose: e.g. the derivative of
  ``convolution_backward_input`` w.r.t. the gradient is ``convolution``), so every op here supports
  double backward, except ``embedding`` with ``scale_grad_by_freq=True`` and
  ``max_pool2d_with_indices_backward`` w.r.t. its input (zero almost everywhere), which raise or
  return zero as documented on the entry.

Conventions: ``reduction`` is the string ``'none' | 'mean' | 'sum'``; the class dimension of a
loss input is 1 (0 for an unbatched input); convolution ``padding`` is either one int per spatial
dim (symmetric) or two per dim, ``[before_0, after_0, before_1, after_1, ...]``.
Bad input raises an exception whose message starts with ``tp.<op>(...)`` and shows the shapes.

One module per family, imported in this order (the order of the table's entries):

  normalization.py   softmax, log_softmax, layer_norm, rms_norm, batch_norm, group_norm
  dropout.py         native_dropout
  embedding.py       embedding, embedding_dense_backward
  conv.py            convolution (and its backward ops), conv1d/2d/3d, conv_transpose1d/2d/3d
  pooling.py         max/avg/adaptive pooling, nearest and (bi)linear upsampling, their backward ops
  loss.py            mse, l1, smooth_l1, huber, nll (+ backward), cross_entropy, bce, kl_div
  attention.py       scaled_dot_product_attention; sdpa_composite (tp ops)
  pixel_shuffle.py   pixel_shuffle, pixel_unshuffle (permutations; reshape/permute decompositions)
  activation_extra.py selu, celu, threshold, hardshrink, softshrink, glu
  loss_extra.py      _ctc_loss (+ backward)
  resample_extra.py  3-d, bicubic, nearest-exact, antialiased resampling; adaptive_avg_pool3d
  _common.py         tags and helpers the families share
"""
from __future__ import annotations

from . import normalization, dropout, embedding, conv, pooling, loss, attention  # noqa: F401  (registration)
from . import pixel_shuffle  # noqa: F401,E402  (registration)
from . import activation_extra, loss_extra, resample_extra  # noqa: F401  (registration)
from .attention import attention_bias, sdpa_composite, sdpa_scores  # noqa: F401
from .conv import resolve_conv_padding  # noqa: F401

__all__ = []
