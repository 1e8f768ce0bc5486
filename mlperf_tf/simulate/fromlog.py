"""Provides what `mlperf-tf simulate --from_log LOG` reads of a published MLPerf log: the
benchmark, the system, the chips, the global batch and (MLPerf 6.1 and later) the disclosed
parallelism and number format, so that the simulator predicts that run.

The system is found by the accelerator the log's `submission_platform` names ("18xNVIDIA
GB200": 18 nodes of GB200), matched against each built-in system's `platform_names`, the longest
name first (GB200 before B200); the chips are the nodes times the system's chips per node (a
tray of an NVL72 rack). Flags given beside `--from_log` override what the log says.
"""

from __future__ import annotations

import re
from typing import Any

from mlperf_logging.mllog import constants as mllog

from mlperf_tf.errors import UserError
from mlperf_tf.facts import normalize_format
from mlperf_tf.simulate import systems
from mlperf_tf.sweep import read_mlperf_log

# Disclosed layout keys (MLPerf 6.1 `closed_common.yaml`) -> the simulator's arguments.
LAYOUT_KEYS = {
    mllog.TENSOR_PARALLELISM: "model_parallel",
    mllog.PIPELINE_PARALLELISM: "pipeline_parallel",
    mllog.CONTEXT_PARALLELISM: "context_parallel",
    mllog.EXPERT_PARALLELISM: "expert_parallel",
}
_PLATFORM = re.compile(r"^\s*(\d+)\s*x\s*(.+?)\s*$")


def _values(path: str) -> dict[str, Any]:
    """The first value of each POINT_IN_TIME key of the log."""
    values: dict[str, Any] = {}
    for event in read_mlperf_log(path):
        if event.get("event_type") == "POINT_IN_TIME":
            values.setdefault(event.get("key"), event.get("value"))
    return values


def system_for(accelerator: str) -> str:
    """The built-in system whose `platform_names` the accelerator name contains (longest first).

    Raises:
      UserError: none does (the message lists what each system matches).
    """
    names = []
    for name in systems.available():
        for token in systems.load(name).platform_names:
            names.append((token, name))
    for token, name in sorted(names, key=lambda t: -len(t[0])):
        if token.lower() in accelerator.lower():
            return name
    known = ", ".join(f"{t} ({n})" for t, n in sorted(names))
    raise UserError(
        f"--from_log: no built-in system runs '{accelerator}' (known: {known}); give --system"
    )


def read_run(path: str, system: str | None = None) -> dict[str, Any]:
    """The `simulate` arguments of the run a log records: benchmark, system, chips,
    global_batch, and the disclosed layout and precision where the log has them.

    Raises:
      UserError: the log lacks the benchmark, the platform or the global batch.
    """
    values = _values(path)
    missing = [
        key
        for key in (mllog.SUBMISSION_BENCHMARK, mllog.SUBMISSION_PLATFORM, mllog.GLOBAL_BATCH_SIZE)
        if key not in values
    ]
    if missing:
        raise UserError(f"--from_log {path!r}: the log has no {', '.join(missing)}")
    platform = str(values[mllog.SUBMISSION_PLATFORM])
    match = _PLATFORM.match(platform)
    nodes, accelerator = (int(match.group(1)), match.group(2)) if match else (1, platform)
    name = system or system_for(accelerator)
    per_node = int(systems.load(name).topology.get("chips_per_node", 1))
    run: dict[str, Any] = {
        "benchmark": str(values[mllog.SUBMISSION_BENCHMARK]),
        "system": name,
        "chips": nodes * per_node,
        "global_batch": int(values[mllog.GLOBAL_BATCH_SIZE]),
    }
    for key, arg in LAYOUT_KEYS.items():
        if key in values:
            run[arg] = int(values[key])
    if mllog.LOWEST_NUMERICAL_PRECISION_IN_LINEAR in values:
        run["precision"] = normalize_format(values[mllog.LOWEST_NUMERICAL_PRECISION_IN_LINEAR])
    if mllog.LOWEST_NUMERICAL_PRECISION_IN_ATTN in values:
        attention = values[mllog.LOWEST_NUMERICAL_PRECISION_IN_ATTN]
        run["attention_precision"] = normalize_format(attention)
    return run
