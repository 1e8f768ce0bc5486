"""Provides `GptOssBenchmark`: MLPerf `gpt_oss_20b` (GPT-OSS 20B mixture-of-experts pretraining on
C4 to log perplexity 3.34)."""

from __future__ import annotations

from absl import logging

from benchmarks.gpt_oss_20b import config as config_lib
from benchmarks.gpt_oss_20b import input as input_lib
from benchmarks.gpt_oss_20b import model as model_lib
from mlperf_tf import flops
from mlperf_tf.data import c4
from mlperf_tf.facts import Blocks, Calibration, Experts, Rcp, SimulatorShape
from mlperf_tf.lm.pretraining import PretrainingBenchmark

# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    # No MLPerf v5.1 result exists (the benchmark is new in v6.0, whose results only test):
    # assumed to sustain llama31_8b's Blackwell calibration, a decoder trained by the same NeMo
    # stack in FP8.
    Calibration(("blackwell", "hopper"), 0.445, "fp8",
                "assumed: llama31_8b's calibration (MLPerf v5.1 Nebius B200, 8 GPUs)"),
)  # fmt: skip


class GptOssBenchmark(PretrainingBenchmark):
    """GPT-OSS causal-LM pretraining with AdamW to the MLPerf log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (`mlperf_tf.data.
    token_windows`) and, in eval, float32 `valid` [batch]. Positions whose input token is the
    end-of-document token (`config.data.eod_token_id`) are left out of the loss and the eval
    (Megatron's `eod_mask_loss`: `loss_mask[tokens == eod] = 0` on the input tokens). The
    quality value is the eval set's log perplexity: the summed next-token cross-entropy (nats)
    over its unmasked tokens over their count, driven down to `quality_target`. Model, loss,
    MoE metrics and eval: `mlperf_tf.lm.LanguageModelBenchmark`.
    """

    name = "gpt_oss_20b"
    config_class = config_lib.GptOssConfig
    input_module = input_lib.INPUT
    model_name = model_lib.MODEL_NAME
    # Samples (sequences of 8,192 tokens) to log perplexity 3.34 at global batch 16, 32, 64.
    convergence = Rcp(config_lib.RCP_FILE.removeprefix("rcp_checker/"), "gpt_oss_20b_ref_", True)

    config: config_lib.GptOssConfig

    reference_hparams = staticmethod(config_lib.rcp_hparams)  # (base LR, warm-up) at a batch

    @property
    def eod_token(self) -> int | None:
        """The end-of-document id whose input positions the loss skips (the preset's data)."""
        eod = self.config.data.eod_token_id
        return None if eod < 0 else eod

    def simulator_shape(self) -> SimulatorShape:
        """Megatron's two all-reduces per block under tensor parallelism; each MoE layer holds
        one SwiGLU expert's weights per expert and runs top-k of them per token (`experts`: the
        simulator splits them over `--expert_parallel` and sends tokens by all-to-all)."""
        m = self.config.model
        h, f = m.hidden_size, m.moe.filter_size or m.intermediate_size
        seq = self.config.data.max_sequence_length
        blocks = Blocks(m.num_hidden_layers, 2, h, seq, 3 * h * f, 2.0 * 3 * h * f)
        experts = Experts(
            num_experts=m.moe.num_experts,
            top_k=m.moe.top_k,
            every=m.moe.every,
            capacity_factor=float(m.moe.capacity_factor),
        )
        # Attention's products (3 x forward, as the training FLOPs count them) stay in BF16.
        per_token = flops.decoder_forward_flops_per_token(self.decoder_shape(), seq)
        attention = 3.0 * seq * per_token["attention"]
        return SimulatorShape(
            blocks=blocks, experts=experts, precision="bf16", calibration=SIMULATOR_CALIBRATION,
            attention_flops=attention, causal=True,
        )  # fmt: skip

    # ---- host side -----------------------------------------------------------------------------
    @classmethod
    def prepare_mini(cls, data_dir: str) -> None:
        """Writes the shared C4-format mini corpus (`mlperf_tf.data.c4`) into `data_dir`."""
        summary = c4.prepare_mini(data_dir)
        logging.info("gpt_oss_20b: mini dataset in %s: %s", data_dir, summary)
