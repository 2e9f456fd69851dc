"""Experiment 1 (1)-(2) of the chapter: the measured roofline of this machine, and the cases of
tables 13.1/13.2 (``tensorplay.experiments.cases``) placed on it -- tp compiled against torch
eager only.  ``python -m tensorplay.experiments.roofline`` runs the whole experiment (every figure,
the speed-up decomposition, the size sweep, a JSON); this script is its roofline part alone.

* **B**, the main-memory read bandwidth (``tensorplay.utils.machine``): the row sum of a 64 MiB
  tensor with the last-level cache evicted before each reading, ``--rounds`` rounds of 7 readings
  at the start and one round after every case, B = bytes / (the smallest round median).  **P**,
  the compute peak: ``--n`` x ``--n`` float32 matrix products (torch eager), P = 2 n^3 / (the
  fastest reading).  Capability parameters take the best over repetitions (chapter §13.1,
  Prop. 13.1): noise only ever slows a reading down.
* The ridge point P / B (FLOP/byte): a kernel of lower arithmetic intensity is bound by memory.
* For every case: FLOPs (``compiler.cost``: one per output element of a pointwise op, one per
  input element of a reduction), the model bytes of the compiled call (inputs + outputs + what
  Stax writes and reads back), the intensity I = FLOPs / bytes, the roofline's attainable rate
  min(P, I * B) and time max(FLOPs / P, bytes / B), and the measured median of ``tp compiled``
  (interleaved with torch eager): achieved GFLOP/s, and the roofline time as a fraction of the
  measured one (1.0 = on the roof; ``utils.machine.roofline_point``).

    python benchmarks/roofline.py [--quick] [--cases ex1.1,ex7.2] [--repeats 7] [--rounds 3]
                                  [--n 2048] [--steady] [--plot roofline.png]

``--quick`` inputs (4 MiB) fit in the last-level cache, so the memory roof does not apply to them.
Outputs are fresh on every call: a 64 MiB output costs page faults, part of the measured time
(``--steady`` removes them, as for table13.py).

``--plot`` draws the roof and the cases with matplotlib when it is installed (not required).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from size_sweep import reexec_steady  # noqa: E402
from tensorplay.experiments.cases import SIZES, cases, select  # noqa: E402
from tensorplay.experiments.roofline import measure_cases, roofline_rows  # noqa: E402
from tensorplay.utils.benchmark import format_table, machine_description  # noqa: E402
from tensorplay.utils.machine import measure_machine  # noqa: E402
from tensorplay.utils.plots import roofline_plot  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="1/16 of table13's sizes")
    p.add_argument("--cases", default="")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--n", type=int, default=2048)
    p.add_argument("--plot", default="")
    p.add_argument("--steady", action="store_true", help="no page faults on fresh outputs (as table13.py --steady)")
    a = p.parse_args(argv)
    if a.steady:
        reexec_steady()
    print(f"machine: {machine_description()}")
    m = measure_machine(rounds=a.rounds, n=a.n)      # and one more B round after every case
    s = 4 if a.quick else 1
    table = select(cases(*(n // s for n in SIZES["cpu"])), a.cases)
    results = measure_cases(table, m, repeats=a.repeats, warmup=2, torch_compile=False, eager=False)
    print(m.summary() + "\n")
    rows, headers = roofline_rows(results)
    print(format_table(rows, headers))
    if a.plot:
        roofline_plot(a.plot, m.B, m.P, [dict(name=r["case"], **r["roofline"]) for r in results])
    return rows


if __name__ == "__main__":
    main()
