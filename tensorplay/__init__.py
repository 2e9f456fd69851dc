"""TensorPlay: a learner-friendly deep-learning framework whose heart is the Stax compiler.

Read in this order: ``_tensor.py`` (the Tensor), ``ops/`` (the op table and the eager dispatcher),
``autograd/`` (TPX reverse and forward mode), ``nn/``, ``optim/``, ``utils/data``; then
``compiler/`` (Stax).
"""
from __future__ import annotations

import torch as _torch

from ._tensor import Tensor, from_dlpack, from_numpy, from_torch
from . import autograd
from .autograd import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled
from . import ops
from . import func, testing
from . import compiler
from .compiler import compile, config
from .compiler.capture.declare import check, mark_dynamic
config.watch("log.ops", ops.registry.log_ops)   # TP_LOG_OPS=1 / config.patch: the eager op log
from .ops import *  # noqa: F401,F403  (free functions generated from the op table)

# dtypes and devices are ATen's (our kernels are ATen's); re-exported under tp.
float16 = half = _torch.float16
bfloat16 = _torch.bfloat16
float32 = float = _torch.float32
float64 = double = _torch.float64
complex64 = _torch.complex64
int8 = _torch.int8
int16 = short = _torch.int16
int32 = int = _torch.int32
int64 = long = _torch.int64
uint8 = _torch.uint8
bool = _torch.bool
dtype = _torch.dtype
device = _torch.device
Size = _torch.Size
layout = _torch.layout
strided = _torch.strided
sparse_coo = _torch.sparse_coo
finfo = _torch.finfo
iinfo = _torch.iinfo
get_default_dtype = _torch.get_default_dtype
set_default_dtype = _torch.set_default_dtype


def is_tensor(obj) -> "bool":
    return isinstance(obj, Tensor)


def cuda_is_available() -> "bool":
    return _torch.cuda.is_available()


class cuda:  # minimal namespace: tp.cuda.is_available(), tp.cuda.synchronize()
    is_available = staticmethod(_torch.cuda.is_available)
    synchronize = staticmethod(_torch.cuda.synchronize)
    device_count = staticmethod(_torch.cuda.device_count)
    manual_seed = staticmethod(_torch.cuda.manual_seed)
    manual_seed_all = staticmethod(_torch.cuda.manual_seed_all)


class accelerator:  # minimal namespace: torch.accelerator's queries (programs pick their device with it)
    is_available = staticmethod(_torch.accelerator.is_available)
    current_accelerator = staticmethod(_torch.accelerator.current_accelerator)
    device_count = staticmethod(_torch.accelerator.device_count)


def set_num_threads(n: "int"):
    _torch.set_num_threads(n)


def get_num_threads() -> "int":
    return _torch.get_num_threads()


__version__ = "0.1.0"

# nn / optim / data / checkpoints (imported last: they build on everything above)
from . import nn, optim, profiler, utils, special, distributions, random  # noqa: E402
from .serialization import load, save  # noqa: E402
from . import fft, linalg  # noqa: E402
from . import backends, onnx  # noqa: E402,F401  (torch.backends flags; the onnx name programs import)
from . import sparse  # noqa: E402,F401  (tp.sparse.mm / sum / softmax of COO tensors)
for _name, _fn in linalg.LEGACY.items():   # tp.svd / tp.qr / tp.matrix_power and their methods
    globals()[_name] = _fn
    setattr(Tensor, _name, _fn)


def __getattr__(name):
    # tp.distributed is imported on first use: it adds its collectives to the op table
    if name == "distributed":
        import importlib
        return importlib.import_module(".distributed", __name__)
    raise AttributeError(f"module 'tensorplay' has no attribute {name!r}")
