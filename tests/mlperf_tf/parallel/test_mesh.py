"""Tests of the device mesh: coordinates, groups, the flags' checks and the input routing."""

import ast
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.data import synthetic
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import input as input_lib
from mlperf_tf.parallel import mesh as mesh_lib
from mlperf_tf.parallel.mesh import DeviceMesh


def test_replica_ids_are_row_major_with_model_fastest():
    mesh = DeviceMesh(data=2, expert=1, spatial=2, model=2)
    assert mesh.size == 8
    zero = {"data": 0, "expert": 0, "pipeline": 0, "context": 0, "spatial": 0, "model": 0}
    assert mesh.coords(0) == zero
    assert mesh.coords(1) == {**zero, "model": 1}
    assert mesh.coords(2) == {**zero, "spatial": 1}
    assert mesh.coords(5) == {**zero, "data": 1, "model": 1}
    for replica in range(mesh.size):
        assert mesh.replica(**mesh.coords(replica)) == replica


def test_pipeline_and_context_sit_between_the_batch_axes_and_spatial():
    # (data, expert, pipeline, context, spatial, model): the replicas that share a batch are
    # consecutive ids, whatever the axes that split it.
    mesh = DeviceMesh(data=2, pipeline=2, context=2, model=2)
    assert mesh.size == 16 and mesh.group_size == 8 and mesh.batch_shards == 2
    assert mesh.coords(6) == {
        "data": 0, "expert": 0, "pipeline": 1, "context": 1, "spatial": 0, "model": 0
    }  # fmt: skip
    assert mesh.group(0, "context") == [0, 2]
    assert mesh.group(1, "pipeline") == [1, 5]
    assert mesh.group(9, "pipeline", "context") == [9, 11, 13, 15]
    assert [mesh.batch_shard(r) for r in range(16)] == [0] * 8 + [1] * 8
    assert mesh.axes_used() == ("pipeline", "context", "model")
    assert str(mesh) == "DeviceMesh(data=2, pipeline=2, context=2, model=2)"
    # A replicated weight's gradient: partial per context chunk, summed over it too.
    assert mesh_lib.GRADIENT_AXES == ("data", "expert", "context", "spatial")


def test_groups_vary_only_along_their_axes():
    mesh = DeviceMesh(data=2, expert=2, model=2)
    assert mesh.group(0, "model") == [0, 1]
    assert mesh.group(3, "model") == [2, 3]
    # The data-axis sum of a model shard: same model index, every data and expert index.
    assert mesh.group(1, "data", "expert") == [1, 3, 5, 7]
    assert mesh.group(6, "data") == [2, 6]
    assert mesh.group(5) == [5]
    assert [mesh.batch_shard(r) for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="unknown mesh axis 'stage'"):
        mesh.group(0, "stage")


def test_build_mesh_puts_the_rest_on_the_data_axis():
    ones = {"data": 1, "expert": 1, "pipeline": 1, "context": 1, "spatial": 1, "model": 1}
    mesh = mesh_lib.build_mesh(8, model_parallel=2, expert_parallel=2)
    assert mesh.shape == {**ones, "data": 2, "expert": 2, "model": 2}
    tiles = mesh_lib.build_mesh(4, spatial_partition="2x2")
    assert (tiles.spatial, tiles.spatial_rows, tiles.spatial_cols) == (4, 2, 2)
    assert str(tiles) == "DeviceMesh(spatial=2x2)"
    assert mesh_lib.build_mesh(4).shape == {**ones, "data": 4}
    assert mesh_lib.build_mesh(4) == DeviceMesh(data=4)  # defaults: every run as before
    staged = mesh_lib.build_mesh(8, pipeline_parallel=2, context_parallel=2)
    assert staged.shape == {**ones, "data": 2, "pipeline": 2, "context": 2}
    assert mesh_lib.build_mesh(4, context_parallel=2, expert_parallel=2).shape == {
        **ones, "expert": 2, "context": 2
    }  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"model_parallel": 3},
            r"--model_parallel=3 needs a multiple of 3 replicas; this run has 4",
        ),
        (
            {"model_parallel": 2, "spatial_partition": "4"},
            r"--model_parallel=2 x --spatial_partition=4 needs a multiple of 8 replicas",
        ),
        ({"model_parallel": 0}, r"--model_parallel \(0\) must be a positive integer"),
        ({"expert_parallel": -2}, r"--expert_parallel \(-2\) must be a positive integer"),
        ({"spatial_partition": "2x"}, r"--spatial_partition='2x' must be K or KxL"),
        ({"spatial_partition": "nan"}, r"--spatial_partition='nan' must be K or KxL"),
        (
            {"pipeline_parallel": 3},
            r"--pipeline_parallel=3 needs a multiple of 3 replicas; this run has 4",
        ),
        (
            {"context_parallel": 2, "model_parallel": 4},
            r"--model_parallel=4 x --context_parallel=2 needs a multiple of 8 replicas",
        ),
        ({"pipeline_parallel": 0}, r"--pipeline_parallel \(0\) must be a positive integer"),
        ({"context_parallel": 1.5}, r"--context_parallel \(1.5\) must be a positive integer"),
    ],
)
def test_bad_mesh_flags_are_one_line_errors(kwargs, message):
    with pytest.raises(UserError, match=message) as raised:
        mesh_lib.build_mesh(4, **kwargs)
    assert "\n" not in str(raised.value)


def test_a_benchmark_refuses_an_axis_it_does_not_declare():
    mesh = DeviceMesh(data=2, model=2)
    mesh_lib.check_supported(mesh, "bert", ("data", "model"))
    with pytest.raises(UserError, match=r"--model_parallel: benchmark 'resnet50' does not support"):
        mesh_lib.check_supported(mesh, "resnet50", ("data",))
    for flag, axis in (("pipeline_parallel", "pipeline"), ("context_parallel", "context")):
        with pytest.raises(UserError, match=rf"--{flag}: benchmark 'bert' does not support {axis}"):
            mesh_lib.check_supported(DeviceMesh(**{axis: 2}), "bert", ("data", "model"))
        with pytest.raises(UserError, match=rf"--{flag}: benchmark 'bert' does not support"):
            mesh_lib.check_flags_supported("bert", ("data", "model"), **{flag: 2})
        mesh_lib.check_flags_supported("x", ("data", axis), **{flag: 2})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"micro_batch_size": -1}, r"--micro_batch_size \(-1\) must not be negative"),
        ({"micro_batch_size": "4"}, r"--micro_batch_size \('4'\) must be an integer"),
        ({"context_parallel": True}, r"--context_parallel \(True\) must be a positive integer"),
    ],
)
def test_bad_micro_batch_and_axis_flags_are_refused_before_any_strategy(kwargs, message):
    flags = {"model_parallel": 1, "expert_parallel": 1, "spatial_partition": "1", **kwargs}
    with pytest.raises(UserError, match=message) as raised:
        mesh_lib.check_flags(**flags)
    assert "\n" not in str(raised.value)


def _routed(mesh, pipelines, pipeline_id):
    """Which batch shard each local replica of one pipeline receives."""
    context = tf.distribute.InputContext(
        num_input_pipelines=pipelines, input_pipeline_id=pipeline_id, num_replicas_in_sync=mesh.size
    )
    inner, repeats = input_lib.mesh_input_context(context, mesh)
    local_shards = inner.num_replicas_in_sync // inner.num_input_pipelines
    first = inner.input_pipeline_id * local_shards
    # A pipeline that yields its shards' ids in turn, as a benchmark's pipeline yields batches.
    dataset = tf.data.Dataset.range(first, first + local_shards).repeat()
    dataset = input_lib.repeat_for_group(dataset, repeats)
    local = mesh.size // pipelines
    return [int(x) for x in dataset.take(local)]


def test_replicas_of_a_group_read_one_batch_and_data_groups_differ():
    mesh = DeviceMesh(data=2, model=2)  # one worker, 4 replicas
    assert _routed(mesh, 1, 0) == [mesh.batch_shard(r) for r in range(4)] == [0, 0, 1, 1]
    spatial = DeviceMesh(data=1, spatial=2, model=2)
    assert _routed(spatial, 1, 0) == [0, 0, 0, 0]
    staged = DeviceMesh(data=2, pipeline=2, context=2)  # 8 replicas, 2 batch shards
    assert _routed(staged, 1, 0) == [staged.batch_shard(r) for r in range(8)] == [0] * 4 + [1] * 4


def test_a_model_group_across_workers_reads_the_same_batch_on_each():
    mesh = DeviceMesh(data=2, model=2)  # 4 workers of one replica each: groups span workers
    shards = [_routed(mesh, 4, worker)[0] for worker in range(4)]
    assert shards == [mesh.batch_shard(r) for r in range(4)] == [0, 0, 1, 1]
    wide = DeviceMesh(data=2, model=4)  # 2 workers of 4 replicas: whole groups on each
    assert _routed(wide, 2, 0) == [0] * 4 and _routed(wide, 2, 1) == [1] * 4


def test_synthetic_batches_differ_between_batch_shards_only():
    def make(seed):
        return tf.data.Dataset.from_tensors(tf.random.stateless_normal([3], [seed, 0])).repeat()

    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )
    a, b, a_again = [
        x.numpy() for x in synthetic.per_batch_shard(make, seed=7, input_context=context).take(3)
    ]
    assert not np.allclose(a, b)
    np.testing.assert_array_equal(a, a_again)
    alone = next(iter(synthetic.per_batch_shard(make, seed=7))).numpy()
    np.testing.assert_array_equal(alone, a)  # shard 0 is what one replica trains on


def _per_replica_rows(strategy, distributed, steps):
    iterator = iter(distributed)
    return [
        [int(t.numpy()[0]) for t in strategy.experimental_local_results(next(iterator))]
        for _ in range(steps)
    ]


@pytest.mark.parametrize("replicas", [4, 1])
def test_untuned_input_deals_each_replica_the_batches_tf_would(replicas):
    # `distribute_untuned` (synthetic input: no per-device pipelines, whose autotuned release
    # waits) must hand every replica what `MultiDeviceIterator` hands it: batch r, r + R, ...
    # of the worker's pipeline, whose input context it sees as before. Two mesh groups of
    # two replicas (4 replicas) check the routing of `for_mesh` too.
    mesh = DeviceMesh(data=2, model=2) if replicas == 4 else DeviceMesh()
    seen = []

    def dataset_fn(context):
        seen.append((context.num_input_pipelines, context.num_replicas_in_sync))
        first = 100 * context.input_pipeline_id
        return tf.data.Dataset.range(first, first + 1000).batch(1)

    if replicas == 1:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(replicas)],
            cross_device_ops=tf.distribute.ReductionToOneDevice(),
        )
    routed = input_lib.for_mesh(dataset_fn, mesh)
    theirs = _per_replica_rows(strategy, strategy.distribute_datasets_from_function(routed), 3)
    ours = _per_replica_rows(strategy, input_lib.distribute_untuned(strategy, routed), 3)
    assert ours == theirs
    assert theirs[0] == ([0, 0, 1, 1] if replicas == 4 else [0])  # groups share a batch
    assert set(seen) == {(1, mesh.batch_shards)}  # the worker's context, replica by replica


def test_the_mesh_imports_no_tensorflow():
    # The simulator and the flag checks describe a mesh with the type the runner trains on;
    # the input routing that needs TensorFlow lives in `mlperf_tf.parallel.input`.
    code = (
        "import sys, mlperf_tf.parallel.mesh, mlperf_tf.parallel.context; "
        "sys.exit(int(bool({'tensorflow', 'keras'} & set(sys.modules))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()


def test_the_mesh_does_not_import_the_input_routing():
    # `parallel/input.py` imports the mesh; the mesh must not import it back (no circle, not even
    # a lazy one through a module `__getattr__`).
    tree = ast.parse(pathlib.Path(mesh_lib.__file__).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.module == "__future__" or not node.module.startswith("mlperf_tf.parallel")
        assert not (isinstance(node, ast.FunctionDef) and node.name == "__getattr__")
    assert not hasattr(mesh_lib, "for_mesh")
