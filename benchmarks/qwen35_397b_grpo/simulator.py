"""Provides `simulator_shape`: `qwen35_397b_grpo` as `mlperf-tf simulate` times it, a step of
generated rollouts and training on them (`mlperf_tf.facts.Rollouts`; docs/scaling.md).

Every constant comes from the reference's layout (`llm_post_training/README.md` of
mlcommons/training, "Benchmark runtime"), its recipe and code (NeMo-RL 3fca04c9), the model's
shape, the suite's calibration of other benchmarks, a published inference benchmark of the
model (the decoding step's latency), or is stated as assumed; none from a
published time of this benchmark (the RCP logs at GBS 256, 512 and 1,024, `rcp_logs/GBS*/`,
are the check).
"""

from __future__ import annotations

import dataclasses

from benchmarks.qwen35_397b_grpo import config as config_lib
from mlperf_tf.facts import Calibration, Rcp, Rollouts, SimulatorShape

# Samples (rollouts) to pass@4 0.69 at global batch 256, 512, 1,024 (6 runs each).
CONVERGENCE = Rcp(config_lib.RCP_FILE.removeprefix("rcp_checker/"), "qwen35_397b_grpo_ref_", True)

# The reference's pools (README "Benchmark runtime"): 64 trays of 4 GB300, 16 training (Megatron
# TP4 PP2 EP32) and 48 generating (vLLM TP8 EP8: 8 GPUs an instance), non-colocated.
GENERATION_SHARE = 48 / 64
GENERATOR_CHIPS = 8
# Tokens of a rollout. Generated: the reference's logs' `global_valid_toks` / `global_valid_seqs`
# (the loss's tokens: the policy's own), mean over rcp_logs/GBS256/seed_1.out's 17 steps: 5,768
# (the workload's size, not a time). Turns and the whole conversation: the reference recipe's
# note on prefix caching (NeMo-RL 3fca04c9, docker/mlperf/conf/
# grpo_qwen35_397b_swe_openhands_async.yaml, `enable_prefix_caching`: "25-30-turn SWE agent
# episodes ... the full 22-29k-token conversation"), the middle of each range: 27.5 turns,
# 25,500 tokens. Assumed: a first prompt (system prompt, tools, issue) of 3,000 tokens; the
# observations are the rest of the conversation, (25,500 - 3,000 - 5,768) / 27.5 = 608 a turn.
GENERATED_TOKENS = 5768.0
PROMPT_TOKENS = 3000.0
TURNS = (25 + 30) / 2
CONVERSATION_TOKENS = (22_000 + 29_000) / 2
OBSERVATION_TOKENS = (CONVERSATION_TOKENS - PROMPT_TOKENS - GENERATED_TOKENS) / TURNS
# The agent server runs at most 256 rollouts at once, in training and in validation (the recipe's
# `env.nemo_gym.swe_agents_{train,val}...concurrency: 256`): a step of 1,024 rollouts or an
# evaluation of 4 x the validation tasks streams through 256 slots.
CONCURRENCY = 256
# The trainer: `policy.megatron_cfg.activation_checkpointing: true` (the forward recomputed in
# the backward) and, before each update, the policy's log-probabilities of the batch (NeMo-RL
# `async_grpo_train`'s `policy_and_reference_logprobs`, which the recipe's importance sampling
# and `seq_logprob_error_threshold` need; the reference policy's are skipped). Before an
# evaluation the trajectory collector is paused and the rollouts in flight drained
# (`async_grpo_train`: `wait_for_pending_generations` before `validate`).
RECOMPUTE_FORWARD = True
LOGPROB_PASS = True
DRAIN_BEFORE_EVAL = True
# The refit: the first trainer broadcasts every tensor to all vLLM workers over one NCCL group
# (NeMo-RL 3fca04c9: `MegatronPolicyWorker.broadcast_weights_for_collective` with `src=0`,
# `update_weights_from_collective` in vllm_backend.py), each worker loading its share of what
# it receives: every generator chip receives all 793 GB of bf16 weights.
REFIT_WHOLE = True
# No constant is read from a published time of this benchmark (its RCP logs, all three batches,
# are the check; issue 55). The trainer's efficiency is the suite's Blackwell constant for
# decoders trained by NeMo/Megatron, which deepseekv3_671b (a MoE of the same stack, 1 of 32
# experts active) and gpt_oss_20b declare: llama31_8b's MLPerf v5.1 calibration, 0.445 of the
# FP8 peak. It is carried to this BF16 run by the profiled layer rate (`mlperf_tf.simulate.
# model.linear_rate`: MXFP8 1.44 x BF16 on a B300, so 0.62 of the BF16 peak on a GB300), and
# applied to GRPO's training shape: every token four forward passes' FLOPs (the recompute),
# the causal attention of a 25,500-token rollout counted beside the weights' products
# (`Rollouts.attention_width`: +18 % a token), and the log-probability pass one more forward.
# What it leaves out: the pipeline bubble of the reference's PP2 (micro-batches of one packed
# 65,536-token sequence, `train_mb_tokens`: 13 a data-parallel rank at GBS 256, 50 at 1,024,
# a bubble of 8 % and 2 %), and the expert all-to-all of its EP32, which `--model_parallel=4
# --expert_parallel=32` charges (2.8 s a step at GBS 1,024, 1.5 s more for TP4).
TRAINER_EFFICIENCY = 0.445
TRAINER_SOURCE = (
    "assumed: deepseekv3_671b's and gpt_oss_20b's Blackwell constant, llama31_8b's "
    "calibration (MLPerf v5.1 Nebius B200, 8 GPUs), 0.445 of FP8; no GRPO time used"
)
SIMULATOR_CALIBRATION = (
    Calibration(("blackwell", "hopper"), TRAINER_EFFICIENCY, "fp8", TRAINER_SOURCE),
)
# The seconds of a turn beyond the decode and the prefill (the tool call in the task's
# Apptainer container, OpenHands' own work): the reference's recipe gives one figure of the
# agent's time outside the model. Its bring-up note on `enforce_eager` (NeMo-RL 3fca04c9,
# docker/mlperf/conf/grpo_qwen35_397b_swe_openhands_async.yaml): with eager decoding "68% of
# train rollouts hit the 600s agent timeout with a median 517s spent in model calls": 83 s of
# such a rollout outside the model calls, here over the mean 27.5 turns (the turns of those
# rollouts are not given: at the 30-turn limit 2.8 s, fewer turns would make a turn longer).
# The recipe's timeouts are bounds, not means (1,800 s a rollout, 300 s / 180 s for the
# tests after it), and are not used; the tests' run after the last turn is not modelled (no
# figure of its mean exists in the recipe or the logs).
ENVIRONMENT_S_PER_TURN = (600.0 - 517.0) / TURNS
ENVIRONMENT_SOURCE = (
    "the reference recipe's note on enforce_eager (NeMo-RL 3fca04c9): rollouts at the 600 s "
    "agent timeout spent a median 517 s in model calls; the other 83 s over 27.5 turns"
)
# The reference's training agent timeout, a whole rollout (README "NeMo Gym and OpenHands
# configuration"): the slowest rollout simulated must fit in it (a test).
AGENT_TIMEOUT_S = 1800.0
# A step waits for its slowest rollout. The reference logs no rollout's length, only each
# step's mean (`global_valid_toks` / `global_valid_seqs`, 17 steps of 6 seeds at GBS 256): the
# seeds run the same tasks in the same order (the curriculum is part of the input), so the
# spread of one step's mean over the seeds is sampling alone (rms 118 tokens over ~251 rollouts:
# 1,866 a rollout, CV 0.32 within a task) and what the seed-averaged means vary beyond it is the
# tasks' (16 prompts a step: 1,916 a task, CV 0.33); together CV 0.46 of the 5,822 mean.
# Assumed lognormal (lengths are positive and right-skewed) and independent.
LENGTH_CV = 0.46
LENGTH_SOURCE = (
    "llm_post_training/rcp_logs/GBS256/seed_1..6.out: spread of the per-step mean generated "
    "tokens over seeds (within a task) and over steps (between tasks); lognormal assumed"
)
# An evaluation: grouped pass@4, 4 trajectories of each validation task (README "Quality";
# `num_val_generations_per_prompt`), generated on the same pool as a step's rollouts.
EVAL_GENERATIONS = 4
# A decoding step of a generator instance is more than its bytes at the HBM rate. The one
# published decode figure of this model on Blackwell: Lambda's benchmark of
# Qwen/Qwen3.5-397B-A17B (the BF16 checkpoint, as the recipe's generator) on 8 B200 with
# `vllm bench serve`, 32 parallel requests of 8,192 tokens in and 1,024 out: inter-token
# latency 23 ms (lambda.ai/inference-models/Qwen/Qwen3.5-397B-A17B; a second table there
# 20 ms, SGLang on the same workload 24 ms, lambda.ai/inference-models/qwen/qwen3.5-397b-a17b).
# The step's bytes (`Rollouts.decode_read_bytes` at 32 sequences over their mean context of
# 8,192 + 512 tokens) take 6.3 ms at 8 x 8 TB/s; the other 16.7 ms are taken as a latency
# paid once a step whatever the batch, 0.28 ms a layer (the kernels and collectives of each
# of the 60 layers; a smaller preset pays it for its own layers), not as a lower share of
# the bandwidth: at batch 1, where bytes take under 1 ms, large MoEs on 8 B200
# decode at 11-20 ms a token (Vultr's B200 cookbook, MiniMax M2.5 FP8 vLLM TP4: TPOT
# 11.4 ms; GLM-5-FP8 SGLang TP8 without speculation: TPOT 20.2 ms, gist BenHamm/
# dcd09f595fef141567a39582f502cef4), which a bandwidth share would put at 2 ms.
# Not from any time of this benchmark (docs/scaling.md, "Issue 48, session 13").
DECODE_REFERENCE_ITL_S = 0.023
DECODE_REFERENCE_SEQUENCES = 32
DECODE_REFERENCE_CONTEXT = 8192 + 1024 / 2  # mean tokens over a request's decoding
DECODE_REFERENCE_CHIPS = 8
B200_HBM_BYTES_PER_S = 8e12  # NVIDIA DGX B200 datasheet: 64 TB/s for 8 GPUs (b200-dgx.json)
DECODE_SOURCE = (
    "lambda.ai/inference-models/Qwen/Qwen3.5-397B-A17B: 8 B200, vLLM, 32 requests of 8,192 "
    "in / 1,024 out, ITL 23 ms; less the step's bytes at 8 x 8 TB/s: 0.28 ms a layer a step"
)
BF16 = 2  # the generator's weights and cache (vLLM, BF16 policy)
STATE_BYTES = 4  # DeltaNet's recurrent state, fp32


def simulator_shape(
    model: config_lib.ModelConfig, global_batch_size: int, max_turns: int = 30,
    group_size: int = config_lib.NUM_GENERATIONS_PER_PROMPT,
) -> SimulatorShape:  # fmt: skip
    """The shape of `model` generating and training at `global_batch_size` rollouts a step,
    each within `max_turns` agent turns and the MLPerf context of 65,536 tokens, in groups of
    `group_size` rollouts of one task (a batch is whole groups)."""
    rollouts = _rollouts(model, max_turns)
    rollouts = dataclasses.replace(
        rollouts, decode_source=DECODE_SOURCE, group_size=group_size,
        decode_step_latency_s=decode_latency_per_layer_s() * model.num_hidden_layers,
    )  # fmt: skip
    return SimulatorShape(
        precision="bf16", reference_batch=global_batch_size, rollouts=rollouts,
        weight_update_sharding=True, calibration=SIMULATOR_CALIBRATION,
    )  # fmt: skip


def decode_latency_per_layer_s() -> float:
    """Seconds a layer adds to a decoding step beyond the step's bytes: the reference
    model's published inter-token latency (`DECODE_REFERENCE_ITL_S`) less its bytes at the
    B200s' memory bandwidth, over its layers."""
    reference = config_lib.ModelConfig()  # Qwen3.5-397B-A17B
    r = _rollouts(reference, max_turns=30)
    bound = r.decode_read_bytes(DECODE_REFERENCE_SEQUENCES, DECODE_REFERENCE_CONTEXT)
    bound /= DECODE_REFERENCE_CHIPS * B200_HBM_BYTES_PER_S
    return (DECODE_REFERENCE_ITL_S - bound) / reference.num_hidden_layers


def _rollouts(model: config_lib.ModelConfig, max_turns: int) -> Rollouts:
    """The rollouts of `model` (its sizes; the recipe's and the logs' constants), without
    the decoding step's latency."""
    m = model
    expert = 3 * m.hidden_size * m.moe.filter_size  # one routed SwiGLU expert
    experts = m.moe.count(m.num_hidden_layers) * m.moe.num_experts * expert
    full = m.num_hidden_layers // m.full_attention_interval  # gated-attention layers
    linear = m.num_hidden_layers - full  # Gated DeltaNet layers
    kv = full * 2 * m.num_key_value_heads * m.head_dim * BF16  # keys and values a token
    state = linear * m.linear_num_value_heads * m.linear_key_head_dim * m.linear_value_head_dim
    context = PROMPT_TOKENS + GENERATED_TOKENS + TURNS * OBSERVATION_TOKENS
    return Rollouts(
        generation_chips=GENERATION_SHARE, instance_chips=GENERATOR_CHIPS,
        prompt_tokens=PROMPT_TOKENS, generated_tokens=GENERATED_TOKENS, context_tokens=context,
        turns=TURNS, environment_s_per_turn=ENVIRONMENT_S_PER_TURN,
        environment_source=ENVIRONMENT_SOURCE,
        weight_bytes=(m.parameter_count() - experts) * BF16, expert_bytes=experts * BF16,
        num_experts=m.moe.num_experts, top_k=m.moe.top_k, kv_bytes_per_token=kv,
        state_bytes=state * STATE_BYTES, active_parameters=m.active_parameter_count(),
        max_age=1, length_cv=LENGTH_CV, length_source=LENGTH_SOURCE,
        max_context_tokens=config_lib.MLPERF_SEQUENCE_LENGTH, max_turns=max_turns,
        eval_generations=EVAL_GENERATIONS, concurrency=CONCURRENCY,
        recompute_forward=RECOMPUTE_FORWARD, logprob_pass=LOGPROB_PASS,
        drain_before_eval=DRAIN_BEFORE_EVAL, refit_whole=REFIT_WHOLE,
        attention_width=full * m.num_attention_heads * m.head_dim,
    )  # fmt: skip
