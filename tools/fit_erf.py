"""Fit the float32 erf table of ``cpp/tp_math.h`` (``fp<float>::erf_tab_c`` / ``erf_tab_p``);
``fit_table`` also serves ``tools/fit_tanh.py``.

The table has eight entries, chosen per lane by ``i = trunc(2|x|)``:

* entry 0, ``|x| < 1/2``: ``erf(x) = x + x P_0(x^2)`` (relative accuracy down to the subnormals);
* entry i = 1..7, ``|x|`` in ``[i/2, i/2 + 1/2)`` (the last one up to 3.95; erf rounds to 1 from
  3.9192): ``erf(a) = P_i(a - c_i)``.  The centre ``c_i`` is a float near the middle whose
  ``erf(c_i)`` lies within a tiny fraction of an ulp of a float (Gal's accurate-table trick), so
  the constant coefficient ``P_i(0)`` is exact and the final Horner step rounds only once.

Each polynomial is a weighted (1/ulp) least-squares fit on a dense grid against mpmath, its
coefficients rounded to float one at a time from the lowest degree with the rest refitted after
each rounding.  Prints the C++ rows (row k holds the degree-(DEG-k) coefficients) and, on stderr,
the approximation error before evaluation rounding.  Usage: ``python tools/fit_erf.py [DEG]``
(DEG = 7 is in the header: at most 0.035 ulp before rounding; 0.66 ulp measured end to end on
every float32 in [0, 4)).
"""
import sys

import mpmath
import numpy as np

mpmath.mp.dps = 40


def c_literal(v):
    v = float(np.float32(v))
    if v == 0:
        return "0.0f"
    mant, ex = v.hex().split("p")
    return f"{mant.rstrip('0').rstrip('.')}p{ex}f"


def ulp32(v):
    return np.spacing(np.abs(v).astype(np.float32)).astype(np.float64)


def fit_rounded(basis, target, w, fixed=()):
    """weighted least squares; coefficients rounded to float32 from the lowest degree up, the rest
    refitted after each rounding"""
    n = basis.shape[1]
    coef = np.zeros(n)
    coef[:len(fixed)] = fixed
    for k in range(len(fixed), n):
        r = target - basis[:, :k] @ coef[:k]
        sol = np.linalg.lstsq(basis[:, k:] * w[:, None], r * w, rcond=None)[0]
        coef[k] = float(np.float32(sol[0]))
    return coef


def as_f32(bits):
    return np.array([bits], np.uint32).view(np.float32)[0]


def centre(f, lo, hi, at=0.5):
    """(offset in ulp, c, f(c) as float): a float c within 0.1 of ``lo + at (hi - lo)`` whose f(c)
    is closest to a float (f rises to 1: solved on the scale of log(1 - f), well conditioned near 1)"""
    mid = lo + at * (hi - lo)
    f0 = np.float32(float(f(mpmath.mpf(mid))))
    best = None
    for k in range(-8, 9):
        t = float(f0 + np.float32(k) * np.spacing(f0))
        if not t < 1:
            continue
        try:
            c = mpmath.findroot(lambda u: mpmath.log(1 - f(u)) - mpmath.log(1 - mpmath.mpf(t)), mid, tol=1e-25)
        except (ValueError, ZeroDivisionError):
            continue
        bits = int(np.array([float(c)], np.float32).view(np.uint32)[0])
        for d in range(-300, 301):
            cc = as_f32(bits + d)
            e = f(mpmath.mpf(float(cc)))
            ff = np.float32(float(e))
            off = abs(float(e - mpmath.mpf(float(ff)))) / float(np.spacing(ff))
            if abs(float(cc) - mid) < 0.1 and (best is None or off < best[0]):
                best = (off, cc, ff)
    return best


def fit_table(f, name, n, hi, deg, at=lambda i: 0.5):
    """The C++ rows of an n-entry table for an odd function f rising to 1: entry 0 is x + x P(x^2)
    on [0, 1/2), entry i is P_i(|x| - c_i) on [i/2, i/2 + 1/2) (the last one up to ``hi``); the
    centre of entry i sits near ``at(i)`` of its interval.  Prints fit details on stderr."""
    def fv(v):
        return float(f(mpmath.mpf(float(v))))
    cols, cents, errs = [], [], []
    z = np.linspace(0, 0.25, 3000)[1:]
    x = np.sqrt(z)
    ref = np.array([fv(v) for v in x])
    basis = np.stack([z ** k for k in range(deg)], 1)
    p = fit_rounded(basis, (ref - x) / x, x / ulp32(ref))
    cols.append(np.concatenate([p, [0.0]]))
    cents.append(0.0)
    errs.append(np.max(np.abs(x + x * (basis @ p) - ref) / ulp32(ref)))
    for i in range(1, n):
        lo, top = 0.5 * i, (0.5 * i + 0.5 if i < n - 1 else hi)
        off, c, c0 = centre(f, lo, top, at(i))
        x = np.linspace(lo, top, 3000)
        ref = np.array([fv(v) for v in x])
        basis = np.stack([(x - float(c)) ** k for k in range(deg + 1)], 1)
        col = fit_rounded(basis, ref, 1 / ulp32(ref), fixed=(float(c0),))
        cols.append(col)
        cents.append(float(c))
        errs.append(np.max(np.abs(basis @ col - ref) / ulp32(ref)))
        print(f"[{lo}, {top}): centre {float(c)!r}, {name}(centre) {off:.5f} ulp from a float", file=sys.stderr)
    print("approximation error (ulp):", " ".join(f"{e:.3f}" for e in errs), file=sys.stderr)
    out = [f"    static constexpr float {name}_tab_c[{n}] = {{" + ", ".join(c_literal(c) for c in cents) + "};",
           f"    static constexpr float {name}_tab_p[{deg + 1}][{n}] = {{"]
    for k in range(deg, -1, -1):
        out.append("        {" + ", ".join(c_literal(cols[i][k]) for i in range(n)) + "},")
    out.append("    };")
    return "\n".join(out)


if __name__ == "__main__":
    print(fit_table(mpmath.erf, "erf", 8, 3.95, int(sys.argv[1]) if len(sys.argv) > 1 else 7))
