"""Meshes, specs and shardings in one process: the seed's shape table on an abstract X=4, Y=2 mesh,
the errors, and the whole manual-mode path on a one-device mesh (which needs no process group).
Nothing here starts a process."""
import numpy as np
import pytest
import torch

import tensorplay as tp
import tensorplay.distributed as D
from tensorplay.distributed import P, NamedSharding

MESH_4x2 = D.Mesh(np.arange(8).reshape(4, 2), ("X", "Y"))


# ---- the seed's table ---------------------------------------------------------------------------------
def test_seed_shape_table():
    inp = NamedSharding(MESH_4x2, P("X", "Y"))
    assert inp.shard_shape((8, 2048)) == (2, 1024) and inp.replicated_axes == () and inp.num_replicas == 1
    w = NamedSharding(MESH_4x2, P("Y", None))
    assert w.shard_shape((2048, 8192)) == (1024, 8192) and w.replicated_axes == ("X",) and w.num_replicas == 4
    # devices along X hold the same block of W; devices along Y different ones
    idx = w.devices_indices_map((2048, 8192))
    assert idx[0] == idx[2] == idx[4] == idx[6] == (slice(0, 1024), slice(0, 8192))
    assert idx[1] == (slice(1024, 2048), slice(0, 8192))
    # P(('X', 'Y')) splits one dimension 8 ways, X major
    joint = NamedSharding(MESH_4x2, P(("X", "Y")))
    assert joint.shard_shape((8, 2048)) == (1, 2048)
    assert [joint.index(r, (8, 2048))[0].start for r in range(8)] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert [NamedSharding(MESH_4x2, P(("Y", "X"))).index(r, (8, 2048))[0].start for r in range(8)] == \
        [0, 4, 1, 5, 2, 6, 3, 7]


def test_mesh_is_a_value():
    m = D.make_mesh((4, 2), ("X", "Y"))
    assert m == MESH_4x2 and hash(m) == hash(MESH_4x2) and m.shape == {"X": 4, "Y": 2} and m.size == 8
    assert m.coords(5) == {"X": 2, "Y": 1} and m.axis_size(("X", "Y")) == 8
    assert m.peers(5, "X") == (1, 3, 5, 7) and m.peers(5, ("Y", "X")) == (0, 2, 4, 6, 1, 3, 5, 7)
    assert m.linear_index(5, ("X", "Y")) == 5 and m.linear_index(5, ("Y", "X")) == 6
    assert "{'X': 4, 'Y': 2}" in repr(m)


def test_partition_spec():
    assert P("X", None) == ("X", None) and P(("X",)) == P("X") and P(()) == P(None)
    assert repr(P(("X", "Y"), None)) == "P(('X', 'Y'), None)"
    assert P("X", ("Y", "Z")).mentioned == ("X", "Y", "Z") and P().mentioned == ()
    with pytest.raises(TypeError, match="PartitionSpec entries"):
        P(3)


def test_mesh_and_sharding_errors():
    with pytest.raises(ValueError, match="2 axis names"):
        D.Mesh(np.arange(8), ("X", "Y"))
    with pytest.raises(ValueError, match="distinct"):
        D.Mesh(np.arange(4).reshape(2, 2), ("X", "X"))
    with pytest.raises(ValueError, match="each once"):
        D.Mesh(np.array([0, 0, 1, 2]), ("X",))
    with pytest.raises(ValueError, match="unknown axis name 'Z'.*axes \\('X', 'Y'\\)"):
        NamedSharding(MESH_4x2, P("Z"))
    with pytest.raises(ValueError, match="more than once"):
        NamedSharding(MESH_4x2, P("X", "X"))
    with pytest.raises(ValueError, match="3 entries, but the array has 2 dimensions"):
        NamedSharding(MESH_4x2, P("X", None, None)).shard_shape((8, 8))


@pytest.mark.parametrize("spec, shape, dim, size, axes", [
    (P("X"), (6, 2), 0, 6, "axis 'X'"),
    (P(None, "Y"), (4, 3), 1, 3, "axis 'Y'"),
    (P(("X", "Y")), (12, 2), 0, 12, "axes \\('X', 'Y'\\)"),
])
def test_uneven_split_names_dim_size_and_axis(spec, shape, dim, size, axes):
    n = MESH_4x2.axis_size(spec.axes_of(dim))
    msg = f"dimension {dim} of size {size} is not divisible by the size {n} of mesh {axes}"
    with pytest.raises(ValueError, match=msg):
        NamedSharding(MESH_4x2, spec).shard_shape(shape)
    with pytest.raises(ValueError, match=msg):     # before anything needs a process group
        D.device_put(tp.zeros(*shape), NamedSharding(MESH_4x2, spec))


def test_abstract_mesh_cannot_place_data():
    with pytest.raises(RuntimeError, match="mesh of 8 devices .* needs an initialised process group of 8"):
        D.device_put(tp.zeros(8, 2), NamedSharding(MESH_4x2, P("X")))
    with pytest.raises(RuntimeError, match="needs an initialised process group"):
        D.shard_map(lambda b: b, MESH_4x2, P("X"), P("X"))(tp.zeros(8))


# ---- a one-device mesh: the manual mode in this process -------------------------------------------------
ONE = D.make_mesh((1,), ("X",))


def test_one_device_round_trip_and_printing():
    x = tp.arange(6.).reshape(2, 3)
    a = D.device_put(x, NamedSharding(ONE, P("X")))
    assert torch.equal(a.local()._data, x._data) and torch.equal(a.gather()._data, x._data)
    assert repr(a) == "ShardedArray(global=[2, 3], spec=P('X'), local=[2, 3], mesh={'X': 1}, float32)"
    assert a.addressable_shards[0].index == (slice(0, 2), slice(0, 3)) and a.local().data_ptr() != x.data_ptr()
    assert D.device_put(a, a.sharding) is a


def test_one_device_collectives_are_identities():
    x = tp.arange(4.).reshape(2, 2)

    def body(b):
        assert D.axis_index("X") == 0 and D.axis_size("X") == 1 and D.psum(1, "X") == 1
        return (D.psum(b, "X"), D.pmean(b, "X"), D.pmax(b, "X"), D.all_gather(b, "X"), D.all_gather(b, "X", tiled=True),
                D.psum_scatter(b, "X", tiled=True), D.ppermute(b, "X", [(0, 0)]), D.all_to_all(b, "X", 0, 1, tiled=True))
    outs = D.shard_map(body, ONE, P(), P())(x)
    for o in outs:
        assert torch.equal(o.local()._data.reshape(2, 2), x._data), o


def test_shard_map_errors():
    x = tp.zeros(2, 2)
    with pytest.raises(ValueError, match="in_specs has 2 entries, but the function got 1 arguments"):
        D.shard_map(lambda b: b, ONE, (P(), P()), P())(x)
    with pytest.raises(ValueError, match="unknown axis name 'Z': the mesh has axes \\('X',\\)"):
        D.shard_map(lambda b: D.psum(b, "Z"), ONE, P(), P())(x)
    with pytest.raises(ValueError, match="unknown axis name 'Z'"):
        D.shard_map(lambda b: b, ONE, P("Z"), P())(x)
    with pytest.raises(ValueError, match="out_specs P\\(None, None, 'X'\\) has 3 entries"):
        D.shard_map(lambda b: b, ONE, P(), P(None, None, "X"))(x)
    with pytest.raises(ValueError, match="out_specs has 2 entries, but result is a Tensor"):
        D.shard_map(lambda b: b, ONE, P(), (P(), P()))(x)
    with pytest.raises(TypeError, match="keyword arguments"):
        D.shard_map(lambda b: b, ONE, P(), P())(b=x)
    with pytest.raises(RuntimeError, match="collectives run inside shard_map"):
        D.psum(x, "X")
    with pytest.raises(RuntimeError, match="shard_map inside shard_map"):
        D.shard_map(lambda b: D.shard_map(lambda c: c, ONE, P(), P())(b), ONE, P(), P())(x)
    with pytest.raises(ValueError, match="a source appears twice"):
        D.shard_map(lambda b: D.ppermute(b, "X", [(0, 0), (0, 0)]), ONE, P(), P())(x)


def test_compiled_body_is_specialised_to_its_mesh():
    """A compiled local function keeps the mesh of its first call; another mesh is an error, not a
    collective over the wrong processes."""
    other = D.make_mesh((1, 1), ("X", "Y"))
    cf = tp.compile(lambda b: D.psum(b * 2, "X") + 1, backend="eager")
    x = tp.ones(2)
    assert torch.equal(D.shard_map(cf, ONE, P(), P())(x).local()._data, torch.full((2,), 3.))
    with pytest.raises(RuntimeError, match="specialised to the mesh it was first called under"):
        D.shard_map(cf, other, P(), P())(x)


def test_import_is_lazy_and_registers_the_collectives():
    assert {"dist_psum", "dist_all_gather", "dist_ppermute", "dist_all_to_all"} <= set(tp.ops.OPS)
    assert tp.distributed is D
