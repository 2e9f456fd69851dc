"""A lowering registered or overridden from outside the package changes the compiled-graph key.

The graph cache (codecache.graph_key) keys a graph by the package's sources; user code added to
Stax -- ``register_lowering`` from a script (experiment 3), an override of an existing rule, a Stax
function replaced by a script -- is keyed by ``usercode.user_code_digest``.  Each test compiles,
changes the lowering, compiles again *without* ``TP_GRAPH_CACHE=0`` and checks that the values are
the new lowering's (which differ detectably from the old one's), then that removing the change
brings back the package's key.  One test does it in new processes sharing the cache folder.

The package digest is pinned for each test (``pinned_package``): other processes may save the
package's sources while a test runs (a shared working tree), and the key follows them.
"""
import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler.api import BackendCompilerError
from tensorplay.compiler.backends.stax import codecache, usercode
from tensorplay.compiler.backends.stax.op_lowerings import LOWERINGS, cdt, ops, pointwise, register_lowering
from tensorplay.ops.registry import register

pytestmark = pytest.mark.usefixtures("stax_cache", "pinned_package")


@pytest.fixture
def pinned_package(monkeypatch):
    """The package digest as of the test's start (a builtin partial, not a lambda: a lambda put
    into a Stax module is user code, and in the key itself)."""
    d = codecache._package_digest()
    monkeypatch.setattr(codecache, "_package_digest", functools.partial(str, d))
    return d


def T(*shape):
    return tp.from_torch(torch.randn(*shape))


def _relu_affine(x):
    return tp.relu(x) * 2 + 1


def _triple_rule():
    """A rule that is not relu: relu(x) becomes 3x, so relu(x) * 2 + 1 becomes 6x + 1."""
    return pointwise(lambda a: ops.mul(a, ops.constant(3, cdt())))


def _run_twice(fn, *args, **kw):
    cf = tp.compile(fn, **kw)
    cf(*args)                 # the capture run (eager values)
    return cf(*args)._data    # a compiled call


def _key(fn, *args):
    low = tp.compile(fn).lower(*args)
    return codecache.graph_key(low.graph_module, low.example_inputs)


def test_override_changes_the_key_and_removing_it_restores_it(monkeypatch):
    x = T(64, 32)
    relu_ref = torch.relu(x._data) * 2 + 1
    torch.testing.assert_close(_run_twice(_relu_affine, x, strict_native=True), relu_ref)
    k0 = _key(_relu_affine, x)
    assert usercode.user_code_digest() == ""            # nothing of the user's in Stax yet
    with monkeypatch.context() as m:
        m.setitem(LOWERINGS, "relu", _triple_rule())
        k1 = _key(_relu_affine, x)
        assert k1 != k0
        assert _key(_relu_affine, x) == k1              # deterministic
        m.setitem(LOWERINGS, "relu", _triple_rule())    # the same code, a new function object
        assert _key(_relu_affine, x) == k1
        # a compiled graph saved before the override is not reused: the values are the new rule's
        torch.testing.assert_close(_run_twice(_relu_affine, x, strict_native=True), x._data * 6 + 1)
        # another user rule (a plain function, registered with the decorator): another key
        @register_lowering("relu")
        def _negated(a):
            return pointwise(lambda v: ops.neg(v))(a)
        assert _key(_relu_affine, x) not in (k0, k1)
        torch.testing.assert_close(_run_twice(_relu_affine, x), -x._data * 2 + 1)
    hits = codecache.stats["graph_hits"]
    assert _key(_relu_affine, x) == k0                  # the package's rule again: the package's key
    torch.testing.assert_close(_run_twice(_relu_affine, x, strict_native=True), relu_ref)
    assert codecache.stats["graph_hits"] == hits + 1    # ... and its graph, saved by the first compile


_SCALE = 3


def test_user_rule_reads_its_globals(monkeypatch):
    """A constant or helper the user's rule reads by name is part of the key."""
    global _SCALE
    x = T(16, 8)
    with monkeypatch.context() as m:
        m.setitem(LOWERINGS, "relu", pointwise(lambda a: ops.mul(a, ops.constant(_SCALE, cdt()))))
        k3 = _key(_relu_affine, x)
        torch.testing.assert_close(_run_twice(_relu_affine, x), x._data * 6 + 1)
        m.setattr(sys.modules[__name__], "_SCALE", 5)
        assert _key(_relu_affine, x) != k3
        torch.testing.assert_close(_run_twice(_relu_affine, x), x._data * 10 + 1)


def test_replaced_stax_function_changes_the_key(monkeypatch):
    """A Stax heuristic replaced by user code (experiment 4 from a script) is in the key."""
    from tensorplay.compiler.backends.stax import choices
    x = T(8, 16)
    f = lambda x: (x.exp().sum(-1), x.exp().amax(-1))    # noqa: E731  example 7.2
    k0 = _key(f, x)
    with monkeypatch.context() as m:
        m.setattr(choices, "score_fusion", lambda sched, g1, g2: (0, -abs(g1.order - g2.order)))
        assert _key(f, x) != k0
    assert _key(f, x) == k0


_LOGADDEXP = register("tpgk_logaddexp(Tensor self, Tensor other) -> Tensor",
                      eager=lambda a, b: torch.logaddexp(a, b), tags=("pointwise",), method=False,
                      function=False)


def _logaddexp_rule():
    def compute(a, b):
        m = ops.maximum(a, b)
        d = ops.abs(ops.sub(a, b))
        both_inf = ops.logical_and(ops.eq(a, b), ops.isinf(a))     # logaddexp(inf, inf) = inf
        return ops.where(both_inf, a, ops.add(m, ops.log1p(ops.exp(ops.neg(d)))))
    return pointwise(compute)


def test_new_op_lowering_after_a_fallback(monkeypatch):
    """Experiment 3's walk-through: an op with no lowering falls back (strict_native raises); the
    lowering registered afterwards is used by the next compile of the same graph."""
    f = lambda x, y: _LOGADDEXP.fn(x, y) * 2 + 1          # noqa: E731
    x, y = T(64, 32), T(32)
    ref = torch.logaddexp(x._data, y._data) * 2 + 1
    assert "tpgk_logaddexp" not in LOWERINGS
    with pytest.raises(BackendCompilerError, match="tpgk_logaddexp: no lowering"):
        _run_twice(f, x, y, strict_native=True)
    with monkeypatch.context() as m:
        m.setitem(LOWERINGS, "tpgk_logaddexp", _logaddexp_rule())
        torch.testing.assert_close(_run_twice(f, x, y, strict_native=True), ref)
    with pytest.raises(BackendCompilerError, match="tpgk_logaddexp: no lowering"):   # removed again: the fallback
        _run_twice(f, x, y, strict_native=True)


_CHILD = textwrap.dedent("""
    import functools, json, sys, torch
    import tensorplay as tp
    from tensorplay.compiler.backends.stax import codecache
    codecache._package_digest = functools.partial(str, sys.argv[2])     # the parent's (pinned_package)
    if sys.argv[1] == "override":
        from tensorplay.compiler.backends.stax.op_lowerings import register_lowering, pointwise, ops, cdt
        register_lowering("relu")(pointwise(lambda a: ops.mul(a, ops.constant(3, cdt()))))
    torch.manual_seed(1)
    x = tp.from_torch(torch.randn(64, 32))
    cf = tp.compile(lambda x: tp.relu(x) * 2 + 1, strict_native=True)
    cf(x)
    out = cf(x)._data
    which = [name for name, ref in (("package", torch.relu(x._data) * 2 + 1), ("override", x._data * 6 + 1))
             if torch.allclose(out, ref)]
    print(json.dumps({"which": which, "graph_hits": codecache.stats["graph_hits"]}))
""")


def _child(mode, package):
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root))
    env.pop("PYTHONHASHSEED", None)          # each process its own hash seed (sets' order differs)
    r = subprocess.run([sys.executable, "-c", _CHILD, mode, package], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_new_process_uses_the_registered_lowering(pinned_package):
    """Here: compile with the package's relu (the graph is saved in TP_CACHE_DIR).  A new process
    that overrides relu gets the override's values; a second one finds the graph the first saved
    (the key is the same in every process); a process without the override finds the package's."""
    torch.manual_seed(1)
    x = T(64, 32)
    torch.testing.assert_close(_run_twice(lambda x: tp.relu(x) * 2 + 1, x, strict_native=True),
                               torch.relu(x._data) * 2 + 1)
    first = _child("override", pinned_package)
    assert first["which"] == ["override"]
    second = _child("override", pinned_package)
    assert second == {"which": ["override"], "graph_hits": 1}
    assert _child("package", pinned_package) == {"which": ["package"], "graph_hits": 1}
