"""Factories: tensors made from sizes, data or random draws (chapter §1.1).

Ops with no tensor inputs (``zeros``, ``rand``...) are table entries tagged ``factory`` (and
``random``), so the tracer and the compiler see them; the Python wrappers below accept
``zeros(2, 3)`` as well as ``zeros((2, 3))`` and the ``dtype``/``device``/``requires_grad`` keywords.
``tensor``/``as_tensor`` build from Python data and are not ops (their input is not a tensor).
RNG: the global ATen generator (``tp.default_generator``, seeded by ``manual_seed``), or the
``generator=`` a random factory is given: a :class:`Generator` or a ``torch.Generator``, passed to
ATen's kernel as it is, so the numbers are PyTorch's for a generator seeded the same way.

Legacy constructors, as in PyTorch: ``tp.Tensor(2, 3)`` / ``tp.Tensor(torch.Size([2, 3]))`` (an
uninitialised tensor of that size in the default dtype; one int is a size too), ``tp.Tensor([1, 2])``
(data converted to the default floating dtype), ``tp.Tensor()`` (empty); the typed classes
``FloatTensor``, ``DoubleTensor``, ``HalfTensor``, ``BFloat16Tensor``, ``LongTensor``, ``IntTensor``,
``ShortTensor``, ``CharTensor``, ``ByteTensor``, ``BoolTensor`` take sizes or data the same way in
their dtype, ``isinstance(x, tp.LongTensor)`` tests for a CPU tensor of that dtype, and ``x.type()``
names the type as PyTorch does (``x.type(tp.LongTensor)`` or ``x.type('torch.LongTensor')`` casts).
"""
from __future__ import annotations

import numbers

import numpy as np
import torch

from .._tensor import Tensor, _wrap
from .registry import register

__all__ = ["tensor", "as_tensor", "zeros", "ones", "full", "empty", "empty_strided", "arange", "linspace", "logspace", "eye", "rand", "randn",
           "randint", "randperm", "zeros_like", "ones_like", "full_like", "empty_like", "rand_like", "randn_like",
           "randint_like", "manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "scalar_tensor",
           "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
           "CharTensor", "ByteTensor", "BoolTensor", "Generator", "default_generator", "normal"]

F = ("factory",)
R = ("factory", "random", "nondeterministic")
_KW = "*, ScalarType? dtype=None, Device? device=None"
_RKW = "*, Generator? generator=None, ScalarType? dtype=None, Device? device=None"   # random factories

register(f"_zeros(int[] size, {_KW}) -> Tensor", lambda size, dtype, device: torch.zeros(size, dtype=dtype, device=device),
         tags=F, method=False)
register(f"_ones(int[] size, {_KW}) -> Tensor", lambda size, dtype, device: torch.ones(size, dtype=dtype, device=device),
         tags=F, method=False)
register(f"_empty(int[] size, {_KW}) -> Tensor", lambda size, dtype, device: torch.empty(size, dtype=dtype, device=device),
         tags=F, method=False)
register(f"_empty_strided(int[] size, int[] stride, {_KW}) -> Tensor",
         lambda size, stride, dtype, device: torch.empty_strided(size, stride, dtype=dtype, device=device), tags=F,
         method=False)
register(f"_full(int[] size, Scalar fill_value, {_KW}) -> Tensor",
         lambda size, fill_value, dtype, device: torch.full(size, fill_value, dtype=dtype, device=device), tags=F, method=False)
register(f"_arange(Scalar start, Scalar end, Scalar step=1, {_KW}) -> Tensor",
         lambda start, end, step, dtype, device: torch.arange(start, end, step, dtype=dtype, device=device), tags=F,
         method=False)
register(f"_linspace(Scalar start, Scalar end, int steps, {_KW}) -> Tensor",
         lambda start, end, steps, dtype, device: torch.linspace(start, end, steps, dtype=dtype, device=device),
         tags=F, method=False)
register(f"_logspace(Scalar start, Scalar end, int steps, float base=10.0, {_KW}) -> Tensor",
         lambda start, end, steps, base, dtype, device: torch.logspace(start, end, steps, base, dtype=dtype,
                                                                       device=device), tags=F, method=False)
register(f"_eye(int n, int? m=None, {_KW}) -> Tensor",
         lambda n, m, dtype, device: torch.eye(n, n if m is None else m, dtype=dtype, device=device), tags=F, method=False)


def _random_factory(fn, shape, default_dtype=None):
    """Kernel and meta of a random factory: ``fn``'s leading arguments, then generator, dtype,
    device.  The kernel passes ``generator=`` only when one is given (ATen's generator overloads
    take no symbolic sizes, and dynamic=True captures run kernels on them); the meta (``shape`` of
    the leading arguments, no draw: a generator's state is left alone) is an empty tensor."""
    def kernel(*args):
        *lead, generator, dtype, device = args
        kw = {} if generator is None else {"generator": generator}
        return fn(*lead, **kw, dtype=dtype or default_dtype, device=device)

    def meta(*args):
        *lead, _, dtype, device = args
        return torch.empty(shape(*lead), dtype=dtype or default_dtype, device=device)
    return {"eager": kernel, "meta": meta}


def _size_last(*lead):
    return lead[-1]


register(f"_rand(int[] size, {_RKW}) -> Tensor", **_random_factory(torch.rand, _size_last), tags=R, method=False)
register(f"_randn(int[] size, {_RKW}) -> Tensor", **_random_factory(torch.randn, _size_last), tags=R, method=False)
register(f"_randint(int low, int high, int[] size, {_RKW}) -> Tensor",
         **_random_factory(torch.randint, _size_last, torch.int64), tags=R, method=False)
register(f"_randperm(int n, {_RKW}) -> Tensor", **_random_factory(torch.randperm, lambda n: (n,), torch.int64),
         tags=R, method=False)
register(f"_normal(float mean, float std, int[] size, {_RKW}) -> Tensor",
         **_random_factory(torch.normal, _size_last), tags=R, method=False)
# The seed of a compiled graph's random streams: Stax draws one per call of a graph with random
# ops (its kernels compute Philox of (seed, op, element); docs/stax.md "Random numbers").  From the
# global generator, so that ``manual_seed`` makes compiled random ops repeatable.
register("_random_seed() -> Tensor", lambda: torch.randint(-2**63, 2**63 - 1, (), dtype=torch.int64),
         tags=R, method=False, differentiable=False)


def _size(size, who):
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    out = []
    for s in size:
        if isinstance(s, Tensor):
            s = int(s.item())
        if isinstance(s, torch.SymInt):    # a symbolic size under tp.compile(dynamic=True): kept a symbol
            out.append(s)
            continue
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool):
            raise TypeError(f"tp.{who}: sizes must be integers, got {size!r}")
        if s < 0:
            raise RuntimeError(f"tp.{who}: negative dimension {s} in size {list(size)}")
        out.append(int(s))
    return tuple(out)


def _finish(t, requires_grad):
    if requires_grad:
        t.requires_grad_(True)
    return t


def _mk(opname, who, random=False):
    from .registry import OPS
    fn = OPS[opname].fn

    def f(*args, size=None, generator=None, dtype=None, device=None, requires_grad=False, out=None, layout=None,
          pin_memory=False):
        if size is not None:
            if args:
                raise TypeError(f"tp.{who}: got the size both positionally and as size=")
            args = (size,)
        kw = {"generator": _generator(generator, who)} if random else {}
        if generator is not None and not random:
            raise TypeError(f"tp.{who}: got an unexpected keyword argument 'generator'")
        return _finish(fn(_size(args, who), **kw, dtype=dtype, device=device), requires_grad)
    f.__name__ = who
    f.__doc__ = (f"tp.{who}(*size, {'generator=None, ' if random else ''}dtype=None, device=None, "
                 f"requires_grad=False); also tp.{who}(size=...)")
    return f


zeros = _mk("_zeros", "zeros")
ones = _mk("_ones", "ones")
empty = _mk("_empty", "empty")
rand = _mk("_rand", "rand", random=True)
randn = _mk("_randn", "randn", random=True)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False):
    from .registry import OPS
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    return _finish(OPS["_full"].fn(_size((size,), "full"), fill_value, dtype=dtype, device=device), requires_grad)


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False):
    from .registry import OPS
    if end is None:
        start, end = 0, start
    if step == 0:
        raise RuntimeError("tp.arange: step must be nonzero")
    return _finish(OPS["_arange"].fn(start, end, step, dtype=dtype, device=device), requires_grad)


def _bound(v, who):
    """A 0-d tensor bound of linspace/logspace as a Python number (torch accepts both)."""
    if isinstance(v, (Tensor, torch.Tensor)):
        if v.dim() != 0:
            raise RuntimeError(f"tp.{who}: start and end must be numbers or 0-d tensors, got shape {list(v.shape)}")
        return v.item()
    return v


def linspace(start, end, steps, *, dtype=None, device=None, requires_grad=False):
    from .registry import OPS
    if steps < 0:
        raise RuntimeError(f"tp.linspace: number of steps must be non-negative, got {steps}")
    start, end = _bound(start, "linspace"), _bound(end, "linspace")
    return _finish(OPS["_linspace"].fn(start, end, steps, dtype=dtype, device=device), requires_grad)


def logspace(start, end, steps, base=10.0, *, dtype=None, device=None, requires_grad=False):
    from .registry import OPS
    if steps < 0:
        raise RuntimeError(f"tp.logspace: number of steps must be non-negative, got {steps}")
    start, end = _bound(start, "logspace"), _bound(end, "logspace")
    return _finish(OPS["_logspace"].fn(start, end, steps, base, dtype=dtype, device=device), requires_grad)


def eye(n, m=None, *, dtype=None, device=None, requires_grad=False):
    from .registry import OPS
    return _finish(OPS["_eye"].fn(n, m, dtype=dtype, device=device), requires_grad)


def randint(low, high=None, size=None, *, dtype=None, device=None, requires_grad=False, generator=None):
    from .registry import OPS
    if size is None and isinstance(high, (tuple, list, torch.Size)):   # torch's randint(high, size)
        low, high, size = 0, low, high
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("tp.randint: missing required argument 'size'")
    if high <= low:
        raise RuntimeError(f"tp.randint: expected low < high, got low={low}, high={high}")
    return OPS["_randint"].fn(low, high, _size((size,), "randint"), generator=_generator(generator, "randint"),
                              dtype=dtype, device=device)


def randperm(n, *, generator=None, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    from .registry import OPS
    if n < 0:
        raise RuntimeError(f"tp.randperm: n must be non-negative, got {n}")
    return OPS["_randperm"].fn(n, generator=_generator(generator, "randperm"), dtype=dtype, device=device)


def normal(mean, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False, out=None,
           layout=None, pin_memory=False):
    """PyTorch's four forms: ``normal(mean, std)`` with a tensor mean and/or std (the op ``normal``,
    broadcast; std may be left out, 1), and ``normal(mean, std, size)`` with numbers (the factory
    ``_normal``).  Draws are ATen's, from ``generator`` or the global generator."""
    from .registry import OPS
    g = _generator(generator, "normal")
    if isinstance(mean, (Tensor, torch.Tensor)) or isinstance(std, (Tensor, torch.Tensor)):
        if size is not None:
            raise TypeError("tp.normal: size= is for a number mean and std (the shape comes from the tensors)")
        return OPS["normal"].fn(mean, std, generator=g)
    if size is None:
        raise TypeError("tp.normal: a number mean and std need a size (normal(mean, std, size))")
    return _finish(OPS["_normal"].fn(float(mean), float(std), _size((size,), "normal"), generator=g,
                                     dtype=dtype, device=device), requires_grad)


def zeros_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return zeros(input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def ones_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return ones(input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad=False, layout=None, pin_memory=False):
    """Uninitialised memory of shape ``size`` with the given strides (PyTorch's ``empty_strided``)."""
    from .registry import OPS
    size, stride = list(size), list(stride)
    if len(size) != len(stride):
        raise RuntimeError(f"tp.empty_strided: size {size} and stride {stride} must have the same length")
    if any(n < 0 for n in size) or any(st < 0 for st in stride):
        raise RuntimeError(f"tp.empty_strided: sizes and strides must be non-negative, got size {size}, stride {stride}")
    return _finish(OPS["_empty_strided"].fn(size, stride, dtype=dtype, device=device), requires_grad)


def empty_like(input, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return empty(input.shape, dtype=dtype or input.dtype, device=device or input.device, requires_grad=requires_grad)


def full_like(input, fill_value, *, dtype=None, device=None, requires_grad=False, memory_format=None):
    return full(input.shape, fill_value, dtype=dtype or input.dtype, device=device or input.device,
                requires_grad=requires_grad)


def rand_like(input, *, generator=None, dtype=None, device=None, requires_grad=False, memory_format=None):
    return rand(input.shape, generator=generator, dtype=dtype or input.dtype, device=device or input.device,
                requires_grad=requires_grad)


def randn_like(input, *, generator=None, dtype=None, device=None, requires_grad=False, memory_format=None):
    return randn(input.shape, generator=generator, dtype=dtype or input.dtype, device=device or input.device,
                 requires_grad=requires_grad)


def randint_like(input, low, high=None, *, generator=None, dtype=None, device=None):
    return randint(low, high, input.shape, generator=generator, dtype=dtype or input.dtype,
                   device=device or input.device)


def _infer(data):
    if isinstance(data, Tensor):
        return data._data
    if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in data):
        return [_infer(x) if not isinstance(x, Tensor) else x._data.tolist() for x in data]
    return data


def tensor(data, *, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """Copy ``data`` (nested lists, numbers, numpy arrays, Tensors) into a new tensor."""
    if isinstance(data, Tensor):
        d = data._data.detach().clone().to(dtype=dtype or data.dtype, device=device or data.device)
    elif isinstance(data, np.ndarray):
        d = torch.tensor(data, dtype=dtype, device=device)
    else:
        try:
            d = torch.tensor(_infer(data), dtype=dtype, device=device)
        except (TypeError, ValueError, RuntimeError) as e:
            raise type(e)(f"tp.tensor: cannot build a tensor from {type(data).__name__}: {e}") from e
    return _finish(_wrap(d), requires_grad)


def as_tensor(data, dtype=None, device=None):
    """Like ``tensor`` but shares memory with ``data`` when it already is a tensor / array of the
    requested dtype and device."""
    if isinstance(data, Tensor):
        return data.to(dtype=dtype, device=device) if (dtype or device) else data
    return _wrap(torch.as_tensor(data, dtype=dtype, device=device))


def scalar_tensor(s, *, dtype=None, device=None, layout=None, pin_memory=None, requires_grad=False):
    t = _wrap(torch.scalar_tensor(s, dtype=dtype or torch.get_default_dtype(), device=device, layout=layout,
                                  pin_memory=pin_memory))
    return t.requires_grad_(True) if requires_grad else t


class _GeneratorMeta(type(torch.Generator)):
    def __instancecheck__(cls, obj):
        return isinstance(obj, torch.Generator)


class Generator(torch.Generator, metaclass=_GeneratorMeta):
    """``tp.Generator(device='cpu')``: a random-number generator of its own, independent of the
    global one and of other generators.  It is ``torch.Generator``'s subclass, so every random op
    and ``nn.init`` / data-loading function hands it to ATen's kernel as it is and draws the numbers
    PyTorch draws from a ``torch.Generator`` seeded the same way.  ``manual_seed`` (returns the
    generator), ``seed``, ``initial_seed``, ``device`` and ``get_offset``/``set_offset`` are torch's;
    ``get_state`` returns a tp uint8 tensor and ``set_state`` takes a tp or a torch tensor; a pickled
    or deep-copied generator is a ``tp.Generator`` in the same state.  ``isinstance(g,
    tp.Generator)`` holds for any ``torch.Generator`` (``tp.default_generator`` included), as
    PyTorch programs expect."""

    def get_state(self):
        return _wrap(super().get_state())

    def set_state(self, new_state):
        super().set_state(new_state._data if isinstance(new_state, Tensor) else new_state)
        return self

    def __reduce__(self):   # torch's, rebuilding this class (pickle, copy.deepcopy)
        _, args, state = super().__reduce__()
        return type(self), args, state

    def __repr__(self):
        return f"<tensorplay.Generator device={self.device} initial_seed={self.initial_seed()}>"


#: The global generator: ``tp.manual_seed`` seeds it and random ops without ``generator=`` draw
#: from it.  It is ``torch.default_generator`` itself (ATen's global CPU generator, which no
#: subclass instance can stand for), so its ``get_state`` returns a torch uint8 tensor
#: (``tp.get_rng_state()`` returns the same state as a tp tensor).
default_generator = torch.default_generator


def _generator(g, who):
    """``g`` if it is None or a generator; a TypeError naming the op otherwise."""
    if g is None or isinstance(g, torch.Generator):
        return g
    raise TypeError(f"tp.{who}: generator must be a tp.Generator or torch.Generator, got {type(g).__name__}")


def manual_seed(seed: int):
    """Seed the global generator (and the accelerators'); returns ``tp.default_generator``, as
    ``torch.manual_seed`` returns ``torch.default_generator``."""
    return torch.manual_seed(seed)


def seed():
    return torch.seed()


def initial_seed():
    return torch.initial_seed()


def get_rng_state():
    return _wrap(torch.get_rng_state())


def set_rng_state(state):
    torch.set_rng_state(state._data if isinstance(state, Tensor) else state)


# ---- legacy constructors ----------------------------------------------------------------------------
def _is_size(args):
    return all(isinstance(a, (int, np.integer, torch.SymInt)) and not isinstance(a, bool) for a in args)


def legacy_data(who, args, dtype, device, explicit):
    """The storage of ``tp.Tensor(*args)`` / ``tp.<Type>Tensor(*args)``: sizes (ints or one
    ``torch.Size``) give an uninitialised tensor of ``dtype``; one sequence, array or number gives its
    data converted to ``dtype``; a tensor is taken as it is (cast when ``explicit``: a dtype or device
    keyword was given).  A single int with an explicit dtype/device is data (a 0-d tensor), without
    them a size, as in PyTorch's legacy constructor."""
    if not args or (len(args) == 1 and args[0] is None):
        return torch.empty(0, dtype=dtype, device=device)
    if len(args) == 1 and isinstance(args[0], (Tensor, torch.Tensor)):
        d = args[0]._data if isinstance(args[0], Tensor) else args[0]
        return d.to(dtype=dtype, device=device) if explicit else d
    if len(args) == 1 and isinstance(args[0], torch.Size):
        return torch.empty(args[0], dtype=dtype, device=device)
    if _is_size(args) and (len(args) > 1 or not explicit):
        if any(int(a) < 0 for a in args):
            raise RuntimeError(f"tp.{who}: negative dimension in size {list(args)}")
        return torch.empty([int(a) for a in args], dtype=dtype, device=device)
    if len(args) != 1:
        raise TypeError(f"tp.{who}: expected sizes (ints) or one sequence of data, got {len(args)} arguments "
                        f"of types {[type(a).__name__ for a in args]}")
    data = args[0]
    if isinstance(data, str):
        raise TypeError(f"tp.{who}: data must be a sequence, array or number (got str)")
    try:
        return torch.as_tensor(np.asarray(data) if not isinstance(data, (list, tuple, numbers.Number)) else
                               _infer(data), dtype=dtype, device=device)
    except (TypeError, ValueError, RuntimeError) as e:
        raise type(e)(f"tp.{who}: cannot build a tensor from {type(data).__name__}: {e}") from e


class _TypedTensorMeta(type):
    """``tp.LongTensor(...)`` builds a ``tp.Tensor`` of int64; ``isinstance(x, tp.LongTensor)`` asks
    whether ``x`` is a CPU tensor of that dtype."""

    def __call__(cls, *args, device=None):
        if len(args) == 1 and isinstance(args[0], (Tensor, torch.Tensor)) and args[0].dtype != cls.dtype:
            raise TypeError(f"tp.{cls.__name__}: expected {cls.dtype} (got {args[0].dtype})")
        d = legacy_data(cls.__name__, args, cls.dtype, device, False)
        return _wrap(d.detach() if d.requires_grad else d)

    def __instancecheck__(cls, x):
        return isinstance(x, Tensor) and x.dtype == cls.dtype and x.device.type == "cpu"


_TYPED = {}


def legacy_type(x, t=None):
    """``x.type()``: PyTorch's type name (``'torch.FloatTensor'``, ``'torch.cuda.LongTensor'``);
    ``x.type(T)`` with a typed class, such a name or a dtype: ``x`` cast to that dtype (and to CUDA
    for a ``torch.cuda.`` name)."""
    if t is None:
        name = next((n for n, c in _TYPED.items() if c.dtype == x.dtype), str(x.dtype))
        return f"torch.{'cuda.' if x.device.type == 'cuda' else ''}{name}"
    if isinstance(t, _TypedTensorMeta):
        return x.to(t.dtype)
    if isinstance(t, str):
        parts = t.split(".")
        cls = _TYPED.get(parts[-1])
        if parts[0] != "torch" or cls is None or parts[1:-1] not in ([], ["cuda"]):
            raise ValueError(f"tp.Tensor.type: invalid type {t!r}")
        return x.to(dtype=cls.dtype, device="cuda" if parts[1:-1] == ["cuda"] else None)
    return x.to(t)


def _typed(name, dtype):
    cls = _TypedTensorMeta(name, (), {"dtype": dtype, "__module__": "tensorplay",
                                       "__doc__": f"Legacy constructor of {dtype} tensors (sizes or data)."})
    _TYPED[name] = cls
    return cls


FloatTensor = _typed("FloatTensor", torch.float32)
DoubleTensor = _typed("DoubleTensor", torch.float64)
HalfTensor = _typed("HalfTensor", torch.float16)
BFloat16Tensor = _typed("BFloat16Tensor", torch.bfloat16)
LongTensor = _typed("LongTensor", torch.int64)
IntTensor = _typed("IntTensor", torch.int32)
ShortTensor = _typed("ShortTensor", torch.int16)
CharTensor = _typed("CharTensor", torch.int8)
ByteTensor = _typed("ByteTensor", torch.uint8)
BoolTensor = _typed("BoolTensor", torch.bool)
