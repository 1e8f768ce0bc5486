"""Tests of strategy resolution: TF_CONFIG validation, bounded peer rendezvous, dtype policies."""

import json
import time

import pytest
import tensorflow as tf

from mlperf_tf import distribute, precision, runner
from mlperf_tf.errors import UserError
from tests import processes
from tests.tiny_benchmark import TinyBenchmark, smoke


def test_bad_tf_config_is_a_user_error(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(UserError, match="TF_CONFIG is not valid JSON"):
        distribute.parse_tf_config()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {}}))
    with pytest.raises(UserError, match="'cluster' and 'task'"):
        distribute.parse_tf_config()


def test_unknown_distribution_is_a_user_error():
    with pytest.raises(UserError, match="--distribution='gpus'"):
        distribute.resolve_strategy("gpus")


def test_missing_peer_fails_within_the_deadline_and_names_it():
    own, peer = processes.free_ports(2)
    tf_config = {
        "cluster": {"worker": [f"127.0.0.1:{own}", f"127.0.0.1:{peer}"]},
        "task": {"type": "worker", "index": 0},
    }
    begin = time.monotonic()
    with pytest.raises(UserError, match=f"worker:1 at 127.0.0.1:{peer} not reachable within 1 s"):
        distribute.wait_for_peers(tf_config, timeout_s=1)
    assert time.monotonic() - begin < 10


def test_auto_picks_mirrored_for_several_cpu_devices_and_one_device_otherwise():
    mirrored = distribute.resolve_strategy("auto", num_cpu_devices=2)
    assert isinstance(mirrored, tf.distribute.MirroredStrategy)
    assert mirrored.num_replicas_in_sync == 2
    assert isinstance(distribute.resolve_strategy("auto"), tf.distribute.OneDeviceStrategy)


def test_fp16_trains_with_loss_scaling(tmp_path):
    try:
        result = runner.run(
            TinyBenchmark(smoke()),
            runner.RunConfig(
                model_dir=str(tmp_path),
                dtype="fp16",
                distribution="one_device",
                max_train_steps=3,
                steps_per_loop=3,
            ),  # fmt: skip
        )
        assert result.steps == 3
        assert result.model.layers[1].compute_dtype == "float16"
        assert result.model.layers[1].kernel.dtype == "float32"
    finally:
        precision.set_policy("fp32")
    with pytest.raises(UserError, match="--dtype='int8'"):
        precision.set_policy("int8")


def test_unreachable_tpu_address_is_a_clear_error_within_the_deadline():
    (port,) = processes.free_ports(1)
    begin = time.monotonic()
    with pytest.raises(UserError, match=f"TPU worker at grpc://127.0.0.1:{port} not reachable"):
        distribute.resolve_strategy("tpu", tpu=f"grpc://127.0.0.1:{port}", timeout_s=1)
    assert time.monotonic() - begin < 10
