"""``tp.backends``: PyTorch's ``torch.backends`` flags (cudnn, cuda, mps, mkldnn, openmp).

tensorplay's eager kernels are ATen's, so these are torch's own modules: setting
``tp.backends.cudnn.benchmark`` sets the flag the convolutions read, and the availability queries
answer for the same build.
"""
from torch.backends import cuda, cudnn, mkldnn, mps, openmp  # noqa: F401

__all__ = ["cuda", "cudnn", "mkldnn", "mps", "openmp"]
