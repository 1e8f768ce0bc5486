"""Test-session set-up: quiet TF, the CPU split into 4 logical devices for cross-replica tests,
bfloat16 tests skipped when oneDNN is capped below the instruction sets that have bfloat16, and
how many test processes `-n auto` starts."""

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

NUM_TEST_CPU_DEVICES = 4


def _split_cpu():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_TEST_CPU_DEVICES
        )
    except RuntimeError:  # devices already initialized by an earlier import: keep what exists
        pass


def _is_xdist_controller(config) -> bool:
    """The process `-n N` starts its test processes from: it runs no test and collects none, so
    it need not import TF (about 8 s before the test processes start, measured here)."""
    workers = getattr(config.option, "numprocesses", None)
    return not hasattr(config, "workerinput") and workers not in (None, 0)


def pytest_addoption(parser):
    parser.addoption(
        "--fuzz-examples",
        type=int,
        default=None,
        help="hypothesis examples for the fuzz tests (sets MLPERF_TF_FUZZ_EXAMPLES)",
    )


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) without bfloat16 kernels. TF picks oneDNN's bfloat16 ops
# from the CPU's own flags, not from the cap, so on an AVX-512 CPU capped to AVX2 a bfloat16 matmul
# aborts the process ("could not create a primitive descriptor for the matmul primitive"). A real
# AVX2-only CPU runs bfloat16 in TF's own kernels instead: CI's TF_ENABLE_ONEDNN_OPTS=0 run covers
# those.
_NO_BF16_ISAS = ("SSE41", "AVX", "AVX2", "AVX2_VNNI")


def pytest_collection_modifyitems(config, items):
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap not in _NO_BF16_ISAS:
        return
    skip = pytest.mark.skip(reason=f"bfloat16 ops abort under ONEDNN_MAX_CPU_ISA={cap}")
    for item in items:
        if "bfloat16" in item.keywords:
            item.add_marker(skip)


# `-n auto` (pyproject's addopts): one test process per core, at most 4. Each process imports TF
# and holds its own runs (1-3 GB at the test shapes), and the multi-process tests start two more
# workers of their own: beyond 4 the memory grows and the run gains little.
MAX_TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config):
    return max(1, min(len(os.sched_getaffinity(0)), MAX_TEST_PROCESSES))


def pytest_configure(config):
    # Before any test module imports TF (collection comes after `pytest_configure`).
    if not _is_xdist_controller(config):
        _split_cpu()
    examples = config.getoption("--fuzz-examples")
    if examples is not None:
        os.environ["MLPERF_TF_FUZZ_EXAMPLES"] = str(examples)
