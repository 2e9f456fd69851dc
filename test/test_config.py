"""One configuration (tensorplay/compiler/config.py, docs/config.md).

* no module but config.py reads a ``TP_*`` variable, and every declared knob is read by some
  module (its dotted name appears in code, not only in a docstring);
* ``config.patch`` as context manager and decorator, nesting, errors on unknown names and wrong
  types; the environment is read at use time, parsed by type, a bad value names the variable;
* ``config.digest`` and the compiled-graph key see keyed knobs and not logs or folders; the cache
  switches and the debug dumps still bypass the cache;
* ``tp.compile(options=...)`` and the modes resolve through the declarations;
* docs/config.md's table of knobs is the declarations' (the README's table of variables:
  test/test_docs.py).
"""
import ast
import re
from pathlib import Path

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler import config

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tensorplay"
CONFIG = PACKAGE / "compiler" / "config.py"


def _sources():
    for py in sorted(PACKAGE.rglob("*.py")):
        if py != CONFIG:
            yield py, ast.parse(py.read_text(), str(py))


def _docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _env_reads_allowed(tree) -> set:
    """ids of the ``environ`` / ``getenv`` nodes of ``os.environ.get("NAME")`` / ``os.getenv("NAME")``
    / ``os.environ.setdefault("NAME", ...)`` calls whose NAME is a constant that is not ours
    (``XDG_CACHE_HOME``; ``TRITON_INTERPRET``, which Triton reads when it is imported)."""
    ok = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("TP_"):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr == "getenv":
                ok.add(id(f))
            elif isinstance(f, ast.Attribute) and f.attr in ("get", "setdefault") and isinstance(f.value, ast.Attribute) \
                    and f.value.attr == "environ":
                ok.add(id(f.value))
    return ok


def test_no_module_but_config_reads_tp_variables():
    bad = []
    for py, tree in _sources():
        ok = _env_reads_allowed(tree)
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in ("environ", "getenv") and id(node) not in ok:
                bad.append(f"{py.relative_to(REPO)}:{node.lineno}")
    assert bad == [], f"the environment read outside tensorplay/compiler/config.py: {bad}"


def test_every_declared_knob_is_read_somewhere():
    used = set()
    for _, tree in _sources():
        docs = _docstrings(tree)
        used |= {n.value for n in ast.walk(tree)
                 if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}
    unread = sorted(set(config.KNOBS) - used)
    assert unread == [], f"declared in config.py but read by no module: {unread}"


def test_declarations_are_well_formed():
    envs = [k.env for k in config.KNOBS.values() if k.env]
    assert len(envs) == len(set(envs))
    for name, k in config.KNOBS.items():
        assert k.name == name and re.fullmatch(r"[a-z]+(\.[a-z0-9_]+)+", name), name
        assert k.type in (bool, int, float, str) and k.help
        assert k.default is None or isinstance(k.default, k.type), name
        assert not (k.option and (k.env or k.keyed)), name    # options are keyed by their readers
        assert k.env is None or k.env.startswith("TP_"), name
    for mode, preset in config.MODES.items():
        assert all(config.knob(n).option for n in preset), mode


# ---- patch, get, environment -------------------------------------------------------------------------

def test_patch_as_context_manager_and_decorator_nests_and_restores():
    assert config.get("stax.max_inline_ops") == 24
    with config.patch({"stax.max_inline_ops": 3}):
        assert config.get("stax.max_inline_ops") == 3 and config.stax.max_inline_ops == 3
        with config.patch(**{"stax.max_inline_ops": 5, "stax.cpp.unroll": 1}):
            assert config.get("stax.max_inline_ops") == 5 and config.get("stax.cpp.unroll") == 1
        assert config.get("stax.max_inline_ops") == 3 and config.get("stax.cpp.unroll") == 2
    assert config.get("stax.max_inline_ops") == 24

    @config.patch({"stax.horizontal_fusion": False})
    def inside():
        return config.get("stax.horizontal_fusion")
    assert inside() is False and inside() is False and config.get("stax.horizontal_fusion") is True
    with pytest.raises(RuntimeError):
        with config.patch({"stax.cpp.unroll": 7}):
            raise RuntimeError
    assert config.get("stax.cpp.unroll") == 2


def test_patch_refuses_unknown_names_and_wrong_types():
    with pytest.raises(KeyError, match="did you mean 'stax.horizontal_fusion'"):
        config.patch({"stax.horizontal_fussion": False})
    with pytest.raises(TypeError, match="expects bool"):
        config.patch({"stax.horizontal_fusion": 0})
    with pytest.raises(TypeError, match="expects int"):
        config.patch({"stax.max_inline_ops": True})
    with pytest.raises(ValueError, match="expected one of"):
        config.patch({"stax.compile_progress": "always"})
    with pytest.raises(AttributeError, match="unknown configuration knob"):
        config.stax.no_such_knob


def test_environment_is_read_at_use_and_parsed_by_type(monkeypatch):
    monkeypatch.setenv("TP_STAX_PREFETCH_BYTES", "1024")
    assert config.get("stax.cpp.prefetch_bytes") == 1024
    monkeypatch.setenv("TP_STAX_PREFETCH_BYTES", "")            # empty: unset
    assert config.get("stax.cpp.prefetch_bytes") == 4096
    for text, value in (("0", False), ("1", True), ("off", False), ("Yes", True)):
        monkeypatch.setenv("TP_STAX_SPLIT_LOADS", text)
        assert config.get("stax.cpp.split_loads") is value
    with config.patch({"stax.cpp.split_loads": True}):          # a patch beats the environment
        assert config.get("stax.cpp.split_loads") is True
    monkeypatch.setenv("TP_STAX_SPLIT_LOADS", "maybe")
    with pytest.raises(ValueError, match="TP_STAX_SPLIT_LOADS='maybe'"):
        config.get("stax.cpp.split_loads")
    monkeypatch.setenv("TP_STAX_PREFETCH_BYTES", "4k")
    with pytest.raises(ValueError, match="TP_STAX_PREFETCH_BYTES='4k': expected an integer"):
        config.get("stax.cpp.prefetch_bytes")


def test_chapter_names_in_choices_are_views_of_the_knobs():
    from tensorplay.compiler.backends.stax import choices
    from tensorplay.compiler.backends.stax.cpp import choices as cpu_choices
    with config.patch({"stax.max_inline_ops": 7, "stax.cpp.stream_min_bytes": 64}):
        assert choices.MAX_INLINE_OPS == 7 and cpu_choices.STREAM_STORE_MIN_BYTES == 64
    assert choices.MAX_INLINE_OPS == 24 and cpu_choices.STREAM_STORE_MIN_BYTES >= 1 << 20
    with pytest.raises(AttributeError, match=r"config.patch\(\{'stax.horizontal_fusion': False\}\)"):
        choices.HORIZONTAL_FUSION = False


def test_watch_follows_patches():
    from tensorplay.ops import registry
    assert registry._log_op not in registry.observers
    with config.patch({"log.ops": True}):
        assert registry._log_op in registry.observers
    assert registry._log_op not in registry.observers


# ---- the cache key ---------------------------------------------------------------------------------------

def test_digest_sees_keyed_knobs_only():
    d = config.digest()
    for name, value in (("stax.max_inline_ops", 25), ("stax.cpp.prefetch_bytes", 0), ("stax.cpp.isa", "sse")):
        with config.patch({name: value}):
            assert config.digest() != d, name
    for name, value in (("stax.debug_dir", "/tmp/x"), ("stax.compile_log", "/tmp/log"), ("log.recompiles", True),
                        ("stax.cache_dir", "/tmp/c"), ("stax.compile_threads", 3), ("stax.cpp_wrapper", True)):
        with config.patch({name: value}):
            assert config.digest() == d, name


def test_graph_key_follows_the_configuration(monkeypatch):
    from tensorplay.compiler.backends.stax import codecache
    low = tp.compile(lambda x: x.exp().sum(-1)).lower(tp.from_torch(torch.randn(4, 5)))
    gm, ex = low.graph_module, low.example_inputs
    k = codecache.graph_key(gm, ex)
    assert k is not None and k == codecache.graph_key(gm, ex)
    with config.patch({"stax.horizontal_fusion": False}):
        assert codecache.graph_key(gm, ex) != k
    monkeypatch.setenv("TP_STAX_KEEP_REALIZED_LOCAL", "0")
    assert codecache.graph_key(gm, ex) != k
    monkeypatch.delenv("TP_STAX_KEEP_REALIZED_LOCAL")
    with config.patch({"stax.debug_dir": "/tmp/tp-dumps", "stax.compile_log": "/tmp/tp-log"}):
        assert codecache.graph_key(gm, ex) == k
    monkeypatch.setenv("TP_LOG_RECOMPILES", "1")
    assert codecache.graph_key(gm, ex) == k
    with config.patch({"stax.graph_cache": False}):
        assert codecache.graph_key(gm, ex) is None
    monkeypatch.setenv("TP_GRAPH_CACHE", "0")
    assert codecache.graph_key(gm, ex) is None
    monkeypatch.delenv("TP_GRAPH_CACHE")
    for var, value in (("TP_STAX_DEBUG", "schedule"), ("TP_STAX_LOWER_DEBUG", "1")):
        monkeypatch.setenv(var, value)
        assert codecache.graph_key(gm, ex) is None, var
        monkeypatch.delenv(var)
    assert codecache.graph_key(gm, ex) == k


# ---- tp.compile options and modes --------------------------------------------------------------------------

def test_options_and_modes_resolve_through_the_declarations(monkeypatch):
    from tensorplay.compiler import api
    monkeypatch.setattr(api, "_WARNED_NO_EFFECT", set())
    with pytest.warns(UserWarning, match="no effect on CPU yet"):
        cf = tp.compile(lambda x: x, mode="max-autotune-no-cudagraphs", options={"stax.cpp_wrapper": True})
    assert cf.options["stax.max_autotune"] is True and cf.options["stax.cudagraphs"] is False
    assert set(cf.options) == set(config.options())
    assert cf.options["stax.cpp_wrapper"] is True and cf.options["aot.partitioner"] == "min_cut"
    with config.patch({"stax.cpp_wrapper": True}):          # an option's default is the knob's value now
        assert tp.compile(lambda x: x).options["stax.cpp_wrapper"] is True
    with pytest.raises(ValueError, match="'stax.horizontal_fusion' is a process-wide knob.*config.patch"):
        tp.compile(lambda x: x, options={"stax.horizontal_fusion": False})
    with pytest.raises(ValueError, match="unknown option 'aot.partitoner'.*did you mean 'aot.partitioner'"):
        tp.compile(lambda x: x, options={"aot.partitoner": "default"})
    assert tp.compiler.list_mode_options() == {n: config.knob(n).default for n in config.options()}


# ---- documentation -----------------------------------------------------------------------------------------

def test_config_page_table_is_current():
    text = (REPO / "docs" / "config.md").read_text()
    table = text.split("<!-- the table: config.markdown_table() -->\n", 1)[1].split("\n\n", 1)[0]
    assert table.strip() == config.markdown_table(), \
        "docs/config.md's table differs from the declarations: paste config.markdown_table() (docs/config.md)"
