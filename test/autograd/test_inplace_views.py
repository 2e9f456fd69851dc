"""In-place writes through views under TPX autograd, judged against torch.autograd.

The model (PyTorch's, see tensorplay/autograd/graph.py): every view knows its root base and the
chain of view ops from it; an in-place op on a view rebases the base on a CopySlices node; every
other view of the base re-derives its grad_fn from the base's current history when the shared
version counter moved.  Errors PyTorch raises (in-place on a leaf / a view of a leaf that requires
grad / a view made in no_grad mode; a saved tensor modified in place) are raised by TPX too.

Most of the checking is differential: a random program generator mixes views (basic indexing
with steps, select, narrow, transpose, t, permute, unsqueeze, squeeze, view/reshape/flatten,
diagonal, expand, movedim), in-place ops (mul_, add_, sub_, div_, copy_, zero_, fill_, clamp_,
relu_, tanh_, neg_, setitem) on bases, views and leaves, under grad mode or no_grad, detach(),
and out-of-place ops, then backpropagates a randomly weighted sum of several results.  Each
program runs step by step in float64 in both libraries: a step raises in TPX iff it raises in
torch, every tensor's value and requires_grad agree, and every leaf's gradient agrees to 1e-9.
"""
from __future__ import annotations

import random

import pytest
import torch

import tensorplay as tp

F64 = torch.float64


def _tp(t, rg=False):
    x = tp.from_torch(t.detach().clone())
    return x.requires_grad_() if rg else x


def _close(a, b, rtol=1e-9, atol=1e-11):
    a = a._data if isinstance(a, tp.Tensor) else a
    torch.testing.assert_close(a, b.detach(), rtol=rtol, atol=atol)


# ---- named regression tests ---------------------------------------------------------------------
def test_reproducer_inplace_on_one_view_seen_by_backward_of_another():
    def prog(lib):
        x = lib.ones(2, 2, dtype=F64, requires_grad=True)
        v = x * 3
        a = v[0]
        v[:, 0].mul_(2)
        a.sum().backward()
        return x.grad
    g = prog(tp)
    _close(g, prog(torch))
    _close(g, torch.tensor([[6.0, 3.0], [0.0, 0.0]], dtype=F64))


def _pair(*shape, seed=0):
    t = torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return _tp(t, rg=True), t.clone().requires_grad_()


def _both(prog, *shapes):
    """Run ``prog(lib, *leaves)`` in both libraries on the same random leaves; compare every
    returned value and every leaf gradient."""
    pairs = [_pair(*s, seed=i + 1) for i, s in enumerate(shapes)]
    rp = prog(tp, *[p[0] for p in pairs])
    rt = prog(torch, *[p[1] for p in pairs])
    for a, b in zip(rp or (), rt or ()):
        _close(a, b)
    for a, b in pairs:
        assert (a.grad is None) == (b.grad is None)
        if b.grad is not None:
            _close(a.grad, b.grad)


def test_inplace_on_base_seen_by_earlier_view():
    def prog(lib, x, w):
        y = x * 2
        a, b = y[1], y[:, ::2]
        y.mul_(w)                 # the base itself
        y.add_(1)
        (a * a).sum().backward(retain_graph=True)
        (b.exp()).sum().backward()
        return a, b
    _both(prog, (3, 4), (4,))


def test_chains_of_views_see_writes_through_other_chains():
    def prog(lib, x, w):
        y = x.exp()
        y = y * 1
        v1 = y.transpose(0, 2).narrow(1, 1, 2)[::2]          # view of view of view
        v2 = y.select(1, 2).unsqueeze(0)
        v3 = y[1:, :, 1::2]
        y[0].t()[1:].mul_(w[:3])                            # write through a chain
        v2.squeeze(0).narrow(0, 0, 1).add_(w[1:4].sum())
        v1.clamp_(-1.0, 1.5)
        loss = (v1 * 3).sum() + (v2 * v2).sum() + (v3.sin()).sum() + (y * y).sum()
        loss.backward()
        return v1, v2, v3, y
    _both(prog, (2, 3, 4), (4,))


def test_multiple_inplace_ops_and_diagonal_and_view():
    def prog(lib, x, w):
        y = x * 1
        d = y.diagonal()
        f = y.view(-1)
        d.mul_(w[:3]).add_(2)
        f[1::3].copy_(w[:4] * 2)
        y[2].zero_()
        f[0:2].fill_(0.5)
        y[1, 1:].sub_(1).relu_()               # nothing writes its region afterwards (relu_ saves its result)
        (d * d).sum().backward(retain_graph=True)
        (f * f).sum().backward()
        return d, f, y
    _both(prog, (3, 4), (4,))


def test_setitem_through_views():
    def prog(lib, x, w):
        y = x + 0
        v = y[:, 1:]
        u = y[1]
        v[0, ::2] = w[:2] * 3
        u[1:3] = w[1:3].exp()
        ((u[1:] * v[1]).sum() + (y ** 2).sum()).backward()
        return u, v
    _both(prog, (3, 4), (4,))


def test_base_without_history_gains_it_through_a_view():
    def prog(lib, w):
        b = lib.zeros(3, 4, dtype=F64)
        early = b[1:]                 # a view of a tensor that does not require grad
        b[0].copy_(w)                 # the base gains history
        b[1].add_(w * w)
        assert early.requires_grad and not early.is_leaf
        (early * 2).sum().backward(retain_graph=True)
        (b.sin()).sum().backward()
        return b, early
    _both(prog, (4,))


def test_expand_is_not_writable():
    x, xt = _pair(3)
    for lib, v in ((tp, x * 1), (torch, xt * 1)):
        e = v.unsqueeze(0).expand(2, 3)
        with pytest.raises(RuntimeError, match="single memory location"):
            e.mul_(2)
    # a size-preserving expand is writable (no element is shared)
    _both(lambda lib, x: (lambda y: (y.view(3, 1).expand(3, 1).mul_(2), y.sum().backward(), y)[2:])(x * 1), (3,))


def test_inplace_on_view_of_leaf_raises_like_torch():
    x, xt = _pair(3, 2)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place"):
        x[0].mul_(2)
    with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place"):
        xt[0].mul_(2)
    with pytest.raises(RuntimeError, match="a leaf Tensor that requires grad"):
        x.mul_(2)
    with tp.no_grad():            # allowed under no_grad, as in torch
        x[0].mul_(2)
    with torch.no_grad():
        xt[0].mul_(2)
    _close(x, xt)


def test_views_made_under_no_grad():
    x, _ = _pair(4)
    y = x * 2
    with tp.no_grad():
        v = y[0:2]
    # a view of a tensor requiring grad requires grad (PyTorch) but has no history: a leaf whose
    # gradient goes nowhere
    assert v.requires_grad and v.is_leaf and v.grad_fn is None
    w = tp.randn(2, dtype=F64, requires_grad=True)
    (v * w).sum().backward()
    assert x.grad is None
    _close(w.grad, v._data)
    # in-place on it with grad mode enabled is ambiguous and forbidden
    with pytest.raises(RuntimeError, match=r"tp\.mul_: a view .* was created in no_grad mode and is being modified"):
        v.mul_(2)
    # its base modified in place: reading its history raises (PyTorch's indirect check)
    y.mul_(2)
    with pytest.raises(RuntimeError, match="created in no_grad mode and its base or another view of its base"):
        v + 1
    # a view of a tensor without grad made under no_grad is harmless
    b = tp.zeros(3, dtype=F64)
    with tp.no_grad():
        u = b[1:]
    u.mul_(2)
    with pytest.raises(RuntimeError, match="created in no_grad mode and is being modified"):
        u.mul_(w.sum())
    # both view and in-place under no_grad: untracked, allowed
    with tp.no_grad():
        y[1:].mul_(3)


def test_detach_shares_version_counter_and_cuts_history():
    x, xt = _pair(3, 2)
    for lib, leaf in ((tp, x), (torch, xt)):
        y = leaf.exp()                    # saves its result
        d = y.detach()
        assert not d.requires_grad and d._version == y._version
        d[0].mul_(2)                      # untracked write through a view of the detached alias
        assert y._version == d._version == 1
        with pytest.raises(RuntimeError, match="modified by an in.?place operation"):
            y.sum().backward()
    z = x * 1
    early = z[1]
    z.detach()[0].mul_(3)                 # no history change: the earlier view keeps its gradient path
    (early * early).sum().backward()
    zt = xt * 1
    et = zt[1]
    zt.detach()[0].mul_(3)
    (et * et).sum().backward()
    _close(x.grad, xt.grad)


def test_saved_tensor_modified_through_a_view_raises():
    x, _ = _pair(3, 4)
    y = x * 1
    z = y.sin()                            # saves y
    y[1].mul_(2)
    with pytest.raises(RuntimeError, match=r"tp\.sin backward: .*modified by an in-place op.*version 0.*version 1"):
        z.sum().backward()
    y = x * 1
    e = y.exp()                            # saves its result
    e[:, 0].zero_()
    with pytest.raises(RuntimeError, match=r"tp\.exp backward: its output 0 .*modified by an in-place operation"):
        e.sum().backward()


def test_retain_grad_follows_the_tensor_through_inplace():
    def prog(lib, x):
        y = x * 1
        v = y[0:2]
        y.retain_grad()
        v.retain_grad()
        y.mul_(2)                  # y and (indirectly) v now hold new values
        (v * 3).sum().backward(retain_graph=True)
        (y * y).sum().backward()
        return y.grad, v.grad
    _both(prog, (4,))


def test_multi_output_views_may_be_modified_in_place():
    """TPX extension (PyTorch forbids it): gradients equal those of the narrow/select program."""
    def prog(lib, x, w):
        y = x * 1
        rows = y.unbind(0) if lib is tp else [y.select(0, i) for i in range(3)]
        halves = y.split(2, 1) if lib is tp else [y.narrow(1, 0, 2), y.narrow(1, 2, 2)]
        rows[1].mul_(w)
        halves[0].add_(w[:2])
        ((rows[2] * rows[1]).sum() + (halves[1] ** 2).sum() + (halves[0] ** 3).sum()).backward()
        return (y,)
    _both(prog, (3, 4), (4,))


def test_double_backward_through_rebased_views():
    def prog(lib, x, w):
        y = x * x
        a = y[0]
        y[:, 1].mul_(w[:3])
        g, = lib.autograd.grad((a * a).sum() + (y * 2).sum(), x, create_graph=True)
        (g * g).sum().backward()
        return (g,)
    _both(prog, (3, 4), (4,))


def test_copyslices_replays_on_gradient_laid_out_like_the_base():
    """The gradient reaching the rebased base is transposed; ``view(-1)`` is defined by the base."""
    def prog(lib, x, r):
        y = x * 1
        y.view(-1)[::5].mul_(3)
        y.view(-1).clamp_(-0.5, 0.5)
        (y.transpose(0, 2) * r).sum().backward()
        return (y,)
    _both(prog, (2, 3, 4), (4, 3, 2))


def test_forward_ad_tangent_of_base_laid_out_like_the_base():
    """Forward mode writes a view's tangent into its base's tangent through the same view chain;
    the base's tangent (here transposed) is laid out like the base first.  Reference: the JVP
    written out (the program is linear up to the final sin)."""
    import tensorplay.autograd.forward_ad as fwAD
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 4, generator=g, dtype=F64)
    t = torch.randn(4, 3, 2, generator=g, dtype=F64).transpose(0, 2)

    def f(a):
        y = a * 1
        y.view(-1)[::5].mul_(3)
        return y.sin()
    y, ty = x.clone(), t.contiguous()
    y.view(-1)[::5] *= 3
    ty.view(-1)[::5] *= 3
    jt = y.cos() * ty
    with fwAD.dual_level():
        out = f(fwAD.make_dual(_tp(x), tp.from_torch(t)))
        jp = fwAD.unpack_dual(out).tangent
    _close(jp, jt)


def test_grad_fn_of_a_view_is_rederived_lazily():
    x, _ = _pair(4)
    y = x * 1
    v = y[1:3]
    fn = v.grad_fn
    assert v.grad_fn is fn                 # nothing changed: the same node
    y.mul_(2)
    assert v.grad_fn is not fn and v.grad_fn is v.grad_fn
    with tp.no_grad():
        y.add_(1)                          # untracked: re-derived from an unchanged base history
    (v * v).sum().backward()
    vt = (x.detach() * 2 + 1)[1:3]
    expect = torch.zeros(4, dtype=F64)
    expect[1:3] = 2 * vt._data * 2
    _close(x.grad, expect)


def _raises_like_torch(prog, *shapes, match=None):
    """``prog(lib, *leaves)`` raises in tp iff it raises in torch (and with ``match``, tp's message)."""
    pairs = [_pair(*sh, seed=i + 1) for i, sh in enumerate(shapes)]
    try:
        prog(torch, *[p[1] for p in pairs])
        torch_raised = False
    except RuntimeError:
        torch_raised = True
    if torch_raised:
        with pytest.raises(RuntimeError, match=match):
            prog(tp, *[p[0] for p in pairs])
    else:
        prog(tp, *[p[0] for p in pairs])
    return torch_raised


def test_saved_input_aliasing_the_written_storage_raises():
    """Inputs are versioned before the kernel: ``y.mul_(y)`` saved ``other`` = y, which the op
    itself overwrote (found by the differential sweep, seed 33)."""
    def prog(lib, x):
        y = x * 2
        y.mul_(y)
        y.sum().backward()
    assert _raises_like_torch(prog, (5,), match=r"tp\.mul_ backward: .*argument 'other'")

    def prog2(lib, x):
        y = x * 2
        y[:2].mul_(y[2:4])      # another, disjoint view of the same base
        y.sum().backward()
    assert _raises_like_torch(prog2, (5,), match=r"tp\.mul_ backward")


def test_saved_tensor_read_only_for_its_shape_does_not_raise():
    """mul saves ``self`` and reads it only for its shape when ``other`` needs no grad: modifying
    it in place must not raise (PyTorch does not unpack it; sweep seed 49)."""
    def prog(lib, x):
        a = x * 0.5
        b = a * 0.25             # saves a (only its shape is needed: 0.25 needs no grad)
        a.neg_()
        (b * b).sum().backward()
        return (b,)
    _both(prog, (2, 3, 4))


def test_identity_flatten_and_contiguous_stand_for_their_input():
    """torch returns the input itself from a no-op flatten/contiguous; ours is an alias that must
    behave the same, under no_grad too (sweep seeds 74, 1518)."""
    def prog(lib, x):
        y = x * 1.5
        with lib.no_grad():
            f = y.flatten()          # 1-d: the input itself
            c = y.contiguous()
        f.mul_(0.5)                  # an in-place on y, not on a no_grad view
        v = y[1:3]
        with lib.no_grad():
            g = v.flatten()          # an identity alias of a view
        y.mul_(2)
        (f * c).sum().backward(retain_graph=True)
        (g * 3).sum().backward()
        return f, c, g
    _both(prog, (4,))


def test_edges_of_inplace_inputs_are_taken_before_the_kernel():
    """A no_grad view used as the *source* of an in-place op on its base: its history is read
    before the write, so it is not yet stale (PyTorch; sweep seed 2366)."""
    def prog(lib, x):
        y = x * 1.5
        with lib.no_grad():
            v = y.movedim(0, 0)
        y.sub_(v)
        y.sum().backward()
        return (y,)
    _both(prog, (3, 4))


def test_view_taken_before_its_base_required_grad_is_a_leaf_for_the_inplace_check():
    """PyTorch's in-place check reads the view's stored node: a view of a tensor without grad,
    not read since the base gained history, raises 'a leaf Variable' (sweep seed 2073).  After
    its grad_fn was read, or once it was used, it does not."""
    def prog(lib, w, read):
        b = lib.zeros(4, dtype=F64)
        v = b[0:2]
        b.add_(w)
        if read:
            v.grad_fn
        v.mul_(2)
        (b * b).sum().backward()
        return (b,)
    assert _raises_like_torch(lambda lib, w: prog(lib, w, False), (4,), match="a leaf Variable that requires grad")
    _both(lambda lib, w: prog(lib, w, True), (4,))


def test_setitem_into_a_non_overlapping_part_of_an_expand():
    """``e[0] = v`` writes the sub-view e[0] (which overlaps nothing), not the whole expand; an
    empty region writes nothing (sweep seed 1648)."""
    def prog(lib, x, w):
        y = x * 1
        e = y.expand(2, 3)
        e[:, 3:] = 1.0
        e[1] = w * 2
        (y * y).sum().backward()
        return (y,)
    _both(prog, (3,), (3,))


# ---- differential testing against torch.autograd --------------------------------------------------
class _World:
    def __init__(self, lib):
        self.lib = lib
        self.pool = []     # every tensor the program made (bases, views, results)
        self.leaves = []

    def const(self, t):
        return t.clone() if self.lib is torch else tp.from_torch(t.clone())

    def no_grad(self):
        return self.lib.no_grad()


def _rand_index(rng, shape):
    items = []
    for n in shape:
        r = rng.random()
        if r < 0.3:
            items.append(slice(None))
        elif r < 0.5 and n > 0:
            items.append(rng.randrange(-n, n))
        else:
            a = rng.randint(-n - 1, n) if rng.random() < 0.7 else None
            b = rng.randint(-n - 1, n + 1) if rng.random() < 0.7 else None
            items.append(slice(a, b, rng.choice((1, 1, 2, 3))))
    if items and rng.random() < 0.3:
        items = items[:rng.randint(0, len(items))] + [Ellipsis]
    if rng.random() < 0.15:
        items.insert(rng.randint(0, len(items)), None)
    return tuple(items)


def _gen_view(rng, t):
    """(description, fn(tensor) -> view) for a random view op valid on torch tensor ``t``."""
    s, n = tuple(t.shape), t.dim()
    choices = ["getitem", "unsqueeze", "flatten"]
    if n >= 1:
        choices += ["select", "narrow", "squeeze", "view", "reshape", "t" if n <= 2 else "transpose"]
    if n >= 2:
        choices += ["transpose", "permute", "diagonal", "movedim"]
    if any(d == 1 for d in s) or rng.random() < 0.3:
        choices.append("expand")
    k = rng.choice(choices)
    d = rng.randrange(n) if n else 0
    if k == "getitem":
        idx = _rand_index(rng, s)
        return f"[{idx!r}]", lambda x: x[idx]
    if k == "select":
        if s[d] == 0:
            return "[...]", lambda x: x[...]
        i = rng.randrange(-s[d], s[d])
        return f".select({d}, {i})", lambda x: x.select(d, i)
    if k == "narrow":
        st = rng.randint(0, s[d])
        ln = rng.randint(0, s[d] - st)
        return f".narrow({d}, {st}, {ln})", lambda x: x.narrow(d, st, ln)
    if k == "transpose":
        e = rng.randrange(n)
        return f".transpose({d}, {e})", lambda x: x.transpose(d, e)
    if k == "t":
        return ".t()", lambda x: x.t()
    if k == "permute":
        p = list(range(n))
        rng.shuffle(p)
        return f".permute({p})", lambda x: x.permute(p)
    if k == "movedim":
        e = rng.randrange(n)
        return f".movedim({d}, {e})", lambda x: x.movedim(d, e)
    if k == "unsqueeze":
        e = rng.randint(-n - 1, n)
        return f".unsqueeze({e})", lambda x: x.unsqueeze(e)
    if k == "squeeze":
        if rng.random() < 0.3:
            return ".squeeze()", lambda x: x.squeeze()
        return f".squeeze({d})", lambda x: x.squeeze(d)
    if k == "flatten":
        return ".flatten()", lambda x: x.flatten()
    if k in ("view", "reshape"):
        new = [-1] if rng.random() < 0.5 else list(s[:d]) + [1] + list(s[d:])
        if k == "view" and not t.is_contiguous():
            k = "reshape"           # may copy; identical aliasing in both libraries
        return f".{k}({new})", (lambda x: x.view(new)) if k == "view" else (lambda x: x.reshape(new))
    if k == "diagonal":
        e = (d + rng.randrange(1, n)) % n
        off = rng.randint(-2, 2)
        return f".diagonal({off}, {d}, {e})", lambda x: x.diagonal(off, d, e)
    new = [rng.randint(1, 3) if v == 1 else v for v in s]
    if rng.random() < 0.5:
        new = [2] + new
    return f".expand({new})", lambda x: x.expand(new)


def _broadcasts_to(src, shape):
    try:
        return tuple(torch.broadcast_shapes(tuple(src), tuple(shape))) == tuple(shape)
    except RuntimeError:
        return False


def _gen_source(rng, g, pool_t, shape, leaves):
    """A source operand for a write of ``shape``: (description, fn(world, pool) -> tensor)."""
    r = rng.random()
    cands = [i for i, p in enumerate(pool_t) if _broadcasts_to(p.shape, shape)]
    if r < 0.45 and cands:
        i = rng.choice(cands)
        return f"t{i}", lambda w, pool: pool[i]
    if r < 0.65:
        j = rng.randrange(len(leaves))
        c = rng.uniform(-1, 1)
        return f"(leaf{j}.sum() * {c:.3f})", lambda w, pool: w.leaves[j].sum() * c
    if r < 0.8:
        j = rng.randrange(len(leaves))
        cst = torch.randn(shape, generator=g, dtype=F64)
        return f"(leaf{j}.mean() * C{list(shape)})", lambda w, pool: w.leaves[j].mean() * w.const(cst)
    cst = torch.randn(shape, generator=g, dtype=F64)
    return f"C{list(shape)}", lambda w, pool: w.const(cst)


_INPLACE = ("mul_s", "mul_t", "add_", "sub_", "div_s", "copy_", "zero_", "fill_", "clamp_", "relu_", "tanh_",
            "neg_", "setitem", "setitem_s")


def _gen_inplace(rng, g, pool_t, tgt, leaves):
    s = tuple(pool_t[tgt].shape)
    k = rng.choice(_INPLACE)
    c = round(rng.uniform(-2, 2), 3) or 0.5
    if k in ("mul_t", "add_", "sub_", "copy_"):
        sd, sf = _gen_source(rng, g, pool_t, s, leaves)
        alpha = round(rng.uniform(-1.5, 1.5), 3)
        if k == "mul_t":
            return f".mul_({sd})", lambda w, x, pool: x.mul_(sf(w, pool))
        if k == "add_":
            return f".add_({sd}, alpha={alpha})", lambda w, x, pool: x.add_(sf(w, pool), alpha=alpha)
        if k == "sub_":
            return f".sub_({sd})", lambda w, x, pool: x.sub_(sf(w, pool))
        return f".copy_({sd})", lambda w, x, pool: x.copy_(sf(w, pool))
    if k in ("setitem", "setitem_s"):
        idx = _rand_index(rng, s)
        try:
            region = tuple(pool_t[tgt].detach()[idx].shape)
        except (IndexError, RuntimeError, ValueError):
            region = None
        if k == "setitem_s" or region is None:
            def f(w, x, pool):
                x[idx] = c
            return f"[{idx!r}] = {c}", f
        sd, sf = _gen_source(rng, g, pool_t, region, leaves)

        def f(w, x, pool):
            x[idx] = sf(w, pool)
        return f"[{idx!r}] = {sd}", f
    if k == "mul_s":
        return f".mul_({c})", lambda w, x, pool: x.mul_(c)
    if k == "div_s":
        return f".div_({c})", lambda w, x, pool: x.div_(c)
    if k == "fill_":
        return f".fill_({c})", lambda w, x, pool: x.fill_(c)
    if k == "clamp_":
        lo = round(rng.uniform(-1.5, 0.5), 3)
        hi = lo + round(rng.uniform(0.1, 2), 3)
        return f".clamp_({lo}, {hi})", lambda w, x, pool: x.clamp_(lo, hi)
    return f".{k}()", lambda w, x, pool: getattr(x, k)()


def _gen_outofplace(rng, g, pool_t, i):
    s, n = tuple(pool_t[i].shape), pool_t[i].dim()
    ks = ["mul", "sin", "tanh", "exp", "clone", "add_t", "sq"]
    if n >= 1 and s[0] > 0:
        ks += ["unbind", "split", "chunk", "sum"]
    k = rng.choice(ks)
    c = round(rng.uniform(-2, 2), 3)
    if k == "mul":
        return f" * {c}", lambda w, x, pool: x * c
    if k == "sq":
        return " ** 2", lambda w, x, pool: x ** 2
    if k in ("sin", "tanh", "clone"):
        return f".{k}()", lambda w, x, pool: getattr(x, k)()
    if k == "exp":
        return ".tanh().exp()", lambda w, x, pool: x.tanh().exp()
    if k == "add_t":
        cands = [j for j, p in enumerate(pool_t) if _broadcasts_to(p.shape, s)]
        j = rng.choice(cands)
        return f" + t{j}", lambda w, x, pool: x + pool[j]
    if k == "sum":
        d = rng.randrange(n)
        return f".sum({d})", lambda w, x, pool: x.sum(d)
    # multi-output views, consumed at once (PyTorch forbids later writes through them; TPX allows)
    k0 = rng.randrange(s[0])
    if k == "unbind":
        return f".unbind(0)[{k0}] * {c}", lambda w, x, pool: x.unbind(0)[k0] * c
    sz = rng.randint(1, s[0])
    if k == "split":
        m = -(-s[0] // sz)
        j = rng.randrange(m)
        return f".split({sz})[{j}] * {c}", lambda w, x, pool: x.split(sz)[j] * c
    m = len(torch.empty(s[0]).chunk(sz))
    j = rng.randrange(m)
    return f".chunk({sz})[{j}] + {c}", lambda w, x, pool: x.chunk(sz)[j] + c


def _gen_step(rng, g, tw):
    """One random step: (description, fn(world, pool) -> new tensor or None)."""
    pool_t = tw.pool
    leaves = tw.leaves
    r = rng.random()
    i = rng.randrange(len(pool_t))
    ng = rng.random() < 0.12
    wrap = "with no_grad: " if ng else ""

    def under(w, fn):
        if ng:
            with w.no_grad():
                return fn()
        return fn()

    if r < 0.34:
        d, vf = _gen_view(rng, pool_t[i])
        return f"{wrap}t{len(pool_t)} = t{i}{d}", lambda w, pool: under(w, lambda: vf(pool[i]))
    if r < 0.70:
        # in-place targets: mostly non-leaf bases and their views; leaves and their views now and then
        ids = {id(x) for x in leaves}
        good = [j for j in range(len(leaves), len(pool_t)) if id(pool_t[j]._base) not in ids]
        if good and rng.random() < 0.85:
            i = rng.choice(good)
        d, f = _gen_inplace(rng, g, pool_t, i, leaves)

        def step(w, pool):
            under(w, lambda: f(w, pool[i], pool))
            return None
        return f"{wrap}t{i}{d}", step
    if r < 0.92:
        d, f = _gen_outofplace(rng, g, pool_t, i)
        return f"{wrap}t{len(pool_t)} = t{i}{d}", lambda w, pool: under(w, lambda: f(w, pool[i], pool))
    if r < 0.96:
        return f"t{len(pool_t)} = t{i}.detach()", lambda w, pool: pool[i].detach()
    shape = tuple(pool_t[i].shape)
    cst = torch.randn(shape, generator=g, dtype=F64)
    return f"t{len(pool_t)} = C{list(shape)} (no grad)", lambda w, pool: w.const(cst)


def _attempt(fn, *a):
    try:
        return fn(*a), None
    except Exception as e:  # noqa: BLE001  (any error: it must happen in both libraries)
        return None, e


_SHAPES = ((3, 4), (4,), (2, 3, 4), (4, 1, 3), (1, 4), (5,))


def run_program(seed, n_steps=8):
    """Run one random program in torch and tp; assert agreement; return what happened."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    tw, pw = _World(torch), _World(tp)
    log = []

    def fail(msg):
        return f"seed {seed}: {msg}\nprogram:\n  " + "\n  ".join(log)

    for j in range(rng.randint(1, 3)):
        shape = rng.choice(_SHAPES)
        data = torch.randn(shape, generator=g, dtype=F64)
        log.append(f"leaf{j} = t{j} = randn{list(shape)}.requires_grad_()")
        for w in (tw, pw):
            x = w.const(data).requires_grad_()
            w.pool.append(x)
            w.leaves.append(x)
    for j in range(rng.randint(1, 2)):   # non-leaf bases
        i = rng.randrange(len(tw.leaves))
        c = round(rng.uniform(0.5, 2), 3)
        log.append(f"t{len(tw.pool)} = leaf{i} * {c}")
        for w in (tw, pw):
            w.pool.append(w.leaves[i] * c)
    for _ in range(n_steps):
        desc, fn = _gen_step(rng, g, tw)
        log.append(desc)
        rt, et = _attempt(fn, tw, tw.pool)
        rp, ep = _attempt(fn, pw, pw.pool)
        assert (et is None) == (ep is None), fail(f"torch raised {et!r}, tp raised {ep!r} at the last step")
        if et is not None:
            return "raised"
        if rt is not None:
            tw.pool.append(rt)
            pw.pool.append(rp)
    for j, (a, b) in enumerate(zip(pw.pool, tw.pool)):
        assert a.shape == b.shape, fail(f"t{j}: shape {list(a.shape)} vs torch {list(b.shape)}")
        assert a.requires_grad == b.requires_grad, fail(f"t{j}: requires_grad {a.requires_grad} vs torch")
        torch.testing.assert_close(a._data, b.detach(), rtol=1e-9, atol=1e-11, msg=lambda m: fail(f"t{j}: {m}"))
    # backward of a randomly weighted sum of several results
    cands = [j for j, b in enumerate(tw.pool) if b.requires_grad]
    if not cands:
        return "no grad"
    terms = []
    for j in rng.sample(cands, min(len(cands), rng.randint(1, 4))):
        terms.append((j, round(rng.uniform(-2, 2), 3), torch.randn(tuple(tw.pool[j].shape), generator=g, dtype=F64)))
    log.append("loss = " + " + ".join(f"{wt} * (t{j} * R{list(r.shape)}).sum()" for j, wt, r in terms))

    def loss(w):
        out = 0
        for j, wt, r in terms:
            out = out + (w.pool[j] * w.const(r)).sum() * wt
        return out
    lt, et = _attempt(loss, tw)
    lp, ep = _attempt(loss, pw)
    assert (et is None) == (ep is None), fail(f"loss: torch raised {et!r}, tp raised {ep!r}")
    if et is not None:
        return "raised"
    assert lp.requires_grad == lt.requires_grad, fail("loss.requires_grad differs")
    if not lt.requires_grad:
        return "no grad"
    _, et = _attempt(lt.backward)
    _, ep = _attempt(lp.backward)
    assert (et is None) == (ep is None), fail(f"backward: torch raised {et!r}, tp raised {ep!r}")
    if et is not None:
        return "raised in backward"
    for j, (a, b) in enumerate(zip(pw.leaves, tw.leaves)):
        if b.grad is None or a.grad is None:
            assert a.grad is None and b.grad is None, fail(f"leaf{j}: grad {a.grad} vs torch {b.grad}")
            continue
        torch.testing.assert_close(a.grad._data, b.grad, rtol=1e-9, atol=1e-11,
                                   msg=lambda m: fail(f"leaf{j}.grad: {m}"))
    return "backward"


def _sweep(seeds, n_steps):
    outcomes = {}
    for seed in seeds:
        o = run_program(seed, n_steps)
        outcomes[o] = outcomes.get(o, 0) + 1
    return outcomes


def test_differential_random_programs():
    """300 random programs (about 8 steps each): every step, value and gradient agrees with torch."""
    out = _sweep(range(300), 8)
    n = sum(out.values())
    # the generator must exercise both sides: programs reaching backward and programs that raise
    assert out.get("backward", 0) >= 0.4 * n, out
    assert out.get("raised", 0) + out.get("raised in backward", 0) >= 0.05 * n, out


@pytest.mark.slow
def test_differential_random_programs_long():
    out = _sweep(range(1000, 4000), 14)
    assert out.get("backward", 0) >= 0.25 * sum(out.values()), out
