"""The ``eager`` backend: run the captured graph op by op (chapter §11.4).

Two paths, chosen from the example inputs (grad mode and ``requires_grad`` are in the
specialization key, so the choice is fixed per artifact):

* **autograd path** — the GraphModule itself: each line calls the op through the eager dispatcher
  (``OpDef.__call__``), which records autograd history; used when grad mode is on and some input
  requires grad;
* **raw path** — a second generated function that unwraps the inputs once and calls each op's ATen
  kernel directly on torch tensors, wrapping only the outputs; no per-op dispatch overhead.  This is
  what makes the compiled call cheaper than tp eager even without Stax.

``"aot_eager"`` (:func:`aot_eager_backend`) adds AOT autograd and partitioning for training regions
(docs/aot.md) and runs the forward and backward graphs on the raw path.
"""
from __future__ import annotations

import operator

import torch

from ..._tensor import Tensor, _wrap
from ...autograd import grad_mode
from ..graph.node import _fmt_arg, generators
from .registry import register_backend

__all__ = ["eager_backend", "raw_function", "aot_eager_backend"]


def raw_function(gm, device=None):
    """Generate ``def raw(x, w): return (K_add(x, w, 1), ...)`` over torch tensors.

    ``device``: the one device of the example inputs; Python scalars are hoisted into 0-d constants
    there (None — no tensor inputs or several devices — keeps them as Python numbers)."""
    g = gm.graph
    ns = {"operator": operator, "torch": torch, "_wrap": _wrap, "Tensor": Tensor, "generators": generators}
    params = [n.name for n in g.placeholders]
    lines = [f"def raw({', '.join(params)}):"]
    for p in params:
        lines.append(f"    {p} = {p}._data")
    lines += g.size_bindings()
    for n in g.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            outs = n.args[0]
            lines.append("    return (" + "".join(f"_wrap({_fmt_arg(o)}), " for o in outs) + ")")
            continue
        if n.op == "get_attr":
            val = getattr(gm, n.target)
            ns[f"A_{n.name}"] = val._data if isinstance(val, Tensor) else val
            lines.append(f"    {n.name} = A_{n.name}")
            continue
        d = n.opdef
        if d is None:
            kname = f"F_{n.name}"
            ns[kname] = n.target
        else:
            kname = f"K_{d.name}"
            ns[kname] = d.eager
        args = ", ".join(_fmt_arg(a) for a in _hoist_scalars(n, ns, device))
        lines.append(f"    {n.name} = {kname}({args})")
        lines += g.size_bindings(after=n)
    src = "\n".join(lines) + "\n"
    exec(compile(src, "<tp raw graph>", "exec"), ns)
    fn = ns["raw"]
    fn.source = src
    return fn


_EXACT_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)


def _hoist_scalars(n, ns, device):
    """Python-number operands of pointwise arithmetic become 0-d constant tensors made once here.

    ATen wraps a Python scalar into a tensor on every call (~1.5 µs on the dev machine); a
    prebuilt 0-d tensor of the op's result dtype gives the same result when the number is exactly
    representable in that dtype (the scalar is converted to that dtype inside the kernel anyway),
    so only then is it hoisted; comparisons, bool and half types keep the Python number."""
    d = n.opdef
    args = list(n.args)
    val = n.meta.get("val")
    if device is None or d is None or "pointwise" not in d.tags or d.is_inplace or "comparison" in d.tags or \
            getattr(val, "dtype", None) not in _EXACT_DTYPES:
        return args
    for i in d.schema.tensor_pos:
        v = args[i]
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            t = torch.tensor(v, dtype=val.dtype, device=device)
            if t.item() != v or (isinstance(v, float) and val.dtype in (torch.int32, torch.int64)):
                continue
            name = f"S_{n.name}_{i}"
            ns[name] = t
            args[i] = _Raw(name)
    return args


class _Raw:
    """An argument printed verbatim in generated code."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def eager_backend(gm, example_inputs, **kwargs):
    needs_autograd = grad_mode.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in example_inputs)
    if needs_autograd:
        def run(*args):
            return gm._forward(gm, *args)
        run.source = gm.code
        return run
    return raw_function(gm, _one_device(example_inputs))


def _one_device(example_inputs):
    """The device of the tensor inputs when there is exactly one, else None."""
    devices = {t.device for t in example_inputs if isinstance(t, Tensor)}
    return devices.pop() if len(devices) == 1 else None


register_backend(eager_backend, name="eager")


def aot_eager_backend(gm, example_inputs, *, options=None, strict_native=False, **kwargs):
    """``"aot_eager"`` (algorithm 11.1's middle prefix): training regions go through AOT autograd
    and the partitioner, then both graphs run op by op on the raw path; other regions as ``eager``."""
    from ..aot import aot_backend, is_training_region
    if not is_training_region(example_inputs):
        return eager_backend(gm, example_inputs)
    return aot_backend(gm, example_inputs, fw_compiler=lambda g, ex: raw_function(g, _one_device(ex)),
                       options=options, bw_fallback=raw_function)


aot_eager_backend.dynamic_shapes = True    # AOT keeps the capture's size symbols (aot/sizes.py)
register_backend(aot_eager_backend, name="aot_eager")
