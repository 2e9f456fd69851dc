"""Grad mode: whether eager ops record autograd nodes (chapter §5.1).

``no_grad`` / ``enable_grad`` / ``set_grad_enabled`` / ``inference_mode`` are context managers and
decorators.  ``inference_mode`` is ``no_grad`` here (TensorPlay has no separate inference tensors);
it is kept for PyTorch compatibility.  The state is process-global (not per thread), which is what
a single-threaded training loop needs; documented in docs/autograd.md.
"""
from __future__ import annotations

import functools

__all__ = ["no_grad", "enable_grad", "set_grad_enabled", "inference_mode", "is_grad_enabled"]


class _State:
    __slots__ = ("enabled",)

    def __init__(self):
        self.enabled = True


class _FwState:
    __slots__ = ("level",)

    def __init__(self):
        self.level = 0


_state = _State()
_fw_state = _FwState()


def is_grad_enabled() -> bool:
    return _state.enabled


class _GradModeCtx:
    _target = True

    def __enter__(self):
        self._prev = _state.enabled
        _state.enabled = self._target
        return self

    def __exit__(self, *exc):
        _state.enabled = self._prev
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with self.__class__():
                return fn(*args, **kwargs)
        return wrapper


class no_grad(_GradModeCtx):
    """Ops run inside record no autograd history."""
    _target = False


class enable_grad(_GradModeCtx):
    _target = True


class inference_mode(_GradModeCtx):
    _target = False

    def __init__(self, mode: bool = True):
        self._target = not mode

    def __call__(self, fn):
        mode = not self._target

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with inference_mode(mode):
                return fn(*args, **kwargs)
        return wrapper


class set_grad_enabled(_GradModeCtx):
    def __init__(self, mode: bool):
        self._target = bool(mode)
        self._prev = _state.enabled
        _state.enabled = self._target  # takes effect as a function call too, like torch

    def __enter__(self):
        return self

    def __call__(self, fn):
        _state.enabled = self._prev
        mode = self._target

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)
        return wrapper
