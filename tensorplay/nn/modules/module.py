"""``Module``: the base class of every layer and model (chapter §4.1).

A module is a tree.  Each node owns three ordered registries, filled by plain attribute
assignment (``__setattr__``):

=================  ============================================================================
``_parameters``    ``Parameter`` values (learnable; returned by ``parameters()``), or ``None``
``_buffers``       plain tensors that are state but not learnable (BatchNorm's running mean),
                   registered with ``register_buffer``; non-persistent ones stay out of
                   ``state_dict``
``_modules``       child modules (``self.fc = Linear(...)``), or ``None``
=================  ============================================================================

Everything else is derived by walking the tree:

* ``named_parameters()`` / ``named_buffers()`` / ``named_modules()`` yield dotted names
  (``"encoder.0.weight"``) in registration order, each *object* once (a weight tied to two
  modules is yielded once, under its first name);
* ``state_dict()`` maps the same dotted names (every name, tied ones included, exactly as PyTorch
  does) to detached tensors sharing storage; ``load_state_dict`` copies values into the existing
  parameters in place and reports missing / unexpected keys and shape mismatches by name;
* ``to()`` / ``cuda()`` / ``float()`` ... move or cast the *storage* of each parameter (and its
  ``.grad``) but keep the ``Parameter`` objects, so an optimizer built before the move still
  holds the right tensors;
* ``train()`` / ``eval()`` set the ``training`` flag on the whole tree (Dropout and BatchNorm read it).

``module(*args)`` runs the forward pre-hooks, ``forward``, then the forward hooks.
"""
from __future__ import annotations

import collections
import itertools
from collections import OrderedDict
from typing import Iterator, Mapping

import torch

from ..._tensor import Tensor
from ...autograd.grad_mode import no_grad
from ..parameter import Buffer, Parameter

__all__ = ["Module", "RemovableHandle"]


class _IncompatibleKeys(collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])):
    def __repr__(self):
        if not self.missing_keys and not self.unexpected_keys:
            return "<All keys matched successfully>"
        return super().__repr__()

    __str__ = __repr__


class RemovableHandle:
    """Returned by ``register_*_hook``; ``handle.remove()`` unregisters the hook."""
    _ids = itertools.count()

    def __init__(self, registry: dict):
        self._registry = registry
        self.id = next(RemovableHandle._ids)

    def remove(self):
        self._registry.pop(self.id, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def _indent(text: str, n: int) -> str:
    """Indent every line but the first by ``n`` spaces (child reprs nest inside the parent's)."""
    lines = text.split("\n")
    if len(lines) == 1:
        return text
    return lines[0] + "\n" + "\n".join(" " * n + line for line in lines[1:])


def _as_torch(value):
    if isinstance(value, Tensor):
        return value._data
    if isinstance(value, torch.Tensor):
        return value.detach()
    return None


class Module:
    """Base class for all neural-network modules; subclasses define ``forward``."""

    training: bool

    def __init__(self, *args, **kwargs):
        if args or kwargs:
            raise TypeError(f"{type(self).__name__}.__init__() got unexpected arguments: "
                            f"{args!r} {kwargs!r}")
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = {}
        d["_buffers"] = {}
        d["_non_persistent_buffers_set"] = set()
        d["_modules"] = {}
        d["_forward_hooks"] = OrderedDict()
        d["_forward_pre_hooks"] = OrderedDict()

    # ---- forward -----------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        raise NotImplementedError(f'Module [{type(self).__name__}] is missing the required "forward" function')

    def __call__(self, *args, **kwargs):
        if not self._forward_pre_hooks and not self._forward_hooks:
            return self.forward(*args, **kwargs)
        for hook in list(self._forward_pre_hooks.values()):
            r = hook(self, args)
            if r is not None:
                args = r if isinstance(r, tuple) else (r,)
        out = self.forward(*args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            r = hook(self, args, out)
            if r is not None:
                out = r
        return out

    def register_forward_pre_hook(self, hook, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, args) -> None or new args``, run before ``forward``."""
        h = RemovableHandle(self._forward_pre_hooks)
        self._forward_pre_hooks[h.id] = hook
        if prepend:
            self._forward_pre_hooks.move_to_end(h.id, last=False)
        return h

    def register_forward_hook(self, hook, *, prepend: bool = False) -> RemovableHandle:
        """``hook(module, args, output) -> None or new output``, run after ``forward``."""
        h = RemovableHandle(self._forward_hooks)
        self._forward_hooks[h.id] = hook
        if prepend:
            self._forward_hooks.move_to_end(h.id, last=False)
        return h

    # ---- registration ------------------------------------------------------------------------
    def _check_init(self, what):
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"cannot assign {what} before Module.__init__() call "
                                 f"(call super().__init__() first in {type(self).__name__}.__init__)")

    def _check_name(self, name, kind):
        if not isinstance(name, str):
            raise TypeError(f"{kind} name should be a string, got {type(name).__name__}")
        if name == "":
            raise KeyError(f'{kind} name can\'t be empty string ""')
        if "." in name:
            raise KeyError(f'{kind} name can\'t contain ".", got: {name}')

    def register_parameter(self, name: str, param) -> None:
        """Register ``param`` (a ``Parameter`` or ``None``) under ``name``."""
        self._check_init("parameters")
        self._check_name(name, "parameter")
        if hasattr(self, name) and name not in self._parameters:
            raise KeyError(f"attribute '{name}' already exists")
        if param is not None and not isinstance(param, Parameter):
            raise TypeError(f"cannot assign '{type(param).__module__}.{type(param).__name__}' object to "
                            f"parameter '{name}' (tp.nn.Parameter or None required)")
        if param is not None and param.grad_fn is not None:
            raise ValueError(f"Cannot assign non-leaf Tensor to parameter '{name}'. Model parameters must be "
                             f"created explicitly; to express '{name}' as a function of another Tensor, compute "
                             f"the value in the forward() method.")
        self._parameters[name] = param

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Register a non-learnable tensor (or ``None``) as module state.  Persistent buffers are
        saved in ``state_dict``; all buffers move with ``to()``."""
        self._check_init("buffers")
        self._check_name(name, "buffer")
        if hasattr(self, name) and name not in self._buffers:
            raise KeyError(f"attribute '{name}' already exists")
        if tensor is not None and not isinstance(tensor, Tensor):
            raise TypeError(f"cannot assign '{type(tensor).__name__}' object to buffer '{name}' "
                            f"(tp.Tensor or None required)")
        if isinstance(tensor, (Parameter, Buffer)):
            from ..._tensor import _wrap
            tensor = _wrap(tensor._data)
        self._buffers[name] = tensor
        if persistent:
            self._non_persistent_buffers_set.discard(name)
        else:
            self._non_persistent_buffers_set.add(name)

    def add_module(self, name: str, module) -> None:
        """Register a child module (or ``None``) under ``name``."""
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        self._check_name(name, "module")
        if hasattr(self, name) and name not in self._modules:
            raise KeyError(f"attribute '{name}' already exists")
        self._modules[name] = module

    register_module = add_module

    def __setattr__(self, name, value):
        d = self.__dict__
        params = d.get("_parameters")

        def discard(*dicts):
            for dd in dicts:
                if name in dd:
                    del dd[name]
            d.pop(name, None)

        if isinstance(value, Parameter):
            self._check_init("parameters")
            discard(d["_buffers"], d["_modules"])
            d["_non_persistent_buffers_set"].discard(name)
            self.register_parameter(name, value)
        elif params is not None and name in params:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as parameter '{name}' "
                                f"(tp.nn.Parameter or None expected)")
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            self._check_init("child modules")
            discard(d["_parameters"], d["_buffers"])
            d["_non_persistent_buffers_set"].discard(name)
            d["_modules"][name] = value
        elif params is not None and name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign '{type(value).__name__}' as child module '{name}' "
                                f"(tp.nn.Module or None expected)")
            d["_modules"][name] = value
        elif isinstance(value, Buffer):
            self._check_init("buffers")
            discard(d["_parameters"], d["_modules"])
            self.register_buffer(name, value, persistent=value.persistent)
        elif params is not None and name in d["_buffers"]:
            if value is not None and not isinstance(value, Tensor):
                raise TypeError(f"cannot assign '{type(value).__name__}' as buffer '{name}' "
                                f"(tp.Tensor or None expected)")
            d["_buffers"][name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        # only called when normal lookup fails: look in the registries
        d = self.__dict__
        for reg in ("_parameters", "_buffers", "_modules"):
            r = d.get(reg)
            if r is not None and name in r:
                return r[name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name):
        for reg in ("_parameters", "_buffers", "_modules"):
            r = self.__dict__.get(reg)
            if r is not None and name in r:
                del r[name]
                self._non_persistent_buffers_set.discard(name)
                return
        object.__delattr__(self, name)

    def __dir__(self):
        keys = list(super().__dir__()) + list(self._parameters) + list(self._buffers) + list(self._modules)
        return sorted(k for k in set(keys) if not k[0].isdigit())

    # ---- traversal ---------------------------------------------------------------------------
    def named_modules(self, memo=None, prefix: str = "", remove_duplicate: bool = True):
        """Yield ``(dotted name, module)`` for this module and every descendant, pre-order."""
        if memo is None:
            memo = set()
        if remove_duplicate:
            if id(self) in memo:
                return
            memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is None:
                continue
            yield from m.named_modules(memo, prefix + ("." if prefix else "") + name, remove_duplicate)

    def modules(self) -> Iterator["Module"]:
        for _, m in self.named_modules():
            yield m

    def named_children(self):
        seen = set()
        for name, m in self._modules.items():
            if m is not None and id(m) not in seen:
                seen.add(id(m))
                yield name, m

    def children(self):
        for _, m in self.named_children():
            yield m

    def _named_members(self, registry, prefix, recurse, remove_duplicate):
        seen = set()
        mods = self.named_modules(prefix=prefix, remove_duplicate=remove_duplicate) if recurse else [(prefix, self)]
        for mprefix, m in mods:
            for name, v in getattr(m, registry).items():
                if v is None:
                    continue
                if remove_duplicate:
                    if id(v) in seen:
                        continue
                    seen.add(id(v))
                yield mprefix + ("." if mprefix else "") + name, v

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        """Yield ``(dotted name, Parameter)``; a parameter shared by several modules appears once."""
        return self._named_members("_parameters", prefix, recurse, remove_duplicate)

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True):
        return self._named_members("_buffers", prefix, recurse, remove_duplicate)

    def buffers(self, recurse: bool = True):
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> "Module":
        if target == "":
            return self
        mod = self
        for item in target.split("."):
            if item not in mod._modules or mod._modules[item] is None:
                raise AttributeError(f"{type(mod).__name__} has no submodule `{item}` (looking up '{target}')")
            mod = mod._modules[item]
        return mod

    def get_parameter(self, target: str) -> Parameter:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._parameters:
            raise AttributeError(f"{type(mod).__name__} has no parameter `{name}`")
        return mod._parameters[name]

    def get_buffer(self, target: str) -> Tensor:
        mod_path, _, name = target.rpartition(".")
        mod = self.get_submodule(mod_path)
        if name not in mod._buffers:
            raise AttributeError(f"{type(mod).__name__} has no buffer `{name}`")
        return mod._buffers[name]

    def apply(self, fn) -> "Module":
        """Call ``fn(m)`` on every descendant (children first) and on ``self``; returns ``self``."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- modes -------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        for m in self.children():
            m.train(mode)
        return self

    def eval(self) -> "Module":
        return self.train(False)

    def requires_grad_(self, requires_grad: bool = True) -> "Module":
        for p in self.parameters():
            p.requires_grad_(requires_grad)
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the ``.grad`` of every parameter: drop it (default) or fill it with zeros."""
        for p in self.parameters():
            _zero_grad(p, set_to_none)

    # ---- device / dtype ----------------------------------------------------------------------
    def _apply(self, fn) -> "Module":
        """Replace the storage of every parameter, gradient and buffer by ``fn(storage)`` (a
        torch tensor -> torch tensor map).  Parameter and buffer *objects* are kept."""
        done = set()
        for m in self.modules():
            for reg in (m._parameters, m._buffers):
                for t in reg.values():
                    if t is None or id(t) in done:
                        continue
                    done.add(id(t))
                    new = fn(t._data)
                    if new is not t._data:
                        t._data = new
                    g = t._grad
                    if g is not None:
                        ng = fn(g._data)
                        if ng is not g._data:
                            g._data = ng
        return self

    def to(self, *args, **kwargs) -> "Module":
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(tensor)``; dtype casts apply to
        floating-point (and complex) parameters and buffers only.  Returns ``self``."""
        device, dtype, non_blocking = _parse_to(args, kwargs)
        if dtype is not None and not (dtype.is_floating_point or dtype.is_complex):
            raise TypeError(f"nn.Module.to only accepts floating point or complex dtypes, but got desired "
                            f"dtype={dtype}")

        def convert(t):
            if dtype is not None and (t.is_floating_point() or t.is_complex()):
                return t.to(device=device, dtype=dtype, non_blocking=non_blocking)
            return t.to(device=device, non_blocking=non_blocking)
        return self._apply(convert)

    def cuda(self, device=None) -> "Module":
        if device is None:
            dev = torch.device("cuda")
        elif isinstance(device, int):
            dev = torch.device("cuda", device)
        else:
            dev = torch.device(device)
        return self.to(dev)

    def cpu(self) -> "Module":
        return self.to("cpu")

    def _cast_float(self, dtype):
        return self._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)

    def float(self) -> "Module":
        return self._cast_float(torch.float32)

    def double(self) -> "Module":
        return self._cast_float(torch.float64)

    def half(self) -> "Module":
        return self._cast_float(torch.float16)

    def bfloat16(self) -> "Module":
        return self._cast_float(torch.bfloat16)

    def type(self, dst_type) -> "Module":
        return self._apply(lambda t: t.to(dst_type))

    # ---- state dict --------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        for name, p in self._parameters.items():
            if p is not None:
                destination[prefix + name] = p if keep_vars else p.detach()
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent_buffers_set:
                destination[prefix + name] = b if keep_vars else b.detach()

    def state_dict(self, *args, destination=None, prefix: str = "", keep_vars: bool = False):
        """An ordered dict ``dotted name -> tensor`` of every parameter and persistent buffer.
        Values are detached tensors sharing storage with the module's (``keep_vars=True``: the
        objects themselves).  Keys are PyTorch's for the same architecture."""
        if args:  # positional (destination, prefix, keep_vars), as older PyTorch code passes them
            names = ("destination", "prefix", "keep_vars")
            vals = dict(zip(names, args))
            destination = vals.get("destination", destination)
            prefix = vals.get("prefix", prefix)
            keep_vars = vals.get("keep_vars", keep_vars)
        if destination is None:
            destination = OrderedDict()
        self._save_to_state_dict(destination, prefix, keep_vars)
        for name, m in self._modules.items():
            if m is not None:
                m.state_dict(destination=destination, prefix=prefix + name + ".", keep_vars=keep_vars)
        return destination

    def _load_from_state_dict(self, state_dict, prefix, strict, missing_keys, consumed, error_msgs, assign):
        """Copy this module's own entries (``prefix + name``) from ``state_dict``."""
        local = [(n, p, True) for n, p in self._parameters.items() if p is not None]
        local += [(n, b, False) for n, b in self._buffers.items()
                  if b is not None and n not in self._non_persistent_buffers_set]
        for name, cur, is_param in local:
            key = prefix + name
            if key not in state_dict:
                missing_keys.append(key)
                continue
            consumed.add(key)
            value = state_dict[key]
            src = _as_torch(value)
            if src is None:
                error_msgs.append(f'While copying the parameter named "{key}", expected a Tensor from the '
                                  f'checkpoint but received {type(value).__name__}')
                continue
            if tuple(src.shape) != tuple(cur.shape):
                error_msgs.append(f"size mismatch for {key}: copying a param with shape {list(src.shape)} from "
                                  f"checkpoint, the shape in current model is {list(cur.shape)}.")
                continue
            try:
                if assign:
                    if is_param:
                        setattr(self, name, Parameter(src.to(device=cur.device), requires_grad=cur.requires_grad))
                    else:
                        from ..._tensor import _wrap
                        self._buffers[name] = _wrap(src.to(device=cur.device))
                else:
                    with no_grad():
                        cur._data.copy_(src)
            except Exception as e:  # dtype that cannot be copied, etc.
                error_msgs.append(f'While copying the parameter named "{key}", whose dimensions in the model are '
                                  f'{list(cur.shape)} and whose dimensions in the checkpoint are '
                                  f'{list(src.shape)}, an exception occurred: {e}')

    def load_state_dict(self, state_dict: Mapping, strict: bool = True, assign: bool = False):
        """Copy parameters and buffers from ``state_dict`` (values: tp or torch tensors) into this
        module, in place.  With ``strict`` a missing or unexpected key is an error; a shape
        mismatch is always an error.  Returns ``(missing_keys, unexpected_keys)``."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"Expected state_dict to be dict-like, got {type(state_dict).__name__}.")
        missing, consumed, errors = [], set(), []

        def load(module, prefix):
            module._load_from_state_dict(state_dict, prefix, strict, missing, consumed, errors, assign)
            for name, child in module._modules.items():
                if child is not None:
                    load(child, prefix + name + ".")
        load(self, "")
        unexpected = [k for k in state_dict if k not in consumed]
        if strict:
            if unexpected:
                errors.insert(0, "Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in unexpected) + ". ")
            if missing:
                errors.insert(0, "Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in missing) + ". ")
        if errors:
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}:\n\t" + "\n\t".join(errors))
        return _IncompatibleKeys(missing, unexpected)

    # ---- printing ----------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside ``Name(...)`` before the children; layers override it."""
        return ""

    def _get_name(self) -> str:
        return type(self).__name__

    def __repr__(self):
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): " + _indent(repr(m), 2) for name, m in self._modules.items()]
        lines = extra_lines + child_lines
        s = self._get_name() + "("
        if lines:
            if len(extra_lines) == 1 and not child_lines:
                s += extra_lines[0]
            else:
                s += "\n  " + "\n  ".join(lines) + "\n"
        return s + ")"


def _zero_grad(p, set_to_none):
    g = p._grad
    if g is None:
        return
    if set_to_none:
        p._grad = None
    else:
        if g.grad_fn is not None:
            g = g.detach()
            p._grad = g
        g.requires_grad = False
        g._data.zero_()


def _parse_to(args, kwargs):
    device = kwargs.pop("device", None)
    dtype = kwargs.pop("dtype", None)
    non_blocking = kwargs.pop("non_blocking", False)
    kwargs.pop("memory_format", None)
    if kwargs:
        raise TypeError(f"to(): unexpected keyword arguments {sorted(kwargs)}")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = a
        elif isinstance(a, bool):
            non_blocking = a
        elif isinstance(a, int):
            device = torch.device("cuda", a)
        elif isinstance(a, (Tensor, torch.Tensor)):
            dtype, device = a.dtype, a.device
        else:
            raise TypeError(f"to() received an invalid argument {a!r}")
    if device is not None:
        device = torch.device(device)
    return device, dtype, non_blocking
