"""The device seam (device.py): a second device backend plugs in with one call, without touching
the scheduler or the plans.

The stub here renders a KernelPlan into Python: every compute function is evaluated with a handler
that prints each ``ops`` call as one line of torch code on 0-d tensors, inside plain Python loops
over the plan's index variables (phases in order, a reduction's accumulator per row) -- a small
reference interpreter of the plan, fine for small tensors.  Registered for ``"cpu"`` in place of
the C++ backend, it runs the chapter's examples 1.1, 7.1 and 7.2 and a few more programs through
``tp.compile(backend="stax")`` with no C++ built, and the values match eager.  Registered beside it
under a name of its own, the knob ``stax.cpu_backend`` selects it.
"""
import math
import os
import sys

import pytest
import sympy
import torch

import tensorplay as tp
from tensorplay.compiler.backends.stax import device
from tensorplay.compiler.backends.stax.cpp import CppBackend
from tensorplay.compiler.backends.stax.ops_handler import BINARY, COMPARE, UNARY, set_handler

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
from read_generated_code import ex11, ex71, ex72  # noqa: E402  (the chapter's examples)

_TORCH_NAME = {"truediv": "div", "floordiv": "floor_divide"}
_INIT = {"sum": 0, "prod": 1, "max": -math.inf, "min": math.inf, "any": False, "all": True}
_COMBINE = {"sum": "{a} + {v}", "prod": "{a} * {v}", "max": "torch.maximum({a}, {v})",
            "min": "torch.minimum({a}, {v})", "any": "{a} | {v}", "all": "{a} & {v}"}


def _py(expr) -> str:
    e = sympy.sympify(expr)
    if any(not isinstance(f, (sympy.Add, sympy.Mul, sympy.Symbol, sympy.Integer)) for f in sympy.preorder_traversal(e)):
        raise NotImplementedError(f"the stub prints linear indices only: {e}")
    return f"({e})"


def _lit(v) -> str:
    if isinstance(v, float) and (math.isinf(v) or math.isnan(v)):
        return f"float('{v}')"
    return repr(v)


class PyHandler:
    """Prints every ``ops`` call as a line ``tK = <torch expression>`` (values are 0-d tensors);
    loads read the flat view ``<buffer>_f`` at the printed index."""

    def __init__(self):
        self.lines, self.n, self.loads = [], 0, set()

    def _emit(self, expr):
        self.n += 1
        name = f"t{id(self) % 9973}_{self.n}"
        self.lines.append(f"{name} = {expr}")
        return name

    def load(self, name, index):
        self.loads.add(name)
        return self._emit(f"{name}_f[{_py(index)}]")

    def index_expr(self, expr, dtype):
        return self._emit(f"torch.tensor({_py(expr)}, dtype={dtype})")

    def constant(self, value, dtype):
        return self._emit(f"torch.tensor({_lit(value)}, dtype={dtype})")

    def to_dtype(self, x, dtype, src_dtype=None):
        return self._emit(f"{x}.to({dtype})")

    def where(self, c, a, b):
        return self._emit(f"torch.where({c}, {a}, {b})")

    def masked(self, mask, body, other):
        outer, self.lines = self.lines, []
        v = body()
        inner, self.lines = self.lines, outer
        out = self._emit("None")
        self.lines[-1:] = [f"if bool({mask}):", *(f"    {ln}" for ln in inner), f"    {out} = {v}",
                           "else:", f"    {out} = torch.tensor({_lit(other)}).to({v}.dtype)"]
        return out

    def __getattr__(self, name):
        if name not in UNARY + BINARY + COMPARE:
            raise AttributeError(name)
        fn = _TORCH_NAME.get(name, name)

        def op(*args, op=None):
            if name == "truncdiv":
                return self._emit(f"torch.div({args[0]}, {args[1]}, rounding_mode='trunc')")
            return self._emit(f"torch.{fn}({', '.join(args)})")
        return op


def render_python(plan, name):
    """(source, params): ``def <name>(<buffers>)`` computing the plan with Python loops."""
    (xs, rs), (osz, isz) = plan.index_vars, plan.iteration
    nodes = {n: p for n, p in plan.nodes.items()}
    body, params, written = [], {}, {}
    ind = "    "

    def loops(vs, sizes, level):
        for v, s in zip(vs, sizes):
            body.append(ind * level + f"for {v} in range({int(s)}):")
            level += 1
        return level

    def node_lines(n, args, level):
        h = PyHandler()
        with set_handler(h):
            v = n.ir.buf.data.inner_fn(*args)
        for b in h.loads:
            if b not in plan.locals:
                params.setdefault(b, False)
        body.extend(ind * level + ln for ln in h.lines)
        return v

    def store(n, value, level):
        lay = n.ir.buf.layout
        if n.name not in plan.locals:
            written[n.name] = True
        body.append(ind * level + f"{n.name}_f[{_py(lay.index(n.index[0]))}] = {value}")

    lvl = loops(xs, osz, 1)
    for ph in plan.phases:
        reds = [nodes[m] for m in ph.reductions]
        for n in reds:
            r = n.reduction
            if r.kind not in _INIT or r.leader != n.name:
                raise NotImplementedError(f"the stub has no {r.kind} reduction")
            body.append(ind * lvl + f"acc_{n.name} = torch.tensor({_lit(_INIT[r.kind])}, dtype={r.acc_dtype})")
        il = loops(rs, isz, lvl)
        for m in ph.inner:
            n = nodes[m]
            if n.placement == "reduce":
                v = node_lines(n, n.index, il)
                comb = _COMBINE[n.reduction.kind].format(a=f"acc_{n.name}", v=f"{v}.to({n.reduction.acc_dtype})")
                body.append(ind * il + f"acc_{n.name} = {comb}")
            else:
                store(n, node_lines(n, n.index[:1], il), il)
        if il == lvl:
            body.append(ind * lvl + "pass")
        for n in reds:
            store(n, f"acc_{n.name}", lvl)
        for m in ph.outer:
            n = nodes[m]
            store(n, node_lines(n, n.index[:1], lvl), lvl)
    names = list(dict.fromkeys([*params, *written]))
    head = [f"def {name}({', '.join(names)}):"]
    for b in names:
        head.append(ind + f"{b}_f = torch.as_strided({b}, ({plan.buffers[b].extent},), (1,))")
    for b in sorted(plan.locals):     # a local value gets a scratch tensor of its layout's extent
        lay = plan.nodes[b].ir.buf.layout
        ext = 1 + sum((int(s) - 1) * int(st) for s, st in zip(lay.size, lay.stride))
        head.append(ind + f"{b}_f = torch.empty({ext}, dtype={lay.dtype})")
    return "\n".join(head + body) + "\n", {b: (None, b in written) for b in names}


class PythonStubBackend(device.DeviceBackend):
    """A second device backend: kernels are Python functions printed into the wrapper module."""
    name = "python-stub"

    def __init__(self):
        self.rendered = []

    def render(self, plan, name):
        self.rendered.append(name)
        return render_python(plan, name)

    def kernel_definition(self, name, source, params):
        return source.splitlines()

    def kernel_call(self, name, params):
        return f"{name}({', '.join(params)})"


@pytest.fixture
def stub(config_patch):
    """The stub registered for "cpu" (one call), the C++ backend back afterwards; no graph cache
    (a graph compiled by the stub must not be found by a later C++ run, and vice versa)."""
    config_patch("stax.graph_cache", False)
    backend = PythonStubBackend()
    prev = device.register_device_backend("cpu", backend)
    assert isinstance(prev, CppBackend)
    try:
        yield backend
    finally:
        device.register_device_backend("cpu", prev)
    assert isinstance(device.device_backend("cpu"), CppBackend)


def _softmax(x):
    z = (x - x.amax(-1, keepdim=True)).exp()
    return z / z.sum(-1, keepdim=True)


def _norm(x, w):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) * (x - m)).mean(-1, keepdim=True)
    return (x - m) / (v + 1e-5).sqrt() * w


PROGRAMS = {
    "ex1.1": (ex11, lambda: (tp.randn(6, 17), tp.randn(6, 17))),
    "ex7.1": (ex71, lambda: (tp.rand(5, 9) + 0.5,)),
    "ex7.2": (ex72, lambda: (tp.randn(4, 3, 11),)),
    "softmax": (_softmax, lambda: (tp.randn(7, 13),)),
    "norm": (_norm, lambda: (tp.randn(5, 16), tp.randn(16))),
    "pointwise": (lambda x, y: (x * y + 1).relu().sigmoid(), lambda: (tp.randn(3, 5), tp.randn(5))),
}


@pytest.mark.parametrize("prog", sorted(PROGRAMS))
def test_stub_backend_runs_programs_like_eager(stub, prog):
    fn, make = PROGRAMS[prog]
    args = make()
    compiled = tp.compile(fn, backend="stax")
    got, want = compiled(*args), fn(*args)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    assert stub.rendered, "the stub rendered no kernel"
    for g, w in zip(got, want):
        torch.testing.assert_close(g._data, w._data, rtol=1e-5, atol=1e-5)


def test_stub_source_is_python_of_the_plan(stub):
    """The wrapper module holds the stub's kernels as Python functions: no C++, no compile pool."""
    from tensorplay.compiler.backends.stax import compile_graph
    got = {}

    def backend(gm, example_inputs, **kw):
        got["src"] = compile_graph(gm, example_inputs)[0]
        from tensorplay.compiler.backends.eager import eager_backend
        return eager_backend(gm, example_inputs)
    tp.compile(_softmax, backend=backend)(tp.randn(4, 8))
    src = got["src"]
    assert "def kernel0(" in src and "    kernel0(arg0, " in src
    assert "async_compile" not in src and "extern \"C\"" not in src


def test_registry_errors():
    with pytest.raises(RuntimeError, match="no device backend for 'nodevice'"):
        device.device_backend("nodevice")
    with pytest.raises(TypeError):
        device.register_device_backend("cpu", object())
    assert "cpu" in device.registered_devices()


def test_a_device_without_a_backend_is_rejected():
    """stax_backend refuses tensors of a device no backend is registered for, naming the ones that are."""
    from tensorplay.compiler.backends.eager import eager_backend
    from tensorplay.compiler.backends.stax import StaxStrictError, stax_backend
    got = {}

    def capture(gm, example_inputs, **kw):
        got["gm"] = gm
        return eager_backend(gm, example_inputs)
    tp.compile(lambda x: x * 2, backend=capture)(tp.randn(3))
    with pytest.raises(StaxStrictError, match="no device backend for meta tensors .registered: cpu"):
        stax_backend(got["gm"], [tp.from_torch(torch.empty(3, device="meta"))])


class CountingStub(PythonStubBackend):
    """The stub, and the wrapper counts the calls of its kernels (``ran``)."""

    def __init__(self):
        super().__init__()
        self.ran = []

    def wrapper_imports(self):
        return ["from tensorplay.compiler.backends.stax import device as _device",
                "_ran = _device.device_backend('cpu').ran"]      # imported while this backend is selected

    def kernel_call(self, name, params):
        return f"_ran.append({name!r}); {super().kernel_call(name, params)}"


def test_a_second_cpu_backend_is_selected_by_the_knob(config_patch):
    """Two backends for "cpu", each under its name; ``stax.cpu_backend`` picks the one that runs, is
    part of the compiled-graph key (config.digest), and an unknown name raises naming the registered."""
    from tensorplay.compiler import config
    config_patch("stax.graph_cache", False)
    stub = CountingStub()
    assert device.register_device_backend("cpu", stub, name="python-stub") is None
    try:
        assert device.registered_backends("cpu") == ["cpp", "triton", "python-stub"]
        assert isinstance(device.device_backend("cpu"), CppBackend)        # the default: "cpp"
        digest = config.digest()
        x, w = tp.randn(6, 17), tp.randn(6, 17)
        with config.patch({"stax.cpu_backend": "python-stub"}):
            assert device.device_backend("cpu") is stub and config.digest() != digest
            f = tp.compile(ex11, backend="stax")
            f(x, w)                   # the capture run (eager's values); compiles through the stub
            assert stub.rendered and not stub.ran
            x2, w2 = tp.randn(6, 17), tp.randn(6, 17)
            got = f(x2, w2)           # the compiled wrapper, its kernels the stub's
        assert stub.ran
        torch.testing.assert_close(got._data, ex11(x2, w2)._data, rtol=1e-5, atol=1e-5)
        with config.patch({"stax.cpu_backend": "nosuch"}):
            with pytest.raises(ValueError, match=r"stax.cpu_backend='nosuch'.*registered: cpp, triton, python-stub"):
                device.device_backend("cpu")
    finally:
        assert device.unregister_device_backend("cpu", "python-stub") is stub
    assert device.registered_backends("cpu") == ["cpp", "triton"]
