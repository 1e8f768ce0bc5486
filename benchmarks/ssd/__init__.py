"""Provides the MLPerf SSD-ResNet34 object-detection benchmark (`SSDBenchmark`)."""

from benchmarks.ssd.benchmark import SSDBenchmark

__all__ = ["SSDBenchmark"]
