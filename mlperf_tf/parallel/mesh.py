"""Provides `DeviceMesh`: the run's replicas as one mesh with named axes, built from the run flags.

Every kind of parallelism in the suite is a layout over this one mesh (JAX's `Mesh`, DTensor's
`Mesh` + `Layout`): a tensor is split along some axes and replicated along the others.

| axis | flag | replicas along it ... |
|---|---|---|
| `data` | (the rest) | read different batches; gradients are summed over it |
| `expert` | `--expert_parallel=E` | read different batches (it is part of data parallelism) and hold different experts of each mixture-of-experts layer; tokens travel between them by all-to-all |
| `pipeline` | `--pipeline_parallel=P` | share one batch; each holds a stage of consecutive layers, the batch run through them in micro-batches (`--micro_batch_size`) |
| `context` | `--context_parallel=C` | share one batch; each holds 2 of every sequence's 2C chunks (zig-zag: chunks c and 2C-1-c) and gathers keys and values over the axis |
| `spatial` | `--spatial_partition=K` or `KxL` | share one batch; each holds a slab (rows, or a K x L tile) of every image's activations |
| `model` | `--model_parallel=M` | share one batch; each holds 1/M of the split weights (Megatron's tensor parallelism) |

Replica ids are laid out row-major over (data, expert, pipeline, context, spatial, model),
`model` fastest: the replicas of one model group are consecutive, so they sit on one host (the
fastest links) when a host has at least M devices, and a host's devices stay together for the
data-axis all-reduce (`--mesh=RxC` is the all-reduce's view of the data groups;
`mlperf_tf/collectives/README.md`). Megatron orders its groups tp-cp-ep-dp-pp (pipeline
outermost, across nodes); here every axis whose replicas share a batch is inside the batch axes,
so the replicas of one batch shard are consecutive ids and the input routing repeats each batch
for a run of consecutive replicas (`mlperf_tf.parallel.input`). On one host the order costs
nothing; across hosts a pipeline group of P > the host's devices spans hosts as Megatron's does.

Replicas that share a batch (one `batch shard`: same data and expert coordinates) read the same
examples; `mlperf_tf.parallel.input` routes them. This module imports no TensorFlow (nor
`mlperf_tf.parallel.input`, which imports it: no circle), so the simulator and the flag checks
describe a mesh with the same type the runner trains on.
"""

from __future__ import annotations

import dataclasses

from mlperf_tf.errors import UserError

# Outermost first; replica ids are row-major over these.
AXES = ("data", "expert", "pipeline", "context", "spatial", "model")
# The axes whose replicas read different batches.
BATCH_AXES = ("data", "expert")
# The axes a replicated weight's gradient is summed over: the batch axes, and `context` and
# `spatial`, whose replicas each hold the partial gradient of their chunks of the same sequences
# or their slab of the same images. (Not `model`: the shards of a model group compute the same
# gradient of a replicated weight. Not `pipeline`: a stage's weights live on that stage only,
# with a layout of their own.)
GRADIENT_AXES = BATCH_AXES + ("context", "spatial")
# Which flag sets each axis, for error messages.
AXIS_FLAGS = {
    "data": "the replica count",
    "expert": "--expert_parallel",
    "pipeline": "--pipeline_parallel",
    "context": "--context_parallel",
    "spatial": "--spatial_partition",
    "model": "--model_parallel",
}


@dataclasses.dataclass(frozen=True)
class DeviceMesh:
    """The run's replicas as a (data, expert, pipeline, context, spatial, model) mesh.

    Attributes:
      data: data-parallel groups beyond the expert axis.
      expert: replicas that split each MoE layer's experts (and read different batches).
      spatial: replicas that split each image (`spatial_rows` x `spatial_cols` tiles).
      model: replicas that split the weights of tensor-parallel layers.
      spatial_cols: the width factor L of `--spatial_partition=KxL` (1: slabs of rows only).
      pipeline: replicas that each hold a stage of consecutive layers.
      context: replicas that split each sequence (2 of its 2 x `context` chunks each).

    (`pipeline` and `context` come last among the fields so that meshes written positionally
    before them keep their meaning; `AXES` gives the replica-id order.)
    """

    data: int = 1
    expert: int = 1
    spatial: int = 1
    model: int = 1
    spatial_cols: int = 1
    pipeline: int = 1
    context: int = 1

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
        """Replicas that read one batch (pipeline x context x spatial x model)."""
        return self.pipeline * self.context * self.spatial * self.model

    @property
    def loss_copies(self) -> int:
        """Replicas of a group whose losses are each the batch shard's whole loss (the summed
        reported loss is divided by it): not the `context` members, whose losses are their
        tokens' shares and sum to it."""
        return self.group_size // self.context

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


def check_flags(
    *, model_parallel: int, expert_parallel: int, spatial_partition: str,
    pipeline_parallel: int = 1, context_parallel: int = 1, micro_batch_size: int = 0,
) -> None:  # fmt: skip
    """Validates the mesh flags that need no strategy (RunConfig time).

    Args:
      micro_batch_size: `--micro_batch_size` (0: the whole per-replica batch in one pass).

    Raises:
      UserError: a size that is not a positive integer, a negative micro batch, or a malformed
        `--spatial_partition`.
    """
    sizes = {
        "model_parallel": model_parallel,
        "expert_parallel": expert_parallel,
        "pipeline_parallel": pipeline_parallel,
        "context_parallel": context_parallel,
    }
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"--{name} ({value!r}) must be a positive integer (1: off)")
    if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int):
        raise UserError(f"--micro_batch_size ({micro_batch_size!r}) must be an integer")
    if micro_batch_size < 0:
        raise UserError(
            f"--micro_batch_size ({micro_batch_size}) must not be negative (0: the whole "
            "per-replica batch in one pass)"
        )
    parse_spatial(spatial_partition)


def _axis_sizes(
    model_parallel: int, expert_parallel: int, spatial_partition: str, pipeline_parallel: int,
    context_parallel: int,
) -> dict[str, int]:  # fmt: skip
    """The flags as sizes of the mesh axes beyond `data`."""
    rows, cols = parse_spatial(spatial_partition)
    return {
        "expert": expert_parallel,
        "pipeline": pipeline_parallel,
        "context": context_parallel,
        "spatial": rows * cols,
        "model": model_parallel,
    }


def build_mesh(
    num_replicas: int, *, model_parallel: int = 1, expert_parallel: int = 1,
    spatial_partition: str = "1", pipeline_parallel: int = 1, context_parallel: int = 1,
) -> DeviceMesh:  # fmt: skip
    """The run's mesh: `num_replicas` split by the flags, the rest on the data axis.

    Raises:
      UserError: the flags' product does not divide the replica count (one line naming them).
    """
    check_flags(
        model_parallel=model_parallel,
        expert_parallel=expert_parallel,
        spatial_partition=spatial_partition,
        pipeline_parallel=pipeline_parallel,
        context_parallel=context_parallel,
    )
    sizes = _axis_sizes(
        model_parallel, expert_parallel, spatial_partition, pipeline_parallel, context_parallel
    )
    split = 1
    for size in sizes.values():
        split *= size
    if num_replicas % split:
        flags = {
            "model_parallel": model_parallel,
            "expert_parallel": expert_parallel,
            "pipeline_parallel": pipeline_parallel,
            "context_parallel": context_parallel,
            "spatial_partition": spatial_partition,
        }
        named = [f"--{flag}={value}" for flag, value in flags.items() if str(value) != "1"]
        raise UserError(
            f"{' x '.join(named)} needs a multiple of {split} replicas; this run has "
            f"{num_replicas} (set --num_cpu_devices, or use a size that divides {num_replicas})"
        )
    return DeviceMesh(
        data=num_replicas // split,
        spatial_cols=parse_spatial(spatial_partition)[1],
        **sizes,
    )


def check_flags_supported(
    benchmark_name: str, supported: tuple[str, ...], *, model_parallel: int = 1,
    expert_parallel: int = 1, spatial_partition: str = "1", pipeline_parallel: int = 1,
    context_parallel: int = 1,
) -> None:  # fmt: skip
    """`check_supported` from the flags alone: before the strategy, the log or any set-up.

    Raises:
      UserError: one line naming the flag, the benchmark and the axes it supports.
    """
    sizes = _axis_sizes(
        model_parallel, expert_parallel, spatial_partition, pipeline_parallel, context_parallel
    )
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
