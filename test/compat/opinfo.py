"""PyTorch's OpInfo database run against TensorPlay: which entries tp exposes, and how many of their
samples agree with torch eagerly, under ``tp.compile`` and in their gradients.

``torch.testing._internal.common_methods_invocations.op_db`` (needs the ``expecttest`` package)
lists about 700 operator entries, each with a ``sample_inputs`` generator.  For each entry this
module

* resolves the entry in tensorplay (:func:`resolve`): its name as a path under ``tp``
  (``nn.functional.x`` -> ``tp.nn.functional.x``, ``linalg.x`` -> ``tp.linalg.x``), then its
  aliases, then the ``tp.Tensor`` method of that name (dunders like ``__radd__`` are methods).  An
  entry whose ``op`` is a lambda is called as that lambda with ``torch`` in its globals replaced by
  a namespace that looks names up in tensorplay only; it is exposed when its name resolves;
* runs at most ``max_samples`` of its samples in float32 and in one integer dtype it supports,
  converting torch tensors (also inside lists, tuples and kwargs) to ``tp.Tensor`` copies with the
  same strides, and compares with torch's own result on the same inputs
  (``torch.testing.assert_close``: shape, dtype and values with the dtype's default tolerance,
  NaN equal to NaN).  Random entries are seeded identically for both sides; an entry whose torch
  result differs between two runs with the same seed (``empty``: uninitialized memory) is compared
  on shape and dtype only, and not run compiled;
* compiled: the eager-passing samples of ``batch`` entries are traced as ONE ``tp.compile``
  program (one C++ translation unit: the g++ runs dominate the sweep's time); a batch that fails
  to compile is halved until the entry that breaks it is found, whose samples then fail with the
  message.  The first call is the capture run, the second call is the one judged, with a tolerance
  10x the eager one (a fused kernel may reassociate a float sum).  A sample whose eager run fails
  counts as a compiled failure too ("not run").  Random entries run alone, with
  ``stax.fallback_random`` (eager's random kernels, so the same seed gives torch's numbers);
* gradients: for entries that support autograd, on the first ``grad_samples`` float32 samples,
  ``tp.autograd`` against ``torch.autograd`` with the same random upstream gradient.

Results are :class:`EntryResult` records; :func:`failure_groups` groups failures by their first
message line.  Nothing here is a stub: a sample counts as passed only when the comparison ran.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
import types

import torch

import tensorplay as tp

__all__ = ["load_op_db", "resolve", "EntryResult", "run_entry", "run_all", "failure_groups", "summary"]

INT_DTYPES = (torch.int64, torch.int32)


@functools.lru_cache(maxsize=1)
def load_op_db():
    """torch's OpInfo list (imports torch's internal testing modules: a few seconds)."""
    from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def entry_id(info) -> str:
    return info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")


def _walk(root, path):
    obj = root
    for part in path.split("."):
        try:
            obj = getattr(obj, part)
        except Exception:   # a module's __getattr__ may raise something other than AttributeError
            return None
    return obj


def _lookup(name):
    """tp's callable for a torch name: ('function', fn) or ('method', name) or None."""
    if name.startswith("torch."):
        name = name[len("torch."):]
    if not (name.startswith("__") and name.endswith("__")):
        fn = _walk(tp, name)
        if callable(fn) and not isinstance(fn, type):
            return ("function", fn)
    if "." not in name and callable(getattr(tp.Tensor, name, None)):
        return ("method", name)
    return None


class _TpNamespace:
    """Stands for ``torch`` in a lambda entry's globals: attributes come from tensorplay only."""

    def __init__(self, root, prefix=""):
        self._root, self._prefix = root, prefix

    def __getattr__(self, name):
        obj = _walk(self._root, name)
        if obj is None:
            # dtypes, Size, finfo...: values, not ops, are shared with torch
            real = getattr(torch, name, None) if not self._prefix else None
            if isinstance(real, (torch.dtype, torch.device)) or real in (torch.Size, torch.finfo, torch.iinfo):
                return real
            raise AttributeError(f"tensorplay has no {self._prefix}{name}")
        if isinstance(obj, types.ModuleType):
            return _TpNamespace(obj, f"{self._prefix}{name}.")
        return obj


def resolve(info):
    """A function ``call(*args, **kwargs)`` running the entry on tp values, or None if tp does not
    expose it.  ``call.how`` says how it resolved."""
    op = info.op
    names = [info.name] + [a.name for a in getattr(info, "aliases", ()) or ()]
    found = None
    for n in names:
        found = _lookup(n)
        if found:
            break
    if found is None:
        return None
    if getattr(op, "__name__", "") == "<lambda>" and hasattr(op, "__code__"):
        g = dict(op.__globals__)
        g["torch"] = _TpNamespace(tp)
        lam = types.FunctionType(op.__code__, g, op.__name__, op.__defaults__, op.__closure__)

        def call(*args, **kwargs):
            return lam(*args, **kwargs)
        call.how = "lambda"
        return call
    kind, target = found
    if kind == "function":
        def call(*args, **kwargs):
            return target(*args, **kwargs)
        call.how = f"tp.{n}"
    else:
        def call(self, *args, **kwargs):
            return getattr(self, target)(*args, **kwargs)
        call.how = f"Tensor.{target}"
    return call


# -- conversions -----------------------------------------------------------------------------------

def _copy_like(x):
    if x.numel() > 1 and 0 not in x.stride() and not x.is_contiguous():
        try:
            t = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=x.device)
            t.copy_(x)
            return t
        except RuntimeError:
            pass
    return x.clone()


def to_tp(obj, grad_leaves=None):
    if isinstance(obj, torch.Tensor):
        t = tp.from_torch(_copy_like(obj.detach()))
        if grad_leaves is not None and obj.requires_grad:
            t.requires_grad_(True)
            grad_leaves.append(t)
        return t
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(to_tp(v, grad_leaves) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_tp(v, grad_leaves) for v in obj)
    if isinstance(obj, dict):
        return {k: to_tp(v, grad_leaves) for k, v in obj.items()}
    return obj


def to_torch(obj):
    if isinstance(obj, tp.Tensor):
        return obj.torch()
    if isinstance(obj, (list, tuple)):
        return [to_torch(v) for v in obj]
    return obj


def _flat(obj, out):
    if isinstance(obj, (list, tuple)):
        for v in obj:
            _flat(v, out)
    elif isinstance(obj, dict):
        for v in obj.values():
            _flat(v, out)
    else:
        out.append(obj)
    return out


def compare(actual, expected, scale=1.0):
    """assert_close on (nested) results; actual is tp's result converted to torch."""
    exp = to_torch(expected) if not isinstance(expected, torch.Tensor) else expected
    if isinstance(exp, torch.Tensor) or isinstance(actual, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or not isinstance(exp, torch.Tensor):
            raise AssertionError(f"result type {type(actual).__name__}, torch gives {type(exp).__name__}")
        kw = {}
        if scale != 1.0 and exp.dtype.is_floating_point:
            eps = torch.finfo(exp.dtype).eps
            kw = dict(rtol=scale * 1000 * eps / 8, atol=scale * 1e-5)
        torch.testing.assert_close(actual, exp.detach(), equal_nan=True, **kw)
        return
    if isinstance(exp, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(exp):
            raise AssertionError(f"result is {type(actual).__name__} of "
                                 f"{len(actual) if isinstance(actual, (list, tuple)) else '-'}, torch gives "
                                 f"{type(exp).__name__} of {len(exp)}")
        for a, e in zip(actual, exp):
            compare(a, e, scale)
        return
    torch.testing.assert_close(actual, exp, equal_nan=True)


def _message(exc) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    return text[:300]


def group_key(message: str) -> str:
    """A failure message with its numbers, shapes and quoted names blurred, to group like causes."""
    key = re.sub(r"\(self: [^)]*\)|\([^()]*\[[^\]]*\][^()]*\)", "(...)", message)
    key = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "N", key)
    return key[:160]


# -- running ---------------------------------------------------------------------------------------

@dataclasses.dataclass
class EntryResult:
    entry: str
    how: str = ""
    exposed: bool = False
    eager_total: int = 0
    eager_pass: int = 0
    compiled_total: int = 0
    compiled_pass: int = 0
    grad_total: int = 0
    grad_pass: int = 0
    failures: list = dataclasses.field(default_factory=list)   # (mode, message)


def _samples(info, dtype, max_samples):
    out = []
    try:
        gen = info.sample_inputs("cpu", dtype, requires_grad=False)
        for s in gen:
            out.append(s)
            if len(out) >= max_samples:
                break
    except Exception as e:     # noqa: BLE001 - an entry whose generator breaks on this dtype
        return [], _message(e)
    return out, None


def _torch_call(info, s):
    torch.manual_seed(0)
    return info.op(s.input, *s.args, **s.kwargs)


def _tp_call(call, s, leaves=None):
    args = to_tp((s.input, *s.args), leaves)
    kwargs = to_tp(dict(s.kwargs), leaves)
    torch.manual_seed(0)
    return call(*args, **kwargs)


def _dtypes(info):
    supported = info.supported_dtypes("cpu")
    ds = [torch.float32] if torch.float32 in supported else []
    for d in INT_DTYPES:
        if d in supported:
            ds.append(d)
            break
    return ds


def _strip(o, tensors):
    """The structure of ``o`` with each torch tensor replaced by its index in ``tensors``."""
    if isinstance(o, torch.Tensor):
        tensors.append(o)
        return _Slot(len(tensors) - 1)
    if isinstance(o, tuple) and hasattr(o, "_fields"):
        return type(o)(*(_strip(v, tensors) for v in o))
    if isinstance(o, (list, tuple)):
        return type(o)(_strip(v, tensors) for v in o)
    if isinstance(o, dict):
        return {k: _strip(v, tensors) for k, v in o.items()}
    return o


class _Slot:
    def __init__(self, i):
        self.i = i


def _fill(o, vals):
    if isinstance(o, _Slot):
        return vals[o.i]
    if isinstance(o, tuple) and hasattr(o, "_fields"):
        return type(o)(*(_fill(v, vals) for v in o))
    if isinstance(o, (list, tuple)):
        return type(o)(_fill(v, vals) for v in o)
    if isinstance(o, dict):
        return {k: _fill(v, vals) for k, v in o.items()}
    return o


@dataclasses.dataclass
class _Job:
    """The eager-passing samples of one entry and dtype, with torch's results, to run compiled."""
    res: "EntryResult"
    call: object
    samples: list
    expected: list
    random: bool


#: one C++ translation unit per compiled graph: a few g++ runs for the whole sweep instead of one
#: per kernel (the dominant cost of the compiled check on a 2-core machine)
COMPILE_OPTIONS = {"stax.cpp_wrapper": True}


def _run_compiled(jobs, name):
    """All samples of ``jobs`` as ONE tp.compile program; the second call is judged.  Returns the
    outputs per job, or raises (the caller splits the batch to find the entry that breaks it)."""
    tensors, skels = [], []
    for j in jobs:
        skels.append([_strip(((s.input, *s.args), dict(s.kwargs)), tensors) for s in j.samples])

    def program(*vals):
        outs = []
        for j, sks in zip(jobs, skels):
            for sk in sks:
                args, kwargs = _fill(sk, vals)
                outs.append(j.call(*args, **kwargs))
        return outs
    from tensorplay.compiler import config
    fn = tp.compile(program, name=name, options=dict(COMPILE_OPTIONS))
    # random entries: the compiled graph calls eager's random kernels (eager's numbers, same seed)
    with config.patch({"stax.fallback_random": any(j.random for j in jobs)}):
        torch.manual_seed(0)
        fn(*[to_tp(t) for t in tensors])                 # capture run (returns eager values)
        torch.manual_seed(0)
        got = fn(*[to_tp(t) for t in tensors])           # the judged run
    per, k = [], 0
    for j in jobs:
        per.append(got[k:k + len(j.samples)])
        k += len(j.samples)
    return per


def _judge(job, got):
    for g, e in zip(got, job.expected):
        try:
            compare(to_torch(g), e, scale=10.0)
            job.res.compiled_pass += 1
        except Exception as ex:  # noqa: BLE001
            job.res.failures.append(("compiled", _message(ex)))


def _compile_batch(jobs, depth=0):
    try:
        per = _run_compiled(jobs, f"opinfo_{entry_id_of(jobs[0])}_{len(jobs)}")
    except Exception as e:  # noqa: BLE001
        if len(jobs) == 1:
            jobs[0].res.failures.extend([("compiled", _message(e))] * len(jobs[0].samples))
            return
        half = len(jobs) // 2
        _compile_batch(jobs[:half], depth + 1)
        _compile_batch(jobs[half:], depth + 1)
        return
    for j, got in zip(jobs, per):
        _judge(j, got)


def entry_id_of(job):
    return re.sub(r"\W", "_", job.res.entry)


def run_compiled(jobs, batch=24):
    """Compiled check of eager-passing samples, ``batch`` entries per compiled program (random
    entries one per program, with eager's random numbers)."""
    plain = [j for j in jobs if not j.random]
    for i in range(0, len(plain), batch):
        _compile_batch(plain[i:i + batch])
    for j in jobs:
        if j.random:
            _compile_batch([j])


def _grad_check(call, info, s, res):
    res.grad_total += 1
    try:
        torch.manual_seed(1)
        ts = {"input": s.input, "args": s.args, "kwargs": s.kwargs}
        leaves_t = [t for t in _flat(ts, []) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not leaves_t:
            res.grad_total -= 1
            return
        req = [t.detach().clone().requires_grad_(True) for t in leaves_t]
        mapping = {id(a): b for a, b in zip(leaves_t, req)}

        def rebuild(o):
            if isinstance(o, torch.Tensor):
                return mapping.get(id(o), o)
            if isinstance(o, tuple) and hasattr(o, "_fields"):
                return type(o)(*(rebuild(v) for v in o))
            if isinstance(o, (list, tuple)):
                return type(o)(rebuild(v) for v in o)
            if isinstance(o, dict):
                return {k: rebuild(v) for k, v in o.items()}
            return o
        sr = type("S", (), {})()
        sr.input, sr.args, sr.kwargs = rebuild(s.input), rebuild(tuple(s.args)), rebuild(dict(s.kwargs))
        out_t = [o for o in _flat(_torch_call(info, sr), [])
                 if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad]
        if not out_t:
            res.grad_total -= 1
            return
        ups = [torch.randn_like(o) for o in out_t]
        gt = torch.autograd.grad(out_t, req, ups, allow_unused=True)
        leaves = []
        out_p = _tp_call(call, sr, leaves)
        out_p = [o for o in _flat(out_p, []) if isinstance(o, tp.Tensor) and o.is_floating_point()]
        loss = None
        for o, u in zip(out_p, ups):
            term = (o * tp.from_torch(u)).sum()
            loss = term if loss is None else loss + term
        gp = tp.autograd.grad(loss, leaves, allow_unused=True)
        for a, b in zip(gp, gt):
            if b is None:
                continue
            if a is None:
                raise AssertionError("tp gives no gradient where torch gives one")
            compare(a.torch(), b, scale=10.0)
        res.grad_pass += 1
    except Exception as e:  # noqa: BLE001
        res.failures.append(("grad", _message(e)))


def _uninitialized(info, s):
    """True when torch's own result differs between two runs with the same seed (``empty``: the
    values are whatever memory held; the ``*empty*`` entries always, since two runs may get the same
    memory); such entries are compared on shape and dtype only."""
    if "empty" in info.name:
        return True
    try:
        a, b = _torch_call(info, s), _torch_call(info, s)
        compare(b, a)
        return False
    except Exception:  # noqa: BLE001
        return True


def compare_meta(actual, expected):
    exp = expected if isinstance(expected, torch.Tensor) else to_torch(expected)
    if isinstance(exp, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"result type {type(actual).__name__}, torch gives a Tensor")
        if (actual.shape, actual.dtype) != (exp.shape, exp.dtype):
            raise AssertionError(f"result {actual.dtype}{list(actual.shape)}, torch gives {exp.dtype}{list(exp.shape)}")
        return
    if isinstance(exp, (list, tuple)):
        for a, e in zip(actual, exp):
            compare_meta(a, e)


def _is_random(info, s):
    try:
        torch.manual_seed(0)
        a = info.op(s.input, *s.args, **s.kwargs)
        torch.manual_seed(1)
        b = info.op(s.input, *s.args, **s.kwargs)
        compare(b, a)
        return False
    except Exception:  # noqa: BLE001
        return True


def run_entry(info, *, max_samples=8, grad_samples=2, jobs=None) -> EntryResult:
    """Eager and gradient checks of one entry; appends its compiled work to ``jobs`` (a list)."""
    res = EntryResult(entry_id(info))
    call = resolve(info)
    if call is None:
        return res
    res.exposed, res.how = True, call.how
    for dtype in _dtypes(info):
        samples, err = _samples(info, dtype, max_samples)
        if err:
            continue
        passed, expected = [], []
        for s in samples:
            try:
                exp = _torch_call(info, s)
            except Exception:  # noqa: BLE001 - torch itself rejects this sample: not counted
                continue
            res.eager_total += 1
            res.compiled_total += 1
            try:
                got = _tp_call(call, s)
                if _uninitialized(info, s):
                    compare_meta(to_torch(got), exp)
                    res.eager_pass += 1
                    res.failures.append(("compiled", "not run: the result is uninitialized memory"))
                    continue
                compare(to_torch(got), exp)
                res.eager_pass += 1
                passed.append(s)
                expected.append(exp)
            except Exception as e:  # noqa: BLE001
                res.failures.append(("eager", _message(e)))
                res.failures.append(("compiled", "not run: the eager sample fails"))
        if jobs is not None and passed:
            jobs.append(_Job(res, call, passed, expected, _is_random(info, passed[0])))
        if dtype == torch.float32 and grad_samples and info.supports_autograd:
            for s in samples[:grad_samples]:
                _grad_check(call, info, s, res)
    if jobs is None:
        res.compiled_total = 0
    return res


def run_all(entries=None, *, max_samples=8, grad_samples=2, compiled=True, batch=24):
    """Every entry (or those named in ``entries``: entry ids or op names)."""
    db = load_op_db()
    if entries is not None:
        wanted = set(entries)
        db = [i for i in db if entry_id(i) in wanted or i.name in wanted]
    jobs = [] if compiled else None
    results = [run_entry(i, max_samples=max_samples, grad_samples=grad_samples, jobs=jobs) for i in db]
    if compiled:
        run_compiled(jobs, batch=batch)
    return results


def failure_groups(results, mode=None):
    groups = collections.Counter()
    where = collections.defaultdict(set)
    for r in results:
        for m, msg in r.failures:
            if mode is None or m == mode:
                k = (m, group_key(msg))
                groups[k] += 1
                where[k].add(r.entry)
    return [(m, k, n, sorted(where[(m, k)])) for (m, k), n in groups.most_common()]


def summary(results) -> dict:
    exp = [r for r in results if r.exposed]

    def rate(p, t):
        return p / t if t else 1.0
    e_t, e_p = sum(r.eager_total for r in exp), sum(r.eager_pass for r in exp)
    c_t, c_p = sum(r.compiled_total for r in exp), sum(r.compiled_pass for r in exp)
    g_t, g_p = sum(r.grad_total for r in exp), sum(r.grad_pass for r in exp)
    return dict(entries=len(results), exposed=len(exp), eager=(e_p, e_t, rate(e_p, e_t)),
                compiled=(c_p, c_t, rate(c_p, c_t)), grad=(g_p, g_t, rate(g_p, g_t)),
                entries_all_eager=sum(1 for r in exp if r.eager_total and r.eager_pass == r.eager_total))
