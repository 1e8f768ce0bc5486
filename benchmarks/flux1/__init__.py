"""MLPerf flux1: FLUX.1-schnell text-to-image training by rectified flow (validation loss)."""

from benchmarks.flux1.benchmark import FluxBenchmark

__all__ = ["FluxBenchmark"]
