"""``tp.Tensor``: our tensor class, holding a ``torch.Tensor`` as storage (chapter §1.1).

ATen (PyTorch's kernel library) is our eager kernel library; everything above the kernels —
op table, autograd, modules, the compiler — is TensorPlay's.  A ``tp.Tensor`` is *not* a
``torch.Tensor`` subclass: it owns one in ``_data`` and adds autograd metadata.

Guarantees:

* metadata (``shape``, ``dtype``, ``device``, ``stride()``, ``storage_offset()``) is that of
  ``_data``; ``from_torch`` / ``Tensor.torch()`` / DLPack / ``numpy()`` share memory (zero copy);
* ``_version`` is the storage tensor's version counter: shared by views, bumped by every in-place
  op, read by autograd (saved-tensor check) and by the compiler's first-level entry (§2.4);
* a *view* (output of a view op that aliases its input) knows its root ``_base`` and the chain of
  view ops that made it (``_view_src``).  ``grad_fn`` and ``requires_grad`` of a view follow the
  base's *current* history, as in PyTorch: when the shared version counter moved since the view's
  ``grad_fn`` was derived (an in-place op on the base or on any view of it), reading ``grad_fn``
  re-derives it from the base (:func:`tensorplay.autograd.graph.regenerate_view_grad_fn`); a view
  requires grad when its base does.  Non-views pay one attribute test for this;
* every method that computes something is generated from the op table
  (:mod:`tensorplay.ops`) and attached in ``tensorplay.ops.__init__``; this file holds only
  metadata, conversions and autograd entry points.
"""
from __future__ import annotations

import numpy as np
import torch

__all__ = ["Tensor", "from_torch", "from_numpy", "from_dlpack"]


class Tensor:
    # Class-level defaults keep construction to a single attribute store (see _wrap).
    _requires_grad = False  # the stored flag; ``requires_grad`` also consults a view's base
    _grad_fn = None         # the stored node; ``grad_fn`` re-derives a stale view's node first
    _output_nr = 0
    _grad = None
    _base = None           # for views: the root tensor whose storage this one views (never a view)
    _view_src = None       # for views: the chain ((op, other args, output index or None), ...) from _base
    _view_meta = None      # for views made in no_grad mode (must not be rebased): ("no_grad", view op name)
    _attr_version = None   # for views: the version at which grad_fn was last derived
    _identity_alias = False  # a view that torch would return as its (non-view) input itself
    _alias_src = None      # the view that torch would return itself instead of this identity alias
    _fw_grad = None        # forward-mode tangent (dual number part)
    _hooks = None
    _retains_grad = False
    _accumulate = None     # the AccumulateGrad node of a leaf
    _tp_name = None

    __array_priority__ = 1000  # so numpy scalars defer to our operators

    def __init__(self, *args, dtype=None, device=None, requires_grad=False, **kwargs):
        """``Tensor(data)`` wraps a tensor (sharing it) or converts data; the legacy forms
        ``Tensor(2, 3)``, ``Tensor([1, 2])``, ``Tensor()`` are PyTorch's (see ``ops/factories.py``)."""
        if "data" in kwargs:
            args = (kwargs.pop("data"),) + args
        if kwargs:
            raise TypeError(f"tp.Tensor: unexpected keyword arguments {sorted(kwargs)}")
        from .ops.factories import legacy_data
        explicit = dtype is not None or device is not None
        if dtype is None and not (len(args) == 1 and isinstance(args[0], (Tensor, torch.Tensor))):
            dtype = torch.get_default_dtype()
        d = legacy_data("Tensor", args, dtype, device, explicit)
        if d.requires_grad:
            d = d.detach()
        self._data = d
        if requires_grad:
            self.requires_grad_(True)

    # ---- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self._data.shape

    def size(self, dim=None):
        if dim is None:
            return self._data.shape
        return self._data.size(dim)

    @property
    def dtype(self):
        return self._data.dtype

    @property
    def device(self):
        return self._data.device

    @property
    def ndim(self) -> int:
        return self._data.dim()

    def dim(self) -> int:
        return self._data.dim()

    ndimension = dim

    def numel(self) -> int:
        return self._data.numel()

    nelement = numel

    def element_size(self) -> int:
        return self._data.element_size()

    @property
    def itemsize(self) -> int:
        return self._data.element_size()

    @property
    def nbytes(self) -> int:
        return self._data.nbytes

    def stride(self, dim=None):
        return self._data.stride() if dim is None else self._data.stride(dim)

    def storage_offset(self) -> int:
        return self._data.storage_offset()

    def is_contiguous(self, memory_format=torch.contiguous_format) -> bool:
        return self._data.is_contiguous(memory_format=memory_format)

    def data_ptr(self) -> int:
        return self._data.data_ptr()

    @property
    def is_cuda(self) -> bool:
        return self._data.is_cuda

    @property
    def is_cpu(self) -> bool:
        return self._data.is_cpu

    @property
    def is_xpu(self) -> bool:
        return self._data.is_xpu

    @property
    def is_mps(self) -> bool:
        return self._data.is_mps

    @property
    def is_meta(self) -> bool:
        return self._data.is_meta

    @property
    def layout(self):
        return self._data.layout

    @property
    def is_sparse(self) -> bool:
        return self._data.is_sparse

    @property
    def is_floating_point_(self):
        return self._data.is_floating_point()

    def is_floating_point(self) -> bool:
        return self._data.is_floating_point()

    def is_complex(self) -> bool:
        return self._data.is_complex()

    def get_device(self) -> int:
        return self._data.get_device()

    @property
    def _version(self) -> int:
        return self._data._version

    @property
    def requires_grad(self) -> bool:
        """True for a tensor that records autograd history; a view requires grad when its base
        does (PyTorch: also a view made under ``no_grad``, which then acts as a leaf)."""
        if self._requires_grad:
            return True
        b = self._base
        return b is not None and (self._grad_fn is not None or b.requires_grad)

    @requires_grad.setter
    def requires_grad(self, value):
        self._requires_grad = value

    @property
    def grad_fn(self):
        """The backward node of this tensor (None for leaves).  For a view whose storage was
        modified in place since its node was made, the node is re-derived from the base's current
        history first, so backward through it sees the modification."""
        if self._base is None:
            return self._grad_fn
        return _view_grad_fn(self)

    @grad_fn.setter
    def grad_fn(self, fn):
        self._grad_fn = fn
        if self._base is not None:
            self._attr_version = self._data._version

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None

    @property
    def grad(self):
        return self._grad

    @grad.setter
    def grad(self, value):
        if value is not None:
            if not isinstance(value, Tensor):
                raise TypeError(f"Tensor.grad: expected a Tensor or None, got {type(value).__name__}")
            if value.shape != self.shape:
                raise RuntimeError(f"Tensor.grad: assigned grad has shape {list(value.shape)}, "
                                   f"but the tensor has shape {list(self.shape)}")
        self._grad = value

    @property
    def data(self) -> "Tensor":
        return _wrap(self._data)

    @data.setter
    def data(self, value):
        self._data = value._data if isinstance(value, Tensor) else torch.as_tensor(value)

    @property
    def _is_view(self) -> bool:
        return self._base is not None

    def _is_view_(self):
        return self._base is not None

    # ---- conversions ------------------------------------------------------------------------
    def torch(self) -> torch.Tensor:
        """The storage tensor itself (zero copy)."""
        return self._data

    def numpy(self, *, force: bool = False):
        if self.requires_grad and not force:
            raise RuntimeError("Tensor.numpy(): can't call numpy() on a Tensor that requires grad; "
                               "use tensor.detach().numpy()")
        d = self._data
        if force:
            d = d.detach().cpu()
            if d.dtype in (torch.bfloat16,):
                d = d.float()
        return d.numpy()

    def __array__(self, dtype=None, copy=None):
        a = self._data.detach().cpu().numpy()
        return a.astype(dtype) if dtype is not None else a

    def item(self):
        if self._data.numel() != 1:
            raise RuntimeError(f"Tensor.item(): a Tensor with {self._data.numel()} elements "
                               f"(shape {list(self.shape)}) cannot be converted to a Python scalar")
        return _read_value(self, "item", lambda d: d.item())

    def tolist(self):
        return self._data.tolist()

    def __dlpack__(self, *args, **kwargs):
        return self._data.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __bool__(self):
        if self._data.numel() != 1:
            raise RuntimeError(f"bool(Tensor): a Tensor with {self._data.numel()} elements (shape "
                               f"{list(self.shape)}) is ambiguous; use .any() or .all()")
        return _read_value(self, "bool", lambda d: bool(d))

    def __int__(self):
        return int(self.item())

    def __float__(self):
        return float(self.item())

    def __complex__(self):
        return complex(self.item())

    def __index__(self):
        if self._data.dtype.is_floating_point or self._data.numel() != 1:
            raise TypeError(f"only integer Tensors of a single element can be converted to an index "
                            f"(got {self._data.dtype} of shape {list(self.shape)})")
        return int(self._data.item())

    def __len__(self):
        if self._data.dim() == 0:
            raise TypeError("len() of a 0-d tensor")
        return self._data.shape[0]

    def __iter__(self):
        if self._data.dim() == 0:
            raise TypeError("iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __hash__(self):
        return id(self)

    def __contains__(self, element):
        return bool((self == element).any().item())

    def __reversed__(self):
        return self.flip(0)

    def __format__(self, spec):
        if self._data.dim() == 0:
            return self._data.item().__format__(spec)
        return object.__format__(self, spec)

    def __repr__(self):
        r = repr(self._data)
        if self.grad_fn is not None:
            r = r[:-1] + f", grad_fn=<{self.grad_fn.name()}>)"
        elif self.requires_grad:
            r = r[:-1] + ", requires_grad=True)"
        return r

    def __reduce_ex__(self, proto):
        return (_rebuild, (self._data.detach(), self.requires_grad))

    def __deepcopy__(self, memo):
        if not self.is_leaf:
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support "
                               "the deepcopy protocol")
        new = type(self).__new__(type(self))
        new._data = self._data.clone()
        if self.requires_grad:
            new._requires_grad = True
        if self._grad is not None:
            new._grad = self._grad.__deepcopy__(memo)
        for k, v in self.__dict__.items():   # the copy is a fresh leaf, not a view
            if k not in _NOT_DEEPCOPIED:
                new.__dict__[k] = v
        memo[id(self)] = new
        return new

    # ---- device / dtype moves ---------------------------------------------------------------
    def to(self, *args, **kwargs):
        """``to(dtype)``, ``to(device)``, ``to(device, dtype)``, ``to(other)``; returns ``self``
        when nothing changes and ``copy`` is False (PyTorch semantics)."""
        dtype = kwargs.pop("dtype", None)
        device = kwargs.pop("device", None)
        copy = kwargs.pop("copy", False)
        non_blocking = kwargs.pop("non_blocking", False)
        kwargs.pop("memory_format", None)
        if kwargs:
            raise TypeError(f"Tensor.to(): unexpected keyword arguments {sorted(kwargs)}")
        for a in args:
            if isinstance(a, torch.dtype):
                dtype = a
            elif isinstance(a, (str, torch.device)):
                device = torch.device(a)
            elif isinstance(a, Tensor):
                dtype, device = a.dtype, a.device
            elif isinstance(a, bool):
                non_blocking = a
            else:
                raise TypeError(f"Tensor.to(): cannot interpret argument {a!r}")
        if device is not None:
            device = torch.device(device)
            if device.type == "cuda" and device.index is None:
                device = torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
        same_dtype = dtype is None or dtype == self.dtype
        same_dev = device is None or device == self.device
        if same_dtype and same_dev and not copy:
            return self
        from .ops import _to_copy
        return _to_copy(self, dtype=dtype, device=device, non_blocking=non_blocking)

    def cuda(self, device=None, non_blocking=False):
        return self.to(torch.device("cuda" if device is None else (f"cuda:{device}" if isinstance(device, int) else device)),
                       non_blocking=non_blocking)

    def cpu(self):
        return self.to("cpu")

    def type(self, dtype=None, non_blocking=False, **kwargs):
        from .ops.factories import legacy_type
        return legacy_type(self, dtype)

    def float(self, memory_format=None):
        return self.to(torch.float32, memory_format=memory_format)

    def double(self, memory_format=None):
        return self.to(torch.float64, memory_format=memory_format)

    def half(self, memory_format=None):
        return self.to(torch.float16, memory_format=memory_format)

    def bfloat16(self, memory_format=None):
        return self.to(torch.bfloat16, memory_format=memory_format)

    def int(self, memory_format=None):
        return self.to(torch.int32, memory_format=memory_format)

    def long(self, memory_format=None):
        return self.to(torch.int64, memory_format=memory_format)

    def short(self, memory_format=None):
        return self.to(torch.int16, memory_format=memory_format)

    def char(self, memory_format=None):
        return self.to(torch.int8, memory_format=memory_format)

    def byte(self, memory_format=None):
        return self.to(torch.uint8, memory_format=memory_format)

    def bool(self, memory_format=None):
        return self.to(torch.bool, memory_format=memory_format)

    def type_as(self, other):
        return self.to(other.dtype)

    # ---- autograd entry points --------------------------------------------------------------
    def detach(self) -> "Tensor":
        """A new tensor sharing storage (and version counter), cut from the graph."""
        return _wrap(self._data)

    def detach_(self) -> "Tensor":
        if self._base is not None:
            raise RuntimeError(f"detach_(): can't detach a view ({str(self.dtype).replace('torch.', '')}"
                               f"{list(self.shape)}) in place (as in PyTorch); use detach()")
        self._grad_fn = None
        self._requires_grad = False
        self._output_nr = 0
        return self

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if not self.is_leaf:
            if requires_grad:
                return self
            raise RuntimeError("requires_grad_(False): you can only change requires_grad flags of leaf "
                               "tensors; use detach() for a non-leaf")
        if requires_grad and not (self._data.is_floating_point() or self._data.is_complex()):
            raise RuntimeError(f"requires_grad_(): only Tensors of floating point or complex dtype can "
                               f"require gradients (got {self.dtype})")
        self.requires_grad = bool(requires_grad)
        return self

    def retain_grad(self):
        if not self.requires_grad:
            raise RuntimeError("retain_grad(): can't retain_grad on a Tensor that has requires_grad=False")
        if self.is_leaf:
            return
        self._retains_grad = True
        from .autograd.graph import add_retain_hook
        add_retain_hook(self)

    @property
    def retains_grad(self) -> bool:
        return self._retains_grad

    def register_hook(self, hook):
        """``hook(grad) -> Tensor or None``: runs when the gradient w.r.t. this tensor is computed;
        a returned tensor replaces the gradient.  Returns a handle with ``remove()``."""
        if not self.requires_grad:
            raise RuntimeError("register_hook(): cannot register a hook on a tensor that doesn't require gradient")
        from .autograd.graph import register_tensor_hook
        return register_tensor_hook(self, hook)

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from .autograd.engine import backward
        backward(self, gradient, retain_graph=retain_graph, create_graph=create_graph, inputs=inputs)

    # ---- small conveniences that are not ops ------------------------------------------------
    def new_tensor(self, data, dtype=None, device=None, requires_grad=False):
        return Tensor(data, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def _new(self, fn, args, size, dtype, device, requires_grad):
        if size is not None:
            args = (size,)
        return fn(*args, dtype=dtype or self.dtype, device=device or self.device, requires_grad=requires_grad)

    def new_zeros(self, *args, size=None, dtype=None, device=None, requires_grad=False, layout=None,
                  pin_memory=False):
        from .ops import zeros
        return self._new(zeros, args, size, dtype, device, requires_grad)

    def new_ones(self, *args, size=None, dtype=None, device=None, requires_grad=False, layout=None,
                 pin_memory=False):
        from .ops import ones
        return self._new(ones, args, size, dtype, device, requires_grad)

    def new_empty(self, *args, size=None, dtype=None, device=None, requires_grad=False, layout=None,
                  pin_memory=False):
        from .ops import empty
        return self._new(empty, args, size, dtype, device, requires_grad)

    def new_full(self, size, fill_value, dtype=None, device=None, requires_grad=False, layout=None,
                 pin_memory=False):
        from .ops import full
        return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                    requires_grad=requires_grad)

    def dim_order(self):
        return self._data.dim_order()


_new = object.__new__

#: instance attributes that ``__deepcopy__`` does not carry over (autograd and view identity)
_NOT_DEEPCOPIED = frozenset({"_data", "_grad", "_requires_grad", "_accumulate", "_hooks", "_grad_fn", "_output_nr",
                             "_base", "_view_src", "_view_meta", "_attr_version", "_identity_alias",
                             "_alias_src", "_retains_grad"})

#: set by tensorplay.autograd.graph: ``view -> grad_fn`` re-derived from the base's current history
_regenerate_view_grad_fn = None


def _view_grad_fn(t):
    """``t.grad_fn`` for a view: the stored node while the version counter has not moved since
    it was derived; otherwise (if the base has history) the node re-derived from the base."""
    fn = t._grad_fn
    ver = t._data._version
    av = t._attr_version
    if av == ver:
        return fn
    if fn is None and not t._base.requires_grad:
        return None
    if av is None and fn is not None:  # node assigned before the view was marked (capture proxies)
        t._attr_version = ver
        return fn
    return _regenerate_view_grad_fn(t)


#: set by compiler/capture/tracer.py: (tensor, kind, convert) -> (gated, value); inside a capture a
#: Python read of a free tensor's value becomes a data gate instead of a constant baked silently
_value_read_hook = None


def _read_value(t, kind, convert):
    h = _value_read_hook
    if h is not None:
        gated, value = h(t, kind, convert)
        if gated:
            return value
    return convert(t._data)


def _wrap(d: torch.Tensor) -> Tensor:
    """Wrap a torch tensor without copying (the hot path: one attribute store)."""
    t = _new(Tensor)
    t._data = d
    return t


def _rebuild(data, requires_grad):
    t = _wrap(data)
    if requires_grad:
        t.requires_grad = True
    return t


def from_torch(t: torch.Tensor) -> Tensor:
    """Zero-copy: the tp.Tensor shares memory and version counter with ``t``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"tp.from_torch: expected a torch.Tensor, got {type(t).__name__}")
    return _wrap(t.detach())


def from_numpy(a) -> Tensor:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"tp.from_numpy: expected a numpy.ndarray, got {type(a).__name__}")
    return _wrap(torch.from_numpy(a))


def from_dlpack(obj) -> Tensor:
    if isinstance(obj, Tensor):
        obj = obj._data
    return _wrap(torch.from_dlpack(obj))
