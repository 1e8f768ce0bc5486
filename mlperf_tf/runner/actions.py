"""Provides the controller's actions: side work called with each loop's, eval's and the run's output.

The controller (`mlperf_tf.runner.controller`) only trains, evaluates and checkpoints; everything
else — MLPerf log events, TensorBoard scalars, the progress line, the stops at a non-finite loss or
at the quality target — is an `Action` in the list it calls. An action overrides the hooks it needs;
`after_loop` and `after_eval` may return a `Stop` to end the run after the current loop or eval.
Pass more actions to `run(..., actions=[...])` (e.g. time-based checkpoints).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from mlperf_tf import runlog, time_breakdown
from mlperf_tf.benchmark import EvalPoint
from mlperf_tf.mllog import MLPerfLogger
from mlperf_tf.runner.config import StopCause


@dataclasses.dataclass(frozen=True)
class Stop:
    """A decision to end the run: the cause, and the reason for people."""

    cause: StopCause
    reason: str


@dataclasses.dataclass(frozen=True)
class LoopOutput:
    """One host loop's outcome (`steps` optimizer steps ending at global step `step`)."""

    step: int
    steps: int
    loss: float  # mean training loss over the loop
    seconds: float
    samples_per_second: float
    last_step: int  # the step at which the run's budget ends
    epoch: float  # `step` in epochs
    next_eval_step: int = 0  # the step of the next evaluation (0: unknown)
    first: bool = False  # the run's first loop (one step; without warm-up, its time has tracing)
    input_wait_s: float = 0.0  # seconds the loop's steps were blocked on the input iterator
    # The benchmark's training metrics (`Benchmark.train_metric_shapes`), means over the loop.
    metrics: dict = dataclasses.field(default_factory=dict)

    def scalar_metrics(self) -> str:
        """The rank-0 metrics as ` | name value` parts of the progress line."""
        return "".join(
            f" | {name} {float(value):.4g}"
            for name, value in self.metrics.items()
            if np.ndim(value) == 0
        )


@dataclasses.dataclass(frozen=True)
class EvalOutput:
    """One evaluation's outcome."""

    point: EvalPoint
    value: float
    target: float  # the benchmark's quality target
    higher_is_better: bool = True  # False: the target is a maximum (a loss, a perplexity)

    @property
    def reached(self) -> bool:
        """Whether `value` is finite and at or beyond the target in the metric's direction."""
        if not math.isfinite(self.value):
            return False
        return self.value >= self.target if self.higher_is_better else self.value <= self.target


@dataclasses.dataclass(frozen=True)
class RunEnd:
    """How the run ended (`at_end`)."""

    stop: Stop
    step: int
    seconds: float  # from run_start


class Action:
    """Side work of a run. Every hook is a no-op here; override the ones you need.

    Hooks run on the host, on every worker, in the order of the controller's action list.
    """

    def attach(self, controller) -> None:
        """Called once before `run_start`, with the `Controller` (e.g. for `controller.save()`)."""

    def block_begin(self, point: EvalPoint) -> None:
        """Before the training block that leads to the evaluation at `point`."""

    def after_loop(self, output: LoopOutput) -> Stop | None:
        """After each host loop; a `Stop` ends the run (the block is closed, no eval)."""

    def block_end(self, point: EvalPoint) -> None:
        """After the block (also when a stop cut it short)."""

    def eval_begin(self, point: EvalPoint) -> None:
        """Before the evaluation at `point`."""

    def after_eval(self, output: EvalOutput) -> Stop | None:
        """After each evaluation; a `Stop` ends the run."""

    def at_end(self, end: RunEnd) -> None:
        """Once, when the run stops (before the final checkpoint)."""


def _block_meta(point: EvalPoint) -> dict:
    return {
        C.FIRST_EPOCH_NUM: point.first_epoch_num,
        C.EPOCH_COUNT: point.epoch_count,
        **_samples_meta(point),
    }


def _samples_meta(point: EvalPoint) -> dict:
    """`samples_count` metadata where the benchmark's rules want it (llama31_8b's eval_accuracy)."""
    return {} if point.samples_count is None else {C.SAMPLES_COUNT: point.samples_count}


class MLPerfEvents(Action):
    """Logs MLPerf's block, eval and `run_stop` events."""

    def __init__(self, mllog: MLPerfLogger):
        self.mllog = mllog

    def block_begin(self, point):
        self.mllog.start(C.BLOCK_START, metadata=_block_meta(point))

    def block_end(self, point):
        self.mllog.end(C.BLOCK_STOP, metadata=_block_meta(point))

    def eval_begin(self, point):
        self.mllog.start(
            C.EVAL_START, metadata={C.EPOCH_NUM: point.epoch_num, **_samples_meta(point)}
        )

    def after_eval(self, output):
        metadata = {C.EPOCH_NUM: output.point.epoch_num, **_samples_meta(output.point)}
        self.mllog.event(C.EVAL_ACCURACY, output.value, metadata=metadata)
        self.mllog.end(C.EVAL_STOP, metadata=metadata)

    def at_end(self, end):
        cause = end.stop.cause
        if cause in (StopCause.TARGET_REACHED, StopCause.BUDGET_ENDED):
            # Read by the next start of the same command: a finished run is not resumed.
            self.mllog.comment(runlog.finished_note(cause.value, end.step, cause.status))
        self.mllog.end(C.RUN_STOP, metadata={C.STATUS: cause.status})


def format_eta(seconds: float) -> str:
    """`H:MM:SS`, or `?` when unknown."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressLine(Action):
    """Prints one absl line per loop (step, epoch, throughput, loss, ETA), per eval and at the end.

    Args:
      breakdown: a `TimeBreakdown` action called before this one: the run_stop line then also
        says where the time went (`mlperf_tf.time_breakdown.one_line`).
    """

    def __init__(self, breakdown=None):
        self.breakdown = breakdown

    def after_loop(self, output):
        if output.first:
            logging.info(
                "step %d/%d | epoch %.2f | loss %.4f%s | first step done in %.1f s",
                output.step, output.last_step, output.epoch, output.loss,
                output.scalar_metrics(), output.seconds,
            )  # fmt: skip
            return
        # The remaining steps at this loop's pace, to the budget's end and to the next eval.
        per_step = output.seconds / max(output.steps, 1)
        eta = (output.last_step - output.step) * per_step
        to_eval = max(output.next_eval_step - output.step, 0) * per_step
        logging.info(
            "step %d/%d | epoch %.2f | %.1f samples/s | loss %.4f%s | next eval in %s | ETA %s",
            output.step, output.last_step, output.epoch, output.samples_per_second, output.loss,
            output.scalar_metrics(), format_eta(to_eval), format_eta(eta),
        )  # fmt: skip

    def after_eval(self, output):
        logging.info("eval at epoch %s: %.5f (target %s)", output.point.epoch_num, output.value,
                     output.target)  # fmt: skip

    def at_end(self, end):
        result = getattr(self.breakdown, "result", None)
        where = f" | {time_breakdown.one_line(result)}" if result else ""
        logging.info(
            "run_stop status=%s after %d steps, %.1f s: %s%s",
            end.stop.cause.status, end.step, end.seconds, end.stop.reason, where,
        )  # fmt: skip


def current_learning_rate(optimizer) -> float:
    """The optimizer's learning rate now (through a loss-scale wrapper); NaN when unknown."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    try:
        return float(keras.ops.convert_to_numpy(inner.learning_rate))
    except (TypeError, ValueError):
        return float("nan")


# The key NeMo-RL's MLPerf GRPO logging gives its per-step statistics (not in
# `mlperf_logging.mllog.constants`; no rule file checks it).
TRACKED_STATS = "tracked_stats"


class TrackedStats(Action):
    """Logs MLPerf `tracked_stats` events after each host loop, as a reference logs its per-step
    statistics (NeMo-RL's GRPO: reward and loss, then where the step's time went): one event per
    dict that `stats(output)` returns, with the loop's last step and its `samples_count`.

    A host loop is one step at `--steps_per_loop=1` (the per-step events of the reference); a
    longer loop logs its means once, at its last step.

    Args:
      stats: `LoopOutput` -> a list of dicts of numbers (each one event's value).
      samples_per_step: the global batch (`samples_count` = step x it).
    """

    def __init__(self, stats, samples_per_step: int):
        self.stats = stats
        self.samples_per_step = samples_per_step
        self.mllog = None

    def attach(self, controller):
        self.mllog = controller.mllog

    def after_loop(self, output):
        # The reference's metadata names (`step`, not the constants' `step_num`).
        metadata = {C.SAMPLES_COUNT: output.step * self.samples_per_step, "step": output.step}
        for value in self.stats(output):
            self.mllog.event(TRACKED_STATS, value, metadata=metadata)


class TensorBoardScalars(Action):
    """Writes loss, samples/s and learning rate per loop to a summary writer."""

    def __init__(self, writer, optimizer):
        self.writer = writer
        self.optimizer = optimizer

    def after_loop(self, output):
        with self.writer.as_default(step=output.step):
            tf.summary.scalar("loss", output.loss)
            tf.summary.scalar("samples_per_second", output.samples_per_second)
            tf.summary.scalar("learning_rate", current_learning_rate(self.optimizer))
            for name, value in output.metrics.items():
                # A vector or matrix metric (e.g. per-layer expert load) as one scalar per entry.
                for index in np.ndindex(np.shape(value)):
                    suffix = "".join(f"/{i}" for i in index)
                    tf.summary.scalar(name + suffix, float(np.asarray(value)[index]))


class NonFiniteLossStop(Action):
    """Stops the run when a loop's loss is NaN or infinite (its weights are not saved)."""

    def after_loop(self, output):
        if not math.isfinite(output.loss):
            reason = f"non-finite loss ({output.loss}) at step {output.step}"
            return Stop(StopCause.NON_FINITE_LOSS, reason)
        return None


class TargetStop(Action):
    """Stops the run with status success when an eval reaches the quality target."""

    def after_eval(self, output):
        if output.reached:
            relation = ">=" if output.higher_is_better else "<="
            reason = f"reached {output.value:.5f} {relation} {output.target}"
            return Stop(StopCause.TARGET_REACHED, reason)
        return None
