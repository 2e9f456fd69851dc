"""The layout of the house, checked where a machine can check it:

* no source file of the shipped code (the package, benchmarks, examples, tools) is over 1000 lines,
  except the files listed below, each with its reason;
* the modules of ``tensorplay.compiler`` import each other without cycles -- a function-level
  (deferred) import counts as much as a module-level one, and importing ``a.b.c`` imports ``a.b``
  first -- except the cycles listed below, each with its reason;
* nothing at the root of Stax (its modules outside a device backend's package) imports a device
  backend: the device seam (device.py) is the only door, and a backend registers itself;
* no module of the compiler hard-codes a list of op names (a tuple, list, set or dict of three or
  more string literals that name ops of the table): op facts are tags and fields of the op table,
  and which ops a rule serves follows from them.
"""
import ast
import os
from pathlib import Path

import networkx as nx

import tensorplay as tp
from tensorplay.compiler.backends.stax.ir import Reduction
from tensorplay.compiler.backends.stax.ops_handler import OPS_NAMES

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tensorplay"

MAX_LINES = 1000
SOURCE_ROOTS = ("tensorplay", "benchmarks", "examples", "tools")
SOURCE_SUFFIXES = (".py", ".h", ".hpp", ".c", ".cc", ".cpp")
#: files allowed over MAX_LINES, with the reason (the lead removes an entry once its file is split)
LONG_FILES: dict = {}

#: import cycles allowed in tensorplay.compiler (as sets of modules), with the reason
ALLOWED_CYCLES: dict = {}

#: lists of op names the compiler may keep: (module, the names) -> reason
RULES = "tensorplay/compiler/backends/stax/op_lowerings/"
ALLOWED_OP_LISTS = {
    ("tensorplay/compiler/backends/stax/triton/matmul.py", frozenset({"gelu", "relu", "sigmoid", "silu", "tanh"})):
        "the GEMM template's own epilogue vocabulary (Epilogue('activation', fn=...): Triton text per "
        "activation), not a dispatch over op-table entries",
    ("tensorplay/compiler/backends/stax/triton/matmul.py",
     frozenset({"argmax", "argmin", "broadcast_to", "cumprod", "cumsum", "dot", "gather", "histogram", "max", "min",
                "permute", "reshape", "sort", "split", "sum", "view"})):
        "Triton language functions (tl.*) a GEMM prologue may not call: names of Triton's API, not ops",
    (RULES + "reduction_rules.py", frozenset({"max", "min", "argmax", "argmin"})):
        "reduction types of the loop IR (ir.Reduction.TYPES) that have no identity: an empty reduction is "
        "eager's error",
}
#: (RULES: the rule package names op-table entries by construction -- rules are registered by op
#: name -- so there a list of ``ops``-interface names is a list of op names too)


def _sources():
    for root in SOURCE_ROOTS:
        for dirpath, dirnames, filenames in os.walk(REPO / root):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                if f.endswith(SOURCE_SUFFIXES):
                    p = Path(dirpath) / f
                    yield p.relative_to(REPO).as_posix(), p


def test_no_source_file_over_1000_lines():
    too_long = {}
    for rel, p in _sources():
        n = len(p.read_text(errors="replace").splitlines())
        if n > MAX_LINES and rel not in LONG_FILES:
            too_long[rel] = n
    assert not too_long, f"over {MAX_LINES} lines (split along a seam, or list with a reason): {too_long}"
    stale = [f for f in LONG_FILES if not (REPO / f).exists()
             or len((REPO / f).read_text(errors="replace").splitlines()) <= MAX_LINES]
    assert not stale, f"listed as too long but not (remove from LONG_FILES): {stale}"


# ---------------------------------------------------------------------------------------------
# imports
# ---------------------------------------------------------------------------------------------
def _modules() -> dict:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        parts = p.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph(prefix="tensorplay.compiler") -> nx.DiGraph:
    """Module -> module it imports, for the modules under ``prefix``: every ``import`` and ``from ...
    import`` anywhere in a module (module level or inside a function), plus the packages above the
    imported module that do not also contain the importer (importing ``a.b.c`` runs ``a.b`` first)."""
    mods = _modules()
    g = nx.DiGraph()
    for m, path in mods.items():
        if not (m == prefix or m.startswith(prefix + ".")):
            continue
        g.add_node(m)
        pkg = m if path.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module
                candidates = [f"{target}.{a.name}" for a in node.names] + [target]
            elif isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            else:
                continue
            for c in candidates:
                while c and c not in mods:
                    c = c.rpartition(".")[0]
                if not c or c == m:
                    continue
                parts = c.split(".")
                for k in range(1, len(parts) + 1):
                    t = ".".join(parts[:k])
                    if t in mods and t != m and not m.startswith(t + ".") and t.startswith(prefix):
                        g.add_edge(m, t, line=node.lineno)
                break
    return g


def test_import_graph_sees_deferred_imports():
    """The graph is built from the source: a function-level import is an edge (the GraphLowering
    walk reads the rule table with one), and so is the package above an imported module."""
    g = import_graph()
    assert g.has_edge("tensorplay.compiler.backends.stax.lowering", "tensorplay.compiler.backends.stax.op_lowerings")
    assert g.has_edge("tensorplay.compiler.backends.stax.op_lowerings.view_rules",
                      "tensorplay.compiler.backends.stax.op_lowerings.registry")


def test_compiler_imports_have_no_cycles():
    g = import_graph()
    found = [frozenset(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    unexpected = [sorted(c) for c in found if c not in ALLOWED_CYCLES]
    cycles = [" -> ".join(c + [c[0]]) for scc in unexpected for c in nx.simple_cycles(g.subgraph(scc))]
    assert not unexpected, "import cycles in tensorplay.compiler (move the shared piece down, or pass it in):\n" + \
        "\n".join(cycles[:20])
    stale = [sorted(c) for c in ALLOWED_CYCLES if c not in found]
    assert not stale, f"allowed cycles that no longer exist (remove them from ALLOWED_CYCLES): {stale}"


_STAX = "tensorplay.compiler.backends.stax"
#: the packages of Stax's device backends (each registers itself with device.register_device_backend)
DEVICE_BACKENDS = (_STAX + ".cpp", _STAX + ".triton")


def _in(m, pkg):
    return m == pkg or m.startswith(pkg + ".")


def test_stax_root_imports_no_device_backend():
    """The scheduler, the plans, the wrapper, the cache... (Stax outside ``cpp/``) are device-neutral:
    none imports a device backend, at module level or in a function; ``tensorplay.compiler``
    imports the built-in one (which registers itself)."""
    g = import_graph()
    assert g.has_edge(_STAX + ".cpp.backend", _STAX + ".device")     # the graph sees the backends
    bad = [f"{a} -> {b} (line {d['line']})" for a, b, d in g.edges(data=True)
           if _in(a, _STAX) and not any(_in(a, p) for p in DEVICE_BACKENDS)
           and any(_in(b, p) for p in DEVICE_BACKENDS)]
    assert not bad, "Stax's root imports a device backend (go through device.py):\n" + "\n".join(bad)


# ---------------------------------------------------------------------------------------------
# op-name lists
# ---------------------------------------------------------------------------------------------
def _string_collections(tree):
    """(line, strings) of every tuple/list/set literal and of the keys of every dict literal."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = node.elts
        elif isinstance(node, ast.Dict):
            elts = [k for k in node.keys if k is not None]
        else:
            continue
        yield node.lineno, [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def op_name_lists():
    """``{(module path, frozenset of op names): first line}`` for the compiler's literal lists of three
    or more op-table names.  Outside the rule package, a list whose every string is a name of the
    loop IR's own vocabulary (an ``ops`` function or a reduction type, which share their spelling
    with ops: ``exp``, ``sum``) is that vocabulary, not a list of ops."""
    op_names = set(tp.ops.OPS)
    vocabulary = set(OPS_NAMES) | set(Reduction.TYPES)
    found = {}
    for p in sorted((PACKAGE / "compiler").rglob("*.py")):
        rel = p.relative_to(REPO).as_posix()
        for line, strings in _string_collections(ast.parse(p.read_text())):
            names = frozenset(s for s in strings if s in op_names)
            if len(names) < 3:
                continue
            if not rel.startswith(RULES) and set(strings) <= vocabulary:
                continue
            found.setdefault((rel, names), line)
    return found


def test_op_name_list_scan_finds_lists():
    """The scan sees a hard-coded list (a check of the check)."""
    tree = ast.parse('if op.name in ("reshape", "flatten", "contiguous"): pass')
    assert [s for _, s in _string_collections(tree)] == [["reshape", "flatten", "contiguous"]]


def test_compiler_keeps_no_lists_of_op_names():
    found = op_name_lists()
    unexpected = {f"{rel}:{line}": sorted(names) for (rel, names), line in found.items()
                  if (rel, names) not in ALLOWED_OP_LISTS}
    assert not unexpected, ("lists of op names in the compiler (use a tag or a field of the op table, "
                            f"tensorplay/ops/registry.py): {unexpected}")
    stale = [k for k in ALLOWED_OP_LISTS if k not in found]
    assert not stale, f"allowed op lists that no longer exist (remove them from ALLOWED_OP_LISTS): {stale}"
