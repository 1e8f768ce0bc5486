"""Provides `simulator_shape`: `qwen35_397b_grpo` as `mlperf-tf simulate` times it, a step of
generated rollouts and training on them (`mlperf_tf.facts.Rollouts`; docs/scaling.md).

Every constant comes from the reference's layout (`llm_post_training/README.md` of
mlcommons/training, "Benchmark runtime"), the model's shape, or is stated as assumed; none is
fitted to a published time (the reference's own logs, `rcp_logs/GBS*/`, are the check).
"""

from __future__ import annotations

from benchmarks.qwen35_397b_grpo import config as config_lib
from mlperf_tf.facts import Rcp, Rollouts, SimulatorShape

# Samples (rollouts) to pass@4 0.69 at global batch 256, 512, 1,024 (6 runs each).
CONVERGENCE = Rcp(config_lib.RCP_FILE.removeprefix("rcp_checker/"), "qwen35_397b_grpo_ref_", True)

# The reference's pools (README "Benchmark runtime"): 64 trays of 4 GB300, 16 training (Megatron
# TP4 PP2 EP32) and 48 generating (vLLM TP8 EP8: 8 GPUs an instance), non-colocated.
GENERATION_SHARE = 48 / 64
GENERATOR_CHIPS = 8
# Tokens of a rollout. Generated: the reference's logs' `global_valid_toks` / `global_valid_seqs`
# (the loss's tokens: the policy's own), mean over rcp_logs/GBS256/seed_1.out's 17 steps: 5,768
# (the workload's size, not a time). Assumed: a first prompt (system prompt, tools, issue) of
# 3,000 tokens, 20 turns (the limit is 30) each returning an observation of 500 tokens.
GENERATED_TOKENS = 5768.0
PROMPT_TOKENS = 3000.0
TURNS = 20.0
OBSERVATION_TOKENS = 500.0
# Assumed: one tool call (a shell command, a file view or edit) in the task's Apptainer
# container takes 5 s on average. No figure for it exists in the reference: its README (section
# "NeMo Gym and OpenHands configuration") gives limits only, 30 agent turns, a training agent
# timeout of 1,800 s a rollout (generation and tools; "configure ... high enough that no rollout
# is terminated"), a 300 s timeout for the final test run, 256 rollouts at once in per-task SIF
# containers; its logs (`tracked_stats`: train_step_time, policy_training_time,
# exposed_generation_time, weight_sync_time) time no environment, nor the sandbox's start; NeMo
# RL's SWE guide (docs/guides/swe-rl-qwen3.md) says only that a multi-turn SWE trajectory "can
# take many minutes". The timeout bounds the assumption: the slowest rollout the simulator times
# must fit in AGENT_TIMEOUT_S (a test).
ENVIRONMENT_S_PER_TURN = 5.0
ENVIRONMENT_SOURCE = (
    "assumed: 5 s a tool call in the task's container; the reference states limits only (30 "
    "turns, 1,800 s agent timeout, 300 s test timeout) and logs no environment time"
)
AGENT_TIMEOUT_S = 1800.0  # the reference's training agent timeout, a whole rollout
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
BF16 = 2  # the generator's weights and cache (vLLM, BF16 policy)
STATE_BYTES = 4  # DeltaNet's recurrent state, fp32


def simulator_shape(
    model: config_lib.ModelConfig, global_batch_size: int, max_turns: int = 30
) -> SimulatorShape:
    """The shape of `model` generating and training at `global_batch_size` rollouts a step,
    each within `max_turns` agent turns and the MLPerf context of 65,536 tokens."""
    m = model
    expert = 3 * m.hidden_size * m.moe.filter_size  # one routed SwiGLU expert
    experts = m.moe.count(m.num_hidden_layers) * m.moe.num_experts * expert
    full = m.num_hidden_layers // m.full_attention_interval  # gated-attention layers
    linear = m.num_hidden_layers - full  # Gated DeltaNet layers
    kv = full * 2 * m.num_key_value_heads * m.head_dim * BF16  # keys and values a token
    state = linear * m.linear_num_value_heads * m.linear_key_head_dim * m.linear_value_head_dim
    context = PROMPT_TOKENS + GENERATED_TOKENS + TURNS * OBSERVATION_TOKENS
    rollouts = Rollouts(
        generation_chips=GENERATION_SHARE, instance_chips=GENERATOR_CHIPS,
        prompt_tokens=PROMPT_TOKENS, generated_tokens=GENERATED_TOKENS, context_tokens=context,
        turns=TURNS, environment_s_per_turn=ENVIRONMENT_S_PER_TURN,
        environment_source=ENVIRONMENT_SOURCE,
        weight_bytes=(m.parameter_count() - experts) * BF16, expert_bytes=experts * BF16,
        num_experts=m.moe.num_experts, top_k=m.moe.top_k, kv_bytes_per_token=kv,
        state_bytes=state * STATE_BYTES, active_parameters=m.active_parameter_count(),
        max_age=1, length_cv=LENGTH_CV, length_source=LENGTH_SOURCE,
        max_context_tokens=config_lib.MLPERF_SEQUENCE_LENGTH, max_turns=max_turns,
        eval_generations=EVAL_GENERATIONS,
    )  # fmt: skip
    return SimulatorShape(
        precision="bf16", reference_batch=global_batch_size, rollouts=rollouts,
        weight_update_sharding=True,
    )  # fmt: skip
