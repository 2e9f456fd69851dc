"""tensorplay.utils.machine: the roofline's machine parameters (chapter §13.1, Prop. 13.1)."""
import math

import pytest

from tensorplay.utils import machine


def test_cache_sizes_from_sysfs_are_plausible_and_ordered():
    c = machine.cache_sizes()
    assert "L1" in c and "L2" in c
    assert 4 << 10 <= c["L1"] <= 1 << 20                 # 4 KiB .. 1 MiB of L1 data cache
    assert c["L1"] < c["L2"] <= 64 << 20
    if "L3" in c:
        assert c["L2"] < c["L3"] <= 4 << 30
    assert machine.last_level_cache_bytes() == max(c.values())


def test_cache_sizes_fall_back_to_sysconf_then_defaults(monkeypatch):
    monkeypatch.setattr(machine, "_SYSFS", "/nonexistent/cache")
    c = machine.cache_sizes()                            # glibc's sysconf, or the defaults
    assert c and all(v > 0 for v in c.values())

    def no_sysconf(name):
        raise ValueError(name)
    monkeypatch.setattr(machine.os, "sysconf", no_sysconf)
    assert machine.cache_sizes() == machine.CACHE_DEFAULTS
    assert machine._size("48K") == 48 << 10 and machine._size("32768K") == 32 << 20 and machine._size("2M") == 2 << 20


@pytest.fixture
def one_thread():
    """One torch thread: on a loaded machine of few cores a parallel row sum of 1 MiB waits for its
    second thread's time slice (readings of ~10 ms where the work takes ~20 µs)."""
    import torch
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_read_bandwidth_is_the_best_round_and_plausible(one_thread):
    bw = machine.read_bandwidth(rounds=3, readings=5, nbytes=1 << 20, evict=False)
    assert bw["probe_bytes"] == 1 << 20
    assert len(bw["rounds"]) == 3 and bw["B"] == max(bw["rounds"])     # Prop. 13.1: the best round
    assert 1e9 < bw["B"] < 1e13                                       # 1 GB/s .. 10 TB/s
    assert all(1e8 < b < 1e13 for b in bw["back_to_back"])


def test_matmul_peak_is_plausible(one_thread):
    P = machine.matmul_peak(n=128, readings=3)
    assert 1e8 < P < 1e15


def test_roofline_point_on_known_numbers():
    B, P = 50e9, 400e9                                   # ridge 8 FLOP/byte
    p = machine.roofline_point(flops=1e6, nbytes=4e6, seconds=1e-4, B=B, P=P)
    assert p["intensity"] == 0.25 and p["bound"] == "memory"
    assert p["attainable_flops"] == pytest.approx(0.25 * B)
    assert p["roof_s"] == pytest.approx(4e6 / B) and p["achieved_flops"] == pytest.approx(1e10)
    assert p["roof_fraction"] == pytest.approx(4e6 / B / 1e-4)
    q = machine.roofline_point(flops=1e9, nbytes=1e6, seconds=1e-2, B=B, P=P)
    assert q["bound"] == "compute" and q["attainable_flops"] == P and q["roof_s"] == pytest.approx(1e9 / P)


def test_machine_parameters_ridge_and_later_rounds(one_thread):
    m = machine.MachineParameters(B=10e9, P=80e9, caches={"L1": 1}, description="test", bandwidth_rounds=[10e9])
    assert m.ridge == 8.0
    m.add_round(readings=3, nbytes=1 << 20, evict=False)
    assert len(m.bandwidth_rounds) == 2 and m.B == max(m.bandwidth_rounds) >= 10e9
    d = m.as_dict()
    assert d["ridge"] == pytest.approx(m.P / m.B) and d["caches"] == {"L1": 1}
    assert "ridge P/B" in m.summary(3) and math.isfinite(m.ridge)


def test_keep_freed_memory_takes_effect_in_a_fresh_process():
    """glibc's mallopt from a running process (the steady state of ``--steady``), in a child so
    that this test session's allocator stays as it is."""
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = "from tensorplay.utils.benchmark import keep_freed_memory; print(keep_freed_memory())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": root})
    assert r.returncode == 0, r.stderr[-2000:]
    import platform
    expected = "True" if platform.libc_ver()[0] == "glibc" else "False"
    assert r.stdout.strip() == expected
