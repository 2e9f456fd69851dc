"""Starting multi-process runs from a test.

``run_launcher(nproc, script, *args)`` runs ``python -m tensorplay.distributed.launch`` on a free
port with this checkout first on ``PYTHONPATH`` (also in the workers: they inherit it), bounded
twice -- the launcher's ``--timeout`` stops the workers, the subprocess timeout the launcher -- so a
hung collective fails the test instead of hanging it.  ``launcher=`` replaces the launcher command
(``torchrun``)."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

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
