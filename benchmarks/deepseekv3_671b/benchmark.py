"""Provides `DeepseekV3Benchmark`: MLPerf `deepseekv3_671b` (DeepSeek-V3 671B pretraining on C4,
continued from a checkpoint, to log perplexity 3.6)."""

from __future__ import annotations

import math
import os
from typing import Any

from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.deepseekv3_671b import checkpoint as checkpoint_lib
from benchmarks.deepseekv3_671b import config as config_lib
from benchmarks.deepseekv3_671b import input as input_lib
from benchmarks.deepseekv3_671b import model as model_lib
from benchmarks.deepseekv3_671b import prepare as prepare_lib
from mlperf_tf.benchmark import EvalPoint
from mlperf_tf.data import c4
from mlperf_tf.errors import UserError
from mlperf_tf.facts import Blocks, Calibration, EvalCadence, Experts, Rcp, SimulatorShape
from mlperf_tf.lm.decoder import DecoderModel
from mlperf_tf.lm.pretraining import PretrainingBenchmark
from mlperf_tf.spmd import use_mesh

# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`; docs/
# scaling.md: one MLPerf v5.1 result per benchmark at most calibrates, every v6.0 result tests).
# No v5.1 result exists (the benchmark is new in v6.0): assumed to sustain llama31_8b's Blackwell
# calibration, a decoder trained by the same NeMo/Megatron stack in FP8, as gpt_oss_20b assumes.
SIMULATOR_CALIBRATION = (
    Calibration(("blackwell", "hopper"), 0.445, "fp8",
                "assumed: llama31_8b's calibration (MLPerf v5.1 Nebius B200, 8 GPUs)"),
)  # fmt: skip


class DeepseekV3Benchmark(PretrainingBenchmark):
    """DeepSeek-V3 causal-LM pretraining with AdamW from a starting checkpoint to the MLPerf
    log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (`mlperf_tf.data.
    token_windows`) and, in eval, float32 `valid` [batch]. Every position counts in the loss
    (the reference's `eod_mask_loss=False`). The training loss is the main head's mean token
    cross-entropy, plus the MoE layers' sequence-wise balance loss x 0.01 and the MTP loss x
    0.1; the quality value is the main head's log perplexity over the 1,024 eval windows
    (`mlperf_tf.lm.LanguageModelBenchmark`).
    """

    name = "deepseekv3_671b"
    config_class = config_lib.DeepseekV3Config
    input_module = input_lib.INPUT
    model_name = model_lib.MODEL_NAME
    # Samples (sequences of 4,096 tokens) to log perplexity 3.6 at global batch 15,360, 16,384,
    # 18,432.
    convergence = Rcp(
        config_lib.RCP_FILE.removeprefix("rcp_checker/"), "deepseekv3_671b_ref_", True
    )

    config: config_lib.DeepseekV3Config

    reference_hparams = staticmethod(config_lib.rcp_hparams)  # (base LR, warm-up) at a batch

    # ---- sizes ---------------------------------------------------------------------------------
    def training_flops_per_sample(self) -> float:
        """Training FLOPs of one sequence (`DecoderConfig.training_flops`: MLA's projections and
        its real attention widths, nope + rope for the scores and v for the context; the
        router, top-8 and shared experts of an MoE layer; the MTP depth)."""
        return self.config.model.training_flops(self.sequence_length())

    def simulator_shape(self) -> SimulatorShape:
        """DeepSeek-V3 as `mlperf-tf simulate` times it (docs/scaling.md):

        - blocks: the 61 decoder layers and the MTP depth's block (62), two all-reduces each
          under tensor parallelism (MLA's o and the feed-forward's down); under context
          parallelism MLA's full keys and values (128 heads x (192 + 128)) pass the ring;
        - experts: 256 routed SwiGLU experts of 2,048 per MoE layer, top-8, dropless, in every
          block after the first 3 dense ones (59 MoE blocks with the MTP's): the routed experts
          split over `--expert_parallel`, the tokens sent by all-to-all; the shared expert's
          FLOPs are in the per-token feed-forward's;
        - attention: MLA's score and context products (nope + rope for the scores, v for the
          context, `attention_flops`), causal, at the 16-bit peak;
        - output: the LM head and the MTP depth's, vocabulary x hidden each (`output_flops`),
          in the run's format unless `--output_precision` says otherwise (the v6.0 GB300
          configs set `FP8_OUTPUT_PROJ=True`, the GB200 ones leave the head in BF16);
        - pipeline: the recipe's uneven stage maps (`model.pipeline_layers`) with the MTP block
          on the last stage ("16+16+16+14" at PP4);
        - the distributed optimizer (Megatron's `use_distributed_optimizer`, on in the
          reference) and the reference's batch, 16,384 (config_GB300_64x4x256xtp1pp4cp1.sh);
        - dense MLPs: the first 3 blocks' SwiGLU feed-forwards (7,168 x 18,432), what
          Megatron's `recompute_modules: ['mlp']` runs again (it skips MoE layers;
          `dense_mlp_flops`, `simulate --recompute_mlp`: the v6.0 GB200 configs'
          `RECOMPUTE_MODULES="mlp"`);
        - memory: the activations kept, not recomputed (`recompute` False: the reference
          recomputes only `mlp,moe_act`, NVIDIA's v6.0 runs nothing), so that a layout search
          finds the layouts its plan fits;
        - calibration: `SIMULATOR_CALIBRATION` (assumed; the v6.0 results test).
        """
        m = self.config.model
        h, f = m.hidden_size, m.moe.filter_size
        seq = self.sequence_length()
        layers = m.num_hidden_layers + m.mtp_layers
        widths = m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim
        blocks = Blocks(
            layers, 2, h, seq, 3 * h * f, 2.0 * 3 * h * (f + m.moe.shared_filter_size),
            kv_width=m.num_attention_heads * widths,  # a context ring pass: K 192, V 128 a head
        )  # fmt: skip
        experts = Experts(
            num_experts=m.moe.num_experts, top_k=m.moe.top_k, every=m.moe.every,
            first_dense=m.moe.first_dense,
        )  # fmt: skip
        attention = 3.0 * 2.0 * seq * seq * m.num_attention_heads * widths * layers
        output = 3.0 * 2.0 * seq * (1 + m.mtp_layers) * m.vocab_size * h  # the heads' GEMMs
        stages = tuple(
            "+".join(map(str, counts[:-1] + [counts[-1] + m.mtp_layers]))
            for counts in ([int(c) for c in entry.split("+")] for entry in m.pipeline_layers)
        )
        return SimulatorShape(
            blocks=blocks, experts=experts, precision="bf16", attention_flops=attention,
            causal=True, output_flops=output, calibration=SIMULATOR_CALIBRATION,
            pipeline_stages=stages,
            weight_update_sharding=True, reference_batch=config_lib.REFERENCE_BATCH,
            recompute=False,
            dense_mlp_flops=2.0 * 3 * h * m.intermediate_size * seq * m.moe.first_dense,
        )  # fmt: skip

    def scaled_settings(self) -> dict[str, str]:
        """`max_sequence_length` off 4,096 and `global_batch_size` below 15,360 (the mini and
        smoke presets), and what follows from a small batch when a preset sets it apart from
        the rules' formulas: the base LR, the warm-up, the first eval's step."""
        out = {}
        batch = self.config.global_batch_size
        lr, warmup = self.learning_rate_and_warmup()
        if abs(lr - config_lib.reference_learning_rate(batch)) >= 1e-9:
            out[C.OPT_BASE_LR] = (
                f"LR {lr:g} instead of 2.4e-5 x sqrt({batch} / 16384): a scaled-down preset"
            )
        if warmup != config_lib.WARMUP_STEPS:
            out[C.OPT_LR_WARMUP_STEPS] = f"{warmup} warm-up steps: a scaled-down preset"
        if self.first_eval_step() != config_lib.first_eval_step(batch):
            out[C.EVAL_ACCURACY] = (
                f"first eval after {self.first_eval_step()} steps instead of "
                f"floor(42 + 24576 / {batch}): a scaled-down preset"
            )
        seq = self.sequence_length()
        if seq != config_lib.MLPERF_SEQUENCE_LENGTH:
            out[C.MAX_SEQUENCE_LENGTH] = (
                f"sequence {seq} instead of {config_lib.MLPERF_SEQUENCE_LENGTH}: a scaled-down "
                "preset"
            )
        if batch < config_lib.MIN_GLOBAL_BATCH_SIZE:
            out[C.GLOBAL_BATCH_SIZE] = (
                f"batch {batch} below {config_lib.MIN_GLOBAL_BATCH_SIZE}: a scaled-down preset"
            )
        return out

    # ---- schedule ------------------------------------------------------------------------------
    def first_eval_step(self) -> int:
        """The first eval's step: `first_eval_samples` / GBS rounded up, or the rules'
        floor(42 + 24,576 / GBS)."""
        batch, samples = self.config.global_batch_size, self.config.first_eval_samples
        if samples > 0:
            return math.ceil(samples / batch)
        return config_lib.first_eval_step(batch)

    def eval_cadence(self) -> EvalCadence:
        """`first_eval_step()` as a rule of the batch (ceil(samples / GBS), or the rules'
        floor(42 + 24,576 / GBS)), then every `eval_every_samples`."""
        every, samples = float(self.config.eval_every_samples), self.config.first_eval_samples
        if samples > 0:
            return EvalCadence(every_samples=every, first=(0.0, float(samples)))
        first = (float(config_lib.FIRST_EVAL_STEPS), float(config_lib.FIRST_EVAL_SAMPLES))
        return EvalCadence(every_samples=every, first=first, first_rounding="floor")

    def eval_schedule(self) -> list[EvalPoint]:
        """The first eval after `first_eval_step()` steps, then every
        ceil(`eval_every_samples` / GBS) steps (the rules: every step) and at the end, each
        with `samples_count`."""
        batch, last = self.config.global_batch_size, self.train_steps
        every = max(1, math.ceil(self.config.eval_every_samples / batch))
        first = min(self.first_eval_step(), last)
        steps = list(range(first, last, every)) + [last]
        points, previous = [], 0
        for step in dict.fromkeys(steps):
            points.append(
                EvalPoint(
                    step=step,
                    epoch_num=step * batch,
                    first_epoch_num=previous * batch,
                    epoch_count=(step - previous) * batch,
                    samples_count=step * batch,
                )  # fmt: skip
            )
            previous = step
        return points

    def train_samples(self) -> int:
        """A run on the reference's data (its 4,096-token C4 windows) logs the reference's
        constant (`config.REFERENCE_TRAIN_SAMPLES`); a smaller one the sequences of its
        schedule (`PretrainingBenchmark`)."""
        if self.config.data.max_sequence_length == config_lib.MLPERF_SEQUENCE_LENGTH:
            return config_lib.REFERENCE_TRAIN_SAMPLES
        return super().train_samples()

    def mlperf_hparams(self) -> dict[str, Any]:
        """The C4 pretraining keys (`PretrainingBenchmark`) and what `closed_deepseekv3_671b.yaml`
        adds: `moe_aux_loss_coeff` and `init_checkpoint_step` (0: the checkpoint is the start)."""
        return {
            **super().mlperf_hparams(),
            C.MOE_AUX_LOSS_COEFF: self.config.model.moe.balance_loss_coef,
            C.INIT_CHECKPOINT_STEP: 0,
        }

    # ---- building ------------------------------------------------------------------------------
    def decoder_class(self):
        """DeepSeek-V3, parametrized at `model.weight_scale` when not 1 (`model.decoder_class`).

        Raises:
          UserError: a scale under `--pipeline_parallel` (its stages call the layers outside
            the scaled forward).
        """
        if self.config.model.weight_scale != 1.0 and self.mesh.pipeline > 1:
            raise UserError(
                f"`model.weight_scale` ({self.config.model.weight_scale:g}) needs "
                f"--pipeline_parallel=1 (not {self.mesh.pipeline})"
            )
        return model_lib.decoder_class(self.config.model)

    def prepare_initial_weights(self) -> None:
        """The mini's first run trains its base here (`prepare.prepare_mini_base`, untimed,
        before `run_start`) when `config.init_checkpoint` is the mini's missing base folder."""
        path = self.config.init_checkpoint
        if path and path == prepare_lib.mini_base_dir() and not os.path.exists(path):
            logging.info("deepseekv3_671b: training the mini base into %s", path)
            logging.info("deepseekv3_671b: %s", prepare_lib.prepare_mini_base(path))

    def restore_initial_weights(self, model: DecoderModel) -> None:
        """Loads `config.init_checkpoint` (a Hugging Face DeepSeek-V3 folder) into the model,
        before `run_start` as the rules want (`checkpoint.load`, the shared importer); nothing
        when it is "" (the smoke preset starts from the initializers)."""
        if not self.config.init_checkpoint:
            return
        with use_mesh(self.mesh):
            count = checkpoint_lib.load(self.config.init_checkpoint, model, self.config.model)
        logging.info("deepseekv3_671b: %d tensors from %s", count, self.config.init_checkpoint)

    # ---- host side -----------------------------------------------------------------------------
    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the shared C4-format mini corpus's windows at this benchmark's mini length
        (`config.MINI_SEQUENCE_LENGTH`, `mlperf_tf.data.c4.prepare_mini_windows`) into
        `data_dir`."""
        summary = c4.prepare_mini_windows(data_dir, config_lib.MINI_SEQUENCE_LENGTH)
        logging.info("deepseekv3_671b: mini dataset in %s: %s", data_dir, summary)
