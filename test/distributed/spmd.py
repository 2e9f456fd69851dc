"""Starting multi-process runs from a test.

``run_launcher(nproc, script, *args)`` runs ``python -m tensorplay.distributed.launch`` on a free
port with this checkout first on ``PYTHONPATH`` (also in the workers: they inherit it), bounded
twice -- the launcher's ``--timeout`` stops the workers, the subprocess timeout the launcher -- so a
hung collective fails the test instead of hanging it.  ``launcher=`` replaces the launcher command
(``torchrun``).  ``check_blocks(recs, name, ref, spec)``: every rank recorded its block of ``ref``."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_launcher(nproc, script, *args, timeout=DEFAULT_TIMEOUT_S, launcher=None, cache_dir=None):
    env = dict(os.environ)
    if cache_dir is not None:
        env["TP_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = launcher or [sys.executable, "-m", "tensorplay.distributed.launch", "--nproc", str(nproc),
                       "--port", str(free_port()), "--timeout", str(timeout)]
    try:
        return subprocess.run([*cmd, str(script), *map(str, args)], env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=timeout + 30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{script}: no result after {timeout + 30} s (a hung collective?)\n{e.stdout}\n{e.stderr}")


def check_blocks(recs, name, ref, spec, exact=True):
    """Every rank holds the block of ``ref`` its sharding names, with ``spec`` (``recs[rank][name]``:
    ``local``, ``spec``, ``shape``, ``index`` as the workers record them); exactly, or to 1e-5."""
    from tensorplay.distributed import P
    for k, rec in enumerate(recs):
        got = rec[name]
        assert got["spec"] == tuple(P(*spec)), (name, k, got["spec"])
        assert got["shape"] == tuple(ref.shape)
        block = ref[got["index"]] if got["index"] else ref
        if exact:
            assert torch.equal(got["local"], block), (name, k)
        else:
            torch.testing.assert_close(got["local"], block, rtol=1e-5, atol=1e-5)
