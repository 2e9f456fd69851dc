"""The ``ops`` interface: what a compute function may say (chapter §6.1–6.2).

Every value of the loop-level IR is a function from an index to a value, written against ``ops``:

    def inner_fn(index):                    # index: list of sympy expressions in loop variables
        x = ops.load("buf0", 2048 * index[0] + index[1])
        return ops.mul(ops.relu(x), ops.constant(2.0, torch.float32))

``ops`` forwards every call to the *current handler* (``set_handler``), so one compute function has
several meanings: the CPU backend's printer (cpp/ops.py) turns it into kernel source, a range analysis
could bound it, a counter could price it (materialisation decisions, §6.6).

The interface (all handlers accept these; values are handler-specific objects):

* memory and indices: ``load(buffer_name, index_expr)``, ``index_expr(expr, dtype)``,
  ``constant(value, dtype)``;
* control: ``where(cond, a, b)``, ``masked(mask, body_fn, other)`` (loads in ``body_fn`` touch memory
  only where ``mask`` holds; elsewhere the value is ``other``), ``to_dtype(x, dtype)``;
* data-dependent indices: ``indirect_indexing(value, size, wrap_negative, check)`` checks a loaded
  index against ``[0, size)`` in the kernel and returns a tag for ``bounds.IndirectIndex(tag, size)``
  (other handlers return 0);
* arithmetic: add sub mul truediv floordiv truncdiv remainder fmod neg abs sign reciprocal pow
  maximum minimum square (integer floordiv/truncdiv/remainder/fmod by zero is an error the kernel
  reports, like eager's ZeroDivisionError; these four take an optional ``op=``: the op-table name
  the error names, by default floor_divide, div, remainder, fmod);
* math: exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan sinh cosh tanh
  sigmoid erf erfc floor ceil trunc round atan2 hypot;
* comparisons and logic: eq ne lt le gt ge logical_and logical_or logical_not logical_xor
  bitwise_and bitwise_or bitwise_xor bitwise_not bitwise_left_shift bitwise_right_shift (torch's
  out-of-range shift counts) isnan isinf;
* random numbers (counter-based, so a value can be recomputed anywhere): ``rand(seed, offset,
  stream, dtype)`` uniform on [0, 1), ``randn(seed, offset, stream, dtype)`` standard normal,
  ``randint64(seed, offset, stream, low, high)`` int64 uniform on [low, high).  ``seed`` is an
  int64 value (the graph's seed, loaded from its buffer), ``offset`` an int64 index value (the
  element's row-major index), ``stream`` a Python int (the random op's number in the graph); the
  result depends on these three only (Philox4x32-10 in the C++ prelude).

Reductions are not ops calls: a :class:`~.ir.Reduction` node carries the reduction type and the
kernel generator emits the accumulator code (monoid associativity, invariant 6).  Its
``inner_fn(index, rindex)`` returns one value per reduced element, in the accumulator's dtype
(argmax/argmin: in the input's dtype; the generator pairs it with the element's flat index).
"""
from __future__ import annotations

import contextlib
import threading

__all__ = ["ops", "set_handler", "OPS_NAMES", "UNARY", "BINARY", "COMPARE", "RANDOM", "TRANSCENDENTAL"]

UNARY = ("neg", "abs", "sign", "reciprocal", "square", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p",
         "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "erf",
         "erfc", "floor", "ceil", "trunc", "round", "logical_not", "bitwise_not", "isnan", "isinf")
BINARY = ("add", "sub", "mul", "truediv", "floordiv", "truncdiv", "remainder", "fmod", "pow", "maximum", "minimum",
          "atan2", "hypot", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
          "bitwise_left_shift", "bitwise_right_shift")
COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")
RANDOM = ("rand", "randn", "randint64")
#: functions whose recomputation is expensive (the materialisation cost model counts them)
TRANSCENDENTAL = frozenset({"exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
                            "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "erf", "erfc", "pow", "atan2",
                            "hypot"} | set(RANDOM))
OPS_NAMES = ("load", "index_expr", "constant", "where", "masked", "to_dtype",
             "indirect_indexing") + UNARY + BINARY + COMPARE + RANDOM

_local = threading.local()


class _Ops:
    """The global ``ops`` object: attribute access goes to the current handler."""

    def __getattr__(self, name):
        h = getattr(_local, "handler", None)
        if h is None:
            raise RuntimeError(f"ops.{name} called outside a handler (use ops_handler.set_handler)")
        try:
            return getattr(h, name)
        except AttributeError:
            raise AttributeError(f"the {type(h).__name__} handler has no op {name!r}") from None


ops = _Ops()


@contextlib.contextmanager
def set_handler(handler):
    prev = getattr(_local, "handler", None)
    _local.handler = handler
    try:
        yield handler
    finally:
        _local.handler = prev


class CountingHandler:
    """Prices a compute function: how many loads and transcendental calls it makes.  Used by the
    materialisation heuristic (choices.py) — recomputing a cheap value in every reader beats
    writing and reading it back; an ``exp`` read by two reductions does not (CPU, §6.6)."""

    def __init__(self):
        self.loads = set()
        self.n_loads = 0
        self.transcendental = 0
        self.ops = 0

    def __getattr__(self, name):
        if name not in OPS_NAMES:
            raise AttributeError(name)

        def f(*args, **kw):
            self.ops += 1
            if name in TRANSCENDENTAL:
                self.transcendental += 1
            if name == "load":
                self.loads.add(args[0])
                self.n_loads += 1
            if name == "masked":
                return args[1]()
            return 0
        return f
