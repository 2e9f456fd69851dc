"""The chapter's programming experiments that need only the installed package.

* ``python -m tensorplay.experiments.roofline`` -- experiment 1, roofline and attribution (§13.1-
  13.4): the machine's B and P, tables 13.1/13.2's cases on the roofline, the speed-up
  decomposition S = rho * beta_c / beta_e (fig. 13.1), compile amortisation, the size sweep and
  the rounding-error model; figures and a JSON of the numbers (docs/experiment1.md).
* ``tensorplay.experiments.cases``: the cases of tables 13.1 and 13.2, over a tensor library.
"""
