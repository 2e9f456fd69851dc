"""Stax's GPU device backend: Triton kernels from the same plans (the chapter, §9).

Read in pipeline order:

  plan.py         the GPU's decisions for a KernelPlan: kernel kind (pointwise / persistent or
                  looped reduction), XBLOCK, RBLOCK, num_warps, num_stages (named heuristics)
  ops.py          TritonHandler: ``ops`` calls printed as Triton (masks, dtypes, Philox)
  kernel.py       a plan printed as one ``@triton.jit`` function (reductions, their combines)
  backend.py      TritonBackend: the device seam's answers (render, kernel definitions, launchers)
  runtime.py      loading a kernel from the cache, Triton's artefact cache under TP_CACHE_DIR
  interpret.py    libdevice for Triton's interpreter (the backend on CPU tensors, for tests)

Registered for ``"cuda"`` (the default there) and for ``"cpu"`` under the name ``"triton"``:
``tp.compile(fn, options={"stax.kernel_backend": "triton"})`` runs CPU tensors through the same
kernels in Triton's interpreter (what ``TRITON_INTERPRET=1`` does; switched on for these kernels).
Importing this package does not import Triton; loading a kernel does.
"""
from ..device import register_device_backend
from .backend import TritonBackend

__all__ = ["TritonBackend"]

register_device_backend("cuda", TritonBackend(), name="triton")
register_device_backend("cpu", TritonBackend(interpret=True), name="triton")
