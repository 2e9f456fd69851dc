"""Tags of the op table that the compiler reads instead of keeping lists of names, checked against
PyTorch: ``may_copy`` (functionalisation's alias analysis and Stax's view rules ask it) is on
exactly the view ops whose torch result is a copy for some input layout; the ``flops`` formulas of
matrix products and convolutions give 2·M·N·K and 2·(output elements)·(C_in/groups · kernel)."""
import math

import pytest
import torch

import tensorplay as tp
from tensorplay.compiler.cost import cost_analysis

OPS = tp.ops.OPS

#: every view op of the table, as torch calls it on a (2, 3, 4) tensor
VIEW_CALLS = {
    "view": lambda x: x.view(24),
    "reshape": lambda x: x.reshape(24),
    "permute": lambda x: x.permute(2, 0, 1),
    "transpose": lambda x: x.transpose(0, 2),
    "swapaxes": lambda x: x.swapaxes(0, 1),
    "expand": lambda x: x.expand(2, 2, 3, 4),
    "broadcast_to": lambda x: x.broadcast_to((2, 2, 3, 4)),
    "unsqueeze": lambda x: x.unsqueeze(1),
    "squeeze": lambda x: x[:1].squeeze(),
    "flatten": lambda x: x.flatten(),
    "unflatten": lambda x: x.unflatten(2, (2, 2)),
    "t": lambda x: x[0].t(),
    "movedim": lambda x: x.movedim(0, 2),
    "contiguous": lambda x: x.contiguous(),
    "narrow": lambda x: x.narrow(2, 1, 2),
    "select": lambda x: x.select(1, 2),
    "split": lambda x: x.split([1, 2], 1),
    "chunk": lambda x: x.chunk(2, 2),
    "unbind": lambda x: x.unbind(1),
    "diagonal": lambda x: x.diagonal(0, 1, 2),
    "as_strided": lambda x: x.as_strided((2, 2), (1, 1)),
    "getitem": lambda x: x[:, 1::2, None],
    "atleast_1d": lambda x: torch.atleast_1d(x),
    "atleast_2d": lambda x: torch.atleast_2d(x),
    "atleast_3d": lambda x: torch.atleast_3d(x),
    "tensor_split": lambda x: x.tensor_split([1, 3], 2),
    "hsplit": lambda x: x.hsplit(3),
    "vsplit": lambda x: x.vsplit([1]),
    "dsplit": lambda x: x.dsplit(2),
    "unfold": lambda x: x.unfold(2, 2, 1),
}


def _layouts(seed=0):
    """(2, 3, 4) float tensors: contiguous, permuted storage, a strided slice, a stride-0 dim, an offset."""
    g = torch.Generator().manual_seed(seed)

    def r(*s):
        return torch.randn(*s, generator=g)
    return {"contiguous": r(2, 3, 4), "permuted": r(4, 3, 2).permute(2, 1, 0), "sliced": r(2, 3, 8)[..., ::2],
            "expanded": r(1, 3, 4).expand(2, 3, 4), "offset": r(50)[2:26].view(2, 3, 4)}


def _aliases(out, x) -> bool:
    return out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()


def test_every_view_op_is_covered():
    views = {n for n, op in OPS.items() if op.is_view and not op.is_inplace}
    assert views == set(VIEW_CALLS), f"view ops without a case here: {sorted(views - set(VIEW_CALLS))}"


@pytest.mark.parametrize("name", sorted(VIEW_CALLS))
def test_may_copy_is_torch_semantics(name):
    """``may_copy`` <=> torch returns a copy for some layout (``view`` raises there instead: always an
    alias when it returns)."""
    copies = []
    for layout, x in _layouts().items():
        try:
            out = VIEW_CALLS[name](x)
        except RuntimeError:
            continue
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not all(_aliases(o, x) for o in outs):
            copies.append(layout)
    assert ("may_copy" in OPS[name].tags) == bool(copies), \
        f"{name}: torch copies for layouts {copies}; tags {sorted(OPS[name].tags)}"


def _flops(fn, *args):
    low = tp.compile(fn, backend="eager").lower(*args)
    return cost_analysis(low.graph_module)["flops"]


def test_matmul_and_conv_flops():
    g = torch.Generator().manual_seed(3)
    a, b = (tp.from_torch(torch.randn(*s, generator=g)) for s in ((5, 7), (7, 3)))
    assert _flops(lambda a, b: a @ b, a, b) == 2 * 5 * 3 * 7
    assert _flops(lambda a, b: tp.mm(a, b), a, b) == 2 * 5 * 3 * 7
    x, w = (tp.from_torch(torch.randn(*s, generator=g)) for s in ((2, 4, 9, 9), (6, 2, 3, 3)))
    out = math.prod((2, 6, 7, 7))
    assert _flops(lambda x, w: tp.nn.functional.conv2d(x, w, groups=2), x, w) == 2 * out * 2 * 3 * 3
    assert "conv" in OPS["conv2d"].tags and "linalg" in OPS["mm"].tags
