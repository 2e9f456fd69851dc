"""tp.utils.data (datasets, samplers, DataLoader, default_collate) and tp.save / tp.load."""
import io
import pickle
from collections import OrderedDict, namedtuple

import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.testing import assert_close
from tensorplay.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset, IterableDataset, RandomSampler,
                                   SequentialSampler, Subset, TensorDataset, default_collate, random_split)


# ---------------------------------------------------------------------------------------------
# datasets
# ---------------------------------------------------------------------------------------------
def test_tensor_dataset():
    x, y = tp.randn(10, 3), tp.arange(10)
    ds = TensorDataset(x, y)
    assert len(ds) == 10
    a, b = ds[4]
    assert_close(a, x[4]) and b.item() == 4
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        TensorDataset(tp.randn(10, 3), tp.randn(9))
    with pytest.raises(ValueError):
        TensorDataset()


def test_subset_concat_split():
    ds = TensorDataset(tp.arange(10))
    sub = Subset(ds, [7, 2, 5])
    assert len(sub) == 3 and sub[0][0].item() == 7
    cat = ds + TensorDataset(tp.arange(100, 105))
    assert isinstance(cat, ConcatDataset) and len(cat) == 15
    assert cat[12][0].item() == 102 and cat[-1][0].item() == 104
    with pytest.raises(IndexError):
        cat[15]
    parts = random_split(ds, [6, 4], generator=torch.Generator().manual_seed(0))
    got = sorted(p[0].item() for part in parts for p in (part[i] for i in range(len(part))))
    assert [len(p) for p in parts] == [6, 4] and got == list(range(10))
    assert [len(p) for p in random_split(ds, [0.5, 0.5])] == [5, 5]
    with pytest.raises(ValueError, match="sum of input lengths"):
        random_split(ds, [3, 3])


# ---------------------------------------------------------------------------------------------
# DataLoader
# ---------------------------------------------------------------------------------------------
def test_batching_and_drop_last():
    x, y = tp.randn(10, 3), tp.arange(10)
    dl = DataLoader(TensorDataset(x, y), batch_size=4)
    batches = list(dl)
    assert len(dl) == 3 and [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert_close(batches[1][0], x[4:8], exact=True)
    assert batches[2][1].tolist() == [8, 9]
    dl = DataLoader(TensorDataset(x, y), batch_size=4, drop_last=True)
    assert len(dl) == 2 and [b[0].shape[0] for b in dl] == [4, 4]
    assert isinstance(batches[0][0], tp.Tensor)


def test_matches_torch_dataloader_without_shuffle():
    x = torch.randn(11, 2)
    y = torch.arange(11)
    tl = list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=3))
    pl = list(DataLoader(TensorDataset(tp.from_torch(x), tp.from_torch(y)), batch_size=3))
    assert len(tl) == len(pl)
    for (a, b), (c, d) in zip(pl, tl):
        assert_close(a, c, exact=True)
        assert_close(b, d, exact=True)


def test_shuffle_is_a_reproducible_permutation():
    ds = TensorDataset(tp.arange(20))

    def order(dl):
        return [int(v) for b in dl for v in b[0].tolist()]

    dl = DataLoader(ds, batch_size=6, shuffle=True, seed=123)
    e1, e2 = order(dl), order(dl)
    assert sorted(e1) == list(range(20)) and sorted(e2) == list(range(20))
    assert e1 != e2 and e1 != list(range(20))            # a new permutation each epoch
    assert order(DataLoader(ds, batch_size=6, shuffle=True, seed=123)) == e1   # reproducible
    assert order(DataLoader(ds, batch_size=6, shuffle=True, seed=124)) != e1
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert order(DataLoader(ds, batch_size=6, shuffle=True, generator=g1)) == \
        order(DataLoader(ds, batch_size=6, shuffle=True, generator=g2))
    tp.manual_seed(9)
    a = order(DataLoader(ds, batch_size=6, shuffle=True))
    tp.manual_seed(9)
    b = order(DataLoader(ds, batch_size=6, shuffle=True))
    assert a == b


def test_default_collate_structures():
    class Items(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return {"x": tp.full((2,), float(i)), "n": i, "f": i / 2, "s": f"item{i}", "np": np.ones(3) * i,
                    "pair": (tp.tensor(i), [i, i + 1]), "b": i % 2 == 0}
    b = next(iter(DataLoader(Items(), batch_size=3)))
    assert b["x"].shape == (3, 2) and b["x"].dtype == tp.float32
    assert b["n"].dtype == tp.int64 and b["n"].tolist() == [0, 1, 2]
    assert b["f"].dtype == tp.float64
    assert b["s"] == ["item0", "item1", "item2"]
    assert isinstance(b["np"], tp.Tensor) and b["np"].shape == (3, 3)
    assert isinstance(b["pair"], list) and b["pair"][0].tolist() == [0, 1, 2]
    assert [t.tolist() for t in b["pair"][1]] == [[0, 1, 2], [1, 2, 3]]
    assert b["b"].dtype == tp.bool
    P = namedtuple("P", "a b")
    c = default_collate([P(tp.ones(2), 1), P(tp.zeros(2), 2)])
    assert isinstance(c, P) and c.a.shape == (2, 2) and c.b.tolist() == [1, 2]
    with pytest.raises(RuntimeError, match="equal size"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError):
        default_collate([object(), object()])


def test_custom_collate_sampler_and_no_batching():
    ds = TensorDataset(tp.arange(6))
    dl = DataLoader(ds, batch_size=2, collate_fn=lambda items: [int(i[0]) for i in items])
    assert list(dl) == [[0, 1], [2, 3], [4, 5]]
    dl = DataLoader(ds, batch_size=None)
    items = list(dl)
    assert len(dl) == 6 and items[3][0].item() == 3
    bs = BatchSampler(SequentialSampler(range(7)), 3, drop_last=False)
    assert list(bs) == [[0, 1, 2], [3, 4, 5], [6]] and len(bs) == 3
    dl = DataLoader(ds, batch_sampler=[[5, 0], [1]])
    assert [b[0].tolist() for b in dl] == [[5, 0], [1]]
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, sampler=SequentialSampler(ds), shuffle=True)
    rs = RandomSampler(ds, replacement=True, num_samples=10, generator=torch.Generator().manual_seed(0))
    idx = list(rs)
    assert len(idx) == 10 and all(0 <= i < 6 for i in idx)


def test_iterable_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(tp.tensor([float(i)]) for i in range(7))
    out = list(DataLoader(Stream(), batch_size=3))
    assert [b.shape[0] for b in out] == [3, 3, 1]
    assert [b.shape[0] for b in DataLoader(Stream(), batch_size=3, drop_last=True)] == [3, 3]
    with pytest.raises(ValueError):
        DataLoader(Stream(), shuffle=True)


def test_loader_feeds_a_training_step():
    x, y = tp.randn(32, 4), tp.randint(0, 3, (32,))
    model = nn.Linear(4, 3)
    opt = tp.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True, seed=0):
        loss = nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert model.weight.grad is not None


# ---------------------------------------------------------------------------------------------
# save / load
# ---------------------------------------------------------------------------------------------
class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(7, 4)
        self.norm = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 7, bias=False)
        self.head.weight = self.emb.weight


def test_state_dict_round_trip_keeps_ties(tmp_path):
    m = Tied()
    path = tmp_path / "model.tp"
    tp.save(m.state_dict(), path)
    sd = tp.load(path)
    assert isinstance(sd, OrderedDict) and list(sd) == list(m.state_dict())
    for k, v in m.state_dict().items():
        assert_close(sd[k], v, exact=True, msg=k)
    assert sd["emb.weight"].data_ptr() == sd["head.weight"].data_ptr()   # tied tensors stay tied
    assert sd["norm.num_batches_tracked"].dtype == tp.int64
    m2 = Tied()
    m2.load_state_dict(sd)
    assert_close(m2.head.weight, m.emb.weight, exact=True)
    assert m2.head.weight is m2.emb.weight


def test_objects_dtypes_parameters_and_sharing():
    p = nn.Parameter(tp.randn(3, 2))
    frozen = nn.Parameter(tp.randn(2), requires_grad=False)
    t = tp.randn(4, 4)
    leaf = tp.randn(2).requires_grad_()
    obj = {
        "p": p, "frozen": frozen, "again": p, "view": t[1:, ::2], "t": t, "leaf": leaf,
        "dtypes": [tp.randn(3).half(), tp.randn(3).to(tp.bfloat16), tp.arange(5), tp.tensor([True, False]),
                   tp.randn(2).double(), tp.tensor(3.5)],
        "nested": ({"a": [1, 2.5, "s", None]}, (tp.zeros(0, 3),)),
        "meta": {"dtype": tp.float16, "size": torch.Size([2, 3]), "lr": 0.1},
        "torch": torch.ones(2),
    }
    buf = io.BytesIO()
    tp.save(obj, buf)
    buf.seek(0)
    r = tp.load(buf)
    assert isinstance(r["p"], nn.Parameter) and r["p"].requires_grad
    assert isinstance(r["frozen"], nn.Parameter) and not r["frozen"].requires_grad
    assert r["again"] is r["p"]
    assert r["leaf"].requires_grad and type(r["leaf"]) is tp.Tensor
    assert_close(r["view"], t[1:, ::2], exact=True)
    assert r["view"].stride() == t[1:, ::2].stride()
    r["t"].torch()[1, 0] = 100.0     # the view still shares the storage of t
    assert r["view"].torch()[0, 0].item() == 100.0
    for a, b in zip(r["dtypes"], obj["dtypes"]):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert_close(a, b, exact=True)
    assert r["nested"] == ({"a": [1, 2.5, "s", None]}, (r["nested"][1][0],))
    assert r["nested"][1][0].shape == (0, 3)
    assert r["meta"] == {"dtype": tp.float16, "size": torch.Size([2, 3]), "lr": 0.1}
    assert isinstance(r["torch"], torch.Tensor)


def test_optimizer_checkpoint_resume(tmp_path):
    m = nn.Linear(3, 2)
    opt = tp.optim.Adam(m.parameters(), lr=0.01)
    for _ in range(2):
        m(tp.randn(4, 3)).pow(2).sum().backward()
        opt.step()
    tp.save({"model": m.state_dict(), "opt": opt.state_dict(), "epoch": 2}, tmp_path / "ckpt.tp")
    ck = tp.load(tmp_path / "ckpt.tp")
    m2 = nn.Linear(3, 2)
    m2.load_state_dict(ck["model"])
    opt2 = tp.optim.Adam(m2.parameters(), lr=0.01)
    opt2.load_state_dict(ck["opt"])
    assert ck["epoch"] == 2 and list(ck["opt"]["state"]) == [0, 1]
    x = tp.randn(4, 3)
    for mm, oo in ((m, opt), (m2, opt2)):
        oo.zero_grad()
        mm(x).pow(2).sum().backward()
        oo.step()
    assert_close(m2.weight, m.weight, exact=True)


def test_safe_loading_and_torch_files(tmp_path):
    tp.save(nn.Linear(2, 2), tmp_path / "module.tp")
    with pytest.raises(pickle.UnpicklingError, match="weights_only=False"):
        tp.load(tmp_path / "module.tp")
    m = tp.load(tmp_path / "module.tp", weights_only=False)
    assert isinstance(m, nn.Linear) and isinstance(m.weight, nn.Parameter) and m.weight.requires_grad
    # the safe loader with the module's classes allowed (PyTorch's safe_globals), as word_language_model does
    with tp.serialization.safe_globals([nn.Linear]):
        ms = tp.load(tmp_path / "module.tp")
    assert_close(ms.weight, m.weight, exact=True) and isinstance(ms.weight, nn.Parameter)
    with pytest.raises(pickle.UnpicklingError):   # the allowlist is gone after the block
        tp.load(tmp_path / "module.tp")
    # a plain torch checkpoint loads as tp tensors (ties kept)
    lin = torch.nn.Linear(3, 3)
    torch.save({"w": lin.weight, "same": lin.weight, "sd": lin.state_dict()}, tmp_path / "torch.pt")
    r = tp.load(tmp_path / "torch.pt")
    assert isinstance(r["w"], nn.Parameter) and r["same"] is r["w"]
    assert isinstance(r["sd"]["bias"], tp.Tensor)
    tm = torch.nn.Linear(3, 3)
    pm = nn.Linear(3, 3)
    pm.load_state_dict(r["sd"])
    tm.load_state_dict({k: v.torch() for k, v in pm.state_dict().items()})
    assert torch.equal(tm.weight, lin.weight)
