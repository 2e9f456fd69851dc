"""What of the running process's *user code* decides Stax's output: a part of the graph key.

The compiled-graph cache (codecache.graph_key, docs/cache.md) keys a graph by, among other things,
the content of every ``.py`` file of the tensorplay package.  That covers every lowering rule of
op_lowerings/, but not

* a rule registered from a script, a notebook or a test (``register_lowering("logaddexp")(...)``,
  experiment 3 of the chapter), or an existing rule overridden that way;
* a Stax function replaced from outside the package (``choices.score_fusion = mine``, experiment 4).

Both change what Stax generates; without them in the key, a new process (or a new ``tp.compile``
in the same process) would reuse the graph compiled before the change.  :func:`user_code_digest`
is the SHA-256 of a text that identifies every such piece of code, or ``""`` when there is none.

Rules and guarantees:

* **Only user code is hashed.**  Code is *user* code when its file is neither inside the tensorplay
  package (whose sources the package digest already covers) nor in the standard library or
  site-packages (``<string>``, ``python -c`` and ``exec`` count as user code).  A process that
  changed nothing contributes ``""`` whether or not it has imported op_lowerings yet -- the warm
  path of a new process never imports it, and must find the entries of a process that did.
* **What identifies a user function**: its bytecode, names and constants, nested code included
  (not its file name or line numbers: moving it changes nothing); its defaults and closure; and the
  user functions and plain values (numbers, strings) it reads from its module's globals by name,
  recursively.  A package or library function is named by module and qualified name, plus what its
  closure and defaults hold: the ``pointwise(compute)`` helper returns a *package* closure around
  the user's ``compute``, which is found there.  Containers are walked; sets are sorted (their
  order follows the hash seed, which differs between processes); ``torch.dtype``/``torch.device``
  are their repr; any other object is its type's name (its state is not seen).
* **Deterministic across processes**: the same script gives the same text in every process of the
  same Python (the Python version is in the graph key), so a new process that registers the same
  rule finds the graph the last one compiled with it.
* **Not seen** (set ``TP_GRAPH_CACHE=0``): a rule re-bound to another of the package's own functions
  (``LOWERINGS["relu"] = LOWERINGS["abs"]``), user code installed into site-packages, the state of
  other objects a rule reads (attributes of a user class instance), and patches of non-Stax modules.
* **Cost**: functions found to hold no user code are memoised by identity, so after the first key
  of a process a key walks the registry and the Stax modules' globals with one dictionary lookup
  each (measured: docs/cache.md).
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import types
from pathlib import Path

__all__ = ["user_code_digest", "describe"]

_STAX = __name__.rsplit(".", 1)[0]                  # tensorplay.compiler.backends.stax
_PACKAGE_ROOT = os.path.join(str(Path(__file__).resolve().parents[3]), "")
_PLAIN = (bool, int, float, complex, str, bytes, type(None))
_origin_memo: dict = {}          # co_filename -> "package" | "library" | "user"
_not_user: dict = {}             # id(obj) -> obj: callables that hold no user code (obj kept alive)


@functools.lru_cache(maxsize=None)
def _library_dirs() -> tuple:
    import site
    import sysconfig
    dirs = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:   # the site.py of an old virtualenv
        pass
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _origin(filename: str) -> str:
    """``package`` (tensorplay's sources), ``library`` (stdlib, site-packages, frozen modules) or
    ``user`` (anything else: a script, a test, ``<string>``)."""
    o = _origin_memo.get(filename)
    if o is None:
        real = os.path.realpath(filename) if os.path.isabs(filename) else filename
        if filename.startswith("<frozen"):
            o = "library"
        elif real.startswith(_PACKAGE_ROOT):
            o = "package"
        elif real.startswith(_library_dirs()):
            o = "library"
        else:
            o = "user"
        _origin_memo[filename] = o
    return o


def _code_text(code) -> str:
    """Bytecode, names and constants of a code object and its nested ones; no file, no lines."""
    consts = []
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            consts.append(_code_text(c))
        elif isinstance(c, frozenset):          # `x in {"a", "b"}`
            consts.append("{" + ",".join(sorted(map(repr, c))) + "}")
        else:
            consts.append(repr(c))
    return (f"code {code.co_name} {code.co_argcount} {code.co_kwonlyargcount} {code.co_flags} "
            f"{code.co_code.hex()} {code.co_names} {code.co_varnames} {code.co_freevars} [{';'.join(consts)}]")


def _code_names(code) -> set:
    out = set(code.co_names)
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            out |= _code_names(c)
    return out


def _cells(fn) -> tuple:
    out = []
    for c in fn.__closure__ or ():
        try:
            out.append(c.cell_contents)
        except ValueError:      # a cell not assigned yet
            out.append("<empty cell>")
    return tuple(out)


def _is_user_fn(v) -> bool:
    return isinstance(v, types.FunctionType) and _origin(v.__code__.co_filename) == "user"


def describe(obj, seen: frozenset = frozenset()) -> tuple[str, bool]:
    """(text, user): a text identifying ``obj`` as code to run, and whether user code is reachable
    from it (the rules in the module docstring)."""
    if isinstance(obj, _PLAIN):
        return repr(obj), False
    if _not_user.get(id(obj)) is obj:
        return "<package>", False
    if id(obj) in seen:
        return "<cycle>", False
    seen = seen | {id(obj)}
    if isinstance(obj, (tuple, list)):
        parts = [describe(v, seen) for v in obj]
        return f"{type(obj).__name__}({','.join(t for t, _ in parts)})", any(u for _, u in parts)
    if isinstance(obj, (set, frozenset)):
        parts = [describe(v, seen) for v in obj]
        return "{" + ",".join(sorted(t for t, _ in parts)) + "}", any(u for _, u in parts)
    if isinstance(obj, dict):
        parts = [(describe(k, seen), describe(v, seen)) for k, v in obj.items()]
        return ("{" + ",".join(f"{k[0]}:{v[0]}" for k, v in parts) + "}",
                any(k[1] or v[1] for k, v in parts))
    if isinstance(obj, functools.partial):
        parts = [describe(obj.func, seen), describe(obj.args, seen), describe(obj.keywords, seen)]
        return f"partial({','.join(t for t, _ in parts)})", any(u for _, u in parts)
    if isinstance(obj, types.MethodType):                        # a bound method
        t, u = describe(obj.__func__, seen)
        return f"method({type(obj.__self__).__qualname__},{t})", u
    if not isinstance(obj, types.FunctionType):
        # (type-level lookups only: an object's own __getattr__ may raise, e.g. the ``ops`` proxy)
        mod = type(obj).__module__
        if mod == "torch" and type(obj).__name__ in ("dtype", "device"):
            return repr(obj), False
        call = getattr(type(obj), "__call__", None)
        if not isinstance(obj, type) and isinstance(call, types.FunctionType):   # __call__ in Python
            t, u = describe(call, seen)
            return f"callable({mod}.{type(obj).__qualname__},{t})", u
        return f"<{mod}.{type(obj).__qualname__}>", False         # its state is not seen
    code = obj.__code__
    user = _origin(code.co_filename) == "user"
    parts = [f"fn {getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"]
    if user:
        parts.append(_code_text(code))
    nested = [describe(obj.__defaults__ or (), seen), describe(obj.__kwdefaults__ or {}, seen),
              describe(_cells(obj), seen)]
    if user:        # the helpers and constants it reads by name from its module
        g = getattr(obj, "__globals__", {})
        for name in sorted(_code_names(code)):
            v = g.get(name)
            if isinstance(v, _PLAIN) and name in g or _is_user_fn(v):
                t, _ = describe(v, seen)
                nested.append((f"{name}={t}", False))
    parts += [t for t, _ in nested]
    return "(" + " ".join(parts) + ")", user or any(u for _, u in nested)


def _user_text(obj) -> str | None:
    """``describe(obj)``'s text if user code is reachable from ``obj``, else None (memoised)."""
    if _not_user.get(id(obj)) is obj:
        return None
    text, user = describe(obj)
    if not user:
        _not_user[id(obj)] = obj
        return None
    return text


_modules_memo: list = [-1, ()]


def _stax_modules() -> tuple:
    """The imported Stax modules, (name, module); re-listed when ``sys.modules`` changes size (a
    scan of its ~3000 entries costs ~0.3 ms, most of this digest's time)."""
    if _modules_memo[0] != len(sys.modules):
        prefix = _STAX + "."
        mods = tuple((k, m) for k, m in list(sys.modules.items())
                     if m is not None and (k == _STAX or k.startswith(prefix)))
        _modules_memo[:] = [len(sys.modules), mods]
    return _modules_memo[1]


_scan_memo: dict = {}    # id(namespace) -> (namespace, values kept alive, ids, keys, user entries)


def _scan(ns: dict, label: str, callables_only: bool) -> list:
    """``label + name=text`` for the entries of ``ns`` that hold user code.  Which entries those are
    is rescanned only when an entry changed: the memo keeps the last scan's values alive, so an
    unchanged tuple of their ids means the same objects (no id is reused while they live).  The
    user entries are described afresh every time (a global constant they read may have changed)."""
    vals = tuple(ns.values())
    ids, keys = tuple(map(id, vals)), tuple(ns)
    m = _scan_memo.get(id(ns))
    if m is None or m[0] is not ns or m[2] != ids or m[3] != keys:
        user = [(k, v) for k, v in zip(keys, vals)
                if not (callables_only and (not callable(v) or isinstance(v, type) or k.startswith("__")))
                and _user_text(v) is not None]
        m = _scan_memo[id(ns)] = (ns, vals, ids, keys, user)
    return [f"{label}{k}={t}" for k, v in m[4] for t in (_user_text(v),) if t is not None]


def user_code_digest() -> str:
    """SHA-256 (hex) of the user code in the lowering registry (``op_lowerings.LOWERINGS``, when
    imported) and among the callables of the imported Stax modules; ``""`` when there is none."""
    found = []
    for modname, mod in _stax_modules():
        found += _scan(vars(mod), modname + ".", True)
    table = getattr(sys.modules.get(_STAX + ".op_lowerings"), "LOWERINGS", None)
    if isinstance(table, dict):
        found += _scan(table, "lowering ", False)
    if not found:
        return ""
    h = hashlib.sha256()
    for part in sorted(found):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()
