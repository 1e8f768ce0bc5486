"""Whole tensors of split variables on 4 logical CPUs: the collective all-gather that saves a
model axis spanning workers (`collectives.whole.gathered_value`, bound to the variable with
`bind_gathers`) joins the shards as the local
concatenation does, for Megatron's layouts (split along dimension 0 or 1, M = 2 and 4, with a
data axis) and the experts' (`EXPERT_SPLIT`, E = 2 x M = 2); a checkpoint written through it
holds the whole tensor and restores each replica's shard; and the gather's failure to meet
its peers is bounded by the timeout bound to the variable; a gather needed and not bound is an
error."""

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives import bind_gathers
from mlperf_tf.parallel import layout
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import processes
from tests.numerics import assert_close
from tests.strategies import mirrored

pytestmark = pytest.mark.numerics

SHAPE = (4, 8, 3)


def _split_variable(strategy, mesh, split: layout.Layout, whole):
    with strategy.scope():
        variable = tf.Variable(tf.zeros(split.shard_shape(SHAPE, mesh)), name="w")
    layout.set_layout(variable, split)
    layout.assign_whole(variable, whole, mesh)
    return variable


@pytest.mark.parametrize(
    ("mesh", "split"),
    [(DeviceMesh(data=2, model=2), layout.model_split(1)),
     (DeviceMesh(data=2, model=2), layout.model_split(0)),
     (DeviceMesh(model=4), layout.model_split(1)),
     (DeviceMesh(expert=2, model=2), layout.EXPERT_SPLIT)],
)  # fmt: skip
def test_the_gather_joins_the_shards_as_the_local_concatenation(mesh, split):
    strategy = mirrored(4)
    whole = tf.reshape(tf.range(np.prod(SHAPE), dtype=tf.float32), SHAPE)
    variable = _split_variable(strategy, mesh, split, whole)
    components = strategy.experimental_local_results(variable)
    assert tuple(components[0].shape) != SHAPE  # really split
    joined = layout.whole_value(variable, mesh, gather=False)
    with pytest.raises(ValueError, match="bind_gathers"):
        layout.whole_value(variable, mesh, gather=True)
    bind_gathers([variable], 60.0)
    gathered = layout.whole_value(variable, mesh, gather=True)
    np.testing.assert_array_equal(joined.numpy(), whole.numpy())
    np.testing.assert_array_equal(gathered.numpy(), whole.numpy())


@pytest.mark.parametrize(
    ("mesh", "split"),
    [(DeviceMesh(data=2, expert=2), layout.Layout(split_axis=0, split_over=("expert",))),
     (DeviceMesh(data=2, model=2), layout.model_split(1)),
     (DeviceMesh(expert=2, model=2), layout.EXPERT_SPLIT),
     (DeviceMesh(data=4), layout.REPLICATED)],
    ids=["rows over expert", "width over model", "E2xM2", "replicated"],
)  # fmt: skip
def test_rows_written_one_at_a_time_make_the_whole_tensor(mesh, split):
    """`assign_whole_row` (one expert of a Hugging Face release into a stacked weight): each
    entry of the first dimension written alone leaves every replica its shard of the whole
    tensor, the rows split over the first dimension or each row's width split; and
    `divide_shards` divides each replica's own shard (a cross-replica `assign(v / s)` would
    write the first component into all)."""
    strategy = mirrored(4)
    whole = tf.reshape(tf.range(np.prod(SHAPE), dtype=tf.float32), SHAPE)
    variable = _split_variable(strategy, mesh, split, tf.zeros(SHAPE))
    for index in range(SHAPE[0]):
        layout.assign_whole_row(variable, index, whole[index].numpy(), mesh)
    np.testing.assert_array_equal(layout.whole_value(variable, mesh).numpy(), whole.numpy())
    layout.divide_shards(variable, 4.0)
    np.testing.assert_array_equal(layout.whole_value(variable, mesh).numpy(), whole.numpy() / 4)


def test_a_checkpoint_through_the_gather_holds_the_whole_tensor_and_restores_shards(tmp_path):
    strategy, mesh, split = mirrored(4), DeviceMesh(data=2, model=2), layout.model_split(1)
    whole = tf.random.stateless_normal(SHAPE, seed=(1, 2))
    variable = _split_variable(strategy, mesh, split, whole)
    layout.save_whole(variable, mesh, SHAPE)
    bind_gathers([variable], 60.0)
    # As on a worker whose model group spans processes: the save gathers.
    serialize = variable._serialize_to_tensors  # noqa: SLF001
    variable._serialize_to_tensors = lambda: {  # noqa: SLF001
        "VARIABLE_VALUE": layout.whole_value(variable, mesh, gather=True)
    }
    path = tf.train.Checkpoint(w=variable).write(str(tmp_path / "ckpt"))
    assert tf.train.load_checkpoint(path).get_variable_to_shape_map()[
        "w/.ATTRIBUTES/VARIABLE_VALUE"
    ] == list(SHAPE)
    assert_close(
        tf.train.load_checkpoint(path).get_tensor("w/.ATTRIBUTES/VARIABLE_VALUE"),
        whole.numpy(),
        rtol=0,
    )
    variable._serialize_to_tensors = serialize  # noqa: SLF001
    other = _split_variable(strategy, mesh, split, tf.zeros(SHAPE))
    layout.save_whole(other, mesh, SHAPE)
    tf.train.Checkpoint(w=other).read(path).assert_consumed()
    parts = np.split(whole.numpy(), 2, axis=1)
    for replica, component in enumerate(strategy.experimental_local_results(other)):
        np.testing.assert_array_equal(component.numpy(), parts[mesh.index(replica, "model")])


_NEVER_MET = """
import tensorflow as tf
from mlperf_tf.distribute import split_cpu
from mlperf_tf.collectives import bind_gathers
from mlperf_tf.parallel import layout
from mlperf_tf.parallel.mesh import DeviceMesh
from tests.strategies import mirrored
split_cpu(2)
strategy = mirrored(2)
with strategy.scope():
    variable = tf.Variable(tf.zeros((4, 2)), name="w")
layout.set_layout(variable, layout.model_split(0))
bind_gathers([variable], 2.0)
try:
    layout.whole_value(variable, DeviceMesh(model=4), gather=True)
except tf.errors.DeadlineExceededError:
    print("timed out")
"""


def test_the_gather_waits_for_its_peers_only_as_long_as_its_bound_timeout(tmp_path):
    # Replicas 0 and 1 on 2 devices, but a mesh of 4 whose model group {0,1,2,3} has members no
    # device runs: the gather never completes and fails after the bound timeout. In a process
    # of its own: a timed-out collective aborts every later collective of its process.
    log = str(tmp_path / "gather.out")
    proc = processes.start(["-c", _NEVER_MET], log)
    try:
        assert processes.wait(proc, 120, log) == 0
    finally:
        processes.kill(proc)
    with open(log, encoding="utf-8") as f:
        assert "timed out" in f.read()
