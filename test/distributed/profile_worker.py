"""Run under ``python -m tensorplay.distributed.launch --nproc 2`` as ``profile_worker.py OUT``: each
rank profiles one shard_map'd step -- rank 0 works 10 ms, rank 1 150 ms, then one psum -- and exports
its trace to ``OUT/rank<r>.json`` (test_profile_ranks.py merges them: seed 001 §1's two devices)."""
import sys
import time
from pathlib import Path

import numpy as np

import tensorplay as tp
import tensorplay.distributed as D
from tensorplay.profiler import ProfilerActivity, profile, record_function

WORK_S = {0: 0.01, 1: 0.15}      # (far apart: the test reads the order, not the exact times)


def main():
    out = Path(sys.argv[1])
    D.init()
    mesh = D.Mesh(np.arange(2), ("Y",))
    x = tp.ones(1000)

    def body(v):
        with record_function("work"):
            time.sleep(WORK_S[D.axis_index("Y")])
        return D.psum(v, "Y")
    step = D.shard_map(body, mesh, D.P(), D.P())
    step(x)                         # warm: the sub-groups exist before the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = step(x)
    assert float(y.local().sum()) == 2000.0
    prof.export_chrome_trace(out / f"rank{D.rank()}.json")
    D.shutdown()


if __name__ == "__main__":
    main()
