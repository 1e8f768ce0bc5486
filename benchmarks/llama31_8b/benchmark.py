"""Provides `Llama31Benchmark`: MLPerf `llama31_8b` (Llama 3.1 8B pretraining on C4 to log
perplexity 3.3)."""

from __future__ import annotations

from benchmarks.llama31_8b import config as config_lib
from benchmarks.llama31_8b import input as input_lib
from benchmarks.llama31_8b import model as model_lib
from mlperf_tf import flops
from mlperf_tf.facts import Blocks, Calibration, Rcp, SimulatorShape
from mlperf_tf.lm.pretraining import PretrainingBenchmark

# The simulator's constants of this benchmark per system family (`mlperf-tf simulate`), each
# from the published result it names (docs/scaling.md: one MLPerf result per benchmark at most
# calibrates; the rest of data/published.json tests). Efficiencies are fractions of the dense
# peak of the calibrating run's number format.
SIMULATOR_CALIBRATION = (
    # Fitted with the calibrating run as it ran (issue 48, session 11): its 10 logs print NVFP4
    # linear layers (`fp4: true`, `fp4_recipe: nvfp4`, `fp8: false`, no healing; config
    # DGXB200_1x8x2xtp1pp1cp1_8b_fp4) and FP8 attention (`fp8_dot_product_attention: true`); the
    # efficiency is stated as a fraction of the FP8 peak and carried to its NVFP4 layers at the
    # profiled layer's FP4 / FP8 rate on a B200 (1.04 x; docs/scaling.md "Efficiency per number
    # format"), its attention at `FP8_ATTENTION_SPEEDUP` x the BF16 rate (0.4966 when it was
    # read as an FP8 run with BF16 attention). Hopper takes the Blackwell fraction of its FP8
    # peak (no Hopper result calibrates).
    Calibration(("blackwell", "hopper"), 0.445, "fp8",
                "MLPerf v5.1 Nebius/results/nebius_b200_n1/llama31_8b", per_chip_batch=2),
)  # fmt: skip


class Llama31Benchmark(PretrainingBenchmark):
    """Llama 3.1 causal-LM pretraining with AdamW to the MLPerf log-perplexity target.

    Batches are dicts of int32 `input_ids` and `labels` [batch, seq] (labels are the inputs
    shifted by one, see input.py; every position counts) and, in eval, float32 `valid` [batch].
    The quality value is the eval set's log perplexity: the mean next-token cross-entropy (nats)
    over all its tokens, which the run drives down to `quality_target`. Model, loss, MoE
    metrics, mesh axes and eval: `mlperf_tf.lm.LanguageModelBenchmark`.
    """

    name = "llama31_8b"
    config_class = config_lib.LlamaConfig
    input_module = input_lib.INPUT
    model_name = model_lib.MODEL_NAME
    # Samples (sequences of 8,192 tokens) to log perplexity 3.3 at global batch 16 ... 128.
    convergence = Rcp("training_5.1.0/rcps_llama31_8b.json", "llama31_8b_ref_", in_samples=True)

    config: config_lib.LlamaConfig

    reference_hparams = staticmethod(config_lib.rcp_hparams)  # (base LR, warm-up) at a batch

    def simulator_shape(self) -> SimulatorShape:
        """For `--model_parallel` and `--expert_parallel`: Megatron's two all-reduces per block
        over sequence x hidden activations; the SwiGLU feed-forward an MoE layer replaces."""
        m = self.config.model
        h, f = m.hidden_size, m.intermediate_size
        seq = self.config.data.max_sequence_length
        blocks = Blocks(m.num_hidden_layers, 2, h, seq, 3 * h * f, 2.0 * 3 * h * f)
        # Attention's products (3 x forward, as the training FLOPs count them) stay in BF16.
        per_token = flops.decoder_forward_flops_per_token(self.decoder_shape(), seq)
        attention = 3.0 * seq * per_token["attention"]
        return SimulatorShape(
            blocks=blocks, precision="bf16", calibration=SIMULATOR_CALIBRATION,
            attention_flops=attention, causal=True,
        )  # fmt: skip
