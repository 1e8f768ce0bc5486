"""Provides `TpuPartition`: the mesh's spatial and model axes on TPUStrategy, as XLA SPMD annotations.

On CPUs and GPUs a replica of the mesh is one device and the split layers of
`mlperf_tf/layers/` exchange halos and all-reduce partial sums themselves. On TPUs the same
mesh is laid out differently: the `spatial` and `model` axes live *inside* a replica, as its
logical cores, and XLA's SPMD partitioner does the exchanging. This is what Google's MLPerf
v0.6 SSD did with TF1's `input_partition_dims` (`mlcommons/training_results_v0.6`,
`Google/benchmarks/ssd/implementations/tpu-v3-*-ssd`: `num_cores_per_replica` cores per replica
and the images split `[1, K, L, 1]`; Kumar et al. 2019), in TF 2.20's public API:

- A `TPUStrategy` whose replicas each span `K x L x M` logical cores: a
  `tf.tpu.experimental.DeviceAssignment.build(topology, computation_shape=..., num_replicas=...)`
  passed as `experimental_device_assignment`, with `experimental_spmd_xla_partitioning=True`
  (`device_assignment`, `computation_shape`). Its `num_replicas_in_sync` is the mesh's `data`
  axis; the runner sees the mesh `replica_mesh` (data only) for batching and gradient sums.
- The model **unsplit**: plain layers (the split layers at M = 1 and K = L = 1 are plain
  layers: same weights, no collective), built from the replica mesh.
- In the replica step, annotations from the same layouts the CPU path uses: the images split
  `[1, K, L, 1]` (`strategy.experimental_split_to_logical_devices`; tile t of the
  row-major `arange(K L).reshape(K, L)` tile assignment on logical core t, which is the CPU
  layout's member t of a spatial group, `SpatialLayout.tile`); for tensor parallelism each
  weight whose layout is `model_split(axis)` (Megatron's, `mlperf_tf.parallel.layout`) split
  `M` ways along `axis` and the replicated ones replicated
  (`experimental_replicate_to_logical_devices`), read through `keras.StatelessScope` so the
  layers compute with the annotated values (`TpuPartition.annotated`). Activations are left to
  XLA's sharding propagation.

What TF 2.20's public API accepts (read from `TPUStrategy` and `DeviceAssignment`):
`experimental_split_to_logical_devices(tensor, partition_dimensions)` takes one integer per
dimension of `tensor`, whose product must equal the logical cores per replica, each dividing
its (known) dimension; `experimental_replicate_to_logical_devices(tensor)` takes any tensor;
`experimental_assign_to_logical_device(tensor, id)` places a tensor on one core and is refused
in SPMD mode (not used here). All three annotate tensors inside the replica function; none
annotates a variable, so a split weight is still *stored* whole on every core of its replica
(with its optimizer slots): on TPU this path splits the matmuls' work and activations, not
the weights' memory. `DeviceAssignment.build` takes a `Topology` (what
`initialize_tpu_system` returns), a `computation_shape` with one entry per topology dimension
(`[x, y, z, core]` on TPU v2-v4) whose product is the cores per replica and which must fit the
topology, and `num_replicas`.

Not run: there is no TPU here. Everything below is tested on a recording fake strategy and a
`Topology` built from a mesh shape (`tests/mlperf_tf/parallel/test_tpu.py`); see the README.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.parallel.layout import EXPERT_SPLIT, Layout, declared_layout
from mlperf_tf.parallel.mesh import DeviceMesh, build_mesh, parse_spatial


def cores_per_replica(*, model_parallel: int = 1, spatial_partition: str = "1") -> int:
    """Logical cores one TPU replica spans: K x L x M (1: the ordinary one core per replica)."""
    rows, cols = parse_spatial(spatial_partition)
    return rows * cols * model_parallel


def check_tpu_flags(
    *, model_parallel: int = 1, expert_parallel: int = 1, spatial_partition: str = "1",
    pipeline_parallel: int = 1, context_parallel: int = 1,
) -> None:  # fmt: skip
    """Refuses the mesh flags this TPU path does not map (no TF needed).

    Raises:
      UserError: `--expert_parallel`, `--pipeline_parallel` or `--context_parallel` > 1 (their
        exchanges have no annotation here), or `--model_parallel` and `--spatial_partition` both
        > 1 (one
        `partition_dimensions` list must multiply to all of a replica's cores, so a weight
        split M ways cannot be replicated over the K x L spatial cores).
    """
    if expert_parallel > 1:
        raise UserError(
            f"--expert_parallel={expert_parallel} with --distribution=tpu: the experts' "
            "all-to-all has no TPUStrategy path here (only --spatial_partition and "
            "--model_parallel map to logical cores); embedding tables need no flag on TPU: "
            "the TPU embedding engine shards them itself (mlperf_tf/layers/tpu_embedding.py)"
        )
    for flag, value in (
        ("pipeline_parallel", pipeline_parallel),
        ("context_parallel", context_parallel),
    ):
        if value > 1:
            raise UserError(
                f"--{flag}={value} with --distribution=tpu: not mapped to TPUStrategy here (only "
                "--spatial_partition and --model_parallel map to logical cores)"
            )
    rows, cols = parse_spatial(spatial_partition)
    if model_parallel > 1 and rows * cols > 1:
        raise UserError(
            f"--model_parallel={model_parallel} with --spatial_partition={spatial_partition} on "
            "TPU: TPUStrategy's partition dimensions must multiply to all of a replica's cores, "
            "so a tensor cannot be split over one of the two axes and replicated over the other"
        )


def computation_shape(mesh_shape, cores: int) -> list[int]:
    """The block of `cores` TPU cores one replica spans, as `DeviceAssignment.build` takes it.

    The cores of one chip first (the last topology dimension: 2 on TPU v2/v3, as Google's v0.6
    SSD used both cores of a chip for its 2 partitions), then x, y, z: each factor the
    largest that divides both what is left and that dimension of the topology.

    Args:
      mesh_shape: the topology's shape (`Topology.mesh_shape`, e.g. [4, 4, 1, 2] for a v3-32).
      cores: logical cores per replica (K x L x M).

    Raises:
      UserError: the cores do not form a block of the topology.
    """
    mesh_shape = [int(d) for d in mesh_shape]
    shape = [1] * len(mesh_shape)
    left = cores
    for dim in [len(mesh_shape) - 1, *range(len(mesh_shape) - 1)]:
        shape[dim] = math.gcd(left, mesh_shape[dim])
        left //= shape[dim]
    if left != 1:
        raise UserError(
            f"{cores} cores per replica (--spatial_partition x --model_parallel) do not form a "
            f"block of the TPU topology {mesh_shape}"
        )
    return shape


def device_assignment(topology, cores: int):
    """The `tf.tpu.experimental.DeviceAssignment` of replicas of `cores` logical cores each,
    over every core of `topology` (a `tf.tpu.experimental.Topology`).

    Raises:
      UserError: the cores do not divide the topology's cores or fit its shape.
    """
    total = int(np.prod(topology.mesh_shape)) - int(len(topology.missing_devices))
    if total % cores:
        raise UserError(
            f"{cores} cores per replica (--spatial_partition x --model_parallel) do not divide "
            f"the TPU's {total} cores"
        )
    return tf.tpu.experimental.DeviceAssignment.build(
        topology,
        computation_shape=computation_shape(topology.mesh_shape, cores),
        num_replicas=total // cores,
    )


def input_partition_dims(mesh: DeviceMesh) -> list[int]:
    """`[1, K, L, 1]`: the images' partition dimensions (TF1's `input_partition_dims`)."""
    return [1, mesh.spatial_rows, mesh.spatial_cols, 1]


def partition_dims(layout: Layout, shape, mesh: DeviceMesh) -> list[int] | None:
    """A weight's layout as `experimental_split_to_logical_devices` partition dimensions.

    The layout's split dimension gets the size of the axes it is split over; None means
    replicated over the replica's cores (`experimental_replicate_to_logical_devices`).

    Args:
      layout: the weight's layout (`declared_layout`: what the split layers record).
      shape: the weight's whole shape.
      mesh: the run's mesh over TPU cores (`TpuPartition.mesh`).

    Raises:
      UserError: an expert layout (no TPU path), or a split dimension that does not divide.
    """
    if not layout.split:
        return None
    if layout == EXPERT_SPLIT or "model" not in layout.split_over:
        raise UserError(
            f"a weight split over {', '.join(layout.split_over)} has no TPUStrategy path here"
        )
    shards = layout.num_shards(mesh)
    if shards == 1:
        return None
    shape = [int(d) for d in shape]
    if shape[layout.split_axis] % shards:
        raise UserError(
            f"--model_parallel={shards}: dimension {layout.split_axis} of a weight of shape "
            f"{shape} does not split into {shards} on TPU"
        )
    dims = [1] * len(shape)
    dims[layout.split_axis] = shards
    return dims


@dataclasses.dataclass(frozen=True)
class TpuPartition:
    """The run's mesh over TPU cores, and how a replica step annotates it.

    Attributes:
      mesh: the mesh over all logical cores (`build_mesh(cores, ...)`: data x spatial x model,
        the same mesh a CPU run of as many devices has).
      input_key: the batch key of the images split over `spatial` (`Benchmark.spatial_input`).
    """

    mesh: DeviceMesh
    input_key: str = "image"

    @classmethod
    def from_flags(
        cls, num_replicas: int, *, model_parallel: int = 1, spatial_partition: str = "1",
        expert_parallel: int = 1, input_key: str = "image",
    ) -> TpuPartition:  # fmt: skip
        """The partition of a TPUStrategy of `num_replicas` replicas of K x L x M cores."""
        check_tpu_flags(
            model_parallel=model_parallel,
            expert_parallel=expert_parallel,
            spatial_partition=spatial_partition,
        )
        cores = cores_per_replica(
            model_parallel=model_parallel, spatial_partition=spatial_partition
        )
        mesh = build_mesh(
            num_replicas * cores, model_parallel=model_parallel,
            spatial_partition=spatial_partition,
        )  # fmt: skip
        return cls(mesh=mesh, input_key=input_key)

    @property
    def cores_per_replica(self) -> int:
        return self.mesh.spatial * self.mesh.model

    @property
    def replica_mesh(self) -> DeviceMesh:
        """The mesh the runner and the benchmark see: TPUStrategy's replicas are the data axis
        (each reads its own batch, and builds the unsplit model)."""
        return DeviceMesh(data=self.mesh.data)

    def weight_dims(self, model) -> list[tuple]:
        """(variable, partition dims or None) of `model`'s trainable weights under the model
        axis (empty without one)."""
        if self.mesh.model == 1:
            return []
        return [
            (v, partition_dims(declared_layout(v), v.shape, self.mesh))
            for v in model.trainable_variables
        ]

    def split_inputs(self, strategy, batch):
        """`batch` with its images split `[1, K, L, 1]` over the replica's cores (spatial)."""
        if self.mesh.spatial == 1:
            return batch
        if not isinstance(batch, dict) or self.input_key not in batch:
            raise UserError(
                f"--spatial_partition on TPU splits the batch's '{self.input_key}' images; "
                "this benchmark's batch has none"
            )
        images = batch[self.input_key]
        dims = input_partition_dims(self.mesh)
        if images.shape.rank != 4:
            raise UserError(
                f"--spatial_partition on TPU: batch['{self.input_key}'] has shape "
                f"{images.shape}, not [batch, height, width, channels]"
            )
        for size, parts, what in ((images.shape[1], dims[1], "height"),
                                  (images.shape[2], dims[2], "width")):  # fmt: skip
            if size is not None and size % parts:
                raise UserError(
                    f"--spatial_partition={self.mesh.spatial_rows}x{self.mesh.spatial_cols} on "
                    f"TPU: the image {what} {size} does not split into {parts}"
                )
        return {
            **batch,
            self.input_key: strategy.experimental_split_to_logical_devices(images, dims),
        }

    @contextlib.contextmanager
    def annotated(self, strategy, model, batch):
        """Replica context: yields `batch` annotated; inside, `model` computes with annotated
        weights.

        Each weight is read once, annotated (split per its layout, or replicated), and handed to
        the layers through `keras.StatelessScope`, so the layers' own reads return the
        annotated tensors (the gradient tape still sees the variables' reads). Assignments the
        scope collected (dropout seed states, moving statistics) are applied on exit.
        """
        batch = self.split_inputs(strategy, batch)
        dims = self.weight_dims(model)
        if not dims:
            yield batch
            return
        mapping = []
        for variable, parts in dims:
            value = variable.value
            if parts is None:
                value = strategy.experimental_replicate_to_logical_devices(value)
            else:
                value = strategy.experimental_split_to_logical_devices(value, parts)
            mapping.append((variable, value))
        mapped = {id(v) for v, _ in mapping}
        with keras.StatelessScope(state_mapping=mapping) as scope:
            yield batch
        for variable in model.variables:
            new = scope.get_current_value(variable)
            if id(variable) not in mapped and new is not None:
                variable.assign(new)
