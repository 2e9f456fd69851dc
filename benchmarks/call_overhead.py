"""Per-call overhead of a compiled 2-op function on 8 elements (issue: front end; seed §13.4).

Variants, interleaved in one run (§13.1): tp eager; tp.compile via the first-level entry (same
tensor objects each call, §2.4); tp.compile with fresh tensors each call (key + guards); torch
eager; torch.compile (same tensors).  Target: first-level entry ≤ 5 µs.

With the Stax backend the same variants also run with ``options={"stax.cpp_wrapper": True}`` (one
C++ entry per graph, cpp/wrapper.py), and the generated modules' ``call(args)`` is timed
directly for both wrappers ("wrapper only": guard checks, allocation, the foreign call(s), no
front end).  Ratios are paired: reading i of a variant over reading i of the reference variant
(interleaved, so both saw the same machine), median [95% CI] over the readings.

``--mechanisms`` times only the foreign call of the C++ wrapper's entry (two data pointers), by
each way of making it: the call extension (what the wrapper uses), ctypes building the pointer
array per call, ctypes filling a preallocated array, ctypes with the pointers as two ``c_void_p``
arguments wrapped per call (what the Python wrapper did per kernel until 2026-11-30; it now calls
each kernel's pointer-array entry through the extension too).

``--cold`` times one call per reading, each after a pass over four times the last-level cache:
what a call finds after a kernel that streamed a large tensor (docs/stax.md "Call overhead with
cold caches").

``--device cuda`` runs the same variants on 8 float32 on a GPU (no C++ wrapper variants there, no
``--mechanisms``): every reading includes the device's work (CUDA events around the ``--number``
calls, after a synchronisation: ``utils.benchmark.cuda_time_fn``), and ``--cold`` evicts the L2
instead (an untimed pass over a device buffer of 4x the L2, at least 256 MiB).

    python benchmarks/call_overhead.py [--number 20000] [--repeats 15] [--backend eager] [--mechanisms] [--cold]
                                       [--device cpu|cuda]
"""
from __future__ import annotations

import argparse

import torch

import tensorplay as tp
from tensorplay.utils.benchmark import compare, cuda_l2_bytes, format_table, machine_description


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--number", type=int, default=20000)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--backend", default="stax")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--mechanisms", action="store_true", help="time only the ways of calling a C++ entry")
    p.add_argument("--cold", action="store_true",
                   help="one call per reading, each after a pass over 4x the last-level cache (what a call "
                        "finds after a kernel that streamed a large tensor)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where the 8 elements live (cuda: CUDA-event timing, the L2 evicted for --cold)")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and a.mechanisms:
        p.error("--mechanisms times the CPU's C++ entry: not with --device cuda")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False")
    if a.mechanisms:
        return call_mechanisms(a.repeats, a.number)

    def f(x):
        return x * 2 + 1

    xt = torch.randn(8, device=a.device)
    x = tp.from_torch(xt.clone())
    fresh = [tp.from_torch(torch.randn(8, device=a.device)) for _ in range(64)]
    cf = tp.compile(f, backend=a.backend)
    fns = {"tp eager": lambda: f(x), "tp.compile first-level": lambda: cf(x),
           "tp.compile fresh tensors": _fresh_caller(tp.compile(f, backend=a.backend), x, fresh),
           "torch eager": lambda: f(xt)}
    cf(x)
    if a.backend == "stax" and not cuda:
        fns.update(_cpp_wrapper_variants(f, cf, x, fresh))
    if cuda:      # CUDA graphs: the call replays the captured kernels (its input copied in)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            cg = tp.compile(f, backend=a.backend, mode="reduce-overhead")
        for _ in range(3):
            cg(x)
        fns["tp.compile reduce-overhead"] = lambda: cg(x)
    if not a.no_torch_compile:
        try:
            tc = torch.compile(f)
            tc(xt)
            fns["torch.compile"] = lambda: tc(xt)
            if cuda:
                tcg = torch.compile(f, mode="reduce-overhead")
                for _ in range(3):
                    tcg(xt)
                fns["torch.compile reduce-overhead"] = lambda: tcg(xt)
        except Exception as e:  # noqa: BLE001
            print(f"torch.compile unavailable: {e}")
    if a.cold:
        if cuda:    # the L2: a device buffer of 4x its size (60 MB on an H200), at least 256 MiB
            evict = torch.randn(max(4 * cuda_l2_bytes(), 256 << 20) // 4, device="cuda")
            before = evict.sum
        else:
            from tensorplay.utils.machine import evict_caches as before
        r = compare(fns, repeats=a.repeats, number=1, warmup=100, before=before, device=a.device)
    else:
        r = compare(fns, repeats=a.repeats, number=a.number, warmup=100, device=a.device)
    rows = []
    for k, s in r.items():
        lo, hi, _ = s.ci
        rows.append((k, f"{s.median * 1e6:.2f}", f"[{lo * 1e6:.2f}, {hi * 1e6:.2f}]", f"{s.min * 1e6:.2f}"))
    print(f"machine: {machine_description(a.device)}")
    print(f"f(x) = x * 2 + 1 on 8 float32{' on cuda' if cuda else ''}; {a.repeats} interleaved readings x "
          + (("1 call after evicting the L2" if cuda else "1 call after evicting the last-level cache") if a.cold
             else f"{a.number} calls") + ("; each reading timed by CUDA events, device work included" if cuda else "")
          + "; µs per call\n")
    print(format_table(rows, ["variant", "median", "95% CI", "min"]))
    for ref, others in (("tp.compile first-level", ("C++ wrapper first-level", "torch eager", "torch.compile")),
                        ("tp.compile reduce-overhead", ("torch.compile reduce-overhead", "torch eager")),
                        ("Python wrapper only", ("C++ wrapper only",))):
        if ref in r:
            print(f"\npaired ratios to {ref!r} (median [95% CI]):")
            for k in others:
                if k in r:
                    lo, med, hi = paired_ratio(r[k].times, r[ref].times)
                    print(f"  {k}: {med:.3f} [{lo:.3f}, {hi:.3f}]")
    print(f"\ncounters: {cf.counters}")
    return r


def call_mechanisms(repeats, number):
    """ns per foreign call of one C++ entry with two data pointers, interleaved."""
    import ctypes

    from tensorplay.compiler.backends.stax.cpp.call import load_call_extension
    x = tp.from_torch(torch.randn(8))
    cc = tp.compile(lambda x: x * 2 + 1, options={"stax.cpp_wrapper": True})
    cc(x)
    cc(x)
    mod = cc._cache[0].artifact.module
    ext, addr = load_call_extension(), mod._entry0
    if ext is None:
        raise SystemExit("the call extension is not available")
    src, out = x._data, torch.empty(8)
    p0, p1 = src.data_ptr(), out.data_ptr()
    fn = getattr(mod.graph_lib, "stax_entry0")
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    cp = tp.compile(lambda x: x * 2 + 1)   # the Python wrapper's kernel0: data pointers as ints
    cp(x)
    cp(x)
    fn_py = cp._cache[0].artifact.module.kernel0
    from tensorplay.compiler.backends.stax.cpp.async_compile import AsyncCompile
    fn2 = AsyncCompile().cpp('extern "C" void kx(const float* __restrict__ x, float* __restrict__ y) '
                             '{ for (int i = 0; i < 8; ++i) y[i] = x[i] * 2.0f + 1.0f; }', "kx").result()
    Arr = ctypes.c_void_p * 2
    arr = Arr()

    def prealloc():
        arr[0] = p0
        arr[1] = p1
        fn(arr)
    fns = {"extension call(entry, p0, p1)": lambda: ext(addr, p0, p1),
           "ctypes, array built per call": lambda: fn(Arr(p0, p1)),
           "ctypes, preallocated array": prealloc,
           "Python wrapper's kernel0(p0, p1) (extension)": lambda: fn_py(p0, p1),
           "ctypes kernel, two c_void_p per call": lambda: fn2(ctypes.c_void_p(p0), ctypes.c_void_p(p1)),
           "two data_ptr() calls (for scale)": lambda: (src.data_ptr(), out.data_ptr())}
    r = compare(fns, repeats=repeats, number=number, warmup=100)
    rows = [(k, f"{s.median * 1e9:.0f}", f"[{s.ci[0] * 1e9:.0f}, {s.ci[1] * 1e9:.0f}]") for k, s in r.items()]
    print(f"machine: {machine_description()}")
    print(f"one foreign call of a C++ entry, 2 data pointers; {repeats} interleaved readings x {number}; ns\n")
    print(format_table(rows, ["mechanism", "median", "95% CI"]))
    assert torch.equal(out, src * 2 + 1)
    return r


def _fresh_caller(cf, x, fresh):
    """Compile ``cf`` for x (first call) and return a call with a different fresh tensor each time.
    ``cf`` must be a compiled function of its own: its calls replace its first-level entry, which
    would make the first-level variant of the same function miss."""
    cf(x)
    cf(fresh[0])
    it = [0]

    def fresh_call():
        it[0] = (it[0] + 1) & 63
        return cf(fresh[it[0]])
    return fresh_call


def paired_ratio(xs, ys):
    """(lo, median, hi) of the per-reading ratios x_i / y_i (Prop. 13.2 interval)."""
    from tensorplay.utils.benchmark import median_ci
    rs = sorted(x / y for x, y in zip(xs, ys))
    n = len(rs)
    med = rs[n // 2] if n % 2 else 0.5 * (rs[n // 2 - 1] + rs[n // 2])
    lo, hi, _ = median_ci(rs)
    return lo, med, hi


def _cpp_wrapper_variants(f, cf, x, fresh):
    """The C++-wrapper variants, and both generated modules' ``call`` timed directly."""
    cc = tp.compile(f, options={"stax.cpp_wrapper": True})
    cc(x)
    fresh_call = _fresh_caller(tp.compile(f, options={"stax.cpp_wrapper": True}), x, fresh)
    py_call = cf._cache[0].artifact.module.call
    cpp_call = cc._cache[0].artifact.module.call
    assert "stax_entry0" in cc._cache[0].artifact.source, "the C++ wrapper was not used"
    data = x._data
    return {"C++ wrapper first-level": lambda: cc(x), "C++ wrapper fresh tensors": fresh_call,
            "Python wrapper only": lambda: py_call([data]), "C++ wrapper only": lambda: cpp_call([data])}


if __name__ == "__main__":
    main()
