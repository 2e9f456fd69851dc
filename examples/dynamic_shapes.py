"""Experiment 5 of the chapter (§10.4): count the artifacts ``tp.compile(fn, dynamic=True)`` makes.

    python examples/dynamic_shapes.py

(1) example 10.4: a shape branch gives 2 artifacts, sizes 0, 1 and general give 3;
(2) the shape guard of an artifact, each condition with the assumption it came from;
(3) a function whose artifact count grows with the number of sizes (``range`` over a size
    specialises it), rewritten so that one artifact serves every size.
"""
import tensorplay as tp


class Counting:
    """A backend that counts the graphs it is given and runs each as captured."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs, **kw):
        self.graphs.append(gm)
        return gm.forward


def artifacts(fn, sizes, cols=4):
    backend = Counting()
    cf = tp.compile(fn, dynamic=True, backend=backend, recompile_limit=32)
    for n in sizes:
        x = tp.randn(n, cols)
        cf(x)
        assert (cf(x) - fn(x)).abs().max().item() < 1e-5      # equal to eager for every size
    return len(backend.graphs), cf


def branch(x):
    if x.shape[0] % 8 == 0:
        return (x * 2).sum(-1)
    return (x + 1).sum(-1)


def plain(x):
    return (x.exp() + 1).sum(0)


def per_row(x):            # range() needs a concrete int: the size is specialised (a guard n == 5)
    total = x[0]
    for i in range(1, x.shape[0]):
        total = total + x[i]
    return total


def vectorised(x):         # the same sum without a Python loop over a size: stays symbolic
    return x.sum(0)


if __name__ == "__main__":
    sizes = [64, 16, 24, 12, 40, 3, 13]
    n, _ = artifacts(branch, sizes)
    print(f"(1) shape branch, sizes {sizes}: {n} artifacts")
    n, _ = artifacts(plain, [7, 0, 1, 2, 100, 0, 1, 33])
    print(f"    sizes 0, 1 and general: {n} artifacts")
    _, cf = artifacts(branch, [48])
    print("(2) the shape guard of the first artifact:")
    print(cf._cache[0].guard.source)
    sizes = list(range(2, 12))
    n1, cf1 = artifacts(per_row, sizes)
    n2, _ = artifacts(vectorised, sizes)
    print(f"(3) {len(sizes)} sizes: the loop over range(x.shape[0]) gives {n1} artifacts, x.sum(0) gives {n2}")
    print("    why the loop recompiles:", cf1.recompile_reasons[0][0])
