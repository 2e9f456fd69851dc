"""Fit the float32 tanh table of ``cpp/tp_math.h`` (``fp<float>::tanh_tab_c`` / ``tanh_tab_p``).

Same scheme as ``tools/fit_erf.py``, with sixteen entries chosen per lane by ``i = trunc(2 min(|x|,
7.75))``: entry 0, ``|x| < 1/2``: ``tanh(x) = x + x P_0(x^2)``; entry i = 1..15, ``|x|`` in
``[i/2, i/2 + 1/2)`` (the last one up to the clamp 9.02; tanh rounds to 1 from 9.0109):
``tanh(a) = P_i(a - c_i)`` with ``tanh(c_i)`` within a tiny fraction of an ulp of a float.
Usage: ``python tools/fit_tanh.py [DEG]`` (DEG = 7 is in the header).
"""
import os
import sys

import mpmath

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fit_erf import fit_table  # noqa: E402

if __name__ == "__main__":
    # [1/2, 1): results just below 1/2 have half the ulp of those near 0.76, so the centre sits
    # nearer the low end (smaller |x - c| where the ulp is small; needed without FMA)
    print(fit_table(mpmath.tanh, "tanh", 16, 9.02, int(sys.argv[1]) if len(sys.argv) > 1 else 7,
                    at=lambda i: 0.3 if i == 1 else 0.5))
