"""Lowering rules: one per op of the table (chapter §6.2; experiment 3 adds one from a script).

``register_lowering(name)`` binds a rule to an op-table entry.  A rule receives the op's canonical
arguments — graph values as :class:`TensorBox`, everything else as Python values — and returns a
TensorBox (or a tuple of them).  Most rules are made by two helpers:

* ``pointwise(compute)`` — ``compute`` takes the *values* of the tensor arguments (already
  broadcast to the output shape and converted to the compute dtype, the dtype PyTorch's type
  promotion gives) followed by the op's other arguments, and uses only the ``ops`` interface;
  ``cdt()`` inside it is the compute dtype (for constants)::

      register_lowering("relu")(pointwise(lambda x: ops.maximum(x, ops.constant(0, cdt()))))

* ``reduction(type)`` — sum/prod/amax/... over ``dim`` with ``keepdim``; ``make_reduction`` (one
  result, optionally of a transformed input: nansum, norm, count_nonzero) and
  ``make_multi_reduction`` (the results of one argmax/argmin/welford accumulator: max_dim's values
  and indices, var_mean's m2 and mean).  median/mode/kthvalue are extern kernels (sort-like).

The rules live in one module per family of the op table (``tensorplay/ops/``), read in this order:

  registry.py         the table ``LOWERINGS``, ``register_lowering``, the lowering in progress
                      (``V.graph``), ``cdt()`` / ``current_op()``: the package's only mutable state
  pointwise_rules.py  the ``pointwise`` helper; arithmetic, math, comparisons, where, casts; every
                      pointwise op named like an ``ops`` function is that function
  factory_rules.py    zeros/ones/full/arange/linspace/eye: Pointwise values of the index
  random_rules.py     rand, randn, randint, bernoulli, dropout, the in-place fills: Pointwise values
                      of a counter-based Philox stream, fused into their consumers like any other
  reduction_rules.py  the ``reduction`` helpers; sum ... norm, mean, var/std (Welford), logsumexp
  view_rules.py       views, copying shape ops (pixel_shuffle and glu too), integer-tensor indexing
                      (embedding included)
  nn_rules.py         softmax, the normalisations, pooling and nearest upsampling, losses
  special_rules.py    the special functions the ``ops`` interface can write (xlogy, logaddexp, sinc...)
  extern_rules.py     the ops Stax calls ATen for (matrix products, convolutions, sorts, scans, ...)

Views of unrealized values remap indices (permute, transpose, expand, slicing with step, select,
unsqueeze/squeeze: affine maps, Prop. 6.2); views of buffers become ReinterpretViews with strides
computed by the op's own kernel on a meta tensor; reshape of an unrealized value materialises it
first (a reshape of a contiguous buffer is free).  Copying shape ops (pad, cat, stack, roll,
repeat, tile, tril/triu) and integer-tensor indexing (gather, index_select, embedding, ``x[idx]``,
...) are index maps too: masked loads and checked indirect loads (bounds.py).
Pooling (max, average, adaptive) and nearest upsampling are index maps over the window: small
windows unrolled into pointwise kernels that make eager's comparisons and additions in eager's
order (bitwise results), their backward ops eager's scatter loops read as gathers.
matmul/mm/bmm/addmm/linear/conv, the sort-like ops and scans are extern kernels, and so are the
few pooling/upsampling forms whose masked lane-wise gathers measured slower than ATen; anything
without a rule is a fallback kernel.
"""
from __future__ import annotations

from ..ops_handler import ops
from .registry import LOWERINGS, V, cdt, current_op, register_lowering
from .pointwise_rules import pointwise
from .reduction_rules import reduction
from . import factory_rules, random_rules, view_rules, nn_rules, extern_rules, special_rules  # noqa: F401  (registration)

__all__ = ["LOWERINGS", "register_lowering", "pointwise", "reduction", "cdt", "current_op", "V", "ops"]
