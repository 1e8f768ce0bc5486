"""Provides `profile_ops`: per-op CPU time of a callable, from a TF profiler trace.

TF's profiler (`tf.profiler.experimental.start/stop`) writes an XSpace (`*.xplane.pb`); on the
CPU each executed TF op is an event named "<op name>:<op type>" on an executor thread
("tf_Compute" lines of the "/host:CPU" plane), whose duration includes waiting for the intra-op
thread pool. Summing them by op type, and by a coarse category of the op name, shows where a
train step spends its time. Ops on different executor threads may overlap, so the sums can
exceed the wall time; compare shares, not absolute sums, across models.

Used by `tools/peers/bench_resnet50.py --profile=DIR`.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import time

import tensorflow as tf

_BN_SCOPE = r"_bn(_\d+)?/|batch_norm"
# Categories, first match wins: (name, predicate on lower-cased (op name, op type)).
CATEGORIES = (
    ("convolution", lambda name, kind: "conv2d" in kind),
    # Keras names a layer's ops after it ("conv1_bn_1/moments/..."), tf_keras "batch_normalization".
    ("batch norm", lambda name, kind: "batchnorm" in kind or re.search(_BN_SCOPE, name)),
    ("optimizer", lambda name, kind: "resourceapply" in kind or "lars" in name or "sgd" in name),
    ("matmul (classifier)", lambda name, kind: "matmul" in kind),
    ("relu", lambda name, kind: "relu" in kind),
    ("pooling", lambda name, kind: "pool" in kind),
    ("add (residual)", lambda name, kind: kind in ("addv2", "add", "addn", "_mklnativeaddv2")),
    ("loss", lambda name, kind: "softmax" in kind or "xent" in name or "cross" in name),
)


def category(name: str, kind: str) -> str:
    """The coarse category of an op ("other" when none matches)."""
    name, kind = name.lower(), kind.lower()
    for label, matches in CATEGORIES:
        if matches(name, kind):
            return label
    return "other"


def read_op_events(logdir: str) -> list[tuple[str, str, float]]:
    """(op name, op type, seconds) of every executed op in the newest trace under `logdir`."""
    # The XSpace proto ships with TF as a generated protobuf module (not a Python API of TF).
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
    if not paths:
        raise FileNotFoundError(f"no *.xplane.pb under {logdir!r}: did the profiler run?")
    space = xplane_pb2.XSpace()
    with open(max(paths, key=os.path.getmtime), "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                label = plane.event_metadata[event.metadata_id].name
                if "::" in label:  # executor bookkeeping (e.g. "ExecutorState::Process")
                    continue
                name, sep, kind = label.rpartition(":")
                if sep and name and kind and not kind.startswith(" "):
                    events.append((name, kind, event.duration_ps * 1e-12))
    return events


def profile_ops(run, steps: int, logdir: str) -> dict:
    """Runs `run(steps)` under TF's profiler; returns wall time and op time by type and category.

    Args:
      run: callable taking a step count (already warmed up, so no tracing is profiled).
      steps: steps to profile.
      logdir: where the trace is written (a fresh folder per call).

    Returns:
      {"wall_s": seconds per step, "by_type": {op type: seconds per step},
       "by_category": {category: seconds per step}, "ops": executed ops per step}.
    """
    tf.profiler.experimental.start(logdir)
    begin = time.perf_counter()
    try:
        run(steps)
    finally:
        wall = time.perf_counter() - begin
        tf.profiler.experimental.stop()
    by_type: dict[str, float] = collections.Counter()
    by_category: dict[str, float] = collections.Counter()
    events = read_op_events(logdir)
    for name, kind, seconds in events:
        by_type[kind] += seconds / steps
        by_category[category(name, kind)] += seconds / steps
    return {
        "wall_s": wall / steps,
        "by_type": dict(by_type),
        "by_category": dict(by_category),
        "ops": len(events) / steps,
    }


def markdown_table(profiles: dict[str, dict], key: str, top: int) -> str:
    """A markdown table of `key` ("by_type" or "by_category"), ms per step, per contestant."""
    names = list(profiles)
    totals = collections.Counter()
    for p in profiles.values():
        totals.update(p[key])
    rows = [r for r, _ in totals.most_common(top)]
    lines = [
        "| " + key.replace("by_", "") + " | " + " | ".join(f"{n} ms/step" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for row in rows:
        cells = [f"{profiles[n][key].get(row, 0.0) * 1e3:.1f}" for n in names]
        lines.append(f"| {row} | " + " | ".join(cells) + " |")
    op_sums = [f"{sum(profiles[n][key].values()) * 1e3:.1f}" for n in names]
    lines.append("| **sum of op time** | " + " | ".join(op_sums) + " |")
    lines.append(
        "| **wall time** | "
        + " | ".join(f"{profiles[n]['wall_s'] * 1e3:.1f}" for n in names)
        + " |"
    )
    lines.append(
        "| ops executed | " + " | ".join(f"{profiles[n]['ops']:.0f}" for n in names) + " |"
    )
    return "\n".join(lines)
