"""Tests of `AxisGroup`: a replica's group along mesh axes, and its collectives on 4 logical CPUs."""

import itertools

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives.axis_group import AxisGroup, batch_norm_group
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.mesh import AXES, DeviceMesh
from tests.strategies import mirrored

REPLICAS = 4


def test_members_along_each_axis_of_a_2x2x2x2x2x2_mesh():
    """Replica ids are row-major over (data, expert, pipeline, context, spatial, model): the group
    along one axis steps by that axis's stride, along two axes it is their product, in rank (id)
    order (the pipeline and context axes found as `model` and `expert` are)."""
    mesh = DeviceMesh(data=2, expert=2, pipeline=2, context=2, spatial=2, model=2)
    stride = {"data": 32, "expert": 16, "pipeline": 8, "context": 4, "spatial": 2, "model": 1}
    for replica in range(mesh.size):
        for axis in AXES:
            group = AxisGroup(axis, owner="t", mesh=mesh)
            first = replica - mesh.index(replica, axis) * stride[axis]
            assert group.members(replica) == [first, first + stride[axis]]
            assert group.rank(replica) == mesh.index(replica, axis)
            assert group.size == 2
        both = AxisGroup(("expert", "model"), owner="t", mesh=mesh)
        base = replica - mesh.index(replica, "expert") * 16 - mesh.index(replica, "model")
        assert both.members(replica) == [base, base + 1, base + 16, base + 17]
        assert both.size == 4


def test_batch_norm_group_is_a_block_of_batch_shards_with_their_tiles():
    """A batch-norm group of 4 replicas on (data=4, spatial=2): 2 batch shards x 2 tiles, the
    consecutive ids the design's batch norm names; not a multiple of the tiles: refused."""
    mesh = DeviceMesh(data=4, spatial=2)
    group = batch_norm_group(mesh, 4, owner="bn")
    assert group.size == 4
    assert [group.members(r) for r in (0, 3, 4, 7)] == [[0, 1, 2, 3]] * 2 + [[4, 5, 6, 7]] * 2
    assert [group.rank(r) for r in range(8)] == [0, 1, 2, 3] * 2
    assert batch_norm_group(mesh, 2, owner="bn").members(5) == [4, 5]  # its tiles only
    with pytest.raises(ValueError, match=r"`group_size` \(3\) of 'bn' must be a multiple of the 2"):
        batch_norm_group(mesh, 3, owner="bn")


def test_no_mesh_is_a_group_of_one_and_every_operation_the_identity():
    group = AxisGroup("model", owner="t")
    x = tf.constant([[1.0, 2.0]])
    assert group.size == 1 and group.rank() == 0 and group.index() == 0
    for op in (group.sum, group.copy, group.reduce, group.gather, group.all_to_all):
        assert op(x) is x
    with use_mesh(DeviceMesh(model=2)):
        assert AxisGroup("model", owner="t").size == 2  # the ambient mesh


def test_unknown_axis_and_missing_replica_context_are_refused():
    with pytest.raises(ValueError, match="unknown mesh axis 'rows'"):
        AxisGroup("rows", owner="t")
    group = AxisGroup("model", owner="proj", mesh=DeviceMesh(model=2))
    with pytest.raises(ValueError, match="'proj' splits work over the mesh's model axis"):
        group.copy(tf.zeros([2]))


def _meshes():
    """Every mesh of two axes of size 2 (4 replicas): each axis appears in three of them."""
    for a, b in itertools.combinations(AXES, 2):
        yield DeviceMesh(**{a: 2, b: 2})


@pytest.fixture(scope="module")
def strategy():
    return mirrored(REPLICAS)


# The meshes README's default run checks: each axis in at least one.
DEFAULT_MESHES = (
    "DeviceMesh(data=2, model=2)",
    "DeviceMesh(data=2, pipeline=2)",
    "DeviceMesh(data=2, context=2)",
    "DeviceMesh(expert=2, pipeline=2)",
    "DeviceMesh(spatial=2, model=2)",
)


# Extended (CI runs them after README's default run): every mesh but five. The default run covers
# each axis in a mesh of DEFAULT_MESHES here (data x model, data x pipeline, data x context,
# expert x pipeline, spatial x model) and the spatial groups in layers/test_spatial.py.
@pytest.mark.parametrize(
    "mesh",
    [m if str(m) in DEFAULT_MESHES else pytest.param(m, marks=pytest.mark.extended)
     for m in _meshes()],
    ids=str,
)  # fmt: skip
def test_collectives_over_each_group_match_numpy(mesh, strategy):
    """On data that differs per replica: the group sum (and its gradient), max, gather, the
    last-axis gather, f/g and all-to-all equal their NumPy definitions over the members."""
    rng = np.random.default_rng(mesh.size + len(str(mesh)))
    x = rng.normal(size=(REPLICAS, 2, 3)).astype(np.float32)  # replica r's input: x[r]
    w = rng.normal(size=(REPLICAS, 2, 3)).astype(np.float32)  # its loss weights
    used = [axis for axis in AXES if getattr(mesh, axis) > 1]
    groups = [AxisGroup(axis, owner=f"g{axis}", mesh=mesh) for axis in used]
    groups.append(AxisGroup(tuple(used), owner="both", mesh=mesh))

    def replica_fn(xr, wr):
        outputs = []
        for g in groups:
            with tf.GradientTape() as tape:
                tape.watch(xr)
                summed = g.sum(xr)
                reduced = g.reduce(g.copy(xr) * 2.0)
                loss = tf.reduce_sum(summed * wr) + tf.reduce_sum(reduced * wr)
            grad = tape.gradient(loss, xr)
            n = g.size
            exchanged = g.all_to_all(tf.reshape(tf.tile(xr, [n, 1]), [n, 2, 3]))
            outputs.append(
                (summed, reduced, grad, g.max(xr), g.gather(xr), g.gather_last(xr), exchanged)
            )
        return outputs

    def per_replica(values):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(values[ctx.replica_id_in_sync_group])
        )

    step = tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))
    results = step(per_replica(x), per_replica(w))
    for g, outputs in zip(groups, results, strict=True):
        local = [
            np.stack([t.numpy() for t in strategy.experimental_local_results(o)]) for o in outputs
        ]
        summed, reduced, grad, maxed, gathered, last, exchanged = local
        for r in range(REPLICAS):
            members = g.members(r)
            assert len(members) == g.size and r in members
            rank = members.index(r)
            np.testing.assert_allclose(summed[r], x[members].sum(0), rtol=1e-6)
            np.testing.assert_allclose(reduced[r], 2.0 * x[members].sum(0), rtol=1e-6)
            # d/dx_r of sum_m (sum_j x_j) . w_m + (2 sum_j x_j) . w_m: 3 sum_m w_m (f sums the
            # gradient of the copy over the group, the sum's gradient is the sum of w).
            np.testing.assert_allclose(grad[r], 3.0 * w[members].sum(0), rtol=1e-5)
            np.testing.assert_array_equal(maxed[r], x[members].max(0))
            np.testing.assert_array_equal(gathered[r], np.concatenate(x[members], 0))
            np.testing.assert_array_equal(last[r], np.concatenate(x[members], -1))
            # Row i of the result came from the member of rank i (its copy of its own x).
            np.testing.assert_array_equal(exchanged[r], x[members])
            assert rank == g.rank(r)
