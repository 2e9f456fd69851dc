"""Prints the OpInfo report: how many of PyTorch's OpInfo entries tensorplay exposes, how many of
their samples agree with torch eagerly, compiled (``tp.compile``, second call judged) and in their
gradients, and the failures grouped by message.  The harness is ``test/compat/opinfo.py``.

    python tools/opinfo_report.py [--max-samples 8] [--no-compiled] [--grad-samples 2]
                                  [--entries abs,add,...] [--per-entry] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "compat"))

import opinfo  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-samples", type=int, default=8)
    ap.add_argument("--grad-samples", type=int, default=2)
    ap.add_argument("--no-compiled", action="store_true")
    ap.add_argument("--batch", type=int, default=24, help="entries per compiled program")
    ap.add_argument("--entries", default="", help="comma-separated entry names (default: all)")
    ap.add_argument("--per-entry", action="store_true", help="one line per exposed entry")
    ap.add_argument("--groups", type=int, default=40, help="failure groups to print per mode")
    ap.add_argument("--json", default="", help="write every entry's result to this file")
    a = ap.parse_args(argv)
    t0 = time.time()
    entries = [e for e in a.entries.split(",") if e] or None
    results = opinfo.run_all(entries, max_samples=a.max_samples, compiled=not a.no_compiled,
                             grad_samples=a.grad_samples, batch=a.batch)
    s = opinfo.summary(results)
    print(f"OpInfo entries: {s['entries']}   exposed in tensorplay: {s['exposed']}   "
          f"({time.time() - t0:.0f} s)")
    for mode in ("eager", "compiled", "grad"):
        p, t, r = s[mode]
        print(f"  {mode:9s} samples passing: {p}/{t} ({100 * r:.1f}%)")
    print(f"  entries with every eager sample passing: {s['entries_all_eager']}")
    if a.per_entry:
        print("\nentry                                      how                        eager   compiled  grad")
        for r in results:
            if r.exposed:
                print(f"{r.entry:42s} {r.how:26s} {r.eager_pass:3d}/{r.eager_total:<3d} "
                      f"{r.compiled_pass:3d}/{r.compiled_total:<3d} {r.grad_pass:2d}/{r.grad_total}")
    for mode in ("eager", "compiled", "grad"):
        groups = opinfo.failure_groups(results, mode)
        if not groups:
            continue
        print(f"\n{mode} failures by message ({sum(g[2] for g in groups)} samples, {len(groups)} groups):")
        for _, key, n, where in groups[:a.groups]:
            print(f"  {n:4d}  {key}\n        in: {', '.join(where[:8])}{' ...' if len(where) > 8 else ''}")
    not_exposed = [r.entry for r in results if not r.exposed]
    print(f"\nnot exposed ({len(not_exposed)}): {', '.join(not_exposed)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump([r.__dict__ for r in results], f, indent=1)
    return s


if __name__ == "__main__":
    main()
