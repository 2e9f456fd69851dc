"""CUDA Graphs for ``mode="reduce-overhead"`` (the chapter, §9.9; table 11.1; exercise 27; SPEC §8.4).

§9.9's model: a region of ``n`` kernels of device time ``t`` each costs about
``n * max(t, t_launch)`` when its wrapper launches them one by one, and ``t_graph + n * t`` when
they are replayed as one CUDA graph -- the graph removes ``n * t_launch`` (and the wrapper's own
``n * t_py``, §11.3).  A graph is a specialisation (Prop. 2.1) finer than the compiled artifact:
it fixes the *addresses* its kernels read and write, not only shapes and strides.
:func:`cudagraphify` makes those addresses fixed -- the inputs are copied into static input
buffers, the outputs are written into the graph's private memory pool -- and replays::

    graphed = cudagraphify(mod.call)        # the wrapper's call(args) (codegen/wrapper.py)
    outs = graphed([x, w])                  # same contract: list of torch tensors in, tuple out

* calls ``1 .. warmup`` run ``call`` eagerly on the caller's tensors, on a side stream (what
  PyTorch does before a capture: lazy initialisation, Triton's first launch, cuBLAS workspaces
  happen outside the graph); their outputs are ordinary tensors;
* call ``warmup + 1`` allocates the static inputs (``empty_strided`` like the arguments, filled
  with a copy), empties the wrapper's ``spare`` dict (runtime.take/stash: buffers kept between
  calls; a warm-up's would be memory outside the pool, baked into the graph and later freed or
  reused -- emptied, every buffer the graph touches is its own: allocated in its private pool
  during the capture, kept there for the graph's life), captures ``call`` on the static inputs into
  one ``torch.cuda.CUDAGraph`` on the side stream, then replays it;
* every later call copies each argument into its static input (no copy for an argument that *is*
  the static tensor: a ``static_argnums`` argument, or a static input the caller filled itself),
  replays the graph on the current stream, copies back the inputs the graph writes (found at the
  capture: their version counter moved) and returns the static outputs.  The hot path launches
  copies and the replay only: nothing synchronises.

One graph per cudagraphify'd call (the wrapper is one specialisation).  A call whose tensors differ
from the captured ones in shape, stride, dtype or device (a symbolic wrapper called at another
size), or whose ``static_argnums`` argument is another tensor, is **not replayed**: ``call`` runs
directly, eagerly, and its outputs are ordinary tensors (``counters["direct"]``); nothing is
re-captured.  A capture that fails (an op that synchronises, e.g. a data-dependent size) warns once
and every later call runs ``call`` directly.

**The output-lifetime rule** (exercise 27; PyTorch's choice).  Replay ``i + 1`` writes its outputs
into the same memory as replay ``i``: a loop that appends each step's output to a list would hold
the same memory ``N`` times, all showing the last step.  So an output of a replay is valid until the
next replay of the same graph; after it, reading the ``tp.Tensor`` that held it raises
``RuntimeError("tp.compile(mode='reduce-overhead'): this output of call N was overwritten by call
M (CUDA graph replay, §9.9); clone() it to keep it")`` -- its ``_data`` is swapped for a
:class:`StaleOutput`, which raises on every use (an attribute, a method, printing, ``numpy()``, a
torch function given it).  :class:`OutputLifetimes` does this for the compiled function's
``run`` (stax/__init__.py), in O(#outputs) Python work per replay (it keeps a weak reference to
each output it handed out, for one replay).  Not stale: a ``clone()`` (own memory), any result
computed from an output, an output that is an input (or a view of one: handed out as the caller's
tensor), an output that is a constant (``fixed``), every output of a warm-up or direct call.  A
*view* the user takes of an output (``out[0]``, ``out.view(...)``, ``out.torch()`` read before the
next call) shares the pool's memory and is not poisoned: clone what must outlive the next call.
The torch-level callable itself (``cudagraphify``'s result) returns the static tensors and poisons
nothing: callers that are not :class:`OutputLifetimes` must copy what they keep.

Guarantees: outputs of call ``k`` equal what ``call`` computes on call ``k``'s arguments, for every
``k`` (a replay reads the arguments' values at the time of the call); the arguments' tensors
(``args``) are not kept past the call (the list is cleared, as the wrapper clears it); a stale
``tp.Tensor`` never reads overwritten memory silently.  Training regions are not graphed
(stax/__init__.py): their saved activations and gradients outlive the call by design.

Testing without a GPU: the capture and replay are an object made by ``graph_factory(device)``
(:class:`CUDAGraph` by default) with ``warmup(fn)``, ``capture(call, inputs)`` and ``replay()``;
the lifetime logic above is device-neutral and is tested on CPU with a stand-in that re-runs the
captured call into the captured outputs (test/stax/test_cudagraphs.py).
"""
from __future__ import annotations

import warnings
import weakref

import torch

__all__ = ["cudagraphify", "CUDAGraphed", "CUDAGraph", "OutputLifetimes", "StaleOutput", "STALE_MESSAGE"]

STALE_MESSAGE = ("tp.compile(mode='reduce-overhead'): this output of call {n} was overwritten by call {m} "
                 "(CUDA graph replay, §9.9); clone() it to keep it")


class StaleOutput:
    """What a stale output's ``tp.Tensor`` holds instead of its storage tensor: every use raises
    :data:`STALE_MESSAGE` (attribute reads and methods through ``__getattr__``, Python's
    protocols through the dunders below, torch functions through ``__torch_function__``)."""

    __slots__ = ("call", "by")

    def __init__(self, call: int, by: int):
        self.call, self.by = call, by

    def error(self) -> RuntimeError:
        return RuntimeError(STALE_MESSAGE.format(n=self.call, m=self.by))

    def __getattr__(self, name):
        raise self.error()

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        for a in list(args) + list((kwargs or {}).values()):
            for x in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(x, StaleOutput):
                    raise x.error()
        raise RuntimeError(STALE_MESSAGE.format(n="?", m="?"))

    def _raise(self, *args, **kwargs):
        raise self.error()

    __repr__ = __str__ = __format__ = __bool__ = __len__ = __iter__ = __getitem__ = __setitem__ = _raise
    __index__ = __int__ = __float__ = __complex__ = __array__ = __dlpack__ = __dlpack_device__ = _raise
    __reduce__ = __reduce_ex__ = __copy__ = __deepcopy__ = _raise


#: Python's operator protocols (looked up on the type, not through __getattr__): each raises too
_OPERATORS = ("__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__matmul__",
              "__and__", "__or__", "__xor__", "__lshift__", "__rshift__")
for _name in _OPERATORS:
    for _form in (_name, "__r" + _name[2:], "__i" + _name[2:]):
        setattr(StaleOutput, _form, StaleOutput._raise)
for _name in ("__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(StaleOutput, _name, StaleOutput._raise)
del _name, _form


class CUDAGraph:
    """The real capture and replay: one ``torch.cuda.CUDAGraph`` in a private memory pool (a new
    one per graph), captured on a side stream, replayed on the current stream."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)
        self.graph = torch.cuda.CUDAGraph()

    def warmup(self, fn):
        """``fn()`` eagerly on the side stream, ordered after the current stream's work and before
        its later work (stream waits, no host synchronisation)."""
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            out = fn()
        current.wait_stream(self.stream)
        return out

    def capture(self, call, inputs):
        """``call(list(inputs))`` captured into the graph (its kernels do not run now); returns its
        outputs, which live in the graph's pool.  ("thread_local": another thread's CUDA calls,
        e.g. a compile pool's, do not invalidate the capture.)"""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.graph(self.graph, stream=self.stream, capture_error_mode="thread_local"):
            out = call(list(inputs))
        return out

    def replay(self):
        self.graph.replay()


def _expanded(t):
    """The index that selects one element along each broadcast dim (stride 0, size > 1) of ``t``,
    or None: such a dim has one element in memory, and ``copy_`` into it must see it once."""
    dims = [d for d, (n, s) in enumerate(zip(t.shape, t.stride())) if s == 0 and n > 1]
    if not dims:
        return None
    return tuple(slice(0, 1) if d in dims else slice(None) for d in range(t.dim()))


def _overlaps(t) -> bool:
    """Might two elements of ``t`` share memory?  (False when, with the dims sorted by stride,
    each stride steps over everything the smaller ones reach: the layouts of dense tensors, their
    permutations and slices.)"""
    reach = 0
    for n, st in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if st <= reach:
            return True
        reach += st * (n - 1)
    return False


def _storage_ptr(t):
    return t.untyped_storage().data_ptr()


class CUDAGraphed:
    """What :func:`cudagraphify` returns: ``self(args)`` has the contract of ``call(args)``.

    Attributes: ``calls`` (calls so far: the number ``N`` of the latest), ``counters``
    (``warmups``, ``captures``, ``replays``, ``direct``), ``static_inputs`` and ``static_outputs``
    (after the capture), ``last_replayed`` (did the latest call replay?) and ``pooled`` (indices of
    the outputs a replay writes into the pool: neither an input nor a ``fixed`` tensor), ``mutated``
    (indices of the inputs the graph writes, copied back after each replay)."""

    def __init__(self, call, *, warmup=1, static_argnums=(), spare=None, fixed=(), graph_factory=None):
        if not isinstance(warmup, int) or warmup < 1:
            raise ValueError(f"cudagraphify: warmup must be an int >= 1 (eager calls before the capture), "
                             f"got {warmup!r}")
        self.call = call
        self.warmup = warmup
        self.static_argnums = frozenset(static_argnums)
        self.spare = spare
        self.fixed = fixed if isinstance(fixed, dict) else tuple(fixed)
        self.graph_factory = graph_factory
        self.calls = 0
        self.counters = {"warmups": 0, "captures": 0, "replays": 0, "direct": 0}
        self.last_replayed = False
        self.pooled: tuple = ()
        self.mutated: tuple = ()
        self.static_inputs = None
        self.static_outputs = None
        self.disabled = None     # why calls run ``call`` directly for good (a failed capture), or None
        self._graph = None       # made by graph_factory at the first warm-up
        self._replay = None      # the capture's replay(), once captured
        self._checks = ()        # per input: (size, stride, dtype, device, broadcast index) or None (static)
        self._aliases = ()       # (output index, input index, same tensor?) of outputs that are inputs

    # ---- the call ------------------------------------------------------------------------------------
    def __call__(self, args):
        self.calls += 1
        replay = self._replay
        if replay is None:
            return self._before_capture(args)
        statics = self.static_inputs
        if len(args) != len(statics):
            return self._direct(args)
        for a, s, chk in zip(args, statics, self._checks):
            if a is s:
                continue
            if chk is None:                        # a static_argnums input given another tensor
                return self._direct(args)
            size, stride, dtype, device, sel = chk
            if a.dtype is not dtype or a.size() != size or a.stride() != stride or a.device != device:
                return self._direct(args)
            if sel is None:
                s.copy_(a)
            else:
                s[sel].copy_(a[sel])
        return self._run_replay(args)

    def _run_replay(self, args):
        statics = self.static_inputs
        if self._aliases or self.mutated:
            held = list(args)                      # (the caller's tensors, for write-back and aliases)
        args.clear()
        self._replay()
        self.counters["replays"] += 1
        self.last_replayed = True
        outs = self.static_outputs
        if self.mutated:
            for i in self.mutated:
                if held[i] is not statics[i]:
                    held[i].copy_(statics[i])
        if self._aliases:
            outs = list(outs)
            for j, i, same in self._aliases:
                o, a, s = outs[j], held[i], statics[i]
                if a is not s:                     # the caller's tensor (or the same view of it)
                    outs[j] = a if same else a.as_strided(o.size(), o.stride(),
                                                          o.storage_offset() - s.storage_offset() + a.storage_offset())
            outs = tuple(outs)
        return outs

    def _direct(self, args):
        self.counters["direct"] += 1
        self.last_replayed = False
        return self.call(args)

    # ---- warm-up and capture -------------------------------------------------------------------------
    def _before_capture(self, args):
        if self.disabled is not None:
            return self._direct(args)
        if not all(isinstance(a, torch.Tensor) for a in args) or not args:
            return self._disable(args, "its arguments are not all tensors")
        if self._graph is None:
            factory = self.graph_factory if self.graph_factory is not None else CUDAGraph
            self._graph = factory(args[0].device)
        if self.counters["warmups"] < self.warmup:
            self.counters["warmups"] += 1
            self.last_replayed = False
            return self._graph.warmup(lambda: self.call(args))
        return self._capture(args)

    def _disable(self, args, why):
        self.disabled = why
        warnings.warn(f"tp.compile(mode='reduce-overhead'): no CUDA graph for this graph ({why}); it runs "
                      f"without one", RuntimeWarning, stacklevel=4)
        return self._direct(args)

    def _capture(self, args):
        statics, checks = [], []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                statics.append(a)
                checks.append(None)
                continue
            sel = _expanded(a)
            with torch.inference_mode(False):      # (a tensor with a version counter: see mutated)
                s = torch.empty_strided(a.size(), a.stride(), dtype=a.dtype, device=a.device)
            dst = s if sel is None else s[sel]
            if _overlaps(dst):
                return self._disable(args, f"input {i} overlaps itself in memory (strides {a.stride()})")
            dst.copy_(a if sel is None else a[sel])
            statics.append(s)
            checks.append((a.size(), a.stride(), a.dtype, a.device, sel))
        if self.spare is not None:
            self.spare.clear()                     # (module docstring: only pool memory in the graph)
        versions = [s._version for s in statics]
        try:
            outs = self._graph.capture(self.call, statics)
        except Exception as e:                     # e.g. an op that synchronises cannot be captured
            if self.spare is not None:
                self.spare.clear()
            return self._disable(args, f"the capture failed: {type(e).__name__}: {e}")
        outs = tuple(outs)
        self.counters["captures"] += 1
        self.static_inputs, self.static_outputs, self._checks = statics, outs, tuple(checks)
        self.mutated = tuple(i for i, s in enumerate(statics) if s._version != versions[i]
                             and i not in self.static_argnums)
        inputs = {}
        for i, s in enumerate(statics):
            inputs.setdefault(_storage_ptr(s), i)
        fixed = self.fixed.values() if isinstance(self.fixed, dict) else self.fixed
        fixed = {_storage_ptr(t) for t in fixed if isinstance(t, torch.Tensor)}
        aliases, pooled = [], []
        for j, o in enumerate(outs):
            p = _storage_ptr(o)
            if p == 0:                             # no memory (no elements): nothing to overwrite
                continue
            if p in inputs:
                i = inputs[p]
                aliases.append((j, i, o is statics[i]))
            elif p not in fixed:
                pooled.append(j)
        self._aliases, self.pooled = tuple(aliases), tuple(pooled)
        self._replay = self._graph.replay
        return self._run_replay(args)


def cudagraphify(call, *, warmup=1, static_argnums=(), spare=None, fixed=(), graph_factory=None) -> CUDAGraphed:
    """``call`` (``call(args)``: a list of CUDA torch tensors in, a tuple of tensors out, the list
    cleared) replayed as one CUDA graph (module docstring).

    ``warmup``: calls that run ``call`` eagerly on a side stream before the capture (>= 1).
    ``static_argnums``: inputs whose tensor is the same at every call (parameters, lifted free
    tensors): used in place, never copied; another tensor there runs ``call`` directly.
    ``spare``: the dict ``call`` keeps buffers in between calls (the wrapper's module-level
    ``spare``), emptied before the capture.  ``fixed``: tensors outside the pool that ``call`` may
    return (the wrapper's ``constants``; a dict is read at the capture): such outputs are never
    stale.  ``graph_factory(device)``: makes the object with ``warmup(fn)``, ``capture(call,
    inputs)`` and ``replay()`` (default :class:`CUDAGraph`; a stand-in for testing on CPU)."""
    return CUDAGraphed(call, warmup=warmup, static_argnums=static_argnums, spare=spare, fixed=fixed,
                       graph_factory=graph_factory)


class OutputLifetimes:
    """``self(args)``: the graphed call's outputs as ``tp.Tensor`` (``wrap``), after poisoning the
    ``tp.Tensor`` outputs of the previous replay that still hold their pool tensor (the
    output-lifetime rule, module docstring).  O(#outputs) Python work per replay; nothing for a
    warm-up or direct call (their outputs are ordinary tensors, and the pool was not written)."""

    def __init__(self, graphed: CUDAGraphed, wrap=None):
        if wrap is None:
            from ....._tensor import _wrap as wrap
        self.graphed = graphed
        self.wrap = wrap
        self._live: list = []      # [(weak ref to a handed-out tp.Tensor, the pool tensor it holds)]
        self._call = 0             # the call whose outputs _live holds

    def __call__(self, args):
        g, wrap = self.graphed, self.wrap
        outs = g(args)
        res = tuple([wrap(o) for o in outs])
        if g.last_replayed:
            if self._live:
                n, m = self._call, g.calls
                for ref, o in self._live:
                    t = ref()
                    if t is not None and t._data is o:
                        t._data = StaleOutput(n, m)
            self._live = [(weakref.ref(res[j]), outs[j]) for j in g.pooled]
            self._call = g.calls
        return res
