"""Provides `ResNet50Benchmark`: MLPerf image classification (ResNet-50 v1.5 on ImageNet)."""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf
from mlperf_logging.mllog import constants as C

from benchmarks.resnet50 import config as config_lib
from benchmarks.resnet50 import input as input_lib
from benchmarks.resnet50 import model as model_lib
from mlperf_tf import layers
from mlperf_tf.benchmark import Benchmark, eval_ratio
from mlperf_tf.facts import Calibration, Conv, Rcp, SimulatorShape
from mlperf_tf.optimizers import WarmupPolynomialDecay, registry
from mlperf_tf.spmd import SpatialLayout

# MLPerf log keys of the closed_resnet_sgd rules that `mlperf_logging.mllog.constants` lacks.
SGD_OPT_BASE_LR = "sgd_opt_base_learning_rate"
SGD_OPT_END_LR = "sgd_opt_end_learning_rate"
SGD_OPT_LR_DECAY_POLY_POWER = "sgd_opt_learning_rate_decay_poly_power"
SGD_OPT_LR_DECAY_STEPS = "sgd_opt_learning_rate_decay_steps"
SGD_OPT_WEIGHT_DECAY = "sgd_opt_weight_decay"
SGD_OPT_MOMENTUM = "sgd_opt_momentum"
OPT_LR_DECAY_POLY_POWER = "opt_learning_rate_decay_poly_power"  # registry optimizers


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    Calibration(("tpu-v3",), 0.375, "bf16", "MLPerf v0.7 Google/results/tpu-v3-32-TF2.0/resnet",
                per_chip_batch=32, input_samples_per_s_per_host=8000),
    Calibration(("tpu-v4",), 0.3321, "bf16", "MLPerf v0.7 Google/results/tpu-v4-16-TF/resnet",
                per_chip_batch=64, input_samples_per_s_per_host=20000),
    Calibration(("ampere",), 0.2354, "fp16",
                "MLPerf v0.7 NVIDIA/results/dgxa100_ngc20.06_mxnet/resnet",
                per_chip_batch=408, input_samples_per_s_per_host=40000),
    Calibration(("volta",), 0.3344, "fp16", "MLPerf v0.6 NVIDIA/results/dgx2h_ngc19.05_mxnet/resnet",
                per_chip_batch=208, input_samples_per_s_per_host=40000),
    Calibration(("pascal",), 0.4735, "fp32", "Jia et al. 2018 (arXiv:1807.11205), 1,024 P40s",
                per_chip_batch=32, input_samples_per_s_per_host=5000),
)  # fmt: skip


class ResNet50Benchmark(Benchmark):
    """ResNet-50 v1.5 trained with LARS (or SGD) to MLPerf's top-1 target on ImageNet.

    Batches are dicts: "image" float32 `[batch, size, size, 3]` (normalized RGB), "label"
    int32 `[batch]` (0-based classes) and, in eval, "valid" float32 `[batch]` (0 for padding).
    """

    name = config_lib.NAME
    mlperf_benchmark = C.RESNET
    sample_unit = "image"
    config_class = config_lib.ResNet50Config
    presets = {"mlperf": config_lib.mlperf, "mini": config_lib.mini, "smoke": config_lib.smoke}
    input_module = input_lib  # synthetic or record batches (the Benchmark's input hooks)
    # --spatial_partition=K: each replica of a group of K holds a slab of rows of every image.
    parallel_axes = ("data", "spatial")
    # The RCPs of the last round with ResNet (epochs to 75.9 % top-1 by global batch).
    convergence = Rcp("training_4.0.0/rcps_resnet.json", "resnet_ref_")

    config: config_lib.ResNet50Config

    def simulator_shape(self) -> SimulatorShape:
        """For `--spatial_partition`: the 7 x 7 stem and each stage's 3 x 3 convolutions (one
        per bottleneck) at the stage's map size; every batch norm (stem, three per bottleneck,
        one per stage's projection shortcut)."""
        m, size = self.config.model, self.config.data.image_size
        side = math.ceil(math.ceil(size / 2) / 2)  # after the stride-2 stem and max pool
        convs = [Conv(1, 7, size, size, 3, stride=2)]
        for stage, blocks in enumerate(m.block_layers):
            convs.append(Conv(blocks, 3, side, side, m.base_width * 2**stage))
            side = math.ceil(side / 2)
        norms = 1 + 3 * sum(m.block_layers) + len(m.block_layers)
        return SimulatorShape(
            convs=tuple(convs),
            batch_norms=norms,
            precision="bf16",
            calibration=SIMULATOR_CALIBRATION,
        )

    # ---- sizes ---------------------------------------------------------------------------------
    def warmup_steps(self) -> int:
        """Optimizer steps of the linear learning-rate warmup."""
        return int(round(self.config.optimizer.warmup_epochs * self.steps_per_epoch))

    def decay_steps(self, train_steps: int) -> int:
        """Steps of the polynomial decay after warmup: `train_steps - warmup + 1` as the
        reference's `lars_util.PolynomialDecayWithWarmup` (at least 1)."""
        return max(1, train_steps - self.warmup_steps() + 1)

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> keras.Model:
        """ResNet v1.5 of `config.model` at `config.data.image_size` (under the strategy scope),
        split into K x L tiles (or K slabs of rows) over the mesh's spatial axis when it has
        one."""
        return model_lib.resnet(
            self.config.model,
            image_size=self.config.data.image_size,
            seed=self.seed,
            layout=SpatialLayout(self.mesh) if self.mesh.spatial > 1 else None,
        )

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """LARS or SGD+momentum with linear warmup and polynomial decay over `train_steps`."""
        opt = self.config.optimizer
        schedule = WarmupPolynomialDecay(
            opt.base_learning_rate,
            warmup_steps=self.warmup_steps(),
            decay_steps=self.decay_steps(train_steps),
            end_learning_rate=opt.end_learning_rate,
            power=opt.poly_power,
        )
        # LARS and SGD are the registry's plug-ins too, built from the `lars_*` / `sgd_*` fields
        # of the same names: LARS' default exclusions (bias, bn, gamma, beta) match model.py's
        # layer names (no weight decay and no layer adaptation for batch norm and the classifier
        # bias), and SGD's weight decay is the L2 term of `compute_loss`. `opt_params` are for
        # the other optimizers only, as the config says.
        params = () if opt.opt_name in ("lars", "sgd") else opt.opt_params
        return registry.build(opt.opt_name, schedule, opt, params)

    # ---- steps (replica context) ---------------------------------------------------------------
    def compute_loss(self, model: keras.Model, batch: Any, training: bool = True) -> tf.Tensor:
        """Label-smoothed cross entropy summed over this replica's batch / `micro_batch_size`.

        With spatial partitioning the K (K x L) replicas of a group hold the same logits (of the
        same images) and each returns this same loss: the runner counts the group once
        (`Benchmark.compute_loss`). With SGD, adds `wd/2 * sum |k|^2` over the convolution and
        dense kernels (not batch norm, not biases), divided by the batch shards because their
        gradients are summed.
        """
        opt = self.config.optimizer
        logits = model(batch["image"], training=training)
        logits = tf.cast(logits, tf.float32)  # [batch, classes]: the loss in fp32
        num_classes = self.config.model.num_classes
        targets = tf.one_hot(batch["label"], num_classes, dtype=tf.float32)
        if opt.label_smoothing:
            targets = targets * (1.0 - opt.label_smoothing) + opt.label_smoothing / num_classes
        xent = tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)  # [batch]
        loss = tf.reduce_sum(xent) / float(self.micro_batch_size)
        if opt.opt_name == "sgd" and opt.sgd_opt_weight_decay:
            l2 = tf.add_n([tf.reduce_sum(tf.square(k)) for k in decayed_variables(model)])
            loss += 0.5 * opt.sgd_opt_weight_decay * l2 / float(self.batch_shards)
        return loss

    def eval_step(self, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
        """Per-example correctness `[batch]` and validity `[batch]` (padding counts 0)."""
        logits = model(batch["image"], training=False)  # [batch, classes]
        predictions = tf.argmax(logits, axis=-1, output_type=tf.int32)
        valid = tf.cast(batch["valid"], tf.float32)
        correct = tf.cast(tf.equal(predictions, batch["label"]), tf.float32) * valid
        return {"correct": correct, "count": valid}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """Top-1 accuracy over the real (non-padding) eval examples."""
        return eval_ratio(state, "correct", "count", what="real examples")

    def model_bn_span(self) -> int:
        """MLPerf's `model_bn_span`: examples one batch-norm layer normalizes over in training."""
        return layers.model_bn_span(self.per_replica_batch_size, self.config.model.bn_group_size)

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_resnet(_lars|_sgd).yaml, rulesets 0.7.0 and 1.0.0."""
        opt = self.config.optimizer
        decay_steps = self.decay_steps(self.train_steps)
        if opt.opt_name == "lars":
            hparams = {
                C.OPT_NAME: C.LARS,
                C.LARS_OPT_BASE_LEARNING_RATE: opt.lars_opt_base_learning_rate,
                C.LARS_OPT_END_LR: opt.lars_opt_end_learning_rate,
                C.LARS_OPT_LR_DECAY_POLY_POWER: opt.lars_opt_learning_rate_decay_poly_power,
                C.LARS_OPT_LR_DECAY_STEPS: decay_steps,
                C.LARS_OPT_LEARNING_RATE_WARMUP_EPOCHS: opt.lars_opt_learning_rate_warmup_epochs,
                C.LARS_OPT_MOMENTUM: opt.lars_opt_momentum,
                C.LARS_OPT_WEIGHT_DECAY: opt.lars_opt_weight_decay,
                C.LARS_EPSILON: opt.lars_epsilon,
            }
        elif opt.opt_name != "sgd":  # a registry optimizer on the LARS schedule
            hparams = {
                C.OPT_BASE_LR: opt.lars_opt_base_learning_rate,
                C.OPT_END_LR: opt.lars_opt_end_learning_rate,
                OPT_LR_DECAY_POLY_POWER: opt.lars_opt_learning_rate_decay_poly_power,
                C.OPT_LR_DECAY_STEPS: decay_steps,
                C.OPT_LR_WARMUP_EPOCHS: opt.lars_opt_learning_rate_warmup_epochs,
                **registry.mlperf_hparams(opt.opt_name, opt, opt.opt_params),
            }
        else:
            hparams = {
                C.OPT_NAME: C.SGD,
                SGD_OPT_BASE_LR: opt.sgd_opt_base_learning_rate,
                SGD_OPT_END_LR: opt.sgd_opt_end_learning_rate,
                SGD_OPT_LR_DECAY_POLY_POWER: opt.sgd_opt_learning_rate_decay_poly_power,
                SGD_OPT_LR_DECAY_STEPS: decay_steps,
                C.OPT_LR_WARMUP_EPOCHS: opt.opt_learning_rate_warmup_epochs,
                SGD_OPT_MOMENTUM: opt.sgd_opt_momentum,
                SGD_OPT_WEIGHT_DECAY: opt.sgd_opt_weight_decay,
            }
        hparams[C.MODEL_BN_SPAN] = self.model_bn_span()
        return hparams

    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the digits mini dataset (ImageNet-format TFRecords) into `data_dir`."""
        from benchmarks.resnet50 import prepare  # imported here: scikit-learn only when needed

        prepare.prepare_mini(data_dir)


def decayed_variables(model: keras.Model) -> list:
    """The variables that get weight decay: convolution and dense kernels (rank >= 2)."""
    return [v for v in model.trainable_variables if len(v.shape) >= 2]
