"""Shared fixtures of the Stax tests: the session's kernel cache (``stax_cache``) is in
test/conftest.py, used by every test; modules that name it (``pytestmark =
pytest.mark.usefixtures("stax_cache")``) say that they compile kernels."""
