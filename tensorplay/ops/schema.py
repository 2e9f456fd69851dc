"""Operator schemas: the signature language of the op table (chapter §1.2, "the operator registry").

A schema reads like ``add(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor``.  It is the single
description of an op's arguments from which the table derives everything positional:

* the generated Python function (`tp.add`, `Tensor.add`), with the right defaults and keyword-only
  arguments, which packs every call into one *canonical argument tuple* (schema order, defaults
  filled in) — eager kernels, meta functions, derivative formulas and, later, the tracer all see that
  tuple, never ``*args/**kwargs``;
* which positions hold tensors (``Tensor``, ``Tensor?``, ``Tensor[]``, ``Index``) and must be
  unwrapped, differentiated and guarded;
* which argument an in-place op mutates (``Tensor(a!)``), and the shape of the return value.

Guarantee: parsing is total on the grammar below and raises ``SchemaError`` naming the schema otherwise.

    schema  := NAME '(' [arg {',' arg}] ')' '->' ret
    arg     := '*' | TYPE NAME ['=' DEFAULT]
    ret     := TYPE | '(' TYPE [NAME] {',' TYPE [NAME]} ')'
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

__all__ = ["Arg", "Schema", "SchemaError", "parse_schema"]


class SchemaError(ValueError):
    pass


@dataclass(frozen=True)
class Arg:
    name: str
    type: str
    default: object = None
    has_default: bool = False
    kwarg_only: bool = False

    @property
    def is_tensor(self) -> bool:  # a single (possibly optional) tensor
        return self.type in ("Tensor", "Tensor?") or self.type.startswith("Tensor(")

    @property
    def is_tensor_list(self) -> bool:
        return self.type in ("Tensor[]", "Tensor?[]")

    @property
    def is_index(self) -> bool:  # a Python indexing expression that may contain tensors
        return self.type == "Index"

    @property
    def is_mutated(self) -> bool:
        return "!" in self.type


@dataclass
class Schema:
    name: str
    args: list[Arg]
    returns: list[tuple[str, str]]  # (type, field name or "")
    text: str = ""
    # derived
    tensor_pos: tuple[int, ...] = field(default=())
    list_pos: tuple[int, ...] = field(default=())
    index_pos: tuple[int, ...] = field(default=())
    mutated_pos: int | None = None

    @property
    def arg_names(self) -> list[str]:
        return [a.name for a in self.args]

    @property
    def returns_tuple(self) -> bool:
        return len(self.returns) > 1

    @property
    def returns_list(self) -> bool:
        return len(self.returns) == 1 and self.returns[0][0] == "Tensor[]"

    @property
    def returns_tensor(self) -> bool:
        return len(self.returns) == 1 and self.returns[0][0].startswith("Tensor") and not self.returns_list

    def python_signature(self) -> str:
        parts, star = [], False
        for a in self.args:
            if a.kwarg_only and not star:
                parts.append("*")
                star = True
            parts.append(f"{a.name}={a.default!r}" if a.has_default else a.name)
        return ", ".join(parts)


_ARG = re.compile(r"^\s*([A-Za-z_][\w\[\]\?\(\)!]*(?:\[\])?\??)\s+([A-Za-z_]\w*)\s*(?:=\s*(.+?))?\s*$")


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def parse_schema(text: str) -> Schema:
    m = re.match(r"^\s*([A-Za-z_]\w*)\s*\((.*)\)\s*->\s*(.+?)\s*$", text)
    if not m:
        raise SchemaError(f"malformed schema: {text!r}")
    name, argtext, rettext = m.groups()
    args: list[Arg] = []
    kwonly = False
    for piece in _split_top(argtext):
        piece = piece.strip()
        if piece == "*":
            kwonly = True
            continue
        am = _ARG.match(piece)
        if not am:
            raise SchemaError(f"schema {name}: cannot parse argument {piece!r}")
        typ, aname, dflt = am.groups()
        if dflt is not None:
            try:
                value = ast.literal_eval(dflt)
            except (ValueError, SyntaxError) as e:
                raise SchemaError(f"schema {name}: bad default {dflt!r} for {aname}") from e
            args.append(Arg(aname, typ, value, True, kwonly))
        else:
            if args and args[-1].has_default and not kwonly:
                raise SchemaError(f"schema {name}: non-default argument {aname} follows a default")
            args.append(Arg(aname, typ, None, False, kwonly))
    rettext = rettext.strip()
    if rettext.startswith("("):
        rets = []
        for r in _split_top(rettext[1:-1]):
            bits = r.split()
            rets.append((bits[0], bits[1] if len(bits) > 1 else ""))
    else:
        rets = [(rettext, "")]
    s = Schema(name, args, rets, text)
    s.tensor_pos = tuple(i for i, a in enumerate(args) if a.is_tensor)
    s.list_pos = tuple(i for i, a in enumerate(args) if a.is_tensor_list)
    s.index_pos = tuple(i for i, a in enumerate(args) if a.is_index)
    mutated = [i for i, a in enumerate(args) if a.is_mutated]
    if len(mutated) > 1:
        raise SchemaError(f"schema {name}: at most one mutated argument is supported")
    s.mutated_pos = mutated[0] if mutated else None
    return s
