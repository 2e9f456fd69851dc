"""Shape-polymorphic Stax kernels (the chapter §10; experiment 5): under ``dynamic=True`` one
artifact serves every size — its kernels take the sizes as arguments, its wrapper allocates from
expressions of them — and a graph Stax cannot compile symbolically is specialised with a named
reason (``Lowered.specialized_reason``), never a wrong result.

Sample sizes are primes (37, 53, ...) so that a test can grep the generated source for them: a
kernel source holds no sample size.  Every compiled result is judged on a later call than the
capture run, against eager.
"""
import re

import pytest
import sympy

import tensorplay as tp
import tensorplay.nn as nn
from tensorplay.compiler.backends.stax import bounds, sizevars

F = tp.nn.functional
SIZES = (37, 53, 11, 101)       # the first is the sample (capture), then three more


def _kernel_sources(cf):
    src = cf._cache[0].artifact.source
    return re.findall(r"r'''(.*?)'''", src, re.S), src


def _run(fn, make, sizes=SIZES, **kw):
    """Compile ``fn`` with dynamic=True; call it at every size (twice: the first call at the
    sample is the capture); return the compiled function and the largest error against eager."""
    cf = tp.compile(fn, dynamic=True, **kw)
    err = 0.0
    for n in sizes:
        args = make(n)
        cf(*args)
        out, ref = cf(*args), fn(*args)
        err = max(err, (out.double() - ref.double()).abs().max().item())
        assert out.shape == ref.shape and out.dtype == ref.dtype
    return cf, err


MLP = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))

CASES = {
    # name: (fn, inputs of size n, tolerance)
    "pointwise broadcast": (lambda x, b: (x * b + 1).relu(), lambda n: (tp.randn(n, 33), tp.randn(33)), 0),
    "row reduction": (lambda x, y: (x.exp() + y).sum(-1), lambda n: (tp.randn(n, 2 * n + 1), tp.randn(n, 2 * n + 1)), 1e-4),
    "column reduction": (lambda x: x.sum(0), lambda n: (tp.randn(n, 40),), 1e-4),
    "mean of all": (lambda x: x.mean(), lambda n: (tp.randn(n, 5),), 1e-6),
    "softmax": (lambda x: x.softmax(-1), lambda n: (tp.randn(7, n),), 1e-6),
    "layer norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                   lambda n: (tp.randn(n, 32), tp.randn(32), tp.randn(32)), 1e-5),
    "var": (lambda x: x.var(-1), lambda n: (tp.randn(4, n),), 1e-5),
    "argmax": (lambda x: x.argmax(-1), lambda n: (tp.randn(n, 11),), 0),
    "matmul epilogue": (lambda x, w: (x @ w).tanh(), lambda n: (tp.randn(n, 16), tp.randn(16, 8)), 1e-5),
    "transpose": (lambda x: x.t().exp() + 1, lambda n: (tp.randn(n, 9),), 1e-5),
    "view by size": (lambda x: x.view(x.shape[0] * 2, -1).cos(), lambda n: (tp.randn(n, 8),), 1e-6),
    "strided slice": (lambda x: x[1:, ::2] * 2, lambda n: (tp.randn(n, 10),), 0),
    "cat": (lambda x, y: tp.cat([x, y], 0).sin(), lambda n: (tp.randn(n, 6), tp.randn(3, 6)), 1e-6),
    "embedding": (lambda w, i: F.embedding(i, w).sum(-1), lambda n: (tp.randn(20, 8), tp.randint(0, 20, (n,))), 1e-5),
    "mlp": (lambda x: MLP(x).softmax(-1), lambda n: (tp.randn(n, 16),), 1e-5),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_artifact_for_every_size(name):
    fn, make, tol = CASES[name]
    with tp.no_grad():
        cf, err = _run(fn, make, strict_native=True)
    assert err <= tol, f"{name}: error {err}"
    assert len(cf._cache) == 1, cf.explain()
    assert cf._cache[0].lowered.specialized_reason is None
    kernels, wrapper = _kernel_sources(cf)
    sample = SIZES[0]
    for k in kernels:   # no sample size in a kernel (37, 2*37 + 1 = 75, 53 ... never appear)
        for lit in (sample, 2 * sample + 1, 2 * sample):
            assert not re.search(rf"\b{lit}\b", k), f"{name}: size literal {lit} in\n{k}"
    assert not re.search(rf"\b{sample}\b", wrapper.split("def call")[1])


def test_kernel_takes_size_arguments():
    """The kernel's signature ends with its size arguments, the wrapper binds them from its inputs
    and passes them; loops run to them; indices are int64 (no declared upper bound, exercise 29)."""
    with tp.no_grad():
        cf, _ = _run(lambda x: (x * 2).sum(-1), lambda n: (tp.randn(n, n + 2),))
    (k,), wrapper = _kernel_sources(cf)
    head = k.split("{", 1)[0]
    syms = re.findall(r"const int64_t (s\d+)", head)
    assert len(syms) == 2, head
    assert "using idx_t = int64_t" in k
    body = wrapper.split("def call")[1]
    for s in syms:
        assert re.search(rf"{s} = arg0\.shape\[\d\]", body)
        assert re.search(rf"\b{s}\b", k.split("{", 1)[1])


@pytest.mark.parametrize("backend", ["eager", "stax"])
def test_strided_view_input_strides_are_symbols(backend):
    """An input that is a strided view (stride no expression of its sizes, here a column slice of a
    wider matrix whose width varies) has stride symbols read from ``.stride(d)``: one artifact for
    every size and stride, the key guards only ``stride >= 2``."""
    def f(x):
        return (x * 2 + 1).sum(-1)
    cf = tp.compile(f, backend=backend, dynamic=True, strict_native=backend == "stax")
    with tp.no_grad():
        for n in SIZES:
            x = tp.randn(n, 2 * n + 3)[:, :n]     # stride (2n + 3, 1)
            cf(x)
            assert (cf(x) - f(x)).abs().max().item() < 1e-4
    assert cf.counters["captures"] == 1, cf.explain()
    text = cf.explain()
    assert re.search(r"stride\[0\] = s\d+ >= 2 \(a symbol of a strided view", text), text
    src = cf._cache[0].artifact.source
    assert re.search(r"s\d+ = \w+\.stride\(0\)", src), src


def test_row_scratch_of_a_symbolic_row_is_a_heap_buffer():
    """A row kept in a scratch array between phases (softmax's exps) with an unbounded symbolic
    length: a per-thread heap buffer grown to the call's row (tp_row_scratch), right for rows far
    longer than the stack's limit and for shorter ones after them."""
    cf = tp.compile(lambda x: x.softmax(-1), dynamic=True, strict_native=True)
    with tp.no_grad():
        for n in (40, 20000, 7, 20000):
            x = tp.randn(6, n) * 3
            cf(x)
            assert (cf(x) - x.softmax(-1)).abs().max().item() < 1e-6
    (k,), _ = _kernel_sources(cf)
    assert "tp_row_scratch<float>(0, s" in k
    assert len(cf._cache) == 1


def test_cpp_wrapper_is_shape_polymorphic():
    with tp.no_grad():
        cf, err = _run(lambda x, y: (x.sin() * y).sum(-1) + 1, lambda n: (tp.randn(n, 19), tp.randn(n, 19)),
                       options={"stax.cpp_wrapper": True}, strict_native=True)
    assert err < 1e-5 and len(cf._cache) == 1
    assert "_call(_entry0" in cf._cache[0].artifact.source


def test_buffers_kept_between_calls_follow_the_sizes():
    """Intermediate buffers kept for the next call (runtime.take_sized) are reused only at the
    size they were made for: calls alternating between sizes read no stale or short buffer."""
    def f(x, w):
        h = (x @ w).relu()
        return (h * h).softmax(-1) @ w.t()
    cf = tp.compile(f, dynamic=True)
    w = tp.randn(24, 24)
    for n in (40, 7, 40, 3, 90, 7):
        x = tp.randn(n, 24)
        cf(x, w)
        assert (cf(x, w) - f(x, w)).abs().max().item() < 1e-4
    assert len(cf._cache) == 1


def test_specialisation_has_a_reason():
    """A reshape whose -1 is a floor division of symbols needs a divisibility fact Stax does not
    have: the graph is specialised per size with the reason recorded, the results stay right."""
    def f(x):
        return x.reshape(-1, 4).sum(-1)
    with tp.no_grad():
        cf, err = _run(f, lambda n: (tp.randn(n, 8),), sizes=(6, 10))
    assert err < 1e-5
    assert len(cf._cache) == 2
    reason = cf._cache[0].lowered.specialized_reason
    assert reason and "floor(" in reason        # the -1: floor(s0*s1 / 4), unproved


@pytest.mark.filterwarnings("error::RuntimeWarning")     # a backward run op by op warns: a failure here
def test_training_region_one_artifact():
    """A training region goes through AOT autograd on the symbolic graph: one forward and one
    backward artifact for every batch size, gradients equal to eager's."""
    tp.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

    def loss_fn(x, y):
        return ((mlp(x) - y) ** 2).mean()
    cf = tp.compile(loss_fn, dynamic=True)
    for n in (5, 9):
        x, y = tp.randn(n, 8), tp.randn(n, 2)
        cf(x, y).backward()
        for p in mlp.parameters():
            p.grad = None
        cf(x, y).backward()
        got = [p.grad.clone() for p in mlp.parameters()]
        for p in mlp.parameters():
            p.grad = None
        loss_fn(x, y).backward()
        for a, p in zip(got, mlp.parameters()):
            assert (a - p.grad).abs().max().item() < 1e-5
            p.grad = None
    assert len(cf._cache) == 1 and cf._cache[0].lowered.specialized_reason is None


# ---- bounds over symbol ranges (exercise 29) ---------------------------------------------------------
def _alloc(hi):
    a = sizevars.SizeVarAllocator()
    return a, a.symbol("n", 64, 2, hi)


@pytest.mark.parametrize("hi, width", [(4096, "int32_t"), (None, "int64_t"), (2 ** 40, "int64_t")])
def test_index_width_follows_declared_range(hi, width):
    """``x[i, j]`` of an (n, n) row-major buffer: in bounds for every n, and int32 only when the
    declared range bounds n * n below 2**31."""
    a, n = _alloc(hi)
    i, j = sympy.symbols("x0 x1", integer=True, nonnegative=True)
    ranges = {i: (0, n - 1), j: (0, n - 1)}
    with sizevars.use(a):
        bounds.check_access("buf", i * n + j, ranges, n * n)
        iv = bounds.bound(i * n + j, ranges)
        assert bounds.index_type([iv]) == width
        with pytest.raises(bounds.Unsupported):   # one past the end is caught for every n
            bounds.check_access("buf", i * n + j + 1, ranges, n * n)


def test_masked_symbolic_bounds():
    """cat's second input is read where ``x0 >= s`` (a mask with a symbolic constant): in range."""
    a = sizevars.SizeVarAllocator()
    s, t = a.symbol("s", 10), a.symbol("t", 3)
    x0, r0 = sympy.symbols("x0 r0", integer=True, nonnegative=True)
    ranges = {x0: (0, s + t - 1), r0: (0, 5)}
    with sizevars.use(a):
        bounds.check_access("b", (x0 - s) * 6 + r0, ranges, t * 6, sympy.Ge(x0 - s, 0))
        with pytest.raises(bounds.Unsupported):
            bounds.check_access("b", (x0 - s) * 6 + r0, ranges, t * 6)


def test_floor_facts_are_proved():
    a = sizevars.SizeVarAllocator()
    n = a.symbol("n", 9)
    assert a.statically_known_leq(1, sympy.floor(n / 2))          # n >= 2
    assert a.statically_known_leq(2 * sympy.floor(n / 2), n)
    assert not a.statically_known_leq(n, 2 * sympy.floor(n / 2))  # false for odd n
    assert a.statically_known_leq(0, sympy.Mod(n, 3))
