"""tp.utils.data against torch.utils.data: lazy samplers with torch's draws (same indices for the same
seeds), WeightedRandomSampler, random_split by lengths or fractions, dataset compositions,
default_collate on nested samples, and DataLoader batches (shuffle, drop_last, collate_fn,
sampler, batch_sampler, generator) equal to torch's."""
import collections
import time

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import tensorplay as tp
import tensorplay.utils.data as data
from tensorplay.testing import assert_close


class Range(data.Dataset):
    def __init__(self, n):
        self.n = n

    def __getitem__(self, i):
        return i

    def __len__(self):
        return self.n


def _gens(seed):
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


def test_random_sampler_with_replacement_is_lazy():
    t0 = time.perf_counter()
    s = data.RandomSampler(Range(1000), replacement=True, num_samples=int(1e10), generator=_gens(3)[0])
    it = iter(s)
    ours = [next(it) for _ in range(100)]
    assert time.perf_counter() - t0 < 1.0
    assert len(s) == int(1e10)
    ts = tud.RandomSampler(range(1000), replacement=True, num_samples=int(1e10), generator=_gens(3)[1])
    it = iter(ts)
    assert ours == [next(it) for _ in range(100)]


@pytest.mark.parametrize("replacement,num_samples", [(False, None), (False, 23), (True, None), (True, 70)])
@pytest.mark.parametrize("seeded", [True, False])
def test_random_sampler_matches_torch(replacement, num_samples, seeded):
    g1, g2 = _gens(5) if seeded else (None, None)
    ours = data.RandomSampler(Range(10), replacement, num_samples, generator=g1)
    theirs = tud.RandomSampler(range(10), replacement, num_samples, generator=g2)
    for _ in range(2):   # two epochs
        torch.manual_seed(11)
        a = list(ours)
        torch.manual_seed(11)
        assert a == list(theirs)
    assert len(ours) == len(theirs)


def test_random_sampler_errors():
    with pytest.raises(ValueError, match="RandomSampler"):
        data.RandomSampler(Range(4), num_samples=0)
    with pytest.raises(TypeError, match="RandomSampler"):
        data.RandomSampler(Range(4), replacement=1)


@pytest.mark.parametrize("replacement", [True, False])
def test_weighted_random_sampler_matches_torch(replacement):
    w = torch.rand(12, generator=torch.Generator().manual_seed(0)) + 0.05
    g1, g2 = _gens(2)
    ours = data.WeightedRandomSampler(tp.from_torch(w), 9, replacement=replacement, generator=g1)
    theirs = tud.WeightedRandomSampler(w, 9, replacement=replacement, generator=g2)
    assert list(ours) == list(theirs) and list(ours) == list(theirs) and len(ours) == 9
    torch.manual_seed(4)
    a = list(data.WeightedRandomSampler(w.tolist(), 30))
    torch.manual_seed(4)
    assert a == list(tud.WeightedRandomSampler(w.tolist(), 30))
    with pytest.raises(ValueError, match="WeightedRandomSampler"):
        data.WeightedRandomSampler(w, 0)
    with pytest.raises(ValueError, match="WeightedRandomSampler"):
        data.WeightedRandomSampler(w.view(3, 4), 2)
    with pytest.raises(ValueError, match="WeightedRandomSampler"):
        data.WeightedRandomSampler(w, 13, replacement=False)


def test_subset_random_sampler_matches_torch():
    idx = [3, 9, 4, 17, 8, 1]
    g1, g2 = _gens(8)
    assert list(data.SubsetRandomSampler(idx, generator=g1)) == list(tud.SubsetRandomSampler(idx, generator=g2))
    torch.manual_seed(1)
    a = list(data.SubsetRandomSampler(idx))
    torch.manual_seed(1)
    assert a == list(tud.SubsetRandomSampler(idx))
    assert sorted(a) == sorted(idx)


@pytest.mark.parametrize("lengths", [[3, 7, 0], [0.5, 0.3, 0.2], [0.34, 0.33, 0.33], [1.0]])
def test_random_split_matches_torch(lengths):
    g1, g2 = _gens(6)
    ours = data.random_split(Range(10), lengths, generator=g1)
    theirs = tud.random_split(range(10), lengths, generator=g2)
    assert [s.indices for s in ours] == [list(s.indices) for s in theirs]
    assert [[s[i] for i in range(len(s))] for s in ours] == [list(s) for s in theirs]
    with pytest.raises(ValueError, match="random_split"):
        data.random_split(Range(10), [3, 3])
    with pytest.raises(ValueError, match="random_split"):
        data.random_split(Range(10), [0.5, 0.6])


def test_dataset_compositions():
    x, y = torch.randn(7, 3), torch.randint(0, 5, (7,))
    ds = data.TensorDataset(tp.from_torch(x), tp.from_torch(y))
    tds = tud.TensorDataset(x, y)
    for i in (0, 4, -1):
        for a, b in zip(ds[i], tds[i]):
            assert_close(a, b, exact=True)
    sub, tsub = data.Subset(ds, [6, 0, 3]), tud.Subset(tds, [6, 0, 3])
    assert len(sub) == 3
    assert_close(sub[0][0], tsub[0][0], exact=True)
    cat, tcat = data.ConcatDataset([ds, sub]), tud.ConcatDataset([tds, tsub])
    assert len(cat) == len(tcat) == 10 and cat.cumulative_sizes == tcat.cumulative_sizes
    for i in (0, 6, 7, 9, -1, -10):
        assert_close(cat[i][0], tcat[i][0], exact=True)
    with pytest.raises(IndexError, match="ConcatDataset"):
        cat[10]
    with pytest.raises(ValueError, match="TensorDataset"):
        data.TensorDataset(tp.from_torch(x), tp.from_torch(y[:3]))


Point = collections.namedtuple("Point", "x y")


def _same(a, b):
    """tp's collated batch equals torch's: the same nesting, container types and values."""
    if isinstance(b, torch.Tensor):
        assert isinstance(a, tp.Tensor)
        assert_close(a, b, exact=True)
        return
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            _same(a[k], b[k])
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


def test_default_collate_nested_matches_torch():
    g = torch.Generator().manual_seed(0)
    samples = [dict(img=torch.randn(2, 3, generator=g), label=i, w=0.5 * i, flag=i % 2 == 0, name=f"s{i}",
                    pair=(torch.randn(2, generator=g), i), pt=Point(torch.randn(1, generator=g), float(i)),
                    arr=np.arange(3) * i, seq=[i, i + 1])
               for i in range(4)]
    ours_in = [dict(s, img=tp.from_torch(s["img"]), pair=(tp.from_torch(s["pair"][0]), s["pair"][1]),
                    pt=Point(tp.from_torch(s["pt"].x), s["pt"].y)) for s in samples]
    _same(data.default_collate(ours_in), tud.default_collate(samples))
    with pytest.raises(RuntimeError, match="default_collate"):
        data.default_collate([[1, 2], [1]])


def _batches(loader):
    out = []
    for b in loader:
        out.append([x._data if isinstance(x, tp.Tensor) else x for x in b] if isinstance(b, list) else b)
    return out


def _compare(make_ours, make_theirs, epochs=2):
    loader = make_ours()
    torch.manual_seed(0)
    ours = [_batches(loader) for _ in range(epochs)]
    tloader = make_theirs()
    torch.manual_seed(0)
    theirs = [_batches(tloader) for _ in range(epochs)]
    assert len(loader) == len(tloader)
    assert len(ours) == len(theirs)
    for eo, et in zip(ours, theirs):
        assert len(eo) == len(et)
        for bo, bt in zip(eo, et):
            for u, v in zip(bo, bt):
                assert torch.equal(u, v)


X = torch.randn(23, 3, generator=torch.Generator().manual_seed(1))
Y = torch.arange(23)


@pytest.mark.parametrize("kw", [dict(batch_size=4), dict(batch_size=5, shuffle=True),
                                dict(batch_size=4, shuffle=True, drop_last=True),
                                dict(batch_size=3, shuffle=True, generator="g")])
def test_dataloader_matches_torch(kw):
    def mk(mod, Xs, Ys):
        k = dict(kw)
        if k.get("generator") == "g":
            k["generator"] = torch.Generator().manual_seed(9)
        return mod.DataLoader(mod.TensorDataset(Xs, Ys), **k)
    _compare(lambda: mk(data, tp.from_torch(X), tp.from_torch(Y)), lambda: mk(tud, X, Y))


def test_dataloader_sampler_batch_sampler_collate_fn():
    w = torch.linspace(0.1, 1.0, 23)

    def mk(mod, Xs, Ys, how):
        ds = mod.TensorDataset(Xs, Ys)
        if how == "sampler":
            return mod.DataLoader(ds, batch_size=4, sampler=mod.WeightedRandomSampler(w, 17), drop_last=True)
        if how == "batch_sampler":
            bs = mod.BatchSampler(mod.SubsetRandomSampler(list(range(0, 23, 2))), batch_size=3, drop_last=False)
            return mod.DataLoader(ds, batch_sampler=bs)
        return mod.DataLoader(ds, batch_size=6, collate_fn=lambda items: [items[0][0] * 2, items[-1][1]])
    for how in ("sampler", "batch_sampler", "collate"):
        _compare(lambda: mk(data, tp.from_torch(X), tp.from_torch(Y), how), lambda: mk(tud, X, Y, how))
    with pytest.raises(ValueError, match="batch_sampler"):
        data.DataLoader(data.TensorDataset(tp.from_torch(X)), batch_size=2,
                        batch_sampler=data.BatchSampler(data.SequentialSampler(range(3)), 2, False))


def test_generic_annotations():
    class Ints(data.Sampler[int]):
        def __iter__(self):
            return iter([2, 0])

        def __len__(self):
            return 2

    class DS(data.Dataset[tuple]):
        def __getitem__(self, i):
            return tp.from_torch(X[i])

        def __len__(self):
            return 23
    b = next(iter(data.DataLoader(DS(), batch_size=2, sampler=Ints())))
    assert_close(b, X[[2, 0]], exact=True)


@pytest.mark.parametrize("n,replicas,shuffle,drop_last", [(10, 3, True, False), (10, 3, False, True),
                                                          (2, 5, True, False), (12, 4, True, True)])
def test_distributed_sampler_matches_torch(n, replicas, shuffle, drop_last):
    from torch.utils.data.distributed import DistributedSampler as TorchDS

    from tensorplay.utils.data.distributed import DistributedSampler
    for rank in range(replicas):
        ours = DistributedSampler(Range(n), replicas, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
        theirs = TorchDS(range(n), replicas, rank, shuffle=shuffle, seed=3, drop_last=drop_last)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)
    with pytest.raises(ValueError, match="DistributedSampler"):
        DistributedSampler(Range(4), 2, 2)


def _stream_class(base):
    """A finite stream over a list, as a subclass of ``base`` (tp's or torch's IterableDataset)."""
    class Stream(base):
        def __init__(self, items):
            self.items = items

        def __iter__(self):
            return iter(self.items)

        def __len__(self):
            return len(self.items)
    return Stream


Stream, TorchStream = _stream_class(data.IterableDataset), _stream_class(tud.IterableDataset)


def test_stack_chain_datasets_and_worker_info():
    x, y = torch.randn(5, 2), torch.arange(5)
    ours = data.StackDataset(data.TensorDataset(tp.from_torch(x)), Range(5))
    theirs = tud.StackDataset(tud.TensorDataset(x), range(5))
    assert len(ours) == len(theirs) == 5
    _same(data.default_collate([ours[i] for i in (1, 3)]), tud.default_collate([theirs[i] for i in (1, 3)]))
    named = data.StackDataset(a=Range(5), b=data.TensorDataset(tp.from_torch(y)))
    assert named[2]["a"] == 2 and int(named[2]["b"][0]) == 2
    with pytest.raises(ValueError, match="StackDataset"):
        data.StackDataset(Range(2), Range(3))
    with pytest.raises(ValueError, match="StackDataset"):
        data.StackDataset(Range(2), b=Range(2))
    chain, tchain = data.ChainDataset([Stream([1, 2]), Stream([3])]), tud.ChainDataset([TorchStream([1, 2]),
                                                                                        TorchStream([3])])
    assert list(chain) == list(tchain) and len(chain) == len(tchain) == 3
    loader = data.DataLoader(chain, batch_size=2)
    _same(list(loader), list(tud.DataLoader(tchain, batch_size=2)))
    with pytest.raises(TypeError, match="ChainDataset"):
        list(data.ChainDataset([Range(2)]))
    assert data.get_worker_info() is None
