"""tp.nn modules against torch.nn: same weights (moved through state_dict both ways), same outputs and
gradients; Module API (registration, traversal, state_dict, train/eval, to(), hooks, repr); nn.init."""
import copy
import math
import re

import pytest
import torch
import torch.nn as tnn

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def tp_to_torch_sd(sd):
    return {k: v.torch().clone() for k, v in sd.items()}


def sync(tmod, pmod):
    """Copy torch module weights into the tp module (and check the keys are PyTorch's)."""
    tsd = tmod.state_dict()
    assert list(pmod.state_dict()) == list(tsd), "state_dict keys differ from torch"
    r = pmod.load_state_dict(tsd)
    assert r.missing_keys == [] and r.unexpected_keys == []


def tp_in(x, requires_grad=None):
    if not isinstance(x, torch.Tensor):
        return x
    t = tp.from_torch(x.detach().clone())
    if requires_grad is None:
        requires_grad = x.is_floating_point()
    if requires_grad:
        t.requires_grad_()
    return t


def th_in(x):
    if not isinstance(x, torch.Tensor):
        return x
    t = x.detach().clone()
    if t.is_floating_point():
        t.requires_grad_()
    return t


_TORCH_213 = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 13)


def same_repr(ours, theirs):
    """PyTorch >= 2.13 prints ``bias=`` for norm layers; older versions do not (ours follows 2.13)."""
    if not _TORCH_213:
        strip = lambda s: re.sub(r", bias=(True|False)(?=[,)])", "", s)  # noqa: E731
        ours, theirs = strip(ours), strip(theirs)
    assert ours == theirs


def _first(o):
    return o[0] if isinstance(o, tuple) else o


def compare(tmod, pmod, *inputs, rtol=1e-5, atol=1e-6, grad=True, call=None):
    """Forward and backward of tmod (torch) and pmod (tp) on the same inputs; compare everything."""
    call = call or (lambda m, *a: m(*a))
    ti = [th_in(x) for x in inputs]
    pi = [tp_in(x) for x in inputs]
    to = call(tmod, *ti)
    po = call(pmod, *pi)
    if isinstance(to, tuple):
        for a, b in zip(po, to):
            if b is None:
                assert a is None
            else:
                assert_close(a, b, rtol=rtol, atol=atol, msg="forward")
    else:
        assert_close(po, to, rtol=rtol, atol=atol, msg="forward")
    if not grad:
        return po
    to, po = _first(to), _first(po)
    g = torch.randn_like(to)
    to.backward(g)
    po.backward(tp.from_torch(g.clone()))
    for a, b in zip(pi, ti):
        if isinstance(b, torch.Tensor) and b.requires_grad:
            assert_close(a.grad, b.grad, rtol=rtol, atol=atol, msg="input grad")
    tparams = dict(tmod.named_parameters())
    for name, p in pmod.named_parameters():
        tg = tparams[name].grad
        if tg is None:
            assert p.grad is None or not p.grad.torch().any(), name
        else:
            assert_close(p.grad, tg, rtol=rtol, atol=atol, msg=f"grad of {name}")
    return po


# ---------------------------------------------------------------------------------------------
# layers vs torch.nn
# ---------------------------------------------------------------------------------------------
LAYERS = [
    ("Linear", (5, 3), {}, [(4, 5)]),
    ("Linear", (5, 3), {"bias": False}, [(2, 3, 5)]),
    ("LayerNorm", (6,), {}, [(3, 6)]),
    ("LayerNorm", ([2, 6],), {"eps": 1e-3}, [(4, 2, 6)]),
    ("LayerNorm", (6,), {"elementwise_affine": False}, [(3, 6)]),
    ("LayerNorm", (6,), {"bias": False}, [(3, 6)]),
    ("RMSNorm", (6,), {}, [(3, 6)]),
    ("RMSNorm", ([2, 6],), {"eps": 1e-4}, [(3, 2, 6)]),
    ("GroupNorm", (2, 6), {}, [(3, 6, 4)]),
    ("Conv1d", (3, 4, 3), {"padding": 1}, [(2, 3, 9)]),
    ("Conv2d", (3, 4, 3), {"stride": 2, "padding": 1}, [(2, 3, 8, 8)]),
    ("Conv2d", (4, 6, 3), {"groups": 2, "bias": False}, [(2, 4, 7, 6)]),
    ("Conv2d", (3, 4, 3), {"padding": "same", "dilation": 2}, [(2, 3, 7, 7)]),
    ("Conv2d", (3, 4, (3, 2)), {"padding": (1, 0), "padding_mode": "reflect"}, [(1, 3, 6, 5)]),
    ("MaxPool2d", (2,), {}, [(2, 3, 6, 6)]),
    ("MaxPool2d", (3,), {"stride": 2, "padding": 1}, [(2, 3, 7, 7)]),
    ("AvgPool2d", (2,), {}, [(2, 3, 6, 6)]),
    ("AvgPool2d", (3,), {"stride": 2, "padding": 1, "count_include_pad": False}, [(2, 3, 7, 7)]),
    ("AdaptiveAvgPool2d", ((2, 3),), {}, [(2, 3, 7, 8)]),
    ("AdaptiveAvgPool2d", (1,), {}, [(2, 3, 5, 5)]),
    ("Upsample", (), {"scale_factor": 2}, [(2, 3, 5, 5)]),
    ("Upsample", ((7, 9),), {"mode": "bilinear", "align_corners": False}, [(2, 3, 5, 5)]),
    ("ReLU", (), {}, [(4, 5)]),
    ("GELU", (), {}, [(4, 5)]),
    ("GELU", (), {"approximate": "tanh"}, [(4, 5)]),
    ("SiLU", (), {}, [(4, 5)]),
    ("Tanh", (), {}, [(4, 5)]),
    ("Sigmoid", (), {}, [(4, 5)]),
    ("Softmax", (), {"dim": 1}, [(4, 5)]),
    ("LogSoftmax", (), {"dim": -1}, [(3, 4, 5)]),
    ("LeakyReLU", (0.2,), {}, [(4, 5)]),
    ("ELU", (), {}, [(4, 5)]),
    ("Softplus", (), {"beta": 2.0}, [(4, 5)]),
    ("Identity", (), {}, [(4, 5)]),
    ("Flatten", (), {}, [(2, 3, 4)]),
    ("Flatten", (0, 1), {}, [(2, 3, 4)]),
    ("Unflatten", (1, (2, 3)), {}, [(4, 6, 2)]),
    ("Bilinear", (3, 4, 5), {}, [(6, 3), (6, 4)]),
    ("PReLU", (), {}, [(4, 5)]),
    ("PReLU", (3,), {"init": 0.1}, [(2, 3, 4)]),
    ("ReLU6", (), {}, [(4, 5)]),
    ("Mish", (), {}, [(4, 5)]),
    ("Softsign", (), {}, [(4, 5)]),
    ("Tanhshrink", (), {}, [(4, 5)]),
    ("Hardtanh", (-0.5, 0.7), {}, [(4, 5)]),
    ("Conv3d", (2, 3, 2), {"stride": (1, 2, 1)}, [(1, 2, 4, 5, 3)]),
    ("ConvTranspose1d", (3, 2, 3), {"stride": 2, "padding": 1, "output_padding": 1}, [(2, 3, 5)]),
    ("ConvTranspose2d", (4, 6, 3), {"stride": 2, "groups": 2, "dilation": 2}, [(1, 4, 4, 3)]),
    ("MaxPool1d", (3,), {"stride": 2}, [(2, 3, 9)]),
    ("AvgPool1d", (2,), {}, [(2, 3, 8)]),
    ("AdaptiveAvgPool1d", (3,), {}, [(2, 3, 8)]),
    ("AdaptiveMaxPool2d", ((2, 2),), {}, [(2, 3, 5, 7)]),
    ("BatchNorm3d", (2,), {}, [(3, 2, 2, 3, 2)]),
    ("Dropout2d", (0.0,), {}, [(2, 3, 4, 4)]),
]


@pytest.mark.parametrize("name,args,kwargs,shapes", LAYERS,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LAYERS)])
def test_layer_matches_torch(name, args, kwargs, shapes):
    tmod = getattr(tnn, name)(*args, **kwargs)
    pmod = getattr(nn, name)(*args, **kwargs)
    sync(tmod, pmod)
    inputs = [torch.randn(s) for s in shapes]
    compare(tmod, pmod, *inputs)
    same_repr(repr(pmod), repr(tmod))


def test_same_initialisation_as_torch():
    """Default initialisers draw the same numbers in the same order as PyTorch's."""
    ctors = [lambda m: m.Linear(7, 5), lambda m: m.Conv2d(3, 4, 3), lambda m: m.Embedding(10, 4, padding_idx=2),
             lambda m: m.MultiheadAttention(8, 2), lambda m: m.Conv1d(2, 3, 5, groups=1, bias=True),
             lambda m: m.TransformerEncoderLayer(8, 2, 16), lambda m: m.BatchNorm1d(3), lambda m: m.LayerNorm(5)]
    for make in ctors:
        torch.manual_seed(3)
        tmod = make(tnn)
        tp.manual_seed(3)
        pmod = make(nn)
        tsd, psd = tmod.state_dict(), pmod.state_dict()
        assert list(tsd) == list(psd)
        for k in tsd:
            assert_close(psd[k], tsd[k], exact=True, msg=k)


def test_embedding_padding_idx():
    tmod, pmod = tnn.Embedding(10, 4, padding_idx=1), nn.Embedding(10, 4, padding_idx=1)
    sync(tmod, pmod)
    idx = torch.tensor([[1, 2, 3, 1], [4, 1, 9, 0]])
    out = compare(tmod, pmod, idx)
    assert not pmod.weight.grad.torch()[1].any()
    same_repr(repr(pmod), repr(tmod))
    assert out.shape == (2, 4, 4)
    assert not nn.Embedding(5, 3, padding_idx=-1).weight.torch()[4].any()
    e = nn.Embedding.from_pretrained(tp.randn(4, 3))
    assert not e.weight.requires_grad and e.weight.shape == (4, 3)


@pytest.mark.parametrize("cls,shape", [("BatchNorm1d", (8, 4)), ("BatchNorm1d", (8, 4, 5)),
                                       ("BatchNorm2d", (4, 4, 5, 3))])
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_train_eval(cls, shape, momentum):
    tmod, pmod = getattr(tnn, cls)(4, momentum=momentum), getattr(nn, cls)(4, momentum=momentum)
    sync(tmod, pmod)
    same_repr(repr(pmod), repr(tmod))
    for _ in range(3):  # running statistics follow torch's
        compare(tmod, pmod, torch.randn(shape) * 3 + 1)
    for k, v in tmod.state_dict().items():
        assert_close(pmod.state_dict()[k], v, rtol=1e-5, atol=1e-6, msg=k)
    assert int(pmod.num_batches_tracked.item()) == 3
    tmod.eval()
    pmod.eval()
    compare(tmod, pmod, torch.randn(shape))
    assert int(pmod.num_batches_tracked.item()) == 3  # eval does not count
    with pytest.raises(ValueError, match="expected"):
        pmod(tp.randn(2, 3, 4, 5, 6))


def test_batchnorm_no_running_stats():
    tmod = tnn.BatchNorm1d(3, track_running_stats=False, affine=False)
    pmod = nn.BatchNorm1d(3, track_running_stats=False, affine=False)
    assert list(pmod.state_dict()) == list(tmod.state_dict()) == []
    tmod.eval()
    pmod.eval()
    compare(tmod, pmod, torch.randn(6, 3))


def test_dropout_train_eval():
    d = nn.Dropout(0.3)
    assert repr(d) == "Dropout(p=0.3, inplace=False)"
    x = tp.ones(200, 100)
    y = d(x)
    kept = (y.torch() != 0).float().mean().item()
    assert 0.65 < kept < 0.75
    assert_close(y.torch()[y.torch() != 0], torch.full_like(y.torch()[y.torch() != 0], 1 / 0.7))
    d.eval()
    assert d(x) is x
    with pytest.raises(ValueError, match="between 0 and 1"):
        nn.Dropout(1.5)
    m = nn.Sequential(nn.Linear(3, 3), nn.Dropout(0.5))
    m.eval()
    assert not any(mod.training for mod in m.modules())
    m.train()
    assert all(mod.training for mod in m.modules())


# ---------------------------------------------------------------------------------------------
# attention / transformer
# ---------------------------------------------------------------------------------------------
MHA_CASES = [
    dict(kw={}, batch_first=False, need_weights=True),
    dict(kw={"batch_first": True}, batch_first=True, need_weights=False),
    dict(kw={"batch_first": True, "bias": False}, batch_first=True, need_weights=True, average=False),
    dict(kw={}, batch_first=False, need_weights=True, attn_mask="bool", kpm=True),
    dict(kw={"batch_first": True}, batch_first=True, need_weights=False, attn_mask="float", kpm=True),
    dict(kw={"batch_first": True, "kdim": 5, "vdim": 3}, batch_first=True, need_weights=True, cross=True),
    dict(kw={"add_bias_kv": True, "add_zero_attn": True}, batch_first=False, need_weights=True, kpm=True,
         attn_mask="bool"),
    dict(kw={}, unbatched=True, need_weights=True, batch_first=False),
    dict(kw={"batch_first": True}, batch_first=True, need_weights=False, causal=True),
]


@pytest.mark.parametrize("case", MHA_CASES, ids=[str(i) for i in range(len(MHA_CASES))])
def test_multihead_attention(case):
    E, H, N, L = 8, 2, 3, 5
    S = 6 if case.get("cross") else L
    tmod, pmod = tnn.MultiheadAttention(E, H, **case["kw"]), nn.MultiheadAttention(E, H, **case["kw"])
    sync(tmod, pmod)
    # state dicts load both ways
    tmod.load_state_dict(tp_to_torch_sd(pmod.state_dict()))
    kd, vd = case["kw"].get("kdim", E), case["kw"].get("vdim", E)
    bf = case["batch_first"]
    if case.get("unbatched"):
        q = torch.randn(L, E)
        inputs = [q]
    else:
        shp = (lambda n, l, e: (n, l, e)) if bf else (lambda n, l, e: (l, n, e))
        q = torch.randn(shp(N, L, E))
        inputs = [q] if not case.get("cross") else [q, torch.randn(shp(N, S, kd)), torch.randn(shp(N, S, vd))]
    kwargs = {"need_weights": case["need_weights"], "average_attn_weights": case.get("average", True)}
    if case.get("attn_mask") == "bool":
        am = torch.rand(L, S) < 0.3
        am[:, 0] = False
        kwargs["attn_mask"] = am
    elif case.get("attn_mask") == "float":
        kwargs["attn_mask"] = torch.randn(L, S)
    if case.get("kpm"):
        kpm = torch.zeros(N, S, dtype=torch.bool)
        kpm[0, -2:] = True
        if case.get("attn_mask") == "float":  # torch wants both masks of one kind
            kpm = torch.zeros(N, S).masked_fill(kpm, float("-inf"))
        kwargs["key_padding_mask"] = kpm
    if case.get("causal"):
        kwargs["is_causal"] = True
        kwargs["attn_mask"] = tnn.Transformer.generate_square_subsequent_mask(L)

    def call(m, *xs):
        is_tp = isinstance(m, nn.Module)
        kw = {k: (tp_in(v, False) if is_tp and isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
        if len(xs) == 1:
            return m(xs[0], xs[0], xs[0], **kw)
        return m(*xs, **kw)
    compare(tmod, pmod, *inputs, call=call, rtol=1e-5, atol=1e-5)


def test_mha_causal_without_mask_equals_explicit_mask():
    m = nn.MultiheadAttention(8, 2, batch_first=True)
    x = tp.randn(2, 5, 8)
    mask = tp.from_torch(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1))
    a = m(x, x, x, need_weights=False, is_causal=True)[0]
    b = m(x, x, x, need_weights=False, attn_mask=mask)[0]
    c = m(x, x, x, need_weights=True, is_causal=True)[0]
    assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert_close(c, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_transformer_encoder_layer(norm_first, activation):
    kw = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=True, norm_first=norm_first,
              activation=activation)
    tmod, pmod = tnn.TransformerEncoderLayer(**kw), nn.TransformerEncoderLayer(**kw)
    sync(tmod, pmod)
    tmod.load_state_dict(tp_to_torch_sd(pmod.state_dict()))
    compare(tmod, pmod, torch.randn(3, 5, 8), rtol=1e-5, atol=1e-5)
    kpm = torch.zeros(3, 5, dtype=torch.bool)
    kpm[1, 3:] = True
    compare(tmod, pmod, torch.randn(3, 5, 8), rtol=1e-5, atol=1e-5,
            call=lambda m, x: m(x, src_key_padding_mask=tp_in(kpm, False) if isinstance(m, nn.Module) else kpm))
    same_repr(repr(pmod), repr(tmod))


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_layer_training_draws_torchs_dropout_masks(batch_first):
    """Seeded training with dropout equals PyTorch's: attention's output has PyTorch's memory layout,
    so each dropout draws its mask in the same element order."""
    kw = dict(d_model=16, nhead=2, dim_feedforward=16, dropout=0.1, batch_first=batch_first)
    torch.manual_seed(1)
    tmod = tnn.TransformerEncoderLayer(**kw)
    tp.manual_seed(1)
    pmod = nn.TransformerEncoderLayer(**kw)
    x = torch.randn(8, 4, 16)
    L = x.shape[1] if batch_first else x.shape[0]
    torch.manual_seed(3)
    a = tmod(x, src_mask=tnn.Transformer.generate_square_subsequent_mask(L), is_causal=True)
    tp.manual_seed(3)
    b = pmod(tp.from_torch(x), src_mask=nn.Transformer.generate_square_subsequent_mask(L), is_causal=True)
    assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_transformer_encoder_stack():
    layer_t = tnn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    layer_p = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0)
    tmod = tnn.TransformerEncoder(layer_t, 2, norm=tnn.LayerNorm(8), enable_nested_tensor=False)
    pmod = nn.TransformerEncoder(layer_p, 2, norm=nn.LayerNorm(8))
    sync(tmod, pmod)
    compare(tmod, pmod, torch.randn(5, 2, 8), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_decoder_layer_and_stack(norm_first, batch_first):
    kw = dict(d_model=8, nhead=2, dim_feedforward=16, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    tmod = tnn.TransformerDecoder(tnn.TransformerDecoderLayer(**kw), 2, norm=tnn.LayerNorm(8))
    pmod = nn.TransformerDecoder(nn.TransformerDecoderLayer(**kw), 2, norm=nn.LayerNorm(8))
    sync(tmod, pmod)
    tgt, mem = (torch.randn(3, 5, 8), torch.randn(3, 7, 8)) if batch_first else (torch.randn(5, 3, 8), torch.randn(7, 3, 8))
    compare(tmod, pmod, tgt, mem, rtol=1e-5, atol=1e-5)
    causal = tnn.Transformer.generate_square_subsequent_mask(5)
    mkpm = torch.zeros(3, 7, dtype=torch.bool)
    mkpm[2, 4:] = True

    def call(m, t, k):
        own = isinstance(m, nn.Module)
        return m(t, k, tgt_mask=tp_in(causal, False) if own else causal,
                 memory_key_padding_mask=tp_in(mkpm, False) if own else mkpm, tgt_is_causal=True)
    compare(tmod, pmod, tgt, mem, rtol=1e-5, atol=1e-5, call=call)


def test_transformer_model():
    """nn.Transformer: the same seeded weights as torch (xavier over every matrix), outputs and gradients
    with masks, the causal-mask helper, the shape checks."""
    torch.manual_seed(5)
    tmod = tnn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16,
                           dropout=0.0)
    tp.manual_seed(5)
    pmod = nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=16,
                          dropout=0.0)
    tsd, psd = tmod.state_dict(), pmod.state_dict()
    assert list(tsd) == list(psd)
    for k in tsd:
        assert_close(psd[k], tsd[k], exact=True, msg=k)
    src, tgt = torch.randn(6, 2, 8), torch.randn(4, 2, 8)
    compare(tmod, pmod, src, tgt, rtol=1e-5, atol=1e-5)
    m = tnn.Transformer.generate_square_subsequent_mask(4)
    assert_close(nn.Transformer.generate_square_subsequent_mask(4), m, exact=True)
    compare(tmod, pmod, src, tgt, rtol=1e-5, atol=1e-5,
            call=lambda mod, s, t: mod(s, t, tgt_mask=tp_in(m, False) if isinstance(mod, nn.Module) else m))
    with pytest.raises(RuntimeError, match="nn.Transformer: the batch number"):
        pmod(tp.randn(6, 2, 8), tp.randn(4, 3, 8))
    with pytest.raises(RuntimeError, match="d_model"):
        pmod(tp.randn(6, 2, 8), tp.randn(4, 2, 6))
    same_repr(repr(pmod), repr(tmod))


def test_transformer_subclass_replaces_the_decoder():
    """The word-language-model pattern: subclass nn.Transformer, replace ``decoder`` by a Linear, run the encoder."""
    class LM(nn.Transformer):
        def __init__(self):
            super().__init__(d_model=8, nhead=2, dim_feedforward=16, num_encoder_layers=1, dropout=0.0)
            self.decoder = nn.Linear(8, 11)

        def forward(self, x):
            return self.decoder(self.encoder(x, mask=nn.Transformer.generate_square_subsequent_mask(x.shape[0])))
    m = LM()
    out = m(tp.randn(5, 2, 8))
    assert out.shape == (5, 2, 11) and tp.isfinite(out).all().item()
    out.sum().backward()
    assert m.encoder.layers[0].linear1.weight.grad is not None


# ---------------------------------------------------------------------------------------------
# losses
# ---------------------------------------------------------------------------------------------
def _loss_cases():
    x = torch.randn(6, 4)
    t = torch.tensor([0, 3, 1, 1, 2, 0])
    w = torch.rand(4) + 0.5
    p = torch.rand(6, 4) * 0.9 + 0.05
    y = (torch.rand(6, 4) > 0.5).float()
    return [
        ("CrossEntropyLoss", {}, x, t),
        ("CrossEntropyLoss", {"weight": w, "ignore_index": 1}, x, t),
        ("CrossEntropyLoss", {"label_smoothing": 0.1, "reduction": "sum"}, x, t),
        ("CrossEntropyLoss", {"reduction": "none"}, torch.randn(3, 4, 5), torch.randint(0, 4, (3, 5))),
        ("CrossEntropyLoss", {}, x, torch.softmax(torch.randn(6, 4), 1)),
        ("NLLLoss", {}, torch.log_softmax(x, 1), t),
        ("NLLLoss", {"weight": w, "reduction": "sum"}, torch.log_softmax(x, 1), t),
        ("MSELoss", {}, x, torch.randn(6, 4)),
        ("MSELoss", {"reduction": "none"}, x, torch.randn(6, 4)),
        ("L1Loss", {"reduction": "sum"}, x, torch.randn(6, 4)),
        ("BCELoss", {}, p, y),
        ("BCELoss", {"weight": torch.rand(4)}, p, y),
        ("BCEWithLogitsLoss", {}, x, y),
        ("BCEWithLogitsLoss", {"pos_weight": torch.rand(4) + 0.5, "reduction": "sum"}, x, y),
        ("SmoothL1Loss", {"beta": 0.5}, x, torch.randn(6, 4)),
        ("HuberLoss", {"delta": 0.7, "reduction": "sum"}, x, torch.randn(6, 4)),
        ("KLDivLoss", {"reduction": "batchmean"}, torch.log_softmax(x, 1), torch.softmax(torch.randn(6, 4), 1)),
    ]


@pytest.mark.parametrize("i", range(17))
def test_losses(i):
    name, kw, inp, tgt = _loss_cases()[i]
    tmod = getattr(tnn, name)(**kw)
    pmod = getattr(nn, name)(**{k: tp_in(v, False) if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
    assert list(pmod.state_dict()) == list(tmod.state_dict())
    same_repr(repr(pmod), repr(tmod))

    def call(m, a):
        return m(a, tp_in(tgt, False) if isinstance(m, nn.Module) else tgt)
    compare(tmod, pmod, inp, call=call)


# ---------------------------------------------------------------------------------------------
# Module API
# ---------------------------------------------------------------------------------------------
def _net(m):
    class Net(m.Module):
        def __init__(self):
            super().__init__()
            self.features = m.Sequential(m.Conv2d(3, 4, 3), m.BatchNorm2d(4), m.ReLU(), m.MaxPool2d(2))
            self.blocks = m.ModuleList([m.Linear(16, 16), m.Linear(16, 16)])
            self.heads = m.ModuleDict({"cls": m.Linear(16, 5), "reg": m.Linear(16, 1)})
            self.scale = m.Parameter(torch.ones(1) if m is tnn else tp.ones(1))
            self.register_buffer("steps", torch.zeros(()) if m is tnn else tp.zeros(()))
            self.register_buffer("cache", torch.zeros(2) if m is tnn else tp.zeros(2), persistent=False)

        def forward(self, x):
            x = self.features(x).flatten(1)
            for b in self.blocks:
                x = b(x).relu()
            return self.heads["cls"](x) * self.scale, self.heads["reg"](x)
    return Net()


def test_module_traversal_matches_torch():
    tnet, pnet = _net(tnn), _net(nn)
    assert [n for n, _ in pnet.named_parameters()] == [n for n, _ in tnet.named_parameters()]
    assert [n for n, _ in pnet.named_buffers()] == [n for n, _ in tnet.named_buffers()]
    assert [n for n, _ in pnet.named_modules()] == [n for n, _ in tnet.named_modules()]
    assert [n for n, _ in pnet.named_children()] == [n for n, _ in tnet.named_children()]
    assert list(pnet.state_dict()) == list(tnet.state_dict())
    assert "cache" not in pnet.state_dict()
    assert len(list(pnet.parameters(recurse=False))) == 1
    assert all(isinstance(p, nn.Parameter) for p in pnet.parameters())
    same_repr(repr(pnet), repr(tnet))
    sync(tnet, pnet)
    x = torch.randn(2, 3, 6, 6)
    compare(tnet, pnet, x, rtol=1e-5, atol=1e-5)
    assert pnet.get_submodule("heads.cls") is pnet.heads["cls"]
    assert pnet.get_parameter("blocks.1.bias") is pnet.blocks[1].bias
    seen = []
    pnet.apply(lambda mm: seen.append(type(mm).__name__))
    assert seen[-1] == "Net" and seen[0] == "Conv2d"


def test_state_dict_round_trip_both_ways():
    tnet, pnet = _net(tnn), _net(nn)
    for p in pnet.parameters():
        nn.init.normal_(p)
    tnet.load_state_dict(tp_to_torch_sd(pnet.state_dict()))
    pnet2 = _net(nn)
    pnet2.load_state_dict(tnet.state_dict())
    for (k, a), (k2, b) in zip(pnet.state_dict().items(), pnet2.state_dict().items()):
        assert k == k2
        assert_close(a, b, exact=True, msg=k)
    # values are detached and share storage; keep_vars returns the objects
    sd = pnet.state_dict()
    assert not sd["blocks.0.weight"].requires_grad
    assert sd["blocks.0.weight"].data_ptr() == pnet.blocks[0].weight.data_ptr()
    assert pnet.state_dict(keep_vars=True)["blocks.0.weight"] is pnet.blocks[0].weight
    # load copies in place: Parameter objects are kept
    w = pnet2.blocks[0].weight
    pnet2.load_state_dict(pnet.state_dict())
    assert pnet2.blocks[0].weight is w


def test_load_state_dict_errors():
    m = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    sd = m.state_dict()
    bad = dict(sd)
    del bad["1.bias"]
    bad["extra.weight"] = tp.zeros(1)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "1.bias"') as ei:
        m.load_state_dict(bad)
    assert 'Unexpected key(s) in state_dict: "extra.weight"' in str(ei.value)
    r = m.load_state_dict(bad, strict=False)
    assert r.missing_keys == ["1.bias"] and r.unexpected_keys == ["extra.weight"]
    shaped = dict(sd)
    shaped["0.weight"] = tp.zeros(5, 3)
    with pytest.raises(RuntimeError, match=r"size mismatch for 0.weight: copying a param with shape \[5, 3\]"):
        m.load_state_dict(shaped, strict=False)
    with pytest.raises(TypeError):
        m.load_state_dict([1, 2])
    assert str(m.load_state_dict(sd)) == "<All keys matched successfully>"
    # assign=True replaces the parameters
    new = {k: tp.randn(*v.shape) for k, v in sd.items()}
    m.load_state_dict(new, assign=True)
    assert m[0].weight.torch().data_ptr() == new["0.weight"].torch().data_ptr()
    assert isinstance(m[0].weight, nn.Parameter) and m[0].weight.requires_grad


def test_tied_weights_counted_once():
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, idx):
            return self.head(self.emb(idx))
    m = Tied()
    assert [n for n, _ in m.named_parameters()] == ["emb.weight"]
    assert sum(p.numel() for p in m.parameters()) == 40
    assert list(m.state_dict()) == ["emb.weight", "head.weight"]  # like torch: both keys
    assert len(list(m.named_parameters(remove_duplicate=False))) == 2
    m(tp.tensor([[1, 2, 3]])).sum().backward()
    assert m.emb.weight.grad is m.head.weight.grad
    # an optimizer over parameters() updates the shared weight once
    opt = tp.optim.SGD(m.parameters(), lr=0.1)
    before = m.emb.weight.torch().clone()
    opt.step()
    assert_close(m.head.weight.torch(), before - 0.1 * m.emb.weight.grad.torch())


def test_setattr_registration_rules():
    m = nn.Linear(2, 3)
    with pytest.raises(TypeError, match="parameter 'weight'"):
        m.weight = tp.zeros(3, 2)
    m.weight = None
    assert "weight" in m._parameters and m.weight is None
    m.weight = nn.Parameter(tp.zeros(3, 2))
    m.plain = tp.zeros(1)  # plain attribute, not a buffer
    assert "plain" not in dict(m.named_buffers())
    m.buf = nn.Buffer(tp.ones(2))
    assert "buf" in m.state_dict()
    del m.buf
    assert "buf" not in m.state_dict()

    class Bad(nn.Module):
        def __init__(self):
            self.w = nn.Parameter(tp.zeros(1))
    with pytest.raises(AttributeError, match="before Module.__init__"):
        Bad()
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        m.nope
    with pytest.raises(KeyError, match="contain"):
        m.register_buffer("a.b", tp.zeros(1))
    with pytest.raises(ValueError, match="non-leaf"):
        m.register_parameter("x", _nonleaf_param())


def _nonleaf_param():
    p = nn.Parameter(tp.zeros(2))
    q = p * 2
    q.__class__ = nn.Parameter
    return q


def test_parameter_basics():
    t = tp.randn(3)
    p = nn.Parameter(t)
    assert p.requires_grad and p.is_leaf and isinstance(p, tp.Tensor)
    assert p.data_ptr() == t.data_ptr()  # no copy
    assert repr(p).startswith("Parameter containing:\ntensor(") and "requires_grad=True" in repr(p)
    q = nn.Parameter(tp.ones(2), requires_grad=False)
    assert not q.requires_grad
    assert type(p * 2) is tp.Tensor
    c = copy.deepcopy(p)
    assert isinstance(c, nn.Parameter) and c.requires_grad and c.data_ptr() != p.data_ptr()
    assert nn.Parameter().shape == (0,)


def test_to_keeps_parameter_objects():
    m = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    params = list(m.parameters())
    opt = tp.optim.SGD(m.parameters(), lr=0.1)
    m(tp.randn(5, 3)).sum().backward()
    r = m.double()
    assert r is m
    assert [id(p) for p in m.parameters()] == [id(p) for p in params]
    assert all(p.dtype == tp.float64 for p in m.parameters())
    assert all(p.grad.dtype == tp.float64 for p in m.parameters())
    assert m[1].running_mean.dtype == tp.float64
    assert m[1].num_batches_tracked.dtype == tp.int64  # integer buffers are not cast
    opt.step()
    m.to(tp.float32)
    assert m[0].weight.dtype == tp.float32
    m.half().float()
    m.to("cpu")
    with pytest.raises(TypeError, match="floating point"):
        m.to(tp.int32)
    out = m(tp.randn(5, 3))
    assert out.dtype == tp.float32


def test_zero_grad_and_requires_grad():
    m = nn.Linear(3, 2)
    m(tp.randn(4, 3)).sum().backward()
    m.zero_grad(set_to_none=False)
    assert m.weight.grad is not None and not m.weight.grad.torch().any()
    m.zero_grad()
    assert m.weight.grad is None
    m.requires_grad_(False)
    assert not any(p.requires_grad for p in m.parameters())
    assert not m(tp.randn(4, 3)).requires_grad


def test_hooks():
    m = nn.Linear(3, 3)
    calls = []
    h1 = m.register_forward_pre_hook(lambda mod, args: (args[0] * 0,))
    h2 = m.register_forward_hook(lambda mod, args, out: calls.append(out.shape) or out + 1)
    y = m(tp.randn(2, 3))
    assert calls == [(2, 3)]
    assert_close(y, m.bias.detach().expand(2, 3) + 1)
    h1.remove()
    h2.remove()
    x = tp.randn(2, 3)
    assert_close(m(x), tp.nn.functional.linear(x, m.weight, m.bias))


def test_containers():
    s = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert len(s) == 3 and isinstance(s[1], nn.ReLU) and isinstance(s[-1], nn.Linear)
    assert isinstance(s[:2], nn.Sequential) and len(s[:2]) == 2
    s.append(nn.Sigmoid())
    assert list(s._modules) == ["0", "1", "2", "3"]
    del s[1]
    assert list(s._modules) == ["0", "1", "2"] and isinstance(s[1], nn.Linear)
    with pytest.raises(IndexError):
        s[5]
    from collections import OrderedDict
    named = nn.Sequential(OrderedDict(fc=nn.Linear(2, 2), act=nn.Tanh()))
    assert list(named.state_dict()) == ["fc.weight", "fc.bias"]
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    ml.append(nn.ReLU())
    tml = tnn.ModuleList([tnn.Linear(2, 2) for _ in range(3)] + [tnn.ReLU()])
    same_repr(repr(ml), repr(tml))
    assert len(ml) == 4 and len(ml[1:]) == 3
    md = nn.ModuleDict({"a": nn.ReLU(), "b": nn.Linear(1, 1)})
    assert "a" in md and list(md.keys()) == ["a", "b"] and len(md) == 2
    assert repr(md) == repr(tnn.ModuleDict({"a": tnn.ReLU(), "b": tnn.Linear(1, 1)}))
    pl = nn.ParameterList([tp.randn(2), nn.Parameter(tp.randn(3))])
    assert all(isinstance(p, nn.Parameter) for p in pl) and len(list(pl.parameters())) == 2
    pd = nn.ParameterDict({"w": tp.randn(2)})
    assert list(pd.state_dict()) == ["w"]


def test_deepcopy_module():
    m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    c = copy.deepcopy(m)
    assert c[0].weight is not m[0].weight
    assert_close(c[0].weight, m[0].weight, exact=True)
    with tp.no_grad():
        c[0].weight.mul_(0)
    assert m[0].weight.torch().any()


def test_repr_matches_torch():
    def build(m):
        return m.Sequential(m.Conv2d(3, 8, 3, padding=1, bias=False), m.BatchNorm2d(8), m.ReLU(inplace=True),
                            m.MaxPool2d(2), m.Dropout(0.1), m.AdaptiveAvgPool2d((1, 1)), m.Flatten(),
                            m.Linear(8, 4), m.LayerNorm(4), m.GELU(), m.Softmax(dim=-1), m.Embedding(5, 3),
                            m.AvgPool2d(3, stride=1), m.GroupNorm(2, 4), m.Conv1d(2, 4, 3, stride=2, dilation=2,
                                                                                   groups=2))
    same_repr(repr(build(nn)), repr(build(tnn)))


# ---------------------------------------------------------------------------------------------
# nn.init
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fn,kw", [("uniform_", dict(a=-2, b=3)), ("normal_", dict(mean=1, std=2)),
                                   ("xavier_uniform_", dict(gain=1.5)), ("xavier_normal_", {}),
                                   ("kaiming_uniform_", dict(a=math.sqrt(5))),
                                   ("kaiming_uniform_", dict(mode="fan_out", nonlinearity="relu")),
                                   ("kaiming_normal_", dict(nonlinearity="relu")), ("constant_", dict(val=0.3)),
                                   ("ones_", {}), ("zeros_", {}), ("eye_", {})])
def test_init_matches_torch(fn, kw):
    shape = (6, 4) if fn == "eye_" else (6, 4, 3)
    t = torch.empty(shape)
    p = nn.Parameter(tp.empty(*shape))
    torch.manual_seed(1)
    getattr(torch.nn.init, fn)(t, **kw)
    tp.manual_seed(1)
    r = getattr(nn.init, fn)(p, **kw)
    assert r is p and p.requires_grad and p.grad_fn is None
    assert_close(p, t, exact=True)


def test_init_misc():
    for nl, arg in [("relu", None), ("tanh", None), ("leaky_relu", 0.2), ("linear", None), ("selu", None)]:
        assert nn.init.calculate_gain(nl, arg) == torch.nn.init.calculate_gain(nl, arg)
    with pytest.raises(ValueError):
        nn.init.calculate_gain("nope")
    t = tp.empty(20000)
    nn.init.trunc_normal_(t, mean=0.5, std=1.0, a=-1.0, b=1.5)
    d = t.torch()
    assert d.min() >= -1.0 and d.max() <= 1.5
    ref = torch.empty(200000)
    torch.nn.init.trunc_normal_(ref, 0.5, 1.0, -1.0, 1.5)
    assert abs(d.mean() - ref.mean()) < 0.02 and abs(d.std() - ref.std()) < 0.02
    with pytest.raises(ValueError, match="fewer than 2"):
        nn.init.xavier_uniform_(tp.empty(3))
    o = tp.empty(4, 6)
    nn.init.orthogonal_(o)
    assert_close(o.torch() @ o.torch().T, torch.eye(4), atol=1e-5, rtol=0)


def test_clip_grad_norm_matches_torch():
    tm, pm = tnn.Linear(4, 3), nn.Linear(4, 3)
    sync(tm, pm)
    x = torch.randn(5, 4) * 10
    tm(x).pow(2).sum().backward()
    pm(tp.from_torch(x)).pow(2).sum().backward()
    tn = torch.nn.utils.clip_grad_norm_(tm.parameters(), 1.0)
    pn = nn.utils.clip_grad_norm_(pm.parameters(), 1.0)
    assert_close(pn, tn, rtol=1e-6, atol=0)
    for (n, a), b in zip(pm.named_parameters(), tm.parameters()):
        assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-7, msg=n)


# ---------------------------------------------------------------------------------------------
# CUDA (run with -m gpu on a GPU machine)
# ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_training_matches_cpu(tmp_path):
    if not tp.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    cpu = nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(0.0), nn.Linear(16, 3))
    gpu = copy.deepcopy(cpu)
    params = list(gpu.parameters())
    gpu.cuda()
    assert [id(p) for p in gpu.parameters()] == [id(p) for p in params]
    assert all(p.is_cuda for p in gpu.parameters())
    ocpu = tp.optim.AdamW(cpu.parameters(), lr=1e-2)
    ogpu = tp.optim.AdamW(gpu.parameters(), lr=1e-2)
    x, y = tp.randn(32, 6), tp.randint(0, 3, (32,))
    for _ in range(3):
        for m, o, xx, yy in ((cpu, ocpu, x, y), (gpu, ogpu, x.cuda(), y.cuda())):
            o.zero_grad()
            nn.functional.cross_entropy(m(xx), yy).backward()
            nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
    for (n, a), b in zip(gpu.named_parameters(), cpu.parameters()):
        assert a.is_cuda
        assert_close(a.cpu(), b, rtol=1e-4, atol=1e-5, msg=n)
    tp.save({"model": gpu.state_dict(), "opt": ogpu.state_dict()}, tmp_path / "gpu.tp")
    ck = tp.load(tmp_path / "gpu.tp", map_location="cpu")
    assert not ck["model"]["0.weight"].is_cuda
    cpu.load_state_dict(ck["model"])
    ocpu.load_state_dict(ck["opt"])
    mha = nn.MultiheadAttention(8, 2, batch_first=True).cuda()
    q = tp.randn(2, 5, 8).cuda()
    out, w = mha(q, q, q, key_padding_mask=tp.zeros(2, 5, dtype=tp.bool).cuda())
    assert out.is_cuda and w.shape == (2, 5, 5)
    dl = tp.utils.data.DataLoader(tp.utils.data.TensorDataset(x.cuda(), y.cuda()), batch_size=8, shuffle=True,
                                  seed=0)
    xb, yb = next(iter(dl))
    assert xb.is_cuda and xb.shape == (8, 6)


def test_dropout2d_of_a_2d_input_warns_and_drops_elements_as_pytorch():
    import warnings
    x = tp.from_torch(torch.rand(64, 32) + 0.5)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        y = tp.nn.functional.dropout2d(x, 0.5, True).torch()
    assert any("2-D input" in str(m.message) for m in w)
    kept = y != 0
    assert 0.35 < kept.float().mean().item() < 0.65                       # element by element
    torch.testing.assert_close(y[kept], x.torch()[kept] * 2)
    assert tp.backends.cudnn is torch.backends.cudnn


def test_onnx_name_imports_and_export_raises_clearly():
    import tensorplay.onnx
    with pytest.raises(NotImplementedError, match="tp.onnx.export"):
        tensorplay.onnx.export(tp.nn.Linear(2, 2), (tp.randn(1, 2),), "m.onnx")


@pytest.mark.parametrize("batch_first", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_compiled_transformer_training_step_equals_eager(batch_first):
    """A post-norm encoder-decoder step (nn.Transformer, dropout off) compiled by Stax, strict_native:
    loss and every gradient equal eager's."""
    tp.manual_seed(0)
    m = nn.Transformer(d_model=16, nhead=2, num_encoder_layers=1, num_decoder_layers=1, dim_feedforward=32,
                       dropout=0.0, batch_first=batch_first)
    src, tgt = (tp.randn(3, 7, 16), tp.randn(3, 5, 16)) if batch_first else (tp.randn(7, 3, 16), tp.randn(5, 3, 16))
    mask = nn.Transformer.generate_square_subsequent_mask(5)

    def loss(src, tgt):
        return m(src, tgt, tgt_mask=mask, tgt_is_causal=True).square().mean()

    def step(fn):
        for p in m.parameters():
            p.grad = None
        out = fn(src, tgt)
        out.backward()
        return out.item(), [p.grad.torch().clone() for p in m.parameters()]
    ref = step(loss)
    cf = tp.compile(loss, strict_native=True)
    step(cf)
    got = step(cf)
    assert got[0] == pytest.approx(ref[0], rel=1e-5)
    for a, b in zip(got[1], ref[1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
