"""The specialization key (chapter §2.2).

A compiled artifact is valid for every call whose key equals the key it was captured with
(Prop. 2.1).  The key is a list of :class:`KeyEntry` — *(subject, field, expression, value)*:

* the call's structure (the signature part of K): how many positional arguments, which keywords
  in which order, and the nesting of tuples/lists/dicts — the tree spec of ``(args, kwargs)``
  (:class:`StructureEntry`); without it ``f(y=a, x=b)`` would pass the guards of ``f(a, b)``;
* per tensor input (and per free tensor): type, dim, each size and stride, dtype, device,
  requires_grad; module state additionally its identity;
* per non-tensor input: its type and value (Python scalars are specialized by value, §2.1);
* which placeholders (tensor inputs and free tensors) share memory, when the region writes one of
  them in place (aliasing.py: ``"same"`` groups are merged into one input, partial overlaps with a
  write run eagerly);
* global state that changes the program: grad mode, the ``training`` flags of the compiled module
  and of every module the function reaches through its closure or globals (all their submodules:
  ``model.dropout.eval()`` is seen);
* constants captured by reference: their version;
* data-gate outcomes are the last part of the key; they are checked by replay (gates.py).

``expression`` is Python source computing the field from the call's values; the guards
(guards.py) are generated from these entries and nothing else — a guard is a projection of the key
(§2.3), so every miss names the entry that differs.
"""
from __future__ import annotations

import dataclasses

import torch

from ..._tensor import Tensor
from .aliasing import alias_structure, describe_structure

__all__ = ["KeyEntry", "AliasEntry", "StructureEntry", "specialization_key", "input_names_for", "spec_text"]


@dataclasses.dataclass(frozen=True)
class KeyEntry:
    subject: str     # "arg 0 'x'", "free tensor global 'w'", "grad mode"
    field: str       # "size[0]", "dtype", "value", ...
    expr: str        # Python expression over the guard function's locals (L, F, M, C, G)
    value: object    # expected value

    def describe(self, got) -> str:
        return f"{self.subject}: {self.field} expected {self.value!r}, got {got!r}"


@dataclasses.dataclass(frozen=True)
class AliasEntry(KeyEntry):
    """The aliasing of the placeholders (aliasing.py); ``names`` are their human names."""
    names: tuple = ()

    def describe(self, got) -> str:
        return (f"{self.subject}: {self.field} expected {describe_structure(self.value, self.names)}, "
                f"got {describe_structure(got, self.names)}")


def spec_text(spec) -> str:
    """A tree spec (capture/pytree.py) as Python-like text, ``*`` for each leaf; the spec of
    ``(args, kwargs)`` reads like a call, ``(*, (*, *), k=*)``."""
    def rec(s):
        if s == "*":
            return "*"
        kind, aux, ch = s
        items = [rec(c) for c in ch]
        if kind == "dict":
            return "{" + ", ".join(f"{k!r}: {v}" for k, v in zip(aux, items)) + "}"
        if kind == "list":
            return "[" + ", ".join(items) + "]"
        if kind == "namedtuple":
            return f"{aux.__name__}(" + ", ".join(items) + ")"
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(spec, tuple) and len(spec) == 3 and spec[0] == "tuple" and len(spec[2]) == 2 \
            and spec[2][1][0] == "dict":
        (_, _, pos), (_, keys, kw) = spec[2]
        return "(" + ", ".join([rec(c) for c in pos] + [f"{k}={rec(c)}" for k, c in zip(keys, kw)]) + ")"
    return rec(spec)


@dataclasses.dataclass(frozen=True)
class StructureEntry(KeyEntry):
    """The tree spec of the call's ``(args, kwargs)``, shown as text."""

    def describe(self, got) -> str:
        return f"{self.subject}: {self.field} expected {spec_text(self.value)}, got {spec_text(got)}"


def _tensor_entries(subject, ref, t: Tensor, identity=False, sizes=True):
    """``sizes=False`` (a dynamic=True input): sizes and strides are the shape guards'
    (shape_guards.py), not values of the key."""
    d = t._data
    out = [KeyEntry(subject, "is a Tensor", f"_is_tensor({ref})", True)]
    if identity:
        out.append(KeyEntry(subject, "identity", f"id({ref})", id(t)))
    out.append(KeyEntry(subject, "dim", f"{ref}._data.dim()", d.dim()))
    for i, s in enumerate(d.shape if sizes else ()):
        out.append(KeyEntry(subject, f"size[{i}]", f"{ref}._data.shape[{i}]", s))
    for i, s in enumerate(d.stride() if sizes else ()):
        out.append(KeyEntry(subject, f"stride[{i}]", f"{ref}._data.stride({i})", s))
    out.append(KeyEntry(subject, "dtype", f"{ref}._data.dtype", d.dtype))
    out.append(KeyEntry(subject, "device", f"{ref}._data.device", d.device))
    out.append(KeyEntry(subject, "requires_grad", f"{ref}.requires_grad", bool(t.requires_grad)))
    return out


def input_names_for(fn, args, kwargs, leaves_per_arg=None) -> list[str]:
    """Human names for flat input leaves: parameter names from the signature, with paths into
    nested structures (``xs[1]``, ``cfg['k']``)."""
    import inspect
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    names = []

    def rec(o, path):
        if isinstance(o, (tuple, list)):
            for i, v in enumerate(o):
                rec(v, f"{path}[{i}]")
        elif isinstance(o, dict):
            for k, v in o.items():
                rec(v, f"{path}[{k!r}]")
        else:
            names.append(path)
    for i, a in enumerate(args):
        rec(a, params[i] if i < len(params) and not params[i].startswith("*") else f"args[{i}]")
    for k, v in kwargs.items():
        rec(v, k)
    return names


def specialization_key(leaves, names, free=(), constants=(), modules=(), writes_inputs=False, spec=None,
                       symbolic=False):
    """The key of one call (see module doc).  ``free``: current free tensors; ``constants``:
    captured constant tensors; ``modules``: ``(description, module)`` of the module being compiled
    (``"self"``) and of the modules reached through closures and globals (the guard's ``M[j]``);
    ``writes_inputs``: the region writes one of its placeholders in place (then their aliasing is
    part of the key); ``spec``: the tree spec of the call's ``(args, kwargs)`` (the guard's ``S``);
    ``symbolic``: a dynamic=True capture — the inputs' sizes and strides are left to its shape
    guards (shape_guards.py, appended once the backend has compiled)."""
    from ...autograd import grad_mode
    key: list[KeyEntry] = []
    if spec is not None:
        key.append(StructureEntry("call", "structure", "S", spec))
    ph_refs, ph_names, ph_vals = [], [], []
    for i, leaf in enumerate(leaves):
        subj = f"arg {i} '{names[i]}'" if i < len(names) else f"arg {i}"
        ref = f"L[{i}]"
        if isinstance(leaf, Tensor):
            key += _tensor_entries(subj, ref, leaf, sizes=not symbolic)
            ph_refs.append(ref)
            ph_names.append(names[i] if i < len(names) else f"arg {i}")
            ph_vals.append(leaf)
        elif leaf is None or isinstance(leaf, (bool, int, float, str, complex, torch.dtype, torch.device)):
            key.append(KeyEntry(subj, "type", f"type({ref})", type(leaf)))
            key.append(KeyEntry(subj, "value", ref, leaf))
        else:
            key.append(KeyEntry(subj, "type", f"type({ref})", type(leaf)))
            key.append(KeyEntry(subj, "identity", f"id({ref})", id(leaf)))
    for j, (desc, t) in enumerate(free):
        key += _tensor_entries(f"free tensor {desc}", f"F[{j}]", t, identity=desc.startswith("self."))
        ph_refs.append(f"F[{j}]")
        ph_names.append(desc)
        ph_vals.append(t)
    if writes_inputs and len(ph_vals) > 1:
        key.append(AliasEntry("inputs", "aliasing", f"_aliasing(({''.join(r + ', ' for r in ph_refs)}))",
                              alias_structure(ph_vals), tuple(ph_names)))
    for j, t in enumerate(constants):
        key.append(KeyEntry(f"constant {j}", "version", f"C[{j}]._version", t._version))
    key.append(KeyEntry("grad mode", "enabled", "G.enabled", grad_mode._state.enabled))
    for j, (desc, m) in enumerate(modules):
        flags = tuple(x.training for x in m.modules()) if hasattr(m, "modules") else (m.training,)
        key.append(KeyEntry("module" if desc == "self" else f"module {desc}", "training flags", f"_training(M[{j}])",
                            flags))
    return key
