"""Provides `Benchmark`, the one interface through which a model joins the suite.

A benchmark is the Model Garden's Task: "a single-replica view of the training procedure". Its
step methods (`compute_loss`, `eval_step`) run in replica context on one replica's batch; only the
runner calls `strategy.run`. Host-side methods (`eval_reduce`, `eval_result`, `mlperf_hparams`)
run in plain Python on every worker.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib
import math
import sys
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from mlperf_tf import rcps
from mlperf_tf import rounds as rounds_lib
from mlperf_tf.config import BenchmarkConfig, ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.facts import EvalCadence, Rcp, RenamedKey, SimulatorShape, StatedConvergence
from mlperf_tf.parallel.mesh import DeviceMesh

PRESET_NAMES = ("mlperf", "mini", "smoke")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunContext:
    """What a benchmark is told about the run it is part of; the runner binds it before any build.

    Attributes:
      num_replicas: replicas in sync of the run's strategy.
      seed: the seed for data order and augmentation (on a `reseed` resume, the run seed plus the
        resumed step).
      skip_bad_records: skip and count corrupt records instead of failing on the first one.
      static_shapes: the steps must keep every tensor's shape fixed by the batch's shape (XLA-
        compiled steps, TPUs, FLOP counting). Without it a step may skip padding with
        data-dependent gathers (`mlperf_tf.layers.PackedTokens`: the Transformer and BERT do),
        which XLA cannot compile.
      mesh: the run's device mesh (`mlperf_tf.parallel.DeviceMesh`): how the replicas split
        into data, expert, spatial and model axes. None means data parallelism over all
        `num_replicas` (the mesh `DeviceMesh(data=num_replicas)`).
      collective_timeout_s: seconds a collective the model issues itself (an expert-parallel
        MoE layer's all-to-alls) may wait for its peers before it fails naming itself
        (`--collective_timeout`; 0: no limit).
      micro_batch_size: sequences per data group in one pipeline micro-batch
        (`--micro_batch_size`; 0: the whole per-replica batch, `per_replica_batch_size`).
    """

    num_replicas: int = 1
    seed: int = 0
    skip_bad_records: bool = False
    static_shapes: bool = False
    mesh: DeviceMesh | None = None
    collective_timeout_s: float = 0.0
    micro_batch_size: int = 0

    @property
    def device_mesh(self) -> DeviceMesh:
        """`mesh`, or data parallelism over `num_replicas` when none was given."""
        return self.mesh if self.mesh is not None else DeviceMesh(data=self.num_replicas)


@dataclasses.dataclass(frozen=True)
class EvalPoint:
    """One evaluation of the MLPerf schedule and the training block that leads to it.

    Attributes:
      step: the global optimizer step after which this evaluation runs.
      epoch_num: what MLPerf logs as `epoch_num` of `eval_accuracy` (epochs, or samples for BERT).
      first_epoch_num: `first_epoch_num` of the block before it (MLPerf's block metadata).
      epoch_count: `epoch_count` of that block.
      samples_count: training samples before this evaluation, logged as `samples_count`
        metadata of the block and eval events (rules that count samples: llama31_8b); None
        leaves it out.
    """

    step: int
    epoch_num: float
    first_epoch_num: float
    epoch_count: float
    samples_count: int | None = None


class Benchmark(abc.ABC):
    """Base class of every benchmark. Subclass it in `benchmarks/<name>/benchmark.py`.

    Class attributes to set:
      name: the registry name (`mlperf-tf run --benchmark=name`).
      mlperf_benchmark: MLPerf's `submission_benchmark` value ("resnet", "ssd", "transformer",
        "bert"); the checker picks its rules from it. Default: `name`.
      config_class: the benchmark's frozen config dataclass (a `BenchmarkConfig` subclass).
      presets: maps preset names (`mlperf`, `mini`, `smoke`) to functions returning a config.
        Default: the functions of those names (`PRESET_NAMES`) in `config_class`'s module
        (every benchmark's `config.py` defines the three).
      parallel_axes: the device-mesh axes the benchmark supports (`mlperf_tf.parallel.AXES`):
        "data" always; "model", "expert", "spatial" where its model has the layers for them.
        The runner refuses a run that sizes another axis above 1, with one line. Read it on an
        instance (`benchmark.parallel_axes`): a class attribute where the axes are fixed, a
        property where the config decides (an MoE config adds "expert").
      spatial_input: the batch key of the `[batch, height, width, channels]` images that
        `--spatial_partition` splits on TPUStrategy (`mlperf_tf.parallel.tpu`; on other
        strategies the model's layers split its activations).
      higher_is_better: whether the quality value improves upward (accuracies, the default)
        or downward (a log perplexity): the run stops when an eval reaches `quality_target`
        in that direction, and the log's target note says so for `mlperf-tf check`.
      sample_unit: what one sample of `global_batch_size` is, singular ("image", "sequence",
        "token"; default "sample"): `mlperf-tf bench` reports its rate in it (images/s).

    Facts about the benchmark (the library names no benchmark: `rounds`, `flops`, `simulate`,
    `bench` and `list` read these through the registry; each has a default):
      mlperf_rounds: the MLPerf rounds ("4.0.0", ...) whose closed rules fit this model, oldest
        first. None (the default): every round of the installed mlperf-logging whose
        `closed_common.yaml` accepts `mlperf_benchmark` and that ships its
        `closed_<mlperf_benchmark>.yaml` (`rounds.rounds_with_rules`). Declare them where a
        rule file of that name is another model in some rounds (SSD: RetinaNet from 2.0.0).
        `supported_rounds()` resolves it; `mlperf-tf run` emits for the newest by default.
      renamed_keys: `RenamedKey(old, new, since)` for each log key MLPerf renamed from a round
        on; the runner logs the round's name (BERT: `opt_epsilon` -> `opt_lamb_epsilon`).
      convergence: `Rcp(file, prefix, in_samples)` naming the reference convergence points in
        the installed mlperf-logging, or `StatedConvergence(points, source)` where no RCP
        exists; the simulator's epochs to target. None: `simulate` needs `--epochs`.
      skipped_evals_rule: (a, b) where the rules skip the first int(a x global batch + b)
        evals (llama2_70b_lora's eval delay); the simulator does not time them. None: none.
      repeatable_input: whether building its datasets again from the same input context yields
        the same elements (True: pure functions of the context and seed). The runner then reads
        synthetic input once per replica, without TF's per-device pipelines, whose release waits
        (`parallel.input.distribute_untuned`). False: a pipeline with its own state (GRPO's
        rollouts, generated on the host as the policy trains) is built once per worker.
    and the methods `training_flops_per_sample()` (None: traced from the model),
    `parameter_count()`, `tokens_per_sample()`, `simulator_shape()`, `eval_cadence()` and
    `round_hparams()`.
    """

    name: ClassVar[str]
    mlperf_benchmark: ClassVar[str]
    config_class: ClassVar[type[BenchmarkConfig]]
    presets: ClassVar[dict[str, Callable[[], BenchmarkConfig]]]
    parallel_axes: ClassVar[tuple[str, ...]] = ("data",)
    spatial_input: ClassVar[str] = "image"
    higher_is_better: ClassVar[bool] = True
    sample_unit: ClassVar[str] = "sample"
    mlperf_rounds: ClassVar[tuple[str, ...] | None] = None
    renamed_keys: ClassVar[tuple[RenamedKey, ...]] = ()
    convergence: ClassVar[Rcp | StatedConvergence | None] = None
    skipped_evals_rule: ClassVar[tuple[float, float] | None] = None
    repeatable_input: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any):
        """Gives a benchmark that declares `name` the defaults of `mlperf_benchmark` and
        `presets` it leaves out (so that no benchmark restates them)."""
        super().__init_subclass__(**kwargs)
        if "name" not in vars(cls):  # a family's base (`mlperf_tf.lm`), no benchmark yet
            return
        if not hasattr(cls, "mlperf_benchmark"):
            cls.mlperf_benchmark = cls.name
        if not hasattr(cls, "presets") and hasattr(cls, "config_class"):
            module = sys.modules[cls.config_class.__module__]
            missing = [preset for preset in PRESET_NAMES if not hasattr(module, preset)]
            if missing:
                raise TypeError(
                    f"benchmark {cls.name!r} declares no `presets`, and its config module "
                    f"{module.__name__} has no {', '.join(missing)} function to default them to"
                )
            cls.presets = {preset: getattr(module, preset) for preset in PRESET_NAMES}

    def __init__(self, config: BenchmarkConfig, *, context: RunContext | None = None):
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config = config
        self.context = context or RunContext()

    def with_context(self, context: RunContext) -> Benchmark:
        """A new benchmark of the same config bound to `context` (the runner's way in; no mutation)."""
        return type(self)(self.config, context=context)

    @property
    def seed(self) -> int:
        """The run's seed: data shuffling, augmentation and initializers derive from it."""
        return self.context.seed

    @property
    def skip_bad_records(self) -> bool:
        """Skip and count corrupt records instead of failing on the first one."""
        return self.context.skip_bad_records

    @property
    def static_shapes(self) -> bool:
        """Whether the steps must keep static shapes (see `RunContext.static_shapes`)."""
        return self.context.static_shapes

    @property
    def num_replicas(self) -> int:
        """Replicas in sync of the strategy, every mesh axis counted (e.g. for batch-norm groups).

        Not the count of batches a step reads: the replicas of a model or spatial group share
        one. Count samples and split batches with `batch_shards`.
        """
        return self.context.num_replicas

    @property
    def batch_shards(self) -> int:
        """Replicas that read different batches (the mesh's data x expert; `num_replicas` when
        the mesh splits nothing else): a step reads `batch_shards` per-replica batches, and a
        replica's loss is its batch shard's share of the global mean (see `compute_loss`)."""
        return self.mesh.batch_shards

    @property
    def mesh(self) -> DeviceMesh:
        """The run's device mesh (see `RunContext.mesh`)."""
        return self.context.device_mesh

    @classmethod
    def preset(cls, name: str) -> BenchmarkConfig:
        """Returns the config of preset `name`; raises KeyError naming the known presets."""
        if name not in cls.presets:
            raise KeyError(
                f"benchmark '{cls.name}' has no preset '{name}' (presets: {', '.join(cls.presets)})"
            )
        return cls.presets[name]()

    # ---- sizes derived from config -------------------------------------------------------------
    @property
    def micro_batch_size(self) -> int:
        """Global examples per forward/backward pass: the global batch over the accumulation steps.

        `compute_loss` divides its per-replica loss sum by this, so that summing gradients across
        replicas (done inside `apply_gradients`) and averaging over accumulation steps (done by the
        runner) gives the mean gradient over the global batch.
        """
        return self.config.global_batch_size // self.config.gradient_accumulation_steps

    def replica_batch_size(self, global_batch: int, input_context=None) -> int:
        """`global_batch` split over the replicas: the one per-replica batch formula.

        Replicas that share a batch (a spatial or model group of the mesh) count once: the
        runner's input context says `batch_shards` replicas in sync on such a mesh.

        Args:
          global_batch: examples (or tokens) over all replicas, e.g. `micro_batch_size`.
          input_context: the pipeline's context; None uses the mesh's `batch_shards`.

        Raises:
          ConfigError: `global_batch` does not split evenly over the replicas.
        """
        replicas = input_context.num_replicas_in_sync if input_context else self.mesh.batch_shards
        if global_batch % replicas:
            raise ConfigError(
                f"the batch ({global_batch}, from `global_batch_size` / "
                "`gradient_accumulation_steps` or `eval_batch_size`) must be divisible by the "
                f"number of replicas ({replicas})."
            )
        return global_batch // replicas

    @property
    def per_replica_batch_size(self) -> int:
        """Examples per replica per forward/backward pass (the micro batch over the replicas)."""
        return self.replica_batch_size(self.micro_batch_size)

    @property
    def pipeline_micro_batch(self) -> int:
        """Examples per data group in one micro-batch of the pipeline schedule: the run's
        `--micro_batch_size`, or the whole `per_replica_batch_size` (one micro-batch).

        Raises:
          UserError: `--micro_batch_size` does not divide `per_replica_batch_size`.
        """
        size = self.context.micro_batch_size
        per_replica = self.per_replica_batch_size
        if not size:
            return per_replica
        if per_replica % size:
            raise UserError(
                f"--micro_batch_size ({size}) must divide the batch of each data group "
                f"({per_replica}: global_batch_size / gradient_accumulation_steps / "
                f"{self.mesh.batch_shards} data groups)"
            )
        return size

    @property
    def steps_per_epoch(self) -> int:
        return self.config.steps_per_epoch

    @property
    def train_steps(self) -> int:
        """The step budget: `max_epochs` worth of optimizer steps."""
        return max(1, int(math.ceil(self.config.max_epochs * self.steps_per_epoch)))

    def eval_steps(self, num_replicas: int) -> int:
        """Eval batches each replica runs to cover the whole eval set (the last one padded)."""
        global_eval_batch = self.config.eval_batch_size
        del num_replicas  # eval_batch_size is global; each replica gets eval_batch_size/replicas.
        return max(1, int(math.ceil(self.config.eval_examples / global_eval_batch)))

    def parameter_count(self) -> int | None:
        """The model's parameter count from its config alone, without building or allocating the
        weights (an 8-billion-parameter model must be countable on a laptop); None where the
        benchmark does not say (`mlperf-tf simulate` and `list` then leave it out)."""
        return None

    def trainable_parameter_count(self) -> int | None:
        """The parameters that get gradients (what data parallelism all-reduces and the optimizer
        updates), from the config: `parameter_count()` unless most of the model is frozen (a
        fine-tuning benchmark's adapters)."""
        return self.parameter_count()

    def parameter_groups(self) -> dict[str, int] | None:
        """`parameter_count()` split by kind where the kinds cost differently, from the config
        (a recommender's embedding tables, updated sparsely and sharded by rows, apart from its
        dense weights); `mlperf-tf list --json` shows it. None (the default): one kind."""
        return None

    def active_parameter_count(self) -> int | None:
        """The parameters one sample's token multiplies, from the config: `parameter_count()`
        unless the model routes (a mixture of experts counts its router and top-k experts);
        `mlperf-tf list` and `simulate` report it beside the total."""
        return self.parameter_count()

    @classmethod
    def supported_rounds(cls) -> tuple[str, ...]:
        """The rounds whose closed rules fit this model, oldest first: `mlperf_rounds`, or by
        default every installed round with rules for `mlperf_benchmark` (() for a benchmark
        no round has, e.g. a plug-in: its logs are open-division logs)."""
        if cls.mlperf_rounds is not None:
            return tuple(cls.mlperf_rounds)
        return rounds_lib.rounds_with_rules(cls.mlperf_benchmark)

    def training_flops_per_sample(self) -> float | None:
        """Training FLOPs (a multiply-add is 2; forward + backward, 3x the forward products) of
        one sample of `global_batch_size`, counted from the config; None (the default):
        `mlperf_tf.flops` traces `compute_loss` and counts the graph's products.

        Declare it where tracing cannot see what runs or cannot run at all: a model too large to
        build on a host (Llama 3.1 8B), MoE layers (only the experts a token is routed to
        count; the traced graph holds the capacity padding), sliding-window attention (counted
        at its window). `mlperf_tf.flops.decoder_training_flops_per_sample` counts a decoder
        from its `DecoderShape`.
        """
        return None

    def timed_step_parts(self, model: Any) -> dict[str, Callable[[Any], tf.Tensor]]:
        """Parts of the training step that `mlperf-tf bench` times alone beside the whole step
        and reports as shares of it (e.g. an embedding lookup); {} (the default): none.

        Each value runs, in replica context on one replica's batch (what `compute_loss` gets),
        the part's forward and backward pass as the step runs them (collectives included) and
        returns a scalar that depends on both, so that nothing of it is pruned.
        """
        del model
        return {}

    def host_step_parts(self) -> dict[str, tuple[float | None, float]]:
        """Parts of the step that the training input pipeline does on the host, for `mlperf-tf
        bench` (e.g. a reinforcement-learning benchmark's rollouts, which the policy generates
        and environments answer): name -> (seconds, tokens) so far, cumulative counters that
        `bench` reads before and after each timed window. Seconds None: the compiled step's own
        work (timed as the window outside its input wait), with the tokens it trained. {} (the
        default): none."""
        return {}

    def simulator_shape(self) -> SimulatorShape:
        """What each kind of parallelism splits and sends, from the config, for `simulate`:
        the transformer blocks (`--model_parallel`, `--expert_parallel`), the convolutions by
        feature map and the batch norms (`--spatial_partition`). The default: none of them
        (the simulator models data parallelism only and refuses the other flags)."""
        return SimulatorShape()

    def eval_cadence(self) -> EvalCadence:
        """When `eval_schedule()` evaluates, as `simulate` reads it (no TensorFlow there): every
        `config.eval_every_samples` samples where the config has them, else every
        `eval_every_epochs` from `eval_offset_epochs`; the first `skipped_evals_rule` ones
        not run. Override where `eval_schedule()` does otherwise (a first evaluation after a
        rule's count of steps, an interval from a rule)."""
        every = getattr(self.config, "eval_every_samples", 0)
        skipped = tuple(float(x) for x in (self.skipped_evals_rule or (0.0, 0.0)))
        if every:
            return EvalCadence(every_samples=float(every), skipped=skipped)
        return EvalCadence(
            every_epochs=float(self.config.eval_every_epochs),
            offset_epochs=float(self.config.eval_offset_epochs),
        )

    def round_hparams(self) -> dict[str, Any]:
        """The round-level disclosure keys of this run (`rounds.ROUND_KEYS`: 6.1.0's numerical
        precision, parallelism, micro batch and config file), from the run's mesh, dtype policy
        and config. The runner logs them for every benchmark; `rounds.adapt_hparams` drops them
        for rounds that do not know them. Override to disclose more (e.g. fp8 matmuls).
        """
        import keras  # noqa: PLC0415 (the policy the runner set before building)

        precision = rounds_lib.precision_name(keras.mixed_precision.global_policy().compute_dtype)
        mesh = self.mesh
        return {
            **{key: precision for key in rounds_lib.PRECISION_KEYS},
            "tensor_parallelism": mesh.model,
            "pipeline_parallelism": mesh.pipeline,
            # Spatial partitioning splits each sample's activations over the group: the image
            # counterpart of splitting a sequence's context (a run has one or the other).
            "context_parallelism": mesh.context * mesh.spatial,
            "expert_parallelism": mesh.expert,
            "micro_batch_size": self.pipeline_micro_batch,
            "config_filename": self.config_class.__module__.replace(".", "/") + ".py",
        }

    def tokens_per_sample(self) -> int | None:
        """Tokens in one training sample of a language model (`mlperf-tf bench` then reports
        tokens/s); None for other models."""
        return None

    def scaled_settings(self) -> dict[str, str]:
        """MLPerf log keys whose value this config sets off what the closed rules fix, each
        with why (e.g. a `mini` preset's sequence length). The runner notes them in the log, and
        `mlperf-tf check --quality=skip` reports their failed CHECKs as one-line warnings."""
        return {}

    @property
    def quality_target(self) -> float:
        """The eval value at which the run stops with status success (at or above it, or at or
        below it where `higher_is_better` is False)."""
        return self.config.quality_target

    # ---- to implement --------------------------------------------------------------------------
    @abc.abstractmethod
    def build_model(self) -> Any:
        """Builds the Keras model (called under the strategy scope, with the dtype policy set)."""

    @abc.abstractmethod
    def build_optimizer(self, train_steps: int) -> Any:
        """Builds the optimizer and its schedule for a run of `train_steps` optimizer steps."""

    def train_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        """An endless dataset of per-replica training batches (static shapes) for one input pipeline.

        The default picks `synthetic_train_data` or `record_train_data` by `config.synthetic`, at
        the per-replica micro batch (`replica_batch_size(micro_batch_size, input_context)`).
        Override the two hooks, or this method for a pipeline of another shape.
        """
        batch_size = self.replica_batch_size(self.micro_batch_size, input_context)
        if self.config.synthetic:
            return self.synthetic_train_data(input_context, batch_size)
        return self.record_train_data(input_context, batch_size)

    def eval_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        """Per-replica eval batches (static shapes) of this pipeline's shard of the eval set.

        It must yield at least `eval_steps(num_replicas)` batches for each local replica; padding
        examples beyond the real eval set must be marked so `eval_step` ignores them (see
        `mlperf_tf.data.pipeline.pad_eval_dataset`). The default picks `synthetic_eval_data` or
        `record_eval_data` by `config.synthetic`, with the per-replica eval batch and the number of
        batches this pipeline must yield.
        """
        from mlperf_tf.data import pipeline  # noqa: PLC0415 (the data package imports TF I/O)

        batch_size = self.replica_batch_size(self.config.eval_batch_size, input_context)
        replicas = input_context.num_replicas_in_sync if input_context else self.num_replicas
        num_batches = pipeline.eval_batches_per_pipeline(self.eval_steps(replicas), input_context)
        if self.config.synthetic:
            return self.synthetic_eval_data(input_context, batch_size, num_batches)
        return self.record_eval_data(input_context, batch_size, num_batches)

    # The input hooks. Their defaults call the functions of `input_module`, a module (or object)
    # with the standard four (benchmarks/resnet50/input.py has them; BERT and Llama, whose
    # records parse to finished examples, get them from `mlperf_tf.data.parsed.ParsedInput`):
    #   synthetic_train_dataset(config, *, batch_size, seed)
    #   train_dataset(config, *, input_context, batch_size, seed, skip_bad_records)
    #   synthetic_eval_dataset(config, *, batch_size, num_batches, seed)
    #   eval_dataset(config, *, input_context, batch_size, num_batches, skip_bad_records)
    input_module: ClassVar[Any] = None

    def _input_function(self, name: str):
        if self.input_module is None:
            raise NotImplementedError(
                f"benchmark '{self.name}' sets no `input_module`: override the input hooks"
            )
        return getattr(self.input_module, name)

    def synthetic_train_data(self, input_context, batch_size: int) -> tf.data.Dataset:
        """Endless synthetic training batches of `batch_size` (no `data_dir`); each batch shard
        (data-parallel replica) gets its own (`synthetic.per_batch_shard`)."""
        from mlperf_tf.data import synthetic  # noqa: PLC0415

        make = self._input_function("synthetic_train_dataset")
        return synthetic.per_batch_shard(
            lambda seed: make(self.config, batch_size=batch_size, seed=seed),
            seed=self.seed,
            input_context=input_context,
        )

    def record_train_data(self, input_context, batch_size: int) -> tf.data.Dataset:
        """Endless training batches of `batch_size` from the records under `config.data_dir`."""
        return self._input_function("train_dataset")(
            self.config,
            input_context=input_context,
            batch_size=batch_size,
            seed=self.seed,
            skip_bad_records=self.skip_bad_records,
        )

    def synthetic_eval_data(self, input_context, batch_size: int, num_batches: int):
        """`num_batches` synthetic eval batches of `batch_size`, padding marked."""
        make = self._input_function("synthetic_eval_dataset")
        return make(self.config, batch_size=batch_size, num_batches=num_batches, seed=self.seed)

    def record_eval_data(self, input_context, batch_size: int, num_batches: int):
        """`num_batches` eval batches of `batch_size` from `config.data_dir`, padding marked."""
        return self._input_function("eval_dataset")(
            self.config,
            input_context=input_context,
            batch_size=batch_size,
            num_batches=num_batches,
            skip_bad_records=self.skip_bad_records,
        )

    @abc.abstractmethod
    def compute_loss(self, model: Any, batch: Any, training: bool = True) -> tf.Tensor:
        """This replica's batch shard's share of the global mean loss (replica context): its
        batch's loss sum divided by `micro_batch_size` (or its mean over `batch_shards`).

        Only the data axis is the benchmark's to count. The replicas of one model or spatial
        group share a batch and each returns the same share; the runner accounts for those axes
        (`mlperf_tf.runner.trainer.group_loss_scale`): a spatial group's gradients are summed
        over its members, a model group's replicated gradients are not.
        """

    def compute_loss_and_metrics(
        self, model: Any, batch: Any, training: bool = True
    ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
        """`compute_loss` and the step's training metrics (replica context).

        Override it (and `train_metric_shapes`) to report more than the loss: e.g. the
        auxiliary losses and expert load of mixture-of-experts layers. The runner averages each
        metric over replicas and over the steps of a host loop, prints the scalar ones in the
        progress line and writes all of them to TensorBoard. The default: no metrics.
        """
        return self.compute_loss(model, batch, training), {}

    def train_metric_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of each metric `compute_loss_and_metrics` returns (float32); the
        compiled loop needs them before its first step."""
        return {}

    def update_metrics(self) -> tuple[str, ...]:
        """The training metrics `after_update` reads; () (the default): it is not called."""
        return ()

    def after_update(self, model: Any, metrics: dict[str, tf.Tensor]) -> None:
        """Changes `model` after each optimizer step, outside the gradient, inside the compiled
        step (cross-replica context): e.g. DeepSeek-V3's selection-bias update, which must see
        every optimizer step's expert load, not a host loop's. `metrics`: each of
        `update_metrics` summed over the step's micro-batches and over every replica (each
        replica's value counted once: replicas of one model or pipeline group count theirs
        once each). The default: nothing."""

    @abc.abstractmethod
    def eval_step(self, model: Any, batch: Any) -> dict[str, tf.Tensor]:
        """Per-replica eval outputs (replica context).

        Returns a dict of tensors, each scalar or with a leading batch dimension. The runner gathers
        every value across replicas (concatenating along axis 0; scalars become vectors) and hands
        the host-side numpy arrays to `eval_reduce`.
        """

    def eval_begin(self) -> Any:
        """Host-side state for one evaluation; the default is a dict of running sums."""
        return {}

    def eval_reduce(self, state: Any, outputs: dict[str, np.ndarray]) -> Any:
        """Folds one gathered eval batch into `state` (host side). The default sums every value."""
        for key, value in outputs.items():
            state[key] = state.get(key, 0.0) + np.sum(value, dtype=np.float64)
        return state

    @abc.abstractmethod
    def eval_result(self, state: Any) -> float:
        """The quality value (MLPerf's `eval_accuracy`) from the reduced eval state (host side)."""

    @abc.abstractmethod
    def mlperf_hparams(self) -> dict[str, Any]:
        """MLPerf log keys (from `mlperf_logging.mllog.constants`) and values that the rules require.

        Keys whose value needs metadata (e.g. `max_sequence_length` with `method`) map to a
        `(value, metadata_dict)` tuple. `global_batch_size`, `train_samples`, `eval_samples`,
        `gradient_accumulation_steps` and the submission keys are logged by the runner.
        """

    def logged_hparams(self) -> dict[str, Any]:
        """Every hyperparameter the runner logs for this run, before `rounds.adapt_hparams`
        fits them to the round: the batch keys, `mlperf_hparams`, the sample counts and the
        round-level disclosure keys (`round_hparams`), the benchmark's own values first."""
        hparams = {
            C.GLOBAL_BATCH_SIZE: self.config.global_batch_size,
            C.GRADIENT_ACCUMULATION_STEPS: self.config.gradient_accumulation_steps,
        }
        hparams.update(self.mlperf_hparams())
        hparams.setdefault(C.TRAIN_SAMPLES, self.train_samples())
        hparams.setdefault(C.EVAL_SAMPLES, self.eval_samples())
        # The round-level disclosure keys, for every benchmark (dropped for rounds before them).
        for key, value in self.round_hparams().items():
            hparams.setdefault(key, value)
        return hparams

    def eval_schedule(self) -> list[EvalPoint]:
        """The MLPerf evaluation points. Default: `epoch_eval_schedule` of the config's
        `eval_every_epochs` and `eval_offset_epochs`.

        Override for sample-based schedules (BERT). The runner trains to the next point,
        evaluates, and stops at the quality target or after the last point.
        """
        return epoch_eval_schedule(
            steps_per_epoch=self.steps_per_epoch,
            max_epochs=self.config.max_epochs,
            every_epochs=self.config.eval_every_epochs,
            offset_epochs=self.config.eval_offset_epochs,
        )

    def gradient_clip_norm(self) -> float | None:
        """Global-norm clip of the full-batch gradient (`config.gradient_clip_norm`); None: none.

        The runner clips the gradient summed over replicas, not each replica's part.
        """
        return float(self.config.gradient_clip_norm) or None

    def train_samples(self) -> int:
        """MLPerf's `train_samples`: examples in one training epoch."""
        return self.config.train_examples

    def eval_samples(self) -> int:
        """MLPerf's `eval_samples`: examples in the whole eval set."""
        return self.config.eval_examples

    def run_actions(self) -> list[Any]:
        """Side work of this benchmark's runs: `mlperf_tf.runner.actions.Action`s the runner
        calls after its built-in ones (e.g. a grid of generated images at the end of a run).
        The default: none."""
        return []

    def bind_model(self, model: Any) -> None:
        """Tells the benchmark the model its input pipelines may read, before the runner makes
        them (and before `evaluate_only` evaluates): a pipeline whose examples the model itself
        generates (reinforcement learning's rollouts) needs it. The default: nothing."""

    def release_input(self) -> None:
        """Called when the runner (or `bench`) is done with the training pipeline, before it
        releases the pipeline's iterator, also when the run ends by an error: a pipeline that
        waits on training (GRPO's rollouts held to a trajectory age until the next update,
        `mlperf_tf.rl.age.AgeGate`) stops waiting, since releasing an iterator waits for its
        pipeline's threads. The default: nothing."""

    def prepare_initial_weights(self) -> None:
        """Makes the starting checkpoint `restore_initial_weights` will load when it is missing
        (e.g. a `mini` preset's base, trained untimed before `run_start` on the first run).

        Called once per run before the model is built, outside the strategy's scope and before
        the run is seeded: a base trains there as `mlperf-tf prepare` trains it (the default
        strategy; a Keras optimizer's update inside another strategy's scope has no replica
        context). The default: nothing.
        """

    def restore_initial_weights(self, model: Any) -> None:
        """Loads a starting checkpoint (e.g. BERT's TF1 checkpoint) before training, if any.

        Called once, under the strategy scope, after `build_model` and before `init_stop`; not
        called when the run resumes from its own checkpoint.
        """

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the offline `mini` dataset into `data_dir` (deterministic; no download).

        The runner calls it when the `mini` preset's data_dir does not exist yet. The default
        calls `prepare_mini(data_dir)` of the `prepare` module beside the benchmark's (every
        benchmark package has one; imported only here, so that its dependencies load only
        when needed) and logs the summary it returns.

        Raises:
          NotImplementedError: the benchmark's package has no `prepare.prepare_mini`.
        """
        package = cls.__module__.rpartition(".")[0]
        prepare = None
        if package:
            try:
                prepare = importlib.import_module(f"{package}.prepare")
            except ModuleNotFoundError as e:
                # No prepare module is no mini dataset; a module it imports missing is a fault.
                if e.name != f"{package}.prepare":
                    raise
        if not hasattr(prepare, "prepare_mini"):
            raise NotImplementedError(f"benchmark '{cls.name}' has no mini dataset")
        summary = prepare.prepare_mini(data_dir)
        logging.info("%s: mini dataset in %s: %s", cls.name, data_dir, summary)


class RcpLearningRate:
    """Mixin of a `Benchmark` whose base learning rate and warm-up default to its reference
    convergence point's (RCP) for the global batch size, as MLPerf's closed rules for the
    AdamW benchmarks allow (C4 pretraining, FLUX.1).

    The config has `global_batch_size` and an `optimizer` with `opt_base_learning_rate` (0:
    the RCP's) and `opt_learning_rate_warmup_steps` (-1: the RCP's). Set `reference_hparams`
    (e.g. `staticmethod(config.rcp_hparams)`).
    """

    def reference_hparams(self, global_batch_size: int) -> tuple[float, int]:
        """(base LR, warm-up steps) of the benchmark's reference convergence point for the batch.

        Raises:
          ConfigError: no RCP has this batch size.
        """
        raise NotImplementedError

    def learning_rate_and_warmup(self) -> tuple[float, int]:
        """(base LR, warm-up steps): the config's, or the RCP's for the global batch size.

        Raises:
          ConfigError: taken from the RCPs, and the batch size has none.
        """
        batch = self.config.global_batch_size
        return rcps.lr_and_warmup(self.config.optimizer, lambda: self.reference_hparams(batch))


def epoch_eval_schedule(
    *, steps_per_epoch: int, max_epochs: float, every_epochs: float, offset_epochs: float = 0.0
) -> list[EvalPoint]:
    """Evaluations at epochs `first, first + every, ...` and at `max_epochs`, where `first` is
    `offset_epochs`, or `every_epochs` when the offset is 0 (the MLPerf TF2 ResNet reference's
    `--eval_offset_epochs`).

    MLPerf counts epochs from 1: the eval after the k-th epoch logs `epoch_num=k`, and the block
    before it starts at `first_epoch_num` = the previous eval's epoch + 1 (1 for the first block)
    and spans `epoch_count` epochs. The last evaluation is at `max_epochs` (the budget), wherever
    it falls.

    Raises:
      ValueError: `every_epochs` is not positive or the offset is outside [0, every_epochs).
    """
    if every_epochs <= 0:
        raise ValueError(f"`every_epochs` ({every_epochs}) must be positive.")
    if not 0 <= offset_epochs < every_epochs:
        raise ValueError(f"`offset_epochs` ({offset_epochs}) must be in [0, {every_epochs}).")
    points = []
    previous = 0.0
    epoch = float(offset_epochs or every_epochs)
    while True:
        epoch = min(epoch, float(max_epochs))
        points.append(
            EvalPoint(
                step=max(1, int(round(epoch * steps_per_epoch))),
                epoch_num=_clean_number(epoch),
                first_epoch_num=_clean_number(previous + 1),
                epoch_count=_clean_number(epoch - previous),
            )
        )
        if epoch >= max_epochs:
            return points
        previous = epoch
        epoch += every_epochs


def sample_eval_schedule(
    *,
    global_batch_size: int,
    train_steps: int,
    every_samples: int,
    log_samples_count: bool = False,
) -> list[EvalPoint]:
    """Evaluations every `ceil(every_samples / global_batch_size)` steps and at the last step.

    For rules that count samples, not epochs (BERT: every 500,000 samples from v1.0; Llama 3.1:
    every 12,288 sequences, the reference's `eval_every_n_batches = ceil(eval_every / gbs)`).
    `epoch_num` is the samples trained when the eval runs, as their logs have it; a block spans
    the samples since the previous eval (`first_epoch_num` = samples before it, 0 for the first;
    `epoch_count` = samples in it). Rounding the interval up to whole steps is what Google's v1.0
    BERT submission did (33 steps x 6912 for 225,000 samples). `log_samples_count`: the points
    also carry `samples_count` (llama31_8b's rules log it).

    Raises:
      ValueError: an argument is not positive.
    """
    for name, value in (
        ("global_batch_size", global_batch_size),
        ("train_steps", train_steps),
        ("every_samples", every_samples),
    ):
        if value <= 0:
            raise ValueError(f"`{name}` ({value}) must be positive.")
    every_steps = max(1, math.ceil(every_samples / global_batch_size))
    steps = list(range(every_steps, train_steps, every_steps)) + [train_steps]
    points = []
    previous = 0
    for step in steps:
        points.append(
            EvalPoint(
                step=step,
                epoch_num=step * global_batch_size,
                first_epoch_num=previous * global_batch_size,
                epoch_count=(step - previous) * global_batch_size,
                samples_count=step * global_batch_size if log_samples_count else None,
            )
        )
        previous = step
    return points


def _clean_number(x: float) -> float | int:
    return int(x) if float(x).is_integer() else float(x)


def eval_ratio(state: dict[str, float], numerator: str, denominator: str, *, what: str) -> float:
    """`state[numerator] / state[denominator]` of a reduced eval (e.g. correct over real examples).

    Raises:
      ValueError: the denominator is 0: the eval saw no `what` (the eval set is empty).
    """
    total = float(state.get(denominator, 0.0))
    if total <= 0:
        raise ValueError(f"eval saw no {what}: the eval set is empty")
    return float(state[numerator]) / total
