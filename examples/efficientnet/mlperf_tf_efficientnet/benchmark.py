"""Provides `EfficientNetBenchmark`: EfficientNet on ImageNet, a plug-in benchmark of mlperf-tf.

It is an image classifier on the same data, loss, eval and optimizer as the suite's ResNet-50,
so it subclasses `ResNet50Benchmark` and changes only the model, the config and the names.
EfficientNet is not an MLPerf benchmark: its logs belong to the open division.
"""

from __future__ import annotations

import dataclasses

import keras

from benchmarks.resnet50.benchmark import ResNet50Benchmark
from mlperf_tf.facts import SimulatorShape, StatedConvergence
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
    # Its facts for `mlperf-tf simulate`, `bench` and `list` (the `Benchmark` contract). No RCP
    # exists: the one point is the `mlperf` preset's recipe (Wongpanich et al. 2020: 350 epochs
    # at global batch 65,536 to 83 % top-1), a stated model, not a measurement.
    convergence = StatedConvergence(
        ((65536, 350.0),),
        "stated model (no RCP): the recipe of Wongpanich et al. 2020, 350 epochs at batch 65,536 "
        "(mlperf_tf_efficientnet EfficientNetBenchmark.convergence)",
    )

    config: config_lib.EfficientNetConfig

    def parameter_count(self) -> int:
        """Trainable parameters of `config.model` from the stage table alone (no weights): the
        stem, each MBConv block (1 x 1 expansion, depthwise k x k, squeeze-excite with biases,
        1 x 1 projection; batch norm's gamma and beta after each convolution), the 1 x 1 head
        and the classifier with its bias."""
        m = self.config.model
        width = m.width

        def conv_bn(fan_in: int, filters: int) -> int:
            return fan_in * filters + 2 * filters

        stem = model_lib.round_filters(model_lib.STEM_FILTERS, width)
        total, channels = conv_bn(3 * 3 * 3, stem), stem
        for spec in model_lib.B0_STAGES:
            out = model_lib.round_filters(spec.filters_out, width)
            for index in range(model_lib.round_repeats(spec.repeats, m.depth)):
                inp = model_lib.round_filters(spec.filters_in, width) if index == 0 else out
                expanded = inp * spec.expand
                squeezed = max(1, int(inp * model_lib.SE_RATIO))
                total += conv_bn(inp, expanded) if spec.expand != 1 else 0
                total += conv_bn(spec.kernel * spec.kernel, expanded)  # depthwise
                total += expanded * squeezed + squeezed + squeezed * expanded + expanded  # SE
                total += conv_bn(expanded, out)
                channels = out
        head = model_lib.round_filters(model_lib.HEAD_FILTERS, width)
        return total + conv_bn(channels, head) + head * m.num_classes + m.num_classes

    def simulator_shape(self) -> SimulatorShape:
        """Data parallelism only: MBConv's halos are not modelled (ResNet-50's convolutions,
        which the base class would describe, are not this model's)."""
        return SimulatorShape()

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
