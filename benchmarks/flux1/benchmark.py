"""Provides `FluxBenchmark`: MLPerf `flux1` (FLUX.1-schnell trained by rectified flow on CC12M
embeddings to a validation loss of 0.586 on a COCO-2014 subset)."""

from __future__ import annotations

import math
import os
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.flux1 import config as config_lib
from benchmarks.flux1 import input as input_lib
from benchmarks.flux1 import model as model_lib
from mlperf_tf.benchmark import Benchmark, EvalPoint, RcpLearningRate, sample_eval_schedule
from mlperf_tf.facts import Blocks, Calibration, Rcp, SimulatorShape
from mlperf_tf.optimizers.adamw import AdamW
from mlperf_tf.runner.actions import Action
from mlperf_tf.spmd import check_divides

EVALUATION_FREQUENCY = "evaluation_frequency"  # closed_flux1.yaml (not in mllog.constants)
GRID_FILE = "samples.png"


# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    # The calibrating run multiplies in MXFP8 (University-of-Florida/benchmarks/flux1/
    # implementations/hpg.dgxb200x8/config_DGXB200_02x08x32.sh: FP8_RECIPE="mxfp8").
    Calibration(("blackwell",), 0.2673, "fp8",
                "MLPerf v5.1 University-of-Florida/results/hpg.dgxb200x8.n2/flux1"),
)  # fmt: skip


@keras.saving.register_keras_serializable(package="mlperf_tf")
class WarmupConstant(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up from 0, then constant: torchtitan's `linear_warmup_stable_decay` with
    `decay_ratio` 0 (the flux1 toml), on the 0-based step of the update:

        step < W:  lr = b * step / W
        else:      lr = b
    """

    def __init__(self, base_learning_rate: float, *, warmup_steps: int):
        super().__init__()
        if base_learning_rate < 0 or warmup_steps < 0:
            raise ValueError(
                f"`base_learning_rate` ({base_learning_rate}) and `warmup_steps` "
                f"({warmup_steps}) must not be negative."
            )
        self.base_learning_rate = float(base_learning_rate)
        self.warmup_steps = int(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        if self.warmup_steps == 0:
            return tf.fill([], self.base_learning_rate)
        return self.base_learning_rate * tf.minimum(step / self.warmup_steps, 1.0)

    def get_config(self):
        return {"base_learning_rate": self.base_learning_rate, "warmup_steps": self.warmup_steps}


class FluxBenchmark(RcpLearningRate, Benchmark):
    """FLUX.1 rectified-flow training with AdamW to the MLPerf validation-loss target.

    Training batches (input.py) hold the clean latents `latents` [B, H, W, C], `noise`, the
    timesteps `t` [B] and the text encodings `t5` [B, T, t], `clip` [B, v]; the model sees
    x_t = (1 - t) latents + t noise and is trained to the velocity noise - latents (MSE in
    float32, `train.py`). The quality value is the eval set's mean per-sample loss, each sample
    at its fixed timestep k / 8 (`higher_is_better` False).
    """

    name = "flux1"
    sample_unit = "image"  # one latent image with its caption's encodings
    config_class = config_lib.FluxConfig
    input_module = input_lib
    higher_is_better = False
    parallel_axes = ("data", "model")
    convergence = Rcp("training_6.1.0/rcps_flux1.json", "flux_ref_", in_samples=True)

    config: config_lib.FluxConfig

    reference_hparams = staticmethod(config_lib.rcp_hparams)  # (base LR, warm-up) at a batch

    # ---- facts ---------------------------------------------------------------------------------
    def parameter_count(self) -> int:
        """Parameters of `config.model` (11,891,178,560 for `mlperf`), from the config."""
        return self.config.model.parameter_count()

    def training_flops_per_sample(self) -> float:
        """3x the forward FLOPs of one image (`ModelConfig.forward_flops`)."""
        d = self.config.data
        return 3.0 * self.config.model.forward_flops(d.image_tokens, d.t5_length)

    def simulator_shape(self) -> SimulatorShape:
        """Tensor parallelism: a double block all-reduces twice per stream (image and text,
        together the joint sequence), a single block once (its fused output projection)."""
        m, d = self.config.model, self.config.data
        h, f = m.hidden_size, m.mlp_hidden
        blocks = m.depth + m.depth_single_blocks
        per_block = (2 * m.depth + m.depth_single_blocks) / max(1, blocks)
        tokens = d.image_tokens + d.t5_length
        return SimulatorShape(
            blocks=Blocks(blocks, per_block, h, tokens, 2 * h * f, 4.0 * h * f),
            precision="bf16",
            calibration=SIMULATOR_CALIBRATION,
        )

    # ---- schedule ------------------------------------------------------------------------------
    def eval_interval(self) -> int:
        """Samples between evaluations (`evaluation_frequency`)."""
        return config_lib.eval_interval_samples(
            self.config.eval_every_samples, self.config.global_batch_size
        )

    def eval_schedule(self) -> list[EvalPoint]:
        """Every `eval_every_samples` samples rounded up to whole steps, and at the end; the
        events carry `samples_count` (the rules check it on `eval_accuracy`)."""
        return sample_eval_schedule(
            global_batch_size=self.config.global_batch_size,
            train_steps=self.train_steps,
            every_samples=self.config.eval_every_samples,
            log_samples_count=True,
        )

    def scaled_settings(self) -> dict[str, str]:
        """`evaluation_frequency` where the preset evaluates off the rules' 262,144 samples."""
        if self.eval_interval() == config_lib.EVAL_EVERY_SAMPLES:
            return {}
        return {
            EVALUATION_FREQUENCY: f"an eval every {self.eval_interval()} samples instead of "
            f"{config_lib.EVAL_EVERY_SAMPLES}: a scaled-down preset"
        }

    # ---- building ------------------------------------------------------------------------------
    def build_model(self) -> model_lib.FluxModel:
        """The MMDiT of `config.model` (under the strategy scope and the ambient mesh)."""
        m = self.config.model
        check_divides(self.mesh, num_heads=m.num_heads, mlp_hidden=m.mlp_hidden)
        return model_lib.build_model(m)

    def build_optimizer(self, train_steps: int) -> keras.optimizers.Optimizer:
        """AdamW (PyTorch's formula) on every parameter, as torchtitan's `build_optimizers`
        (no exclusions: biases and norm scales decay too), warm-up then constant."""
        del train_steps
        opt = self.config.optimizer
        lr, warmup = self.learning_rate_and_warmup()
        return AdamW(
            WarmupConstant(lr, warmup_steps=warmup),
            beta_1=opt.opt_adamw_beta_1,
            beta_2=opt.opt_adamw_beta_2,
            epsilon=opt.opt_adamw_epsilon,
            weight_decay=opt.opt_adamw_weight_decay,
            exclude_from_weight_decay=(),
        )

    # ---- steps (replica context) ---------------------------------------------------------------
    def sample_losses(self, model, batch, training: bool) -> tf.Tensor:
        """Per-sample MSE (float32) of the predicted velocity [batch]."""
        x0, noise, t = batch["latents"], batch["noise"], batch["t"]
        t4 = t[:, None, None, None]
        noised = (1.0 - t4) * x0 + t4 * noise
        inputs = {"latents": noised, "t5": batch["t5"], "clip": batch["clip"], "timesteps": t}
        prediction = tf.cast(model(inputs, training=training), tf.float32)
        return tf.reduce_mean(tf.square(prediction - (noise - x0)), axis=[1, 2, 3])

    def compute_loss(self, model, batch, training: bool = True) -> tf.Tensor:
        """The replica's summed per-sample losses over the micro batch (the reference's mean
        over its batch, once the replicas' gradients are summed)."""
        losses = self.sample_losses(model, batch, training)
        return tf.reduce_sum(losses) / float(self.micro_batch_size)

    def eval_step(self, model, batch) -> dict[str, tf.Tensor]:
        """Per sample: its loss and 1 (padding: 0)."""
        valid = tf.cast(batch["valid"], tf.float32)
        return {"loss": self.sample_losses(model, batch, training=False) * valid, "count": valid}

    # ---- host side -----------------------------------------------------------------------------
    def eval_result(self, state: dict[str, float]) -> float:
        """The mean loss over the eval samples (equal counts per timestep: the mean of the
        eight timesteps' means, the reference's validation loss)."""
        count = float(state.get("count", 0.0))
        if count <= 0:
            raise ValueError("eval saw no samples: the eval set is empty")
        return float(state["loss"]) / count

    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_flux1.yaml (5.1.0, 6.0.0, 6.1.0)."""
        opt = self.config.optimizer
        lr, warmup = self.learning_rate_and_warmup()
        return {
            C.OPT_NAME: "adamw",
            C.OPT_ADAMW_BETA_1: opt.opt_adamw_beta_1,
            C.OPT_ADAMW_BETA_2: opt.opt_adamw_beta_2,
            C.OPT_ADAMW_EPSILON: opt.opt_adamw_epsilon,
            C.OPT_ADAMW_WEIGHT_DECAY: opt.opt_adamw_weight_decay,
            C.OPT_BASE_LR: lr,
            C.OPT_LR_WARMUP_STEPS: warmup,
            C.OPT_GRADIENT_CLIP_NORM: float(self.config.gradient_clip_norm),
            EVALUATION_FREQUENCY: self.eval_interval(),
        }

    def run_actions(self) -> list[Action]:
        """A grid of generated images at the end of a run, where the config asks for one."""
        if not self.config.sample_grid_steps or not self.config.data_dir:
            return []
        return [SampleGrid(self)]


def sample(model, t5, clip, *, steps: int, shape, seed: int = 0) -> np.ndarray:
    """Euler steps of the learned flow from noise (t = 1) to an image (t = 0): x += (t' - t) v.

    Args:
      t5, clip: [N, T, t] and [N, v] text encodings of the N images.
      steps: uniform steps over [0, 1].
      shape: (H, W, C) of a latent.
    """
    n = t5.shape[0]
    x = tf.random.stateless_normal([n, *shape], [seed, 7])
    times = np.linspace(1.0, 0.0, steps + 1, dtype=np.float32)
    for t, t_next in zip(times[:-1], times[1:], strict=True):
        inputs = {"latents": x, "t5": t5, "clip": clip, "timesteps": tf.fill([n], t)}
        x = x + (t_next - t) * tf.cast(model(inputs, training=False), tf.float32)
    return x.numpy()


class SampleGrid(Action):
    """Writes `samples.png` to the model dir at the end of the run: a row of generated images
    per class caption of the data set (`class_encodings.npz`, written by `prepare_mini`)."""

    PER_CLASS = 6

    def __init__(self, benchmark: FluxBenchmark):
        self.benchmark = benchmark
        self.controller = None

    def attach(self, controller) -> None:
        self.controller = controller

    def at_end(self, end) -> None:
        del end
        c = self.controller
        if not c.chief or self.benchmark.mesh.model > 1:  # a split model runs in replicas only
            return
        config = self.benchmark.config
        path = os.path.join(config.data_dir, "class_encodings.npz")
        if not os.path.exists(path):
            return
        with np.load(path) as data:
            t5, clip = data["t5"], data["clip"]
        per = self.PER_CLASS
        d = config.data
        images = sample(
            c.model, np.repeat(t5, per, 0), np.repeat(clip, per, 0),
            steps=config.sample_grid_steps, shape=(d.latent_size, d.latent_size, d.latent_channels),
        )  # fmt: skip
        out = os.path.join(c.run_config.model_dir, GRID_FILE)
        write_grid(images, rows=t5.shape[0], path=out)
        logging.info("flux1: generated samples in %s", out)


def write_grid(images: np.ndarray, *, rows: int, path: str, zoom: int = 4) -> None:
    """Images [rows x cols, H, W, C] in [-1, 1] as one grayscale PNG (first channel)."""
    from PIL import Image  # noqa: PLC0415

    n, height, width = images.shape[:3]
    cols = math.ceil(n / rows)
    grid = np.zeros((rows * (height + 1), cols * (width + 1)), np.float32)
    for i in range(n):
        r, col = divmod(i, cols)
        grid[r * (height + 1) : r * (height + 1) + height,
             col * (width + 1) : col * (width + 1) + width] = images[i, :, :, 0]  # fmt: skip
    pixels = np.clip((grid + 1.0) * 127.5, 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels).resize((pixels.shape[1] * zoom, pixels.shape[0] * zoom))
    image.save(path)


def baseline_losses(config: config_lib.FluxConfig) -> dict[str, float]:
    """The eval loss of two models that learned nothing of the text or the noised image: the
    untrained model (it predicts 0, its output layer being zero) and the one that predicts the
    mean velocity of the training set (-mean latent, the best constant). A target means
    something where it lies well below both (README.md, "mini")."""
    total = 0.0
    count = 0
    for batch in input_lib.train_dataset(config, input_context=None, batch_size=64, seed=0).take(
        max(1, config.train_examples // 64)
    ):
        total = total + tf.reduce_sum(batch["latents"], 0)
        count += int(batch["latents"].shape[0])
    mean_velocity = -(total / count)
    zero = mean = examples = 0.0
    eval_data = input_lib.eval_dataset(config, input_context=None, batch_size=64,
                                       num_batches=math.ceil(config.eval_examples / 64))  # fmt: skip
    for batch in eval_data:
        valid = batch["valid"].numpy()
        target = (batch["noise"] - batch["latents"]).numpy()
        zero += float(np.sum(np.mean(target**2, axis=(1, 2, 3)) * valid))
        mean += float(
            np.sum(np.mean((target - mean_velocity.numpy()) ** 2, axis=(1, 2, 3)) * valid)
        )
        examples += float(valid.sum())
    return {"untrained": zero / examples, "mean_velocity": mean / examples}
