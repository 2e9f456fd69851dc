"""The Triton interpreter's stand-in for ``libdevice`` (testing without a GPU).

Under ``TRITON_INTERPRET=1`` (how the Triton backend runs on CPU tensors) a kernel is executed by
Triton's interpreter on numpy arrays, which has no extern (libdevice) functions: a call of
``libdevice.tanh`` fails there.  The generated kernels call libdevice for what ``tl`` lacks
(tanh, expm1, log1p, fmod, pow, ...); the loader (runtime.py) gives an interpreted module this
``libdevice`` instead, whose functions compute the same function with torch on the interpreter's
arrays -- the kernel source stays the one a GPU compiles.

Guarantee: each function here takes and returns interpreter tensors of the argument's dtype and
computes what the libdevice function of that name computes (to the rounding of torch's CPU kernel).
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["libdevice"]

def _wrap(t: torch.Tensor, dtype):
    """An interpreter tensor of Triton dtype ``dtype`` holding ``t``'s values."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle
    data = np.ascontiguousarray(t.numpy())
    ty = tl.block_type(dtype, list(data.shape)) if data.shape else dtype
    return tl.core.tensor(TensorHandle(data, dtype), ty)


def _torch(x):
    return torch.from_numpy(np.asarray(x.handle.data))


class _Libdevice:
    """``libdevice.<name>(*args)``: torch's function of that name (``torch.special``'s, or the one
    :data:`_RENAMED` names) on the interpreter's arrays, broadcast, in the first argument's dtype
    (a predicate's: int1)."""

    _RENAMED = {"rint": "round", "nearbyint": "round"}     # (torch.round rounds half to even, as rint)

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        torch_name = self._RENAMED.get(name, name)
        f = getattr(torch, torch_name, None) or getattr(torch.special, torch_name)

        def fn(*xs, **_):
            import triton.language as tl
            r = f(*torch.broadcast_tensors(*[_torch(x) for x in xs]))
            return _wrap(r, tl.int1 if r.dtype == torch.bool else xs[0].dtype)
        fn.__name__ = name
        return fn


libdevice = _Libdevice()
