"""The backward engine: ``backward`` and ``grad`` over the TPX graph (chapter §5.1).

Algorithm: from the roots, count for every reachable node how many edges lead into it
(dependencies); a node is ready once all gradients flowing into it have arrived; ready nodes run
latest-created first (a max-heap on the creation sequence), which follows the reverse of the forward
order and frees saved tensors early.  With ``inputs=`` only nodes from which an input is reachable
run.

Guarantees: every node runs at most once per call and only after all its incoming gradients were
summed; gradients of unused outputs are materialised as zeros of the right shape; grad mode during
backward is ``create_graph``, so formulas (written in tp ops) build a differentiable graph exactly
when higher-order gradients are asked for; nodes are freed after use unless ``retain_graph``.
"""
from __future__ import annotations

import heapq

import torch

from .._tensor import Tensor, _wrap
from . import grad_mode
from .graph import AccumulateGrad, edge_of

__all__ = ["backward", "grad"]


#: ``f(node, grads) -> node.apply(grads)`` run instead of each node's ``apply`` (a recording
#: profiler: profiler/hooks.py), or None
node_hook = None


def _make_root_grads(outputs, grad_outputs, who):
    roots = []
    for i, (t, g) in enumerate(zip(outputs, grad_outputs)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{who}: outputs must be Tensors, got {type(t).__name__}")
        if not t.requires_grad:
            raise RuntimeError(f"{who}: element {i} of tensors does not require grad and does not have a grad_fn")
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"{who}: grad can be implicitly created only for scalar outputs "
                                   f"(output {i} has shape {list(t.shape)}); pass a gradient")
            g = _wrap(torch.ones_like(t._data, memory_format=torch.preserve_format))
        elif not isinstance(g, Tensor):
            g = Tensor(g, dtype=t.dtype, device=t.device)
        if g.shape != t.shape:
            raise RuntimeError(f"{who}: gradient {i} has shape {list(g.shape)} but output has shape {list(t.shape)}")
        e = edge_of(t)
        if e is not None:  # None: a view made under no_grad (requires grad through its base, no history)
            roots.append((e, g))
    return roots


def _run(roots, retain_graph, create_graph, targets=None, capture=None):
    """Core loop.  ``targets``: set of (node, nr) edges whose gradient is captured into ``capture``
    instead of flowing further (grad()); ``None`` means accumulate into leaves (backward())."""
    # 1. dependency counts over the reachable graph (iterative DFS)
    deps: dict = {}
    stack = list(dict.fromkeys(e[0] for e, _ in roots))  # a node rooted twice counts once
    seen = set(stack)
    while stack:
        n = stack.pop()
        for e in n.next_edges:
            if e is None:
                continue
            c = e[0]
            deps[c] = deps.get(c, 0) + 1
            if c not in seen:
                seen.add(c)
                stack.append(c)
    # 2. prune to nodes that lead to a target (grad(..., inputs) / backward(inputs=...))
    needed = None
    if targets is not None:
        target_nodes = {e[0] for e in targets}
        needed = set()
        order = _topo(seen)
        for n in reversed(order):  # children before parents
            if n in target_nodes or any(e is not None and e[0] in needed for e in n.next_edges):
                needed.add(n)
    buffers: dict = {}

    def _add(node, nr, g):
        buf = buffers.get(node)
        if buf is None:
            buf = buffers[node] = [None] * max(1, len(node.out_meta))
        buf[nr] = g if buf[nr] is None else buf[nr] + g

    heap = []
    for e, g in roots:
        _add(e[0], e[1], g)
    for n in {e[0] for e, _ in roots}:
        if deps.get(n, 0) == 0:
            heapq.heappush(heap, (-n.seq, id(n), n))
    with grad_mode.set_grad_enabled(create_graph):
        while heap:
            _, _, node = heapq.heappop(heap)
            grads = buffers.pop(node, None) or [None]
            # tensor hooks of non-leaf outputs (and retain_grad)
            if node.pre_hooks:
                for nr, hooks in node.pre_hooks.items():
                    for h in list(hooks):
                        if grads[nr] is None:
                            continue
                        r = h(grads[nr])
                        if r is not None and not getattr(h, "_is_retain", False):
                            grads[nr] = r
            if targets is not None:
                for nr in range(len(grads)):
                    if (node, nr) in targets and grads[nr] is not None:
                        capture[(node, nr)] = grads[nr]
                if isinstance(node, AccumulateGrad) or not any(
                        e is not None and e[0] in needed for e in node.next_edges):
                    _release(node, [None] * len(node.next_edges), deps, heap, buffers, needed, _add)
                    continue
            if isinstance(node, AccumulateGrad) and targets is None:
                node.apply(grads) if node_hook is None else node_hook(node, grads)
                continue
            # materialise missing output grads as zeros
            for i, g in enumerate(grads):
                if g is None and i < len(node.out_meta) and node.out_meta[i] is not None:
                    shape, dtype, device = node.out_meta[i]
                    grads[i] = _wrap(torch.zeros(shape, dtype=dtype, device=device))
            in_grads = node.apply(grads) if node_hook is None else node_hook(node, grads)
            if node.post_hooks:
                for h in node.post_hooks:
                    r = h(in_grads, grads)
                    if r is not None:
                        in_grads = r
            if not retain_graph:
                node.release()
            _release(node, in_grads, deps, heap, buffers, needed, _add)


def _release(node, in_grads, deps, heap, buffers, needed, add):
    """Send a node's input gradients along its edges; children whose last dependency this was
    become ready (or, having received nothing, release their own subtree)."""
    for e, g in zip(node.next_edges, in_grads):
        if e is None:
            continue
        child = e[0]
        if g is not None and (needed is None or child in needed):
            add(child, e[1], g)
        deps[child] -= 1
        if deps[child] == 0:
            if child in buffers:
                heapq.heappush(heap, (-child.seq, id(child), child))
            else:
                _skip_subgraph(child, deps, heap, buffers)


def _skip_subgraph(node, deps, heap, buffers):
    """A node that received no gradient at all: its subtree still has to release its
    dependency counts so that nodes shared with other paths can become ready."""
    stack = [node]
    while stack:
        n = stack.pop()
        for e in n.next_edges:
            if e is None:
                continue
            c = e[0]
            deps[c] -= 1
            if deps[c] == 0:
                if c in buffers:
                    heapq.heappush(heap, (-c.seq, id(c), c))
                else:
                    stack.append(c)


def _topo(nodes):
    """Parents before children (reverse post-order), iteratively."""
    order, visited = [], set()
    for start in nodes:
        if start in visited:
            continue
        stack = [(start, iter([e[0] for e in start.next_edges if e is not None]))]
        visited.add(start)
        while stack:
            n, it = stack[-1]
            for c in it:
                if c not in visited:
                    visited.add(c)
                    stack.append((c, iter([e[0] for e in c.next_edges if e is not None])))
                    break
            else:
                stack.pop()
                order.append(n)
    order.reverse()
    return order


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    """Accumulate d(tensors)/d(leaf) into ``leaf.grad`` for every leaf reachable (or only ``inputs``)."""
    if isinstance(tensors, Tensor):
        tensors = [tensors]
    tensors = list(tensors)
    if grad_tensors is None or isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors] * len(tensors) if grad_tensors is None else [grad_tensors]
    if retain_graph is None:
        retain_graph = create_graph
    roots = _make_root_grads(tensors, grad_tensors, "backward")
    if inputs is not None:
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        edges = set()
        for t in inputs:
            e = edge_of(t)
            if e is None:
                raise RuntimeError("backward(inputs=...): every input must require grad")
            edges.add(e)
        capture = {}
        _run(roots, retain_graph, create_graph, targets=edges, capture=capture)
        for t in inputs:
            g = capture.get(edge_of(t))
            if g is not None:
                if t.grad_fn is None:
                    t._accumulate().apply([g])
                else:
                    t._grad = g if t._grad is None else t._grad + g
        return
    _run(roots, retain_graph, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=None,
         materialize_grads=False):
    """Return d(outputs)/d(inputs) without touching ``.grad``."""
    single_out = isinstance(outputs, Tensor)
    outputs = [outputs] if single_out else list(outputs)
    inputs_was_tensor = isinstance(inputs, Tensor)
    inputs = [inputs] if inputs_was_tensor else list(inputs)
    if grad_outputs is None or isinstance(grad_outputs, Tensor):
        grad_outputs = [None] * len(outputs) if grad_outputs is None else [grad_outputs]
    if retain_graph is None:
        retain_graph = create_graph
    if allow_unused is None:
        allow_unused = materialize_grads
    roots = _make_root_grads(outputs, list(grad_outputs), "grad")
    edges = []
    for i, t in enumerate(inputs):
        if not isinstance(t, Tensor):
            raise TypeError(f"grad: inputs must be Tensors, got {type(t).__name__}")
        e = edge_of(t)
        if e is None:
            raise RuntimeError(f"grad: input {i} does not require grad")
        edges.append(e)
    capture: dict = {}
    _run(roots, retain_graph, create_graph, targets=set(edges), capture=capture)
    res = []
    for i, (t, e) in enumerate(zip(inputs, edges)):
        g = capture.get(e)
        if g is None:
            if materialize_grads:
                g = _wrap(torch.zeros_like(t._data))
            elif not allow_unused:
                raise RuntimeError(f"grad: input {i} ({list(t.shape)}) was not used in the graph; "
                                   f"set allow_unused=True if this is intended")
        elif not create_graph:
            g = g.detach()
        res.append(g)
    return tuple(res)
