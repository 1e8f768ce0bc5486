"""Test-session set-up: quiet TF, and the CPU split into 4 logical devices for cross-replica tests."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf  # noqa: E402

NUM_TEST_CPU_DEVICES = 4


def _split_cpu():
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_CPU_DEVICES
        )
    except RuntimeError:  # devices already initialized by an earlier import: keep what exists
        pass


_split_cpu()


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=None,
        help="hypothesis examples for the fuzz tests (sets MLPERF_TF_FUZZ_EXAMPLES)",
    )


def pytest_configure(config):
    examples = config.getoption("--fuzz-examples")
    if examples is not None:
        os.environ["MLPERF_TF_FUZZ_EXAMPLES"] = str(examples)
