"""The compiled training runtime (chapter §5.6–5.7; §11.6): forward and lazily compiled backward
wrapped in a ``tp.autograd.Function``.

:func:`aot_backend` is what a backend calls for a training region (an input requires grad with
grad mode on): it builds the joint graph (:mod:`.joint`), partitions it (``options["aot.partitioner"]``,
default ``"min_cut"``; :mod:`.partition`), compiles the **forward graph now** with ``fw_compiler`` and
returns a callable of the flat inputs.  Each call runs :class:`CompiledRegionFunction` — a
``tp.autograd.Function`` — whose ``forward`` runs the compiled forward graph (outputs: the region's
outputs, then the saved values) and keeps exactly the partitioner's saved values with
``ctx.save_for_backward``; its ``backward``

* compiles the **backward graph at the first backward()** (``bw_compiler``; a failure there warns and
  runs the graph compiled by ``bw_fallback`` instead -- the backends pass the eager backend's op-by-op
  ``raw_function`` -- unless ``strict_native`` or no ``bw_fallback`` is given); with symbolic sizes
  (a ``dynamic=True`` capture, :mod:`.sizes`) it is compiled together with the forward instead, on
  zero-filled example inputs at the hint sizes, so that its shape guards enter the key;
* gives the compiled backward the saved values and one tangent per differentiable output (laid out
  as the backward graph expects: incoming gradients with other strides are copied);
* returns one gradient per input (None where none), which the engine accumulates into ``.grad`` of
  leaves — parameters of compiled modules included, over any number of backward calls;
* runs inside the engine, so saved tensors are freed after it unless ``retain_graph=True`` (a second
  backward then raises the engine's "backward through the graph a second time" error), and a saved
  value modified in place before backward raises the version-counter error;
* raises a clear error under ``create_graph=True`` (double backward, §5.7): the compiled backward is
  not itself differentiable.

Inputs mutated by the region (their new values are extra forward outputs, see :mod:`.dispatch_trace`)
are written back after the forward; one that requires grad is rebased on the compiled node
(``ctx.mark_dirty``), and saved values sharing its storage are cloned before the write-back.
Parameters updated in place between calls (an optimizer step under ``no_grad``) are never seen
stale: they are inputs of the compiled graph, read at every call.

``strict_native=True`` requires both graphs to compile to native code: the forward at once, the
backward's lowering is checked at compile time too (its native code is still built lazily).
"""
from __future__ import annotations

import dataclasses
import warnings

import torch

from ..._tensor import Tensor, _wrap
from ...autograd import grad_mode
from ...autograd.function import Function
from ..graph import GraphModule
from .dispatch_trace import _hints, is_symbolic
from .joint import build_joint
from ...profiler.recorder import span

__all__ = ["aot_backend", "aot_lower", "AOTRuntime", "CompiledRegionFunction", "AOTLowered", "DoubleBackwardError"]


class DoubleBackwardError(RuntimeError):
    """Double backward (create_graph=True) through a compiled region (§5.7)."""


@dataclasses.dataclass
class AOTLowered:
    """The AOT layer's view of one training region: the joint graph and its partition."""
    joint: object
    partition: object
    partitioner: str

    @property
    def forward_graph(self) -> GraphModule:
        return self.partition.fw_gm

    @property
    def backward_graph(self) -> GraphModule:
        return self.partition.bw_gm

    @property
    def saved_values(self) -> list:
        return list(self.partition.saved)

    @property
    def saved_bytes(self) -> int:
        return sum(s.nbytes for s in self.partition.saved)


def _partitioner(name):
    from .partition import PARTITIONERS
    if callable(name):
        return name
    try:
        return PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"tp.compile: unknown option value aot.partitioner={name!r}; "
                         f"choose one of {sorted(PARTITIONERS)}") from None


def aot_lower(gm, example_inputs, partitioner="min_cut", decompose_if=None) -> AOTLowered:
    """Joint graph and partition of a region, without compiling anything.  ``decompose_if(node)``:
    the backend's choice of forward nodes to expand by their decomposition before differentiating
    (a backend function's ``aot_decompose`` attribute, e.g. Stax's ``choices.aot_decompose``)."""
    with span("aot joint graph", "compile"):
        joint = build_joint(gm, example_inputs, decompose_if=decompose_if)
    with span(f"aot partition ({partitioner if isinstance(partitioner, str) else 'custom'})", "compile"):
        part = _partitioner(partitioner)(joint)
    return AOTLowered(joint, part, partitioner if isinstance(partitioner, str) else
                      getattr(partitioner, "__name__", "custom"))


def _detached(t):
    return _wrap(t._data) if isinstance(t, Tensor) else t


def _example_from_meta(v, device=None):
    """A zero-filled tensor with the layout of meta value ``v`` (symbolic sizes at their hints), on
    ``v``'s device, or for a ``meta`` value on ``device`` (the region's: a GPU region's backward is
    compiled for the GPU; None: the CPU)."""
    dev = v.device if v.device.type != "meta" else device
    return _wrap(torch.empty_strided(_hints(v.shape), _hints(v.stride()), dtype=v.dtype, device=dev).zero_())


def _contiguous_strides(shape) -> tuple:
    """The strides ``torch.empty(shape)`` has (the layout of every tangent placeholder)."""
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(out))


def compact_outputs(gm):
    """A copy of ``gm`` whose output tuple drops the ``None`` entries; returns (graph module, the
    positions of the kept outputs in the original tuple, the original length)."""
    g, env = gm.graph.copy()
    out = g.output_node
    orig = list(out.args[0])
    keep = [i for i, o in enumerate(orig) if o is not None]
    out.args = (tuple(orig[i] for i in keep),)
    new = GraphModule(g, dict(gm.attrs), name=getattr(gm, "_name", "backward"))
    return new, keep, len(orig)


class CompiledRegionFunction(Function):
    """``apply(runtime, *flat_inputs)`` -> the forward outputs (see the module docstring)."""

    @staticmethod
    def forward(ctx, rt, *args):
        outs = rt.fw(*args)
        n = rt.num_fwd
        ctx.rt = rt
        if rt.symbolic:     # the sizes of this call, for the tangents of outputs that get no gradient
            ctx.out_shapes = [outs[i].shape for i in rt.diff_idx]
        saved = outs[n:]
        if rt.mutated:
            saved = rt.protect_saved(saved, args)
        ctx.save_for_backward(*saved)
        fwd = list(outs[:n])
        if rt.mutated:
            dirty = rt.write_back(args, fwd)
            ctx.mark_dirty(*dirty)
        ctx.mark_non_differentiable(*[fwd[i] for i in rt.non_diff])
        return tuple(fwd)

    @staticmethod
    def backward(ctx, *grads):
        rt = ctx.rt
        if grad_mode.is_grad_enabled():
            raise DoubleBackwardError(
                f"tp.compile({rt.name}): double backward (create_graph=True) through a compiled training region is "
                f"not supported (§5.7): the compiled backward graph is not itself differentiable. Compute "
                f"higher-order gradients eagerly (tp.compile(..., disable=True) or backend='eager').")
        saved = ctx.saved_tensors
        shapes = ctx.out_shapes if rt.symbolic else rt.tangent_shapes
        tangents = [rt.tangent(k, grads[i], shapes[k]) for k, i in enumerate(rt.diff_idx)]
        bw = rt.backward_fn(saved, tangents)
        res = bw(*saved, *tangents)
        out = [None] * rt.n_grads
        for pos, g in zip(rt.grad_pos, res):
            out[pos] = g
        return (None, *out)


class AOTRuntime:
    """The artifact of a compiled training region (callable on the flat inputs)."""

    def __init__(self, lowered: AOTLowered, example_inputs, fw_compiler, bw_compiler, *, name="region",
                 strict_native=False, check_native=None, bw_fallback=None):
        self.lowered = lowered
        joint, part = lowered.joint, lowered.partition
        self.name = name
        self.num_fwd = part.num_fwd_outputs
        self.num_user = joint.num_user_outputs
        self.mutated = list(joint.mutated_inputs)
        self.diff_idx = [i for i, d in enumerate(joint.fwd_output_differentiable) if d]
        self.non_diff = [i for i, d in enumerate(joint.fwd_output_differentiable) if not d]
        self.needs_grad = any(joint.primals_requiring_grad)
        self.strict_native = strict_native
        #: the region's device: where the backward's example inputs live when its metadata is meta
        self.device = next((t.device for t in example_inputs if isinstance(t, Tensor)), None)
        with span("compile forward graph", "compile"):
            self.fw = fw_compiler(part.fw_gm, [_detached(t) for t in example_inputs])
        self._bw_compiler = bw_compiler
        self._bw_fallback = bw_fallback
        self.bw_gm, self.grad_pos, self.n_grads = compact_outputs(part.bw_gm)
        ph = self.bw_gm.graph.placeholders
        n_saved = len(ph) - len(self.diff_idx)
        self.tangent_meta = [p.meta.get("val") for p in ph[n_saved:]]
        # symbolic sizes (a dynamic=True capture, aot/sizes.py): one forward and one backward graph
        # serve every size; a tangent's expected layout is computed from the call's sizes
        self.symbolic = is_symbolic(part.fw_gm)
        self.tangent_shapes = None if self.symbolic else [tuple(m.shape) for m in self.tangent_meta]
        self.tangent_strides = None if self.symbolic else [tuple(m.stride()) for m in self.tangent_meta]
        self._bw = None
        self.bw_compiles = 0     # backward graphs built (CompiledFunction.counters["backward_compiles"])
        if strict_native and check_native is not None:
            check_native(self.bw_gm, [_example_from_meta(p.meta["val"], self.device) for p in ph])
        if self.symbolic:
            # compiled now, not at the first backward: what the backward compiler assumes about sizes
            # (its shape guards) must reach the key, which is built when the backend returns (as
            # PyTorch compiles the backward eagerly when symbolic sizes are saved for it)
            self.backward_fn(None, None)
        self.source = getattr(self.fw, "source", None)

    # -- forward ---------------------------------------------------------------------------------
    def __call__(self, *args):
        if self.needs_grad and grad_mode.is_grad_enabled():
            outs = CompiledRegionFunction.apply(self, *args)   # writes mutated inputs back itself
        else:
            outs = list(self.fw(*args)[:self.num_fwd])
            if self.mutated:
                self.write_back(args, outs)
        return tuple(outs[:self.num_user])

    def write_back(self, args, fwd):
        """Copy the new values of mutated inputs into them; a mutated input that requires grad
        replaces its output (to be rebased on the compiled node).  Returns those inputs."""
        n, dirty = self.num_user, []
        for k, i in enumerate(self.mutated):
            a = args[i]
            a._data.copy_(fwd[n + k]._data)
            if a.requires_grad:
                fwd[n + k] = a
                dirty.append(a)
        return dirty

    def protect_saved(self, saved, args):
        """Saved values that share storage with a mutated input hold its value *before* the
        mutation: clone them before the write-back overwrites it."""
        storages = {args[i]._data.untyped_storage().data_ptr() for i in self.mutated}
        return tuple(_wrap(s._data.clone()) if s._data.untyped_storage().data_ptr() in storages else s
                     for s in saved)

    # -- backward --------------------------------------------------------------------------------
    def tangent(self, k, g, shape):
        """The incoming gradient of differentiable output ``k`` (of size ``shape`` at this call) in
        the layout the backward graph expects: contiguous (zeros for ``None``)."""
        meta = self.tangent_meta[k]
        if g is None:
            return _wrap(torch.zeros(shape, dtype=meta.dtype, device=meta.device if meta.device.type != "meta" else None))
        d = g._data
        want = self.tangent_strides[k] if self.tangent_strides is not None else _contiguous_strides(d.shape)
        if tuple(d.stride()) != want or d.storage_offset() != 0:
            # e.g. the expanded gradient of a sum: give the compiled backward the layout it expects
            d = torch.empty_strided(d.shape, want, dtype=d.dtype, device=d.device).copy_(d)
            return _wrap(d)
        return g

    def backward_fn(self, saved, tangents):
        """The compiled backward, built at the first backward() (§11.6) — or, with symbolic sizes,
        when the forward is compiled; its example inputs are then zero-filled tensors at the hint
        sizes (the sample's), laid out as the backward graph's placeholders."""
        if self._bw is None:
            if saved is None:
                example = [_example_from_meta(p.meta["val"], self.device) for p in self.bw_gm.graph.placeholders]
            else:
                example = [_detached(t) for t in saved] + [_detached(t) for t in tangents]
            self.bw_compiles += 1
            try:
                with span("compile backward graph", "compile"):
                    self._bw = self._bw_compiler(self.bw_gm, example)
            except Exception as e:
                if self.strict_native or self._bw_fallback is None:
                    raise
                warnings.warn(f"tp.compile({self.name}): compiling the backward graph failed ({type(e).__name__}: "
                              f"{e}); running it op by op instead", RuntimeWarning, stacklevel=4)
                self._bw = self._bw_fallback(self.bw_gm)
        return self._bw


def aot_backend(gm, example_inputs, *, fw_compiler, bw_compiler=None, options=None, strict_native=False,
                check_native=None, name="region", decompose_if=None, bw_fallback=None, **kwargs):
    """Compile a training region: joint graph, partition, forward now, backward lazily (see the
    module docstring).  ``fw_compiler(gm, example_inputs) -> callable`` is a non-autograd backend
    (it receives detached example inputs); ``bw_compiler`` defaults to it.  ``bw_fallback(gm) ->
    callable`` runs the backward graph when compiling it fails (None: the failure is raised)."""
    partitioner = (options or {}).get("aot.partitioner", "min_cut")
    lowered = aot_lower(gm, example_inputs, partitioner, decompose_if)
    rt = AOTRuntime(lowered, example_inputs, fw_compiler, bw_compiler or fw_compiler, name=name,
                    strict_native=strict_native, check_native=check_native, bw_fallback=bw_fallback)

    def run(*args):
        return rt(*args)
    run.source = rt.source
    run.aot = rt
    return run
