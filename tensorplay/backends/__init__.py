"""``tp.backends``: PyTorch's ``torch.backends`` flags (cudnn, cuda, mps, mkldnn, openmp).

tensorplay's eager kernels are ATen's, so these are torch's own modules: setting
``tp.backends.cudnn.benchmark`` sets the flag the convolutions read, and the availability queries
answer for the same build.  They are also importable as submodules
(``import tensorplay.backends.cudnn as cudnn``, as programs import ``torch.backends.cudnn``).
"""
import sys

from torch.backends import cuda, cudnn, mkldnn, mps, openmp  # noqa: F401

__all__ = ["cuda", "cudnn", "mkldnn", "mps", "openmp"]
for _name in __all__:
    sys.modules[f"{__name__}.{_name}"] = globals()[_name]
