"""Operator decomposition (chapter §4.3, Prop. 4.3; exercise 7).

A backend supports a *basis* B of ops (a set of op names; ``None`` means every op is in the basis,
so nothing is expanded).  A node whose op is not in B and has ``OpDef.decomp`` — a function written
in tp ops that takes the op's canonical arguments — is replaced by the traced decomposition: the
function is captured with ``execute=False`` on the node's meta values (shapes, dtypes, strides,
no data), the captured nodes are spliced in before the node, its placeholders bound to the node's
inputs and its constants copied into the GraphModule, and the node's uses go to the spliced result
(for multi-output ops, each ``getitem`` projection goes to the corresponding result).  A
decomposition that itself uses in-place ops is functionalised before splicing; one that would
mutate its inputs is refused.

**Depth (Prop. 4.3).**  ``depth(o) = 0`` if ``o`` is in B or has no decomposition, else
``1 + max depth(o')`` over the ops ``o'`` its decomposition emits.  The decomposition graph is
discovered by tracing (a decomposition is Python code, its ops are known once it runs on argument
metas), following every emitted op outside B.  If the graph has a cycle — exercise 7:
``o1 -> o2 + o3``, ``o2 -> o1 * c`` — the depth is undefined and recursive expansion would not
terminate: :func:`decomposition_depth` raises :class:`DecompositionCycleError` naming the cycle.
Putting ``o2`` into B cuts the cycle and ``depth(o1) = 1``.  The pass checks the depth of every
node before expanding it.

Termination measure: the multiset of depths of the nodes outside B, ordered by the multiset
ordering (Dershowitz–Manna): one expansion removes an element of depth d and adds elements of depth
< d only, so the measure strictly decreases; multiset orderings over a well-founded order are
well-founded.

A decomposition that cannot be traced on meta values (a data-dependent branch, a node without
meta) leaves its node in place, with the reason in ``node.meta["decompose_error"]``.

Tracing and splicing are splice.py's (shared with canonicalisation).
"""
from __future__ import annotations

import torch

from ..._tensor import _wrap
from ...ops.registry import OPS
from ..graph.node import Node, map_arg
from .functionalize import functionalize, is_mutation
from .splice import MissingMeta, meta_tensor, replace_with_trace

__all__ = ["decompose", "decompose_nodes", "decomposition_depth", "DecompositionCycleError"]


class DecompositionCycleError(RuntimeError):
    """The decomposition table has a cycle outside the basis (Prop. 4.3's depth is undefined)."""


# ---------------------------------------------------------------------------------------------
# depth (Prop. 4.3)
# ---------------------------------------------------------------------------------------------
def _in_basis(name, basis):
    return basis is None or name in basis


def _expandable(op, basis):
    return op is not None and op.decomp is not None and not _in_basis(op.name, basis)


def _example_args(op):
    """Canonical arguments synthesised from the schema (meta tensors 2x2 float32), for
    ``decomposition_depth(name)`` called without arguments."""
    out = []
    for a in op.schema.args:
        if a.is_tensor:
            out.append(None if a.type == "Tensor?" else _wrap(torch.empty(2, 2, device="meta")))
        elif a.is_tensor_list:
            out.append([_wrap(torch.empty(2, 2, device="meta"))])
        elif a.has_default:
            out.append(a.default)
        elif a.type in ("int", "Scalar", "float"):
            out.append(1)
        elif a.type.startswith("int[]"):
            out.append([2, 2])
        elif a.type == "bool":
            out.append(False)
        else:
            raise ValueError(f"decomposition_depth({op.name}): cannot synthesise an example for argument "
                             f"{a.name}: {a.type}; pass args=")
    return tuple(out)


def _trace_decomp(op, args):
    """Trace ``op.decomp`` on ``args`` (nodes with meta, tp tensors, or numbers)."""
    from ..capture.tracer import capture
    vals = map_arg(tuple(args), meta_tensor)
    return capture(op.decomp, tuple(vals), {}, execute=False, name=f"decomp_{op.name}")


def _depth(op, args, basis, stack, memo):
    if not _expandable(op, basis):
        return 0
    if op.name in stack:
        cyc = stack[stack.index(op.name):] + [op.name]
        raise DecompositionCycleError(
            f"decomposition cycle outside the basis: {' -> '.join(cyc)}; the depth of Prop. 4.3 is undefined "
            f"and recursive expansion would not terminate (put one of {sorted(set(cyc))} into the basis)")
    cap = _trace_decomp(op, args)
    best = 0
    stack.append(op.name)
    try:
        for n in cap.gm.graph.nodes:
            d = n.opdef
            if n.op == "call_function" and _expandable(d, basis):
                key = (d.name, _sig(n.args))
                if key not in memo:
                    memo[key] = _depth(d, n.args, basis, stack, memo)
                best = max(best, memo[key])
    finally:
        stack.pop()
    return 1 + best


def _sig(args):
    def leaf(x):
        if isinstance(x, Node):
            v = x.meta.get("val")
            return ("T", tuple(v.shape), str(v.dtype)) if isinstance(v, torch.Tensor) else ("N",)
        return repr(x)
    out = []
    map_arg(args, lambda n: out.append(leaf(n)))
    return repr(args.__class__) + repr(out) + repr(map_arg(args, lambda n: "N"))


def decomposition_depth(op_name: str, basis=None, args=None) -> int:
    """Prop. 4.3's depth of ``op_name`` relative to ``basis`` (0: in the basis or primitive).

    ``args`` is the op's canonical argument tuple (graph nodes with meta values, tp tensors — meta
    tensors suffice — or Python values); without it, an example is synthesised from the schema.
    Raises :class:`DecompositionCycleError` if the decomposition graph has a cycle outside the
    basis."""
    op = OPS[op_name]
    if not _expandable(op, basis):
        return 0
    if args is None:
        args = _example_args(op)
    return _depth(op, args, basis, [], {})


# ---------------------------------------------------------------------------------------------
# the pass
# ---------------------------------------------------------------------------------------------
def decompose(gm, basis=None) -> bool:
    """Expand every node whose op is outside ``basis`` and has a decomposition (module doc, §4.3).
    Measure: the multiset of decomposition depths of the nodes outside the basis (Prop. 4.3);
    raises DecompositionCycleError before rewriting a node whose depth is undefined."""
    if basis is None:
        return False
    basis = set(basis)
    g = gm.graph
    changed = False

    def wanted(n):
        return n.op == "call_function" and _expandable(n.opdef, basis) and "decompose_error" not in n.meta
    work = [n for n in g.nodes if wanted(n)]
    while work:
        node = work.pop(0)
        if node not in g.nodes:
            continue
        before = set(g.nodes)
        # decomposition_depth raises on a cycle before any rewrite
        if not _expand(gm, node, lambda node=node: decomposition_depth(node.opdef.name, basis, node.args)):
            continue
        changed = True
        work = [n for n in g.nodes if n not in before and wanted(n)] + work
    return changed


def _functional_only(traced, node):
    """A decomposition that uses in-place ops is functionalised before splicing; one that would
    mutate its inputs is refused (module doc)."""
    functionalize(traced)
    if any(is_mutation(n) and not n.meta.get("private_inplace") for n in traced.graph.nodes):
        raise RuntimeError(f"the traced replacement of {node.name} mutates its inputs")


def _expand(gm, node, check=None) -> bool:
    """Replace ``node`` by its op's traced decomposition (after ``check()``).  A node that cannot be
    traced symbolically (e.g. a data-dependent branch) stays -- the backend runs it as an extern op
    -- with the reason in ``node.meta["decompose_error"]``, so that no fixed point is disturbed."""
    from ..capture.proxy import CaptureError
    try:
        if check is not None:
            check()
        replace_with_trace(gm, node, node.opdef.decomp, node.args, prepare=_functional_only)
    except (CaptureError, MissingMeta) as e:
        node.meta["decompose_error"] = str(e)
        return False
    return True


def decompose_nodes(gm, pred) -> bool:
    """Expand the nodes for which ``pred(node)`` holds by their op's decomposition (one level; a
    backend's choice for particular nodes, e.g. small attention in a training region)."""
    nodes = [n for n in gm.graph.nodes
             if n.op == "call_function" and n.opdef is not None and n.opdef.decomp is not None and pred(n)]
    return any([_expand(gm, n) for n in nodes])
