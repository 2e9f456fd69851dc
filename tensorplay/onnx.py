"""``tp.onnx``: the name PyTorch programs import (``import torch.onnx``).  Exporting a tensorplay
model to ONNX is not supported: :func:`export` raises, naming what to use instead."""
from __future__ import annotations

__all__ = ["export"]


def export(model, args, f=None, *a, **k):
    raise NotImplementedError("tp.onnx.export: exporting to ONNX is not supported by tensorplay; load the state_dict "
                              "into the same model written with torch.nn and export that with torch.onnx.export")
