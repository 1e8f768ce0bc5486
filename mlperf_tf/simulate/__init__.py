"""Provides `mlperf-tf simulate`: step time and time to train of the suite's benchmarks at scale."""
