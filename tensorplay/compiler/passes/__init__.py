"""Graph passes of Stax's front end (chapter §4): rewriting the op-level graph before lowering.

Every pass is a function ``pass_name(gm) -> bool`` that edits ``gm.graph`` in place and reports
whether it changed anything; each module's docstring states what the pass does, the seed section it
implements and the **termination measure** that the pass strictly decreases whenever it reports a
change (Prop. 4.1: a rewrite system whose rules all decrease a well-founded measure terminates).

=================  ============================================================================
canonicalize       methods / Python operators / free functions -> op-table nodes, canonical args
simplify           IEEE-754-safe identities (x*1, x+0, x-0, x/1, neg(neg x), x**1, x/2^k)
constant_fold      evaluate pure non-random nodes whose tensor inputs are all constants
decompose          expand ops outside the backend basis by their ``OpDef.decomp`` (Prop. 4.3)
cse                value numbering with a memory epoch (never across an in-place op)
dce                backward reachability from the outputs and the side effects
regions            mark maximal connected groups of pointwise nodes (``node.meta["region"]``)
functionalize      in-place ops and mutation through views -> pure ops + scatter inverses (§4.4)
pipeline           :func:`run_passes`: functionalise once, then the rest to a fixed point
=================  ============================================================================

Shared by the passes: ``node_meta`` (a new node's meta value from its op's meta kernel) and
``splice`` (replace a node by a function traced on its metas: canonicalisation, decomposition).

Each pass lives in the module of the same name; import the function from there
(``from tensorplay.compiler.passes.cse import cse``) or use the module attribute
(``passes.cse.cse(gm)``).  The package itself exports the modules, :func:`run_passes`,
:func:`decomposition_depth` and :class:`DecompositionCycleError`.
"""
from . import canonicalize, constant_fold, cse, dce, decompose, functionalize, pipeline, regions, simplify  # noqa: F401
from .decompose import DecompositionCycleError, decomposition_depth
from .pipeline import DEFAULT_PASSES, run_passes

__all__ = ["canonicalize", "simplify", "constant_fold", "decompose", "cse", "dce", "regions", "functionalize",
           "pipeline", "run_passes", "decomposition_depth", "DecompositionCycleError", "DEFAULT_PASSES"]
