"""Provides `StopRequest` and `handle_stop_signals`: SIGTERM/SIGINT stop a run at the next step.

Cloud TPU VMs, spot GPUs and Kubernetes pods are stopped with SIGTERM and a grace period; people
press Ctrl-C. Either way the run should end at the next step boundary with a checkpoint of that step.

Why not a Python signal handler alone: it runs only when the main thread returns to Python, which it
does not while a compiled host loop of `steps_per_loop` steps runs. So the signal's C-level handler
writes to a wakeup pipe (`signal.set_wakeup_fd`), a daemon thread reading that pipe sets a
`tf.Variable`, and the compiled loop reads that variable before each step and breaks out of its
`tf.range` loop. A second signal ends the process at once.

On several workers the loop breaks on the sum of the flag over all replicas (one scalar
all-reduce per step), so every worker stops after the same step even when only one was signaled.

Why not `tf.distribute.experimental.PreemptionCheckpointHandler`: it counts calls to its `run()`
(here one call is a whole host loop, which it lets finish and then runs one more before saving),
installs a Python-level SIGTERM handler (which cannot run during the compiled loop) and ends the
process through `TerminationConfig.exit_fn` from inside the loop, before the MLPerf log is closed.
Its worker agreement is what the in-loop all-reduce gives here, at step rather than loop granularity.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator

import tensorflow as tf
from absl import logging

from mlperf_tf.errors import EXIT_INTERRUPTED, EXIT_KILLED_AT_ONCE

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """A stop flag: set from the host (a signal, a test), read by the compiled loop at every step.

    The `tf.Variable` behind it is made at the first `should_stop` (while the loop is traced), not
    here: making a variable initializes TensorFlow, and MultiWorkerMirroredStrategy must be created
    before that. It is a plain host variable, not a mirrored one, so that a host thread can set it
    while a loop runs.
    """

    def __init__(self):
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._flag = None
        self._reclaim = None  # set by `handle_stop_signals`
        self._armed = threading.Event()  # set when the first loop is built: a step can follow
        self.reason = ""

    def reclaim_signals(self) -> None:
        """Re-installs this request's signal handlers (call after creating a strategy).

        MultiWorkerMirroredStrategy starts TensorFlow's coordination service, whose C++ preemption
        notifier installs its own SIGTERM handler over ours; without this a SIGTERM to a worker
        would go unseen. No-op outside `handle_stop_signals` or off the main thread.
        """
        if self._reclaim is not None and threading.current_thread() is threading.main_thread():
            self._reclaim()

    def request(self, reason: str = "stop requested") -> None:
        """Asks the run to stop at the next step boundary; `reason` says why, for people."""
        with self._lock:
            if not self.reason:
                self.reason = reason
            self._event.set()
            if self._flag is not None:
                self._flag.assign(1)

    def clear(self) -> None:
        with self._lock:
            self._event.clear()
            self.reason = ""
            if self._flag is not None:
                self._flag.assign(0)

    @property
    def armed(self) -> bool:
        """Whether the compiled loop reads this flag yet (before that, no step can stop on it)."""
        return self._armed.is_set()

    @property
    def requested(self) -> bool:
        """This host's flag (host side; across workers use the loop's agreed `should_stop`)."""
        return self._event.is_set()

    def _variable(self) -> tf.Variable:
        with self._lock:
            if self._flag is None:
                with tf.init_scope():
                    self._flag = tf.Variable(
                        int(self._event.is_set()), dtype=tf.int32, trainable=False,
                        name="stop_request",
                    )  # fmt: skip
                self._armed.set()
            return self._flag

    def should_stop(self, strategy: tf.distribute.Strategy | None = None) -> tf.Tensor:
        """A bool tensor: stop now. Call it inside the compiled loop, in cross-replica context.

        With workers on several hosts, this is the sum of every worker's flag (a scalar
        all-reduce), so all of them agree on the step at which they stop.
        """
        variable = self._variable()
        flag = variable.read_value()
        if strategy is not None and spans_hosts(strategy):
            per_replica = strategy.run(lambda: tf.identity(variable.read_value()))
            flag = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return flag > 0


def spans_hosts(strategy: tf.distribute.Strategy) -> bool:
    """True when `strategy`'s replicas live in more than one worker process (TF_CONFIG cluster)."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return False
    cluster = resolver.cluster_spec().as_dict()
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker")) > 1


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


@contextlib.contextmanager
def handle_stop_signals(
    stop: StopRequest,
    *,
    on_second: Callable[[str], None] | None = None,
    before_start: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Turns SIGTERM/SIGINT into `stop.request(...)` while the block runs; restores handlers after.

    The first signal prints one line on stderr and sets the flag. A second one calls
    `on_second(name)` (default: print one line and `os._exit(EXIT_KILLED_AT_ONCE)`): the user asked
    twice, so nothing more is saved. A first signal that comes before the run's first loop is
    built (`StopRequest.armed`: set-up, where no step boundary will come for minutes) calls
    `before_start(name)` when given (the CLI's ends the process at once: nothing to save yet).

    Outside the main thread (signals can only be handled there) this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = {sig: signal.signal(sig, _ignore_in_python) for sig in STOP_SIGNALS}
    previous_fd = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    on_second = on_second or _stop_at_once
    watcher = threading.Thread(
        target=_watch,
        args=(read_end, stop, on_second, before_start),
        daemon=True,
        name="stop-signals",
    )
    watcher.start()

    def reclaim():
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, _ignore_in_python)

    stop._reclaim = reclaim
    try:
        yield
    finally:
        stop._reclaim = None
        signal.set_wakeup_fd(previous_fd)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        os.close(write_end)  # the watcher reads EOF and returns
        watcher.join(timeout=5)
        os.close(read_end)


def _ignore_in_python(signum, frame) -> None:
    """Python-level handler: the watcher thread already acted on the signal's wakeup byte."""


def _watch(
    read_end: int,
    stop: StopRequest,
    on_second: Callable[[str], None],
    before_start: Callable[[str], None] | None,
) -> None:
    wanted = {int(s) for s in STOP_SIGNALS}
    seen = 0
    while True:
        try:
            data = os.read(read_end, 64)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            if signum not in wanted:
                continue
            name = signal_name(signum)
            seen += 1
            if seen == 1 and before_start is not None and not stop.armed:
                before_start(name)
            elif seen == 1:
                stop.request(f"stopped by {name}")
                print(
                    f"{name}: stopping at the next step boundary with a checkpoint "
                    "(send it again to stop at once, without one)",
                    file=sys.stderr,
                    flush=True,
                )
                logging.info("%s received: the run stops at the next step", name)
            else:
                on_second(name)


def _stop_at_once(name: str) -> None:
    print(
        f"error: stopped at once by a second {name}; nothing was saved since the last checkpoint",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_KILLED_AT_ONCE)


def last_checkpoint_words(model_dir: str) -> str:
    """Names the newest checkpoint in `<model_dir>/ckpt` (its `.index` file), or says there is none.

    Read from the folder, without TensorFlow: a signal handler thread calls it.
    """
    directory = os.path.join(model_dir, "ckpt")
    steps = []
    for name in os.listdir(directory) if os.path.isdir(directory) else ():
        match = re.fullmatch(r"ckpt-(\d+)\.index", name)
        if match:
            steps.append(int(match.group(1)))
    if not steps:
        return "no checkpoint exists, so the same command starts again from step 0"
    step = max(steps)
    path = os.path.join(directory, f"ckpt-{step}")
    return f"the checkpoint of step {step} ({path}) is kept: the same command resumes from it"


def stop_at_once(name: str, model_dir: str) -> None:
    """The CLI's second signal: one honest line naming what is kept, then exit 130."""
    print(
        f"error: stopped at once by a second {name}; {last_checkpoint_words(model_dir)}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_KILLED_AT_ONCE)


def stop_in_setup(name: str, model_dir: str) -> None:
    """The CLI's signal during set-up (no training loop yet): end at once, exit 3."""
    print(
        f"error: stopped by {name} during set-up, before the first step; nothing new to save: "
        f"{last_checkpoint_words(model_dir)}",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_INTERRUPTED)
