"""Provides the time-breakdown file of a run: where the time from `run_start` to `run_stop` went.

The runner (`mlperf_tf.runner.breakdown.TimeBreakdown`) writes `<model_dir>/time_breakdown.json`
and the same object as a `# mlperf-tf time_breakdown {...}` comment line after `run_stop` in the
MLPerf log (a comment, not an MLPerf key: the official checker skips it; it travels with the log
when the log is copied into a result folder). `mlperf-tf score` and `report` read it back with
`from_log`. No TensorFlow here: `compliance/` imports this module.

The parts, in seconds, add up to `time_to_train_s` (this process's `run_start` to `run_stop`):
  train: steady train steps (host loops, minus input wait and compile).
  compile: the first loop's time beyond a steady step's (tracing; ~0 after the init warm-up).
  eval: evaluations (from `eval_start` to `eval_stop`).
  checkpoint: checkpoint saves between loops.
  input_wait: time the train steps spent blocked on the input iterator.
  other: the rest (logging, actions, host work between loops).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

FILE_NAME = "time_breakdown.json"
COMMENT_TAG = "time_breakdown"  # the log line is `# mlperf-tf time_breakdown {json}`
PARTS = ("train", "compile", "eval", "checkpoint", "input_wait", "other")
TOTAL = "time_to_train_s"
LABELS = {
    "train": "train",
    "compile": "compile",
    "eval": "eval",
    "checkpoint": "checkpoint",
    "input_wait": "input wait",
    "other": "other",
}


def compute(
    *,
    total_s: float,
    loops: list[tuple[int, float, float]],
    eval_s: float,
    checkpoint_s: float,
) -> dict[str, float]:
    """The parts of `total_s` (seconds), from the run's loops, evals and checkpoint saves.

    Args:
      total_s: run_start to run_stop.
      loops: (steps, seconds, input wait seconds) per host loop, the run's first loop first.
      eval_s: seconds spent in evaluations.
      checkpoint_s: seconds spent saving checkpoints between run_start and run_stop.

    Returns:
      `PARTS` -> seconds, plus `steady_step_s` (a steady step's compute time, seconds),
      `input_wait_first_loop_s` (the first loop's input wait, seconds) and `TOTAL`.
    """
    later = loops[1:]
    later_steps = sum(steps for steps, _, _ in later)
    steady = (
        sum(seconds - wait for _, seconds, wait in later) / later_steps if later_steps else None
    )
    compile_s = 0.0
    if loops and steady is not None:
        steps, seconds, wait = loops[0]
        compile_s = max(0.0, seconds - wait - steps * steady)
    loop_s = sum(seconds for _, seconds, _ in loops)
    wait_s = sum(wait for _, _, wait in loops)
    parts = {
        "train": loop_s - wait_s - compile_s,
        "compile": compile_s,
        "eval": eval_s,
        "checkpoint": checkpoint_s,
        "input_wait": wait_s,
    }
    parts["other"] = total_s - sum(parts.values())
    parts = {key: round(value, 3) for key, value in parts.items()}
    parts[TOTAL] = round(total_s, 3)
    parts["steady_step_s"] = None if steady is None else round(steady, 6)
    # Of `input_wait`, the first loop's: the pipeline's start (its first batch), apart from the
    # stalls of a pipeline that does not keep up.
    parts["input_wait_first_loop_s"] = round(loops[0][2], 3) if loops else 0.0
    return parts


def one_line(breakdown: dict[str, Any]) -> str:
    """`time to train 75.6 s: train 59.0 s (78 %), compile 0.0 s, ...` (the run_stop line)."""
    total = breakdown.get(TOTAL) or 0.0
    shown = []
    for key in PARTS:
        seconds = float(breakdown.get(key) or 0.0)
        share = f" ({100 * seconds / total:.0f} %)" if total > 0 else ""
        shown.append(f"{LABELS[key]} {seconds:.1f} s{share}")
    return f"time to train {total:.1f} s: " + ", ".join(shown)


def write(model_dir: str, breakdown: dict[str, Any]) -> str:
    """Writes `<model_dir>/time_breakdown.json` (atomically); returns its path."""
    path = os.path.join(model_dir, FILE_NAME)
    temporary = path + ".tmp"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(breakdown, handle, indent=1, sort_keys=True)
        handle.write("\n")
    os.replace(temporary, path)
    return path


def valid(breakdown: Any) -> bool:
    """Whether `breakdown` has every part and the total as finite numbers."""
    if not isinstance(breakdown, dict):
        return False
    values = [breakdown.get(key) for key in (*PARTS, TOTAL)]
    return all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values
    )


def from_log(log_path: str, notes: list[dict] | None = None) -> dict[str, Any] | None:
    """The breakdown of the run in `log_path`: its comment line, else the side file beside it.

    The side file counts only when its `run_start_ms` is the log's (a restarted run in the same
    folder writes a new one). `notes` are the log's `# mlperf-tf time_breakdown` objects when the
    caller has parsed them already.

    Returns:
      The breakdown dict, or None when the run has none (an older or crashed run).
    """
    if not os.path.isfile(log_path):  # a FIFO would block, a device never end: no breakdown
        return None
    if notes is None:
        notes = _comment_notes(log_path)
    for note in reversed(notes):
        if valid(note):
            return note
    side = os.path.join(os.path.dirname(os.path.abspath(log_path)), FILE_NAME)
    try:
        with open(side, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    start = _run_start_ms(log_path)
    if valid(data) and start is not None and data.get("run_start_ms") == start:
        return data
    return None


def _comment_notes(log_path: str) -> list[dict]:
    marker = f"# mlperf-tf {COMMENT_TAG} "
    notes = []
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                at = line.find(marker)
                if at >= 0:
                    try:
                        notes.append(json.loads(line[at + len(marker) :]))
                    except ValueError:
                        continue
    except OSError:
        return []
    return notes


def _run_start_ms(log_path: str) -> int | None:
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if '"key": "run_start"' in line and ":::MLLOG" in line:
                    record = json.loads(line.split(":::MLLOG", 1)[1])
                    return int(record["time_ms"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None
