"""``tp.save`` / ``tp.load``: checkpoints of tensors in nested containers (chapter §4.4).

File format: a ``torch.save`` file (zip of tensor storages + a pickle) holding the plain structure
``{"__tensorplay__": 1, "tensors": [torch.Tensor, ...], "meta": [{"parameter": bool,
"requires_grad": bool}, ...], "obj": <the object with every tp.Tensor replaced by a reference
{"__tp_tensor__": index}>}``.  Because only dicts, lists, tuples, numbers, strings and torch tensors
appear in it, ``tp.load`` can use PyTorch's safe ``weights_only`` unpickler (the default): loading a
checkpoint cannot run arbitrary code.

Guarantees of a round trip ``tp.load(tp.save(obj))``:

* containers keep their type (dict, OrderedDict, list, tuple) and order; numbers, strings, None,
  dtypes and ``torch.Size`` are kept as they are;
* each tensor keeps dtype, shape, strides and values; a ``Parameter`` comes back as a ``Parameter``
  and ``requires_grad`` is restored;
* sharing is preserved: the same tensor object referenced twice comes back as one object, and
  distinct tensors sharing storage (tied weights in a ``state_dict``, views) still share storage.

Objects of other types (a whole ``Module``, custom classes) are pickled as they are; loading them
needs ``weights_only=False`` (only for files you trust).  ``tp.load`` also reads plain
``torch.save`` files, turning their torch tensors into tp tensors.

``safe_globals(objs)`` / ``add_safe_globals`` / ``get_safe_globals`` / ``clear_safe_globals`` are
PyTorch's allowlist of classes and functions the safe loader may rebuild (a whole saved module
needs its classes listed); inside ``safe_globals`` tensorplay's own tensor and parameter
reconstructors are allowed as well, so a listed module's tp parameters load.
"""
from __future__ import annotations

import contextlib
import pickle
from collections import OrderedDict

import torch

from ._tensor import Tensor, _wrap

__all__ = ["save", "load", "safe_globals", "add_safe_globals", "get_safe_globals", "clear_safe_globals"]

_MARK = "__tp_tensor__"
_MAGIC = "__tensorplay__"


def _pack(obj, tensors, meta, memo):
    if isinstance(obj, Tensor):
        i = memo.get(id(obj))
        if i is None:
            from .nn.parameter import Parameter
            i = len(tensors)
            memo[id(obj)] = i
            tensors.append(obj._data.detach())
            meta.append({"parameter": isinstance(obj, Parameter), "requires_grad": bool(obj.requires_grad)})
        return {_MARK: i}
    t = type(obj)
    if t is dict or t is OrderedDict:
        return t((k, _pack(v, tensors, meta, memo)) for k, v in obj.items())
    if t is list:
        return [_pack(v, tensors, meta, memo) for v in obj]
    if t is tuple:
        return tuple(_pack(v, tensors, meta, memo) for v in obj)
    return obj


def save(obj, f, pickle_protocol: int = 2) -> None:
    """Write ``obj`` (tensors, state dicts, nested containers) to the path or file object ``f``."""
    tensors, meta = [], []
    packed = _pack(obj, tensors, meta, {})
    payload = {_MAGIC: 1, "tensors": tensors, "meta": meta, "obj": packed}
    torch.save(payload, f, pickle_protocol=pickle_protocol)


def _unpack(obj, objs):
    t = type(obj)
    if t is dict and len(obj) == 1 and _MARK in obj:
        return objs[obj[_MARK]]
    if t is dict or t is OrderedDict:
        return t((k, _unpack(v, objs)) for k, v in obj.items())
    if t is list:
        return [_unpack(v, objs) for v in obj]
    if t is tuple:
        return tuple(_unpack(v, objs) for v in obj)
    return obj


def _from_torch_file(obj, memo):
    """Plain torch checkpoint: torch tensors -> tp tensors (one tp object per torch object)."""
    if isinstance(obj, torch.Tensor):
        r = memo.get(id(obj))
        if r is None:
            if isinstance(obj, torch.nn.Parameter):
                from .nn.parameter import Parameter
                r = Parameter(obj.detach(), requires_grad=obj.requires_grad)
            else:
                r = _wrap(obj.detach())
            memo[id(obj)] = r
        return r
    t = type(obj)
    if t is dict or t is OrderedDict:
        return t((k, _from_torch_file(v, memo)) for k, v in obj.items())
    if t is list:
        return [_from_torch_file(v, memo) for v in obj]
    if t is tuple:
        return tuple(_from_torch_file(v, memo) for v in obj)
    return obj


def load(f, map_location=None, weights_only: bool = True):
    """Read an object written by :func:`save` (or by ``torch.save``) from a path or file object.
    ``map_location`` is passed to ``torch.load`` (e.g. ``"cpu"`` to load CUDA tensors on a CPU machine)."""
    try:
        payload = torch.load(f, map_location=map_location, weights_only=weights_only)
    except pickle.UnpicklingError as e:
        if weights_only:
            raise pickle.UnpicklingError(
                f"tp.load: the file contains objects other than tensors and plain containers, which the safe "
                f"loader refuses. If you trust the file, call tp.load(..., weights_only=False).\n{e}") from e
        raise
    if not (isinstance(payload, dict) and payload.get(_MAGIC) == 1):
        return _from_torch_file(payload, {})
    from .nn.parameter import Parameter
    objs = []
    for d, m in zip(payload["tensors"], payload["meta"]):
        if m["parameter"]:
            t = Parameter(d, requires_grad=m["requires_grad"])
        else:
            t = _wrap(d)
            if m["requires_grad"]:
                t.requires_grad_(True)
        objs.append(t)
    return _unpack(payload["obj"], objs)


def _tp_reconstructors():
    """The functions tp tensors and parameters pickle through (``Tensor.__reduce_ex__``)."""
    from ._tensor import _rebuild
    from .nn.parameter import _rebuild_parameter
    return [_rebuild, _rebuild_parameter]


@contextlib.contextmanager
def safe_globals(safe_globals):
    """Within the block the safe loader (``weights_only=True``) may rebuild ``safe_globals`` (classes,
    functions) and tp tensors/parameters; PyTorch's ``torch.serialization.safe_globals``."""
    with torch.serialization.safe_globals(list(safe_globals) + _tp_reconstructors()):
        yield


def add_safe_globals(safe_globals):
    """Allow ``safe_globals`` (and tp tensors/parameters) in every later safe load."""
    torch.serialization.add_safe_globals(list(safe_globals) + _tp_reconstructors())


get_safe_globals = torch.serialization.get_safe_globals
clear_safe_globals = torch.serialization.clear_safe_globals
