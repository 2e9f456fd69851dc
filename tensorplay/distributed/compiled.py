"""``tp.compile`` of explicit-mode functions: ShardedArrays in, ShardedArrays out (seed 001 §4).

The compiler captures tensors.  A function of ShardedArrays is compiled as its *local program*: the
function of the local blocks that runs the explicit-mode propagation (explicit.py) on ShardedArrays
wrapped around them and returns the blocks of the results.  Capture runs the propagation rules once,
in Python, so the captured graph holds each process's local ops and the collectives the rules
inserted (op-table entries: ``dist_allreduce``, ``dist_psum_scatter``, ``dist_allgather_blocks``,
...); Stax compiles the local ops and runs the collectives as fallback kernels between them.

Rules and guarantees:

* ``tp.compile(f)(a, b, ...)`` with a :class:`ShardedArray` among the positional arguments compiles
  one local program per *layout* -- the sharding and global shape of every ShardedArray argument,
  by position -- each a ``CompiledFunction`` of its own with the options of ``tp.compile(f)``, kept
  by it (its guards handle dtypes, ``requires_grad``, the other arguments).  Another argument
  passes to the local program as it is: a tensor is a replicated global value, a Python value a
  constant of the capture.  Keyword arguments raise ``TypeError``;
* the results are ShardedArrays with the shardings ``f``'s results had at capture; a pending
  :class:`~tensorplay.distributed.explicit.PartialSum` result is reduced (all-reduced, unless ``f``
  constrained it with ``with_sharding_constraint``: reduce-scattered).  Their values equal eager
  explicit mode's (the same ops and collectives on the same blocks), hence the single-process ones;
* every process compiles the same graph from the same layouts, so the collectives run in the same
  order everywhere; what differs by rank (which block a process keeps) is computed by the kernels;
* training: the steps explicit mode inserts are op-table entries whose derivatives are in the
  global convention of explicit mode (an all-reduce of partial sums transposes to the identity, an
  all-gather to taking one's block, ...), so the AOT backend differentiates the local program into
  the single-process gradients -- blocks that require grad train as in eager explicit mode.  A
  ``gather()`` or ``device_put`` *inside* ``f`` is an autograd Function whose backward a capture
  does not keep: with blocks that require grad it raises (do them outside ``f``);
* ``tp.compile(f).lower(a, b)`` returns a :class:`ShardedLowered`: ``as_text()`` is the local
  program, a header line per argument (global shape, spec, local shape) and per result, every
  line with its local shape and every collective line with its mesh axes and the bytes of its
  input (``| dist_allreduce over ['Y']: 96 bytes``); ``compile()`` gives a :class:`ShardedCompiled`
  (``as_text()``, called like ``f``).
"""
from __future__ import annotations

import math
import re
import weakref

import torch

from .._tensor import Tensor
from ..ops.registry import OPS
from .array import ShardedArray

__all__ = ["on_blocks", "compiled_text", "ShardedLowered", "ShardedCompiled", "compile_hook"]


def on_blocks(f, *examples):
    """``f`` over ShardedArrays as a function of their local blocks: argument ``i`` of the result is
    the block of an array sharded like ``examples[i]`` (a non-array example passes unchanged), and
    each ShardedArray ``f`` returns is returned as its block (a pending PartialSum reduced).  Its
    ``out_shardings`` are those of ``f``'s last run.  ``tp.compile`` it: the captured graph is the
    local program, the inserted collectives ops of it (``dist_allreduce``, ``dist_allgather_blocks``, ...)."""
    layout = [(a.sharding, tuple(a.shape)) if isinstance(a, ShardedArray) else None for a in examples]

    def local_program(*blocks):
        if len(blocks) != len(layout):
            raise TypeError(f"on_blocks({getattr(f, '__name__', f)}): {len(blocks)} blocks for {len(layout)} examples")
        args = [ShardedArray(b, *lay) if lay else b for b, lay in zip(blocks, layout)]
        out = f(*args)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        local_program.out_shardings = [(o.sharding, tuple(o.shape)) if isinstance(o, ShardedArray) else None
                                       for o in outs]
        res = [o.local() if isinstance(o, ShardedArray) else o for o in outs]
        return type(out)(res) if isinstance(out, (tuple, list)) else res[0]

    local_program.__name__ = f"{getattr(f, '__name__', 'f')}_on_blocks"
    local_program.out_shardings = None
    return local_program


def _blocks(args):
    return [a.local() if isinstance(a, ShardedArray) else a for a in args]


def _annotate(text, blocks) -> str:
    """The graph text with ``| <op> over [axes]: <bytes> bytes`` after each collective line."""
    lines = text.splitlines()
    params = re.match(r"def forward\(self, (.*)\):", lines[0]) if lines else None
    shape = {}
    if params:
        for name, b in zip(params.group(1).split(", "), blocks):
            if isinstance(b, Tensor):
                shape[name] = (b.numel(), b._data.element_size())
    out = lines[:1]
    for line in lines[1:]:
        m = re.match(r"\s*(\w+) = ops\.(\w+)\((\w+), (\d+), (\[[^\]]*\]).*#\s*(\w+)\[([\d, ]*)\]", line)
        d = re.match(r"\s*(\w+) = ops\.\w+\(.*#\s*(\w+)\[([\d, ]*)\]", line)
        if d:
            n = math.prod(int(v) for v in d.group(3).split(",") if v.strip())
            shape[d.group(1)] = (n, torch.empty((), dtype=getattr(torch, d.group(2))).element_size())
        if m and m.group(2) in OPS and "collective" in OPS[m.group(2)].tags and m.group(3) in shape:
            n, size = shape[m.group(3)]
            line += f" | {m.group(2)} over {m.group(5)}: {n * size} bytes"
        out.append(line)
    return "\n".join(out)


def _dtype(t) -> str:
    return str(t.dtype).replace("torch.", "")


def _header(args, program) -> list:
    lines = []
    for i, a in enumerate(args):
        if isinstance(a, ShardedArray):
            lines.append(f"# arg {i}: {_dtype(a)}{list(a.shape)} {a.spec} on mesh {a.mesh.shape} -> local "
                         f"{list(a.local_shape)}")
        elif isinstance(a, Tensor):
            lines.append(f"# arg {i}: {_dtype(a)}{list(a.shape)} replicated")
    for i, lay in enumerate(program.out_shardings or ()):
        if lay is not None:
            sharding, shape = lay
            lines.append(f"# result {i}: {list(shape)} {sharding.spec} -> local {list(sharding.shard_shape(shape))}")
    return lines


def _wrap_results(out, program):
    lays = program.out_shardings or ()
    outs = out if isinstance(out, (tuple, list)) else (out,)
    res = [ShardedArray(o, *lay) if lay is not None and isinstance(o, Tensor) else o
           for o, lay in zip(outs, list(lays) + [None] * (len(outs) - len(lays)))]
    return type(out)(res) if isinstance(out, (tuple, list)) else res[0]


class ShardedLowered:
    """``tp.compile(f).lower(*args)`` for ShardedArray arguments: the local program of their layout,
    captured and lowered (``lowered``: the compiler's ``Lowered``)."""

    def __init__(self, args, program, lowered):
        self.args, self.program, self.lowered = args, program, lowered

    @property
    def out_shardings(self) -> list:
        """``(NamedSharding, global shape)`` of each result (None for a non-array result)."""
        return list(self.program.out_shardings or ())

    def as_text(self) -> str:
        """The local program: the layouts, then every op with its local shape and every collective
        with its axes and bytes (module doc)."""
        body = _annotate(self.lowered.as_text(), _blocks(self.args))
        return "\n".join(_header(self.args, self.program) + [body])

    def compile(self) -> "ShardedCompiled":
        return ShardedCompiled(self, self.lowered.compile())


class ShardedCompiled:
    """The compiled local program of one layout (never recompiles); called like ``f``."""

    def __init__(self, lowered: ShardedLowered, compiled):
        self.lowered, self.compiled = lowered, compiled

    def __call__(self, *args):
        _check_layout(self.lowered.args, args, "Compiled")
        return _wrap_results(self.compiled(*_blocks(args)), self.lowered.program)

    def as_text(self) -> str:
        return self.lowered.as_text()


def _layout(args) -> tuple:
    return tuple((a.sharding, tuple(a.shape)) if isinstance(a, ShardedArray) else None for a in args)


def _check_layout(examples, args, who):
    if _layout(examples) != _layout(args):
        raise TypeError(f"{who}: built for arguments laid out as {_describe(examples)}, called with "
                        f"{_describe(args)}")


def _describe(args) -> str:
    return ", ".join(f"{list(a.shape)} {a.spec}" if isinstance(a, ShardedArray) else type(a).__name__ for a in args)


#: CompiledFunction -> {layout: (local program, its CompiledFunction)}
_PROGRAMS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _program(cf, args):
    from ..compiler.api import CompiledFunction
    table = _PROGRAMS.setdefault(cf, {})
    key = _layout(args)
    hit = table.get(key)
    if hit is None:
        program = on_blocks(cf.fn, *args)
        inner = CompiledFunction(program, backend=cf.backend, mode=cf.mode, options=cf.options, dynamic=cf.dynamic,
                                 strict_native=cf.strict_native, recompile_limit=cf.recompile_limit,
                                 name=f"{cf.name}[local program]")
        hit = table[key] = (program, inner)
    return hit


def compile_hook(cf, how, args, kwargs):
    """``ShardedArray.__tp_compile__``: a call (``how="call"``) or ``lower`` of ``tp.compile(f)``
    with ShardedArray arguments (module doc)."""
    if kwargs:
        raise TypeError(f"tp.compile({cf.name}) with ShardedArray arguments: keyword arguments are not supported "
                        f"(got {sorted(kwargs)}); pass them positionally")
    program, inner = _program(cf, args)
    blocks = _blocks(args)
    if how == "lower":
        return ShardedLowered(args, program, inner.lower(*blocks))
    return _wrap_results(inner(*blocks), program)


def compiled_text(f, *args, **compile_options) -> str:
    """``tp.compile(f, **compile_options).lower(*args).as_text()``: the compiled local program, every
    line with its local shape, each collective line also with its mesh axes and the bytes of its
    input (``# ... | dist_allreduce over ['Y']: 96 bytes``)."""
    from .. import compile as tp_compile
    return tp_compile(f, **compile_options).lower(*args).as_text()
