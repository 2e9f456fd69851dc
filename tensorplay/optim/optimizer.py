"""``Optimizer``: the base class of the update rules in ``tp.optim`` (chapter §4.2).

An optimizer holds *parameter groups*: a list of dicts, each with a ``"params"`` list and its own
hyper-parameters (``lr``, ``weight_decay``, ...); options missing from a group take the defaults
given to the constructor.  Per-parameter state (momentum buffers, Adam moments, step counts) lives
in ``optimizer.state[param]``.

Guarantees:

* a parameter may belong to one group only (adding it twice is an error);
* ``step()`` runs without recording autograd and updates parameters in place (their storage),
  so the ``Parameter`` objects a model holds are the ones that change;
* ``state_dict()`` has PyTorch's layout — ``{"state": {index: {...}}, "param_groups": [{..., "params":
  [indices]}]}``, parameters numbered in group order — and ``load_state_dict`` restores it onto a fresh
  optimizer over the same parameters (state tensors are cast to each parameter's device, and dtype
  for floating-point state other than ``step``); it also accepts a ``torch.optim`` state dict;
* ``zero_grad(set_to_none=True)`` drops gradients (``False``: fills them with zeros).
"""
from __future__ import annotations

import copy
import functools
from collections import defaultdict
from itertools import chain

import torch

from .._tensor import Tensor, _wrap
from ..autograd.grad_mode import enable_grad
from ..profiler import recorder as _profiler

__all__ = ["Optimizer", "required"]


class _Required:
    def __repr__(self):
        return "<required parameter>"


required = _Required()


def _profiled_step(step):
    """``step`` recorded as an ``optimizer`` span by a running profile (its state tensors marked
    ``optimizer state``); a global read and a call otherwise."""
    @functools.wraps(step)
    def profiled(self, *args, **kwargs):
        rec = _profiler.active()
        if rec is None or self.__dict__.get("_tp_profiling_step"):
            return step(self, *args, **kwargs)
        self._tp_profiling_step = True
        try:
            with _profiler.span(f"Optimizer.step#{type(self).__name__}.step", "optimizer"):
                out = step(self, *args, **kwargs)
        finally:
            self._tp_profiling_step = False
        for v in self._state_tensors():
            rec.mark(v, "optimizer state")
        return out
    return profiled


class Optimizer:
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "step" in cls.__dict__:
            cls.step = _profiled_step(cls.__dict__["step"])

    def __init__(self, params, defaults: dict):
        self.defaults = defaults
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict] = []
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of Tensors or dicts, "
                            f"but got {type(params).__name__}")
        groups = list(params)
        if len(groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for g in groups:
            self.add_param_group(g)

    # ---- groups ------------------------------------------------------------------------------
    def _state_tensors(self):
        """The tensors of the per-parameter state (moments, momentum buffers, step counts held as
        tensors): what the profiler's memory timeline calls optimizer state."""
        for st in self.state.values():
            for v in st.values():
                if isinstance(v, (Tensor, torch.Tensor)):
                    yield v

    def add_param_group(self, param_group: dict) -> None:
        """Add a group (``{"params": [...], option: value}``); unspecified options take the defaults."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, but the ordering "
                            "of tensors in sets will change between runs. Please use a list instead.")
        else:
            params = list(params)
        names = None
        if params and isinstance(params[0], tuple):  # named parameters: [(name, p), ...]
            names = [n for n, _ in params]
            params = [p for _, p in params]
        for p in params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        group = dict(param_group)
        group["params"] = params
        if names is not None:
            group["param_names"] = names
        for k, v in self.defaults.items():
            if v is required and k not in group:
                raise ValueError(f"parameter group didn't specify a value of required optimization parameter {k}")
            group.setdefault(k, v)
        ids = [id(p) for p in params]
        if len(set(ids)) != len(ids):
            import warnings
            warnings.warn("optimizer contains a parameter group with duplicate parameters; in future, this will "
                          "cause an error", stacklevel=3)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if seen & set(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    # ---- gradients ---------------------------------------------------------------------------
    def zero_grad(self, set_to_none: bool = True) -> None:
        from ..nn.modules.module import _zero_grad
        for g in self.param_groups:
            for p in g["params"]:
                _zero_grad(p, set_to_none)

    def step(self, closure=None):
        raise NotImplementedError

    def _closure(self, closure):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    # ---- state dict --------------------------------------------------------------------------
    def state_dict(self) -> dict:
        index, groups, start = {}, [], 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            for i, p in enumerate(g["params"], start):
                index.setdefault(id(p), i)
            packed["params"] = [index[id(p)] for p in g["params"]]
            start += len(packed["params"])
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = copy.copy(state_dict)
        groups = self.param_groups
        saved = state_dict["param_groups"]
        if len(groups) != len(saved):
            raise ValueError(f"loaded state dict has a different number of parameter groups ({len(saved)}) than "
                             f"the optimizer ({len(groups)})")
        for i, (g, s) in enumerate(zip(groups, saved)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(f"loaded state dict contains a parameter group ({i}) that doesn't match the size "
                                 f"of optimizer's group: {len(s['params'])} vs {len(g['params'])} parameters")
        id_map = dict(zip(chain.from_iterable(s["params"] for s in saved),
                          chain.from_iterable(g["params"] for g in groups)))

        def cast(param, value, key):
            if isinstance(value, (Tensor, torch.Tensor)):
                d = value._data if isinstance(value, Tensor) else value.detach()
                if key == "step":
                    return _wrap(d.clone())
                if d.is_floating_point():
                    d = d.to(dtype=param.dtype, device=param.device)
                else:
                    d = d.to(device=param.device)
                return _wrap(d.clone())
            if isinstance(value, dict):
                return {k: cast(param, v, k) for k, v in value.items()}
            return copy.deepcopy(value)

        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                p = id_map[k]
                state[p] = cast(p, v, None)
            else:
                state[k] = v
        new_groups = []
        for g, s in zip(groups, saved):
            ng = {k: copy.deepcopy(v) for k, v in s.items() if k != "params"}
            ng["params"] = g["params"]
            new_groups.append(ng)
        self.state = state
        self.param_groups = new_groups

    def __getstate__(self):
        return {"defaults": self.defaults, "state": self.state, "param_groups": self.param_groups}

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        s = type(self).__name__ + " ("
        for i, g in enumerate(self.param_groups):
            s += f"\nParameter Group {i}"
            for k in sorted(g):
                if k != "params":
                    s += f"\n    {k}: {g[k]}"
        return s + "\n)"


def _state_step(state, device):
    """The ``step`` counter, a float32 0-d tensor as in PyTorch; incremented, returned as a float."""
    t = state.get("step")
    if t is None:
        t = _wrap(torch.tensor(0.0, dtype=torch.float32))
        state["step"] = t
    t._data += 1
    return t._data.item()
