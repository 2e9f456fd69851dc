"""tp.profiler: host spans, compile phases, Stax kernel spans, the memory timeline and the exports
(trace-event JSON that Perfetto loads, key_averages, the memory PNG/JSON)."""
import gzip
import json
import re
from collections import Counter, defaultdict

import pytest
import torch

import tensorplay as tp
import tensorplay.nn.functional as F
from tensorplay.profiler import ProfilerAction, ProfilerActivity, profile, record_function, schedule

CPU = [ProfilerActivity.CPU]


def _mlp():
    tp.manual_seed(0)
    lin1, lin2 = tp.nn.Linear(32, 64), tp.nn.Linear(64, 8)
    params = list(lin1.parameters()) + list(lin2.parameters())

    def loss_fn(x, y):
        return F.cross_entropy(lin2(F.gelu(lin1(x))), y)
    return loss_fn, params


def _batch():
    g = torch.Generator().manual_seed(1)
    return tp.from_torch(torch.randn(16, 32, generator=g)), tp.from_torch(torch.randint(0, 8, (16,), generator=g))


def _check_trace_schema(trace):
    """What Perfetto needs of a trace-event file: each event's fields, balanced flows, monotonic
    timestamps per thread."""
    evs = trace["traceEvents"]
    assert evs
    last = {}
    flows = defaultdict(Counter)
    for e in evs:
        assert {"ph", "name", "pid", "tid", "ts"} <= set(e), e
        assert isinstance(e["ts"], (int, float)) and e["ts"] >= 0
        if e["ph"] == "X":
            assert e["dur"] >= 0 and isinstance(e.get("args", {}), dict) and "cat" in e
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        elif e["ph"] in ("s", "f"):
            flows[e["id"]][e["ph"]] += 1
        elif e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and "name" in e["args"]
        else:
            raise AssertionError(f"unexpected phase {e['ph']}")
        if e["ph"] != "M":
            k = (e["pid"], e["tid"])
            assert e["ts"] >= last.get(k, 0), f"ts goes back on {k}"
            last[k] = e["ts"]
    assert all(c == Counter({"s": 1, "f": 1}) for c in flows.values()), flows
    json.dumps(trace)


def test_trace_of_a_compiled_training_step_is_valid_and_counts_every_kernel_call(tmp_path):
    loss_fn, params = _mlp()
    opt = tp.optim.AdamW(params, lr=1e-3)
    cf = tp.compile(loss_fn, strict_native=True)
    x, y = _batch()
    for _ in range(2):      # capture, then the compiled step (outside the profile)
        opt.zero_grad()
        cf(x, y).backward()
        opt.step()
    with profile(activities=CPU, record_shapes=True) as prof:
        for _ in range(3):
            with record_function("train step"):
                opt.zero_grad()
                loss = cf(x, y)
                loss.backward()
                opt.step()
    path = tmp_path / "trace.json.gz"
    prof.export_chrome_trace(path)
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    _check_trace_schema(trace)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    cats = Counter(e["cat"] for e in xs)
    assert cats["user"] == 3 and cats["optimizer"] == 3
    # the kernel spans are the wrapper's kernel calls: the kernel call lines of the forward and
    # backward wrappers, once per step
    from tensorplay.compiler.backends.stax import codecache
    calls = 0
    for mod in codecache._modules.values():
        names = set(getattr(mod, "kernel_costs", {}))
        if names and any(e["args"].get("graph") == mod.__name__ for e in xs):
            src = open(mod.__file__).read().split("def call(", 1)[1]
            calls += sum(len(re.findall(rf"\b{n}\(", src)) for n in names)
    kernel_spans = [e for e in xs if e["cat"] == "kernel"]
    assert calls > 0 and len(kernel_spans) == 3 * calls
    for e in kernel_spans:
        assert e["args"]["model_bytes"] > 0 and e["args"]["model_flops"] >= 0 and e["args"]["achieved_GBps"] > 0
    # the spans nest: every kernel span lies inside a user range on its thread
    users = [e for e in xs if e["cat"] == "user"]
    assert all(any(u["ts"] <= k["ts"] and k["ts"] + k["dur"] <= u["ts"] + u["dur"] + 1e-3 for u in users)
               for k in kernel_spans)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=5)
    assert "train step" in prof.key_averages().table() and len(table.splitlines()) == 5 + 5


def test_compile_phases_compiler_runs_and_cache_hits_are_spans():
    from tensorplay.compiler.backends.stax import codecache
    loss_fn, params = _mlp()
    x = tp.from_torch(torch.randn(13, 32))          # sizes no other test compiles: g++ runs
    y = tp.from_torch(torch.randint(0, 8, (13,)))
    with profile(activities=CPU) as prof:
        cf = tp.compile(loss_fn, strict_native=True)
        cf(x, y).backward()
        cf(x, y).backward()
    names = [s.name for s in prof.events() if s.cat == "compile"]
    for phase in ("capture", "pass simplify", "aot joint graph", "aot partition", "stax lowering",
                  "stax scheduling", "stax codegen", "compile forward graph", "compile backward graph",
                  "stax load wrapper"):
        assert any(n.startswith(phase) for n in names), (phase, sorted(set(names)))
    runs = [n for n in names if n.startswith("g++ kernel")]
    assert runs, "\n".join(sorted(set(names)))
    codecache.clear_memo()          # a new process: the graphs and kernels come from the disk cache
    with profile(activities=CPU) as prof:
        cf = tp.compile(loss_fn, strict_native=True)
        cf(x, y).backward()
        cf(x, y).backward()
    spans = [s for s in prof.events() if s.cat == "compile"]
    hits = [s for s in spans if s.name.startswith("cpp cache hit kernel")]
    assert any(s.name == "stax graph cache hit" for s in spans)
    assert len(hits) >= len(runs) and all(s.args["where"] in ("disk", "memory") for s in hits)
    assert not any(s.name.startswith("g++ ") for s in spans)      # (strict_native still lowers to check)


def test_eager_ops_backward_nodes_shapes_and_stack():
    a = tp.from_torch(torch.randn(4, 5)).requires_grad_()
    with profile(activities=CPU, record_shapes=True, with_stack=True) as prof:
        b = (a * 2).exp().sum()
        b.backward()
    ops = [s for s in prof.events() if s.cat == "op"]
    mul = next(s for s in ops if s.name == "mul")
    assert mul.args["input_shapes"][0] == [4, 5] and mul.args["input_dtypes"][0] == "torch.float32"
    assert mul.args["source"].startswith(__file__) and mul.dur > 0
    back = [s.name for s in prof.events() if s.cat == "backward"]
    assert "autograd::AccumulateGrad" in back and len(back) >= 4
    rows = {r["name"]: r for r in prof.key_averages()}
    assert rows["mul"]["count"] >= 1 and rows["exp"]["self"] <= rows["exp"]["total"]
    # one host thread: the critical path is the thread's whole recorded extent, every op on it
    cp = prof.critical_path()
    xs = [e for e in prof.trace()["traceEvents"] if e["ph"] == "X"]
    extent = max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)
    assert cp.total == pytest.approx(extent, abs=1e-3)
    first_mul = min((r for r in cp.rows.values() if r.name == "mul"), key=lambda r: r.activity.start)
    assert first_mul.on_path and first_mul.added == pytest.approx(mul.dur / 1e3, abs=1e-3)


def test_nothing_is_installed_outside_a_profile():
    from tensorplay.autograd import engine
    from tensorplay.compiler.backends import stax
    from tensorplay.ops import registry
    from tensorplay.profiler import hooks, recorder
    before = (list(registry.observers), list(registry.pre_observers))
    with profile(activities=CPU):
        assert hooks._before_op in registry.pre_observers and engine.node_hook is not None
        with pytest.raises(RuntimeError, match="already recording"):
            with profile(activities=CPU):
                pass
    assert (list(registry.observers), list(registry.pre_observers)) == before
    assert engine.node_hook is None and stax.on_wrapper_ready is None and recorder.active() is None
    assert recorder.span("x") is recorder.span("y")     # the shared do-nothing context


def test_schedule_records_the_active_steps_and_calls_on_trace_ready():
    sched = schedule(wait=1, warmup=1, active=2, repeat=1)
    assert [sched(i) for i in range(5)] == [ProfilerAction.NONE, ProfilerAction.WARMUP, ProfilerAction.RECORD,
                                            ProfilerAction.RECORD_AND_SAVE, ProfilerAction.NONE]
    ready = []
    x = tp.from_torch(torch.randn(3))
    with profile(activities=CPU, schedule=sched, on_trace_ready=lambda p: ready.append(
            [s.name for s in p.events() if s.cat == "user"])) as prof:
        for i in range(5):
            with record_function(f"step {i}"):
                x = x + 1
            prof.step()
    assert ready == [["step 2", "step 3"]]
    with pytest.raises(ValueError, match="active"):
        schedule(wait=0, warmup=0, active=0)


def test_memory_timeline_peak_equals_the_hand_computed_peak(tmp_path):
    """a (1 MiB) and b (2 MiB) live together, a is freed, c (4 MiB) joins b: the peak is b + c =
    6 MiB above what was live at the start, at c's allocation; the allocator's own running total
    agrees."""
    keep = tp.from_torch(torch.randn(1 << 16))          # persistent: 256 KiB before the profile
    mib = 1 << 18                                       # float32 elements in 1 MiB
    with profile(activities=CPU, profile_memory=True) as prof:
        a = tp.from_torch(torch.empty(mib).normal_())
        b = a.repeat(2)
        del a
        c = tp.from_torch(torch.empty(4 * mib).normal_())
        del b, c
    mt = prof.memory_timeline()
    peak, at = mt.peak()
    assert mt.persistent >= keep._data.nbytes
    assert peak - mt.persistent == 6 * 2 ** 20
    assert mt.allocator_peak["cpu"] == 6 * 2 ** 20       # the CPU allocator counts from the profile's start
    live = mt.live_at_peak()
    assert sorted(b.nbytes for b in live if b.start is not None) == [2 * 2 ** 20, 4 * 2 ** 20]
    assert any(b.allocated_by == "op: repeat" for b in live)
    prof.export_memory_timeline(tmp_path / "mem.png")
    d = json.loads((tmp_path / "mem.json").read_text())
    assert d["peak"]["bytes"] == peak and len(d["times_us"]) == len(d["series"]["temporary"])
    trace = prof.trace()
    _check_trace_schema(trace)
    assert any(e["ph"] == "C" for e in trace["traceEvents"])
    mpl = pytest.importorskip("matplotlib")
    img = mpl.image.imread(tmp_path / "mem.png")
    assert img.shape[0] > 100 and img.shape[1] > 100 and float(img.std()) > 0.01


def test_memory_categories_of_a_training_step():
    loss_fn, params = _mlp()
    opt = tp.optim.AdamW(params, lr=1e-3)
    x, y = _batch()
    opt.zero_grad()
    loss_fn(x, y).backward()
    opt.step()                     # parameters, gradients and optimizer state exist before the profile
    with profile(activities=CPU, profile_memory=True) as prof:
        for _ in range(2):
            opt.zero_grad()
            loss_fn(x, y).backward()
            opt.step()
    mt = prof.memory_timeline()

    def category(t):
        ptr = t._data.untyped_storage().data_ptr()
        return {b.category for b in mt.blocks if b.ptr == ptr and b.end is None}
    assert all(category(p) == {"parameter"} for p in params)
    assert all(category(p.grad) == {"gradient"} for p in params)      # (the last step's, allocated in it)
    assert all(category(v) == {"optimizer state"} for st in opt.state.values() for v in st.values()
               if isinstance(v, tp.Tensor) and v.numel() > 1)
    assert category(x) == {"input"}
    cats = Counter(b.category for b in mt.blocks if b.start is not None)
    assert cats["activation"] >= 2 and cats["temporary"] > 0 and cats["gradient"] >= 2 * len(params)


def test_roofline_fraction_with_machine_parameters():
    f = lambda x: (x * 2 + 1).sum(-1)  # noqa: E731
    cf = tp.compile(f, strict_native=True)
    x = tp.from_torch(torch.randn(256, 512))
    cf(x)
    cf(x)
    with profile(activities=CPU, machine={"bandwidth": 10e9, "peak": 100e9}) as prof:
        cf(x)
    k = [s for s in prof.events() if s.cat == "kernel"]
    assert len(k) == 1
    a = k[0].args
    assert a["model_bytes"] == 256 * 512 * 4 + 256 * 4
    expected = max(a["model_bytes"] / 10e9, a["model_flops"] / 100e9) / (k[0].dur * 1e-9)
    assert a["roofline_fraction"] == pytest.approx(expected, rel=1e-3)
