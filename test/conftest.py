import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: long-running tests (not in the default CI run)")
    config.addinivalue_line("markers", "gpu: needs a CUDA device")
