import contextlib
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


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
