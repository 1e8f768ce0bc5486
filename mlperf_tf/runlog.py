"""Provides the run's MLPerf log file: where it goes, whether a run finished, keeping old logs.

What this module guarantees (`docs/reliability.md`):
- `--mlperf_log` naming an existing folder puts the log inside it (`<folder>/mlperf_log.txt`);
  the folder itself is never moved. A path whose folder part is a file is an error.
- Only a log this suite wrote (its first record line is `:::MLLOG`, or the file is empty) is ever
  moved aside (to `<log>.1`, `<log>.2`, ...) when a run starts a new log; any other file at the
  log path is an `error:`, left as it is.
- A run whose log says it finished (`# mlperf-tf finished {...}` followed by `run_stop`: the
  quality target or the step budget ended it) is not resumed: the same command raises
  `RunFinished` (the CLI says so and exits 0), and its log stays in place. `--restart` starts a
  new run instead: the old log and checkpoints are kept under new names (`.N`).

No TensorFlow here: the checks run before the strategy is built.
"""

from __future__ import annotations

import dataclasses
import json
import os

from mlperf_tf.errors import UserError

LOG_NAME = "mlperf_log.txt"
FINISHED_MARK = "# mlperf-tf finished "  # written just before a finished run's run_stop
_RECORD = ":::MLLOG"
_HEAD_BYTES = 64 * 1024  # enough to see a log's first record line


class RunFinished(Exception):  # noqa: N818 - not an error: the run is done
    """The run in `--model_dir` finished already; the message says how and where its log is."""


@dataclasses.dataclass(frozen=True)
class Finished:
    """What a finished run's log says about its end."""

    cause: str  # a `StopCause` value: target_reached or budget_ended
    step: int
    status: str  # MLPerf run_stop status


def finished_note(cause: str, step: int, status: str) -> str:
    """The comment text (without `# `) a run writes just before its `run_stop` when it finished."""
    note = {"cause": cause, "step": step, "status": status}
    return f"{FINISHED_MARK[2:]}{json.dumps(note)}"


def resolve_path(mlperf_log: str, model_dir: str) -> str:
    """The log file of a run: `--mlperf_log`, a file inside it when it is a folder, or the default.

    Whether it can be written is tried, not inspected, by `paths.try_output_file` (the runner's
    preflight): as root, permission bits say yes to `/proc/x`.

    Raises:
      UserError: the path's folder part is a file, or the path is not a regular file.
    """
    if not mlperf_log:
        return os.path.join(model_dir, LOG_NAME)
    path = os.path.expanduser(mlperf_log)
    if os.path.isdir(path) or path.endswith(("/", os.sep)):
        path = os.path.join(path, LOG_NAME)
    parent = os.path.dirname(os.path.abspath(path))
    probe = parent
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if probe and not os.path.isdir(probe):
        raise UserError(f"--mlperf_log={mlperf_log!r}: {probe!r} is a file, not a folder")
    if os.path.exists(path) and not os.path.isfile(path):
        raise UserError(f"--mlperf_log={mlperf_log!r} is not a regular file")
    return path


def is_suite_log(path: str) -> bool:
    """Whether `path` is empty or an MLPerf log this suite wrote (its first record is :::MLLOG)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return False
    for raw in head.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith(b"# mlperf-tf "):
            continue
        return line.startswith(_RECORD.encode())
    return len(head) == 0 or not head.strip()


def finished(path: str) -> Finished | None:
    """The end a finished run wrote to its log at `path`, or None (no log, or not finished).

    Finished means: a `# mlperf-tf finished {...}` note followed by a `run_stop` record, or (logs
    of earlier versions, which wrote no note) a `run_stop` with status success.
    """
    if not os.path.isfile(path) or not is_suite_log(path):
        return None
    note, stopped_after_note, success = None, False, False
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith(FINISHED_MARK):
                try:
                    note = json.loads(line[len(FINISHED_MARK) :])
                except ValueError:
                    note = None
                stopped_after_note = False
            elif line.startswith(_RECORD) and '"run_stop"' in line:
                stopped_after_note = note is not None
                success = '"success"' in line
                if not stopped_after_note:
                    note = None
            elif line.startswith(_RECORD) and '"init_start"' in line:
                note, stopped_after_note, success = None, False, False  # a newer attempt
    if stopped_after_note and isinstance(note, dict):
        return Finished(
            cause=str(note.get("cause", "")),
            step=int(note.get("step", 0) or 0),
            status=str(note.get("status", "")),
        )
    if success:
        return Finished(cause="target_reached", step=0, status="success")
    return None


def _next_free(path: str) -> str:
    index = 1
    while os.path.exists(f"{path}.{index}"):
        index += 1
    return f"{path}.{index}"


def check_before_start(
    log_path: str, *, model_dir: str, restart: bool, budget_steps: int | None = None
) -> None:
    """Refuses to touch a foreign file at the log path and to resume a finished run.

    A run whose step budget ended is continued (not refused) when this run's budget,
    `budget_steps`, is larger than the step it ended at: a longer `--max_train_steps` extends it.
    Read-only: every worker may call it before the strategy is built.

    Raises:
      UserError: a file that is not a log of this suite is at `log_path`.
      RunFinished: the log says the run finished and `restart` is False.
    """
    if os.path.isfile(log_path) and os.path.getsize(log_path) and not is_suite_log(log_path):
        raise UserError(
            f"--mlperf_log: {log_path!r} exists and is not an MLPerf log this suite wrote; it is "
            "left as it is: name another file"
        )
    done = None if restart else finished(log_path)
    longer = done is not None and done.cause == "budget_ended" and done.step
    if longer and budget_steps is not None and budget_steps > done.step:
        return  # a longer budget: the run goes on from its last checkpoint
    if done is not None:
        at = f" at step {done.step}" if done.step else ""
        raise RunFinished(
            f"the run in {model_dir} finished ({done.cause}{at}, run_stop {done.status}); its "
            f"MLPerf log {log_path} is kept as it is. Pass --restart to start a new run (the old "
            "log and checkpoints are kept under new names), a larger step budget to go on, or "
            "another --model_dir"
        )


def keep_previous(log_path: str, *, model_dir: str, restart: bool) -> str | None:
    """Moves the previous log (and on `restart` the checkpoints) aside; returns the log's new name.

    Call it on the chief only, after `check_before_start`. A log in which set-up never reached
    `run_start` holds nothing worth keeping and is replaced instead.
    """
    kept = None
    if os.path.isfile(log_path) and os.path.getsize(log_path):
        if _reached_run_start(log_path) or restart:
            kept = _next_free(log_path)
            os.replace(log_path, kept)
        else:
            os.remove(log_path)
    checkpoint_dir = os.path.join(model_dir, "ckpt")
    if restart and os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
        os.replace(checkpoint_dir, _next_free(checkpoint_dir))
    return kept


def _reached_run_start(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as f:
        return any(line.startswith(_RECORD) and '"run_start"' in line for line in f)


def logged_benchmark(path: str) -> str:
    """The `submission_benchmark` value in the log at `path` ("" when none or unreadable)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f):
                if number > 10_000:
                    break
                if line.startswith(_RECORD) and '"submission_benchmark"' in line:
                    try:
                        return str(json.loads(line[len(_RECORD) :]).get("value", ""))
                    except (ValueError, AttributeError):
                        return ""
    except OSError:
        return ""
    return ""


def holds_a_run(log_path: str, model_dir: str) -> bool:
    """Whether `model_dir` holds something a run would resume or keep: checkpoints, or a log that
    reached `run_start`."""
    checkpoint_dir = os.path.join(model_dir, "ckpt")
    try:
        if os.path.isdir(checkpoint_dir) and os.listdir(checkpoint_dir):
            return True
    except OSError:
        return True  # unreadable: let the checks that read it say why
    return os.path.isfile(log_path) and is_suite_log(log_path) and _reached_run_start(log_path)
