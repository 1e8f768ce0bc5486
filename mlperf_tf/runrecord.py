"""Provides the record of what a run is (`<model_dir>/run.json`: benchmark, preset, config), and
the check that refuses to resume a folder holding another run, before any file is touched.

A run writes the record when it starts (the chief, after every start-up check passed). A later
run in the same folder compares itself with it: another benchmark, another preset's model, or a
config whose fields differ would restore a checkpoint that is not its own (at best a cryptic
"incompatible tensor" error, at worst a silently wrong run), so it is refused with one line
saying what the folder holds and what was asked. Folders of earlier versions hold no record:
their MLPerf log's `submission_benchmark` is compared instead.

No TensorFlow here: the check runs before the strategy is built.
"""

from __future__ import annotations

import json
import os
from typing import Any

from mlperf_tf.errors import UserError

RECORD_NAME = "run.json"
# Config fields a resumed run may change: where the same data lives.
RESUMABLE_CHANGES = frozenset({"data_dir"})
_SHOWN = 4  # differing fields named in the message


def _plain(value: Any) -> Any:
    """`value` as JSON would give it back (tuples as lists, anything else as its text)."""
    return json.loads(json.dumps(value, default=str))


def config_fields(config) -> dict[str, Any]:
    """The config's leaf fields (dotted path -> JSON value)."""
    from mlperf_tf import config as config_lib

    return {key: _plain(value) for key, value in config_lib.field_paths(config).items()}


def preset_of(benchmark_class, config) -> tuple[str, list[str]]:
    """The preset `config` is closest to, and the fields it changes of it (sorted)."""
    fields = config_fields(config)
    best: tuple[str, list[str]] | None = None
    for name in getattr(benchmark_class, "presets", {}):
        try:
            preset = config_fields(benchmark_class.preset(name))
        except Exception:  # noqa: BLE001 (a preset that cannot be built here is not this run's)
            continue
        changed = sorted(k for k in fields if preset.get(k) != fields[k])
        if best is None or len(changed) < len(best[1]):
            best = (name, changed)
    return best or ("", sorted(fields))


def describe(benchmark) -> dict[str, Any]:
    """The record of a run of `benchmark` (its class's name, the nearest preset, the config)."""
    preset, changed = preset_of(type(benchmark), benchmark.config)
    return {
        "benchmark": benchmark.name,
        "preset": preset,
        "overrides": changed,
        "config": config_fields(benchmark.config),
    }


def record_path(model_dir: str) -> str:
    return os.path.join(model_dir, RECORD_NAME)


def read(model_dir: str) -> dict[str, Any] | None:
    """The record in `model_dir`, or None (none there).

    Raises:
      UserError: a record that cannot be read or parsed (the message names it).
    """
    path = record_path(model_dir)
    if not os.path.lexists(path):
        return None
    from mlperf_tf import paths

    text = paths.read_input(path, "--model_dir record")
    try:
        data = json.loads(text)
    except ValueError as e:
        raise UserError(
            f"--model_dir: the run record {path!r} is not valid JSON ({e}); move it away to "
            "resume without the check"
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise UserError(f"--model_dir: the run record {path!r} is not a run record")
    return data


def write(model_dir: str, record: dict[str, Any]) -> None:
    """Writes the record atomically (a temporary file, then a rename)."""
    path = record_path(model_dir)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def _label(record: dict[str, Any]) -> str:
    """`ssd (preset smoke, 2 fields changed)`."""
    text = str(record.get("benchmark", "?"))
    if record.get("preset"):
        changed = len(record.get("overrides") or [])
        more = f", {changed} field{'s' if changed != 1 else ''} changed" if changed else ""
        text += f" (preset {record['preset']}{more})"
    return text


def differences(held: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """`key (held -> asked)` of every config field that differs, resumable changes aside."""
    old, new = held.get("config", {}), asked.get("config", {})
    keys = sorted((set(old) | set(new)) - RESUMABLE_CHANGES)
    missing = object()
    out = []
    for key in keys:
        a, b = old.get(key, missing), new.get(key, missing)
        if a != b:
            shown_a = "unset" if a is missing else json.dumps(a)
            shown_b = "unset" if b is missing else json.dumps(b)
            out.append(f"{key} ({shown_a} -> {shown_b})")
    return out


def check_same_run(model_dir: str, asked: dict[str, Any], *, logged_benchmark: str = "") -> None:
    """Refuses to resume `model_dir` when it holds another run than `asked` (see the module doc).

    Args:
      model_dir: the run's folder.
      asked: `describe(benchmark)` of the run to start.
      logged_benchmark: for a folder without a record, the `submission_benchmark` of its log
        ("" when there is none); `asked` has it as `mlperf_benchmark`.

    Raises:
      UserError: the folder holds another benchmark's run or one with another config; the
        message names both and the fields that differ.
    """
    held = read(model_dir)
    fix = (
        "pass --restart to start a new run there (the old one is kept under new names), or "
        "use another --model_dir"
    )
    if held is None:
        wanted = asked.get("mlperf_benchmark", "")
        if logged_benchmark and wanted and logged_benchmark != wanted:
            raise UserError(
                f"--model_dir={model_dir!r} holds a run of MLPerf benchmark {logged_benchmark!r} "
                f"(its log says so); asked: {_label(asked)}, which is {wanted!r}: {fix}"
            )
        return
    if held.get("benchmark") != asked["benchmark"]:
        raise UserError(
            f"--model_dir={model_dir!r} holds a run of {_label(held)}; asked: {_label(asked)}: "
            f"{fix}"
        )
    changed = differences(held, asked)
    if changed:
        more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
        raise UserError(
            f"--model_dir={model_dir!r} holds a run of {_label(held)}; asked: {_label(asked)}, "
            f"which differs in {', '.join(changed[:_SHOWN])}{more}: {fix}"
        )
