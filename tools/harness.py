"""Provides the measuring harness every tool shares: interleaved rounds, child processes, reports.

The machines are shared, so a speed claim is a ratio taken within one run.

In one process (`interleaved_rounds`, `report`): each contestant is a callable `run(steps)`; after
one warm-up call each (tracing, graph optimization), every round runs every contestant for `steps`
steps in a rotating order, so machine load hits them alike. Reported per contestant: samples/s
(median of rounds, pooled = all samples over all time), the ratio to a reference contestant
(pooled, median of per-round ratios, and each round's), and the process CPU seconds per step,
which other jobs' load distorts far less than wall time (it still does through shared caches and
memory bandwidth). A contestant whose calls carry costs that are not its steps' times its steps
itself and returns them as a `StepWindow` (`keras_fit_run`).

Across processes (`run_child`, `child_main`, `case_rounds`): a case that needs a fresh process
(its own logical devices, tracing from cold, another source tree) runs the tool itself again with
`--child`; the child prints its result as one JSON line, and rounds alternate the cases' order.
`run_workers` starts MultiWorkerMirroredStrategy workers on 127.0.0.1.

Nothing here imports TensorFlow at module level, so every tool's `--help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Sequence

REPO_ROOT = str(pathlib.Path(__file__).resolve().parents[1])


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


def warm_up(contestants: dict[str, Callable[[int], StepWindow | None]], steps: int = 1) -> None:
    """One call of `steps` steps per contestant (tracing, graph building), timed and printed."""
    for name, run in contestants.items():
        begin = time.perf_counter()
        run(steps)
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


def compare(
    contestants: dict[str, Callable[[int], StepWindow | None]],
    *,
    steps: int,
    rounds: int,
    samples_per_step: int,
    reference: str,
    unit: str = "samples",
    title: str = "",
    warm_up_steps: int = 1,
) -> Rounds:
    """`warm_up` (`warm_up_steps` each), `interleaved_rounds` and the `report` against
    `reference`, printed under `title`: the whole side-by-side comparison of a peer or
    ablation tool."""
    warm_up(contestants, warm_up_steps)
    result = interleaved_rounds(
        contestants, steps=steps, rounds=rounds, samples_per_step=samples_per_step
    )
    print(f"\n{title}" if title else "")
    print(report(result, reference, unit=unit), flush=True)
    return result


def compare_tokens(contestants, config, *, steps: int, rounds: int, model: str, note: str = ""):
    """`compare` of language-model train steps against "mlperf_tf" in tokens (batch x sequence
    of the benchmark `config`), titled with `model`, the batch, the rounds, the TF and Keras
    versions and `note`."""
    import keras  # noqa: PLC0415 - the harness runs without TF
    import tensorflow as tf  # noqa: PLC0415

    batch, sequence = config.global_batch_size, config.data.max_sequence_length
    title = (
        f"{model}, batch {batch} x sequence {sequence}; {steps} steps x {rounds} rounds; "
        f"TF {tf.__version__}, Keras {keras.__version__}{note}\n"
    )
    return compare(
        contestants, steps=steps, rounds=rounds, samples_per_step=batch * sequence,
        reference="mlperf_tf", unit="tokens", title=title,
    )  # fmt: skip


@dataclasses.dataclass
class RunnerParts:
    """A benchmark's model and optimizer and the suite's runner `Trainer` over its distributed
    train data; `run(steps)` is a contestant for the rounds."""

    model: object
    optimizer: object
    trainer: object
    iterator: object

    def run(self, steps: int) -> None:
        import tensorflow as tf  # noqa: PLC0415 - the harness runs without TF

        self.trainer.loop(self.iterator, tf.constant(steps, tf.int32))[0].numpy()


def runner_parts(
    strategy, benchmark, *, xla: bool = False, build_optimizer=None, adjust_model=None,
    dataset_fn=None, summer=None,
) -> RunnerParts:  # fmt: skip
    """Builds, in `strategy`'s scope, the benchmark's model (`adjust_model(model)` before the
    first trace) and optimizer (`build_optimizer(benchmark)` instead of the benchmark's), with
    its slots (a custom loop under MirroredStrategy fails at its first step without them), and
    the runner's `Trainer` over `dataset_fn` (default the benchmark's train data). On a mesh
    (`summer`: the runner's `GradientSummer` of `benchmark.mesh`) the model is built under the
    ambient mesh and the Trainer sums each gradient over its layout's axes, as `mlperf-tf run`
    does; pass `dataset_fn=parallel.input.for_mesh(...)` to route the batches."""
    from mlperf_tf.parallel.context import use_mesh  # noqa: PLC0415 - the harness runs without TF
    from mlperf_tf.runner import Trainer  # noqa: PLC0415

    with strategy.scope(), use_mesh(benchmark.mesh if summer is not None else None):
        model = benchmark.build_model()
        if adjust_model is not None:
            adjust_model(model)
        if build_optimizer is None:
            optimizer = benchmark.build_optimizer(benchmark.train_steps)
        else:
            optimizer = build_optimizer(benchmark)
        optimizer.build(model.trainable_variables)
        if summer is not None:
            summer.build(optimizer, model.trainable_variables)
    trainer = Trainer(
        strategy=strategy, benchmark=benchmark, model=model, optimizer=optimizer, xla=xla
    )
    trainer.summer = summer
    datasets = strategy.distribute_datasets_from_function(dataset_fn or benchmark.train_dataset)
    return RunnerParts(model, optimizer, trainer, iter(datasets))


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


# ---- arguments ----------------------------------------------------------------------------------
def rounds_parser(description: str, *, steps: int, rounds: int = 5) -> argparse.ArgumentParser:
    """A tool's parser with the rounds' `--steps` (per contestant per round) and `--rounds`;
    `parse_rounds` reads it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="steps per side per round")
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def parse_rounds(parser: argparse.ArgumentParser, argv, *positive: str) -> argparse.Namespace:
    """`parser.parse_args(argv)`, exiting with a usage error unless `--steps`, `--rounds` and
    every flag in `positive` are > 0."""
    args = parser.parse_args(argv)
    require_positive(parser, args, "steps", "rounds", *positive)
    return args


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str):
    """Exits through `parser.error` (usage, the flag and its value) if any `--name` is not > 0."""
    for name in names:
        if getattr(args, name) <= 0:
            parser.error(f"--{name} ({getattr(args, name)}) must be positive")


def median_of(records: Sequence[dict], key: str) -> float:
    """The median of `record[key]` over `records` (one record per round of a case)."""
    return statistics.median(r[key] for r in records)


def median_ratio(numerators: Sequence[float], denominators: Sequence[float]) -> float:
    """The median of the per-round ratios `numerators[i] / denominators[i]`."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def load_average() -> str:
    """`uptime`'s three load averages (1, 5, 15 minutes), for the line under a table."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def mirrored_cpus(num_devices: int):
    """A MirroredStrategy over the first `num_devices` logical CPUs, safe to build often.

    It reduces on the host (`ReductionToOneDevice`, as the runner does on CPUs): default
    MirroredStrategies over the same devices share collective keys, and two whose first
    all-reduces differ in shape break collectives for the rest of the process.
    """
    import tensorflow as tf  # noqa: PLC0415 - the harness runs without TF

    devices = [f"CPU:{i}" for i in range(num_devices)]
    return tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )


# ---- child processes ----------------------------------------------------------------------------
def child_env(tree: str | None = None, **extra: str) -> dict[str, str]:
    """This process's environment with `PYTHONPATH` at `tree` (a repository root; default this
    checkout) and TF's C++ logging quiet, plus `extra`."""
    path = os.path.abspath(tree) if tree else REPO_ROOT
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2", **extra}


def json_records(text: str) -> list[dict]:
    """The JSON objects a child printed, one a line (the lines that start with "{")."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def run_child(
    script: str, flags: Sequence[str], *, tree: str | None = None, timeout_s: float | None = None
) -> dict | None:
    """Runs `python script --child *flags` in a fresh process of `tree` and returns the last JSON
    line it printed, or None if it passed `timeout_s`.

    Raises:
      RuntimeError: the child exited non-zero or printed no JSON (the message ends with the
        tail of its stderr, whose last line is the error).
    """
    command = [sys.executable, os.path.abspath(script), "--child", *flags]
    try:
        done = subprocess.run(
            command, env=child_env(tree), capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None
    records = json_records(done.stdout)
    if done.returncode or not records:
        raise RuntimeError(f"child failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return records[-1]


def child_main(measure: Callable[[], dict]) -> None:
    """In a `--child` process: prints `measure()` as one JSON line for `run_child`; a user's
    mistake (`UserError`) ends the process with one `error:` line and exit code 2."""
    from mlperf_tf.errors import UserError  # noqa: PLC0415

    try:
        result = measure()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(result), flush=True)


def _shown(result) -> str:
    if result is None:
        return "no result (timed out)"
    if isinstance(result, dict):
        return json.dumps(
            {k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}
        )
    return str(result)


def case_rounds(
    cases: Sequence[Hashable],
    measure: Callable[[Hashable], object],
    *,
    rounds: int,
    label: Callable[[Hashable], str] = str,
) -> dict[Hashable, list]:
    """Measures every case once a round, the order reversed every other round (a drifting load
    then hits the first and last cases alike), printing each result with the load average
    around it. Returns {case: [result of each round]}."""
    results: dict[Hashable, list] = {case: [] for case in cases}
    for index in range(rounds):
        for case in cases if index % 2 == 0 else cases[::-1]:
            before = os.getloadavg()[0]
            result = measure(case)
            print(
                f"round {index + 1} {label(case)}: {_shown(result)} "
                f"(load {before:.1f} -> {os.getloadavg()[0]:.1f})",
                flush=True,
            )
            results[case].append(result)
    return results


# ---- workers on 127.0.0.1 -----------------------------------------------------------------------
def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (all bound at once, so none repeats)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILLs a worker started with `start_new_session=True`, its threads and children too."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@dataclasses.dataclass(frozen=True)
class WorkerResult:
    """One worker's end: exit code (None: still running at the deadline) and its output."""

    index: int
    returncode: int | None
    stdout: str
    stderr: str


def run_workers(command: Sequence[str], count: int, *, timeout_s: float) -> list[WorkerResult]:
    """Runs `count` copies of `command` as the workers of one cluster on 127.0.0.1 (each with
    its `TF_CONFIG`), waits for all of them up to `timeout_s` in total, then kills what is left
    (a worker whose peer died can wait for it forever)."""
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(count)]}
    procs, results = [], []
    try:
        for index in range(count):
            tf_config = {"cluster": cluster, "task": {"type": "worker", "index": index}}
            procs.append(
                subprocess.Popen(
                    list(command), env=child_env(TF_CONFIG=json.dumps(tf_config)),
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    start_new_session=True,
                )
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        for index, proc in enumerate(procs):
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1.0))
                results.append(WorkerResult(index, proc.returncode, out, err))
            except subprocess.TimeoutExpired:
                results.append(WorkerResult(index, None, "", ""))
    finally:
        for proc in procs:
            kill_session(proc)
    return results


def comma_list(parser: argparse.ArgumentParser, text: str, flag: str, kind=str) -> list:
    """`listflags.parse_list` (no empty elements, spaces, wrong types or duplicates) for a tool."""
    from mlperf_tf import listflags  # noqa: PLC0415
    from mlperf_tf.errors import UserError  # noqa: PLC0415

    try:
        return list(listflags.parse_list(text, flag, kind))
    except UserError as e:
        parser.error(str(e))


def output_dir(parser: argparse.ArgumentParser, path: str, flag: str) -> None:
    """`paths.try_output_dir` for a tool: the folder is tried (created, written, put back)."""
    from mlperf_tf import paths  # noqa: PLC0415
    from mlperf_tf.errors import UserError  # noqa: PLC0415

    try:
        paths.try_output_dir(path, flag)
    except UserError as e:
        parser.error(str(e))
