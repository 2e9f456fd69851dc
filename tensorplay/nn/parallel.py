"""``tp.nn.parallel``: ``DataParallel`` and ``DistributedDataParallel`` with PyTorch's signatures.

* ``DataParallel(module)`` runs the module as it is, on the device it lives on (one device: no
  scatter/gather); ``.module`` is the wrapped module, the forward equals the module's and
  ``state_dict`` keys carry PyTorch's ``module.`` prefix.
* ``DistributedDataParallel(module)`` needs an initialised ``torch.distributed`` process group (the
  default one or ``process_group``).  At construction it broadcasts the parameters and buffers of
  rank 0 to every rank; before each forward (``broadcast_buffers=True``) the buffers again.  Each
  parameter gets a gradient hook in tp's autograd: when its gradient of a backward pass is
  complete, the accumulated gradient (``.grad`` plus the new contribution) is divided by the world
  size and all-reduced, so after ``backward()`` every rank holds the average over ranks — the
  gradient of the mean loss over all ranks' data.  Inside ``no_sync()`` gradients accumulate locally
  and the next synchronised backward averages the accumulated sum.

Limits: every parameter must receive a gradient in every synchronised backward, in the same order
on every rank (``find_unused_parameters=True`` is refused, as a rank would wait forever on a
parameter another rank never reduces); the all-reduce is per parameter, not bucketed, and runs when
the hook fires (no overlap with the rest of the backward pass).
"""
from __future__ import annotations

import contextlib

from .._tensor import _wrap
from ..autograd.grad_mode import no_grad
from .modules.module import Module

__all__ = ["DataParallel", "DistributedDataParallel"]


class DataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim: int = 0):
        super().__init__()
        self.module = module
        self.device_ids = list(device_ids) if device_ids is not None else []
        self.output_device = output_device
        self.dim = dim

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)


def _dist():
    import torch.distributed as dist
    return dist


class DistributedDataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim: int = 0, broadcast_buffers: bool = True,
                 process_group=None, bucket_cap_mb=None, find_unused_parameters: bool = False,
                 check_reduction: bool = False, gradient_as_bucket_view: bool = False, static_graph: bool = False,
                 **kwargs):
        super().__init__()
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("tp.nn.parallel.DistributedDataParallel: the default process group has not been "
                               "initialized; call torch.distributed.init_process_group first")
        if find_unused_parameters:
            raise NotImplementedError("tp.nn.parallel.DistributedDataParallel: find_unused_parameters=True is not "
                                      "supported (every parameter must get a gradient in each backward)")
        self.module = module
        self.device_ids, self.output_device, self.dim = device_ids, output_device, dim
        self.broadcast_buffers = broadcast_buffers
        self.process_group = process_group
        self.world_size = dist.get_world_size(process_group)
        self.require_backward_grad_sync = True
        self._src = dist.get_global_rank(process_group, 0) if process_group is not None else 0
        self._params = [p for p in module.parameters() if p.requires_grad]
        with no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t._data, src=self._src, group=process_group)
        self._handles = [p.register_hook(self._make_hook(p)) for p in self._params]

    def _make_hook(self, p):
        def hook(g):
            if not self.require_backward_grad_sync:
                return None
            d = g._data if p._grad is None else p._grad._data + g._data
            d = d.div(self.world_size)
            _dist().all_reduce(d, group=self.process_group)
            p._grad = None       # the averaged total becomes .grad
            return _wrap(d)
        return hook

    @contextlib.contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) inside the block."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    def forward(self, *inputs, **kwargs):
        if self.broadcast_buffers and self.world_size > 1:
            with no_grad():
                for b in self.module.buffers():
                    _dist().broadcast(b._data, src=self._src, group=self.process_group)
        return self.module(*inputs, **kwargs)
