"""The op table: ONE registry of operators and the eager dispatcher that reads it (chapter §1.2).

Every operator TensorPlay knows is one :class:`OpDef` in :data:`OPS`.  An entry carries everything
about the op, so that no other part of the system keeps a second list:

============  ==============================================================================
``schema``    the signature (see :mod:`tensorplay.ops.schema`), source of the Python function
``eager``     the ATen kernel, called with the canonical argument tuple of torch tensors
``meta``      shape / dtype / strides without data (default: the kernel on ``device='meta'``)
``backward``  the derivative formula, written in **tp ops** so that it can itself be
              differentiated (``create_graph=True``) and, later, traced into a joint graph
``save``      which arguments (and ``"result"``) the formula reads; only those are kept alive
``jvp``       optional forward-mode formula; otherwise forward mode transposes ``backward``
``decomp``    optional decomposition into simpler tp ops (read by the compiler's decompose pass)
``flops``     optional FLOP count of one call, ``flops(input metas, output meta)`` (the cost model's;
              without it the model counts by tags)
``tags``      pointwise, reduction, view, inplace, random, factory, linalg, nn, nondeterministic,
              comparison, scan, sort, indexing, dynamic_shape, nondifferentiable, loss, shape, conv,
              may_copy, collective, extern, per_process, holomorphic (below)
============  ==============================================================================

A few tags answer a compiler's questions about an op, so that no pass keeps a list of names:
``may_copy`` marks the views whose result is a copy when the input's layout cannot be viewed
(``reshape``, ``flatten``, ``contiguous``: they may or may not alias their input); ``conv`` the
convolutions and their backward ops; ``sort`` the ops computed by sorting or selection (sort,
topk, kthvalue, median, mode, unique); ``scan`` the cumulative ops; ``linalg`` the matrix
products; ``collective`` the communication between processes (tensorplay.distributed: the profiler
records their bytes and matches them across ranks); ``per_process`` the ops whose value depends on
the process that runs them without communicating (explicit mode's ``dist_block``: this process's
piece); constant folding evaluates neither kind at compile time; ``extern`` the ops with no
loop-level form in the compiler, which Stax runs as library (ATen) kernels rather than as eager
fallbacks.

``holomorphic`` marks an op whose formula is written as for real inputs, ``g * f'(z)`` with ``f'``
built from the inputs without conjugation (exp, matmul, div, ...).  On a complex gradient the table
applies PyTorch's convention for complex inputs (the conjugate Wirtinger derivative,
``g * conj(f'(z))``) by running the formula as ``conj(formula(conj(g)))``; a formula that handles
complex values itself (abs, real, the FFTs) is not tagged.

From the table we generate the free functions (``tp.add``), the ``Tensor`` methods, the Python
operators (``__add__``/``__radd__``) and the in-place variants (``add_``).

Guarantees of :func:`call` (the eager path, one per op call):

* tensors are unwrapped to their torch storage, the kernel runs, outputs are wrapped; a
  ``torch.Tensor`` argument is read as it is and otherwise taken as ``tp.from_torch`` takes it
  (an in-place op on it returns that zero-copy wrapper);
* an argument of a type with a ``__tp_dispatch__(op, args)`` hook (tensorplay.distributed's
  ``ShardedArray``: explicit.py) hands the whole call to that hook;
* a kernel error is re-raised as the same exception class, its message prefixed with the op name
  and the shapes/dtypes of the tensor arguments — never a crash, never a silent wrong result;
* if grad mode is on and an input requires grad, an autograd node is recorded
  (:mod:`tensorplay.autograd.graph`); if a forward-AD level is active, tangents are propagated.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Callable

import torch

from .schema import Schema, parse_schema

__all__ = ["OpDef", "OPS", "register", "call", "get", "describe_args", "TAGS", "DataDependentShapeError"]


class DataDependentShapeError(RuntimeError):
    """Raised by a meta function whose output shape depends on the input *values* (masked_select,
    ``index`` with a bool mask, one_hot with num_classes=-1) when it is given meta tensors.  The
    tracer asks the meta function, and records such an op's output shape as a data gate."""

TAGS = frozenset({"pointwise", "reduction", "view", "inplace", "random", "factory", "linalg", "nn",
                  "nondeterministic", "comparison", "scan", "sort", "indexing", "dynamic_shape",
                  "nondifferentiable", "loss", "shape", "conv", "may_copy", "collective", "extern",
                  "per_process", "holomorphic"})


@dataclass
class OpDef:
    name: str
    schema: Schema
    eager: Callable
    backward: Callable | None = None
    save: tuple[str, ...] | None = None
    meta: Callable | None = None
    jvp: Callable | None = None
    decomp: Callable | None = None
    flops: Callable | None = None       # (input metas, output meta) -> FLOPs, or None: count by tags
    tags: frozenset = frozenset()
    method: str | None = None          # Tensor method name, or None
    function: str | None = None        # free function name (tp.<function>), or None
    dunders: tuple[str, ...] = ()      # Python operators bound to the Tensor class
    rdunders: tuple[str, ...] = ()     # reflected operators: ``__rsub__(self, other) = sub(other, self)``
    varargs: str | None = None         # name of an int[] argument that also accepts *ints
    inplace_of: str | None = None      # for ``add_``: ``"add"``
    doc: str = ""
    # derived at registration
    fn: Callable = field(default=None, repr=False)
    returns_named: type | None = field(default=None, repr=False)
    differentiable: bool = True

    @property
    def is_view(self):
        return "view" in self.tags

    @property
    def is_inplace(self):
        return self.schema.mutated_pos is not None

    def __call__(self, *canonical_args):
        """Run the op on its canonical argument tuple (all arguments, schema order)."""
        return call(self, canonical_args)

    def output_shape_depends_on_data(self, *args) -> bool:
        """Does this call's output shape depend on its inputs' values?  Always for ops tagged
        ``dynamic_shape`` (unique, masked_select); for indexing ops when their meta function cannot
        answer on meta tensors (a bool-mask index, one_hot with num_classes=-1)."""
        if "dynamic_shape" in self.tags:
            return True
        if "indexing" not in self.tags:
            return False
        try:
            self.run_meta(*_to_meta_args(self.schema, args))
        except DataDependentShapeError:
            return True
        except Exception:   # noqa: BLE001  (bad arguments: the eager call reports them)
            return False
        return False

    def run_meta(self, *args):
        """Output metadata (shape, dtype, strides) with no data: the tracer's and the
        compiler's view of the op.  Accepts tp.Tensors or torch tensors; returns torch meta
        tensors."""
        if self.meta is not None:
            return self.meta(*args)
        return self.eager(*_to_meta_args(self.schema, args))


OPS: dict[str, OpDef] = {}

#: file name of generated functions (tracebacks and source-line reports skip these frames)
GENERATED = "<tensorplay-generated>"

#: Callbacks ``f(op, args, result)`` run after every eager op call (tests check meta functions
#: with it; the profiler records ops with it).  Empty in normal use: one truthiness test per call.
observers: list = []
#: Output metadata to use when a kernel run on meta tensors cannot know its output shape
#: (DataDependentShapeError): a stack of ``None`` or ``() -> torch meta tensor(s)``.  Retracing a
#: captured graph pushes the node's captured value: that graph is specialised on the shape (a data
#: gate), so the op's output shape is known there (compiler/aot/dispatch_trace.retrace_nodes).
shape_hints: list = []
#: Callbacks ``raw_args = f(op, args, raw_args)`` run before the kernel (capture snapshots
#: constants about to be mutated, and symbolic capture turns every tensor argument into a meta
#: tensor with it).  Empty in normal use.
pre_observers: list = []


def _log_op(op, args, outs):
    import sys
    shapes = ", ".join(_fmt_t(o) for o in outs if isinstance(o, Tensor))
    print(f"[tp op] {op.name}({describe_args(op, args)}) -> {shapes}", file=sys.stderr)


def log_ops(on: bool) -> None:
    """Print every eager op call (``log.ops``, TP_LOG_OPS=1: a debugging aid) or stop.  The
    configuration calls it (tensorplay/__init__.py: ``config.watch``), at import and whenever a
    ``config.patch`` of ``log.ops`` begins or ends."""
    if on and _log_op not in observers:
        observers.append(_log_op)
    elif not on and _log_op in observers:
        observers.remove(_log_op)


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"tensorplay: no op named {name!r} in the op table") from None


# ---------------------------------------------------------------------------------------------
# Kernel adapters: map the canonical tuple onto a torch callable
# ---------------------------------------------------------------------------------------------
def torch_adapter(schema: Schema, target: Callable) -> Callable:
    """Call ``target`` with the schema's positional args positionally and keyword-only args by
    name.  Generated once per op (no per-call introspection)."""
    pos = [a.name for a in schema.args if not a.kwarg_only]
    kw = [a.name for a in schema.args if a.kwarg_only]
    params = ", ".join(a.name for a in schema.args)
    call_args = ", ".join(pos + [f"{k}={k}" for k in kw])
    src = f"def _kernel({params}):\n    return _target({call_args})\n"
    ns = {"_target": target}
    exec(compile(src, GENERATED, "exec"), ns)
    return ns["_kernel"]


def _to_meta(t):
    from .._tensor import Tensor
    if isinstance(t, Tensor):
        t = t._data
    if isinstance(t, torch.Tensor):
        if t.layout != torch.strided:   # sparse: its meta keeps the layout (a sparse tensor's strides are 0s)
            return torch.empty(t.shape, dtype=t.dtype, layout=t.layout, device="meta")
        mode = getattr(t, "fake_mode", None)
        if mode is not None:   # a symbolic fake tensor (dynamic=True): a fresh fake, no guard recorded
            with mode:
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
    return t


def _to_meta_args(schema, args):
    out = list(args)
    for i in schema.tensor_pos:
        out[i] = _to_meta(out[i])
    for i in schema.list_pos:
        if out[i] is not None:
            out[i] = [_to_meta(t) for t in out[i]]
    for i in schema.index_pos:
        out[i] = _map_index(out[i], _to_meta)
    return out


def _map_index(idx, f):
    if isinstance(idx, tuple):
        return tuple(_map_index(i, f) for i in idx)
    if isinstance(idx, list):
        return [_map_index(i, f) for i in idx]
    return f(idx)


# ---------------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------------
def register(schema: str, eager: Callable | str | None = None, *, backward=None, save=None, meta=None,
             jvp=None, decomp=None, flops=None, tags=(), method: bool | str = True, function: bool | str = True,
             dunders=(), rdunders=(), varargs=None, inplace: bool | str = False, inplace_eager=None,
             inplace_dunders=(), differentiable=True, doc="") -> OpDef:
    """Add one op to the table and generate its Python function (and in-place twin).

    ``eager`` may be a callable taking the canonical argument tuple, a string naming a torch
    function (``"torch.add"``), or None, meaning ``torch.<name>`` with matching argument names.
    ``inplace=True`` also registers ``<name>_`` (kernel ``torch.Tensor.<name>_``) sharing the
    derivative formula.
    """
    s = parse_schema(schema)
    if s.name in OPS:
        raise ValueError(f"op {s.name!r} registered twice")
    tags = frozenset(tags)
    unknown = tags - TAGS
    if unknown:
        raise ValueError(f"op {s.name}: unknown tags {sorted(unknown)}")
    if "holomorphic" in tags and backward is not None:
        backward = _holomorphic(backward)
    if eager is None:
        eager = torch_adapter(s, getattr(torch, s.name))
    elif isinstance(eager, str):
        obj = torch
        for part in eager.split(".")[1:]:
            obj = getattr(obj, part)
        eager = torch_adapter(s, obj)
    op = OpDef(name=s.name, schema=s, eager=eager, backward=backward,
               save=tuple(save) if save is not None else None, meta=meta, jvp=jvp, decomp=decomp,
               flops=flops, tags=tags, method=(s.name if method is True else (method or None)),
               function=(s.name if function is True else (function or None)), dunders=tuple(dunders),
               rdunders=tuple(rdunders),
               varargs=varargs, differentiable=differentiable and backward is not None, doc=doc)
    if s.returns_tuple and all(n for _, n in s.returns):
        op.returns_named = collections.namedtuple(f"{s.name}_return", [n for _, n in s.returns])
    op._argidx = {a.name: i for i, a in enumerate(s.args)}
    op._is_view = "view" in tags
    op._tensorish = tuple(sorted(s.tensor_pos + s.list_pos))
    op.fn = _make_function(op)
    OPS[s.name] = op
    if inplace:
        iname = inplace if isinstance(inplace, str) else s.name + "_"
        args = []
        for j, a in enumerate(s.args):
            t = "Tensor(a!)" if j == 0 else a.type
            d = f"={a.default!r}" if a.has_default else ""
            args.append(("*, " if a.kwarg_only and not any(x.kwarg_only for x in s.args[:j]) else "")
                        + f"{t} {a.name}{d}")
        ischema = f"{iname}({', '.join(args)}) -> Tensor(a!)"
        if inplace_eager is None:
            inplace_eager = getattr(torch.Tensor, iname)
        register(ischema, torch_adapter(parse_schema(ischema), inplace_eager), backward=backward,
                 save=save, jvp=jvp, tags=(tags - {"view"}) | {"inplace"}, method=True, dunders=inplace_dunders,
                 function=False, varargs=varargs, differentiable=differentiable, doc=doc)
        OPS[iname].inplace_of = s.name
    return op


def _conj_grads(res):
    """``conj`` of every complex tensor of a formula's result (a tensor, None, or nested sequences)."""
    if isinstance(res, (tuple, list)):
        return type(res)(_conj_grads(r) for r in res)
    if isinstance(res, Tensor) and res.is_complex():
        return OPS["conj_physical"].fn(res)
    return res


def _holomorphic(backward):
    """The formula of a ``holomorphic`` op under PyTorch's complex convention: ``conj(f(conj g))``
    when a gradient is complex (the formula is linear in ``g``), the formula itself otherwise."""
    if getattr(backward, "holomorphic", False):     # (the in-place twin shares the wrapped formula)
        return backward

    def bwd(ctx, *grads):
        if not any(isinstance(g, Tensor) and g.is_complex() for g in grads):
            return backward(ctx, *grads)
        return _conj_grads(backward(ctx, *_conj_grads(grads)))
    bwd.holomorphic = True
    bwd.__name__ = getattr(backward, "__name__", "backward")
    return bwd


def _make_function(op: OpDef) -> Callable:
    """Generate ``def add(self, other, *, alpha=1): return _call(_op, (self, other, alpha))``."""
    s = op.schema
    names = [a.name for a in s.args]
    if op.varargs:
        # e.g. view(self, *size): accept x.view(2, 3) and x.view((2, 3))
        before = [a for a in s.args if a.name != op.varargs and not a.kwarg_only]
        params = [a.name for a in before] + [f"*{op.varargs}"]
        params += [f"{a.name}={a.default!r}" if a.has_default else a.name for a in s.args if a.kwarg_only]
        params.append("**_kw")   # the sizes by keyword: x.flip(dims=(0,)), torch.permute(x, dims=...)
        body = (f"    if _kw:\n"
                f"        if {op.varargs} or list(_kw) != [{op.varargs!r}]:\n"
                f"            raise TypeError(f'tp.{s.name}: unexpected keyword argument(s) {{sorted(_kw)}}')\n"
                f"        {op.varargs} = _kw[{op.varargs!r}]\n"
                f"    elif len({op.varargs}) == 1 and not isinstance({op.varargs}[0], (int, torch.SymInt)):\n"
                f"        {op.varargs} = {op.varargs}[0]\n")
    else:
        params = [s.python_signature()]
        body = ""
    tup = "(" + ", ".join(names) + ("," if len(names) == 1 else "") + ")"
    src = f"def {s.name}({', '.join(params)}):\n{body}    return _call(_op, {tup})\n"
    ns = {"_call": call, "_op": op, "torch": torch}
    exec(compile(src, GENERATED, "exec"), ns)
    fn = ns[s.name]
    fn.__doc__ = f"{s.text}\n\n{op.doc}".strip()
    fn.__qualname__ = s.name
    fn.__module__ = "tensorplay"
    fn._opdef = op
    return fn


# ---------------------------------------------------------------------------------------------
# The eager dispatcher
# ---------------------------------------------------------------------------------------------
from .._tensor import Tensor, _wrap  # noqa: E402  (Tensor needs nothing from here at import)
from ..autograd import grad_mode as _gm  # noqa: E402
from ..autograd.graph import check_inplace, mark_views, record_op  # noqa: E402

_grad_state = _gm._state
_fw_state = _gm._fw_state


def describe_args(op: OpDef, args) -> str:
    """``self: float32[3, 4], other: float32[5]`` — for error messages."""
    parts = []
    for a, v in zip(op.schema.args, args):
        if isinstance(v, (Tensor, torch.Tensor)):
            parts.append(f"{a.name}: {_fmt_t(v)}")
        elif isinstance(v, (list, tuple)) and v and all(isinstance(t, (Tensor, torch.Tensor)) for t in v):
            parts.append(f"{a.name}: [" + ", ".join(_fmt_t(t) for t in v) + "]")
        elif v is not None and not (a.has_default and _eq(v, a.default)):
            parts.append(f"{a.name}={_fmt_v(v)}")
    return ", ".join(parts)


def _eq(a, b):
    try:
        return bool(a == b) and type(a) is type(b)
    except Exception:
        return False


def _fmt_t(t):
    return f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" + ("" if t.device.type == "cpu" else f"@{t.device}")


def _fmt_v(v):
    if isinstance(v, tuple):
        return "(" + ", ".join(_fmt_v(x) for x in v) + ")"
    if isinstance(v, (Tensor, torch.Tensor)):
        return _fmt_t(v)
    r = repr(v)
    return r if len(r) < 60 else r[:57] + "..."


def op_error(op: OpDef, args, e: BaseException) -> BaseException:
    msg = f"tp.{op.name}({describe_args(op, args)}): {e}"
    cls = type(e) if isinstance(e, (RuntimeError, IndexError, ValueError, TypeError, NotImplementedError)) else RuntimeError
    if cls.__module__ != "builtins":
        cls = RuntimeError if isinstance(e, RuntimeError) else ValueError
    try:
        return cls(msg)
    except Exception:
        return RuntimeError(msg)


def _unwrap_index(idx):
    if isinstance(idx, Tensor):
        return idx._data, idx.requires_grad
    if isinstance(idx, tuple):
        out, rg = [], False
        for i in idx:
            u, r = _unwrap_index(i)
            out.append(u)
            rg |= r
        return tuple(out), rg
    if isinstance(idx, list) and any(isinstance(i, (Tensor, list, tuple)) for i in idx):
        out, rg = [], False
        for i in idx:
            u, r = _unwrap_index(i)
            out.append(u)
            rg |= r
        return out, rg
    return idx, False


def _on_meta_tensors(op, raw, err):
    """Symbolic tracing runs kernels on meta tensors.  For a kernel that cannot run there (it reads
    data: ``nonzero`` of a bool index), the op's meta function answers; for an output shape that
    depends on data, the shape hint of the graph being retraced (``shape_hints``).  None when the
    call is not on meta tensors or neither answers: the kernel's error stands."""
    if not any(isinstance(a, torch.Tensor) and a.device.type == "meta" for a in raw):
        return None
    if op.meta is not None and not isinstance(err, DataDependentShapeError):
        try:
            return op.meta(*raw)
        except DataDependentShapeError:
            pass
        except Exception:   # noqa: BLE001  (the kernel's error is the one to report)
            return None
    if shape_hints and shape_hints[-1] is not None:
        return shape_hints[-1]()
    return None


def call(op: OpDef, args: tuple):
    """Run one op eagerly: unwrap, kernel, wrap, record autograd and forward-AD."""
    s = op.schema
    raw = list(args)
    req = False
    taken = None
    for i in s.tensor_pos:
        a = raw[i]
        if isinstance(a, Tensor):
            raw[i] = a._data
            if a._requires_grad or (a._base is not None and a.requires_grad):  # a view follows its base
                req = True
        elif isinstance(a, torch.Tensor):
            # a torch tensor (torchvision's transforms make them): the kernel reads it as it is, and
            # the rest of the call (views, the tracer, an in-place result) sees it as
            # tp.from_torch's zero-copy wrapper
            if taken is None:
                taken = list(args)
            taken[i] = _wrap(a)
        elif a is not None and not isinstance(a, (int, float, bool, complex, torch.SymInt,
                                                  torch.SymFloat, torch.SymBool)):
            handler = getattr(type(a), "__tp_dispatch__", None)
            if handler is not None:     # an array type with rules of its own (a ShardedArray)
                return handler(op, args)
            raise TypeError(f"tp.{op.name}: argument '{s.args[i].name}' must be a Tensor or a number, "
                            f"got {type(a).__name__}")
    for i in s.list_pos:
        seq = raw[i]
        if seq is not None:
            if isinstance(seq, Tensor) or not isinstance(seq, (list, tuple)):
                raise TypeError(f"tp.{op.name}: argument '{s.args[i].name}' must be a sequence of Tensors, "
                                f"got {type(seq).__name__}")
            lst = []
            for t in seq:
                if isinstance(t, Tensor):
                    lst.append(t._data)
                    if t._requires_grad or (t._base is not None and t.requires_grad):
                        req = True
                elif t is None or isinstance(t, torch.Tensor):
                    lst.append(t)
                else:
                    raise TypeError(f"tp.{op.name}: argument '{s.args[i].name}' must hold Tensors, "
                                    f"got {type(t).__name__}")
            raw[i] = lst
    for i in s.index_pos:
        raw[i], _ = _unwrap_index(raw[i])
    if taken is not None:
        args = tuple(taken)
    record = req and _grad_state.enabled and op.differentiable
    mp = s.mutated_pos
    if mp is not None and req and _grad_state.enabled:
        inplace_state = check_inplace(op, args, record)
    else:
        inplace_state = None
    fw_old = None
    if _fw_state.level and mp is not None and isinstance(args[mp], Tensor):
        fw_old = _wrap(args[mp]._data.clone())
    if pre_observers:
        for f in pre_observers:
            raw = f(op, args, raw)
    try:
        out = op.eager(*raw)
    except Exception as e:
        out = _on_meta_tensors(op, raw, e)
        if out is None:
            raise op_error(op, args, e) from e
    # -- wrap ---------------------------------------------------------------------------------
    if mp is not None:
        result = args[mp]
        outs = (result,)
    elif s.returns_tensor:
        result = _wrap(out)
        outs = (result,)
    elif s.returns_list:
        outs = tuple(_wrap(o) for o in out)
        result = list(outs)
    elif s.returns_tuple:
        outs = tuple(_wrap(o) if isinstance(o, torch.Tensor) else o for o in out)
        result = op.returns_named(*outs) if op.returns_named else outs
    else:  # non-tensor result (e.g. a Python number)
        return out
    if op._is_view and mark_views(op, args, outs):
        record = False   # an identity alias of a view carries the view's history as is
    if record:
        record_op(op, args, outs, inplace_state)
    if _fw_state.level and not ("nondifferentiable" in op.tags):
        from ..autograd.forward_ad import propagate
        propagate(op, args, outs, fw_old)
    if observers:
        for f in observers:
            f(op, args, outs)
    return result
