"""Library-kernel lowering rules (chapter §6.2, §8): ops Stax hands to ATen.

Matrix products, convolutions, sorts and selections, scans (found by the op table's tags
``linalg``, ``conv``, ``sort``, ``scan``), ops with no loop-level form (tag ``extern``), scatters,
fused attention and (bi)linear resampling are extern kernels: the wrapper calls the op's ATen
kernel on realized buffers, and the values around them still fuse into Stax kernels.  A
batched-matmul operand whose batch dims do not merge is copied densely by a Stax kernel first (ATen
would copy it anyway).
"""
from __future__ import annotations

from .....ops.registry import OPS
from .registry import LOWERINGS, V, register_lowering


# ---- extern kernels -------------------------------------------------------------------------------------
def _extern(*args):
    return V.graph.extern("library kernel (ATen)")


def _batch_collapsible(layout) -> bool:
    """Can a batched matmul view this operand as (batch, m, n) without a copy?  Its batch dims must
    merge into one stride (size-1 dims ignored)."""
    dims = [(n, s) for n, s in zip(layout.size[:-2], layout.stride[:-2]) if n != 1]
    return all(s0 == s1 * n1 for (_, s0), (n1, s1) in zip(dims, dims[1:]))


def _bmm_operand(r):
    """A batched-matmul operand whose batch dims do not merge (a head view of a fused qkv
    projection: (B, H, T, D) with strides (T*3C, D, 3C, 1)) is copied densely by a Stax kernel
    (GraphLowering.batched_matrix_copy): ATen would copy it anyway, in a parallel region of its own."""
    lay = getattr(r, "layout", None)
    if lay is None or len(lay.size) < 3 or _batch_collapsible(lay):
        return r
    return V.graph.batched_matrix_copy(r)


@register_lowering("matmul", "bmm")
def _extern_bmm(*args):
    return V.graph.extern("library kernel (ATen)", prepare=_bmm_operand)


# matrix products (tag linalg), convolutions (conv), the ops computed by sorting or selection
# (sort: sort, topk, kthvalue, median, mode, unique -- unique's output shape is a data gate of
# capture), scans (scan: cumsum, cummax, ...) and the ops tagged extern: library kernels
for _op in OPS.values():
    if _op.tags & {"linalg", "conv", "sort", "scan", "extern"} and not _op.is_inplace and _op.name not in LOWERINGS:
        register_lowering(_op.name)(_extern)

# the rest of the indexing family: scatters (their consumers still fuse into the next kernel) and
# masked_select (its output shape is a data gate of capture)
register_lowering("scatter", "scatter_add", "index_add", "index_put", "_scatter_view", "_index_backward",
                  "masked_select", "_masked_select_backward", "_storage_remap")(_extern)
# library kernels with no loop-level form here: fused attention, and the scatter-adds of the
# embedding and max-pooling backward ops
register_lowering("scaled_dot_product_attention", "_sdpa_backward", "_sdpa_fused_backward", "embedding_dense_backward",
                  "max_pool2d_with_indices_backward",
                  "adaptive_max_pool2d_backward")(_extern)
# linear/bilinear resampling: ATen computes each dim's source rows and weights once and runs a
# separable loop; a kernel here reading them per element, exact to eager's rounding, ran 2.4x
# slower (its rows are lane-wise gathers; docs/stax.md)
register_lowering("upsample_linear1d", "upsample_bilinear2d", "upsample_linear1d_backward",
                  "upsample_bilinear2d_backward")(_extern)
