"""Provides the default locations of the suite's offline mini datasets."""

import os

DATA_ENV = "MLPERF_TF_DATA"


def data_root() -> str:
    """The folder for generated datasets: `$MLPERF_TF_DATA`, default `~/.cache/mlperf_tf`."""
    return os.environ.get(DATA_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "mlperf_tf")


def mini_data_dir(benchmark_name: str) -> str:
    """Where the `mini` preset of `benchmark_name` keeps its offline data by default."""
    return os.path.join(data_root(), f"{benchmark_name}-mini")
