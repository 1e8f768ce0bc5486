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
- One format, whatever the layout (`run_checkpoint`): the model's and the optimizer's variables
  are keyed by their stable Keras paths, not by their position in the model's layer list (a
  spatially partitioned SSD orders its layers differently from the unsplit one), and split
  variables are saved whole (`mlperf_tf.parallel.layout.save_whole`), each replica restoring its
  own slice. So a run saved under any data x model x expert x spatial layout resumes under any
  other the model allows. A checkpoint that lacks one of the model's variables, or holds one the
  model does not have, is refused naming them (never a silent partial restore). Checkpoints of
  the earlier positional format (`model/_operations/...`) still restore under the layout that
  wrote them.
- Errors: `--model_dir` that is a file, cannot be created or is read-only is a `UserError` before
  training starts; a save that fails (disk full, read-only) is a `CheckpointError` naming the step,
  the folder and the OS's reason.
"""

from __future__ import annotations

import collections
import dataclasses
import glob
import os
import re
import shutil
import time
import uuid
from typing import Protocol, runtime_checkable

import keras
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


# ---- the format: variables by stable path ------------------------------------------------------
MODEL_PART = "model_variables"
OPTIMIZER_PART = "optimizer_variables"
_BY_PATH = "by_path"  # `VariablesByPath`'s dict: the second component of every entry's key
_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
# The first component of the earlier format's keys (`model/_operations/1/_operations/29/...`).
_POSITIONAL = ("model/", "optimizer/")


class VariablesByPath(tf.Module):
    """Variables in a checkpoint under names given to them, whatever their order.

    `tf.train.Checkpoint` names an entry by the attributes that reach it: through a Keras model
    that is the layer's position (`model/_operations/29/...`), through this dict the name given
    (`model_variables/by_path/<path>/...`, TF escaping `/` as `.S`). Each variable keeps its own
    serialization: a split one is joined at save and cut at restore (`layout.save_whole`).
    """

    def __init__(self, variables: dict, *, name: str):
        super().__init__(name=name)
        self.by_path = dict(variables)


def _unique(pairs) -> dict:
    # Two variables of one path (two layers given one name) stay apart by their order:
    # `<path>#2` is the second of that path.
    keyed, seen = {}, collections.Counter()
    for key, variable in pairs:
        seen[key] += 1
        keyed[key if seen[key] == 1 else f"{key}#{seen[key]}"] = variable
    return keyed


def model_paths(model) -> dict:
    """The model's variables (weights, moving statistics, seed states) by their Keras path."""
    return _unique((v.path, v) for v in model.variables)


def optimizer_paths(optimizer) -> dict:
    """The optimizer's variables (step count, slots) by their path below the optimizer's name.

    Keras names an unnamed optimizer `sgd`, `sgd_1`, ... by how many were made before in the
    process, so the name is left out. A wrapper's own variables (`LossScaleOptimizer`'s scale,
    step counter and `iteration`) get `wrapper/` in front, one per level of wrapping.
    """
    chain = [optimizer]
    while getattr(chain[-1], "inner_optimizer", None) is not None:
        chain.append(chain[-1].inner_optimizer)

    def key(variable) -> str:
        for depth, owner in enumerate(chain):
            prefix = f"{owner.name}/"
            if variable.path.startswith(prefix):
                return "wrapper/" * (len(chain) - 1 - depth) + variable.path[len(prefix) :]
        return variable.path

    return _unique((key(v), v) for v in optimizer.variables)


@runtime_checkable
class MapsCheckpointFormat(Protocol):
    """A model whose variables are kept in another arrangement than the one format's (DLRMv4's
    tables in the TPU embedding engine's stacked layout): it maps its checkpoint entries itself.
    """

    def checkpoint_format_entries(self, model_entries: dict, optimizer_entries: dict):
        """The entries replaced by ones in the format's whole form (trackables computed at save,
        written back at restore): `(model_entries, optimizer_entries)`."""


def run_checkpoint(*, model: keras.Model, optimizer, optimizer_slots: dict | None = None,
                   **parts) -> tf.train.Checkpoint:  # fmt: skip
    """A run's checkpoint in the one format: model and optimizer variables by stable path.

    Args:
      model: the built model (split variables already `save_whole`).
      optimizer: the built optimizer (slots of split variables already `split_slots`).
      optimizer_slots: slots kept outside the optimizer, saved under the keys of the
        optimizer's own (the pipeline's stage-local update: `GradientSummer.optimizer_slots`).
      **parts: more trackables saved as they are (the run state, sharded slots).

    A model kept in another arrangement maps the entries itself (`MapsCheckpointFormat`).
    """
    models = model_paths(model)
    optimizers = {**optimizer_paths(optimizer), **(optimizer_slots or {})}
    if isinstance(model, MapsCheckpointFormat):
        models, optimizers = model.checkpoint_format_entries(models, optimizers)
    by_path = {
        MODEL_PART: VariablesByPath(models, name=MODEL_PART),
        OPTIMIZER_PART: VariablesByPath(optimizers, name=OPTIMIZER_PART),
    }
    return tf.train.Checkpoint(**by_path, **parts)


def _unescape(name: str) -> str:
    # TF's escaping of a name inside a checkpoint key: "." -> "..", "/" -> ".S".
    out, i = [], 0
    while i < len(name):
        if name[i] == "." and i + 1 < len(name):
            out.append({"S": "/", ".": "."}.get(name[i + 1], name[i : i + 2]))
            i += 2
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _variable_name(key: str, part: str) -> str | None:
    # `<part>/by_path/<escaped name>/.ATTRIBUTES/VARIABLE_VALUE` -> the name; else None.
    prefix = f"{part}/{_BY_PATH}/"
    if key.startswith(prefix) and key.endswith(_VALUE):
        return _unescape(key[len(prefix) : -len(_VALUE)])
    return None


def stored_paths(names, part: str) -> set[str]:
    """The variable names a checkpoint holds under `part` (given its keys, `list_variables`)."""
    return {name for key in names if (name := _variable_name(key, part)) is not None}


def read_part(path: str, part: str = MODEL_PART) -> dict:
    """A checkpoint's variables under `part` (`MODEL_PART`, `OPTIMIZER_PART`) as whole arrays by
    name, read from the files alone (no model needed: for tools and tests)."""
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if (name := _variable_name(key, part)) is not None
    }


def _few(paths) -> str:
    paths = sorted(paths)
    return ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")


def check_matches(checkpoint: tf.train.Checkpoint, path: str, names) -> None:
    """Refuses a checkpoint whose variables are not the run's, before anything is restored.

    Every model variable must be in it, and nothing else under the model's part (another
    model's); every optimizer variable must be in it (a run would otherwise resume with fresh
    slots); extra optimizer entries are left (a weight-update-sharded run keeps its slots apart).

    Raises:
      CheckpointError: naming the first few missing and unknown variables.
    """
    problems = []
    for part, what in ((MODEL_PART, "model"), (OPTIMIZER_PART, "optimizer")):
        wanted = getattr(checkpoint, part, None)
        if not isinstance(wanted, VariablesByPath):
            continue
        stored = stored_paths(names, part)
        missing = set(wanted.by_path) - stored
        unknown = stored - set(wanted.by_path) if part == MODEL_PART else set()
        if missing:
            problems.append(f"it lacks {len(missing)} {what} variables ({_few(missing)})")
        if unknown:
            problems.append(
                f"it holds {len(unknown)} {what} variables the run has not ({_few(unknown)})"
            )
    if problems:
        raise CheckpointError(
            f"checkpoint {path} is not one of this model: {'; '.join(problems)}; move the folder "
            "away, or pass --restart to start from step 0"
        )


def is_positional(names) -> bool:
    """Whether a checkpoint (given its keys) is of the earlier format, keyed by layer position."""
    return any(n.startswith(_POSITIONAL) for n in names)


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
      positional: the same state in the earlier format, keyed by layer position (as
        `tf.train.Checkpoint(model=..., optimizer=...)` keys it), to restore checkpoints of that
        format; None: refuse them as not of this model.
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
        positional: tf.train.Checkpoint | None = None,
    ):
        self.checkpoint = checkpoint
        self.positional = positional
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
                self._restore_one(path)
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

    def _restore_one(self, path: str) -> None:
        """Restores one checkpoint of either format; refuses one whose variables are not the run's."""
        names = [name for name, _ in tf.train.list_variables(path)]
        if self.positional is not None and is_positional(names):
            self.positional.restore(path).expect_partial()
            return
        check_matches(self.checkpoint, path, names)
        self.checkpoint.restore(path).expect_partial()

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
