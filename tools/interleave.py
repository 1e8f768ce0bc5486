"""Provides `interleaved_rounds` and `report`: side-by-side step timing of several contestants.

The machines are shared, so a speed claim is a ratio taken within one run: each contestant is a
callable `run(steps)`; after one warm-up call each (tracing, graph optimization), every round runs
every contestant for `steps` steps in a rotating order, so machine load hits them alike. Reported
per contestant: samples/s (median of rounds, pooled = all samples over all time), the ratio to a
reference contestant (pooled, median of per-round ratios, and each round's), and the process CPU
seconds per step, which other jobs' load distorts far less than wall time (it still does through
shared caches and memory bandwidth). A contestant whose calls carry costs that are not its
steps' times its steps itself and returns them as a `StepWindow` (`keras_fit_run`).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import time
from collections.abc import Callable


@dataclasses.dataclass
class Rounds:
    """Per-contestant measurements of `interleaved_rounds`, one entry per round."""

    samples_per_step: int
    rates: dict[str, list[float]]  # samples/s
    cpu: dict[str, list[float]]  # process CPU seconds per step
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def pooled(self, name: str) -> float:
        """All samples over all wall time of `name`, in samples/s."""
        return len(self.rates[name]) / sum(1.0 / r for r in self.rates[name])


@dataclasses.dataclass(frozen=True)
class StepWindow:
    """Wall and process CPU seconds of a call's steps alone, when a `run(steps)` returns it."""

    seconds: float
    cpu_seconds: float


def warm_up(contestants: dict[str, Callable[[int], StepWindow | None]]) -> None:
    """One call of one step per contestant (tracing, graph building), timed and printed."""
    for name, run in contestants.items():
        begin = time.perf_counter()
        run(1)
        print(f"warm-up {name}: {time.perf_counter() - begin:.1f} s", flush=True)


def interleaved_rounds(
    contestants: dict[str, Callable[[int], StepWindow | None]],
    *,
    steps: int,
    rounds: int,
    samples_per_step: int,
) -> Rounds:
    """Runs `rounds` rounds of `steps` steps of every (warmed-up) contestant, rotating the order."""
    names = list(contestants)
    result = Rounds(
        samples_per_step=samples_per_step,
        rates={n: [] for n in names},
        cpu={n: [] for n in names},
        load_before=os.getloadavg(),
    )
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            begin, cpu_begin = time.perf_counter(), time.process_time()
            window = contestants[name](steps)
            if not isinstance(window, StepWindow):
                window = StepWindow(time.perf_counter() - begin, time.process_time() - cpu_begin)
            result.cpu[name].append(window.cpu_seconds / steps)
            result.rates[name].append(steps * samples_per_step / window.seconds)
        line = ", ".join(f"{n} {result.rates[n][-1]:.2f}" for n in names)
        print(f"round {r + 1}: {line} samples/s; load {os.getloadavg()[0]:.1f}", flush=True)
    result.load_after = os.getloadavg()
    return result


def report(result: Rounds, reference: str, unit: str = "samples") -> str:
    """Markdown tables of `result`: rates and CPU time, each contestant against `reference`.

    Ratios are "reference / contestant" by speed (> 1: the reference is faster), i.e. the
    contestant's time over the reference's.
    """
    names = list(result.rates)
    ref_rates, ref_cpu = result.rates[reference], result.cpu[reference]
    lines = [
        f"| contestant | {unit}/s (median of rounds) | {unit}/s (pooled) | {reference} / it "
        f"(pooled) | {reference} / it (median of per-round ratios) | {reference} / it per round |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        ratios = [a / b for a, b in zip(ref_rates, result.rates[name])]
        lines.append(
            f"| {name} | {statistics.median(result.rates[name]):.2f} | {result.pooled(name):.2f} | "
            f"{result.pooled(reference) / result.pooled(name):.2f} | "
            f"{statistics.median(ratios):.2f} | {' '.join(f'{r:.2f}' for r in ratios)} |"
        )
    lines += [
        "",
        f"| contestant | CPU s/step (median) | it / {reference} CPU time (total) | it / "
        f"{reference} CPU time (median of per-round ratios) | per round |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        ratios = [a / b for a, b in zip(result.cpu[name], ref_cpu)]
        lines.append(
            f"| {name} | {statistics.median(result.cpu[name]):.3f} | "
            f"{sum(result.cpu[name]) / sum(ref_cpu):.2f} | {statistics.median(ratios):.2f} | "
            f"{' '.join(f'{r:.2f}' for r in ratios)} |"
        )
    before, after = result.load_before, result.load_after
    lines.append(
        f"\nload average (1, 5, 15 min): {before[0]:.2f} {before[1]:.2f} {before[2]:.2f} before, "
        f"{after[0]:.2f} {after[1]:.2f} {after[2]:.2f} after"
    )
    return "\n".join(lines)


def custom_loop(model, optimizer, iterator, loss_of) -> Callable[[int], None]:
    """A peer's training step as its own custom loop runs it: `run(steps)` for the rounds above.

    One `tf.function` of `steps` steps (a tensor, so one trace serves every count), each taking
    the next batch, the loss `loss_of(model, batch)` under a tape, and `apply_gradients` — the
    shape of the Model Garden's trainers, without their Orbit plumbing.
    """
    import tensorflow as tf  # noqa: PLC0415 - the report helpers above run without TF

    @tf.function
    def loop(steps):
        loss = tf.constant(0.0)
        for _ in tf.range(steps):
            batch = next(iterator)
            with tf.GradientTape() as tape:
                loss = loss_of(model, batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def run(steps: int) -> None:
        loop(tf.constant(steps)).numpy()

    return run


def keras_fit_run(model, dataset) -> Callable[[int], StepWindow]:
    """`model.fit` as a contestant: `run(steps)` fits `steps` steps of `dataset` and returns the
    window from the first step's start to the last step's end.

    A user's `fit` runs an epoch of thousands of steps per call; the rounds call it for a few, so
    what each call costs besides its steps would be charged to a handful of them. On TF 2.20 /
    Keras 3.15 that is large: timed by callbacks, `fit(steps_per_epoch=3)` on ResNet-50 spent
    4.7-5.0 s after `on_train_end`, with no CPU time, before returning (releasing its epoch
    iterator, `mlperf_tf/data/README.md`; the steps themselves took 1.7-1.9 s each). The window
    leaves out that and the call's set-up, and keeps everything between steps (callbacks,
    Keras' Python loop).
    """
    import keras  # noqa: PLC0415 - the report helpers above run without Keras

    marks: list[tuple[float, float]] = []

    class _StepMarks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                marks[:] = [(time.perf_counter(), time.process_time())]

        def on_train_batch_end(self, batch, logs=None):
            marks[1:] = [(time.perf_counter(), time.process_time())]

    step_marks = _StepMarks()

    def run(steps: int) -> StepWindow:
        marks.clear()
        model.fit(dataset, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[step_marks])
        # The call's iterator may sit in a reference cycle; freed here, its wait falls outside
        # every window instead of inside the next call's.
        gc.collect()
        (begin, cpu_begin), (end, cpu_end) = marks
        return StepWindow(end - begin, cpu_end - cpu_begin)

    return run
