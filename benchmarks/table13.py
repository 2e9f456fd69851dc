"""Reproduce tables 13.1 and 13.2 of the chapter on this machine (issue: Stax on CPU).

Cases (``tensorplay.experiments.cases``; 8192 x 2048 float32 = 64 MiB; the softmax rows are 16384 x 1000):

  table 13.1 (fusion): ex 1.1 (relu(x + w) * 2).sum(-1); ex 7.1 x / x.sum(-1, keepdim=True);
                       five-op softmax; F.softmax; ex 7.2 exp -> sum and amax; LayerNorm -> GELU -> x0.5
  table 13.2 (single ops): exp, x + 1, relu, row sum, row amax
  (on a GPU, ``--device cuda``: 32768 x 2048 = 256 MiB and softmax rows of 65536 x 1000; see below)

Per case, four variants are timed interleaved in one run (§13.1): tp eager, tp compiled
(``tp.compile(strict_native=True)``: Stax kernels only, no fallback), torch eager and
``torch.compile``.  Reported: median [95% CI of the median, Prop. 13.2], S = t(tp eager)/t(compiled),
S vs torch.compile, the model byte ratio rho (§1.1 counting, the compiled bytes taken from the
artifact's cost analysis), the effective bandwidths beta_e, beta_c (Def. 13.2) and beta_c as a
fraction of the measured read bandwidth B; and the paired ratios vs torch eager / torch.compile,
the median [95% CI] of the per-round ratios (readings of a round are adjacent in time, so the
host's drift during the run cancels; ``utils.benchmark.paired_ratio``).  B is measured as in §13 of the chapter: the row sum
of a 64 MiB tensor (torch eager), one round of 7 readings before every case and one after the last,
and B = bytes / (the smallest round median) -- a capability parameter takes the minimum over
repetitions (Prop. 13.1), each repetition summarised by its median like the cases themselves.
Each reading of B starts with the last-level cache evicted (``tensorplay.utils.machine.bandwidth_round``,
which also holds the GPU's probes): B is the
main-memory read bandwidth the 64-128 MiB cases are bound by, not a rate the LLC partly serves.
``beta_c/B in-round`` goes further, for ex 1.1 (the target's case; inputs of more than twice the
LLC, which the eviction before B's probe cannot disturb): B's probe (an evicted-cache row sum of
64 MiB) is one more variant of the case's own shuffled rounds, and each round gives beta_c / B from
its two readings; the column is their median [95% CI].  ``beta_c/B adj`` divides by the better of the two rounds taken just before and just after the case
instead: the host's bandwidth moves by up to 2x during a run (round medians of 24-46 GB/s), and a
case timed in a slow stretch is then compared with the bandwidth of that stretch.

Fairness of the readings (2026-11-30): all four variants read the *same* input tensors (tp's are
zero-copy views of torch's; two copies of one 64 MiB tensor differed by up to 20 % in the read
speed of the same ATen kernel on this VM), and each round runs the variants in a fresh random
order (``utils.benchmark.compare``), so no variant always inherits the cache state of one
predecessor (in a fixed order, ATen's row sum read 2.46 ms in one place and 2.00 ms in another).
(Until 2026-11-30 B was the minimum single reading of one burst before the table, and then the
back-to-back median, which the 32 MiB LLC served in part: round medians of 32-71 GB/s in one run.)
Outputs are allocated fresh on every call by every variant (that is what a caller
sees); a fresh 64 MiB output costs page faults on Linux, which the table reports as part of the
time.  ``--steady`` re-runs the same table in the steady state of a long-running program: glibc is
told to keep freed memory (``MALLOC_MMAP_MAX_=0``, a large ``MALLOC_TRIM_THRESHOLD_``), so a fresh
output reuses pages that are already mapped and the page faults disappear for every variant alike.

``--device cuda`` runs the same table on a GPU, with inputs made on the device: 32768 x 2048 float32
(256 MiB) for the cases of 8192 x 2048 on the CPU, softmax rows 65536 x 1000; ``--quick`` divides
both dimensions by 4 there too.  Every reading includes the device's work: CUDA events on the
current stream around the call, after a synchronisation (``utils.benchmark.cuda_time_fn``, which
``compare(device=...)`` uses).  B is the device's read bandwidth, the row sum of a 1 GiB tensor
(at least 16x the L2, 60 MB on an H200: no eviction is needed or done, the inputs are simply large),
min over round medians as on the CPU, and beside it the device-to-device copy bandwidth of
``y.copy_(x)`` on 1 GiB, counting the bytes read and written; ``beta_c/copy`` gives beta_c as a
fraction of it (the GPU target: beta_c >= 85 % of the measured copy bandwidth).  B's probe joins the
rounds of every case whose inputs exceed twice the L2 (all of them at the full sizes).  A case that
``tp.compile(strict_native=True)`` cannot compile (on a GPU, the Triton backend may raise
StaxStrictError) is reported with its error and the others go on; its tp-compiled cells read
"n/a".  ``--steady`` is for the CPU only (device outputs come from PyTorch's caching allocator,
which keeps freed memory anyway).  ``--json PATH`` also writes the table's numbers (per case: the
variants' readings, medians and CIs in ms, the ratios, bandwidths in GB/s; and the bandwidth
rounds) to PATH.

    python benchmarks/table13.py [--repeats 15] [--quick] [--steady] [--no-torch-compile] [--cases ex1.1,ex7.1]
                                 [--device cpu|cuda] [--json PATH] [--number N]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

import tensorplay as tp
from tensorplay.compiler.cost import compiled_cost_analysis
from tensorplay.experiments.cases import SIZES, cases
from tensorplay.utils.benchmark import (Stats, compare, cuda_l2_bytes, format_table, json_safe, machine_description,
                                       paired_ratio, speedup_decomposition, synchronize, torch_variants)
from tensorplay.utils.machine import (bandwidth_round, cuda_bandwidth_round, cuda_probe_tensors, evict_caches,
                                      last_level_cache_bytes, probe_tensor)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="1/16 of the sizes (smoke test)")
    p.add_argument("--no-torch-compile", action="store_true")
    p.add_argument("--cases", default="")
    p.add_argument("--steady", action="store_true",
                   help="steady state: freed memory stays mapped (glibc settings), no page faults on outputs")
    p.add_argument("--device", default="cpu", choices=sorted(SIZES),
                   help="where the inputs live and every variant runs (cuda: larger sizes, CUDA-event timing)")
    p.add_argument("--json", metavar="PATH", help="also write the table's numbers to PATH as JSON")
    p.add_argument("--number", type=int, default=1,
                   help="calls per reading, back to back (cuda: device time per call without the fixed latency "
                        "of one launch after a synchronisation)")
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and a.steady:
        p.error("--steady is for the CPU: on cuda, outputs come from PyTorch's caching allocator")
    if cuda and not torch.cuda.is_available():
        p.error("--device cuda: torch.cuda.is_available() is False")
    if a.steady and os.environ.get("MALLOC_MMAP_MAX_") != "0":
        # glibc reads these at start-up only: re-execute this script with them set
        env = dict(os.environ, MALLOC_MMAP_MAX_="0", MALLOC_TRIM_THRESHOLD_=str(1 << 40))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    scale = 4 if a.quick else 1
    table = cases(*(n // scale for n in SIZES[a.device]))
    if a.cases:
        want = [c.strip() for c in a.cases.split(",")]
        table = {k: v for k, v in table.items() if any(k.startswith(w) for w in want)}
    rounds = []   # bandwidth rounds, one before every case and one at the end
    probe_round = (lambda: cuda_bandwidth_round(number=a.number)) if cuda else bandwidth_round
    cache = cuda_l2_bytes() if cuda else last_level_cache_bytes()
    print(f"machine: {machine_description(a.device)}")
    print("allocation: " + ("device outputs from PyTorch's CUDA caching allocator (freed blocks are reused)" if cuda
                            else "steady state (freed memory stays mapped: MALLOC_MMAP_MAX_=0)" if a.steady else
                            "fresh outputs (default glibc policy: large buffers are mmap-ed and page-faulted)"))
    print(f"{a.repeats} interleaved readings after {a.warmup} warm-up calls; times in ms, median [95% CI]"
          + (f"; every reading timed by CUDA events around {a.number} call(s) back to back, after a synchronisation"
             if cuda else "") + "\n")
    results = []
    g = torch.Generator(device=a.device).manual_seed(0)
    for name, (fn, shapes, eager_elems) in table.items():
        rounds.append(probe_round())
        tins = [torch.randn(s, generator=g, device=a.device) for s in shapes]
        # zero-copy: every variant reads the same memory.  Two copies of one tensor can differ in
        # read speed by 20 % on this VM (the same ATen row sum: 2.18-2.68 ms over six 64 MiB buffers)
        pins = [tp.from_torch(t) for t in tins]

        def f_tp(*xs, _fn=fn):
            return _fn(*xs, tp)

        def f_torch(*xs, _fn=fn):
            return _fn(*xs, torch)
        cf, compile_s, comp_bytes, error = _compile(f_tp, pins, a.device)
        if error:
            print(f"{name}: tp.compile(strict_native=True) failed on {a.device} (its tp-compiled cells: n/a): {error}")
        # (torch_variants resets dynamo: one f_torch per case never meets its recompile limit)
        variants = {"tp eager": lambda: f_tp(*pins)}
        if cf is not None:
            variants["tp compiled"] = lambda _cf=cf: _cf(*pins)
        variants.update(torch_variants(f_torch, *tins, torch_compile=not a.no_torch_compile))
        # B's probe in the case's own rounds, where the LLC eviction before it cannot change the
        # other readings: inputs of more than twice the LLC (ex 1.1) never stay in it anyway.  (On a
        # GPU nothing is evicted, and inputs of more than twice the L2 are every case's at full size.)
        bw_x = cuda_probe_tensors()[0] if cuda else probe_tensor()
        probe = bool(comp_bytes) and sum(t.numel() * t.element_size() for t in tins) > 2 * cache
        if probe:
            variants["B probe"] = lambda: bw_x.sum(-1)
        r = compare(variants, repeats=a.repeats, warmup=a.warmup, before=None if cuda else {"B probe": evict_caches},
                    device=a.device, number=a.number)
        results.append(_case_result(name, shapes, r, eager_elems * 4, comp_bytes, compile_s, error,
                                    bw_x.numel() * 4 if probe else None))
        del cf, variants
    rounds.append(probe_round())
    first = [c for c, _ in rounds]      # B's rounds (the CPU's cold readings; the GPU's row sums)
    second = [w for _, w in rounds]     # CPU: back-to-back readings; GPU: the copy bandwidth
    B = max(first)
    if cuda:
        copy_bw = max(second)
        mib = cuda_probe_tensors()[0].numel() * 4 / 2 ** 20
        print(f"measured read bandwidth B = {B / 1e9:.1f} GB/s (device memory: row sum of {mib:.0f} MiB, "
              f"{mib * 2 ** 20 / cache:.0f}x the L2, no eviction; the smallest median of {len(rounds)} rounds of "
              f"7 readings spread over the run; round medians {min(first) / 1e9:.1f}-{B / 1e9:.1f} GB/s)")
        print(f"measured copy bandwidth = {copy_bw / 1e9:.1f} GB/s (device to device, y.copy_(x) of {mib:.0f} MiB "
              f"counting the bytes read and written; the smallest median of {len(rounds)} rounds; round medians "
              f"{min(second) / 1e9:.1f}-{copy_bw / 1e9:.1f} GB/s)\n")
    else:
        copy_bw = None
        print(f"measured read bandwidth B = {B / 1e9:.1f} GB/s (main memory: row sum of 64 MiB with the "
              f"last-level cache evicted before each reading; the smallest median of {len(rounds)} rounds of "
              f"7 readings spread over the run; round medians {min(first) / 1e9:.1f}-{B / 1e9:.1f} GB/s)")
        print(f"  back-to-back readings of the same 64 MiB, partly served by the LLC (not used for B): "
              f"round medians {min(second) / 1e9:.1f}-{max(second) / 1e9:.1f} GB/s\n")
    # B adj: the better of the two rounds measured just before and just after the case (the host's
    # bandwidth moves during a run; B itself is the best round of the whole run)
    for i, res in enumerate(results):
        bc = (res["beta_c_GBps"] or 0) * 1e9     # 0: tp compiled did not run (or had no cost analysis)
        res["beta_c_over_B"] = bc / B if bc else None
        res["beta_c_over_B_adj"] = bc / max(first[i], first[i + 1]) if bc else None
        if cuda:
            res["beta_c_over_copy"] = bc / copy_bw if bc else None
    headers = ["case", "tp eager", "tp compiled", "torch eager", "torch.compile", "S", "vs torch eager",
               "vs torch.compile", "rho", "beta_e GB/s", "beta_c GB/s", "beta_c/B", "beta_c/B adj", "compile s",
               "paired vs torch eager", "paired vs torch.compile", "beta_c/B in-round"]
    if cuda:
        headers.insert(headers.index("beta_c/B adj") + 1, "beta_c/copy")
    rows = [_row(res, cuda) for res in results]
    print(format_table(rows, headers))
    print("\nS = t(tp eager)/t(tp compiled); 'vs X' = t(X)/t(tp compiled) (> 1: Stax is faster); "
          "rho = model bytes eager / compiled; beta = model bytes / median time; 'paired vs X' = median "
          "[95% CI] of the per-round ratios t(X)/t(tp compiled) (readings of a round are adjacent in time); "
          "'beta_c/B adj': B of the rounds just before and after the case; "
          + ("'beta_c/copy': beta_c / the measured copy bandwidth; " if cuda else "")
          + "'beta_c/B in-round': median [95% CI] "
          "over the rounds of beta_c / B with B's probe read in the same round as tp compiled.")
    failed = [res for res in results if res["error"]]
    if failed:
        print("\nn/a: tp.compile(strict_native=True) failed for " + "; ".join(
            f"{res['case']} ({res['error'].splitlines()[0][:200]})" for res in failed))
    if a.json:
        bw = {"B_GBps": B / 1e9, "read_round_medians_GBps": [x / 1e9 for x in first]}
        if cuda:
            bw.update(copy_GBps=copy_bw / 1e9, copy_round_medians_GBps=[x / 1e9 for x in second],
                      probe_bytes=cuda_probe_tensors()[0].numel() * 4)
        else:
            bw.update(back_to_back_round_medians_GBps=[x / 1e9 for x in second], probe_bytes=probe_tensor().numel() * 4)
        doc = {"machine": machine_description(a.device), "device": a.device, "repeats": a.repeats,
               "warmup": a.warmup, "number": a.number, "quick": a.quick, "steady": a.steady, "torch_compile": not a.no_torch_compile,
               "sizes": dict(zip(("R", "C", "SR", "SC"), (n // scale for n in SIZES[a.device]))),
               "times": "ms", "bandwidth": bw, "cases": results}
        with open(a.json, "w") as f:
            json.dump(json_safe(doc), f, indent=1, allow_nan=False)
            f.write("\n")
        print(f"\nwrote {a.json}")
    return rows


def _compile(f_tp, pins, device):
    """``tp.compile(f_tp, strict_native=True)``, called once on ``pins`` (its compilation):
    (compiled function, seconds, model bytes of its program or None where the cost analysis fails,
    None), or (None, None, None, the error as text) when it cannot compile (the GPU backend may raise
    StaxStrictError for some case)."""
    t0 = time.perf_counter()
    try:
        cf = tp.compile(f_tp, strict_native=True)
        cf(*pins)
        synchronize(device)
    except Exception as e:  # noqa: BLE001 -- any failure: report it and go on with the other cases
        return None, None, None, f"{type(e).__name__}: {e}"
    compile_s = time.perf_counter() - t0
    try:
        comp_bytes = compiled_cost_analysis(cf)["bytes_accessed"]
    except Exception as e:  # noqa: BLE001 -- the timings stand without the model's bytes
        print(f"  (no cost analysis of the compiled program: {type(e).__name__}: {e}; rho and beta_c: n/a)")
        comp_bytes = None
    return cf, compile_s, comp_bytes, None


def _case_result(name, shapes, r, eager_bytes, comp_bytes, compile_s, error, probe_bytes):
    """The numbers of one case (a JSON-able dict; times in ms, bandwidths in GB/s; None for what the
    case lacks) from the ``compare`` result ``r``; ``beta_c_over_B*`` are filled in once B is known."""
    te = r["tp eager"].median
    tc = r["tp compiled"].median if "tp compiled" in r else None

    def paired(k):
        if tc is None or k not in r:
            return None
        return dict(zip(("median", "lo", "hi"), paired_ratio(r, k, "tp compiled")))
    dec = speedup_decomposition(te, tc, eager_bytes, comp_bytes) if tc is not None and comp_bytes else None
    frac = None
    if probe_bytes:   # beta_c / B per round: (comp_bytes / t_c) / (probe bytes / t_probe), both read in one round
        fs = Stats("beta_c/B", [comp_bytes / t_c * t_b / probe_bytes
                                for t_c, t_b in zip(r["tp compiled"].times, r["B probe"].times)])
        frac = {"median": fs.median, "lo": fs.ci[0], "hi": fs.ci[1]}
    return {"case": name, "shapes": [list(s) for s in shapes], "error": error,
            "variants": {k: s.as_dict() for k, s in r.items()},
            "S": te / tc if tc else None,
            "vs_torch_eager": r["torch eager"].median / tc if tc else None,
            "vs_torch_compile": (r["torch.compile"].median / tc if "torch.compile" in r else float("nan")) if tc else None,
            "paired_vs_torch_eager": paired("torch eager"), "paired_vs_torch_compile": paired("torch.compile"),
            "rho": dec["rho"] if dec else None, "bytes_eager": eager_bytes, "bytes_compiled": comp_bytes,
            "beta_e_GBps": eager_bytes / te / 1e9, "beta_c_GBps": dec["beta_c"] / 1e9 if dec else None,
            "compile_s": compile_s, "beta_c_over_B_in_round": frac}


def _row(res, cuda):
    """A table row of ``_case_result``'s dict: the CPU's columns (and on a GPU beta_c/copy after
    beta_c/B adj), in the formats the table has always had; "n/a" where tp compiled failed."""
    na = "n/a"
    v = res["variants"]

    def ms(k):
        if k not in v:
            return "-" if k == "torch.compile" else na
        d = v[k]
        return f"{d['median']:.2f} [{d['ci'][0]:.2f}, {d['ci'][1]:.2f}]"

    def num(x, fmt):
        return na if x is None else format(x, fmt)

    def ci(d, fmt):
        return "-" if d is None else f"{d['median']:{fmt}} [{d['lo']:{fmt}}, {d['hi']:{fmt}}]"
    ok = res["error"] is None
    row = [res["case"], ms("tp eager"), ms("tp compiled"), ms("torch eager"), ms("torch.compile"),
           num(res["S"], ".2f"), num(res["vs_torch_eager"], ".2f"), num(res["vs_torch_compile"], ".2f"),
           num(res["rho"], ".2f"), f"{res['beta_e_GBps']:.1f}", num(res["beta_c_GBps"], ".1f"),
           num(res["beta_c_over_B"], ".0%"), num(res["beta_c_over_B_adj"], ".0%"), num(res["compile_s"], ".1f"),
           ci(res["paired_vs_torch_eager"], ".2f") if ok else na, ci(res["paired_vs_torch_compile"], ".2f") if ok else na,
           ci(res["beta_c_over_B_in_round"], ".0%") if ok else na]
    if cuda:
        row.insert(13, num(res["beta_c_over_copy"], ".0%"))   # after beta_c/B adj
    return tuple(row)


if __name__ == "__main__":
    main()
