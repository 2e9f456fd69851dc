"""Shared fixtures of the Stax tests."""
import os

import pytest


@pytest.fixture
def stax_cache(tmp_path_factory, monkeypatch):
    """Point TP_CACHE_DIR at one cache for the test session ($TP_TEST_CACHE to reuse one across
    sessions), so tests never touch the user's kernel cache.  Modules use it with
    ``pytestmark = pytest.mark.usefixtures("stax_cache")``."""
    d = os.environ.get("TP_TEST_CACHE") or str(tmp_path_factory.getbasetemp() / "tp_cache")
    monkeypatch.setenv("TP_CACHE_DIR", d)
    yield d
