"""Locating the layer that breaks semantics (chapter §11.4, algorithm 11.1).

The backends form a chain of prefixes of the full pipeline:

    eager       capture + front-end passes, then the graph op by op
    aot_eager   + AOT autograd and partitioning, op by op   (training regions)
    stax        + lowering, scheduling, code generation: native kernels

``locate_error(fn, *args)`` runs ``fn`` in plain eager mode, then compiled with each prefix in
order, and reports the first whose results differ from eager (beyond the error model's
tolerance): the bug lies in the layer that prefix added.
"""
from __future__ import annotations

import dataclasses

import torch

from ..._tensor import Tensor

__all__ = ["locate_error", "LocateResult", "PREFIXES"]

PREFIXES = ("eager", "aot_eager", "stax")


@dataclasses.dataclass
class LocateResult:
    first_bad: str | None          # the first backend whose results differ, or None
    details: dict                  # backend -> "ok" / description of the difference / error

    def __str__(self):
        lines = [f"  {k}: {v}" for k, v in self.details.items()]
        head = "no layer breaks semantics" if self.first_bad is None else \
            f"first layer that breaks semantics: {self.first_bad}"
        return head + "\n" + "\n".join(lines)


def _flat(x):
    if isinstance(x, (tuple, list)):
        out = []
        for v in x:
            out += _flat(v)
        return out
    if isinstance(x, dict):
        return _flat(list(x.values()))
    return [x]


def _differs(a, b, rtol, atol):
    fa, fb = _flat(a), _flat(b)
    if len(fa) != len(fb):
        return f"{len(fa)} outputs vs {len(fb)}"
    for i, (x, y) in enumerate(zip(fa, fb)):
        if isinstance(x, Tensor) != isinstance(y, Tensor):
            return f"output {i}: type {type(x).__name__} vs {type(y).__name__}"
        if not isinstance(x, Tensor):
            if x != y:
                return f"output {i}: {x!r} vs {y!r}"
            continue
        tx, ty = x._data, y._data
        if tx.shape != ty.shape or tx.dtype != ty.dtype:
            return f"output {i}: {tx.dtype}{list(tx.shape)} vs {ty.dtype}{list(ty.shape)}"
        if tx.is_floating_point():
            if not torch.allclose(tx, ty, rtol=rtol, atol=atol, equal_nan=True):
                return f"output {i}: max abs difference {(tx - ty).abs().nan_to_num().max().item():.3g}"
        elif not torch.equal(tx, ty):
            return f"output {i}: values differ"
    return None


def locate_error(fn, *args, rtol=1e-4, atol=1e-5, prefixes=PREFIXES, **kwargs) -> LocateResult:
    from ..api import compile as tp_compile
    ref = fn(*args, **kwargs)
    details = {}
    first = None
    for name in prefixes:
        try:
            cf = tp_compile(fn, backend=name)
            cf(*args, **kwargs)             # capture run
            out = cf(*args, **kwargs)       # the compiled artifact
            why = _differs(out, ref, rtol, atol)
        except Exception as e:  # noqa: BLE001 - a crash is a semantic failure of that layer
            why = f"raised {type(e).__name__}: {e}"
        details[name] = why or "ok"
        if why and first is None:
            first = name
    return LocateResult(first, details)
