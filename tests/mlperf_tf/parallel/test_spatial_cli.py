"""`--spatial_partition` bad input through `mlperf-tf run`: one `error:` line, exit 2, nothing
written. In this process (`cli.main`, as `tests/test_cli_fuzz.py` runs its refusals): the refusal
comes before any step, and a separate interpreter would add only its TF import (13 s a case on
a 2-core Zen 1). The refused run in its own process, where a layout error leaves with
`os._exit`, is `collectives/test_cli.py`'s wrong mesh."""

import pytest

from mlperf_tf import cli
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
def test_bad_spatial_partition_is_one_error_line(argv, needle, tmp_path, capsys):
    model_dir = tmp_path / "run"
    code = cli.main(["run", "--preset=smoke", f"--model_dir={model_dir}",
                     "--num_cpu_devices=4", *argv])  # fmt: skip
    assert needle in the_error_line(capsys.readouterr().err, code, 2)
    assert not model_dir.exists() or not any(model_dir.iterdir()), "a refused run wrote files"
