"""Provides `DeviceMesh`: the run's replicas as one mesh with named axes, built from the run flags.

Every kind of parallelism in the suite is a layout over this one mesh (JAX's `Mesh`, DTensor's
`Mesh` + `Layout`): a tensor is split along some axes and replicated along the others.

| axis | flag | replicas along it ... |
|---|---|---|
| `data` | (the rest) | read different batches; gradients are summed over it |
| `expert` | `--expert_parallel=E` | read different batches (it is part of data parallelism) and hold different experts of each mixture-of-experts layer; tokens travel between them by all-to-all |
| `spatial` | `--spatial_partition=K` or `KxL` | share one batch; each holds a slab (rows, or a K x L tile) of every image's activations |
| `model` | `--model_parallel=M` | share one batch; each holds 1/M of the split weights (Megatron's tensor parallelism) |

Replica ids are laid out row-major over (data, expert, spatial, model), `model` fastest: the
replicas of one model group are consecutive, so they sit on one host (the fastest links) when a
host has at least M devices, and a host's devices stay together for the data-axis all-reduce
(`--mesh=RxC` is the all-reduce's view of the data groups; `mlperf_tf/collectives/README.md`).

Replicas that share a batch (one `batch shard`: same data and expert coordinates) read the same
examples: the runner's input wrapper (`mesh_input_context`, `repeat_for_group`) makes each input
pipeline yield each of its batches once per replica of the group, in replica order, which is how
`distribute_datasets_from_function` hands a pipeline's batches to its local replicas.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from mlperf_tf.errors import UserError

# Outermost first; replica ids are row-major over these.
AXES = ("data", "expert", "spatial", "model")
# The axes whose replicas read different batches.
BATCH_AXES = ("data", "expert")
# The axes a replicated weight's gradient is summed over: the batch axes, and `spatial`, whose
# replicas each hold the partial gradient of their slab of the same images. (Not `model`: the
# shards of a model group compute the same gradient of a replicated weight.)
GRADIENT_AXES = BATCH_AXES + ("spatial",)
# Which flag sets each axis, for error messages.
AXIS_FLAGS = {
    "data": "the replica count",
    "expert": "--expert_parallel",
    "spatial": "--spatial_partition",
    "model": "--model_parallel",
}


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """The run's replicas as a (data, expert, spatial, model) mesh.

    Attributes:
      data: data-parallel groups beyond the expert axis.
      expert: replicas that split each MoE layer's experts (and read different batches).
      spatial: replicas that split each image (`spatial_rows` x `spatial_cols` tiles).
      model: replicas that split the weights of tensor-parallel layers.
      spatial_cols: the width factor L of `--spatial_partition=KxL` (1: slabs of rows only).
    """

    data: int = 1
    expert: int = 1
    spatial: int = 1
    model: int = 1
    spatial_cols: int = 1

    def __post_init__(self):
        for axis in AXES:
            size = getattr(self, axis)
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"mesh axis '{axis}' ({size!r}) must be a positive integer")
        if self.spatial % self.spatial_cols:
            raise ValueError(
                f"spatial_cols ({self.spatial_cols}) must divide the spatial axis ({self.spatial})"
            )

    # ---- shape ---------------------------------------------------------------------------------
    @property
    def shape(self) -> dict[str, int]:
        """Axis name -> size, outermost first."""
        return {axis: getattr(self, axis) for axis in AXES}

    @property
    def size(self) -> int:
        """Replicas in the mesh (the strategy's replicas in sync)."""
        n = 1
        for axis in AXES:
            n *= getattr(self, axis)
        return n

    @property
    def spatial_rows(self) -> int:
        """K of `--spatial_partition=KxL`: how many slabs along the height."""
        return self.spatial // self.spatial_cols

    @property
    def batch_shards(self) -> int:
        """How many different batches the replicas read per step (data x expert)."""
        return self.data * self.expert

    @property
    def group_size(self) -> int:
        """Replicas that read one batch (spatial x model)."""
        return self.spatial * self.model

    def axes_used(self) -> tuple[str, ...]:
        """The axes beyond `data` whose size is more than 1 (what a benchmark must support)."""
        return tuple(axis for axis in AXES[1:] if getattr(self, axis) > 1)

    # ---- coordinates ---------------------------------------------------------------------------
    def coords(self, replica: int) -> dict[str, int]:
        """Replica id -> its index along each axis."""
        if not 0 <= replica < self.size:
            raise ValueError(f"replica {replica} is outside the mesh of {self.size}")
        out = {}
        for axis in reversed(AXES):
            size = getattr(self, axis)
            out[axis] = replica % size
            replica //= size
        return {axis: out[axis] for axis in AXES}

    def replica(self, **coords: int) -> int:
        """The replica id at `coords` (missing axes: 0)."""
        unknown = set(coords) - set(AXES)
        if unknown:
            raise ValueError(f"unknown mesh axes {sorted(unknown)} (axes: {', '.join(AXES)})")
        replica = 0
        for axis in AXES:
            size, index = getattr(self, axis), coords.get(axis, 0)
            if not 0 <= index < size:
                raise ValueError(f"index {index} is outside mesh axis '{axis}' of size {size}")
            replica = replica * size + index
        return replica

    def index(self, replica: int, axis: str) -> int:
        """`replica`'s index along `axis`."""
        return self.coords(replica)[axis]

    def group(self, replica: int, *axes: str) -> list[int]:
        """The replicas that differ from `replica` only along `axes`, in id order (which is the
        rank order of TF's collectives: see `mlperf_tf.collectives.ops`)."""
        for axis in axes:
            if axis not in AXES:
                raise ValueError(f"unknown mesh axis '{axis}' (axes: {', '.join(AXES)})")
        base = self.coords(replica)
        members = [
            r
            for r in range(self.size)
            if all(v == base[a] for a, v in self.coords(r).items() if a not in axes)
        ]
        return members

    def batch_shard(self, replica: int) -> int:
        """Which of the `batch_shards` batches `replica` reads (its data and expert index)."""
        c = self.coords(replica)
        return c["data"] * self.expert + c["expert"]

    def __str__(self) -> str:
        parts = [f"{axis}={getattr(self, axis)}" for axis in AXES if getattr(self, axis) > 1]
        if self.spatial_cols > 1:
            parts[parts.index(f"spatial={self.spatial}")] = (
                f"spatial={self.spatial_rows}x{self.spatial_cols}"
            )
        return "DeviceMesh(" + (", ".join(parts) or "data=1") + ")"


# ---- from the run flags ------------------------------------------------------------------------
def parse_spatial(text: str) -> tuple[int, int]:
    """`--spatial_partition=K` or `KxL` -> (K, L).

    Raises:
      UserError: not one positive integer or two joined by "x".
    """
    parts = str(text).lower().split("x")
    if len(parts) not in (1, 2) or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise UserError(
            f"--spatial_partition={text!r} must be K or KxL with positive integers (e.g. 2, 2x2)"
        )
    rows = int(parts[0])
    cols = int(parts[1]) if len(parts) == 2 else 1
    return rows, cols


def check_flags(*, model_parallel: int, expert_parallel: int, spatial_partition: str) -> None:
    """Validates the mesh flags that need no strategy (RunConfig time).

    Raises:
      UserError: a size that is not a positive integer, or a malformed `--spatial_partition`.
    """
    for name, value in (("model_parallel", model_parallel), ("expert_parallel", expert_parallel)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--{name} ({value!r}) must be a positive integer (1: off)")
    parse_spatial(spatial_partition)


def build_mesh(
    num_replicas: int, *, model_parallel: int = 1, expert_parallel: int = 1,
    spatial_partition: str = "1",
) -> DeviceMesh:  # fmt: skip
    """The run's mesh: `num_replicas` split by the flags, the rest on the data axis.

    Raises:
      UserError: the flags' product does not divide the replica count (one line naming them).
    """
    check_flags(
        model_parallel=model_parallel,
        expert_parallel=expert_parallel,
        spatial_partition=spatial_partition,
    )
    rows, cols = parse_spatial(spatial_partition)
    spatial = rows * cols
    split = model_parallel * expert_parallel * spatial
    if num_replicas % split:
        named = [
            f"--{flag}={value}"
            for flag, value in (
                ("model_parallel", model_parallel),
                ("expert_parallel", expert_parallel),
                ("spatial_partition", spatial_partition),
            )
            if str(value) != "1"
        ]
        raise UserError(
            f"{' x '.join(named)} needs a multiple of {split} replicas; this run has "
            f"{num_replicas} (set --num_cpu_devices, or use a size that divides {num_replicas})"
        )
    return DeviceMesh(
        data=num_replicas // split,
        expert=expert_parallel,
        spatial=spatial,
        model=model_parallel,
        spatial_cols=cols,
    )


def check_flags_supported(
    benchmark_name: str, supported: tuple[str, ...], *, model_parallel: int = 1,
    expert_parallel: int = 1, spatial_partition: str = "1",
) -> None:  # fmt: skip
    """`check_supported` from the flags alone: before the strategy, the log or any set-up.

    Raises:
      UserError: one line naming the flag, the benchmark and the axes it supports.
    """
    rows, cols = parse_spatial(spatial_partition)
    sizes = {"expert": expert_parallel, "spatial": rows * cols, "model": model_parallel}
    for axis in AXES[1:]:
        if sizes[axis] > 1 and axis not in supported:
            raise UserError(
                f"{AXIS_FLAGS[axis]}: benchmark '{benchmark_name}' does not support {axis} "
                f"parallelism (it supports: {', '.join(supported)})"
            )


def check_supported(mesh: DeviceMesh, benchmark_name: str, supported: tuple[str, ...]) -> None:
    """Refuses a mesh axis the benchmark does not declare (`Benchmark.parallel_axes`).

    Raises:
      UserError: one line naming the flag, the benchmark and the axes it supports.
    """
    for axis in mesh.axes_used():
        if axis not in supported:
            flag = AXIS_FLAGS[axis]
            raise UserError(
                f"{flag}: benchmark '{benchmark_name}' does not support {axis} parallelism "
                f"(it supports: {', '.join(supported)})"
            )


# ---- input -------------------------------------------------------------------------------------
def mesh_input_context(
    input_context: tf.distribute.InputContext, mesh: DeviceMesh
) -> tuple[tf.distribute.InputContext, int]:
    """The input context a benchmark's pipeline sees on `mesh`, and how often to repeat each batch.

    A benchmark's pipeline is written for data parallelism: pipeline `i` of `n` reads its shard
    and yields one batch per local replica, of `global / num_replicas_in_sync` examples. On a
    mesh the replicas of one group (spatial x model) share a batch, so the pipeline is told there
    are `batch_shards` replicas in sync, and each batch it yields is repeated for every replica
    of the group. When a group spans several workers (a model axis across processes), the
    workers of one group get the same pipeline id, so they read the same examples.

    Returns:
      (context, repeats): the context to pass to the benchmark's dataset function, and how many
      consecutive replicas receive each of its batches (`repeat_for_group`).
    """
    if mesh.group_size == 1:
        return input_context, 1
    pipelines = input_context.num_input_pipelines
    if mesh.size % pipelines:
        raise UserError(f"{mesh} does not split over {pipelines} input pipelines (workers)")
    local = mesh.size // pipelines  # replicas fed by one pipeline
    group = mesh.group_size
    if local % group == 0:  # whole groups on each worker
        shards_here = local // group
        pipeline_id = input_context.input_pipeline_id
        num_pipelines = pipelines
        repeats = group
    elif group % local == 0:  # a group spans several workers: they read the same batch
        shards_here = 1
        pipeline_id = input_context.input_pipeline_id * local // group
        num_pipelines = mesh.batch_shards
        repeats = local
    else:
        raise UserError(
            f"{mesh}: a worker's {local} replicas neither hold whole replica groups of "
            f"{group} nor divide one"
        )
    context = tf.distribute.InputContext(
        num_input_pipelines=num_pipelines,
        input_pipeline_id=pipeline_id,
        num_replicas_in_sync=mesh.batch_shards,
    )
    del shards_here  # implied by the context: local batches = num_replicas_in_sync / pipelines
    return context, repeats


def repeat_for_group(dataset: tf.data.Dataset, repeats: int) -> tf.data.Dataset:
    """Each element of `dataset` `repeats` times in a row (the replicas of one group, in order)."""
    if repeats == 1:
        return dataset
    return dataset.flat_map(
        lambda *element: tf.data.Dataset.from_tensors(
            element if len(element) > 1 else element[0]
        ).repeat(repeats)
    )


def for_mesh(dataset_fn, mesh: DeviceMesh):
    """`dataset_fn` (input context -> per-replica batches) as a `distribute_datasets_from_function`
    argument on `mesh`: it sees the batch shards as its replicas, and each of its batches goes to
    every replica of the group that shares it."""

    def mesh_dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        input_context, repeats = mesh_input_context(input_context, mesh)
        return repeat_for_group(dataset_fn(input_context), repeats)

    return mesh_dataset_fn
