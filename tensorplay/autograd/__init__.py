"""TPX autograd: reverse mode over an explicit node/edge graph, forward mode with dual numbers.

Read in this order: grad_mode.py (when ops record), graph.py (nodes, saved tensors, in-place),
engine.py (backward / grad), function.py (custom Functions), forward_ad.py (dual numbers),
gradcheck.py (finite differences).
"""
from . import forward_ad, grad_mode, graph
from .engine import backward, grad
from .function import Function, FunctionCtx, once_differentiable
from .gradcheck import GradcheckError, gradcheck, gradgradcheck
from .grad_mode import enable_grad, inference_mode, is_grad_enabled, no_grad, set_grad_enabled

__all__ = ["backward", "grad", "Function", "FunctionCtx", "once_differentiable", "gradcheck", "gradgradcheck",
           "GradcheckError", "no_grad", "enable_grad", "inference_mode", "set_grad_enabled", "is_grad_enabled",
           "forward_ad", "graph"]
