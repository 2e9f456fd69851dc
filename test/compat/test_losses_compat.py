"""The margin, embedding, likelihood and CTC losses of tp.nn.functional and their modules against
torch.nn.functional: forward, meta, gradients vs torch.autograd, gradcheck in float64, every
reduction, weights, non-contiguous inputs, size 0, bad arguments; a compiled training step."""
import pytest
import torch
import torch.nn.functional as TF

import tensorplay as tp
import tensorplay.nn.functional as F
from harness import check_op, to_tp
from tensorplay.testing import assert_close

REDS = ["none", "mean", "sum"]
g = torch.Generator().manual_seed(0)


def rn(*s, dtype=torch.float64):
    return torch.randn(*s, generator=g, dtype=dtype)


def sign_target(*s):
    return torch.randint(0, 2, s, generator=g).double() * 2 - 1


def _check(f, tf, *inputs, **kw):
    kw.setdefault("exact", False)
    kw.setdefault("rtol", 1e-6)
    kw.setdefault("atol", 1e-7)
    return check_op(f, tf, *inputs, **kw)


@pytest.mark.parametrize("red", REDS)
def test_margin_ranking(red):
    a, b, y = rn(7), rn(7), sign_target(7)
    _check(lambda a, b, y: F.margin_ranking_loss(a, b, y, 0.3, reduction=red),
           lambda a, b, y: TF.margin_ranking_loss(a, b, y, 0.3, reduction=red), a, b, y)


@pytest.mark.parametrize("red", REDS)
def test_hinge_embedding(red):
    x, y = rn(4, 5), sign_target(4, 5)
    _check(lambda x, y: F.hinge_embedding_loss(x, y, 0.7, reduction=red),
           lambda x, y: TF.hinge_embedding_loss(x, y, 0.7, reduction=red), x, y)


@pytest.mark.parametrize("red", REDS)
def test_soft_margin(red):
    x, y = rn(5, 3).t(), sign_target(3, 5)        # transposed input; torch has no target gradient here
    _check(lambda x: F.soft_margin_loss(x, to_tp(y), reduction=red), lambda x: TF.soft_margin_loss(x, y, reduction=red),
           x)


@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("p", [1, 2])
def test_multi_margin(red, p):
    x, t, w = rn(5, 4), torch.randint(0, 4, (5,), generator=g), rn(4).abs() + 0.1
    _check(lambda x, t: F.multi_margin_loss(x, t, p, 0.8, reduction=red),
           lambda x, t: TF.multi_margin_loss(x, t, p, 0.8, reduction=red), x, t)
    _check(lambda x, t: F.multi_margin_loss(x, t, p, 1.0, to_tp(w), reduction=red),
           lambda x, t: TF.multi_margin_loss(x, t, p, 1.0, w, reduction=red), x, t)
    _check(lambda x, t: F.multi_margin_loss(x, t, p), lambda x, t: TF.multi_margin_loss(x, t, p), rn(4), t[:1])


@pytest.mark.parametrize("red", REDS)
def test_multilabel_margin(red):
    x = rn(3, 5)
    t = torch.tensor([[3, 0, -1, 1, 2], [1, 2, 4, 0, 3], [-1, 2, 1, 0, 0]])
    _check(lambda x, t: F.multilabel_margin_loss(x, t, reduction=red),
           lambda x, t: TF.multilabel_margin_loss(x, t, reduction=red), x, t)
    _check(lambda x, t: F.multilabel_margin_loss(x, t), lambda x, t: TF.multilabel_margin_loss(x, t), x[0], t[0])


@pytest.mark.parametrize("red", REDS)
def test_multilabel_soft_margin(red):
    x, t, w = rn(4, 3), torch.randint(0, 2, (4, 3), generator=g).double(), rn(3).abs()
    _check(lambda x, t, w: F.multilabel_soft_margin_loss(x, t, w, reduction=red),
           lambda x, t, w: TF.multilabel_soft_margin_loss(x, t, w, reduction=red), x, t, w)
    _check(lambda x, t: F.multilabel_soft_margin_loss(x, t, reduction=red),
           lambda x, t: TF.multilabel_soft_margin_loss(x, t, reduction=red), x, t)


@pytest.mark.parametrize("red", REDS)
def test_cosine_embedding(red):
    a, b, y = rn(4, 6), rn(4, 6), sign_target(4)
    _check(lambda a, b, y: F.cosine_embedding_loss(a, b, y, 0.2, reduction=red),
           lambda a, b, y: TF.cosine_embedding_loss(a, b, y, 0.2, reduction=red), a, b, y, gradcheck=True)
    _check(lambda a, b, y: F.cosine_embedding_loss(a, b, y), lambda a, b, y: TF.cosine_embedding_loss(a, b, y),
           a[0], b[0], y[0])


@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("p,swap", [(2, False), (1, True), (3, False)])
def test_triplet_margin(red, p, swap):
    a, pos, neg = rn(3, 5), rn(3, 5), rn(3, 5)
    _check(lambda a, b, c: F.triplet_margin_loss(a, b, c, 0.5, p, swap=swap, reduction=red),
           lambda a, b, c: TF.triplet_margin_loss(a, b, c, 0.5, p, swap=swap, reduction=red), a, pos, neg)


def test_triplet_with_distance_and_pairwise():
    a, pos, neg = rn(3, 5), rn(3, 5), rn(3, 5)
    for red in REDS:
        _check(lambda a, b, c: F.triplet_margin_with_distance_loss(a, b, c, reduction=red, swap=True),
               lambda a, b, c: TF.triplet_margin_with_distance_loss(a, b, c, reduction=red, swap=True), a, pos, neg)
    cos = (lambda x, y: 1 - F.cosine_similarity(x, y)), (lambda x, y: 1 - TF.cosine_similarity(x, y))
    _check(lambda a, b, c: F.triplet_margin_with_distance_loss(a, b, c, distance_function=cos[0], margin=0.4),
           lambda a, b, c: TF.triplet_margin_with_distance_loss(a, b, c, distance_function=cos[1], margin=0.4),
           a, pos, neg)
    for p in (1.0, 2.0, float("inf")):
        _check(lambda x, y: F.pairwise_distance(x, y, p, keepdim=True),
               lambda x, y: TF.pairwise_distance(x, y, p, keepdim=True), a, pos[:1])      # broadcast
    _check(lambda x, y: F.pairwise_distance(x, y), lambda x, y: TF.pairwise_distance(x, y), a[0], pos[0])


@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("log_input,full", [(True, False), (False, True), (True, True)])
def test_poisson_nll(red, log_input, full):
    x = rn(4, 3) if log_input else rn(4, 3).abs() + 0.1
    t = torch.poisson(torch.full((4, 3), 2.0), generator=g).double()
    t[0, 0] = 0.0                             # Stirling's term is masked where t <= 1
    _check(lambda x: F.poisson_nll_loss(x, to_tp(t), log_input, full, reduction=red),
           lambda x: TF.poisson_nll_loss(x, t, log_input, full, reduction=red), x)
    t = torch.rand(4, 3, generator=g, dtype=torch.float64) * 3 + 1.2     # away from t = 1 for the target gradient
    _check(lambda x, t: F.poisson_nll_loss(x, t, log_input, full, reduction=red),
           lambda x, t: TF.poisson_nll_loss(x, t, log_input, full, reduction=red), x, t)


@pytest.mark.parametrize("red", REDS)
def test_gaussian_nll(red):
    x, t = rn(4, 3), rn(4, 3)
    var = rn(4, 3).abs() + 0.05
    var[0, 0] = 1e-8                          # clamped at eps: the gradient passes through the clamp
    _check(lambda x, t, v: F.gaussian_nll_loss(x, t, v, True, reduction=red),
           lambda x, t, v: TF.gaussian_nll_loss(x, t, v, True, reduction=red), x, t, var, gradcheck=False)
    v1 = rn(4).abs() + 0.1                    # homoscedastic: var one dim short
    _check(lambda x, t, v: F.gaussian_nll_loss(x, t, v, reduction=red),
           lambda x, t, v: TF.gaussian_nll_loss(x, t, v, reduction=red), x, t, v1)
    _check(lambda x, t, v: F.gaussian_nll_loss(x, t, v), lambda x, t, v: TF.gaussian_nll_loss(x, t, v),
           x, t, v1.unsqueeze(1))


@pytest.mark.parametrize("red", REDS)
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc(red, zero_infinity):
    lp = rn(6, 3, 5).log_softmax(2)
    targets = torch.tensor([[1, 2, 2], [3, 4, 0], [1, 1, 1]])
    il, tl = torch.tensor([6, 5, 2]), torch.tensor([3, 2, 3])    # the third sample is impossible: inf
    _check(lambda lp: F.ctc_loss(lp, to_tp(targets), il, tl, 0, red, zero_infinity),
           lambda lp: TF.ctc_loss(lp, targets, il, tl, 0, red, zero_infinity), lp, exact=True, gradcheck=False)
    # ATen's gradient is the one w.r.t. normalised log-probabilities: gradcheck through log_softmax
    logits = rn(4, 2, 3)
    t2 = torch.tensor([[1, 2], [2, 2]])
    _check(lambda x: F.ctc_loss(x.log_softmax(2), to_tp(t2), [4, 3], [2, 1], 0, red, zero_infinity),
           lambda x: TF.ctc_loss(x.log_softmax(2), t2, [4, 3], [2, 1], 0, red, zero_infinity), logits,
           gradcheck=True)


def test_ctc_concatenated_and_unbatched():
    lp = rn(6, 2, 4).log_softmax(2)
    tg = torch.tensor([1, 2, 3, 3, 1])
    _check(lambda lp: F.ctc_loss(lp, to_tp(tg), [6, 6], [2, 3]), lambda lp: TF.ctc_loss(lp, tg, [6, 6], [2, 3]), lp,
           exact=True, gradcheck=False)
    lp1 = rn(6, 4).log_softmax(1)
    _check(lambda lp: F.ctc_loss(lp, to_tp(tg[:3]), [6], [3], reduction="sum"),
           lambda lp: TF.ctc_loss(lp, tg[:3], torch.tensor(6), torch.tensor(3), reduction="sum"), lp1,
           gradcheck=False)


def test_size0_batches():
    x, y = torch.empty(0, 3, dtype=torch.float64), torch.empty(0, 3, dtype=torch.float64)
    for red in ("none", "sum", "mean"):
        check_op(lambda x: F.soft_margin_loss(x, to_tp(y), reduction=red),
                 lambda x: TF.soft_margin_loss(x, y, reduction=red), x, exact=False, gradcheck=False)
        if red == "mean":   # ATen returns uninitialised memory for an empty batch; tp the mean of nothing (nan)
            assert F.multi_margin_loss(to_tp(x), tp.zeros(0, dtype=tp.int64)).isnan().item()
            continue
        check_op(lambda x, y: F.multi_margin_loss(x, y, reduction=red),
                 lambda x, y: TF.multi_margin_loss(x, y, reduction=red), x, torch.empty(0, dtype=torch.long),
                 exact=False, gradcheck=False)


MODULES = [
    ("MarginRankingLoss", {"margin": 0.2}, 3), ("HingeEmbeddingLoss", {"margin": 0.5}, 2),
    ("CosineEmbeddingLoss", {"margin": 0.1}, 3), ("SoftMarginLoss", {}, 2), ("MultiMarginLoss", {"p": 2}, 2),
    ("MultiLabelMarginLoss", {}, 2), ("MultiLabelSoftMarginLoss", {}, 2), ("TripletMarginLoss", {"swap": True}, 3),
    ("TripletMarginWithDistanceLoss", {"margin": 0.7}, 3), ("PoissonNLLLoss", {"full": True}, 2),
    ("GaussianNLLLoss", {"full": True}, 3), ("PairwiseDistance", {"p": 1.0}, 2), ("CosineSimilarity", {"dim": 1}, 2),
]


def _module_inputs(name):
    x = rn(4, 5)
    return {
        "MarginRankingLoss": (rn(4), rn(4), sign_target(4)), "HingeEmbeddingLoss": (x, sign_target(4, 5)),
        "CosineEmbeddingLoss": (x, rn(4, 5), sign_target(4)), "SoftMarginLoss": (x, sign_target(4, 5)),
        "MultiMarginLoss": (x, torch.tensor([0, 4, 2, 2])),
        "MultiLabelMarginLoss": (x, torch.tensor([[0, 1, -1, 0, 0]] * 4)),
        "MultiLabelSoftMarginLoss": (x, (rn(4, 5) > 0).double()),
        "PoissonNLLLoss": (x, torch.poisson(torch.full((4, 5), 3.0), generator=g).double()),
        "GaussianNLLLoss": (x, rn(4, 5), rn(4, 5).abs() + 0.1),
    }.get(name, (x, rn(4, 5), rn(4, 5)))


@pytest.mark.parametrize("name,kw,n", MODULES, ids=[m[0] for m in MODULES])
def test_modules(name, kw, n):
    ins = _module_inputs(name)[:n]
    m, tm = getattr(tp.nn, name)(**kw), getattr(torch.nn, name)(**kw)
    assert_close(m(*[to_tp(i) for i in ins]), tm(*ins), exact=False, rtol=1e-9, atol=1e-12)
    assert m.state_dict().keys() == tm.state_dict().keys()
    assert getattr(m, "reduction", None) == getattr(tm, "reduction", None)


def test_ctc_module_and_weighted_state_dict():
    w = rn(5).abs()
    m, tm = tp.nn.MultiMarginLoss(weight=to_tp(w)), torch.nn.MultiMarginLoss(weight=w)
    assert m.state_dict().keys() == tm.state_dict().keys() == {"weight"}
    m2 = tp.nn.MultiMarginLoss(weight=to_tp(rn(5)))
    m2.load_state_dict(m.state_dict())
    assert_close(m2.weight, w)
    lp = rn(5, 2, 4).log_softmax(2)
    t = torch.tensor([[1, 2], [3, 1]])
    assert_close(tp.nn.CTCLoss(blank=0)(to_tp(lp), to_tp(t), [5, 4], [2, 2]),
                 torch.nn.CTCLoss(blank=0)(lp, t, [5, 4], [2, 2]))


@pytest.mark.slow
def test_compiled_training_step():
    x, y = rn(6, 4).float(), torch.tensor([0, 3, 1, 1, 2, 0])

    def step(x, w):
        h = x @ w
        return F.multi_margin_loss(h, to_tp(y)) + F.soft_margin_loss(h, h.detach().sign()) + \
            F.cosine_embedding_loss(h, x, to_tp(torch.ones(6)))
    w0 = rn(4, 4).float()
    cf = tp.compile(step, strict_native=True)   # every op of these losses lowers natively
    cf(to_tp(x), to_tp(w0))
    wt = to_tp(w0, requires_grad=True)
    loss = cf(to_tp(x), wt)
    loss.backward()
    tw = w0.clone().requires_grad_()
    h = x @ tw
    ref = TF.multi_margin_loss(h, y) + TF.soft_margin_loss(h, h.detach().sign()) + \
        TF.cosine_embedding_loss(h, x, torch.ones(6))
    ref.backward()
    assert_close(loss, ref, exact=False, rtol=1e-5, atol=1e-6)
    assert_close(wt.grad, tw.grad, exact=False, rtol=1e-4, atol=1e-5)


def test_bad_input():
    x = tp.randn(3, 4)
    with pytest.raises(ValueError, match="tp.multi_margin_loss"):
        F.multi_margin_loss(x, tp.tensor([0, 1, 2]), p=3)
    with pytest.raises(IndexError, match="tp.multi_margin_loss"):
        F.multi_margin_loss(x, tp.tensor([0, 1, 7]))
    with pytest.raises(RuntimeError, match="tp.multilabel_margin_loss"):
        F.multilabel_margin_loss(x, tp.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="tp.soft_margin_loss"):
        F.soft_margin_loss(x, tp.randn(4, 3))
    with pytest.raises(ValueError, match="tp.gaussian_nll_loss"):
        F.gaussian_nll_loss(x, x, -tp.ones(3, 4))
    with pytest.raises(ValueError, match="tp.gaussian_nll_loss"):
        F.gaussian_nll_loss(x, x, tp.ones(2, 2))
    with pytest.raises(ValueError, match="tp.triplet_margin_loss"):
        F.triplet_margin_loss(x, x, x, margin=0.0)
    with pytest.raises(RuntimeError, match="tp.margin_ranking_loss"):
        F.margin_ranking_loss(x, x, tp.ones(3))
    with pytest.raises(ValueError, match="tp.hinge_embedding_loss"):
        F.hinge_embedding_loss(x, x, reduction="avg")
    with pytest.raises(RuntimeError, match="tp._ctc_loss"):
        F.ctc_loss(tp.randn(5, 2, 4).log_softmax(2), tp.tensor([[1, 2], [1, 1]]), [9, 5], [2, 2])
