"""`--spatial_partition` bad input through the `mlperf-tf` command: one `error:` line, exit 2."""

import subprocess
import sys

import pytest

from tests import processes
from tests.refusals import the_error_line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (
            ["--benchmark=bert", "--spatial_partition=2"],
            "--spatial_partition: benchmark 'bert' does not support spatial parallelism",
        ),
        (
            ["--benchmark=resnet50", "--spatial_partition=3"],
            "--spatial_partition=3 needs a multiple of 3 replicas; this run has 4",
        ),
    ],
)
def test_bad_spatial_partition_is_one_error_line(argv, needle, tmp_path):
    ran = subprocess.run(
        [sys.executable, "-m", "mlperf_tf.cli", "run", "--preset=smoke",
         f"--model_dir={tmp_path}", "--num_cpu_devices=4", *argv],
        cwd=processes.REPO_ROOT, env=processes.python_env(), capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert needle in the_error_line(ran.stderr, ran.returncode, 2), ran.stderr[-3000:]
