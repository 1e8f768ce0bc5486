"""SIGTERM/SIGINT stop a run inside a long host loop with a checkpoint; the resume matches.

Subprocesses on 127.0.0.1 only; every wait is bounded; processes are killed by pid in `finally`.
"""

import json
import os
import signal
import time

import numpy as np
import pytest
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from mlperf_tf import errors
from tests import processes
from tests.numerics import assert_close

TIMEOUT_S = 240
# 3,000 steps in one block with one host loop of up to 3,000 steps: a stop must cut the loop short.
STEPS = 3000
LONG_LOOP = [f"steps_per_loop={STEPS}", "checkpoint_every_loops=0", "checkpoint_every_minutes=0"]
ENV = {"TINY_MAX_EPOCHS": "300", "TINY_EVAL_EVERY_EPOCHS": "300"}


def _npz(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _log_records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in f if ":::MLLOG" in line]


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _run_tiny(model_dir, weights, log, *fields, env=ENV):
    args = ["-m", "tests.run_tiny", str(model_dir), str(weights), "distribution=one_device",
            *LONG_LOOP, *fields]  # fmt: skip
    return processes.start(args, log, **env)


def _wait_for_training(proc, log):
    # The first loop is one step: its progress line says the loop is compiled and training.
    processes.wait_until(
        lambda: "first step done" in _read(log) or proc.poll() is not None, TIMEOUT_S,
        "the first progress line",
    )  # fmt: skip
    assert proc.poll() is None, _read(log)[-3000:]


# Extended (CI runs SIGTERM after README's default run): the default run covers a signal
# stopping a run at its next step in faults/test_fail_safe.py and a stop across two workers in
# test_sigterm_to_one_worker_stops_both_after_the_same_step.
@pytest.mark.parametrize(
    "signum",
    [pytest.param(signal.SIGTERM, marks=pytest.mark.extended),
     pytest.param(signal.SIGINT, marks=pytest.mark.slow)],
)  # fmt: skip
def test_a_signal_stops_inside_a_long_loop_saves_and_the_resume_matches(tmp_path, signum):
    unbroken_log = str(tmp_path / "unbroken.out")
    proc = _run_tiny(tmp_path / "unbroken", tmp_path / "u.npz", unbroken_log)
    try:
        assert processes.wait(proc, TIMEOUT_S, unbroken_log) == 0, _read(unbroken_log)[-3000:]
    finally:
        processes.kill(proc)

    model_dir, log = tmp_path / "broken", str(tmp_path / "broken.out")
    proc = _run_tiny(model_dir, tmp_path / "b.npz", log)
    try:
        _wait_for_training(proc, log)
        time.sleep(0.5)
        sent = time.monotonic()
        os.kill(proc.pid, signum)
        code = processes.wait(proc, TIMEOUT_S, log)
        seconds = time.monotonic() - sent
    finally:
        processes.kill(proc)
    text = _read(log)
    assert code == errors.EXIT_INTERRUPTED, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert f"{signal.Signals(signum).name}: stopping at the next step boundary" in text
    stopped_at = int(text.split("cause=interrupted")[0].rsplit("steps=", 1)[1])
    assert 1 < stopped_at < STEPS, "the loop was not cut short"
    assert seconds < 60
    latest = tf.train.latest_checkpoint(str(model_dir / "ckpt"))
    assert latest.endswith(f"ckpt-{stopped_at}"), latest
    records = _log_records(model_dir / "mlperf_log.txt")
    assert [r["key"] for r in records[-2:]] == [C.BLOCK_STOP, C.RUN_STOP]
    assert records[-1]["metadata"]["status"] == C.ABORTED
    first_run_start = next(r["time_ms"] for r in records if r["key"] == C.RUN_START)

    proc = _run_tiny(model_dir, tmp_path / "b.npz", log + ".2")
    try:
        assert processes.wait(proc, TIMEOUT_S, log + ".2") == 0, _read(log + ".2")[-3000:]
    finally:
        processes.kill(proc)
    assert f"steps={STEPS}" in _read(log + ".2")
    for a, b in zip(_npz(tmp_path / "u.npz"), _npz(tmp_path / "b.npz"), strict=True):
        assert_close(a, b, rtol=1e-6)
    # The resumed log is honest: marked, with the first attempt's run_start, and its block
    # starts where the checkpoint was (10 steps per epoch: epoch 1 + stopped_at / 10).
    resumed_text = _read(model_dir / "mlperf_log.txt")
    marker = json.dumps({"step": stopped_at, "original_run_start_ms": first_run_start})
    assert f"# mlperf-tf resumed {marker}" in resumed_text
    resumed = _log_records(model_dir / "mlperf_log.txt")
    assert next(r["time_ms"] for r in resumed if r["key"] == C.RUN_START) == first_run_start
    block = next(r for r in resumed if r["key"] == C.BLOCK_START)
    first_epoch = 1 + stopped_at / 10
    assert block["metadata"][C.FIRST_EPOCH_NUM] == pytest.approx(first_epoch)
    assert block["metadata"][C.EPOCH_COUNT] == pytest.approx(301 - first_epoch)


def test_a_second_signal_stops_at_once(tmp_path):
    log = str(tmp_path / "twice.out")
    env = {"TINY_MAX_EPOCHS": "100000", "TINY_EVAL_EVERY_EPOCHS": "100000"}
    # The stop flag is read before each step; a save of the stopped step can still be slow, so
    # the second signal is sent at once: it must end the process whatever it is doing.
    proc = _run_tiny(tmp_path / "m", tmp_path / "w.npz", log, env=env)
    try:
        _wait_for_training(proc, log)
        os.kill(proc.pid, signal.SIGINT)
        os.kill(proc.pid, signal.SIGINT)
        code = processes.wait(proc, 60, log)
    finally:
        processes.kill(proc)
    text = _read(log)
    assert code in (errors.EXIT_KILLED_AT_ONCE, errors.EXIT_INTERRUPTED), text[-3000:]
    if code == errors.EXIT_KILLED_AT_ONCE:
        assert "error: stopped at once by a second SIGINT" in text
    assert "Traceback" not in text


def test_sigterm_to_one_worker_stops_both_after_the_same_step(tmp_path):
    """Only worker 1 is signaled; the per-step all-reduce of the stop flag stops worker 0 too,
    after the same step, both with a checkpoint (the chief's is kept) and exit code 3."""
    ports = processes.free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs, logs = [], []
    try:
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            log = str(tmp_path / f"worker{index}.out")
            args = ["-m", "tests.run_tiny", str(tmp_path / "model"), str(tmp_path / f"w{index}.npz"),
                    "distribution=multi_worker", *LONG_LOOP, "startup_timeout_s=90",
                    f"mlperf_log={tmp_path / f'mlperf_log_{index}.txt'}"]  # fmt: skip
            procs.append(processes.start(args, log, TF_CONFIG=tf_config, **ENV))
            logs.append(log)
        _wait_for_training(procs[0], logs[0])
        time.sleep(5.0)
        os.kill(procs[1].pid, signal.SIGTERM)
        codes = [processes.wait(proc, TIMEOUT_S, log) for proc, log in zip(procs, logs)]
    finally:
        for proc in procs:
            processes.kill(proc)
    texts = [_read(log) for log in logs]
    assert codes == [errors.EXIT_INTERRUPTED] * 2, [t[-2000:] for t in texts]
    steps = [int(t.split("cause=interrupted")[0].rsplit("steps=", 1)[1]) for t in texts]
    assert steps[0] == steps[1] and 1 < steps[0] < STEPS, steps  # inside the long loop
    for a, b in zip(_npz(tmp_path / "w0.npz"), _npz(tmp_path / "w1.npz"), strict=True):
        np.testing.assert_array_equal(a, b)
    latest = tf.train.latest_checkpoint(str(tmp_path / "model" / "ckpt"))
    assert latest.endswith(f"ckpt-{steps[0]}"), latest
    records = _log_records(tmp_path / "mlperf_log_0.txt")
    assert records[-1]["key"] == C.RUN_STOP and records[-1]["metadata"]["status"] == C.ABORTED
