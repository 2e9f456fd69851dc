import contextlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

# without a GPU, Triton kernels run in Triton's interpreter (test/stax/test_triton_backend.py): its mode is
# fixed when triton is imported, so it is chosen here, before any test imports it
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def stax_cache(tmp_path_factory, monkeypatch):
    """Every test: TP_CACHE_DIR at one cache for the test session ($TP_TEST_CACHE to reuse one
    across sessions), so no test touches the user's kernel cache, and a library the process loaded
    once (the code cache keeps loaded libraries in memory) is in the cache a child process reads."""
    d = os.environ.get("TP_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "tp_cache")
    monkeypatch.setenv("TP_CACHE_DIR", d)
    yield d


_UNSET = object()


@pytest.fixture
def config_patch():
    """``config_patch(name, value)`` or ``config_patch({name: value, ...})``: a ``config.patch`` of
    tensorplay/compiler/config.py that lasts until the test ends (what ``monkeypatch.setattr`` is
    for attributes; a later call for the same knob wins)."""
    from tensorplay.compiler import config
    with contextlib.ExitStack() as stack:
        def apply(changes, value=_UNSET):
            stack.enter_context(config.patch(changes if value is _UNSET else {changes: value}))
        yield apply


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests (not in the default CI run)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
