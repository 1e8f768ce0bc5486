"""Provides `run`: the MLPerf training loop of any `Benchmark` on any tf.distribute strategy.

Orbit-shaped: the controller (`run`) owns the outer loop — blocks up to each evaluation point of the
benchmark's MLPerf schedule, checkpoints, the stop at the quality target; `Trainer` is one compiled
`tf.function` that runs `steps_per_loop` steps (the count is a tensor, so it traces once);
`Evaluator` runs the eval set and reduces its outputs on the host.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from compliance.logger import MLPerfLogger
from mlperf_tf import collectives, distribute, precision
from mlperf_tf.benchmark import Benchmark, EvalPoint
from mlperf_tf.data.pipeline import translate_errors
from mlperf_tf.errors import DataError, UserError

RESUME_INPUT_MODES = ("skip", "reseed")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """How to run a benchmark (not what it trains): strategy, precision, loops, checkpoints, log.

    Attributes:
      model_dir: folder for checkpoints (`ckpt/`), TensorBoard (`tensorboard/`) and the log.
      mlperf_log: MLPerf log path; "" means `<model_dir>/mlperf_log.txt`.
      steps_per_loop: optimizer steps per compiled host loop; progress is printed once per loop.
      checkpoint_every_loops: save every N host loops (0: only at the end of the run).
      resume_input: on resume, `skip` replays the input pipeline past the consumed batches (exact
        resume for deterministic pipelines, costs the input time of the skipped part); `reseed`
        starts the pipeline afresh with a seed derived from the step (cheap, different order).
      max_train_steps: stop after this many steps (0: the benchmark's `max_epochs` budget).
    """

    model_dir: str
    mlperf_log: str = ""
    distribution: str = "auto"
    tpu: str = ""
    num_cpu_devices: int = 0
    dtype: str = "fp32"
    xla: bool = False
    steps_per_loop: int = 100
    checkpoint_every_loops: int = 10
    max_checkpoints: int = 3
    resume_input: str = "skip"
    seed: int = 0
    max_train_steps: int = 0
    data_service: str = ""
    skip_bad_records: bool = False
    startup_timeout_s: float = 120.0
    submission_org: str = "mlperf-tf"
    submission_platform: str = "1xCPU"
    submission_division: str = "closed"
    submission_status: str = "research"
    echo_mlperf_log: bool = False
    # Gradient summation (mlperf_tf.collectives): algorithm, RxC replica mesh, bucket MiB.
    all_reduce: str = "auto"
    mesh: str = ""
    pack_mb: float = 0.0
    weight_update_sharding: bool = False
    cluster_resolver: str = "auto"  # where the workers come from (see distribute.py)
    slurm_port_base: int = 8888  # first worker port on each node under --cluster_resolver=slurm

    def __post_init__(self):
        collectives.check_settings(
            all_reduce=self.all_reduce,
            mesh=self.mesh,
            pack_mb=self.pack_mb,
            cluster_resolver=self.cluster_resolver,
        )
        if not self.model_dir:
            raise UserError("--model_dir is required")
        if self.steps_per_loop <= 0:
            raise UserError(f"--steps_per_loop ({self.steps_per_loop}) must be a positive integer.")
        if self.checkpoint_every_loops < 0:
            raise UserError(
                f"--checkpoint_every_loops ({self.checkpoint_every_loops}) must not be negative."
            )
        if self.max_checkpoints <= 0:
            raise UserError(f"--max_checkpoints ({self.max_checkpoints}) must be positive.")
        if self.resume_input not in RESUME_INPUT_MODES:
            raise UserError(
                f"--resume_input={self.resume_input!r} is not one of {', '.join(RESUME_INPUT_MODES)}"
            )
        if self.max_train_steps < 0:
            raise UserError(f"--max_train_steps ({self.max_train_steps}) must not be negative.")

    @property
    def mlperf_log_path(self) -> str:
        return self.mlperf_log or os.path.join(self.model_dir, "mlperf_log.txt")


@dataclasses.dataclass
class RunResult:
    """What a run ended with (on every worker)."""

    status: str  # MLPerf run_stop status: "success" or "aborted"
    reason: str  # why it stopped, for people
    steps: int
    evals: list[tuple[float, float]]  # (epoch_num, eval value) in order
    mlperf_log: str | None  # the log path on the chief, None on other workers
    model: Any = None

    @property
    def success(self) -> bool:
        return self.status == C.SUCCESS


class Trainer:
    """One compiled host loop of `steps_per_loop` optimizer steps (replica math in `Benchmark`)."""

    def __init__(self, *, strategy, benchmark: Benchmark, model, optimizer, xla: bool,
                 summer: collectives.GradientSummer | None = None):  # fmt: skip
        self.strategy = strategy
        self.summer = summer
        self.benchmark = benchmark
        self.model = model
        self.optimizer = optimizer
        self.accumulation = benchmark.config.gradient_accumulation_steps
        self.clip_norm = benchmark.gradient_clip_norm()
        # XLA compiles the forward/backward pass per replica; apply_gradients stays outside it
        # because its cross-replica sum is a merge_call, which XLA cannot hold on CPU/GPU.
        # Without XLA the pass is inlined into the loop's graph: a nested tf.function would
        # refuse the all-reduce of cross-replica batch norm ("merge_call ... in a tf.function").
        self._grads = (
            tf.function(self._replica_grads, jit_compile=True, reduce_retracing=True)
            if xla
            else self._replica_grads
        )
        self.loop = tf.function(self._loop)

    def _replica_grads(self, batch):
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            loss = self.benchmark.compute_loss(self.model, batch, training=True)
            scaled = self.optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        return loss, grads

    def _replica_step(self, micro_batches):
        variables = self.model.trainable_variables
        total_loss = 0.0
        total_grads = None
        for batch in micro_batches:  # Python loop: the accumulation count is static
            loss, grads = self._grads(batch)
            total_loss += loss
            if total_grads is None:
                total_grads = list(grads)
            else:
                total_grads = [a + g for a, g in zip(total_grads, grads)]
        if self.accumulation > 1:
            total_grads = [g / self.accumulation for g in total_grads]
            total_loss /= self.accumulation
        if self.summer is not None:  # --all_reduce/--pack_mb/--weight_update_sharding
            self.summer.apply(self.optimizer, total_grads, variables, clip_norm=self.clip_norm)
            return total_loss
        if self.clip_norm:
            total_grads = self._clip_summed(total_grads)
        # Keras 3 sums gradients across replicas here: losses are already per global batch.
        self.optimizer.apply_gradients(zip(total_grads, variables))
        return total_loss

    def _clip_summed(self, grads):
        """Clips the cross-replica sum of `grads` to `clip_norm` (global norm), in replica context.

        Keras clips before its own cross-replica sum, i.e. per replica, which is not the
        reference's clip of the full-batch gradient. So this sums first, clips, and hands Keras
        each replica's equal share (sum / replicas), which its sum restores: one extra
        all-reduce, and none with a single replica.
        """
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context else 1
        if replicas > 1:
            grads = context.all_reduce(tf.distribute.ReduceOp.SUM, grads)
        grads, _ = tf.clip_by_global_norm(grads, self.clip_norm)
        return [g / replicas for g in grads] if replicas > 1 else grads

    def _loop(self, iterator, num_steps):
        loss_sum = tf.constant(0.0, tf.float32)
        for _ in tf.range(num_steps):
            micro_batches = [next(iterator) for _ in range(self.accumulation)]
            per_replica_loss = self.strategy.run(self._replica_step, args=(micro_batches,))
            # Each replica's loss is its share of the global mean: the sum is the global loss.
            loss = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
            loss_sum += tf.cast(loss, tf.float32)
        return loss_sum / tf.cast(num_steps, tf.float32)


class Evaluator:
    """Runs the eval set, gathers per-replica outputs and reduces them on the host."""

    def __init__(self, *, strategy, benchmark: Benchmark, model, dataset, xla: bool):
        self.strategy = strategy
        self.benchmark = benchmark
        self.model = model
        self.dataset = dataset
        self.steps = benchmark.eval_steps(strategy.num_replicas_in_sync)
        self._replica_eval = (
            tf.function(self._replica, jit_compile=True, reduce_retracing=True)
            if xla
            else self._replica
        )
        self._step = tf.function(self._gathered_step)

    def _replica(self, batch):
        outputs = self.benchmark.eval_step(self.model, batch)
        # Scalars get a leading axis so that gathering concatenates one value per replica.
        return {k: tf.reshape(v, [1]) if v.shape.rank == 0 else v for k, v in outputs.items()}

    def _gathered_step(self, iterator):
        outputs = self.strategy.run(self._replica_eval, args=(next(iterator),))
        return {k: self.strategy.gather(v, axis=0) for k, v in outputs.items()}

    def evaluate(self) -> float:
        iterator = iter(self.dataset)
        state = self.benchmark.eval_begin()
        for _ in range(self.steps):
            outputs = self._step(iterator)
            state = self.benchmark.eval_reduce(state, {k: v.numpy() for k, v in outputs.items()})
        return float(self.benchmark.eval_result(state))


def _checkpoint_dir(model_dir: str, strategy) -> str:
    # Workers other than the chief write to their own throw-away folder: every worker must take
    # part in a save (mirrored variables), but only the chief's copy is kept and restored from.
    if distribute.is_chief(strategy):
        return os.path.join(model_dir, "ckpt")
    return os.path.join(model_dir, f"ckpt_worker{distribute.task_id(strategy)}")


def _build(benchmark: Benchmark, run_config: RunConfig, strategy, summer=None):
    with strategy.scope():
        model = benchmark.build_model()
        if not model.built:
            raise RuntimeError(
                f"{type(benchmark).__name__}.build_model() must return a built model"
            )
        budget = run_config.max_train_steps or benchmark.train_steps
        optimizer = precision.wrap_optimizer(benchmark.build_optimizer(budget), run_config.dtype)
        # Slots must exist before the first step under MirroredStrategy (a placeholder error else).
        # With weight-update sharding the optimizer keeps no full-size slots: the summer holds
        # each replica's shard of them.
        sharded = summer is not None and summer.sharded
        optimizer.build([] if sharded else model.trainable_variables)
        if summer is not None:
            summer.build(optimizer, model.trainable_variables)
    return model, optimizer


def _train_dataset_fn(benchmark: Benchmark, run_config: RunConfig, start_step: int):
    replicas_per_batch = benchmark.config.gradient_accumulation_steps

    def dataset_fn(input_context: tf.distribute.InputContext):
        dataset = benchmark.train_dataset(input_context)
        if run_config.data_service:
            from mlperf_tf.data import service  # noqa: PLC0415 (only runs that use it pay)

            # One job per pipeline: pipelines read different shards and must not share a job.
            job_name = f"{benchmark.name}-train-{input_context.input_pipeline_id}"
            dataset = service.distribute(dataset, run_config.data_service, job_name=job_name)
        if start_step and run_config.resume_input == "skip":
            local_replicas = input_context.num_replicas_in_sync // input_context.num_input_pipelines
            dataset = dataset.skip(start_step * replicas_per_batch * local_replicas)
        return dataset

    return dataset_fn


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _current_lr(optimizer) -> float:
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    lr = inner.learning_rate
    try:
        return float(keras.ops.convert_to_numpy(lr))
    except (TypeError, ValueError):
        return float("nan")


def run(benchmark: Benchmark, run_config: RunConfig) -> RunResult:
    """Trains `benchmark` until its quality target or its budget; logs MLPerf lines on the chief.

    Resumes from the latest checkpoint in `<model_dir>/ckpt` when there is one.

    Raises:
      UserError: bad run settings, unreachable peers, or bad data reported by the benchmark.
    """
    strategy = distribute.resolve_strategy(
        run_config.distribution,
        tpu=run_config.tpu,
        num_cpu_devices=run_config.num_cpu_devices,
        timeout_s=run_config.startup_timeout_s,
        cluster_resolver=run_config.cluster_resolver,
        port_base=run_config.slurm_port_base,
    )
    chief = distribute.is_chief(strategy)
    os.makedirs(run_config.model_dir, exist_ok=True)
    log_path = run_config.mlperf_log_path
    if chief and os.path.exists(log_path) and os.path.getsize(log_path):
        # A restarted run writes a fresh log; the old one is kept, never overwritten.
        index = 1
        while os.path.exists(f"{log_path}.{index}"):
            index += 1
        os.replace(log_path, f"{log_path}.{index}")
        logging.info("Kept the previous MLPerf log as %s.%d", log_path, index)
    mllog = MLPerfLogger(log_path, enabled=chief, echo=run_config.echo_mlperf_log)
    try:
        return _run(benchmark, run_config, strategy, mllog, chief)
    finally:
        mllog.close()


def _run(benchmark, run_config, strategy, mllog: MLPerfLogger, chief: bool) -> RunResult:
    config = benchmark.config
    mllog.event(C.CACHE_CLEAR, True)
    mllog.start(C.INIT_START)
    mllog.log_submission(
        benchmark=benchmark.mlperf_benchmark,
        org=run_config.submission_org,
        platform=run_config.submission_platform,
        division=run_config.submission_division,
        status=run_config.submission_status,
    )
    keras.utils.set_random_seed(run_config.seed)
    mllog.event(C.SEED, run_config.seed)
    precision.set_policy(run_config.dtype)
    benchmark.num_replicas = strategy.num_replicas_in_sync
    benchmark.seed = run_config.seed
    benchmark.skip_bad_records = run_config.skip_bad_records

    settings = collectives.Settings(
        all_reduce=run_config.all_reduce,
        mesh=run_config.mesh,
        pack_mb=run_config.pack_mb,
        weight_update_sharding=run_config.weight_update_sharding,
    )
    summer = None if settings.uses_keras_sum else collectives.GradientSummer(strategy, settings)
    model, optimizer = _build(benchmark, run_config, strategy, summer)
    if summer is not None:
        collectives.record_choices(summer, run_config.model_dir, chief=chief)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    ckpt_dir = _checkpoint_dir(run_config.model_dir, strategy)
    manager = tf.train.CheckpointManager(
        checkpoint, ckpt_dir, max_to_keep=run_config.max_checkpoints
    )
    chief_ckpt = os.path.join(run_config.model_dir, "ckpt")
    latest = tf.train.latest_checkpoint(chief_ckpt)
    with strategy.scope():
        if latest:
            checkpoint.restore(latest).expect_partial()
            logging.info("Resumed from %s", latest)
        else:
            benchmark.restore_initial_weights(model)
    start_step = int(optimizer.iterations.numpy())
    if start_step and run_config.resume_input == "reseed":
        benchmark.seed = run_config.seed + start_step

    hparams = {
        C.GLOBAL_BATCH_SIZE: config.global_batch_size,
        C.GRADIENT_ACCUMULATION_STEPS: config.gradient_accumulation_steps,
    }
    hparams.update(benchmark.mlperf_hparams())
    hparams.setdefault(C.TRAIN_SAMPLES, benchmark.train_samples())
    hparams.setdefault(C.EVAL_SAMPLES, benchmark.eval_samples())
    mllog.log_hparams(hparams)

    train_data = strategy.distribute_datasets_from_function(
        _train_dataset_fn(benchmark, run_config, start_step)
    )
    eval_data = strategy.distribute_datasets_from_function(benchmark.eval_dataset)
    trainer = Trainer(
        strategy=strategy, benchmark=benchmark, model=model, optimizer=optimizer,
        xla=run_config.xla, summer=summer,
    )  # fmt: skip
    evaluator = Evaluator(
        strategy=strategy, benchmark=benchmark, model=model, dataset=eval_data, xla=run_config.xla
    )
    schedule = _schedule(benchmark, run_config)
    writer = (
        tf.summary.create_file_writer(os.path.join(run_config.model_dir, "tensorboard"))
        if chief
        else tf.summary.create_noop_writer()
    )

    mllog.end(C.INIT_STOP)
    mllog.start(C.RUN_START)
    iterator = iter(train_data)
    step = start_step
    last_step = schedule[-1].step
    evals: list[tuple[float, float]] = []
    status, reason = C.ABORTED, f"budget of {last_step} steps ended before the quality target"
    loops_since_save = 0
    samples_per_step = config.global_batch_size
    run_begin = time.monotonic()
    stop = False
    try:
        with translate_errors():
            for point in schedule:
                if point.step <= step:
                    continue  # evaluated before the restart
                mllog.start(C.BLOCK_START, metadata=_block_meta(point))
                while step < point.step:
                    n = min(run_config.steps_per_loop, point.step - step)
                    loop_begin = time.monotonic()
                    loss = float(trainer.loop(iterator, tf.constant(n, tf.int32)).numpy())
                    elapsed = time.monotonic() - loop_begin
                    step += n
                    throughput = n * samples_per_step / max(elapsed, 1e-9)
                    eta = (
                        (last_step - step) * samples_per_step / throughput
                        if throughput
                        else math.inf
                    )
                    logging.info(
                        "step %d/%d | epoch %.2f | %.1f samples/s | loss %.4f | ETA %s",
                        step, last_step, step / benchmark.steps_per_epoch, throughput, loss,
                        _format_eta(eta),
                    )  # fmt: skip
                    with writer.as_default(step=step):
                        tf.summary.scalar("loss", loss)
                        tf.summary.scalar("samples_per_second", throughput)
                        tf.summary.scalar("learning_rate", _current_lr(optimizer))
                    if not math.isfinite(loss):
                        status, reason = C.ABORTED, f"non-finite loss ({loss}) at step {step}"
                        stop = True
                        break
                    loops_since_save += 1
                    if run_config.checkpoint_every_loops and (
                        loops_since_save >= run_config.checkpoint_every_loops
                    ):
                        _save(manager, step, strategy)
                        loops_since_save = 0
                mllog.end(C.BLOCK_STOP, metadata=_block_meta(point))
                if stop:
                    break
                mllog.start(C.EVAL_START, metadata={C.EPOCH_NUM: point.epoch_num})
                value = evaluator.evaluate()
                evals.append((point.epoch_num, value))
                mllog.event(C.EVAL_ACCURACY, value, metadata={C.EPOCH_NUM: point.epoch_num})
                mllog.end(C.EVAL_STOP, metadata={C.EPOCH_NUM: point.epoch_num})
                logging.info("eval at epoch %s: %.5f (target %s)", point.epoch_num, value,
                             benchmark.quality_target)  # fmt: skip
                if math.isfinite(value) and value >= benchmark.quality_target:
                    status, reason = C.SUCCESS, f"reached {value:.5f} >= {benchmark.quality_target}"
                    break
    except DataError:
        # Bad input mid-run: close the log as an aborted run and keep the work done so far.
        mllog.end(C.RUN_STOP, metadata={C.STATUS: C.ABORTED})
        _save(manager, int(optimizer.iterations.numpy()), strategy)
        raise
    mllog.end(C.RUN_STOP, metadata={C.STATUS: status})
    if status == C.SUCCESS or "non-finite" not in reason:
        _save(manager, step, strategy)  # never save non-finite weights over good ones
    logging.info(
        "run_stop status=%s after %d steps, %.1f s: %s",
        status, step, time.monotonic() - run_begin, reason,
    )  # fmt: skip
    return RunResult(
        status=status,
        reason=reason,
        steps=step,
        evals=evals,
        mlperf_log=mllog.path if chief else None,
        model=model,
    )


def _save(manager: tf.train.CheckpointManager, step: int, strategy) -> None:
    manager.save(checkpoint_number=step)
    if not distribute.is_chief(strategy):
        shutil.rmtree(manager.directory, ignore_errors=True)


def _block_meta(point: EvalPoint) -> dict:
    return {C.FIRST_EPOCH_NUM: point.first_epoch_num, C.EPOCH_COUNT: point.epoch_count}


def _schedule(benchmark: Benchmark, run_config: RunConfig) -> list[EvalPoint]:
    schedule = sorted(benchmark.eval_schedule(), key=lambda p: p.step)
    if not schedule:
        raise RuntimeError(f"{type(benchmark).__name__}.eval_schedule() returned no eval points")
    if run_config.max_train_steps:
        limit = run_config.max_train_steps
        kept = [p for p in schedule if p.step < limit]
        last = next((p for p in schedule if p.step >= limit), schedule[-1])
        # The budget's end gets an eval too, so every run logs at least one eval_accuracy.
        kept.append(dataclasses.replace(last, step=min(limit, last.step)))
        schedule = kept
    return schedule


def evaluate_only(benchmark: Benchmark, model) -> float:
    """Evaluates `model` on the benchmark's eval set on the default strategy (tests, tools)."""
    strategy = tf.distribute.get_strategy()
    data = strategy.distribute_datasets_from_function(benchmark.eval_dataset)
    return Evaluator(
        strategy=strategy, benchmark=benchmark, model=model, dataset=data, xla=False
    ).evaluate()


__all__ = ["RunConfig", "RunResult", "Trainer", "Evaluator", "run", "evaluate_only"]
