"""Provides `EfficientNetBenchmark`: EfficientNet on ImageNet, a plug-in benchmark of mlperf-tf.

It is an image classifier on the same data, loss, eval and optimizer as the suite's ResNet-50,
so it subclasses `ResNet50Benchmark` and changes only the model, the config and the names.
EfficientNet is not an MLPerf benchmark: its logs belong to the open division.
"""

from __future__ import annotations

import dataclasses

import keras

from benchmarks.resnet50.benchmark import ResNet50Benchmark
from mlperf_tf_efficientnet import config as config_lib
from mlperf_tf_efficientnet import model as model_lib


class EfficientNetBenchmark(ResNet50Benchmark):
    """EfficientNet-B0..B7 trained with LARS, distributed batch norm and label smoothing.

    Batches are ResNet-50's: "image" float32 `[batch, size, size, 3]`, "label" int32 `[batch]`
    and, in eval, "valid" float32 `[batch]`.
    """

    name = config_lib.NAME
    mlperf_benchmark = config_lib.NAME  # not an MLPerf benchmark name: checked as open division
    config_class = config_lib.EfficientNetConfig
    presets = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}

    config: config_lib.EfficientNetConfig

    def __init__(self, config: config_lib.EfficientNetConfig, *args, **kwargs):
        if isinstance(config, config_lib.EfficientNetConfig):
            # The input pipeline reads `data.image_size`: make it the resolved resolution.
            data = dataclasses.replace(config.data, image_size=config.resolution)
            config = dataclasses.replace(config, data=data)
        super().__init__(config, *args, **kwargs)

    def build_model(self) -> keras.Model:
        """EfficientNet of `config.model` at `config.resolution` (under the strategy scope)."""
        return model_lib.efficientnet(
            self.config.model, image_size=self.config.resolution, seed=self.seed
        )

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes ResNet-50's digits mini dataset (ImageNet-format TFRecords) into `data_dir`."""
        from benchmarks.resnet50 import prepare  # imported here: scikit-learn only when needed

        prepare.prepare_mini(data_dir)
