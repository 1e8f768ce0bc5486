"""Provides the MLPerf ResNet-50 v1.5 image-classification benchmark (`ResNet50Benchmark`)."""

from benchmarks.resnet50.benchmark import ResNet50Benchmark

__all__ = ["ResNet50Benchmark"]
