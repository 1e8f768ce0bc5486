"""Provides `RunConfig` (how to run a benchmark), `StopCause` and `RunResult` (how a run ended).

`RunConfig` is the one declaration of every run setting: `mlperf_tf.flags` builds one absl flag per
field from its type, default and `help` metadata, so a new run setting is one field here.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
from typing import Any

from mlperf_logging.mllog import constants as C

from mlperf_tf import distribute, precision, runlog
from mlperf_tf.collectives import mesh as collectives_mesh
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import mesh as parallel_mesh
from mlperf_tf.parallel import pipeline as pipeline_lib

RESUME_INPUT_MODES = ("skip", "reseed")
SUBMISSION_DIVISIONS = ("auto", "closed", "open")
SUBMISSION_STATUSES = ("onprem", "cloud", "preview", "research")


def default_platform() -> str:
    """MLPerf `submission_platform` of this host when none is given, e.g. `2xCPU`."""
    return f"{os.cpu_count()}xCPU"


def setting(default: Any = dataclasses.MISSING, *, help: str, choices=None, factory=None, **kw):  # noqa: A002
    """A `RunConfig` field with its flag's help text (and allowed values, for enum flags)."""
    metadata = {"help": help, "choices": tuple(choices) if choices else None}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata, **kw)
    return dataclasses.field(default=default, metadata=metadata, **kw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How to run a benchmark (not what it trains): strategy, precision, loops, checkpoints, log.

    Every field is a flag of `mlperf-tf run` of the same name; its `help` metadata is the flag's
    help text. Validation errors name the flag and its value.
    """

    model_dir: str = setting(
        None, help="Folder for checkpoints (ckpt/), TensorBoard (tensorboard/) and the MLPerf log."
    )
    mlperf_log: str = setting(
        "",
        help="MLPerf log path ('' means <model_dir>/mlperf_log.txt; a folder: the log inside it). "
        "Only an old log of this suite at that path is ever moved aside (to <log>.N).",
    )
    restart: bool = setting(
        False,
        help="Start a new run even though the log says this run finished: the old log and "
        "checkpoints are kept as <log>.N and ckpt.N (without it, a finished run is not resumed).",
    )
    distribution: str = setting(
        "auto", help="tf.distribute strategy.", choices=distribute.DISTRIBUTIONS
    )
    tpu: str = setting("", help="TPU name or address for TPUClusterResolver.")
    num_cpu_devices: int = setting(
        0,
        help="Split the CPU into N logical devices (tests); at most "
        f"{distribute.CPU_DEVICES_PER_CORE} per core and one per "
        f"{distribute.CPU_DEVICE_MEMORY_MB} MB of memory.",
    )
    dtype: str = setting("fp32", help="Compute precision.", choices=precision.DTYPES)
    xla: bool = setting(False, help="Compile the per-replica train and eval steps with XLA.")
    warm_up: bool = setting(
        True,
        help="Before run_start, trace (with --xla compile) the train and eval steps on synthetic "
        "batches of the real shapes, then restore the initial state: the first timed step is a "
        "steady one (MLPerf allows model execution before the clock, not data).",
    )
    steps_per_loop: int = setting(
        100, help="Optimizer steps per compiled host loop; progress is printed once per loop."
    )
    checkpoint_every_loops: int = setting(
        10, help="Save a checkpoint every N host loops (0: only at the end of the run)."
    )
    checkpoint_every_minutes: float = setting(
        5.0,
        help="Also save a checkpoint once this many minutes passed since the last (0: off); a "
        "block without a save gets one before its eval.",
    )
    max_checkpoints: int = setting(3, help="Checkpoints to keep.")
    resume_input: str = setting(
        "skip",
        help="On resume: `skip` replays the input past the consumed batches (exact for "
        "deterministic pipelines; costs their input time); `reseed` restarts it with a seed "
        "derived from the step (cheap; a different order).",
        choices=RESUME_INPUT_MODES,
    )
    seed: int = setting(0, help="Run seed (MLPerf `seed`): data order, augmentation, initializers.")
    max_train_steps: int = setting(
        0, help="Stop after N optimizer steps (0: the benchmark's `max_epochs` budget)."
    )
    data_service: str = setting("", help="tf.data service address, e.g. grpc://host:5050.")
    data_service_timeout_s: float = setting(
        120.0,
        help="With --data_service: seconds a train loop may wait for a batch before the run stops "
        "with an error naming the dispatcher (all its workers dead or frozen; with one worker "
        "left TF goes on). Must exceed the slowest step; 0: wait forever.",
    )
    skip_bad_records: bool = setting(False, help="Skip and count corrupt records.")
    startup_timeout_s: float = setting(120.0, help="Seconds to reach a TPU or the peer workers.")
    collective_timeout: float = setting(
        0.0,
        help="Seconds a multi-worker collective may wait for its peers before the run stops with "
        "an error naming them (0: no limit; TF's heartbeat check still ends it in about 10 s "
        "when a peer dies or freezes).",
    )
    submission_org: str = setting("mlperf-tf", help="MLPerf submission_org.")
    submission_platform: str = setting(
        help="MLPerf submission_platform (default: this host, e.g. 2xCPU).",
        factory=default_platform,
    )
    submission_division: str = setting(
        "auto",
        help="MLPerf submission_division (auto: closed, or open when the round's closed rules do "
        "not allow the run's settings, e.g. a K-FAC, NLCG or Neumann optimizer for ResNet).",
        choices=SUBMISSION_DIVISIONS,
    )
    submission_status: str = setting(
        "research", help="MLPerf submission_status.", choices=SUBMISSION_STATUSES
    )
    echo_mlperf_log: bool = setting(False, help="Also print the MLPerf log lines to stdout.")
    ruleset: str = setting(
        "",
        help="MLPerf Training round whose rules the log follows, e.g. 2.0.0: it decides the keys "
        "emitted (e.g. weights_initialization in 1.1.0-2.1.0). '' means the newest round that "
        "has the benchmark.",
    )

    all_reduce: str = setting(
        "auto",
        help="Cross-replica gradient sum: auto (the strategy's own inside Keras; ring, or "
        "hierarchical over several workers, when packing or sharding), ring, hierarchical (sum "
        "within mesh rows, across their first replicas, broadcast back), torus2d (reduce-scatter "
        "along rows, all-reduce along columns, all-gather along rows). See "
        "mlperf_tf/collectives/README.md.",
        choices=collectives_mesh.ALGORITHMS,
    )
    mesh: str = setting(
        "",
        help="The all-reduce's view of the data groups (the replicas that read different "
        "batches) as RxC rows x columns, group i at row i // C ('' means one row per worker, or "
        "on one host the most square R <= C); not a device mesh (see --model_parallel).",
    )
    pack_mb: float = setting(
        0.0, help="Fuse gradients into buckets of about M MiB before summing (0: one per tensor)."
    )
    weight_update_sharding: bool = setting(
        False,
        help="Reduce-scatter the summed gradients, update a 1/N shard of each variable per "
        "replica (optimizer slots for that shard only; SGD, LARS, LAMB, FusedAdam, AdamW), "
        "all-gather the weights.",
    )
    cluster_resolver: str = setting(
        "auto",
        help="Where the workers come from: TF_CONFIG, or TF's SlurmClusterResolver, "
        "KubernetesClusterResolver or TPUClusterResolver (auto: --tpu, then TF_CONFIG, then a "
        "Slurm step of several tasks).",
        choices=distribute.CLUSTER_RESOLVERS,
    )
    slurm_port_base: int = setting(
        8888, help="First worker port on each node with --cluster_resolver=slurm (then +1, ...)."
    )

    # The device mesh (mlperf_tf/parallel/mesh.py): each flag sizes one axis; the replicas left
    # over form the data axis. A benchmark declares the axes it supports.
    model_parallel: int = setting(
        1,
        help="Tensor (model) parallelism: split the weights of the benchmark's Megatron-style "
        "layers over M replicas that share one batch (1: off).",
    )
    expert_parallel: int = setting(
        1,
        help="Expert parallelism: split each mixture-of-experts layer's experts over E replicas "
        "(which read different batches); tokens travel by all-to-all (1: off).",
    )
    spatial_partition: str = setting(
        "1",
        help="Spatial partitioning: K (slabs of rows) or KxL (tiles) replicas share one batch of "
        "images, each holding a part of every activation; convolutions exchange halos (1: off).",
    )
    pipeline_parallel: int = setting(
        1,
        help="Pipeline parallelism: P replicas that share one batch each hold a stage of "
        "consecutive decoder layers; the batch runs through them in micro-batches (1: off).",
    )
    context_parallel: int = setting(
        1,
        help="Context parallelism: C replicas that share one batch each hold 2 of every "
        "sequence's 2C chunks (zig-zag, for the causal mask's balance); attention gathers keys "
        "and values over them (1: off).",
    )
    pipeline_schedule: str = setting(
        "1f1b",
        help="The order of the micro-batches through the pipeline's stages: '1f1b' (each stage "
        "holds at most P - s micro-batches' activations) or 'gpipe' (every forward, then every "
        "backward: M in flight); both idle (P - 1) / (M + P - 1) of the step.",
        choices=pipeline_lib.SCHEDULES,
    )
    micro_batch_size: int = setting(
        0,
        help="Sequences per data group in one pipeline micro-batch (0: the whole per-replica "
        "batch, or the gradient-accumulation count's share of it).",
    )

    def __post_init__(self):
        _check_numbers(self)
        collectives_mesh.check_settings(
            all_reduce=self.all_reduce,
            mesh=self.mesh,
            pack_mb=self.pack_mb,
            cluster_resolver=self.cluster_resolver,
        )
        parallel_mesh.check_flags(
            model_parallel=self.model_parallel,
            expert_parallel=self.expert_parallel,
            spatial_partition=self.spatial_partition,
            pipeline_parallel=self.pipeline_parallel,
            context_parallel=self.context_parallel,
            micro_batch_size=self.micro_batch_size,
        )
        if not self.model_dir:
            raise UserError("--model_dir is required")
        for field in dataclasses.fields(self):
            choices = field.metadata.get("choices")
            value = getattr(self, field.name)
            if choices and value not in choices:
                raise UserError(f"--{field.name}={value!r} is not one of {', '.join(choices)}")
        if self.num_cpu_devices:
            distribute.check_cpu_device_count(self.num_cpu_devices)
        _check_no_effect(self)
        runlog.resolve_path(self.mlperf_log, self.model_dir)  # a bad path fails before any work

    def mesh_flags(self) -> dict[str, int | str]:
        """The flags that size the device mesh's axes, as `parallel.mesh.build_mesh` takes them."""
        return dict(
            model_parallel=self.model_parallel,
            expert_parallel=self.expert_parallel,
            spatial_partition=self.spatial_partition,
            pipeline_parallel=self.pipeline_parallel,
            context_parallel=self.context_parallel,
        )

    @property
    def mlperf_log_path(self) -> str:
        """The log file: `--mlperf_log` (inside it when it is a folder) or the default."""
        return runlog.resolve_path(self.mlperf_log, self.model_dir)


# Upper bounds of the numeric settings: beyond them a value means nothing on any system (steps
# and counts are int32 inside the compiled loop; a year of seconds or minutes is "off" in
# disguise). Lower bounds: `_POSITIVE` > 0, the rest >= 0.
_MAX_COUNT = 2**31 - 1
_MAX_SECONDS = 366 * 24 * 3600.0
_BOUNDS = {
    "steps_per_loop": _MAX_COUNT,
    "checkpoint_every_loops": _MAX_COUNT,
    "checkpoint_every_minutes": _MAX_SECONDS / 60,
    "max_checkpoints": 10_000,
    "seed": _MAX_COUNT,
    "max_train_steps": _MAX_COUNT,
    "data_service_timeout_s": _MAX_SECONDS,
    "startup_timeout_s": _MAX_SECONDS,
    "collective_timeout": _MAX_SECONDS,
    "pack_mb": 1024.0 * 1024,
    "slurm_port_base": 65535,
    "model_parallel": 1 << 20,
    "expert_parallel": 1 << 20,
    "pipeline_parallel": 1 << 20,
    "context_parallel": 1 << 20,
    "micro_batch_size": _MAX_COUNT,
    "num_cpu_devices": 1 << 20,
}
_POSITIVE = ("steps_per_loop", "max_checkpoints", "startup_timeout_s", "slurm_port_base")


def _check_numbers(config: RunConfig) -> None:
    """Every numeric flag is finite and within its range; the message names the flag."""
    for name, upper in _BOUNDS.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"--{name}={value!r} must be a number")
        if not math.isfinite(value):
            raise UserError(f"--{name}={value!r} must be a finite number")
        if name in _POSITIVE and value <= 0:
            raise UserError(f"--{name} ({value}) must be positive.")
        if value < 0:
            raise UserError(f"--{name} ({value}) must not be negative.")
        if value > upper:
            raise UserError(f"--{name} ({value}) is too large (at most {upper:g})")


def _check_no_effect(config: RunConfig) -> None:
    """A setting that changes nothing in the chosen mode is an error, not silently ignored."""
    keras_sum = config.all_reduce == "auto" and not config.pack_mb
    if config.mesh and keras_sum and not config.weight_update_sharding:
        raise UserError(
            f"--mesh={config.mesh!r} has no effect with --all_reduce=auto (Keras' own sum): "
            "pick --all_reduce=ring|hierarchical|torus2d, or drop --mesh"
        )
    defaults = {f.name: f.default for f in dataclasses.fields(RunConfig)}
    if config.slurm_port_base != defaults["slurm_port_base"] and config.cluster_resolver not in (
        "slurm",
        "auto",
    ):
        raise UserError(
            f"--slurm_port_base={config.slurm_port_base} has no effect with "
            f"--cluster_resolver={config.cluster_resolver}"
        )
    changed_timeout = config.data_service_timeout_s != defaults["data_service_timeout_s"]
    if changed_timeout and not config.data_service:
        raise UserError(
            f"--data_service_timeout_s={config.data_service_timeout_s:g} has no effect without "
            "--data_service"
        )
    if config.tpu and config.distribution not in ("auto", "tpu"):
        raise UserError(
            f"--tpu={config.tpu!r} has no effect with --distribution={config.distribution}"
        )
    if config.num_cpu_devices and config.distribution in ("tpu", "one_device"):
        raise UserError(
            f"--num_cpu_devices={config.num_cpu_devices} has no effect with "
            f"--distribution={config.distribution}"
        )


class StopCause(enum.Enum):
    """Why a run stopped. The MLPerf `run_stop` status and the checkpoint policy follow from it."""

    TARGET_REACHED = "target_reached"
    BUDGET_ENDED = "budget_ended"
    NON_FINITE_LOSS = "non_finite_loss"
    BAD_DATA = "bad_data"
    INTERRUPTED = "interrupted"  # SIGTERM/SIGINT (mlperf_tf.preemption)
    PEER_FAILED = "peer_failed"  # a peer worker died or froze (mlperf_tf.peers)
    SAVE_FAILED = "save_failed"  # a checkpoint could not be written (full disk, read-only)
    DATA_SERVICE_FAILED = "data_service_failed"  # no batch from the tf.data service in time

    @property
    def status(self) -> str:
        """MLPerf's `run_stop` status: success only at the quality target."""
        return C.SUCCESS if self is StopCause.TARGET_REACHED else C.ABORTED

    @property
    def keeps_weights(self) -> bool:
        """Whether the final weights are worth a checkpoint (never save diverged weights)."""
        return self not in (StopCause.NON_FINITE_LOSS, StopCause.SAVE_FAILED)


@dataclasses.dataclass
class RunResult:
    """What a run ended with (on every worker)."""

    cause: StopCause
    reason: str  # why it stopped, for people
    steps: int
    evals: list[tuple[float, float]]  # (epoch_num, eval value) in order
    mlperf_log: str | None  # the log path on the chief, None on other workers
    model: Any = None

    @property
    def status(self) -> str:
        """MLPerf `run_stop` status: "success" or "aborted"."""
        return self.cause.status

    @property
    def success(self) -> bool:
        return self.cause is StopCause.TARGET_REACHED
