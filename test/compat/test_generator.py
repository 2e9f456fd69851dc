"""tp.Generator against torch.Generator: every random factory, sampler, in-place fill, nn.init
function and data utility that takes ``generator=`` draws PyTorch's numbers, bit for bit, from a
generator seeded the same way (a ``torch.Generator`` is accepted too); generators are independent
of each other and of the global seed; state round trips; compiled programs draw from the generator
they are given (Stax leaves such a draw to eager's kernel) and keep its state as eager does."""

import pytest
import torch
import torch.utils.data as tud

import tensorplay as tp
import tensorplay.utils.data as data


def _pair(seed):
    return tp.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


def _eq(ours, ref):
    ours = ours._data if isinstance(ours, tp.Tensor) else ours
    assert ours.dtype == ref.dtype and ours.shape == ref.shape
    assert torch.equal(ours, ref), (ours, ref)


# (name, tp call, torch call): each draws from the generator g
FACTORIES = [
    ("rand", lambda g: tp.rand(3, 4, generator=g), lambda g: torch.rand(3, 4, generator=g)),
    ("rand_size", lambda g: tp.rand(size=(5,), generator=g, dtype=tp.float64),
     lambda g: torch.rand(size=(5,), generator=g, dtype=torch.float64)),
    ("randn", lambda g: tp.randn((2, 7), generator=g), lambda g: torch.randn((2, 7), generator=g)),
    ("randint", lambda g: tp.randint(-3, 9, (11,), generator=g), lambda g: torch.randint(-3, 9, (11,), generator=g)),
    ("randint_high", lambda g: tp.randint(5, (4, 2), generator=g), lambda g: torch.randint(5, (4, 2), generator=g)),
    ("randperm", lambda g: tp.randperm(13, generator=g), lambda g: torch.randperm(13, generator=g)),
    ("normal_numbers", lambda g: tp.normal(2.0, 3.0, (6,), generator=g),
     lambda g: torch.normal(2.0, 3.0, (6,), generator=g)),
    ("rand_like", lambda g: tp.rand_like(tp.zeros(4, dtype=tp.float64), generator=g),
     lambda g: torch.rand_like(torch.zeros(4, dtype=torch.float64), generator=g)),
    ("randn_like", lambda g: tp.randn_like(tp.zeros(2, 3), generator=g),
     lambda g: torch.randn_like(torch.zeros(2, 3), generator=g)),
    ("randint_like", lambda g: tp.randint_like(tp.zeros(5), 0, 7, generator=g),
     lambda g: torch.randint_like(torch.zeros(5), 0, 7, generator=g)),
]


@pytest.mark.parametrize("name,ours,ref", FACTORIES, ids=[f[0] for f in FACTORIES])
def test_factories_match_torch_bit_for_bit(name, ours, ref):
    seed = int(torch.randint(0, 2**31, ()))
    g, t = _pair(seed)
    for _ in range(3):   # a sequence: the generator advances as torch's does
        _eq(ours(g), ref(t))
    assert torch.equal(g.get_state()._data, t.get_state())


def _tensor_samplers():
    m = torch.randn(4, 3)
    s = torch.rand(4, 3) + 0.1
    p = torch.rand(6)
    rate = torch.rand(5) * 4
    return [
        ("normal_tensor_tensor", lambda g: tp.normal(tp.from_torch(m), tp.from_torch(s), generator=g),
         lambda g: torch.normal(m, s, generator=g)),
        ("normal_tensor_float", lambda g: tp.normal(tp.from_torch(m), 0.5, generator=g),
         lambda g: torch.normal(m, 0.5, generator=g)),
        ("normal_tensor_default_std", lambda g: tp.normal(tp.from_torch(m), generator=g),
         lambda g: torch.normal(m, generator=g)),
        ("normal_float_tensor", lambda g: tp.normal(1.5, tp.from_torch(s), generator=g),
         lambda g: torch.normal(1.5, s, generator=g)),
        ("bernoulli", lambda g: tp.bernoulli(tp.from_torch(p), generator=g), lambda g: torch.bernoulli(p, generator=g)),
        ("bernoulli_p", lambda g: tp.bernoulli(tp.from_torch(p), 0.3, generator=g),
         lambda g: torch.bernoulli(p, 0.3, generator=g)),
        ("multinomial", lambda g: tp.multinomial(tp.from_torch(p), 4, generator=g),
         lambda g: torch.multinomial(p, 4, generator=g)),
        ("multinomial_replacement", lambda g: tp.multinomial(tp.from_torch(p), 9, True, generator=g),
         lambda g: torch.multinomial(p, 9, True, generator=g)),
        ("poisson", lambda g: tp.poisson(tp.from_torch(rate), generator=g), lambda g: torch.poisson(rate, generator=g)),
        ("method_multinomial", lambda g: tp.from_torch(p).multinomial(2, generator=g),
         lambda g: p.multinomial(2, generator=g)),
    ]


def test_tensor_samplers_match_torch_bit_for_bit():
    for name, ours, ref in _tensor_samplers():
        g, t = _pair(int(torch.randint(0, 2**31, ())))
        for _ in range(2):
            _eq(ours(g), ref(t))
        assert torch.equal(g.get_state()._data, t.get_state()), name


FILLS = [("uniform_", (-2.0, 3.0)), ("normal_", (1.0, 0.5)), ("random_", (0, 10)), ("random_", (7,)),
         ("random_", ()), ("exponential_", (2.0,)), ("cauchy_", (0.5, 2.0)), ("log_normal_", (0.0, 0.25)),
         ("geometric_", (0.3,)), ("bernoulli_", (0.25,))]


@pytest.mark.parametrize("name,args", FILLS, ids=[f"{n}{len(a)}" for n, a in FILLS])
def test_inplace_fills_match_torch_bit_for_bit(name, args):
    g, t = _pair(int(torch.randint(0, 2**31, ())))
    dtype = torch.float64 if name != "random_" else torch.int32
    x, y = tp.zeros(17, dtype=dtype), torch.zeros(17, dtype=dtype)
    for _ in range(2):
        assert getattr(x, name)(*args, generator=g) is x
        getattr(y, name)(*args, generator=t)
        _eq(x, y)


def test_bernoulli_inplace_tensor_probabilities():
    g, t = _pair(5)
    p = torch.rand(8)
    x, y = tp.zeros(8), torch.zeros(8)
    x.bernoulli_(tp.from_torch(p), generator=g)
    y.bernoulli_(p, generator=t)
    _eq(x, y)


INITS = [("uniform_", (-0.5, 0.5)), ("normal_", (0.1, 2.0)), ("trunc_normal_", ()),
         ("trunc_normal_", (0.0, 1.0, 0.5, 0.7)), ("xavier_uniform_", ()), ("xavier_normal_", (2.0,)),
         ("kaiming_uniform_", (5 ** 0.5,)), ("kaiming_normal_", (0, "fan_out", "relu")), ("orthogonal_", ()),
         ("orthogonal_", (1.5,))]


@pytest.mark.parametrize("name,args", INITS, ids=[f"{n}{len(a)}" for n, a in INITS])
def test_nn_init_matches_torch_bit_for_bit(name, args):
    g, t = _pair(int(torch.randint(0, 2**31, ())))
    for shape in ((7, 5), (4, 3, 2, 2)):
        w, r = tp.empty(*shape), torch.empty(*shape)
        getattr(tp.nn.init, name)(w, *args, generator=g)
        getattr(torch.nn.init, name)(r, *args, generator=t)
        _eq(w, r)


def test_nn_init_sparse_matches_torch():
    g, t = _pair(3)
    w, r = tp.empty(10, 6), torch.empty(10, 6)
    tp.manual_seed(1)
    tp.nn.init.sparse_(w, 0.4, generator=g)
    torch.manual_seed(1)
    torch.nn.init.sparse_(r, 0.4, generator=t)
    _eq(w, r)
    assert int((w._data == 0).sum()) == 6 * 4
    with pytest.raises(ValueError, match="sparse_"):
        tp.nn.init.sparse_(tp.empty(3), 0.5)


def test_trunc_normal_global_seed_matches_torch():
    """Without a generator too: the same draws as torch's rejection sampler after the same seed."""
    w, r = tp.empty(300), torch.empty(300)
    tp.manual_seed(4)
    tp.nn.init.trunc_normal_(w, std=0.02)
    torch.manual_seed(4)
    torch.nn.init.trunc_normal_(r, std=0.02)
    _eq(w, r)
    assert float(w._data.abs().max()) <= 2.0


def test_generator_api_and_state_round_trip():
    g = tp.Generator()
    assert g.device == torch.device("cpu") and tp.Generator(device="cpu").device.type == "cpu"
    assert g.manual_seed(123) is g and g.initial_seed() == 123
    state = g.get_state()
    assert isinstance(state, tp.Tensor) and state.dtype == tp.uint8
    a = tp.rand(10, generator=g)
    g.set_state(state)                       # a tp tensor ...
    _eq(tp.rand(10, generator=g), a._data)
    g.set_state(state._data)                 # ... or a torch tensor
    _eq(tp.rand(10, generator=g), a._data)
    # state moves between tp and torch generators
    t = torch.Generator()
    t.set_state(g.get_state()._data)
    _eq(tp.rand(4, generator=g), torch.rand(4, generator=t))
    s = g.seed()
    assert s == g.initial_seed()
    assert "Generator" in repr(g)
    assert isinstance(g, torch.Generator) and isinstance(torch.Generator(), tp.Generator)
    assert isinstance(tp.default_generator, tp.Generator)


def test_generators_are_independent_of_each_other_and_of_the_global_seed():
    g1, g2 = tp.Generator().manual_seed(7), tp.Generator().manual_seed(7)
    ref = torch.rand(5, generator=torch.Generator().manual_seed(7))
    tp.manual_seed(0)
    _eq(tp.rand(5, generator=g1), ref)
    tp.rand(100)                              # global draws do not move g2
    tp.randn(5, generator=tp.Generator().manual_seed(1))   # nor do other generators
    _eq(tp.rand(5, generator=g2), ref)
    # and generator draws do not move the global stream
    torch.manual_seed(11)
    ref = torch.rand(3)
    tp.manual_seed(11)
    tp.rand(50, generator=g1)
    _eq(tp.rand(3), ref)


def test_default_generator_is_the_global_one():
    tp.manual_seed(21)
    assert tp.default_generator.initial_seed() == 21
    a = tp.rand(4, generator=tp.default_generator)
    tp.manual_seed(21)
    _eq(tp.rand(4), a._data)


def test_torch_generator_accepted_directly():
    t1, t2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    _eq(tp.randn(6, generator=t1), torch.randn(6, generator=t2))
    _eq(tp.randperm(6, generator=t1), torch.randperm(6, generator=t2))


@pytest.mark.parametrize("bad", [3, "g", object()])
def test_bad_generator_is_a_clear_error(bad):
    with pytest.raises(TypeError, match=r"tp\.rand: generator must be"):
        tp.rand(2, generator=bad)
    with pytest.raises(TypeError, match=r"tp\.randperm: generator must be"):
        tp.randperm(2, generator=bad)
    with pytest.raises(TypeError, match="generator"):
        tp.zeros(2, generator=tp.Generator())


def test_data_utilities_match_torch():
    ds = list(range(23))
    g, t = _pair(2)
    assert list(data.RandomSampler(ds, generator=g)) == list(tud.RandomSampler(ds, generator=t))
    assert list(data.RandomSampler(ds, True, 40, generator=g)) == list(tud.RandomSampler(ds, True, 40, generator=t))
    assert list(data.SubsetRandomSampler([3, 1, 4, 1, 5], generator=g)) == \
        list(tud.SubsetRandomSampler([3, 1, 4, 1, 5], generator=t))
    w = [0.1, 0.5, 0.2, 0.2]
    assert list(data.WeightedRandomSampler(w, 12, generator=g)) == list(tud.WeightedRandomSampler(w, 12, generator=t))
    assert list(data.WeightedRandomSampler(tp.tensor(w), 3, False, generator=g)) == \
        list(tud.WeightedRandomSampler(torch.tensor(w), 3, False, generator=t))
    ours = data.random_split(ds, [0.5, 0.3, 0.2], generator=g)
    ref = tud.random_split(ds, [0.5, 0.3, 0.2], generator=t)
    assert [list(s.indices) for s in ours] == [list(s.indices) for s in ref]
    x = torch.randn(20, 3)
    lo = data.DataLoader(data.TensorDataset(tp.from_torch(x)), batch_size=6, shuffle=True, generator=g)
    lt = tud.DataLoader(tud.TensorDataset(x), batch_size=6, shuffle=True, generator=t)
    for _ in range(2):
        for (a,), (b,) in zip(lo, lt):
            _eq(a, b)
    assert torch.equal(g.get_state()._data, t.get_state())
    assert isinstance(data.DataLoader(ds, seed=3).generator, tp.Generator)


def _compiled_ref(t, x):
    return (x + torch.rand(3, generator=t) * torch.randn(3, generator=t)
            + torch.empty(3).uniform_(-1, 1, generator=t) + torch.randint(0, 4, (3,), generator=t)
            + torch.randperm(3, generator=t) + torch.normal(0.0, 1.0, (3,), generator=t)
            + torch.bernoulli(torch.full((3,), 0.5), 0.5, generator=t))


def _compiled_fn(x, g):
    return (x + tp.rand(3, generator=g) * tp.randn(3, generator=g)
            + tp.empty(3).uniform_(-1, 1, generator=g) + tp.randint(0, 4, (3,), generator=g)
            + tp.randperm(3, generator=g) + tp.normal(0.0, 1.0, (3,), generator=g)
            + tp.bernoulli(tp.full((3,), 0.5), 0.5, generator=g))


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_compiled_draws_from_the_given_generator():
    cf = tp.compile(_compiled_fn)
    g, t = _pair(17)
    x = tp.randn(3)
    for _ in range(3):    # the first call is the capture run; the later ones run the compiled program
        _eq(cf(x, g), _compiled_ref(t, x._data))
        assert torch.equal(g.get_state()._data, t.get_state())
    # another generator object: a new specialization that draws from it, not from the first
    g2, t2 = _pair(5)
    for _ in range(2):
        _eq(cf(x, g2), _compiled_ref(t2, x._data))
    assert torch.equal(g.get_state()._data, t.get_state())
    # global draws are untouched by the compiled generator draws
    torch.manual_seed(3)
    ref = torch.rand(2)
    tp.manual_seed(3)
    cf(x, g)
    _eq(tp.rand(2), ref)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_compiled_closure_generator_and_unread_draws():
    """A generator from a closure, and a draw nobody reads: kept (the generator advances as in
    eager), and two equal draws are two draws."""
    g, t = _pair(8)

    def f(x):
        tp.rand(4, generator=g)              # unread
        return x + tp.rand(4, generator=g) - tp.rand(4, generator=g)

    cf = tp.compile(f)
    x = tp.zeros(4)
    for _ in range(3):
        torch.rand(4, generator=t)
        ref = x._data + torch.rand(4, generator=t) - torch.rand(4, generator=t)
        _eq(cf(x), ref)
        assert torch.equal(g.get_state()._data, t.get_state())


def test_normal_gradient_is_zero_and_meta_matches():
    """As in PyTorch: normal(mean, std) is not reparameterised (zero gradients, output requires
    grad); the meta function gives the broadcast shape."""
    m = torch.randn(4, 1, dtype=torch.float64)
    s = torch.rand(3, dtype=torch.float64) + 0.1
    mt, st = tp.from_torch(m.clone()).requires_grad_(), tp.from_torch(s.clone()).requires_grad_()
    mr, sr = m.clone().requires_grad_(), s.clone().requires_grad_()
    y, yr = tp.normal(mt, st), torch.normal(mr, sr)
    assert y.requires_grad and y.shape == yr.shape
    y.sum().backward()
    yr.sum().backward()
    _eq(mt.grad, mr.grad)
    _eq(st.grad, sr.grad)
    meta = tp.ops.OPS["normal"].run_meta(m, s, None)
    assert meta.shape == (4, 3) and meta.dtype == torch.float64
    with pytest.raises(TypeError, match=r"tp\.normal: a number mean and std need a size"):
        tp.normal(0.0, 1.0)


def test_pickle_and_deepcopy_keep_type_and_state():
    import copy
    import pickle
    g = tp.Generator().manual_seed(31)
    tp.rand(7, generator=g)
    for h in (copy.deepcopy(g), pickle.loads(pickle.dumps(g))):
        assert type(h) is tp.Generator and h.initial_seed() == 31
        _eq(tp.rand(3, generator=h), torch.rand(3, generator=copy.deepcopy(g)))


def test_compiled_with_symbolic_sizes_draws_from_the_generator():
    """dynamic=True: the capture's symbolic run takes the factories' meta (no draw), and the
    compiled program's eager kernels draw from the generator at each call's sizes."""
    def f(x, g):
        return x * tp.rand(x.shape, generator=g) + tp.randint(0, 3, x.shape, generator=g) \
            + tp.randperm(x.shape[0], generator=g)

    cf = tp.compile(f, dynamic=True)
    g, t = _pair(12)
    for n in (3, 4, 5, 6):
        x = tp.randn(n)
        ref = (x._data * torch.rand(n, generator=t) + torch.randint(0, 3, (n,), generator=t)
               + torch.randperm(n, generator=t))
        _eq(cf(x, g), ref)
    assert cf._counters["captures"] == 1
    # without a generator the symbolic capture works as before
    cg = tp.compile(lambda x: x * tp.rand(x.shape), dynamic=True)
    for n in (3, 4, 5):
        assert cg(tp.ones(n)).shape == (n,)


def test_tp_random_namespace():
    """``torch.random``'s names: the global generator's seed and state, and fork_rng."""
    torch.manual_seed(8)
    ref = torch.rand(4)
    assert tp.random.manual_seed(8) is tp.default_generator and tp.random.initial_seed() == 8
    state = tp.random.get_rng_state()
    assert isinstance(state, tp.Tensor)
    g = tp.random.Generator().manual_seed(8)
    with tp.random.fork_rng():
        tp.rand(10)                          # restored when the block ends
        tp.rand(2, generator=g)
    _eq(tp.rand(4), ref)
    tp.random.set_rng_state(state)
    _eq(tp.rand(4), ref)
    t = torch.Generator().manual_seed(8)
    torch.rand(2, generator=t)
    _eq(tp.rand(3, generator=g), torch.rand(3, generator=t))   # g's draw inside the block stands
    assert tp.random.default_generator is tp.default_generator


@pytest.mark.filterwarnings("error::RuntimeWarning")     # the backend compiles it (no whole-graph fallback)
@pytest.mark.parametrize("backend", ["stax", "eager"])
def test_compiled_fills_without_lowering_draw_from_the_generator(backend):
    """cauchy_ / geometric_ / log_normal_ / poisson have no Stax rule: eager's kernel (a fallback
    kernel, or the eager backend's raw path) draws from the generator the program names; their
    metas do not consult the generator."""
    def f(x, g):
        return (x + tp.empty(4).cauchy_(generator=g) + tp.empty(4).geometric_(0.3, generator=g)
                + tp.empty(4).log_normal_(generator=g) + tp.rand(4, generator=g)
                + tp.poisson(x.abs(), generator=g))

    cf = tp.compile(f, backend=backend)
    g, t = _pair(3)
    x = tp.randn(4)
    for _ in range(3):
        ref = (x._data + torch.empty(4).cauchy_(generator=t) + torch.empty(4).geometric_(0.3, generator=t)
               + torch.empty(4).log_normal_(generator=t) + torch.rand(4, generator=t)
               + torch.poisson(x._data.abs(), generator=t))
        _eq(cf(x, g), ref)
