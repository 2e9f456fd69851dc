"""The package's shape: its modules import each other without cycles, ``import tensorplay`` does
not load it (``tp.distributed`` is imported on first use), and the package does not import its
launcher (``python -m tensorplay.distributed.launch`` runs that module as ``__main__``)."""
import os
import subprocess
import sys

import networkx as nx

from spmd import REPO

sys.path.insert(0, str(REPO / "test"))
from test_layout import import_graph  # noqa: E402


def test_no_import_cycles():
    g = import_graph("tensorplay.distributed")
    assert g.has_edge("tensorplay.distributed.shard_map", "tensorplay.distributed.collectives")
    assert [c for c in nx.strongly_connected_components(g) if len(c) > 1] == []
    assert not any(b == "tensorplay.distributed.launch" for _, b in g.edges())


def test_import_is_lazy():
    code = ("import sys, tensorplay as tp; assert 'tensorplay.distributed' not in sys.modules; "
            "assert 'dist_psum' not in tp.ops.OPS; tp.distributed.Mesh; assert 'dist_psum' in tp.ops.OPS")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr
