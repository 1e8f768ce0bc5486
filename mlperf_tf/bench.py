"""Provides `mlperf-tf bench`: steady-state training throughput of a benchmark, for hardware teams.

What tf_cnn_benchmarks gave hardware teams, for every registered benchmark through the `Benchmark`
interface: the benchmark's own model, loss and optimizer are trained by the runner's `Trainer` (the
compiled host loop of `mlperf-tf run`, not a second training loop) on synthetic data of the real
shapes. The first `--warmup_steps` (tracing, graph optimization, allocator growth) are excluded;
then `--windows` timed windows of `--steps_per_window` steps each give samples/s per window, and
the summary is their median with the spread (min, max).

MFU (model FLOPs utilization) is reported where the FLOPs of the model are known
(`mlperf_tf.flops`): training FLOPs per sample x the median samples/s, over the best matmul peak
of the same device in the same dtype, measured by this command after each window (on a loaded
machine the best of several peaks is the closest to the machine's real one). The FLOPs are
those of every slot of the batch, padding included (`mlperf_tf.flops` traces with static
shapes): for a step that skips its padding (the Transformer and BERT without `--xla`) MFU
counts the padded slots as done work and so reads high by the padding share of the synthetic
batch. With `--config.data_dir=DIR`, the benchmark's real input pipeline is also timed alone
(one host pipeline, no training) to show whether input can keep up.

Rates count the benchmark's own unit (`Benchmark.sample_unit`: images/s for ResNet-50, SSD and
FLUX.1, sequences/s and tokens/s for the language models); the FLOPs are the benchmark's
declared `training_flops_per_sample()` where it declares them, so a mixture of experts' MFU
counts the experts a token is routed to (its active parameters) and attention with each
sliding-window layer at its window (`mlperf_tf.flops.decoder_training_flops_per_sample`).

A benchmark may declare parts of its step to time (`Benchmark.timed_step_parts`, e.g. a
recommender's embedding lookup): each runs alone, forward and backward, for as many steps right
after each timed window, and the report gives its ms a step and its share of the step
(`_part_loops` says why alone). `--expert_parallel=E` splits the replicas' expert axis as
`mlperf-tf run` does.

    mlperf-tf bench --benchmark=resnet50 [--preset=mlperf] [--distribution=auto] [--dtype=fp32]
        [--xla] [--json] [--windows=5] [--steps_per_window=10] [--config.KEY=VALUE ...]
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import sys
import time
from typing import Any

from absl import flags

from mlperf_tf import splits
from mlperf_tf.errors import DataError, UserError
from mlperf_tf.runner.config import RunConfig, setting

# The run settings `bench` shares with `mlperf-tf run`: declared once, in `RunConfig`.
SHARED_RUN_SETTINGS = (
    "distribution",
    "tpu",
    "num_cpu_devices",
    "dtype",
    "xla",
    "seed",
    "startup_timeout_s",
    "pipeline_parallel",
    "expert_parallel",
    "micro_batch_size",
    "pipeline_schedule",
)
MATMUL_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# Upper bounds of the counts: beyond them a measurement would run for days.
_MOST = {"warmup_steps": 100_000, "windows": 10_000, "steps_per_window": 1_000_000,
         "input_batches": 1_000_000}  # fmt: skip
_MOST_PEAK_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What `mlperf-tf bench` measures and how long (each field is a flag of the same name)."""

    benchmark: str = setting("", help="Registered benchmark name (see `mlperf-tf list`).")
    preset: str = setting("mlperf", help="Config preset whose model and batch are measured.")
    warmup_steps: int = setting(3, help="Untimed steps first (tracing, graph optimization).")
    windows: int = setting(5, help="Timed windows; the summary is their median and spread.")
    steps_per_window: int = setting(10, help="Optimizer steps per timed window.")
    input_batches: int = setting(
        50, help="Batches of the real input pipeline to time (with --config.data_dir)."
    )
    peak_seconds: float = setting(
        1.0, help="Seconds of matmul-peak measurement after each window (0: no MFU)."
    )
    json: bool = setting(False, help="Print the result as one JSON object on stdout.")

    def __post_init__(self):
        if not self.benchmark:
            raise UserError("--benchmark is required (see `mlperf-tf list`)")
        for name, most in _MOST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise UserError(f"--{name} ({value!r}) must be a positive integer.")
            if value > most:
                raise UserError(f"--{name} ({value}) is too large (at most {most:,})")
        if not 0 <= self.peak_seconds <= _MOST_PEAK_SECONDS:
            raise UserError(
                f"--peak_seconds ({self.peak_seconds!r}) must be in [0, {_MOST_PEAK_SECONDS:g}]"
            )


@dataclasses.dataclass
class BenchResult:
    """One `bench` measurement. Rates are of the whole sync group (all replicas) unless named."""

    benchmark: str
    preset: str
    dtype: str
    xla: bool
    strategy: str
    replicas: int
    expert_parallel: int  # replicas of the mesh's `expert` axis (`--expert_parallel`)
    global_batch_size: int
    steps_per_window: int
    sample_unit: str  # what one sample is (`Benchmark.sample_unit`): "image", "sequence", ...
    window_samples_per_s: list[float]
    samples_per_s: float  # median over the windows
    samples_per_s_min: float
    samples_per_s_max: float
    samples_per_s_per_replica: float
    step_time_ms: float  # at the median rate
    warmup_s: float
    flops_per_sample: float | None = None  # training FLOPs (a multiply-add is 2)
    peak_flops_per_s: float | None = None  # the best matmul rate measured
    mfu: float | None = None  # model FLOP/s at the median rate / (best matmul peak x devices)
    input_samples_per_s: float | None = None
    tokens_per_sample: int | None = None  # a language model's tokens per sequence
    tokens_per_s: float | None = None  # the median rate in tokens (a language model)
    load_average: tuple[float, float] = (0.0, 0.0)  # 1-min load before and after
    # With --pipeline_parallel: the schedule's (P - 1) / (M + P - 1) and the bubble the stages
    # measured (1 - seconds computing / seconds from their first action to their last exchange,
    # over every replica and timed step).
    pipeline_bubble_predicted: float | None = None
    pipeline_bubble_measured: float | None = None
    # The benchmark's declared step parts (`Benchmark.timed_step_parts`, e.g. a recommender's
    # embedding lookup): each part's ms a step, run alone right after each window on the same
    # iterator, and its share of the step (the median over windows of part ms / that window's
    # step ms).
    part_ms: dict[str, float] = dataclasses.field(default_factory=dict)
    part_shares: dict[str, float] = dataclasses.field(default_factory=dict)
    device: str = ""
    tensorflow: str = ""

    def summary(self) -> str:
        """One line for people."""
        spread = f"min {self.samples_per_s_min:.4g}, max {self.samples_per_s_max:.4g}"
        unit = _plural(self.sample_unit)
        line = (
            f"bench {self.benchmark} ({self.preset}, {self.dtype}, {'XLA' if self.xla else 'no XLA'}"
            f", {self.strategy} x{self.replicas}"
            f"{f' (expert {self.expert_parallel})' if self.expert_parallel > 1 else ''}"
            f", batch {self.global_batch_size}): "
            f"{self.samples_per_s:.4g} {unit}/s median ({spread}; {len(self.window_samples_per_s)}"
            f" windows of {self.steps_per_window} steps), "
            f"{self.samples_per_s_per_replica:.4g} {unit}/s/replica, step {self.step_time_ms:.1f} ms"
        )
        if self.tokens_per_s:
            line += f", {self.tokens_per_s:.4g} tokens/s"
        if self.mfu is not None:
            line += (
                f", MFU {100 * self.mfu:.1f}% ({self.flops_per_sample / 1e9:.3g} GFLOP/"
                f"{self.sample_unit}, "
                f"matmul peak {self.peak_flops_per_s / 1e9:.4g} GFLOP/s)"
            )
        if self.input_samples_per_s is not None:
            line += f", input pipeline {self.input_samples_per_s:.4g} {unit}/s"
        if self.pipeline_bubble_predicted is not None:
            line += (
                f", pipeline bubble {100 * self.pipeline_bubble_measured:.1f}% measured "
                f"({100 * self.pipeline_bubble_predicted:.1f}% predicted)"
            )
        for name, share in self.part_shares.items():
            line += f", {name} {self.part_ms[name]:.1f} ms ({100 * share:.1f}% of the step)"
        load = self.load_average
        return line + f"; load average {load[0]:.1f} -> {load[1]:.1f}"


class MatmulPeak:
    """The FLOP/s of a chain of square matmuls on one device in one dtype (a multiply-add is 2).

    The chain is traced once per instance; `measure` can be called between other work.

    Args:
      device: a TF device name, e.g. "/cpu:0" or "/GPU:0".
      dtype: fp32, bf16 or fp16.
      size: the matrix side (0: 1024 on CPUs, 8192 on accelerators).

    Raises:
      UserError: `dtype` is not one of fp32, bf16, fp16.
    """

    def __init__(self, *, device: str, dtype: str = "fp32", size: int = 0):
        import tensorflow as tf

        if dtype not in MATMUL_DTYPES:
            raise UserError(f"--dtype={dtype!r} is not one of {', '.join(MATMUL_DTYPES)}")
        self.size = size or (1024 if "CPU" in device.upper() else 8192)
        self.device = device
        tf_dtype = tf.as_dtype(MATMUL_DTYPES[dtype])
        with tf.device(device):
            # An orthogonal factor keeps the chain's values bounded in any dtype.
            shape = [self.size, self.size]
            q, _ = tf.linalg.qr(tf.random.stateless_normal(shape, seed=[1, 2]))
            a = tf.cast(tf.random.stateless_normal(shape, seed=[3, 4]), tf_dtype)
            b = tf.cast(q, tf_dtype)

        @tf.function
        def chain(n):
            x = a
            for _ in tf.range(n):
                x = tf.matmul(x, b)
            return tf.reduce_sum(tf.cast(x[:1, :1], tf.float32))

        self._chain = chain

    def measure(self, seconds: float = 1.0, *, cpu_time: bool = False) -> float:
        """FLOP/s of one timed chain of about `seconds` (after a short calibration call).

        Args:
          seconds: roughly how long the timed chain runs.
          cpu_time: divide by this process's CPU seconds instead of wall seconds (FLOPs per
            CPU-second: on a shared host, other jobs' load distorts it far less).
        """
        import tensorflow as tf

        with tf.device(self.device):
            begin = time.perf_counter()
            self._chain(tf.constant(2)).numpy()  # the first call also traces
            per_matmul = max((time.perf_counter() - begin) / 2, 1e-6)
            n = max(2, int(seconds / per_matmul))
            clock = time.process_time if cpu_time else time.perf_counter
            begin = clock()
            self._chain(tf.constant(n)).numpy()
            elapsed = clock() - begin
        return 2.0 * self.size**3 * n / max(elapsed, 1e-9)


def matmul_peak(
    *, device: str, dtype: str = "fp32", seconds: float = 1.0, size: int = 0, cpu_time: bool = False
) -> float:
    """`MatmulPeak(device=..., dtype=..., size=...).measure(seconds, cpu_time=...)`, once."""
    return MatmulPeak(device=device, dtype=dtype, size=size).measure(seconds, cpu_time=cpu_time)


def model_flops_per_sample(benchmark) -> float | None:
    """Training FLOPs per sample from `mlperf_tf.flops`, or None where they are not known."""
    try:
        from mlperf_tf import flops
    except ImportError:
        return None
    try:
        return float(flops.training_flops_per_sample(benchmark))
    except (NotImplementedError, ValueError, TypeError) as e:
        print(f"bench: no FLOP count for {benchmark.name}: {e}", file=sys.stderr)
        return None


def _real_dataset(benchmark_class, real_config, setup: _Setup):
    """One host's real training input pipeline (`--config.data_dir`), not yet read.

    Raises:
      DataError: the data is missing or unreadable, named with how to bench without it.
    """
    import tensorflow as tf

    real = benchmark_class(real_config).with_context(setup.benchmark.context)
    context = tf.distribute.InputContext(
        num_input_pipelines=1,
        input_pipeline_id=0,
        num_replicas_in_sync=setup.strategy.num_replicas_in_sync,
    )
    try:
        return real.train_dataset(context)
    except DataError as e:
        raise DataError(
            f"{e} (bench times the input pipeline of the preset's data_dir: prepare the data, or "
            "pass --config.data_dir= to time the model on synthetic data only)"
        ) from None


def input_rate(dataset, *, batches: int) -> float:
    """Samples/s of one host's real training input pipeline, alone (after 3 untimed batches)."""
    import tensorflow as tf

    iterator = iter(dataset)
    for _ in range(3):
        next(iterator)
    samples = 0
    begin = time.perf_counter()
    for _ in range(batches):
        batch = next(iterator)
        samples += int(tf.nest.flatten(batch)[0].shape[0])
    return samples / (time.perf_counter() - begin)


def benchmark_config(config: BenchConfig, overrides: dict[str, str]):
    """(benchmark class, its preset's config with `overrides`) of a bench, TF not needed.

    Raises:
      UserError: an unknown benchmark, preset or config key, or a bad config value.
    """
    from mlperf_tf import config as config_lib
    from mlperf_tf import registry

    benchmark_class = registry.get(config.benchmark)
    try:
        preset = benchmark_class.preset(config.preset)
    except KeyError as e:
        raise UserError(e.args[0]) from None
    return benchmark_class, config_lib.override(preset, overrides)


@dataclasses.dataclass
class _Setup:
    """What `run` measures: the strategy, the benchmark on synthetic data and its `Trainer`."""

    strategy: Any
    benchmark: Any
    trainer: Any
    iterator: Any
    device: str
    global_batch: int
    # (seconds the stages computed, seconds of their schedules) per timed window, averaged
    # over replicas and steps: with --pipeline_parallel only.
    pipeline_times: list = dataclasses.field(default_factory=list)
    # name -> compiled loop of the benchmark's declared step part (`_part_loops`).
    part_loops: dict = dataclasses.field(default_factory=dict)
    # name -> [(part seconds a step, step seconds a step)] per timed window.
    part_times: dict = dataclasses.field(default_factory=dict)


def run(config: BenchConfig, run_settings: dict[str, Any], overrides: dict[str, str]):
    """Measures `config.benchmark`; prints a progress line per window; returns a `BenchResult`.

    Args:
      config: what to measure and for how long.
      run_settings: the `RunConfig` fields named in `SHARED_RUN_SETTINGS` (strategy, dtype, ...).
      overrides: `--config.KEY=VALUE` overrides of the benchmark config (`data_dir` selects the
        input-pipeline measurement; training always runs on synthetic data).

    Raises:
      UserError: an unknown benchmark, preset or config key, or a bad setting.
    """
    import tensorflow as tf

    progress = sys.stderr if config.json else sys.stdout
    load_before = os.getloadavg()[0]
    benchmark_class, real_config = benchmark_config(config, overrides)
    setup = _set_up(benchmark_class, real_config, run_settings)
    # Built before the timed windows, so that missing or unreadable data fails in seconds.
    real_dataset = (
        _real_dataset(benchmark_class, real_config, setup) if real_config.data_dir else None
    )
    flops_per_sample = model_flops_per_sample(setup.benchmark) if config.peak_seconds else None
    peak = (
        MatmulPeak(device=setup.device, dtype=run_settings["dtype"]) if flops_per_sample else None
    )

    begin = time.perf_counter()
    setup.trainer.loop(setup.iterator, tf.constant(config.warmup_steps, tf.int32))[0].numpy()
    warmup_s = time.perf_counter() - begin
    print(f"warm-up: {config.warmup_steps} steps in {warmup_s:.1f} s", file=progress, flush=True)
    # CPU replicas share the host's cores: one peak; accelerators each have theirs.
    workers = setup.strategy.extended.worker_devices
    devices = 1 if "CPU" in setup.device.upper() else len(workers)
    rates, peaks = _timed_windows(config, setup, flops_per_sample, peak, devices, progress)

    input_samples_per_s = None
    if real_dataset is not None:
        input_samples_per_s = input_rate(real_dataset, batches=config.input_batches)
    return _result(
        config, run_settings, setup, rates=rates, peaks=peaks, devices=devices,
        warmup_s=warmup_s, flops_per_sample=flops_per_sample,
        input_samples_per_s=input_samples_per_s, load_before=load_before,
    )  # fmt: skip


def _set_up(benchmark_class, real_config, run_settings: dict[str, Any]) -> _Setup:
    """The strategy, the benchmark on synthetic data of `real_config`'s shapes, its model and
    optimizer built in the strategy's scope, and the runner's `Trainer` over its dataset."""
    import keras

    from mlperf_tf import collectives, distribute, precision
    from mlperf_tf.benchmark import RunContext
    from mlperf_tf.parallel import layout
    from mlperf_tf.parallel.context import use_mesh
    from mlperf_tf.parallel.input import for_mesh
    from mlperf_tf.parallel.mesh import build_mesh, check_supported
    from mlperf_tf.runner import Trainer

    synthetic_config = dataclasses.replace(real_config, data_dir="")
    strategy = distribute.resolve_strategy(
        run_settings["distribution"],
        tpu=run_settings["tpu"],
        num_cpu_devices=run_settings["num_cpu_devices"],
        timeout_s=run_settings["startup_timeout_s"],
    )
    keras.utils.set_random_seed(run_settings["seed"])
    precision.set_policy(run_settings["dtype"])
    replicas = strategy.num_replicas_in_sync
    mesh = build_mesh(
        replicas, pipeline_parallel=run_settings["pipeline_parallel"],
        expert_parallel=run_settings["expert_parallel"],
    )  # fmt: skip
    context = RunContext(
        num_replicas=replicas,
        seed=run_settings["seed"],
        static_shapes=distribute.needs_static_shapes(strategy, xla=run_settings["xla"]),
        mesh=mesh,
        micro_batch_size=run_settings["micro_batch_size"],
    )
    splits.check_batch_split(
        synthetic_config, data_groups=mesh.batch_shards, replicas=replicas,
        groups_from=f"--distribution={run_settings['distribution']}",
    )  # fmt: skip
    benchmark = benchmark_class(synthetic_config).with_context(context)
    check_supported(mesh, benchmark.name, benchmark.parallel_axes)
    # The mesh ambient while the model is built (its layers find their groups); a split
    # variable's gradient summed over its layout's axes only, as `mlperf-tf run` does.
    summer = None
    if mesh.axes_used():
        summer = collectives.GradientSummer(strategy, collectives.Settings(), mesh)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        optimizer = precision.wrap_optimizer(
            benchmark.build_optimizer(benchmark.train_steps), run_settings["dtype"]
        )
        optimizer.build(model.trainable_variables)
        if summer is not None:
            summer.build(optimizer, model.trainable_variables)
        layout.split_slots(optimizer, mesh)
    trainer = Trainer(
        strategy=strategy, benchmark=benchmark, model=model, optimizer=optimizer,
        xla=run_settings["xla"], pipeline_schedule=run_settings["pipeline_schedule"],
    )  # fmt: skip
    trainer.summer = summer
    if trainer.pipeline is not None:  # the stages time their work (not under XLA)
        trainer.pipeline.timed = not run_settings["xla"]
    benchmark.bind_model(model)  # before its pipelines are made (rollouts read it), as `run`
    dataset = for_mesh(benchmark.train_dataset, mesh)
    iterator = iter(strategy.distribute_datasets_from_function(dataset))
    return _Setup(
        strategy=strategy, benchmark=benchmark, trainer=trainer, iterator=iterator,
        device=strategy.extended.worker_devices[0],
        global_batch=synthetic_config.global_batch_size,
        part_loops=_part_loops(strategy, benchmark.timed_step_parts(model)),
    )  # fmt: skip


def _part_loops(strategy, parts: dict) -> dict:
    """A compiled loop per declared step part: `steps` times, the next distributed batch
    through the part on every replica (as `Trainer.loop` runs the step), a scalar back.

    Why alone and not the step with and without the part: a step without it is not the same
    step minus the part (an embedding lookup replaced by constants leaves its tables without a
    gradient, so their optimizer update and gradient exchange vanish too), and a profile's
    per-op times on a shared CPU host need op-to-part attribution the graph does not keep. The
    part alone runs exactly its own ops, collectives included; what it cannot show is how much
    of it the step overlaps with other work, so its share is an upper bound of what removing
    the part would save.
    """
    import tensorflow as tf

    def loop(part):
        @tf.function
        def run_part(iterator, steps):
            total = tf.constant(0.0, tf.float32)
            for _ in tf.range(steps):
                out = strategy.run(part, args=(next(iterator),))
                total += tf.cast(strategy.reduce("SUM", out, axis=None), tf.float32)
            return total

        return run_part

    return {name: loop(part) for name, part in parts.items()}


def _timed_windows(config: BenchConfig, setup: _Setup, flops_per_sample, peak, devices, progress):
    """(samples/s of each window, the matmul peak measured after each window or [])."""
    import tensorflow as tf

    unit = _plural(setup.benchmark.sample_unit)
    rates, peaks = [], []
    steps = tf.constant(config.steps_per_window, tf.int32)
    for window in range(config.windows):
        begin = time.perf_counter()
        loss, _, _, metrics = setup.trainer.loop(setup.iterator, steps)
        loss = float(loss.numpy())
        if "pipeline/busy_s" in metrics:
            setup.pipeline_times.append(
                (float(metrics["pipeline/busy_s"]), float(metrics["pipeline/span_s"]))
            )
        elapsed = time.perf_counter() - begin
        rates.append(config.steps_per_window * setup.global_batch / elapsed)
        line = (
            f"window {window + 1}/{config.windows}: {rates[-1]:.4g} {unit}/s, "
            f"step {1e3 * elapsed / config.steps_per_window:.1f} ms, loss {loss:.4g}"
        )
        for name, part in setup.part_loops.items():
            if window == 0:  # traced outside the timing
                part(setup.iterator, tf.constant(1, tf.int32)).numpy()
            begin = time.perf_counter()
            part(setup.iterator, steps).numpy()
            seconds = (time.perf_counter() - begin) / config.steps_per_window
            step_s = elapsed / config.steps_per_window
            setup.part_times.setdefault(name, []).append((seconds, step_s))
            line += f", {name} {1e3 * seconds:.1f} ms ({100 * seconds / step_s:.0f}%)"
        if flops_per_sample:
            peaks.append(peak.measure(config.peak_seconds))
            line += f", MFU {100 * flops_per_sample * rates[-1] / (max(peaks) * devices):.1f}%"
        print(line, file=progress, flush=True)
    return rates, peaks


def _result(config, run_settings, setup: _Setup, *, rates, peaks, devices, warmup_s,
            flops_per_sample, input_samples_per_s, load_before) -> BenchResult:  # fmt: skip
    """The `BenchResult` of the windows' rates (median and spread) and the peaks measured."""
    import tensorflow as tf

    median = statistics.median(rates)
    replicas = setup.strategy.num_replicas_in_sync
    predicted = measured = None
    if setup.trainer.pipeline is not None:
        predicted = setup.trainer.pipeline.schedule.predicted_bubble
        if setup.pipeline_times:
            busy, span = (sum(t) for t in zip(*setup.pipeline_times, strict=True))
            measured = 1.0 - busy / span
    tokens = setup.benchmark.tokens_per_sample()
    return BenchResult(
        benchmark=config.benchmark,
        preset=config.preset,
        dtype=run_settings["dtype"],
        xla=run_settings["xla"],
        strategy=type(setup.strategy).__name__,
        replicas=replicas,
        expert_parallel=run_settings["expert_parallel"],
        global_batch_size=setup.global_batch,
        steps_per_window=config.steps_per_window,
        sample_unit=setup.benchmark.sample_unit,
        window_samples_per_s=rates,
        samples_per_s=median,
        samples_per_s_min=min(rates),
        samples_per_s_max=max(rates),
        samples_per_s_per_replica=median / replicas,
        step_time_ms=1e3 * setup.global_batch / median,
        warmup_s=warmup_s,
        flops_per_sample=flops_per_sample,
        peak_flops_per_s=max(peaks) if peaks else None,
        mfu=flops_per_sample * median / (max(peaks) * devices) if peaks else None,
        input_samples_per_s=input_samples_per_s,
        tokens_per_sample=tokens,
        tokens_per_s=median * tokens if tokens else None,
        load_average=(load_before, os.getloadavg()[0]),
        pipeline_bubble_predicted=predicted,
        pipeline_bubble_measured=measured,
        part_ms={
            name: 1e3 * statistics.median(s for s, _ in times)
            for name, times in setup.part_times.items()
        },
        part_shares={
            name: statistics.median(s / step for s, step in times)
            for name, times in setup.part_times.items()
        },
        device=setup.device,
        tensorflow=tf.__version__,
    )


def _plural(unit: str) -> str:
    """ "image" -> "images": the rate's unit in the progress and summary lines."""
    return unit if unit.endswith("s") else unit + "s"


def _define_flags(flag_values: flags.FlagValues) -> None:
    """The bench flags: `BenchConfig`'s fields and the shared `RunConfig` fields."""
    run_fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    fields = list(dataclasses.fields(BenchConfig)) + [run_fields[n] for n in SHARED_RUN_SETTINGS]
    definers = {
        str: flags.DEFINE_string,
        bool: flags.DEFINE_bool,
        int: flags.DEFINE_integer,
        float: flags.DEFINE_float,
    }
    for field in fields:
        help_text, choices = field.metadata["help"], field.metadata.get("choices")
        if choices:
            flags.DEFINE_enum(
                field.name, field.default, list(choices), help_text, flag_values=flag_values
            )
        else:
            kind = type(field.default)
            definers[kind](field.name, field.default, help_text, flag_values=flag_values)


def main(argv: list[str]) -> int:
    """`mlperf-tf bench ARGS`: returns the exit code (2 with a one-line error on bad input)."""
    from mlperf_tf.config import split_config_overrides

    try:
        argv, overrides = split_config_overrides(argv)
    except ValueError as e:
        raise UserError(str(e)) from None
    flag_values = flags.FlagValues()
    _define_flags(flag_values)
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv):
        print(__doc__.split("\n\n")[-1].strip() + "\n")
        print(flag_values.main_module_help() or flag_values.get_help())
        print("\n  --config.KEY=VALUE: override a field of the benchmark's config (typed)")
        return 0
    try:
        flag_values(["mlperf-tf bench", *argv])
    except flags.Error as e:
        raise UserError(str(e).splitlines()[0]) from None
    values = {name: flag_values[name].value for name in flag_values}
    config = BenchConfig(**{f.name: values[f.name] for f in dataclasses.fields(BenchConfig)})
    run_settings = {name: values[name] for name in SHARED_RUN_SETTINGS}
    run_config = RunConfig(model_dir="unused", **run_settings)  # the run flags' own checks
    _, bench_config = benchmark_config(config, overrides)  # bad values fail before TF starts
    splits.check_run_split(bench_config, run_config)  # where the replicas are known already
    if run_settings["distribution"] == "multi_worker" and not os.environ.get("TF_CONFIG"):
        # `run`'s message names --cluster_resolver, a flag bench does not have.
        raise UserError("--distribution=multi_worker needs TF_CONFIG to name the cluster")
    result = run(config, run_settings, overrides)
    if config.json:
        print(json.dumps(dataclasses.asdict(result), allow_nan=False))
    else:
        print(result.summary())
    return 0 if all(math.isfinite(r) for r in result.window_samples_per_s) else 1
