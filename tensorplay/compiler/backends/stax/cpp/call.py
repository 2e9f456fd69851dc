"""The call extension: how Python runs a compiled C++ entry (the chapter, §11.2).

``tp_stax_call`` is a tiny CPython extension (``METH_FASTCALL``): ``call(entry_address, ptr0, ptr1,
...)`` runs ``entry((void*[]){ptr0, ...})`` with the data pointers converted on the C stack and the
GIL released around the call.  It is compiled once per Python ABI and cached like every library
(build.py).  If it cannot be built (no ``Python.h``), ctypes with a pointer array built per
call is used instead, with one warning.  Both wrappers call kernels through it: the Python wrapper
one entry per kernel (``kernel_entry`` of cpp/wrapper.py), the C++ wrapper one entry per segment.
"""
from __future__ import annotations

import ctypes
import sys
import sysconfig
import threading
import warnings

from . import build
from .. import codecache

__all__ = ["submit_call_extension", "bind_entries", "load_call_extension"]

_EXT_NAME = "tp_stax_call"

#: The call extension: ``call(entry_address, ptr0, ptr1, ...)`` runs ``entry((void*[]){ptr0, ...})``.
_EXT_SOURCE = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef void (*tp_entry_t)(void* const*);

static PyObject* tp_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "tp_stax_call.call(entry, *pointers): missing the entry");
        return NULL;
    }
    void* entry = PyLong_AsVoidPtr(args[0]);
    if (entry == NULL) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "tp_stax_call.call: the entry address is 0");
        return NULL;
    }
    const Py_ssize_t n = nargs - 1;
    void* stack[64];
    void** ptrs = n <= 64 ? stack : static_cast<void**>(PyMem_Malloc(sizeof(void*) * n));
    if (ptrs == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; ++i) {
        ptrs[i] = PyLong_AsVoidPtr(args[i + 1]);
        if (ptrs[i] == NULL && PyErr_Occurred()) {
            if (ptrs != stack) PyMem_Free(ptrs);
            return NULL;
        }
    }
    tp_entry_t fn = reinterpret_cast<tp_entry_t>(entry);
    Py_BEGIN_ALLOW_THREADS
    fn(ptrs);
    Py_END_ALLOW_THREADS
    if (ptrs != stack) PyMem_Free(ptrs);
    Py_RETURN_NONE;
}

static PyMethodDef tp_methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(tp_call)), METH_FASTCALL,
     "call(entry_address, *data_pointers): run a Stax graph entry on an array of data pointers"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef tp_module = {PyModuleDef_HEAD_INIT, "tp_stax_call", NULL, -1, tp_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_tp_stax_call(void) { return PyModule_Create(&tp_module); }
"""


_ext_lock = threading.Lock()
_ext_state: dict = {}   # "call": the extension's call function, or None after a failed build
codecache.on_clear_memo(_ext_state.clear)   # the extension is a loaded library too


def _ext_compile_args():
    """(source, extra flags): the Python ABI is part of the source, so of the cache key."""
    inc = sysconfig.get_paths()["include"]
    tag = f"// CPython {sys.version.split()[0]} {sys.implementation.cache_tag} " \
          f"{sysconfig.get_config_var('EXT_SUFFIX')} {inc}\n"
    return tag + _EXT_SOURCE, (f"-I{inc}",)


def load_call_extension():
    """The extension's ``call`` function (built or loaded from the cache once per process), or
    None if it cannot be built (a warning says why; ctypes is used instead)."""
    if "call" in _ext_state:
        return _ext_state["call"]
    with _ext_lock:
        if "call" in _ext_state:
            return _ext_state["call"]
        from importlib.machinery import ExtensionFileLoader
        from importlib.util import module_from_spec, spec_from_loader

        call = None
        try:
            src, extra = _ext_compile_args()
            lib = build.load_cpp(src, "scalar", extra)
            loader = ExtensionFileLoader(_EXT_NAME, lib._name)
            mod = module_from_spec(spec_from_loader(_EXT_NAME, loader))
            loader.exec_module(mod)
            call = mod.call
        except Exception as e:  # noqa: BLE001 - any failure: fall back to ctypes
            warnings.warn(f"Stax C++ wrapper: the call extension could not be built or loaded "
                          f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                          f"falling back to ctypes (slower calls)", RuntimeWarning, stacklevel=2)
        _ext_state["call"] = call
        return call


def submit_call_extension(async_compile):
    """Start :func:`load_call_extension` in the compile pool (next to the graph's own build)."""
    if _ext_state.get("call") is not None:
        return None
    return async_compile.submit(load_call_extension)


def _ctypes_call(fn, *ptrs):
    fn((ctypes.c_void_p * len(ptrs))(*ptrs))


def bind_entries(lib, ext_future, names, checked=False):
    """(call, entries) such that ``call(entries[i], *data_pointers)`` runs ``names[i]``.

    ``checked``: some kernel reports run-time errors (``tp_report_error``, stax_kernel.h: integer
    division by zero, an index out of range); ``call`` then looks at the library's error slot
    after every entry and raises what a kernel reported, as the Python wrapper does."""
    call = ext_future.result() if ext_future is not None else load_call_extension()
    if call is not None:
        entries = tuple(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value for n in names)
    else:
        call, entries = _ctypes_call, []
        for n in names:
            fn = getattr(lib, n)
            fn.restype, fn.argtypes = None, [ctypes.c_void_p]
            entries.append(fn)
    if checked:
        from ..runtime import checked_kernel
        call = checked_kernel(call, lib)
    return call, tuple(entries)
