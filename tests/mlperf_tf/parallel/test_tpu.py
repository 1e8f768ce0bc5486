"""The TPUStrategy path of the mesh (`mlperf_tf.parallel.tpu`), without a TPU: the layout ->
partition-dims mapping for every layout kind and model, the device assignment from the mesh on
TPU topologies built from their shapes, and the replica steps calling the annotations on a
recording fake strategy. None of this runs on a TPU (see `mlperf_tf/parallel/README.md`)."""

import dataclasses
from unittest import mock

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.bert import config as bert_config
from benchmarks.bert.benchmark import BertBenchmark
from benchmarks.llama31_8b import config as llama_config
from benchmarks.llama31_8b.benchmark import Llama31Benchmark
from benchmarks.resnet50 import config as resnet_config
from benchmarks.resnet50.benchmark import ResNet50Benchmark
from benchmarks.ssd import config as ssd_config
from benchmarks.ssd.benchmark import SSDBenchmark
from benchmarks.transformer import config as transformer_config
from benchmarks.transformer.benchmark import TransformerBenchmark
from mlperf_tf import distribute
from mlperf_tf.benchmark import RunContext
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import tpu, use_mesh
from mlperf_tf.parallel.layout import (
    EXPERT_SPLIT,
    REPLICATED,
    declared_layout,
    layout_of,
    model_split,
)
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.runner.evaluator import Evaluator
from mlperf_tf.runner.trainer import Trainer
from tests import strategies
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


class RecordingStrategy:
    """Stands in for a TPUStrategy in replica context: records each annotation (what, dims) and
    returns the tensor unchanged, as the annotations do (they change placement, not values)."""

    num_replicas_in_sync = 1

    def __init__(self):
        self.calls = []

    def experimental_split_to_logical_devices(self, tensor, partition_dimensions):
        self.calls.append(("split", tuple(tensor.shape), list(partition_dimensions)))
        return tf.identity(tensor)

    def experimental_replicate_to_logical_devices(self, tensor):
        self.calls.append(("replicate", tuple(tensor.shape), None))
        return tf.identity(tensor)


def _topology(mesh_shape):
    """A one-host `Topology` of `mesh_shape` ([x, y, z, cores per chip]), as
    `initialize_tpu_system` returns it on such a slice."""
    coords = np.array(list(np.ndindex(*mesh_shape)), dtype=np.int32)
    return tf.tpu.experimental.Topology(mesh_shape=mesh_shape, device_coordinates=coords[None])


# ---- the device assignment from the mesh -------------------------------------------------------
@pytest.mark.parametrize(
    ("mesh_shape", "cores", "expected"),
    [([2, 2, 1, 2], 1, [1, 1, 1, 1]),  # v3-8: one core per replica
     ([2, 2, 1, 2], 2, [1, 1, 1, 2]),  # both cores of a chip (Google's v0.6 SSD: 2 per replica)
     ([2, 2, 1, 2], 4, [2, 1, 1, 2]),
     ([2, 2, 1, 2], 8, [2, 2, 1, 2]),
     ([4, 4, 1, 2], 16, [4, 2, 1, 2]),  # v3-32
     ([2, 2, 2, 1], 4, [2, 2, 1, 1])],  # v4-16 (one megacore per chip)
)  # fmt: skip
def test_computation_shape_fills_a_chip_then_x_y_z(mesh_shape, cores, expected):
    assert tpu.computation_shape(mesh_shape, cores) == expected
    assert np.prod(expected) == cores


def test_computation_shape_refuses_what_does_not_fit():
    with pytest.raises(UserError, match=r"3 cores per replica .* do not form a block"):
        tpu.computation_shape([2, 2, 1, 2], 3)
    with pytest.raises(UserError, match="do not divide the TPU's 8 cores"):
        tpu.device_assignment(_topology([2, 2, 1, 2]), 16)


@pytest.mark.parametrize(
    ("flags", "replicas", "cores"),
    [({"spatial_partition": "2"}, 4, 2), ({"spatial_partition": "2x2"}, 2, 4),
     ({"model_parallel": 4}, 2, 4), ({"model_parallel": 8}, 1, 8)],
)  # fmt: skip
def test_device_assignment_gives_each_replica_the_mesh_group_s_cores(flags, replicas, cores):
    topology = _topology([2, 2, 1, 2])  # 8 cores
    assert tpu.cores_per_replica(**flags) == cores
    assignment = tpu.device_assignment(topology, cores)
    assert assignment.num_replicas == replicas
    assert assignment.num_cores_per_replica == cores
    used = assignment.core_assignment.reshape(-1, 4)
    assert len({tuple(c) for c in used}) == 8  # every core once
    if cores == 2:  # a replica's two cores are the two cores of one chip
        for r in range(replicas):
            chips = {tuple(c[:3]) for c in assignment.core_assignment[r]}
            assert len(chips) == 1
    # The mesh over the cores is the one a CPU run of 8 devices builds; the runner sees its
    # data axis as the strategy's replicas.
    partition = tpu.TpuPartition.from_flags(replicas, **flags)
    assert partition.mesh.size == 8 and partition.cores_per_replica == cores
    assert partition.replica_mesh == DeviceMesh(data=replicas)


def test_tpu_refuses_expert_and_model_with_spatial():
    with pytest.raises(UserError, match="--expert_parallel=2 with --distribution=tpu"):
        tpu.check_tpu_flags(expert_parallel=2)
    for flag in ("pipeline_parallel", "context_parallel"):
        with pytest.raises(UserError, match=f"--{flag}=2 with --distribution=tpu: not mapped"):
            tpu.check_tpu_flags(**{flag: 2})
    with pytest.raises(UserError, match="--model_parallel=2 with --spatial_partition=2 on TPU"):
        tpu.TpuPartition.from_flags(2, model_parallel=2, spatial_partition="2")


def test_is_tpu_is_false_off_tpu():
    assert not distribute.is_tpu(strategies.mirrored(2))
    assert not distribute.needs_static_shapes(strategies.mirrored(2), xla=False)


# ---- layout -> partition dimensions ------------------------------------------------------------
def test_partition_dims_of_every_layout_kind():
    mesh = DeviceMesh(data=2, model=4)
    assert tpu.partition_dims(REPLICATED, (8, 12), mesh) is None
    assert tpu.partition_dims(model_split(0), (8, 12), mesh) == [4, 1]
    assert tpu.partition_dims(model_split(1), (8, 12), mesh) == [1, 4]
    assert tpu.partition_dims(model_split(0), (12,), mesh) == [4]  # a bias
    assert tpu.partition_dims(model_split(1), (8, 12), DeviceMesh(data=8)) is None  # M = 1
    with pytest.raises(UserError, match=r"dimension 1 of a weight of shape \[8, 6\]"):
        tpu.partition_dims(model_split(1), (8, 6), mesh)
    with pytest.raises(UserError, match="split over expert has no TPUStrategy path"):
        tpu.partition_dims(EXPERT_SPLIT, (4, 8, 8), DeviceMesh(expert=2))


@pytest.mark.parametrize(
    ("flag", "dims"), [("2", [1, 2, 1, 1]), ("4", [1, 4, 1, 1]), ("2x2", [1, 2, 2, 1]),
                       ("1x2", [1, 1, 2, 1])],
)  # fmt: skip
def test_input_partition_dims_are_tf1_s(flag, dims):
    partition = tpu.TpuPartition.from_flags(1, spatial_partition=flag)
    assert tpu.input_partition_dims(partition.mesh) == dims
    fake = RecordingStrategy()
    batch = {"image": tf.zeros([2, 8, 8, 3]), "label": tf.zeros([2], tf.int32)}
    out = partition.split_inputs(fake, batch)
    assert fake.calls == [("split", (2, 8, 8, 3), dims)]
    assert out["label"] is batch["label"]


def test_split_inputs_refuses_images_that_do_not_split():
    partition = tpu.TpuPartition.from_flags(1, spatial_partition="4")
    with pytest.raises(UserError, match="the image height 6 does not split into 4"):
        partition.split_inputs(RecordingStrategy(), {"image": tf.zeros([1, 6, 8, 3])})
    with pytest.raises(UserError, match="has none"):
        partition.split_inputs(RecordingStrategy(), {"tokens": tf.zeros([1, 8])})


def _tensor_parallel_benchmarks():
    bert = bert_config.smoke()
    bert = dataclasses.replace(bert, model=dataclasses.replace(bert.model, num_attention_heads=4))
    return {
        "bert": BertBenchmark(bert),
        "transformer": TransformerBenchmark(transformer_config.smoke()),
        "llama31_8b": Llama31Benchmark(llama_config.smoke()),
    }


def _build(benchmark, mesh=None, strategy=None):
    context = RunContext(num_replicas=mesh.size if mesh else 1, mesh=mesh)
    b = benchmark.with_context(context)
    if strategy is None:
        with use_mesh(mesh):
            return b, b.build_model()
    with strategy.scope(), use_mesh(mesh):
        return b, b.build_model()


@pytest.mark.parametrize("name", ["bert", "transformer", "llama31_8b"])
def test_tensor_parallel_weights_get_the_cpu_path_s_layouts(name):
    """The unsplit model's weights are annotated exactly as the CPU path splits them at M = 2:
    a weight split along dimension a on 2 replicas is split [.., 2 at a, ..] over 2 cores."""
    benchmark = _tensor_parallel_benchmarks()[name]
    _, cpu_model = _build(benchmark, DeviceMesh(model=2), strategies.mirrored(2))
    _, whole_model = _build(benchmark)
    partition = tpu.TpuPartition.from_flags(1, model_parallel=2)
    dims = partition.weight_dims(whole_model)
    assert len(dims) == len(cpu_model.trainable_variables)
    split = 0
    for (variable, parts), cpu in zip(dims, cpu_model.trainable_variables, strict=True):
        layout = layout_of(cpu)
        assert declared_layout(variable).split_axis == layout.split_axis, variable.path
        if layout.split:
            split += 1
            expected = [1] * len(variable.shape)
            expected[layout.split_axis] = 2
            assert parts == expected, variable.path
            shard = list(variable.shape)
            shard[layout.split_axis] //= 2
            assert list(cpu.shape) == shard, variable.path
        else:
            assert parts is None, variable.path
            assert list(cpu.shape) == list(variable.shape), variable.path
    assert split >= 4  # attention and feed-forward kernels at least


def test_llama_gqa_with_fewer_key_value_heads_than_cores_differs_from_the_cpu_path():
    """At M = 4 the tiny Llama's 2 key/value heads are replicated on the CPU path (each shard
    keeps the head its queries use); the TPU path splits k_proj/v_proj's 16 columns 4 ways
    (inside the heads: XLA's partitioner keeps the math, moving more data). The only
    difference, stated in the README."""
    benchmark = _tensor_parallel_benchmarks()["llama31_8b"]
    _, cpu_model = _build(benchmark, DeviceMesh(model=4), strategies.mirrored(4))
    _, whole_model = _build(benchmark)
    dims = tpu.TpuPartition.from_flags(1, model_parallel=4).weight_dims(whole_model)
    differ = [
        v.path.split("/")[-2]
        for (v, parts), cpu in zip(dims, cpu_model.trainable_variables, strict=True)
        if (parts is not None) != layout_of(cpu).split
    ]
    assert differ and set(differ) == {"k_proj", "v_proj"}


@pytest.mark.parametrize("name", ["resnet50", "ssd"])
def test_spatial_models_annotate_images_only(name):
    benchmark = {
        "resnet50": ResNet50Benchmark(resnet_config.smoke()),
        "ssd": SSDBenchmark(ssd_config.smoke()),
    }[name]
    _, model = _build(benchmark)
    partition = tpu.TpuPartition.from_flags(2, spatial_partition="2x2")
    assert partition.weight_dims(model) == []  # weights replicated: XLA's default
    assert not any(layout_of(v).split for v in model.trainable_variables)  # the unsplit model
    assert partition.input_key == benchmark.spatial_input == "image"


# ---- the replica steps call the annotations ---------------------------------------------------
def _one_batch(benchmark):
    dataset = benchmark.train_dataset(tf.distribute.InputContext())
    return next(iter(dataset))


def _trainer(benchmark, model, strategy):
    optimizer = keras.optimizers.SGD(0.1)
    return Trainer(strategy=strategy, benchmark=benchmark, model=model, optimizer=optimizer,
                   xla=False)  # fmt: skip


def test_trainer_step_annotates_tensor_parallel_weights_and_keeps_dropout_state():
    benchmark = _tensor_parallel_benchmarks()["bert"]
    b, model = _build(benchmark)
    batch = _one_batch(b)
    fake = RecordingStrategy()
    trainer = _trainer(b, model, fake)
    seeds = [v for v in model.variables if "seed_generator" in v.path]
    assert seeds  # BERT smoke has dropout: its seed states advance in the step
    start = [v.numpy() for v in seeds]
    loss_ref, grads_ref, _ = trainer._replica_grads(batch)  # no partition: plain
    after_ref = [v.numpy() for v in seeds]
    assert fake.calls == []
    for v, value in zip(seeds, start):
        v.assign(value)

    trainer.partition = tpu.TpuPartition.from_flags(1, model_parallel=2)
    loss, grads, _ = trainer._replica_grads(batch)
    expected = trainer.partition.weight_dims(model)
    split = [(tuple(v.shape), parts) for v, parts in expected if parts is not None]
    assert [(c[1], c[2]) for c in fake.calls if c[0] == "split"] == split
    assert sum(c[0] == "replicate" for c in fake.calls) == len(expected) - len(split)
    # The annotations are identities here: the same loss and gradients (same dropout masks),
    # and the dropout seed states advanced as without them (assignments leave the scope).
    assert_close(loss, loss_ref, rtol=1e-6)
    for g, ref in zip(grads, grads_ref, strict=True):
        assert g is not None
        assert_close(tf.convert_to_tensor(g), tf.convert_to_tensor(ref), rtol=1e-6)
    for v, ref, s0 in zip(seeds, after_ref, start):
        np.testing.assert_array_equal(v.numpy(), ref)
        assert not np.array_equal(ref, s0)


def test_trainer_and_evaluator_steps_split_the_images():
    c = resnet_config.smoke()
    b, model = _build(ResNet50Benchmark(c))
    batch = _one_batch(b)
    fake = RecordingStrategy()
    trainer = _trainer(b, model, fake)
    trainer.partition = tpu.TpuPartition.from_flags(1, spatial_partition="2x2")
    trainer._replica_grads(batch)
    shape = tuple(batch["image"].shape)
    assert fake.calls == [("split", shape, [1, 2, 2, 1])]

    eval_batch = next(iter(b.eval_dataset(tf.distribute.InputContext())))
    evaluator = Evaluator(strategy=fake, benchmark=b, model=model, dataset=None, xla=False)
    evaluator.partition = trainer.partition
    evaluator._replica(eval_batch)
    assert fake.calls[-1] == ("split", tuple(eval_batch["image"].shape), [1, 2, 2, 1])


def test_annotated_step_traces_in_a_function():
    """The runner's steps are traced (`tf.function`): the weights' scope and the assignments
    it collects work there too (the dropout states advance once per call)."""
    benchmark = _tensor_parallel_benchmarks()["transformer"]
    b, model = _build(benchmark)
    batch = _one_batch(b)
    fake = RecordingStrategy()
    trainer = _trainer(b, model, fake)
    trainer.partition = tpu.TpuPartition.from_flags(1, model_parallel=2)
    seeds = [v for v in model.variables if "seed_generator" in v.path]
    step = tf.function(trainer._replica_grads)
    before = [v.numpy() for v in seeds]
    loss, grads, _ = step(batch)
    assert np.isfinite(float(loss)) and all(g is not None for g in grads)
    assert any(c[0] == "split" for c in fake.calls)
    assert seeds and all(not np.array_equal(v.numpy(), s) for v, s in zip(seeds, before))


def test_tpu_strategy_is_built_with_the_device_assignment():
    """`resolve_strategy("tpu", tpu_cores_per_replica=4)` hands TPUStrategy the assignment of
    replicas of 4 cores and SPMD partitioning; with 1 core, TF's defaults (the TPU calls are
    stand-ins: there is no TPU here)."""
    topology = _topology([2, 2, 1, 2])
    made = []

    def strategy(resolver, **kwargs):
        made.append(kwargs)
        return "strategy"

    with (
        mock.patch.object(tf.distribute.cluster_resolver, "TPUClusterResolver"),
        mock.patch.object(tf.config, "experimental_connect_to_cluster"),
        mock.patch.object(tf.tpu.experimental, "initialize_tpu_system", return_value=topology),
        mock.patch.object(tf.distribute, "TPUStrategy", side_effect=strategy),
    ):
        assert (
            distribute.resolve_strategy("tpu", tpu="local", tpu_cores_per_replica=4) == "strategy"
        )
        distribute.resolve_strategy("tpu", tpu="local")
    assignment = made[0]["experimental_device_assignment"]
    assert made[0]["experimental_spmd_xla_partitioning"] is True
    assert (assignment.num_replicas, assignment.num_cores_per_replica) == (2, 4)
    assert made[1] == {}
