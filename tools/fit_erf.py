"""Fit the float32 erf table of ``cpp_prelude.h`` (``fp<float>::erf_tab_c`` / ``erf_tab_p``).

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
DEG = int(sys.argv[1]) if len(sys.argv) > 1 else 7
HI = 3.95


def erf_m(v):
    return mpmath.erf(mpmath.mpf(float(v)))


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


def centre(lo, hi):
    """(offset in ulp, c, erf(c) as float): a float c within 0.1 of the middle of [lo, hi] whose erf
    is closest to a float"""
    mid = 0.5 * (lo + hi)
    f0 = np.float32(float(erf_m(mid)))
    best = None
    for k in range(-8, 9):
        f = float(f0 + np.float32(k) * np.spacing(f0))
        if not f < 1:
            continue
        try:   # erf(c) = f, solved on erfc's log scale (well conditioned near 1)
            c = mpmath.findroot(lambda t: mpmath.log(mpmath.erfc(t)) - mpmath.log(1 - mpmath.mpf(f)), mid, tol=1e-25)
        except ValueError:
            continue
        bits = int(np.array([float(c)], np.float32).view(np.uint32)[0])
        for d in range(-300, 301):
            cc = as_f32(bits + d)
            e = erf_m(cc)
            ff = np.float32(float(e))
            off = abs(float(e - mpmath.mpf(float(ff)))) / float(np.spacing(ff))
            if abs(float(cc) - mid) < 0.1 and (best is None or off < best[0]):
                best = (off, cc, ff)
    return best


def main():
    cols, cents, errs = [], [], []
    z = np.linspace(0, 0.25, 3000)[1:]
    x = np.sqrt(z)
    ref = np.array([float(erf_m(v)) for v in x])
    basis = np.stack([z ** k for k in range(DEG)], 1)
    p = fit_rounded(basis, (ref - x) / x, x / ulp32(ref))
    cols.append(np.concatenate([p, [0.0]]))
    cents.append(0.0)
    errs.append(np.max(np.abs(x + x * (basis @ p) - ref) / ulp32(ref)))
    for i in range(1, 8):
        lo, hi = 0.5 * i, min(0.5 * i + 0.5, HI)
        off, c, c0 = centre(lo, hi)
        x = np.linspace(lo, hi, 3000)
        ref = np.array([float(erf_m(v)) for v in x])
        basis = np.stack([(x - float(c)) ** k for k in range(DEG + 1)], 1)
        col = fit_rounded(basis, ref, 1 / ulp32(ref), fixed=(float(c0),))
        cols.append(col)
        cents.append(float(c))
        errs.append(np.max(np.abs(basis @ col - ref) / ulp32(ref)))
        print(f"[{lo}, {hi}): centre {float(c)!r}, erf(centre) {off:.5f} ulp from a float", file=sys.stderr)
    print("approximation error (ulp):", " ".join(f"{e:.3f}" for e in errs), file=sys.stderr)
    print("    static constexpr float erf_tab_c[8] = {" + ", ".join(c_literal(c) for c in cents) + "};")
    print(f"    static constexpr float erf_tab_p[{DEG + 1}][8] = {{")
    for k in range(DEG, -1, -1):
        print("        {" + ", ".join(c_literal(cols[i][k]) for i in range(8)) + "},")
    print("    };")


if __name__ == "__main__":
    main()
