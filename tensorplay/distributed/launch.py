"""The launcher: ``python -m tensorplay.distributed.launch --nproc N script.py [args]`` starts the
processes that are a mesh's devices (seed 001 §4 assumes them).

It starts N copies of the script on this machine, one per device, with the variables ``torchrun``
sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``), so a script runs the same under either; in the script,
``tp.distributed.init()`` joins the process group (runtime.py).

Guarantees:

* the launcher returns 0 when every worker does, else the first non-zero exit status it sees, and
  then stops the other workers (the processes it started, by their ids);
* with ``--timeout S`` it stops every worker after S seconds and returns 124: a hung collective
  ends instead of waiting forever;
* ``--port 0`` (the default) picks a free port.

This module is not imported by ``tensorplay.distributed`` (``python -m`` runs it as the main module).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

from ..compiler import config
from .runtime import free_port

__all__ = ["main"]


def _stop(procs, grace=5.0):
    for p in procs:
        if p.poll() is None:
            p.terminate()
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorplay.distributed.launch",
                                 description="Run N local processes of one SPMD script (gloo on CPU, NCCL with "
                                             "one GPU per process).")
    ap.add_argument("--nproc", type=int, required=True, help="number of processes (= devices of the mesh)")
    ap.add_argument("--port", type=int, default=0, help="rendezvous port (0: a free one)")
    ap.add_argument("--timeout", type=float, default=None, help="stop every worker after this many seconds (exit 124)")
    ap.add_argument("script", help="the Python script every process runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    a = ap.parse_args(argv)
    if a.nproc < 1:
        ap.error("--nproc must be at least 1")
    port = a.port or free_port()
    procs = []
    for r in range(a.nproc):
        env = config.child_environment(RANK=r, WORLD_SIZE=a.nproc, LOCAL_RANK=r, LOCAL_WORLD_SIZE=a.nproc,
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, a.script, *a.args], env=env))
    deadline = None if a.timeout is None else time.monotonic() + a.timeout
    try:
        while True:
            codes = [p.poll() for p in procs]
            bad = [c for c in codes if c not in (None, 0)]
            if bad:
                _stop(procs)
                return bad[0]
            if all(c == 0 for c in codes):
                return 0
            if deadline is not None and time.monotonic() > deadline:
                print(f"tensorplay.distributed.launch: timeout after {a.timeout:g} s; stopping the workers",
                      file=sys.stderr)
                _stop(procs)
                return 124
            time.sleep(0.05)
    except KeyboardInterrupt:
        _stop(procs)
        return 130


if __name__ == "__main__":
    sys.exit(main())
