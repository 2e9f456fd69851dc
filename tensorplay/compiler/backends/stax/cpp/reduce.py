"""C++ of reduction accumulators (the chapter, §8.3; invariant 6: associativity).

A monoid reduction (sum ... all) keeps ``nacc`` vectors ``acc_<buf>_<u>`` combined with
``_COMBINE`` and reduced across lanes with ``_HREDUCE``.  argmax/argmin keep a ``tp::ArgAcc``
(per-lane value + int64 index) and welford a ``tp::WelfordAcc`` (per-lane n, mean, m2; Chan
combine): cpp_prelude.h.  The nodes of one multi-result reduction (Reduction.multi: same inner_fn)
share the accumulator of the first of them in the kernel (the *leader*, kernel_plan.py); the
others only read its results.  Guarantee: the accumulators start at the monoid's identity, a
tail adds only its first ``n`` lanes, and the final value combines every accumulator and lane.
"""
from __future__ import annotations

import torch

from ..ir import Reduction
from .ops import CTYPE, literal, vec_type

__all__ = ["acc_decl", "acc_update", "acc_final", "acc_final_columns"]

_IDENTITY = {"sum": 0, "prod": 1, "any": 0, "all": 1}
_COMBINE = {"sum": "({a} + {b})", "prod": "({a} * {b})", "max": "tp::maximum({a}, {b})",
            "min": "tp::minimum({a}, {b})", "any": "({a} | {b})", "all": "({a} & {b})"}
_HREDUCE = {"sum": "tp::reduce_add", "prod": "tp::reduce_mul", "max": "tp::reduce_max", "min": "tp::reduce_min",
            "any": "tp::reduce_max", "all": "tp::reduce_min"}


def _identity(rtype, dtype):
    if rtype in _IDENTITY:
        return literal(_IDENTITY[rtype], dtype)
    ct = CTYPE[dtype]
    if dtype.is_floating_point:
        return f"{'-' if rtype == 'max' else ''}std::numeric_limits<{ct}>::infinity()"
    return f"std::numeric_limits<{ct}>::{'lowest' if rtype == 'max' else 'max'}()"


def _is_max(rt):
    return "true" if rt == "argmax" else "false"


def acc_decl(n, acc_dt, nacc):
    rt, ct = n.buf.data.reduction_type, CTYPE[acc_dt]
    if rt in ("argmax", "argmin"):
        return [f"tp::ArgAcc<{ct}> acc_{n.name}_{u} = tp::arg_identity<{_is_max(rt)}, {ct}>();" for u in range(nacc)]
    if rt == "welford":
        return [f"tp::WelfordAcc<{ct}> acc_{n.name}_{u};" for u in range(nacc)]
    return [f"{vec_type(acc_dt)} acc_{n.name}_{u}({_identity(rt, acc_dt)});" for u in range(nacc)]


def acc_update(n, acc_dt, unroll, v, mode):
    """The statement folding this iteration's value ``v`` (argmax: (value, index)) into
    accumulator ``unroll``; in a tail only the first ``n`` lanes count."""
    rt = n.buf.data.reduction_type
    acc = f"acc_{n.name}_{unroll}"
    tail = mode in ("tail", "tail1")
    mask = ", tp_tail_mask<float>(n)" if tail else ""
    if rt in ("argmax", "argmin"):
        return f"tp::arg_update<{_is_max(rt)}>({acc}, {v[0]}, {v[1]}{mask});"
    if rt == "welford":
        return f"tp::welford_update({acc}, {v}{mask});"
    val = v.name
    if acc_dt == torch.bool and v.dtype != torch.bool:
        val = f"tp_bool_from_mask({v} != {vec_type(v.dtype)}(0))"
    if tail:
        val = f"tp::where(tp_tail_mask<{CTYPE[acc_dt]}>(n), {val}, {vec_type(acc_dt)}({_identity(rt, acc_dt)}))"
    return f"{acc} = {_COMBINE[rt].format(a=acc, b=val)};"


def acc_final(n, acc_dt, sibs, nacc):
    """Combine the ``nacc`` accumulators, then the lanes, into ``v_<buf>`` of every sibling."""
    rt, ct = n.buf.data.reduction_type, CTYPE[acc_dt]
    acc = [f"acc_{n.name}_{u}" for u in range(nacc)]
    if rt in Reduction.OUTPUTS:
        comb = acc[0]
        for a in acc[1:]:
            comb = (f"tp::arg_combine<{_is_max(rt)}>({comb}, {a})" if rt != "welford"
                    else f"tp::welford_combine({comb}, {a})")
        res = {o: f"r_{n.name}_{o}" for o in Reduction.OUTPUTS[rt]}
        rct = {o: ("int64_t" if o == "index" else ct) for o in res}
        out = [f"{rct[o]} {var};" for o, var in res.items()]
        if rt == "welford":
            out.append(f"tp::welford_reduce({comb}, {res['mean']}, {res['m2']}, {res['count']});")
        else:
            out.append(f"tp::arg_reduce<{_is_max(rt)}>({comb}, {res['value']}, {res['index']});")
        return out + [f"v_{o.name} = {res[o.buf.data.output]};" for o in sibs]
    comb = acc[0]
    for a in acc[1:]:
        comb = _COMBINE[rt].format(a=comb, b=a)
    red = f"{_HREDUCE[rt]}({comb})"
    if acc_dt == torch.bool:
        red = f"(int32_t)({red} != 0)"
    return [f"v_{n.name} = {red};"]


def acc_final_columns(n, sibs, u):
    """Column mode: accumulator ``u`` holds one output column per lane, so its results are the
    vectors ``v_<buf>_<u>`` of every sibling as they are (no combine, no horizontal reduce)."""
    rt, acc = n.buf.data.reduction_type, f"acc_{n.name}_{u}"
    res = {"index": f"{acc}.idx", "value": f"{acc}.val"} if rt in ("argmax", "argmin") else \
        {"mean": f"{acc}.mean", "m2": f"{acc}.m2", "count": f"{acc}.counts()"} if rt == "welford" else {None: acc}
    return [f"v_{o.name}_{u} = {res[o.buf.data.output]};" for o in sibs]
