"""Random lowering rules (chapter §6.2; docs/stax.md "Random numbers"): counter-based streams.

rand, randn, randint, bernoulli, native_dropout and the in-place fills (functionalisation applies
them to a private clone) are Pointwise values of a Philox4x32-10 stream: element i of random op k
is a function of (the seed the call drew, k, i), so a random value is fused into its consumers and
may be recomputed by several readers, all of which see the same numbers.  The numbers are not
eager's (eager's generator is sequential); ``choices.eager_random()`` calls eager's kernels
instead.  randperm, multinomial and the graph's seed are library kernels.
"""
from __future__ import annotations

import math

import sympy
import torch

from .. import choices
from ..ir import Pointwise, TensorBox, Unsupported, contiguous_strides
from ..ops_handler import ops
from .pointwise_rules import _device
from .registry import V, _out_val, register_lowering


# ---- random ops: counter-based streams (docs/stax.md "Random numbers") -------------------------------
# Element i of random op k of a graph is Philox4x32-10 of (the seed the call drew, k, i), computed
# inside the consuming kernel: ``x + tp.rand_like(x)`` or dropout is one kernel that writes no
# random tensor.  Being a function of its index like every other value, a random value may be
# inlined into several readers and recomputed: every reader sees the same numbers (dropout's
# output and its saved mask).  The numbers are not eager's (ATen's generator is sequential);
# TP_STAX_FALLBACK_RANDOM=1 calls eager's kernels instead (choices.eager_random).
def _random_stream(shape):
    """A new stream of the graph for a random op of this shape: ``draw(index) -> (seed, offset,
    stream)``, the arguments of ``ops.rand``/``randn``/``randint64`` for element ``index``
    (``offset``: its row-major index as an int64 value)."""
    seed_name, stream = V.graph.random_stream()
    strides = contiguous_strides(shape)

    def draw(i):
        offset = ops.index_expr(sum((s * x for s, x in zip(strides, i)), sympy.Integer(0)), torch.int64)
        return ops.load(seed_name, sympy.Integer(0)), offset, stream
    return draw


def _random_value(fn, generator=None):
    """The op's output as a Pointwise ``fn(seed, offset, stream)`` of a new stream.  An explicit
    generator keeps eager's kernel (a fallback), which draws from that generator."""
    if generator is not None:
        raise Unsupported("an explicit generator (eager's kernel draws from it)")
    if choices.eager_random():
        return V.graph.extern("eager's generator (TP_STAX_FALLBACK_RANDOM=1)")
    out = _out_val()
    draw = _random_stream(tuple(out.shape))
    return TensorBox(Pointwise(out.dtype, _device((), out), tuple(out.shape), lambda i: fn(*draw(i))))


def _floating_random(kind):
    def rule(size, generator=None, dtype=None, device=None):
        dt = _out_val().dtype
        return _random_value(lambda seed, off, k: getattr(ops, kind)(seed, off, k, dt), generator)
    return rule


register_lowering("_rand")(_floating_random("rand"))
register_lowering("_randn")(_floating_random("randn"))


@register_lowering("_randint")
def _randint(low, high, size, generator=None, dtype=None, device=None):
    return _random_value(_random_fill(_out_val().dtype, low, high), generator)


def _keep(seed, off, k, p):
    """True with probability 1 - p (ATen's bernoulli_(1 - p) of dropout's mask): u < 1 - p for a
    float32 uniform u = m * 2^-24 (m an integer below 2^24).  m < x holds exactly when m <
    ceil(x), so the test is u < ceil((1 - p) * 2^24) * 2^-24, a float32 constant: no conversion to
    double, the same decisions as comparing with 1 - p in double."""
    u = ops.rand(seed, off, k, torch.float32)
    return ops.lt(u, ops.constant(math.ceil((1.0 - p) * 2.0 ** 24) * 2.0 ** -24, torch.float32))


@register_lowering("bernoulli")
def _bernoulli(x, p=None, generator=None):
    """``bernoulli(x, p)`` with a float p: 1 with probability p in x's dtype.  Tensor probabilities
    stay eager's kernel: it checks them in [0, 1] and raises (a kernel here could not)."""
    if p is None:
        raise Unsupported("tensor probabilities (eager checks them in [0, 1])")
    return _random_value(_bernoulli_fill(_out_val().dtype, p), generator)


@register_lowering("native_dropout")
def _native_dropout(x, p, train):
    """``(x * mask * scale, mask)`` with mask true with probability 1 - p and scale = 1/(1 - p)
    (0 for p = 1), in eager's order of operations: a dropped inf or NaN gives NaN, as in eager.
    ``train=False`` is the identity with an all-true mask.  The output and the mask are two
    Pointwise values of the same stream: either may be inlined into its readers."""
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"p={p} outside [0, 1] (eager's kernel raises)")
    dt = x.dtype
    shape = tuple(x.get_size())
    if train is False:
        load = x.make_loader()
        return (TensorBox(Pointwise(dt, x.device, shape, lambda i: load(i))),
                TensorBox(Pointwise(torch.bool, x.device, shape, lambda i: ops.constant(True, torch.bool))))
    if choices.eager_random():
        return V.graph.extern("eager's generator (TP_STAX_FALLBACK_RANDOM=1)")
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    draw = _random_stream(shape)
    load = x.make_loader()

    def keep(i):
        return _keep(*draw(i), p)

    def output(i):
        return ops.mul(ops.mul(load(i), ops.to_dtype(keep(i), dt)), ops.constant(scale, dt))
    return (TensorBox(Pointwise(dt, x.device, shape, output)), TensorBox(Pointwise(torch.bool, x.device, shape, keep)))


# In-place fills: functionalisation applies them to a private clone (passes/functionalize.py), so
# the new value is simply a fresh random value of the clone's shape and dtype.  Each maker checks
# the arguments (what eager would raise on stays eager's kernel) and returns the compute function.
def _fill(make):
    def rule(x, *args):
        *params, generator = args
        return _random_value(make(x.dtype, *params), generator)
    return rule


def _uniform_fill(dt, lo, hi):
    if not dt.is_floating_point:
        raise Unsupported("uniform_ of an integer tensor")
    return lambda seed, off, k: ops.add(ops.mul(ops.rand(seed, off, k, dt), ops.constant(hi - lo, dt)),
                                        ops.constant(lo, dt))


def _normal_fill(dt, mean, std):
    if not dt.is_floating_point or std < 0:
        raise Unsupported("normal_ of an integer tensor or with std < 0 (eager raises)")
    return lambda seed, off, k: ops.add(ops.mul(ops.randn(seed, off, k, dt), ops.constant(std, dt)),
                                        ops.constant(mean, dt))


def _exponential_fill(dt, lambd):
    """-log(1 - u) / lambd, u in [0, 1): finite, >= 0."""
    if not dt.is_floating_point or not lambd > 0:
        raise Unsupported("exponential_ of an integer tensor or with lambd <= 0 (eager raises)")
    return lambda seed, off, k: ops.truediv(ops.neg(ops.log1p(ops.neg(ops.rand(seed, off, k, dt)))),
                                            ops.constant(lambd, dt))


def _bernoulli_fill(dt, p):
    if isinstance(p, TensorBox) or not 0 <= p <= 1:
        raise Unsupported("bernoulli_ with tensor probabilities or p outside [0, 1] (eager's kernel)")
    return lambda seed, off, k: ops.to_dtype(ops.logical_not(_keep(seed, off, k, p)), dt)


def _random_fill(dt, lo, hi):
    """Integers on [lo, hi) in dtype dt (randint; random_(from, to) and random_(to))."""
    if lo is not None and hi is None:
        lo, hi = 0, lo
    if lo is None or not lo < hi:
        raise Unsupported(f"no range or an empty range [{lo}, {hi}) (eager's kernel)")

    def value(seed, off, k):
        v = ops.randint64(seed, off, k, lo, hi)
        return v if dt == torch.int64 else ops.to_dtype(v, dt)
    return value


for _name, _make in (("uniform_", _uniform_fill), ("normal_", _normal_fill), ("exponential_", _exponential_fill),
                     ("bernoulli_", _bernoulli_fill), ("random_", _random_fill)):
    register_lowering(_name)(_fill(_make))


# sampling by sorting and searching: library kernels (their consumers still fuse); a seed drawn
# inside a traced program is the generator's call too
@register_lowering("_randperm", "multinomial", "_random_seed")
def _generator_kernel(*args):
    return V.graph.extern("library kernel (ATen's generator)")
