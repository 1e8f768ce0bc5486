"""Two MultiWorkerMirroredStrategy workers on 127.0.0.1 sum with the collectives' algorithms and
end at the weights of Keras' own sum on 2 workers (1e-5 relative).

The default case finds its cluster through TF's `SlurmClusterResolver` from the environment
variables Slurm sets for a 2-task step on one node (`--cluster_resolver=slurm`); the slow sweep
uses TF_CONFIG with the other algorithms and optimizers. (TF's MultiWorkerMirroredStrategy uses
one device per worker on a CPU host, so these are 2 workers x 1 replica.)
"""

import json
import os
import socket

import numpy as np
import pytest

from tests import processes
from tests.numerics import assert_close

TIMEOUT_S = 240
RTOL = 1e-5
STEPS = 10


def _npz(path):
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))]


def _two_free_consecutive_ports() -> int:
    for _ in range(50):
        (port,) = processes.free_ports(1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def _tf_config_envs():
    ports = processes.free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    return [
        {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}})}
        for i in range(2)
    ]


def _reference(tmp_path, optimizer):
    """Keras' own sum (the strategy's collectives) on 2 workers: each worker reads the same
    stream, so the reference must be 2 workers too."""
    folder = tmp_path / "reference"
    folder.mkdir()
    chief, _ = _two_workers(folder, [], _tf_config_envs(), optimizer)
    return chief


def _two_workers(tmp_path, fields, envs, optimizer):
    procs, logs = [], []
    try:
        for index, env in enumerate(envs):
            log = str(tmp_path / f"worker{index}.out")
            logs.append(log)
            args = ["-m", "tests.run_tiny", str(tmp_path / "model"), str(tmp_path / f"w{index}.npz"),
                    "distribution=multi_worker", f"max_train_steps={STEPS}",
                    f"steps_per_loop={STEPS}", "startup_timeout_s=60",
                    f"mlperf_log={tmp_path / f'mlperf_log_{index}.txt'}", *fields]  # fmt: skip
            procs.append(processes.start(args, log, TINY_OPTIMIZER=optimizer, **env))
        for proc, log in zip(procs, logs):
            code = processes.wait(proc, TIMEOUT_S, log)
            with open(log, encoding="utf-8", errors="replace") as f:
                assert code == 0, f.read()[-3000:]
    finally:
        for proc in procs:
            processes.kill(proc)
    return _npz(tmp_path / "w0.npz"), _npz(tmp_path / "w1.npz")


def _check(tmp_path, chief, other, optimizer):
    for a, b in zip(chief, other, strict=True):
        np.testing.assert_array_equal(a, b)
    reference = _reference(tmp_path, optimizer)
    for got, want in zip(chief, reference, strict=True):
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * np.abs(want).max())
    with open(tmp_path / "model" / "gradient_summation.json", encoding="utf-8") as f:
        return json.load(f)


# Extended (CI runs it after README's default run); the default run covers its case by
# collectives/test_summer.py (torus2d on 4 devices) and test_multiprocess.py (two workers train to
# identical weights).
@pytest.mark.extended
def test_slurm_two_workers_torus2d_sharded_match_the_plain_sum(tmp_path):
    port = _two_free_consecutive_ports()
    slurm = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "1",
             "SLURM_STEP_NODELIST": "127.0.0.1", "SLURM_STEP_TASKS_PER_NODE": "2"}  # fmt: skip
    envs = [{**slurm, "SLURM_PROCID": str(i), "SLURM_LOCALID": str(i)} for i in range(2)]
    fields = ["cluster_resolver=slurm", f"slurm_port_base={port}", "all_reduce=torus2d",
              "weight_update_sharding=True", "pack_mb=0.001"]  # fmt: skip
    chief, other = _two_workers(tmp_path, fields, envs, "lars")
    metadata = _check(tmp_path, chief, other, "lars")
    assert metadata == {"all_reduce": "torus2d", "mesh": "2x1", "pack_mb": 0.001,
                        "weight_update_sharding": True}  # fmt: skip
    # The MLPerf log carries no invented keys for the choices.
    with open(tmp_path / "mlperf_log_0.txt", encoding="utf-8") as f:
        assert "torus2d" not in f.read()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("optimizer", "algorithm", "sharding"),
    [("sgd", "ring", False), ("lamb", "hierarchical", True), ("lamb", "torus2d", False),
     ("sgd", "auto", True)],
)  # fmt: skip
def test_tf_config_two_workers_match_the_plain_sum(tmp_path, optimizer, algorithm, sharding):
    envs = _tf_config_envs()
    fields = [f"all_reduce={algorithm}", f"weight_update_sharding={sharding}", "pack_mb=0.001"]
    chief, other = _two_workers(tmp_path, fields, envs, optimizer)
    metadata = _check(tmp_path, chief, other, optimizer)
    assert metadata["mesh"] == "2x1"
    assert os.path.exists(tmp_path / "mlperf_log_0.txt")


@pytest.mark.slow
def test_two_workers_sharded_resume_matches_the_unbroken_run(tmp_path):
    # The save all-gathers the slot shards across the workers and the restore re-shards them:
    # 5 steps, a restart of both workers, 5 more end where 10 unbroken steps end.
    fields = ["all_reduce=torus2d", "weight_update_sharding=True", "pack_mb=0.001"]
    (tmp_path / "unbroken").mkdir()
    (tmp_path / "broken").mkdir()
    unbroken, _ = _two_workers(tmp_path / "unbroken", fields, _tf_config_envs(), "lars")
    half = [f"max_train_steps={STEPS // 2}", f"steps_per_loop={STEPS // 2}"]
    _two_workers(tmp_path / "broken", fields + half, _tf_config_envs(), "lars")
    resumed, other = _two_workers(tmp_path / "broken", fields, _tf_config_envs(), "lars")
    with open(tmp_path / "broken" / "worker0.out", encoding="utf-8", errors="replace") as f:
        assert f"steps={STEPS}" in f.read()
    for got, want, mirror in zip(resumed, unbroken, other, strict=True):
        np.testing.assert_array_equal(got, mirror)
        assert_close(got, want, rtol=1e-6)
