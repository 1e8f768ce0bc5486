"""Provides `main` of `mlperf-tf prepare efficientnet`: ImageNet folders to TFRecords.

EfficientNet reads the same TFRecords as ResNet-50, so this is ResNet-50's converter.
"""

from benchmarks.resnet50.prepare import main

__all__ = ["main"]
