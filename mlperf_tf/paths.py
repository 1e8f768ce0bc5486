"""Provides the default locations of the suite's offline mini datasets and user caches."""

import os

DATA_ENV = "MLPERF_TF_DATA"


def data_root() -> str:
    """The folder for generated datasets: `$MLPERF_TF_DATA`, default `~/.cache/mlperf_tf`."""
    return os.environ.get(DATA_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "mlperf_tf")


def user_flops_cache() -> str:
    """The user's FLOPs cache (plug-in benchmarks): `<data_root>/flops.json`, outside the package."""
    return os.path.join(data_root(), "flops.json")


def mini_data_dir(benchmark_name: str) -> str:
    """Where the `mini` preset of `benchmark_name` keeps its offline data by default."""
    return os.path.join(data_root(), f"{benchmark_name}-mini")
