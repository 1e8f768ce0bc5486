"""Provides `Checkpointer`: when to save, saves that a crash cannot corrupt, and careful restores.

- When: every `every_loops` host loops, every `every_minutes` minutes, and at least once per eval
  block, so that a killed run of any preset keeps its work (a mini run is shorter than the default
  1,000 steps of loop-based saving). On several workers the decision is agreed (a scalar
  all-reduce), because every worker must take part in each save.
- Crash-safe: TensorFlow writes a checkpoint's shards to a `_temp` folder, merges them into
  `ckpt-N.data*`/`ckpt-N.index`, and only then rewrites the `checkpoint` state file (atomically, by
  rename), so a kill mid-save leaves the state naming the previous checkpoint (tests/faults proves
  it by killing saves). The one unsafe case is overwriting the newest checkpoint with a save of the
  same step, which this class never does.
- Restore: the newest checkpoint that restores cleanly, with a warning for each newer one that is
  corrupt or partial; never a silent start from step 0 when checkpoints exist but none restores.
- Errors: `--model_dir` that is a file, cannot be created or is read-only is a `UserError` before
  training starts; a save that fails (disk full, read-only) is a `CheckpointError` naming the step,
  the folder and the OS's reason.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import shutil
import time
import uuid

import tensorflow as tf
from absl import logging

from mlperf_tf.errors import UserError

# What TF's checkpoint reader raises for a truncated, missing or garbled file (IndexError: "Read
# less bytes than requested" from a truncated data file).
_RESTORE_ERRORS = (
    tf.errors.OpError,
    ValueError,
    IndexError,
    KeyError,
    AssertionError,
    RuntimeError,
)


class CheckpointError(UserError):
    """A checkpoint could not be written or read; the message names the folder and the reason."""


@dataclasses.dataclass(frozen=True)
class CheckpointPolicy:
    """When to save. Both cadences count from the last save; 0 turns a cadence off.

    Attributes:
      every_loops: save after this many host loops.
      every_minutes: save once this many minutes of training passed (wall clock of this host).
      every_block: save at the end of an eval block in which nothing was saved.
    """

    every_loops: int = 10
    every_minutes: float = 5.0
    every_block: bool = True

    def __post_init__(self):
        if self.every_loops < 0:
            raise UserError(f"--checkpoint_every_loops ({self.every_loops}) must not be negative.")
        if self.every_minutes < 0:
            raise UserError(
                f"--checkpoint_every_minutes ({self.every_minutes}) must not be negative."
            )

    def due(self, *, loops_since_save: int, seconds_since_save: float, block_ended: bool) -> bool:
        """True when a save is due after a host loop (this host's view; see `agree`)."""
        if self.every_loops and loops_since_save >= self.every_loops:
            return True
        if self.every_minutes and seconds_since_save >= self.every_minutes * 60:
            return True
        return self.every_block and block_ended and loops_since_save > 0


def check_model_dir(model_dir: str) -> None:
    """Creates `model_dir` if needed and proves it writable, before any training.

    Raises:
      UserError: it is a file, it cannot be created, or a file cannot be written in it (the
        message names the flag, the path and the OS's reason).
    """
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise UserError(f"--model_dir={model_dir!r} is a file, not a folder")
    try:
        os.makedirs(model_dir, exist_ok=True)
        probe = os.path.join(model_dir, f".write_test_{uuid.uuid4().hex}")
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        raise UserError(
            f"--model_dir={model_dir!r} is not a writable folder: {e.strerror or e}"
        ) from None


def check_readable(model_dir: str) -> None:
    """Refuses a start whose checkpoints exist but none can be read, before any file is touched.

    Reads each checkpoint's index (newest first) until one reads; `Checkpointer.restore` later
    restores the newest that restores. So a folder whose every checkpoint is unreadable is refused
    while its MLPerf log is still in place.

    Raises:
      CheckpointError: checkpoints exist in `<model_dir>/ckpt` and none of them can be read.
    """
    directory = os.path.join(model_dir, "ckpt")
    if not os.path.isdir(directory):
        return
    failures = []
    for path in candidates(directory):
        try:
            tf.train.load_checkpoint(path)
            return
        except _RESTORE_ERRORS as e:
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            failures.append(f"{os.path.basename(path)}: {reason}")
    if failures:
        raise CheckpointError(
            f"--model_dir={model_dir!r}: no checkpoint in {directory} can be read "
            f"({'; '.join(failures)[:300]}); move the folder away, or pass --restart to start "
            "from step 0 (the old checkpoints are kept under a new name)"
        )


def _spans_hosts(strategy) -> bool:
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return False
    cluster = resolver.cluster_spec().as_dict()
    return sum(len(cluster.get(kind, [])) for kind in ("chief", "worker")) > 1


def agreement(strategy):
    """A function `value -> bool`: `value` OR-ed over all workers (a scalar all-reduce, compiled
    once: an eager collective is slow), or `value` itself on one host.

    Call it at the same point on every worker: it is a collective.
    """
    if strategy is None or not _spans_hosts(strategy):
        return bool

    @tf.function
    def summed(local):
        per_replica = strategy.run(lambda: tf.identity(local))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return lambda value: bool(summed(tf.constant(int(value), tf.int32)).numpy())


def _step_of(path: str) -> int:
    match = re.search(r"-(\d+)$", path)
    return int(match.group(1)) if match else -1


def candidates(directory: str) -> list[str]:
    """Checkpoint prefixes in `directory`, newest first: from the state file, plus any `.index`
    files it does not list (a state file that is missing or corrupt must not hide them)."""
    found: set[str] = set()
    try:
        state = tf.train.get_checkpoint_state(directory)
    except (tf.errors.OpError, ValueError) as e:  # a corrupt state file (text proto)
        logging.warning("Ignoring the unreadable checkpoint state in %s: %s", directory, e)
        state = None
    if state is not None:
        for path in state.all_model_checkpoint_paths:
            found.add(path if os.path.isabs(path) else os.path.join(directory, path))
    for index in glob.glob(os.path.join(glob.escape(directory), "*.index")):
        found.add(index[: -len(".index")])
    return sorted(found, key=_step_of, reverse=True)


class Checkpointer:
    """Saves and restores one run's `tf.train.Checkpoint` under `<model_dir>/ckpt`.

    Args:
      checkpoint: what to save (model, optimizer, run state).
      model_dir: the run's folder; the chief keeps `ckpt/`, other workers write to a throw-away
        `ckpt_worker<i>/` (every worker must take part in a save of mirrored variables).
      chief: whether this task keeps its checkpoints.
      task_id: this worker's index (names the throw-away folder).
      max_to_keep: checkpoints kept.
      policy: when `maybe_save` saves.
      strategy: for agreeing on saves across workers (None: one host).
    """

    def __init__(
        self,
        *,
        checkpoint: tf.train.Checkpoint,
        model_dir: str,
        chief: bool = True,
        task_id: int = 0,
        max_to_keep: int = 3,
        policy: CheckpointPolicy | None = None,
        strategy=None,
    ):
        self.checkpoint = checkpoint
        self.chief = chief
        self.chief_directory = os.path.join(model_dir, "ckpt")
        self.directory = (
            self.chief_directory if chief else os.path.join(model_dir, f"ckpt_worker{task_id}")
        )
        self.policy = policy or CheckpointPolicy()
        self._agree = agreement(strategy)
        self.manager = tf.train.CheckpointManager(checkpoint, self.directory, max_to_keep)
        self.last_saved_step: int | None = None
        self._loops_since_save = 0
        self._saved_in_block = False
        self._last_save_time = time.monotonic()
        self.save_seconds = 0.0  # spent in `save` so far (the run's time breakdown reads it)

    def restore(self) -> str | None:
        """Restores the newest checkpoint that reads cleanly; returns its path (None: none exist).

        Raises:
          CheckpointError: checkpoints exist but none of them restores.
        """
        paths = candidates(self.chief_directory)
        failures = []
        for path in paths:
            try:
                self.checkpoint.restore(path).expect_partial()
            except _RESTORE_ERRORS as e:
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                failures.append(f"{os.path.basename(path)}: {reason}")
                logging.warning(
                    "Checkpoint %s is corrupt or partial (%s); trying the one before it.",
                    path,
                    reason,
                )
                continue
            if failures:
                logging.warning(
                    "Resumed from %s, not the newest checkpoint (%s)", path, "; ".join(failures)
                )
            self.last_saved_step = _step_of(path)
            return path
        if failures:
            raise CheckpointError(
                f"no checkpoint in {self.chief_directory} can be restored ({'; '.join(failures)}); "
                "move the folder away to start from step 0"
            )
        return None

    def after_loop(self, step: int, *, block_ended: bool = False) -> bool:
        """Counts a finished host loop and saves when the policy says so; returns whether it saved.

        Call it at the same point on every worker (the decision is agreed).
        """
        self._loops_since_save += 1
        due = self.policy.due(
            loops_since_save=self._loops_since_save,
            seconds_since_save=time.monotonic() - self._last_save_time,
            block_ended=block_ended and not self._saved_in_block,
        )
        saved = False
        if self._agree(due):
            saved = self.save(step)
        if block_ended:
            self._saved_in_block = False
        return saved

    def save(self, step: int) -> bool:
        """Saves the state as of `step` unless that step is saved already; returns whether it did.

        Raises:
          CheckpointError: the write failed (a full disk, a read-only folder).
        """
        self._loops_since_save = 0
        self._last_save_time = time.monotonic()
        self._saved_in_block = True
        if step == self.last_saved_step:
            return False  # rewriting the newest checkpoint in place is the one non-atomic save
        begin = time.monotonic()
        try:
            self.manager.save(checkpoint_number=step)
        except (tf.errors.OpError, OSError) as e:
            raise CheckpointError(
                f"cannot write the checkpoint of step {step} to {self.directory}: {_reason(e)}"
            ) from None
        finally:
            if not self.chief:
                shutil.rmtree(self.directory, ignore_errors=True)
            self.save_seconds += time.monotonic() - begin
        self.last_saved_step = step
        return True


# What a save's collective (a gather of shards held by other workers, `parallel.layout`) raises
# when a peer left or never came: its first line ("Graph execution error:") says nothing.
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


def _reason(error: BaseException) -> str:
    if isinstance(error, _PEER_ERRORS):
        return (
            f"another worker did not take part in the save ({type(error).__name__}); a "
            "multi-worker save needs every worker"
        )
    text = getattr(error, "message", None) or getattr(error, "strerror", None) or str(error)
    text = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    for known in ("No space left on device", "Read-only file system", "Permission denied"):
        if known.lower() in text.lower():
            return known
    return text
