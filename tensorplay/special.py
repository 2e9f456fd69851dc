"""``tp.special``: PyTorch's ``torch.special`` namespace over the op table.

Every function here is an op-table entry (tensorplay/ops/special.py and the pointwise, reduction
and normalisation families) under the name ``torch.special`` gives it, so results, dtype promotion
and derivatives are those of the table's entry, bit-identical to ``torch.special`` in eager mode.
Aliases (``expit`` is ``sigmoid``, ``gammaln`` is ``lgamma``, ``psi`` is ``digamma``...) are the
same function objects, so a compiled graph sees one op either way.
"""
from __future__ import annotations

from .ops import OPS

__all__ = ["entr", "ndtr", "ndtri", "log_ndtr", "erfcx", "xlog1py", "i0e", "i1", "i1e", "i0", "xlogy",
           "expit", "logit", "gammaln", "digamma", "psi", "polygamma", "multigammaln", "erf", "erfc", "erfinv",
           "expm1", "exp2", "log1p", "sinc", "round", "logsumexp", "softmax", "log_softmax", "gammainc", "gammaincc",
           "zeta", "airy_ai", "bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0",
           "modified_bessel_i1", "modified_bessel_k0", "modified_bessel_k1",
           "scaled_modified_bessel_k0", "scaled_modified_bessel_k1", "spherical_bessel_j0"]

_f = {name: OPS[name].fn for name in OPS}
#: torch.special name -> op-table entry
_TABLE_NAMES = {"entr": "special_entr", "ndtr": "special_ndtr", "ndtri": "special_ndtri",
                "log_ndtr": "special_log_ndtr", "erfcx": "special_erfcx", "xlog1py": "special_xlog1py",
                "i0e": "special_i0e", "i1": "special_i1", "i1e": "special_i1e", "i0": "i0", "xlogy": "xlogy",
                "expit": "sigmoid", "gammaln": "lgamma", "digamma": "digamma", "psi": "digamma",
                "polygamma": "polygamma", "erf": "erf", "erfc": "erfc", "erfinv": "erfinv", "expm1": "expm1",
                "exp2": "exp2", "log1p": "log1p", "sinc": "sinc", "logsumexp": "logsumexp",
                "gammainc": "special_gammainc", "gammaincc": "special_gammaincc", "zeta": "special_zeta"}
_TABLE_NAMES.update({n[len("special_"):]: n for n in OPS if n.startswith("special_") and "bessel" in n})
_TABLE_NAMES["airy_ai"] = "special_airy_ai"
globals().update({name: _f[op] for name, op in _TABLE_NAMES.items()})


def logit(input, eps=None):
    """log(p / (1 - p)), ``input`` first clamped to [eps, 1 - eps] when eps is given."""
    return _f["logit"](input, eps)


def round(input, decimals=0):
    """Round half to even to ``decimals`` places."""
    return _f["round"](input, decimals=decimals)


def multigammaln(input, p):
    """Multivariate log-gamma of dimension ``p`` (``tp.mvlgamma``)."""
    return _f["mvlgamma"](input, p)


def softmax(input, dim, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim`` (computed in ``dtype`` if given)."""
    return _f["softmax"](input, dim, dtype)


def log_softmax(input, dim, dtype=None):
    """x - logsumexp(x) along ``dim`` (computed in ``dtype`` if given)."""
    return _f["log_softmax"](input, dim, dtype)


def __getattr__(name):
    raise AttributeError(f"tp.special has no function {name!r} (torch.special.{name} is not implemented here)")
