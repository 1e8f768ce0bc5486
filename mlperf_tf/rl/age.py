"""Provides `AgeGate`: the asynchronous GRPO schedule's bound on how old a step's rollouts may be.

In asynchronous GRPO the rollouts of step k+1 are generated while update k runs, so they are
sampled by weights up to some updates older than the ones they train (NeMo-RL's
`async_grpo.max_trajectory_age_steps`, 1 in the MLPerf reference; its importance-sampling
correction sees exactly that age). Here the overlap comes from the input pipeline's prefetch:
a `tf.data` generator produces the next steps' rollouts while the runner trains. The gate is
where that overlap is bounded: before generating the rollouts of batch b (0-based, trained by
update b + 1) the generator waits until `version() - base >= b - max_age`, where `version` is
the number of updates applied so far (the optimizer's `iterations`) and `base` its value when
the first batch was generated (a resumed run starts from its checkpoint's count). The age the
batch is then generated at, `b - (version() - base)`, is what NeMo-RL's replay buffer reports as
`avg_trajectory_age` (the trained version minus the generation version, in updates); the
generation version is read once, before the batch's first turn, so a batch whose later turns
see newer weights (the update finishing meanwhile) is counted at its oldest.

Max age 0 is the synchronous schedule: the rollouts of step k+1 start only after update k.

Waiting inside a `tf.data` generator blocks the pipeline's thread, and releasing the pipeline's
iterator waits for that thread: whoever stops consuming calls `close()` first (the runner and
`bench` do, through `Benchmark.release_input`), which ends the generator's wait. A closed gate
lets the generator run on as it would without one (its batches are never trained: the consumer
is gone), and records no age. An exit that looked like a hang: a 2-device
`--model_parallel=2` GRPO run's process often did not exit after `run_stop` when watched (its
release of the iterator waiting in TensorFlow); measured since, with tf.data's autotuner off for
synthetic input, 8 of 8 runs exited 6-138 s after `run_stop`: read as the release's waits for
tf.data's threads (not proven) (`benchmarks/qwen35_397b_grpo/README.md`,
"Parallelism").
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class AgeGate:
    """Holds a rollout generator to batches at most `max_age` policy updates old.

    Args:
      max_age: updates the weights a batch is sampled with may lag the weights it trains
        (0: synchronous).
      version: the count of policy updates applied so far; None: nothing updates the policy
        (every batch is sampled with the weights it trains: age 0, no wait).
      poll_s: seconds between reads of `version` while waiting.
    """

    def __init__(self, max_age: int, version: Callable[[], int] | None, *, poll_s: float = 0.01):
        if max_age < 0:
            raise ValueError(f"max_age ({max_age}) must be >= 0")
        self.max_age = max_age
        self.version = version
        self.poll_s = poll_s
        self.base: int | None = None
        self.ages: list[int] = []  # each batch's age, in the order generated
        self._closed = threading.Event()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Ends every wait, now and later (the consumer is gone): `wait` returns at once."""
        self._closed.set()

    def wait(self, batch: int) -> int:
        """Blocks until batch `batch` (0-based) may be generated; returns its age in updates
        (recorded in `ages`). Once `close()` was called it returns at once, the age the batch
        has then, unrecorded: nothing trains it."""
        if self.version is None:
            self.ages.append(0)
            return 0
        if self.base is None:
            self.base = int(self.version())
        while True:
            done = int(self.version()) - self.base
            if done >= batch - self.max_age or self._closed.wait(self.poll_s):
                break
        age = max(0, batch - done)
        if not self.closed:
            self.ages.append(age)
        return age

    @property
    def max_seen(self) -> int:
        """The oldest batch generated so far, in updates (0 before any)."""
        return max(self.ages, default=0)
