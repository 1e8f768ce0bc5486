"""Multi-process runner tests: two MultiWorkerMirroredStrategy workers, and a SIGKILLed resume.

Only 127.0.0.1; every wait is bounded; processes are killed by pid (process group) in `finally`.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests import processes
from tests.numerics import assert_close
from tests.refusals import the_error_line

TIMEOUT_S = 240


def _npz(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def test_two_workers_train_to_identical_weights_and_only_the_chief_logs(tmp_path):
    processes.run_workers(
        lambda index: [
            "-m", "tests.run_tiny", str(tmp_path / "model"), str(tmp_path / f"w{index}.npz"),
            "distribution=multi_worker", "max_train_steps=3", "steps_per_loop=3",
            f"mlperf_log={tmp_path / f'mlperf_log_{index}.txt'}", "startup_timeout_s=60",
        ],
        tmp_path,
        TIMEOUT_S,
    )  # fmt: skip
    chief, other = _npz(tmp_path / "w0.npz"), _npz(tmp_path / "w1.npz")
    for a, b in zip(chief, other, strict=True):
        np.testing.assert_array_equal(a, b)
    assert os.path.getsize(tmp_path / "mlperf_log_0.txt") > 0
    assert not os.path.exists(tmp_path / "mlperf_log_1.txt")


def test_a_missing_peer_is_a_clear_error_within_the_timeout(tmp_path):
    ports = processes.free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
    log = str(tmp_path / "alone.out")
    proc = processes.start(
        ["-m", "mlperf_tf.cli", "run", "--benchmark=resnet50", "--preset=smoke",
         f"--model_dir={tmp_path / 'm'}", "--distribution=multi_worker", "--startup_timeout=3"],
        log, TF_CONFIG=tf_config,
    )  # fmt: skip
    try:
        code = processes.wait(proc, 90, log)
    finally:
        processes.kill(proc)
    with open(log, encoding="utf-8") as f:
        text = f.read()
    assert f"127.0.0.1:{ports[1]}" in the_error_line(text, code, 2), text


# Extended (CI runs it after README's default run); the default run covers its case by
# faults/test_checkpoints.py (a kill during a save leaves a restorable checkpoint) and
# test_sharded_resume.py (a resume matches the unbroken run).
@pytest.mark.extended
def test_sigkill_after_the_second_checkpoint_then_resume_matches_an_unbroken_run(tmp_path):
    common = ["distribution=one_device", "steps_per_loop=2", "checkpoint_every_loops=1"]
    env = {"TINY_MAX_EPOCHS": "8"}  # 80 steps: long enough to be killed mid-run
    unbroken_log = str(tmp_path / "unbroken.out")
    broken_dir = tmp_path / "broken"
    broken_log = str(tmp_path / "broken.out")
    proc = processes.start(
        ["-m", "tests.run_tiny", str(tmp_path / "unbroken"), str(tmp_path / "u.npz"), *common],
        unbroken_log, **env,
    )  # fmt: skip
    try:
        assert processes.wait(proc, TIMEOUT_S, unbroken_log) == 0
    finally:
        processes.kill(proc)

    def checkpoints():
        state = tf.train.get_checkpoint_state(str(broken_dir / "ckpt"))
        return len(state.all_model_checkpoint_paths) if state else 0

    proc = processes.start(
        ["-m", "tests.run_tiny", str(broken_dir), str(tmp_path / "b.npz"), *common],
        broken_log, **env,
    )  # fmt: skip
    try:
        processes.wait_until(lambda: checkpoints() >= 2 or proc.poll() is not None, TIMEOUT_S,
                             "the second checkpoint")  # fmt: skip
        processes.kill(proc)
    finally:
        processes.kill(proc)
    assert checkpoints() >= 2
    assert not os.path.exists(tmp_path / "b.npz"), "the run finished before it could be killed"
    killed_at = tf.train.latest_checkpoint(str(broken_dir / "ckpt"))

    proc = processes.start(
        ["-m", "tests.run_tiny", str(broken_dir), str(tmp_path / "b.npz"), *common],
        broken_log + ".2", **env,
    )  # fmt: skip
    try:
        assert processes.wait(proc, TIMEOUT_S, broken_log + ".2") == 0
    finally:
        processes.kill(proc)
    with open(broken_log + ".2", encoding="utf-8") as f:
        assert "steps=80" in f.read()
    assert int(killed_at.rsplit("-", 1)[1]) < 80
    for a, b in zip(_npz(tmp_path / "u.npz"), _npz(tmp_path / "b.npz"), strict=True):
        assert_close(a, b, rtol=1e-6)
