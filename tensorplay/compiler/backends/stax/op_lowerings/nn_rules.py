"""nn lowering rules (chapter §6.2–6.5): softmax, the normalisations, pooling, upsampling, losses.

softmax and log_softmax are a max and a sum reduction over the row and a pointwise result (over
the trailing dim the row's exp becomes a per-row scratch of the one kernel when the device
backend says it fits, ``DeviceBackend.fits_row_scratch``).  layer/batch/group norm take Welford statistics (layer_norm's:
``LAYER_NORM_STATS``), rms_norm a mean of squares, and normalise pointwise; batch_norm in training
mode also writes its running statistics back, as eager.  Pooling windows of at most
``POOL_UNROLL_MAX`` elements and nearest upsampling are index maps, computed in eager's order of
comparisons and additions (bitwise equal results); their backward ops read eager's scatter loops
as gathers.  Losses are a Pointwise of (input, target) reduced like eager ('none' / 'sum' /
'mean' / kl_div's 'batchmean'); nll_loss reads the input at each sample's target (a checked
indirect load).  The forms whose lane-wise gathers measured slower than ATen are library kernels.
"""
from __future__ import annotations

import itertools
import math

import sympy
import torch

from .... import config
from .. import choices
from ..bounds import _fraction
from ..ir import Pointwise, TensorBox, Unsupported
from ..ops_handler import ops
from ..sizevars import evaluate_static_shape, size_hint
from .extern_rules import _extern
from .pointwise_rules import _conv, _realize, broadcast_loader, broadcast_size, size_constant
from .reduction_rules import LAYER_NORM_STATS, _var_parts, logsumexp_of, make_reduction, online_stats, reduction
from .registry import V, _node, _out_val, backend_of, register_lowering
from .view_rules import _and, _box, _checked, _icmp, _ix


# ---- nn ops -----------------------------------------------------------------------------------------------
def _softmax_parts(x, dim, dtype):
    xl0 = x.make_loader()
    src = x
    if dtype != x.dtype:
        src = TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.to_dtype(xl0(i), dtype)))
    m = _realize(make_reduction(src, dim, True, "max", dtype))
    ml = broadcast_loader(m, x.get_size())
    xl = src.make_loader()

    def shifted(i):
        return ops.sub(xl(i), ml(i))
    return src, shifted


@register_lowering("softmax")
def _softmax(x, dim, dtype=None):
    out = _out_val()
    if not out.dtype.is_floating_point:
        raise Unsupported("softmax of integers")
    if math.prod(x.get_size()) == 0:   # empty input: empty output, nothing to reduce
        return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.constant(0.0, out.dtype)))
    nd = max(len(x.get_size()), 1)      # a 0-d input behaves as one element along dim -1
    row = x.get_size()[dim % nd] if x.get_size() else 1
    backend = backend_of(x)
    if dim % nd == nd - 1 and backend.online_softmax(row):
        return _online_softmax(x, dim, out.dtype)
    src, shifted = _softmax_parts(x, dim, out.dtype)
    # e is read twice (the sum and the division): over the trailing dim, realized, it becomes a
    # per-row scratch value of the one fused kernel, so exp runs once per element (as in the five-op
    # softmax); over another dim it would be a separate pass through memory, and a row too long for
    # the device's scratch (device.DeviceBackend.fits_row_scratch) would be refused -- recompute it instead
    e = TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    if dim % nd == nd - 1 and backend.fits_row_scratch(row):
        _realize(e)
    s = make_reduction(e, dim, True, "sum", out.dtype)
    # one reciprocal per row, then a multiply per element — what eager's softmax kernel does
    # (a division per element costs several multiplies; the extra rounding is within the error model)
    sl0 = _realize(s).make_loader()
    r = _realize(TensorBox(Pointwise(out.dtype, x.device, s.get_size(), lambda i: ops.reciprocal(sl0(i)))))
    rl = broadcast_loader(r, x.get_size())
    el = e.make_loader()
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), lambda i: ops.mul(el(i), rl(i))))


def _online_softmax(x, dim, dtype):
    """softmax from the (m, d) monoid (Prop. 9.1): one pass over the row for its max m and
    d = sum(exp(x - m)), one for exp(x - m) / d -- for a backend whose long rows are passes through
    memory (DeviceBackend.online_softmax)."""
    src, stats = online_stats(x, dim, True, dtype)
    ml = broadcast_loader(stats["max"], x.get_size())
    r = _realize(TensorBox(Pointwise(dtype, x.device, stats["sum"].get_size(),
                                     lambda i, d=stats["sum"].make_loader(): ops.reciprocal(d(i)))))
    rl, xl = broadcast_loader(r, x.get_size()), src.make_loader()
    return TensorBox(Pointwise(dtype, x.device, x.get_size(),
                               lambda i: ops.mul(ops.exp(ops.sub(xl(i), ml(i))), rl(i))))


@register_lowering("log_softmax")
def _log_softmax(x, dim, dtype=None):
    return _log_softmax_of(x, dim, _out_val().dtype)


def _log_softmax_of(x, dim, dtype):
    if not dtype.is_floating_point:
        raise Unsupported("log_softmax of integers")
    if math.prod(x.get_size()) == 0:
        return TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.constant(0.0, dtype)))
    nd = max(len(x.get_size()), 1)
    row = x.get_size()[dim % nd] if x.get_size() else 1
    if dim % nd == nd - 1 and backend_of(x).online_softmax(row):
        # a long row: (m, d) in one pass, then x - m - log(d) (two passes, not three)
        src, stats = online_stats(x, dim, True, dtype)
        ml, dl = (broadcast_loader(stats[k], x.get_size()) for k in ("max", "sum"))
        xl = src.make_loader()
        return TensorBox(Pointwise(dtype, x.device, x.get_size(),
                                   lambda i: ops.sub(ops.sub(xl(i), ml(i)), ops.log(dl(i)))))
    src, shifted = _softmax_parts(x, dim, dtype)
    e = TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.exp(shifted(i))))
    s = _realize(make_reduction(e, dim, True, "sum", dtype))
    sl = broadcast_loader(s, x.get_size())
    return TensorBox(Pointwise(dtype, x.device, x.get_size(), lambda i: ops.sub(shifted(i), ops.log(sl(i)))))


def _normalized(x, mean, var, eps, weight, bias, dt):
    """The compute function ``(x - mean) * rsqrt(var + eps) [* weight] [+ bias]`` of layer_norm,
    batch_norm and group_norm: every argument a loader over the output index (weight/bias None
    when absent), eps a constant of dtype ``dt``."""
    def f(i):
        y = ops.mul(ops.sub(x(i), mean(i)), ops.rsqrt(ops.add(var(i), ops.constant(float(eps), dt))))
        if weight is not None:
            y = ops.mul(y, weight(i))
        return ops.add(y, bias(i)) if bias is not None else y
    return f


def _channel_loader(t, dt):
    """A per-channel (C,) tensor as a loader over an (N, C, ...) index, converted to ``dt``; None
    for an absent (non-tensor) argument."""
    if not isinstance(t, TensorBox):
        return None
    ld = t.make_loader()
    return lambda i: _conv(ld([i[1]]), t.dtype, dt)


#: float dtypes the norms compute in float32 (loads widened, the result narrowed on store), as
#: eager's kernels do; the Triton backend has them natively (DeviceBackend.native_dtypes)
NORM_COMPUTE = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
                torch.float32: torch.float32, torch.float64: torch.float64}


def _norm_compute_dtype(op: str, dtype):
    """The dtype a norm's statistics and affine map are computed in (NORM_COMPUTE)."""
    if dtype not in NORM_COMPUTE:
        raise Unsupported(f"{op} dtype {dtype}")
    return NORM_COMPUTE[dtype]


def _widened(box, dt):
    """``box`` read as ``dt`` (a view-like pointwise conversion; ``box`` itself when it is ``dt``)."""
    if not isinstance(box, TensorBox) or box.dtype == dt:
        return box
    ld = box.make_loader()
    return TensorBox(Pointwise(dt, box.device, box.get_size(), lambda i: _conv(ld(i), box.dtype, dt)))


def _narrowed(f, dt, out_dtype):
    """The compute function ``f`` (values of ``dt``) stored as ``out_dtype``."""
    return f if dt == out_dtype else (lambda i: _conv(f(i), dt, out_dtype))


@register_lowering("layer_norm")
def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    out = _out_val()
    dt = _norm_compute_dtype("layer_norm", out.dtype)
    x, weight, bias = (_widened(t, dt) for t in (x, weight, bias))
    n = len(x.get_size())
    k = len(normalized_shape)
    dims = list(range(n - k, n))
    var, mean = LAYER_NORM_STATS(x, dims, 0, True, dt)
    vl, mlo = broadcast_loader(var, x.get_size()), broadcast_loader(mean, x.get_size())
    wl = broadcast_loader(weight, x.get_size()) if isinstance(weight, TensorBox) else None
    bl = broadcast_loader(bias, x.get_size()) if isinstance(bias, TensorBox) else None
    f = _normalized(x.make_loader(), mlo, vl, eps, wl, bl, dt)
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), _narrowed(f, dt, out.dtype)))


@register_lowering("batch_norm")
def _batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Eval mode: an affine map per channel (dim 1) with the running statistics, one pointwise
    kernel that fuses with its neighbours (conv -> batch_norm -> relu: the conv is an extern kernel,
    the rest one Stax kernel).  Without running statistics: the batch statistics (biased variance,
    Welford over every dim but 1).  Training mode with running statistics also updates them in
    place, as eager does: ``r = momentum * batch + (1 - momentum) * r`` with the unbiased batch
    variance, written back into the graph inputs they are (the wrapper's copy after the kernels,
    like every mutated input: ``copy_``); running statistics that are not graph inputs, or that the
    graph reads again, keep the fallback kernel (eager)."""
    out = _out_val()
    dt = _norm_compute_dtype("batch_norm", out.dtype)
    x = _widened(x, dt)
    size = x.get_size()
    if len(size) < 2:
        raise Unsupported("batch_norm of fewer than 2 dims (eager raises)")
    tracked = [isinstance(t, TensorBox) for t in (running_mean, running_var)]
    if any(tracked) and not all(tracked):
        raise Unsupported("batch_norm with only one of running_mean / running_var")
    if all(tracked) and not training:
        ml, vl = _channel_loader(running_mean, dt), _channel_loader(running_var, dt)
    else:
        rdims = [0] + list(range(2, len(size)))
        var, mean = _var_parts(x, rdims, 0, True, dt)
        ml, vl = broadcast_loader(mean, size), broadcast_loader(var, size)
        if all(tracked):
            # the unbiased variance's n / (n - 1) is a constant of the kernel: a static size
            n = evaluate_static_shape(math.prod(size[d] for d in rdims))
            _update_running_stats(running_mean, running_var, mean, var, n, momentum)
    xl = x.make_loader()
    f = _normalized(lambda i: _conv(xl(i), x.dtype, dt), ml, vl, eps, _channel_loader(weight, dt),
                    _channel_loader(bias, dt), dt)
    return TensorBox(Pointwise(out.dtype, x.device, size, _narrowed(f, dt, out.dtype)))


def _update_running_stats(running_mean, running_var, mean, var, n, momentum):
    """batch_norm's in-place update of its running statistics, as write-backs of graph inputs:
    ``momentum * batch + (1 - momentum) * running`` per channel, the variance unbiased (n/(n-1))."""
    from ..ir import InputBuffer
    node = _node()
    for arg, box in zip(node.args[3:5], (running_mean, running_var)):
        if not isinstance(box.data, InputBuffer) or len(getattr(arg, "users", ())) != 1 or \
                box.dtype not in (torch.float32, torch.float64) or len(box.get_size()) != 1:
            raise Unsupported("batch_norm in training mode: the running statistics must be graph inputs "
                              "that nothing else in the graph reads (their in-place update)")
    c = running_mean.get_size()[0]
    for box, stat, factor in ((running_mean, mean, 1.0), (running_var, var, n / (n - 1) if n > 1 else math.nan)):
        dt, rl, sl = box.dtype, box.make_loader(), stat.make_loader()
        zeros = [sympy.Integer(0)] * (len(stat.get_size()) - 2)

        def new(i, dt=dt, rl=rl, sl=sl, factor=factor, zeros=zeros):
            b = _conv(sl([sympy.Integer(0), i[0]] + zeros), stat.dtype, dt)
            if factor != 1.0:
                b = ops.mul(b, ops.constant(factor, dt))
            return ops.add(ops.mul(ops.constant(momentum, dt), b),
                           ops.mul(ops.constant(1.0 - momentum, dt), rl(i)))
        V.graph.mutations.append((box.data, V.graph.realize(TensorBox(Pointwise(dt, box.device, [c], new)))))


@register_lowering("group_norm")
def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    """Statistics of each (sample, group) over its C/G channels and the spatial dims: a Welford
    reduction of the index map (N, G, C/G, *spatial) -> x[n, g*C/G + c, ...] (no copy), then a
    pointwise kernel reading the group's statistics at ``floor(channel / (C/G))``."""
    out = _out_val()
    dt = _norm_compute_dtype("group_norm", out.dtype)
    x = _widened(x, dt)
    size = list(x.get_size())
    if len(size) >= 2 and not sympy.sympify(size[1]).is_Integer:
        raise Unsupported(f"group_norm: a symbolic channel count {size[1]} (C / num_groups must be a "
                          f"static size; channels fixed by a parameter are)")
    if len(size) < 2 or num_groups <= 0 or size[1] % num_groups:
        raise Unsupported("group_norm: channels not divisible by num_groups (eager raises)")
    n, c, rest = size[0], size[1], size[2:]
    cpg, xl = c // num_groups, x.make_loader()
    grouped = TensorBox(Pointwise(x.dtype, x.device, [n, num_groups, cpg] + rest,
                                  lambda i: xl([i[0], i[1] * cpg + i[2]] + list(i[3:]))))
    var, mean = _var_parts(grouped, list(range(2, 3 + len(rest))), 0, True, dt)
    vl, ml = var.make_loader(), mean.make_loader()
    zeros = [sympy.Integer(0)] * (1 + len(rest))

    def group_of(i):
        return [i[0], sympy.floor(i[1] / cpg)] + zeros
    f = _normalized(lambda i: _conv(xl(i), x.dtype, dt), lambda i: ml(group_of(i)), lambda i: vl(group_of(i)),
                    eps, _channel_loader(weight, dt), _channel_loader(bias, dt), dt)
    return TensorBox(Pointwise(out.dtype, x.device, size, _narrowed(f, dt, out.dtype)))


@register_lowering("avg_pool2d")
def _avg_pool2d(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
    """A sum reduction over the window of the index map (..., OH, OW, KH, KW) -> x[..., oh*sH - pH + kh,
    ow*sW - pW + kw] (positions outside x read nothing: masked loads), divided by eager's divisor,
    computed from the output position: ``divisor_override``, else the window clipped to the padded
    input (``count_include_pad``) or to the input itself."""
    from .....ops.nn_ops.pooling import _pool_params
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("avg_pool2d dtype")
    (kh, kw), (sh, sw), (ph, pw), _ = _pool_params(kernel_size, stride, padding)
    size = x.get_size()
    if len(size) not in (3, 4) or not divisor_override and divisor_override is not None:
        raise Unsupported("avg_pool2d input rank / zero divisor (eager raises)")
    lead, (h_in, w_in), (oh_n, ow_n) = list(size[:-2]), size[-2:], tuple(out.shape[-2:])
    nl, dt = len(lead), out.dtype
    axes = (lambda o, k: o * sh - ph + k, lambda o, k: o * sw - pw + k)
    _reread(x, oh_n * ow_n * kh * kw, h_in * w_in)
    window, _ = _window_map(x, lead, axes, 0.0, dt)
    sl = _window_sum(window, lead, (oh_n, ow_n), (kh, kw), dt, x.device)

    div = _avg_divisor((kh, kw), (sh, sw), (ph, pw), (h_in, w_in), count_include_pad, divisor_override, dt)
    return TensorBox(Pointwise(dt, x.device, list(out.shape), lambda i: ops.truediv(sl(i), div(i[nl], i[nl + 1]))))


def _avg_divisor(k, s, p, n, count_include_pad, divisor_override, dt):
    """avg_pool2d's divisor of output position (oh, ow), as eager computes it: ``divisor_override``,
    else the window's area clipped to the padded input (``count_include_pad``) or to the input."""
    def extent(o, d):
        start = _ix(o * s[d] - p[d])
        end = ops.minimum(ops.add(start, _ix(sympy.Integer(k[d]))),
                          _ix(sympy.sympify(n[d] + (p[d] if count_include_pad else 0))))
        return ops.sub(end, start if count_include_pad else ops.maximum(start, _ix(sympy.Integer(0))))

    def div(oh, ow):
        if divisor_override:
            return ops.constant(float(divisor_override), dt)
        return ops.to_dtype(ops.mul(extent(oh, 0), extent(ow, 1)), dt)
    return div


def _scatter_as_gather(g, lead, in_shape, dims, contrib, dt):
    """The transpose of a map from input positions to output positions that adds each output's
    value into its inputs (the backward of a pooling or upsampling), as a gather: input position h
    of spatial dim d is written by at most A outputs, ``dims[d] = (A, o(h, a), ok(h, o))`` lists
    them in ascending order (a = 0 .. A-1) with the condition that output o exists and covers h;
    the value is the sum of ``contrib(lead_index, *o)`` over them in eager's order (outputs
    row-major, from +0), with masked loads for the outputs that do not exist.  Exact: the same
    additions as the scatter loop, in the same order."""
    nl = len(lead)

    def f(i):
        acc = ops.constant(0.0, dt)
        for a in itertools.product(*(range(d[0]) for d in dims)):
            o = [d[1](i[nl + k], a[k]) for k, d in enumerate(dims)]
            cond = None
            for k, d in enumerate(dims):
                cond = _and(cond, d[2](i[nl + k], o[k]))
            acc = ops.add(acc, ops.masked(cond, lambda o=o: contrib(list(i[:nl]), *o), 0.0))
        return acc
    return TensorBox(Pointwise(dt, g.device, list(lead) + list(in_shape), f))


@register_lowering("avg_pool2d_backward")
def _avg_pool2d_backward(g, input_size, kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override):
    """grad_input[h, w] = the sum of grad_output[oh, ow] / divisor(oh, ow) over the windows that
    hold (h, w): at most ceil(k/s) per dim, oh = floor((h + p)/s) - a (``_scatter_as_gather``).
    Lowered for stride 1 (then oh = h + p - a, plain shifted loads); other strides are an extern
    kernel (ATen), measured faster."""
    from .....ops.nn_ops.pooling import _pool_params
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64) or g.dtype != out.dtype:
        raise Unsupported("avg_pool2d_backward dtype")
    (kh, kw), (sh, sw), (ph, pw), _ = _pool_params(kernel_size, stride, padding)
    gsize = g.get_size()
    if len(gsize) not in (3, 4) or (divisor_override is not None and not divisor_override):
        raise Unsupported("avg_pool2d_backward rank / zero divisor (eager raises)")
    lead, osz, isz, dt = list(gsize[:-2]), gsize[-2:], list(out.shape[-2:]), out.dtype
    if (sh, sw) != (1, 1):
        # with stride s > 1 the outputs over an input are floor((h + p)/s) - a and which of them
        # exist alternates from lane to lane: masked lane-wise gathers ran 1.8-3.7x slower than
        # ATen's scatter loop (32x64x56x56, k3 s2 p1: 46 vs 12 ms); stride 1 ran 2.2x faster
        return _extern()
    div = _avg_divisor((kh, kw), (sh, sw), (ph, pw), isz, count_include_pad, divisor_override, dt)
    _reread(g, math.prod(isz) * kh * kw, math.prod(osz))
    gl = g.make_loader()

    def dim(k, s, p, n_out):
        a_max = -(-k // s)
        return (a_max, lambda h, a: sympy.floor((h + p) / s) - (a_max - 1 - a),
                lambda h, o: _and(_and(_icmp(o, "ge", 0), _icmp(o, "lt", n_out)), _icmp(h + p - o * s, "lt", k)))
    return _scatter_as_gather(g, lead, isz, (dim(kh, sh, ph, osz[0]), dim(kw, sw, pw, osz[1])),
                              lambda ld, oh, ow: ops.truediv(gl(ld + [oh, ow]), div(oh, ow)), dt)


def _reread(x, reads, elems):
    """``x`` written to memory first when its reader evaluates each of its ``elems`` elements
    ``reads / elems`` times and recomputing it would cost more than reading it back
    (choices.realize_reread).  A heuristic: symbolic sizes count at their hints (sizevars.py)."""
    factor = size_hint(reads) / max(1, size_hint(elems))
    if isinstance(x, TensorBox) and isinstance(x.data, Pointwise) and choices.realize_reread(x.data, factor):
        _realize(x)
    return x


def _window_map(x, lead, axes, fill, dt):
    """The index map (*lead, OH, OW, KH, KW) -> x[*lead, h(oh, kh), w(ow, kw)] of a pooling window,
    read as ``dt``: ``axes`` gives, per spatial dim, the input position ``position(o, k)``; a
    position outside x reads nothing (a masked load) and gives ``fill``.  Returns (the window's
    compute function, the validity mask of a window index)."""
    nl, xl, (h_in, w_in) = len(lead), x.make_loader(), x.get_size()[-2:]

    def hw(i):
        return [pos(i[nl + k], i[nl + 2 + k]) for k, pos in enumerate(axes)]

    def valid(i):
        cond = None
        for e, n in zip(hw(i), (h_in, w_in)):
            cond = _and(_and(cond, _icmp(e, "ge", 0)), _icmp(e, "lt", n))
        return cond

    def window(i):
        return ops.masked(valid(i), lambda: _conv(xl(list(i[:nl]) + hw(i)), x.dtype, dt), fill)
    return window, valid


# POOL_UNROLL_MAX (the knob stax.pool_unroll_max, 25): pooling windows of at most this many elements
# are unrolled into one pointwise kernel (max and average pooling; TorchInductor uses the same limit)


def _first_inside(o, s, p, d):
    """The first input position ``o*s - p + k*d`` (k >= 0) of a pooling window that is >= 0, as
    an int64 value: ``h0 + d * ceil(max(-h0, 0) / d)``."""
    h0 = _ix(o * s - p)
    if d == 1:
        return ops.maximum(h0, _ix(sympy.Integer(0)))
    short = ops.maximum(ops.neg(h0), _ix(sympy.Integer(0)))
    steps = ops.floordiv(ops.add(short, _ix(sympy.Integer(d - 1))), _ix(sympy.Integer(d)))
    return ops.add(h0, ops.mul(steps, _ix(sympy.Integer(d))))


@register_lowering("max_pool2d_with_indices")
def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False, out=None):
    """(values, flat H*W indices) with eager's choice: scanning the window in order, a position
    inside the input wins if its value is greater than the best so far or is NaN (the first of equal
    maxima, the *last* NaN, ±0 as eager; a window of -inf gives its first position inside x).

    A window of at most POOL_UNROLL_MAX elements is unrolled: a pointwise kernel over the outputs
    runs that scan on vectors of output columns (TorchInductor does the same for small windows).
    A larger window is two reduction phases over the window in one kernel (like softmax): m = its
    max (NaN-propagating), then the min over the positions inside x of ``flat`` where the value
    equals m (``-flat`` where both are NaN: the last NaN); the value is x read at that index."""
    from .....ops.nn_ops.pooling import _pool_params
    out = _out_val()[0] if out is None else out
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("max_pool2d dtype")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = _pool_params(kernel_size, stride, padding, dilation)
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape:
        raise Unsupported("max_pool2d input rank / empty output (eager's checks)")
    lead, w_in, oshape = list(size[:-2]), size[-1], list(out.shape)
    nl, dt = len(lead), out.dtype
    axes = (lambda o, k: o * sh - ph + k * dh, lambda o, k: o * sw - pw + k * dw)
    _reread(x, math.prod(oshape[-2:]) * kh * kw, size[-2] * w_in)
    window, valid = _window_map(x, lead, axes, float("-inf"), dt)

    def flat(i):
        return _ix(axes[0](i[nl], i[nl + 2]) * w_in + axes[1](i[nl + 1], i[nl + 3]))
    if kh * kw <= config.get("stax.pool_unroll_max"):
        def scan(i, with_index):
            # a position outside x reads -inf: never taken, so the scan needs no validity mask
            best = ops.constant(float("-inf"), dt)
            at = ops.add(ops.mul(_first_inside(i[nl], sh, ph, dh), _ix(sympy.Integer(w_in))),
                         _first_inside(i[nl + 1], sw, pw, dw)) if with_index else None
            for a in range(kh):
                for b in range(kw):
                    j = list(i) + [sympy.Integer(a), sympy.Integer(b)]
                    v = window(j)
                    take = ops.logical_or(ops.isnan(v), ops.gt(v, best))
                    best = ops.where(take, v, best)
                    at = ops.where(take, flat(j), at) if with_index else None
            return at if with_index else best
        return (TensorBox(Pointwise(dt, x.device, oshape, lambda i: scan(i, False))),
                TensorBox(Pointwise(torch.int64, x.device, oshape, lambda i: scan(i, True))))
    wsize = lead + oshape[-2:] + [kh, kw]
    win = TensorBox(Pointwise(dt, x.device, wsize, window))
    ml = _realize(make_reduction(win, [nl + 2, nl + 3], False, "max", dt)).make_loader()

    def key(i):
        m, v = ml(list(i[:nl + 2])), window(i)
        nan_m = ops.isnan(m)
        hit = ops.logical_and(valid(i), ops.where(nan_m, ops.isnan(v), ops.eq(v, m)))
        return ops.where(hit, ops.where(nan_m, ops.neg(flat(i)), flat(i)), ops.constant(2 ** 62, torch.int64))
    keys = TensorBox(Pointwise(torch.int64, x.device, wsize, key))
    kl = _realize(make_reduction(keys, [nl + 2, nl + 3], False, "min", torch.int64)).make_loader()

    def index(i):
        r = kl(i)
        return ops.where(ops.isnan(ml(i)), ops.neg(r), r)
    idx = _realize(TensorBox(Pointwise(torch.int64, x.device, oshape, index)))
    il, xl, plane = idx.make_loader(), x.make_loader(), size[-2] * w_in

    def value(i):
        k = _checked(il(i), plane, "max_pool2d", nl)
        return xl(list(i[:nl]) + [sympy.floor(k / w_in), sympy.Mod(k, w_in)])
    return TensorBox(Pointwise(dt, x.device, oshape, value)), idx


@register_lowering("adaptive_max_pool2d")
def _adaptive_max_pool2d(x, output_size):
    """Bins of equal extent are max_pool2d with kernel = stride = input // output (eager's scan
    and indices are the same); bins of unequal extent are an extern kernel (ATen), as for
    adaptive_avg_pool2d."""
    out = _out_val()[0]
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape or any(n % m for n, m in zip(size[-2:], out.shape[-2:])):
        return _extern()
    k = [n // m for n, m in zip(size[-2:], out.shape[-2:])]
    return _max_pool2d_with_indices(x, k, k, 0, 1, False, out)


@register_lowering("max_pool2d")
def _max_pool2d(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    return _max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode, _out_val())[0]


def _window_sum(window, lead, oshape, k, dt, device):
    """The sum over a (k[0], k[1]) pooling window: unrolled in eager's order (rows, then columns,
    from +0) when it has at most POOL_UNROLL_MAX elements, else a sum reduction of the window map.
    Returns a loader over the output positions."""
    if k[0] * k[1] <= config.get("stax.pool_unroll_max"):
        def sl(i):
            acc = ops.constant(0.0, dt)     # eager's sum starts at +0 (a window of -0 sums to +0)
            for a in range(k[0]):
                for b in range(k[1]):
                    acc = ops.add(acc, window(list(i) + [sympy.Integer(a), sympy.Integer(b)]))
            return acc
        return sl
    win = TensorBox(Pointwise(dt, device, list(lead) + list(oshape[-2:]) + list(k), window))
    nl = len(lead)
    return _realize(make_reduction(win, [nl + 2, nl + 3], False, "sum", dt)).make_loader()


@register_lowering("adaptive_avg_pool2d")
def _adaptive_avg_pool2d(x, output_size):
    """Output position o of a dim of n inputs averages bin [floor(o*n/m), ceil((o+1)*n/m)) (m the
    output size).  Bins of equal extent k = n/m (m divides n; global average pooling is m = 1) are a
    window sum with kernel = stride = k, divided by the bin's height, then by its width (eager's
    order of rounding).  Bins of unequal extent are an extern kernel (ATen): their starts
    floor(o*n/m) need lane-wise gathers and masks, which ran 2-4x slower than ATen's loop
    (14x14 -> 5x5: 8.0 vs 1.9 ms; 100x100 -> 30x30: 10.6 vs 5.0 ms)."""
    out = _out_val()
    if out.dtype not in (torch.float32, torch.float64):
        raise Unsupported("adaptive_avg_pool2d dtype")
    size = x.get_size()
    if len(size) not in (3, 4) or 0 in out.shape:
        raise Unsupported("adaptive_avg_pool2d input rank / empty output (eager's checks)")
    lead, oshape, dt = list(size[:-2]), list(out.shape), out.dtype
    if any(n % m for n, m in zip(size[-2:], oshape[-2:])):
        return _extern()
    k = [n // m for n, m in zip(size[-2:], oshape[-2:])]
    axes = [lambda o, j, kd=kd: o * kd + j for kd in k]
    _reread(x, math.prod(oshape[-2:]) * math.prod(k), math.prod(size[-2:]))
    window, _ = _window_map(x, lead, axes, 0.0, dt)
    sl = _window_sum(window, lead, oshape, k, dt, x.device)

    def f(i):
        r = sl(i)
        for kd in k:
            r = ops.truediv(r, ops.constant(float(kd), dt))
        return r
    return TensorBox(Pointwise(dt, x.device, oshape, f))


def _nearest_source(o_sym, n_in, n_out, scale):
    """The source index of nearest upsampling along one dim as an index expression of the output
    index, or None.  Eager computes ``min(floor(float32(o) * s), n_in - 1)`` with the float32 scale
    ``s = 1/scale`` (``n_in/n_out`` without one; then n_out = n_in and 2*n_in are exact); the
    table of that is compared with ``floor(o * p/q)`` for the candidate fractions p/q (n_in/n_out,
    and 1/scale as a fraction), so the kernel reads exactly eager's rows or the op is not lowered."""
    import numpy as np
    from fractions import Fraction
    o = np.arange(n_out, dtype=np.int64)
    if n_out == n_in and not scale:
        table = o
    elif n_out == 2 * n_in and not scale:
        table = o >> 1
    else:
        s = np.float32(1.0 / scale) if scale and scale > 0 else np.float32(n_in) / np.float32(n_out)
        table = np.minimum(np.floor(o.astype(np.float32) * s).astype(np.int64), n_in - 1)
    cands = [Fraction(n_in, n_out)] + ([Fraction(1 / scale).limit_denominator(1 << 16)] if scale else [])
    for f in cands:
        if np.array_equal(table, np.minimum((o * f.numerator) // f.denominator, n_in - 1)):
            e = sympy.floor(o_sym * f.numerator / f.denominator) if f.denominator != 1 else o_sym * f.numerator
            # the clamp is needed only where floor(o*p/q) passes n_in - 1 (then it is not affine)
            return e if (n_out - 1) * f.numerator // f.denominator <= n_in - 1 else None
    return None


@register_lowering("upsample_nearest1d", "upsample_nearest2d")
def _upsample_nearest(x, output_size, *scales):
    """out[..., o] = x[..., src(o)] per resampled dim: a view-like index map (no copy when fused),
    with eager's source rows (``_nearest_source``).  The last dim's rows repeat a lane pattern
    every q/gcd(p, q) columns; when that divides 16 the kernel reads a vector as one load and a
    lane permute (codegen ``_lane_pattern``).  Otherwise, and when eager's float32 rows are no
    ``floor(o*p/q)``, the op is an extern kernel (ATen's loop, faster than lane-wise gathers)."""
    out = _out_val()
    size = x.get_size()
    nd = len(output_size)
    if len(size) != nd + 2:
        raise Unsupported("upsample_nearest input rank")
    lead = len(size) - nd
    syms = [sympy.Symbol(f"_o{k}", integer=True, nonnegative=True) for k in range(nd)]
    # eager's source rows are a table of the static sizes
    src = [_nearest_source(syms[k], evaluate_static_shape(size[lead + k]), out.shape[lead + k],
                           scales[k] if k < len(scales) else None)
           for k in range(nd)]
    if any(e is None for e in src):
        return _extern()        # eager's float32 rows are no floor(o*p/q): ATen's kernel reads them
    if 16 % max((_fraction(a.args[0])[1] for a in src[-1].atoms(sympy.floor)), default=1):
        # the last dim's pattern repeats only every q/gcd(p, q) > 16 columns: lane-wise gathers ran
        # 1.5x slower than ATen's loop (56 -> 75: 4.2 vs 2.8 ms), so ATen's kernel runs it
        return _extern()
    _reread(x, math.prod(out.shape), math.prod(size))
    xl = x.make_loader()

    def f(i):
        sub = {syms[k]: i[lead + k] for k in range(nd)}
        return xl(list(i[:lead]) + [e.xreplace(sub) for e in src])
    return _box(out, f, x.device)


@register_lowering("upsample_nearest1d_backward", "upsample_nearest2d_backward")
def _upsample_nearest_backward(g, output_size, input_size, *scales):
    """grad_input[h] = the sum of grad_output[o] over the outputs o that read row h.  For an
    integer factor q (eager's rows floor(o/q), ``_nearest_source``) they are o = q*h + a, a < q:
    plain loads (``_scatter_as_gather``).  Other factors start the outputs of a row at
    floor((h*q + p - 1)/p), lane-wise gathers again (the forward's extern rule: 16x64x112x112 ->
    56x56 ran 2.4 ms as a loop against 7.4 for ATen with q = 2), and sizes whose rows are no
    floor(o*p/q) are an extern kernel (ATen) too."""
    out = _out_val()
    gsize = g.get_size()
    nd = len(output_size)
    if out.dtype not in (torch.float32, torch.float64) or len(gsize) != nd + 2 or nd not in (1, 2):
        raise Unsupported("upsample_nearest_backward dtype / rank")
    lead, isz = list(gsize[:2]), list(out.shape[2:])
    o_sym = sympy.Symbol("_o", integer=True, nonnegative=True)
    dims = []
    for k in range(nd):
        src = _nearest_source(o_sym, isz[k], gsize[2 + k], scales[k] if k < len(scales) else None)
        if src is None:
            return _extern()
        num, q = _fraction(src.args[0] if isinstance(src, sympy.floor) else src)
        if num != o_sym:     # rows floor(o*p/q) with p != 1: not an integer factor
            return _extern()
        n_out = gsize[2 + k]
        dims.append((q, lambda h, a, q=q: h * q + a,
                     lambda h, o, q=q, n_out=n_out: _and(_icmp(o, "lt", n_out), _icmp(o - (h + 1) * q, "lt", 0))))
    gl = g.make_loader()
    return _scatter_as_gather(g, lead, isz, dims, lambda ld, *o: _conv(gl(ld + list(o)), g.dtype, out.dtype),
                              out.dtype)


@register_lowering("adaptive_avg_pool2d_backward")
def _adaptive_avg_pool2d_backward(g, input_size):
    """Bins of equal extent k: each input is in one bin, grad_input[h, w] = grad_output[h // kh,
    w // kw] / kh / kw (eager's grad_delta); bins of unequal extent are an extern kernel (ATen)."""
    out = _out_val()
    gsize = g.get_size()
    isz = list(out.shape[-2:])
    if out.dtype not in (torch.float32, torch.float64) or len(gsize) not in (3, 4) or \
            any(n % m for n, m in zip(isz, gsize[-2:])) or 0 in gsize:
        return _extern()
    kh, kw = (n // m for n, m in zip(isz, gsize[-2:]))
    nl, dt, gl = len(gsize) - 2, out.dtype, g.make_loader()

    def f(i):
        v = _conv(gl(list(i[:nl]) + [sympy.floor(i[nl] / kh), sympy.floor(i[nl + 1] / kw)]), g.dtype, dt)
        return ops.truediv(ops.truediv(v, ops.constant(float(kh), dt)), ops.constant(float(kw), dt))
    return _box(out, f, g.device)


@register_lowering("rms_norm")
def _rms_norm(x, normalized_shape, weight=None, eps=None):
    out = _out_val()
    dt = _norm_compute_dtype("rms_norm", out.dtype)
    e = float(eps) if eps is not None else float(torch.finfo(x.dtype).eps)   # eager: of the input's dtype
    x, weight = _widened(x, dt), _widened(weight, dt)
    n = len(x.get_size())
    dims = list(range(n - len(normalized_shape), n))
    xl = x.make_loader()
    sq = TensorBox(Pointwise(dt, x.device, x.get_size(), lambda i: (lambda v: ops.mul(v, v))(xl(i))))
    ss = _realize(make_reduction(sq, dims, True, "sum", dt))
    cnt = math.prod(x.get_size()[d] for d in dims)
    sl = broadcast_loader(ss, x.get_size())
    wl = broadcast_loader(weight, x.get_size()) if isinstance(weight, TensorBox) else None

    def f(i):
        r = ops.rsqrt(ops.add(ops.truediv(sl(i), size_constant(cnt, dt)), ops.constant(e, dt)))
        y = ops.mul(xl(i), r)
        return ops.mul(y, wl(i)) if wl is not None else y
    return TensorBox(Pointwise(out.dtype, x.device, x.get_size(), _narrowed(f, dt, out.dtype)))


# ---- losses ---------------------------------------------------------------------------------------------
# Elementwise losses are a Pointwise of (self, target) reduced like eager ('none' / 'sum' / 'mean' /
# kl_div's 'batchmean'); nll_loss reads self at each sample's target class (an indirect load, checked
# in the kernel); cross_entropy with class indices is log_softmax's row statistics, then nll_loss
# reading x at each target (the log-probabilities are not materialised);
# nll_loss_backward is a Pointwise (the target class of the row gets -weight·g, the others 0) — no
# scatter needed.
def _loss_reduce(box, reduction, dtype):
    if reduction == "none":
        return box
    if reduction not in ("sum", "mean", "batchmean"):
        raise Unsupported(f"loss reduction {reduction!r}")
    s = make_reduction(box, None, False, "sum", dtype)
    if reduction == "sum":
        return s
    size = box.get_size()
    n = math.prod(size) if reduction == "mean" else (size[0] if size else 1)
    sl = _realize(s).make_loader()
    return TensorBox(Pointwise(dtype, box.device, (), lambda i: ops.truediv(sl([]), size_constant(n, dtype))))


def _elementwise_loss(x, t, reduction, fn, weight=None):
    """fn(x, t, dtype, index) -> per-element loss, times ``weight`` if given; x, t and weight
    broadcast like eager."""
    dt = _out_val().dtype
    if not dt.is_floating_point:
        raise Unsupported("loss of integers")
    shape = broadcast_size(x.get_size(), t.get_size())
    xl, tl = broadcast_loader(x, shape), broadcast_loader(t, shape)
    wl = broadcast_loader(weight, shape) if weight is not None else None

    def f(i):
        v = fn(_conv(xl(i), x.dtype, dt), _conv(tl(i), t.dtype, dt), dt, i)
        return ops.mul(v, _conv(wl(i), weight.dtype, dt)) if wl is not None else v
    return _loss_reduce(TensorBox(Pointwise(dt, x.device, shape, f)), reduction, dt)


def _k(v, dt):
    return ops.constant(v, dt)


@register_lowering("mse_loss")
def _mse_loss(x, t, reduction="mean"):
    return _elementwise_loss(x, t, reduction, lambda a, b, dt, i: (lambda d: ops.mul(d, d))(ops.sub(a, b)))


@register_lowering("l1_loss")
def _l1_loss(x, t, reduction="mean"):
    return _elementwise_loss(x, t, reduction, lambda a, b, dt, i: ops.abs(ops.sub(a, b)))


@register_lowering("smooth_l1_loss")
def _smooth_l1_loss(x, t, reduction="mean", beta=1.0):
    def f(a, b, dt, i):
        d = ops.abs(ops.sub(a, b))
        if beta == 0:
            return d
        quad = ops.truediv(ops.mul(ops.mul(_k(0.5, dt), d), d), _k(beta, dt))
        return ops.where(ops.lt(d, _k(beta, dt)), quad, ops.sub(d, _k(0.5 * beta, dt)))
    return _elementwise_loss(x, t, reduction, f)


@register_lowering("huber_loss")
def _huber_loss(x, t, reduction="mean", delta=1.0):
    def f(a, b, dt, i):
        d = ops.abs(ops.sub(a, b))
        quad = ops.mul(ops.mul(_k(0.5, dt), d), d)
        lin = ops.mul(_k(delta, dt), ops.sub(d, ops.mul(_k(0.5, dt), _k(delta, dt))))
        return ops.where(ops.lt(d, _k(delta, dt)), quad, lin)
    return _elementwise_loss(x, t, reduction, f)


@register_lowering("binary_cross_entropy")
def _bce(x, t, weight=None, reduction="mean"):
    """-(t·max(log x, -100) + (1 - t)·max(log(1 - x), -100)), eager's clamped logs."""
    def f(a, b, dt, i):
        lo = _k(-100.0, dt)
        la = ops.maximum(ops.log(a), lo)
        lb = ops.maximum(ops.log(ops.sub(_k(1.0, dt), a)), lo)
        return ops.neg(ops.add(ops.mul(b, la), ops.mul(ops.sub(_k(1.0, dt), b), lb)))
    return _elementwise_loss(x, t, reduction, f, weight)


@register_lowering("binary_cross_entropy_with_logits")
def _bce_logits(x, t, weight=None, pos_weight=None, reduction="mean"):
    """(1 - t)·x + lw·(log(exp(-m) + exp(-x - m)) + m), m = max(-x, 0), lw = 1 + (pos_weight - 1)·t
    (the stable form eager uses)."""
    shape = broadcast_size(x.get_size(), t.get_size())
    pwl = broadcast_loader(pos_weight, shape) if pos_weight is not None else None

    def f(a, b, dt, i):
        m = ops.maximum(ops.neg(a), _k(0.0, dt))
        soft = ops.add(ops.log(ops.add(ops.exp(ops.neg(m)), ops.exp(ops.sub(ops.neg(a), m)))), m)
        if pwl is not None:
            pw = _conv(pwl(i), pos_weight.dtype, dt)
            soft = ops.mul(ops.add(_k(1.0, dt), ops.mul(ops.sub(pw, _k(1.0, dt)), b)), soft)
        return ops.add(ops.mul(ops.sub(_k(1.0, dt), b), a), soft)
    return _elementwise_loss(x, t, reduction, f, weight)


@register_lowering("kl_div")
def _kl_div(x, t, reduction="mean", log_target=False):
    """log_target: exp(t)·(t - x); else xlogy(t, t) - t·x (0 where t == 0)."""
    def f(a, b, dt, i):
        if log_target:
            return ops.mul(ops.exp(b), ops.sub(b, a))
        xlogy = ops.where(ops.eq(b, _k(0.0, dt)), _k(0.0, dt), ops.mul(b, ops.log(b)))
        return ops.sub(ops.where(ops.isnan(b), b, xlogy), ops.mul(b, a))
    return _elementwise_loss(x, t, reduction, f)


def _nll_sample(target, weight, ignore_index, C, dt, op, dim):
    """sample(rows) -> (counted, class, weight): the target class of a sample (ignored samples
    read class 0, checked in the kernel against [0, C)) and its weight (0 if ignored)."""
    tl = target.make_loader()
    wl = weight.make_loader() if weight is not None else None

    def sample(r):
        tv = tl(r)
        counted = ops.ne(tv, ops.constant(ignore_index, target.dtype))
        safe = ops.where(counted, tv, ops.constant(0, target.dtype))
        cls = _checked(safe, C, op, dim,
                       message=f"IndexError: tp.{op}: target {{value}} is out of bounds for {C} classes")
        w = _conv(wl([cls]), weight.dtype, dt) if wl is not None else ops.constant(1.0, dt)
        return counted, safe, cls, ops.where(counted, w, ops.constant(0.0, dt))
    return sample


def _nll_rows(size, op):
    if len(size) not in (1, 2):
        raise Unsupported(f"{op}: only (N, C) / (C,) inputs are native")
    two_d = len(size) == 2
    return two_d, (lambda i: i[:1] if two_d else [])


def _nll(x, target, weight, reduction, ignore_index, op):
    """nll_loss of x (N, C) or (C,): the per-sample losses reduced like eager ('mean' divides by
    the total weight of the counted samples — both sums are one kernel)."""
    size = x.get_size()
    two_d, rows = _nll_rows(size, op)
    if target.dtype not in (torch.int32, torch.int64) or reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"{op}: integer class targets and reduction none/sum/mean are native")
    dt, xl = x.dtype, x.make_loader()
    sample = _nll_sample(target, weight, ignore_index, size[-1], dt, op, 1 if two_d else 0)

    def loss(i):
        counted, _, cls, w = sample(rows(i))
        v = xl([i[0], cls] if two_d else [cls])
        return ops.where(counted, ops.neg(ops.mul(w, v)), ops.constant(0.0, dt))
    shape = (size[0],) if two_d else ()
    box = TensorBox(Pointwise(dt, x.device, shape, loss))
    if reduction != "mean":
        return _loss_reduce(box, reduction, dt)
    s = _realize(make_reduction(box, None, False, "sum", dt)).make_loader()
    wsum = _realize(make_reduction(TensorBox(Pointwise(dt, x.device, shape, lambda i: sample(rows(i))[3])),
                                   None, False, "sum", dt)).make_loader()
    return TensorBox(Pointwise(dt, x.device, (), lambda i: ops.truediv(s([]), wsum([]))))


@register_lowering("nll_loss")
def _nll_loss(x, target, weight=None, reduction="mean", ignore_index=-100):
    return _nll(x, target, weight, reduction, ignore_index, "nll_loss")


@register_lowering("cross_entropy")
def _cross_entropy(x, target, weight=None, reduction="mean", ignore_index=-100, label_smoothing=0.0):
    if label_smoothing != 0 or target.dtype.is_floating_point:
        raise Unsupported("cross_entropy with label smoothing or class probabilities")
    _nll_rows(x.get_size(), "cross_entropy")
    if not x.dtype.is_floating_point:
        raise Unsupported("cross_entropy of integers")
    # the row statistics (an output: the backward reads them), then nll reading x[i, t] - lse[i]:
    # the (N, C) log-probabilities never go through memory
    lse = _realize(logsumexp_of(x, len(x.get_size()) - 1, True))
    ll, xl = broadcast_loader(lse, x.get_size()), x.make_loader()
    lsm = TensorBox(Pointwise(x.dtype, x.device, x.get_size(), lambda i: ops.sub(xl(i), ll(i))))
    return _nll(lsm, target, weight, reduction, ignore_index, "cross_entropy"), lse


@register_lowering("nll_loss_backward")
def _nll_loss_backward(grad_output, target, weight, input_size, reduction, ignore_index):
    """grad[i, c] = (c == target[i]) · -weight[target[i]] · g  (/ total weight for 'mean')."""
    dt = _out_val().dtype
    size = tuple(input_size)
    two_d, rows = _nll_rows(size, "nll_loss_backward")
    sample = _nll_sample(target, weight, ignore_index, size[-1], dt, "nll_loss_backward", 1 if two_d else 0)
    gl = grad_output.make_loader()
    denom = None
    if reduction == "mean":
        shape = (size[0],) if two_d else ()
        denom = _realize(make_reduction(TensorBox(Pointwise(dt, grad_output.device, shape,
                                                            lambda i: sample(rows(i))[3])),
                                        None, False, "sum", dt)).make_loader()
    elif reduction not in ("sum", "none"):
        raise Unsupported(f"nll_loss_backward reduction {reduction!r}")
    idt = target.dtype if target.dtype in (torch.int32, torch.int64) else torch.int64

    def f(i):
        r = rows(i)
        counted, safe, _, w = sample(r)
        g = _conv(gl(r if reduction == "none" else []), grad_output.dtype, dt)
        coef = ops.neg(ops.mul(w, g))
        if denom is not None:
            coef = ops.truediv(coef, denom([]))
        hit = ops.logical_and(counted, ops.eq(ops.index_expr(i[-1], idt), safe))
        return ops.where(hit, coef, ops.constant(0.0, dt))
    return TensorBox(Pointwise(dt, grad_output.device, size, f))
