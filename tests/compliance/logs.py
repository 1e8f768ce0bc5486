"""Builds small synthetic MLPerf logs (the v0.7+ JSON format) for the compliance tests."""

from __future__ import annotations

import json

T0_MS = 1_600_000_000_000  # 2020-09-13: a run of the v1.0 round


def line(key, value=None, *, time_ms, metadata=None, event_type="POINT_IN_TIME"):
    record = {
        "namespace": "",
        "time_ms": time_ms,
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": {"file": "test.py", "lineno": 1, **(metadata or {})},
    }
    return ":::MLLOG " + json.dumps(record)


_SGD = [
    ("sgd_opt_base_learning_rate", 0.1),
    ("sgd_opt_end_learning_rate", 0.0001),
    ("sgd_opt_learning_rate_decay_poly_power", 2),
    ("sgd_opt_learning_rate_decay_steps", 1000),
    ("sgd_opt_weight_decay", 0.0001),
    ("sgd_opt_momentum", 0.9),
]
_LARS = [
    ("lars_opt_base_learning_rate", 9.0),
    ("lars_opt_end_learning_rate", 0.0001),
    ("lars_opt_learning_rate_decay_poly_power", 2),
    ("lars_opt_learning_rate_decay_steps", 1000),
    ("lars_epsilon", 0.0),
    ("lars_opt_learning_rate_warmup_epochs", 2),
    ("lars_opt_momentum", 0.9),
    ("lars_opt_weight_decay", 0.0001),
]


def resnet_records(
    *,
    accuracies=(0.5, 0.7, 0.76),
    epochs_per_eval=4,
    status="success",
    run_stop=True,
    gbs=256,
    t0_ms=T0_MS,
    optimizer="sgd",
):
    """The records of a closed-division ResNet run that the 0.7.0 and 1.0.0 rules accept.

    Evals at epochs epochs_per_eval, 2*epochs_per_eval, ...: one block of `epochs_per_eval` epochs
    per eval, one minute per block.
    """
    t = t0_ms
    out = []

    def add(key, value=None, metadata=None, advance_ms=1):
        nonlocal t
        out.append(line(key, value, time_ms=t, metadata=metadata))
        t += advance_ms

    add("cache_clear", True)
    add("init_start")
    for key, value in [
        ("submission_benchmark", "resnet"),
        ("submission_org", "mlperf-tf tests"),
        ("submission_division", "closed"),
        ("submission_status", "research"),
        ("submission_platform", "cpu"),
        ("global_batch_size", gbs),
        ("gradient_accumulation_steps", 1),
        ("opt_name", optimizer),
        *(_SGD if optimizer == "sgd" else _LARS),
        ("model_bn_span", 32),
        ("opt_learning_rate_warmup_epochs", 2),
        ("train_samples", 1000),
        ("eval_samples", 100),
    ]:
        add(key, value)
    add("init_stop")
    add("run_start")
    epoch = 0
    for accuracy in accuracies:
        add("block_start", metadata={"first_epoch_num": epoch + 1, "epoch_count": epochs_per_eval})
        for _ in range(epochs_per_eval):
            epoch += 1
            add("epoch_start", metadata={"epoch_num": epoch})
            add("epoch_stop", metadata={"epoch_num": epoch}, advance_ms=60_000 // epochs_per_eval)
        add("block_stop", metadata={"first_epoch_num": epoch + 1 - epochs_per_eval})
        add("eval_start", metadata={"epoch_num": epoch})
        add("eval_stop", metadata={"epoch_num": epoch})
        add("eval_accuracy", accuracy, metadata={"epoch_num": epoch})
    if run_stop:
        add("run_stop", metadata={"status": status})
    return out


def write_log(path, records, *, newline="\n", prefix=""):
    """Writes records (strings) as a log file; returns the path as str."""
    with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as handle:
        for record in records:
            handle.write(prefix + record + newline)
    return str(path)
