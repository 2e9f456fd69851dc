"""nn.RNN / nn.LSTM / nn.GRU and their cells, and nn.utils.rnn (packed sequences), against torch.nn
with the same weights (copied through state_dict): outputs, final states and every gradient, over
a grid of options (layers, bias, batch_first, bidirectional, proj_size, nonlinearity, unbatched
input, given or default h0/c0, dropout with the same seed), packed sequences sorted and unsorted,
state_dict round trips, PyTorch's initialisation under one seed, errors naming the module, and
an LSTM training step compiled by Stax (strict native) equal to eager."""
import itertools

import pytest
import torch
import torch.nn.utils.rnn as trnn

import tensorplay as tp
import tensorplay.nn as nn
import tensorplay.nn.functional as F
from tensorplay.nn.utils import rnn as prnn

I, H = 5, 6


def tp_of(x, requires_grad=False):
    t = tp.from_torch(x.detach().clone())
    return t.requires_grad_() if requires_grad else t


def make(cls, dtype=torch.float64, seed=0, **kw):
    """A torch module and a tp module with the same weights (state_dict keys are PyTorch's)."""
    torch.manual_seed(seed)
    tm = getattr(torch.nn, cls)(I, H, **kw).to(dtype)
    m = getattr(nn, cls)(I, H, **kw).to(dtype)
    tsd = tm.state_dict()
    assert list(m.state_dict()) == list(tsd)
    r = m.load_state_dict(tsd)
    assert r.missing_keys == [] and r.unexpected_keys == []
    return tm, m


def flat(out):
    """(output, h) or (output, (h, c)) -> list of tensors (a PackedSequence gives its data)."""
    o, h = out
    o = o.data if isinstance(o, (prnn.PackedSequence, trnn.PackedSequence)) else o
    return [o] + (list(h) if isinstance(h, tuple) else [h])


def loss_of(ts, weights):
    return sum((t * w).sum() for t, w in zip(ts, weights))


def compare(tm, m, t_args, p_args, tol):
    """Forward values and the gradients of every parameter and input requiring grad."""
    t_out, p_out = flat(tm(*t_args)), flat(m(*p_args))
    assert len(t_out) == len(p_out)
    for a, b in zip(p_out, t_out):
        assert tuple(a.shape) == tuple(b.shape)
        torch.testing.assert_close(a.torch(), b.detach(), rtol=tol, atol=tol)
    g = torch.Generator().manual_seed(1)
    weights = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in t_out]
    loss_of(t_out, weights).backward()
    loss_of(p_out, [tp_of(w) for w in weights]).backward()
    tparams = dict(tm.named_parameters())
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.grad.torch(), tparams[name].grad, rtol=tol, atol=tol, msg=name)
    return t_out, p_out


def states(cls, kw, batch, dtype, seed=2):
    d = (2 if kw.get("bidirectional") else 1) * kw.get("num_layers", 1)
    hs = (d, batch, kw.get("proj_size") or H) if batch is not None else (d, kw.get("proj_size") or H)
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(hs, generator=g, dtype=dtype, requires_grad=True)
    if cls != "LSTM":
        return h, tp_of(h, True)
    cs = hs[:-1] + (H,)
    c = torch.randn(cs, generator=g, dtype=dtype, requires_grad=True)
    return (h, c), (tp_of(h, True), tp_of(c, True))


# every value of every option, each pair of (layers, bias, batch_first, bidirectional) values at least once
GRID = [dict(num_layers=n, bias=b, batch_first=bf, bidirectional=bd)
        for n, b, bf, bd in ((1, True, False, False), (2, False, True, True), (2, True, False, True),
                             (1, False, True, False), (2, True, True, False), (1, False, False, True))]
MODES = [("LSTM", {}), ("LSTM", {"proj_size": 3}), ("GRU", {}), ("RNN", {}), ("RNN", {"nonlinearity": "relu"})]


@pytest.mark.parametrize("cls,extra", MODES, ids=lambda v: v if isinstance(v, str) else str(v))
@pytest.mark.parametrize("kw", GRID, ids=str)
def test_module_grid_float64(cls, extra, kw):
    kw = {**kw, **extra}
    tm, m = make(cls, **kw)
    T, B = 4, 3
    x = torch.randn((B, T, I) if kw["batch_first"] else (T, B, I), dtype=torch.float64, requires_grad=True)
    xp = tp_of(x, True)
    th, ph = states(cls, kw, B, torch.float64)
    compare(tm, m, (x, th), (xp, ph), 1e-12)
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=1e-12, atol=1e-12)
    for a, b in zip(ph if isinstance(ph, tuple) else (ph,), th if isinstance(th, tuple) else (th,)):
        torch.testing.assert_close(a.grad.torch(), b.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls,extra", MODES, ids=lambda v: v if isinstance(v, str) else str(v))
def test_float32_default_state_and_noncontiguous(cls, extra):
    kw = dict(num_layers=2, bidirectional=True, **extra)
    tm, m = make(cls, dtype=torch.float32, **kw)
    x = torch.randn(3, 5, I).transpose(0, 1)  # (T=5, B=3, I), not contiguous
    assert not x.is_contiguous()
    x.requires_grad_()
    xp = tp.from_torch(x.detach()).requires_grad_()
    compare(tm, m, (x,), (xp,), 2e-5)
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("cls,extra", MODES, ids=lambda v: v if isinstance(v, str) else str(v))
@pytest.mark.parametrize("with_h", [False, True])
def test_unbatched(cls, extra, with_h):
    kw = dict(num_layers=2, bidirectional=True, **extra)
    tm, m = make(cls, **kw)
    x = torch.randn(5, I, dtype=torch.float64, requires_grad=True)
    xp = tp_of(x, True)
    th, ph = states(cls, kw, None, torch.float64) if with_h else (None, None)
    out = compare(tm, m, (x, th), (xp, ph), 1e-12)[1]
    assert out[0].shape == (5, 2 * (extra.get("proj_size") or H))
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=1e-12, atol=1e-12)


def test_size_zero_batch():
    tm, m = make("LSTM", num_layers=2)
    x = torch.randn(3, 0, I, dtype=torch.float64)
    to, (th, tc) = tm(x)
    o, (h, c) = m(tp_of(x))
    assert o.shape == to.shape == (3, 0, H) and h.shape == th.shape and c.shape == tc.shape


def test_dropout_between_layers_same_seed():
    """Dropout draws from the global generator in PyTorch's order: same seed, same masks."""
    tm, m = make("LSTM", dtype=torch.float32, num_layers=3, dropout=0.4, proj_size=2)
    x = torch.randn(6, 3, I)
    torch.manual_seed(11)
    to, _ = tm(x)
    tp.manual_seed(11)
    o, _ = m(tp.from_torch(x))
    torch.testing.assert_close(o.torch(), to, rtol=1e-5, atol=1e-6)   # the same masks
    tm.eval(), m.eval()
    no_drop = m(tp.from_torch(x))[0].torch()
    torch.testing.assert_close(no_drop, tm(x)[0], rtol=1e-5, atol=1e-6)
    assert not torch.equal(no_drop, o.torch())


def test_dropout_packed_bidirectional_same_seed():
    tm, m = make("GRU", dtype=torch.float32, num_layers=3, dropout=0.3, bidirectional=True)
    x = torch.randn(6, 3, I)
    tpk = trnn.pack_padded_sequence(x, [3, 6, 2], enforce_sorted=False)
    ppk = prnn.pack_padded_sequence(tp.from_torch(x), [3, 6, 2], enforce_sorted=False)
    torch.manual_seed(11)
    to, th = tm(tpk)
    tp.manual_seed(11)
    o, h = m(ppk)
    torch.testing.assert_close(o.data.torch(), to.data, rtol=1e-5, atol=1e-6)   # the same masks
    torch.testing.assert_close(h.torch(), th, rtol=1e-5, atol=1e-6)


def test_initialisation_matches_pytorch_under_one_seed():
    for cls, kw in [("LSTM", dict(num_layers=2, bidirectional=True, proj_size=3)), ("GRU", {}), ("RNN", {})]:
        torch.manual_seed(5)
        tm = getattr(torch.nn, cls)(I, H, **kw)
        tp.manual_seed(5)
        m = getattr(nn, cls)(I, H, **kw)
        tsd = tm.state_dict()
        assert list(m.state_dict()) == list(tsd)
        for k, v in tsd.items():
            assert torch.equal(m.state_dict()[k].torch(), v), k
    m = nn.LSTM(I, H, num_layers=2, proj_size=3, bidirectional=True)
    names = [n for n, _ in m.named_parameters()]
    assert names[:5] == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0", "weight_hr_l0"]
    assert "weight_hr_l1_reverse" in names and m.weight_hh_l1_reverse.shape == (4 * H, 3)
    assert [len(w) for w in m.all_weights] == [5] * 4
    bound = 1 / H ** 0.5
    assert all(float(p.abs().max()) <= bound for p in m.parameters())


def test_state_dict_round_trip():
    tm, m = make("GRU", dtype=torch.float32, num_layers=2, bidirectional=True)
    m2 = nn.GRU(I, H, num_layers=2, bidirectional=True)
    m2.load_state_dict(m.state_dict())
    x = tp.randn(4, 2, I)
    assert torch.equal(m(x)[0].torch(), m2(x)[0].torch())
    tm2 = torch.nn.GRU(I, H, num_layers=2, bidirectional=True)
    tm2.load_state_dict({k: v.torch() for k, v in m.state_dict().items()})
    torch.testing.assert_close(tm2(x.torch())[0], m(x)[0].torch(), rtol=1e-6, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# cells
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,kw", [("LSTMCell", {}), ("GRUCell", {}), ("RNNCell", {}),
                                    ("RNNCell", {"nonlinearity": "relu"}), ("LSTMCell", {"bias": False})])
@pytest.mark.parametrize("batched,with_h", [(True, True), (True, False), (False, True), (False, False)])
def test_cells(cls, kw, batched, with_h):
    tm, m = make(cls, **kw)
    shape = (3,) if batched else ()
    x = torch.randn(*shape, I, dtype=torch.float64, requires_grad=True)
    xp = tp_of(x, True)
    targs, pargs = [x], [xp]
    if with_h:
        n = 2 if cls == "LSTMCell" else 1
        hs = [torch.randn(*shape, H, dtype=torch.float64, requires_grad=True) for _ in range(n)]
        targs.append(tuple(hs) if cls == "LSTMCell" else hs[0])
        pargs.append(tuple(tp_of(h, True) for h in hs) if cls == "LSTMCell" else tp_of(hs[0], True))
    t_out, p_out = tm(*targs), m(*pargs)
    t_out = list(t_out) if isinstance(t_out, tuple) else [t_out]
    p_out = list(p_out) if isinstance(p_out, tuple) else [p_out]
    for a, b in zip(p_out, t_out):
        torch.testing.assert_close(a.torch(), b.detach(), rtol=1e-12, atol=1e-12)
    w = [torch.randn(t.shape, dtype=t.dtype) for t in t_out]
    loss_of(t_out, w).backward()
    loss_of(p_out, [tp_of(v) for v in w]).backward()
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=1e-12, atol=1e-12)
    tparams = dict(tm.named_parameters())
    for name, p in m.named_parameters():
        torch.testing.assert_close(p.grad.torch(), tparams[name].grad, rtol=1e-12, atol=1e-12)


def test_lstm_gradcheck_float64():
    tp.manual_seed(0)
    m = nn.LSTM(3, 4, proj_size=2, bidirectional=True).double()
    x = tp.randn(3, 2, 3, dtype=torch.float64, requires_grad=True)
    assert tp.autograd.gradcheck(lambda x: m(x)[0], (x,))


# ---------------------------------------------------------------------------------------------
# packed sequences
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls,extra", MODES, ids=lambda v: v if isinstance(v, str) else str(v))
@pytest.mark.parametrize("batch_first,enforce_sorted", [(False, True), (False, False), (True, False)])
def test_packed_sequence_modules(cls, extra, batch_first, enforce_sorted):
    kw = dict(num_layers=2, bidirectional=True, batch_first=batch_first, **extra)
    tm, m = make(cls, **kw)
    lengths = [5, 4, 4, 2] if enforce_sorted else [2, 5, 1, 4]
    B, T = len(lengths), 6
    x = torch.randn((B, T, I) if batch_first else (T, B, I), dtype=torch.float64, requires_grad=True)
    xp = tp_of(x, True)
    tpk = trnn.pack_padded_sequence(x, lengths, batch_first=batch_first, enforce_sorted=enforce_sorted)
    ppk = prnn.pack_padded_sequence(xp, tp.tensor(lengths), batch_first=batch_first, enforce_sorted=enforce_sorted)
    assert ppk.batch_sizes.tolist() == tpk.batch_sizes.tolist()
    for a, b in ((ppk.sorted_indices, tpk.sorted_indices), (ppk.unsorted_indices, tpk.unsorted_indices)):
        assert (a is None and b is None) or a.tolist() == b.tolist()
    th, ph = states(cls, kw, B, torch.float64)
    compare(tm, m, (tpk, th), (ppk, ph), 1e-12)
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=1e-12, atol=1e-12)
    # unpacking the module's output
    po, pl = prnn.pad_packed_sequence(m(ppk, ph)[0], batch_first=batch_first, padding_value=-2.0, total_length=7)
    to, tl = trnn.pad_packed_sequence(tm(tpk, th)[0], batch_first=batch_first, padding_value=-2.0, total_length=7)
    torch.testing.assert_close(po.torch(), to.detach(), rtol=1e-12, atol=1e-12)
    assert pl.tolist() == tl.tolist() == lengths


def test_pack_pad_round_trip_and_gradients():
    x = torch.randn(3, 4, 2, dtype=torch.float64, requires_grad=True)
    lengths = [2, 4, 1]
    xp = tp_of(x, True)
    pk = prnn.pack_padded_sequence(xp, lengths, batch_first=True, enforce_sorted=False)
    tk = trnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    torch.testing.assert_close(pk.data.torch(), tk.data.detach(), rtol=0, atol=0)
    out, lens = prnn.pad_packed_sequence(pk, batch_first=True)
    tout, tlens = trnn.pad_packed_sequence(tk, batch_first=True)
    torch.testing.assert_close(out.torch(), tout.detach(), rtol=0, atol=0)
    assert lens.tolist() == tlens.tolist() == lengths and lens.dtype == torch.int64
    w = torch.randn(tout.shape, dtype=torch.float64)
    (tout * w).sum().backward()
    (out * tp_of(w)).sum().backward()
    torch.testing.assert_close(xp.grad.torch(), x.grad, rtol=0, atol=0)   # padding positions get 0


@pytest.mark.parametrize("batch_first,side", [(False, "right"), (True, "right"), (True, "left")])
def test_pad_sequence_pack_sequence(batch_first, side):
    seqs = [torch.randn(n, 3, dtype=torch.float64) for n in (4, 2, 3)]
    ps = [tp_of(s) for s in seqs]
    torch.testing.assert_close(
        prnn.pad_sequence(ps, batch_first=batch_first, padding_value=-1.5, padding_side=side).torch(),
        trnn.pad_sequence(seqs, batch_first=batch_first, padding_value=-1.5, padding_side=side), rtol=0, atol=0)
    pk, tk = prnn.pack_sequence(ps, enforce_sorted=False), trnn.pack_sequence(seqs, enforce_sorted=False)
    torch.testing.assert_close(pk.data.torch(), tk.data, rtol=0, atol=0)
    assert pk.batch_sizes.tolist() == tk.batch_sizes.tolist()
    for a, b in zip(prnn.unpack_sequence(pk), trnn.unpack_sequence(tk)):
        torch.testing.assert_close(a.torch(), b, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="pack_padded_sequence.*sorted in decreasing order"):
        prnn.pack_sequence(ps)


def test_packed_sequence_api():
    pk = prnn.pack_sequence([tp.randn(3, 2), tp.randn(2, 2)])
    assert isinstance(pk, tuple) and pk.sorted_indices is None and pk.unsorted_indices is None
    d = pk.double()
    assert d.data.dtype == torch.float64 and d.batch_sizes.tolist() == [2, 2, 1]
    p2 = prnn.PackedSequence(pk.data, pk.batch_sizes, tp.tensor([1, 0]))
    assert p2.unsorted_indices.tolist() == [1, 0]
    assert not pk.is_cuda
    import tensorplay.nn.utils.rnn as mod  # the package layout: nn.utils keeps its old names
    assert mod is prnn and callable(nn.utils.clip_grad_norm_) and nn.utils.rnn is prnn


def test_packing_errors():
    x = tp.randn(4, 2, 3)
    with pytest.raises(ValueError, match="pad_packed_sequence.*total_length"):
        prnn.pad_packed_sequence(prnn.pack_padded_sequence(x, [4, 2]), total_length=3)
    with pytest.raises(RuntimeError, match="pack_padded_sequence.*length > 0"):
        prnn.pack_padded_sequence(x, [4, 0])
    with pytest.raises(ValueError, match="pack_padded_sequence.*expected 3 sequences"):
        prnn.pack_padded_sequence(x, [4, 2, 1])


# ---------------------------------------------------------------------------------------------
# errors
# ---------------------------------------------------------------------------------------------
def test_bad_inputs_name_the_module():
    m = nn.LSTM(I, H, num_layers=2)
    with pytest.raises(RuntimeError, match=r"nn\.LSTM: input\.size\(-1\) must be equal to input_size. "
                                           r"Expected 5, got 4"):
        m(tp.randn(3, 2, 4))
    with pytest.raises(RuntimeError, match=r"nn\.LSTM: Expected hidden\[0\] size \(2, 2, 6\), got \[1, 2, 6\]"):
        m(tp.randn(3, 2, I), (tp.randn(1, 2, H), tp.randn(2, 2, H)))
    with pytest.raises(RuntimeError, match=r"nn\.LSTM: Expected hidden\[1\] size \(2, 2, 6\), got \[2, 2, 5\]"):
        m(tp.randn(3, 2, I), (tp.randn(2, 2, H), tp.randn(2, 2, 5)))
    with pytest.raises(RuntimeError, match=r"nn\.GRU: Expected hidden size \(1, 3, 6\), got \[1, 2, 6\]"):
        nn.GRU(I, H)(tp.randn(4, 3, I), tp.randn(1, 2, H))
    with pytest.raises(RuntimeError, match=r"nn\.RNN: For batched 3-D input, hx should also be 3-D"):
        nn.RNN(I, H)(tp.randn(4, 3, I), tp.randn(3, H))
    with pytest.raises(RuntimeError, match=r"nn\.RNN: For unbatched 2-D input, hx should also be 2-D"):
        nn.RNN(I, H)(tp.randn(4, I), tp.randn(1, 1, H))
    with pytest.raises(RuntimeError, match=r"nn\.LSTM: Expected sequence length to be larger than 0"):
        m(tp.randn(0, 2, I))
    with pytest.raises(RuntimeError, match=r"nn\.GRU: Expected sequence length to be larger than 0"):
        nn.GRU(I, H, batch_first=True)(tp.randn(2, 0, I))
    with pytest.raises(ValueError, match=r"nn\.GRU: Expected input to be 2D or 3D, got 4D"):
        nn.GRU(I, H)(tp.randn(1, 4, 3, I))
    with pytest.raises(RuntimeError, match=r"nn\.GRU: input must have the type torch.float32"):
        nn.GRU(I, H)(tp.randn(4, 3, I, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"nn\.LSTMCell: input has inconsistent input_size: got 4 expected 5"):
        nn.LSTMCell(I, H)(tp.randn(3, 4))
    with pytest.raises(RuntimeError, match=r"nn\.GRUCell: Expected hidden size \(3, 6\), got \[3, 5\]"):
        nn.GRUCell(I, H)(tp.randn(3, I), tp.randn(3, 5))
    with pytest.raises(ValueError, match=r"nn\.RNNCell: Expected input to be 1D or 2D, got 3D"):
        nn.RNNCell(I, H)(tp.randn(1, 3, I))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match=r"nn\.RNN: Unknown nonlinearity 'gelu'"):
        nn.RNN(I, H, nonlinearity="gelu")
    with pytest.raises(ValueError, match=r"nn\.GRU: proj_size argument is only supported for LSTM"):
        nn.GRU(I, H, proj_size=2)
    with pytest.raises(ValueError, match=r"nn\.LSTM: proj_size has to be smaller than hidden_size"):
        nn.LSTM(I, H, proj_size=H)
    with pytest.raises(ValueError, match=r"nn\.LSTM: dropout should be a number in range \[0, 1\]"):
        nn.LSTM(I, H, num_layers=2, dropout=1.5)
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(I, H, dropout=0.2)
    assert repr(nn.LSTM(I, H, num_layers=2, batch_first=True, proj_size=2)) == \
        repr(torch.nn.LSTM(I, H, num_layers=2, batch_first=True, proj_size=2))
    assert repr(nn.RNN(I, H, nonlinearity="relu")) == repr(torch.nn.RNN(I, H, nonlinearity="relu"))
    assert repr(nn.GRUCell(I, H, bias=False)) == repr(torch.nn.GRUCell(I, H, bias=False))
    assert repr(nn.RNNCell(I, H, nonlinearity="relu")) == repr(torch.nn.RNNCell(I, H, nonlinearity="relu"))


# ---------------------------------------------------------------------------------------------
# compiled
# ---------------------------------------------------------------------------------------------
def _lstm_lm(T=3, B=2, V=7, E=4, seed=0):
    tp.manual_seed(seed)
    emb, lstm, head = nn.Embedding(V, E), nn.LSTM(E, H, num_layers=2), nn.Linear(H, V)
    params = list(emb.parameters()) + list(lstm.parameters()) + list(head.parameters())

    def loss_fn(idx, y):
        out, (h, c) = lstm(emb(idx))
        return F.cross_entropy(head(out).reshape(-1, V), y.reshape(-1)) + (c * c).mean()

    idx, y = tp.randint(0, V, (T, B)), tp.randint(0, V, (T, B))
    return loss_fn, params, idx, y


def _step(fn, params, idx, y):
    for p in params:
        p.grad = None
    loss = fn(idx, y)
    loss.backward()
    return loss.torch().clone(), [p.grad.torch().clone() for p in params]


def test_compiled_aot_eager_lstm_step_is_bitwise_eager():
    loss_fn, params, idx, y = _lstm_lm(T=2)
    ref = _step(loss_fn, params, idx, y)
    cf = tp.compile(loss_fn, backend="aot_eager")
    for _ in range(3):
        got = _step(cf, params, idx, y)
    assert cf.counters["captures"] == 1 and cf.counters["backward_compiles"] == 1
    assert torch.equal(got[0], ref[0]) and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


def test_compiled_packed_gru_is_bitwise_eager():
    """Packing, the packed recurrence and unpacking inside one compiled training region."""
    tp.manual_seed(0)
    m = nn.GRU(I, H, bidirectional=True)
    x = tp.randn(4, 3, I)

    def f(x):
        out, h = m(prnn.pack_padded_sequence(x, [2, 4, 3], enforce_sorted=False))
        o, _ = prnn.pad_packed_sequence(out)
        return (o * o).sum() + h.sum()

    params = list(m.parameters())
    ref = _step(lambda x, _: f(x), params, x, None)
    cf = tp.compile(f, backend="aot_eager")
    for _ in range(3):
        got = _step(lambda x, _: cf(x), params, x, None)
    assert cf.counters["captures"] == 1
    assert torch.equal(got[0], ref[0]) and all(torch.equal(a, b) for a, b in zip(got[1], ref[1]))


@pytest.mark.slow
def test_compiled_stax_lstm_step_strict_native(capfd):
    """Stax, strict_native: only the matmuls (extern kernels) leave Stax; the forward runs one
    kernel per step and layer (the four gates, the cell and hidden updates)."""
    from tensorplay.compiler import config
    loss_fn, params, idx, y = _lstm_lm(T=3)
    ref = _step(loss_fn, params, idx, y)
    cf = tp.compile(loss_fn, strict_native=True)
    with config.patch({"stax.debug": "plan"}):
        for _ in range(3):
            got = _step(cf, params, idx, y)
    plans = capfd.readouterr()
    assert cf.counters["captures"] == 1 and cf.counters["backward_compiles"] == 1
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[1], ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    text = plans.out + plans.err
    fwd = text.split("===== [stax] plan =====")[1]
    # the forward: one (B, H) = (2, 6) kernel per time step and layer computes the four gates from
    # their slices (offsets 0, 6, 12, 18 of the 4H = 24 wide projections), the cell and the hidden state
    step_kernels = [k for k in fwd.split("\nkernel")[1:]
                    if k.split("\n")[0].endswith("rows [2] x inner [6], index int32")]
    assert len(step_kernels) == 2 * 3
    for k in step_kernels:
        assert all(f"24*xm0 + {off}]" in k for off in (6, 12, 18)) and "24*xm0]" in k
