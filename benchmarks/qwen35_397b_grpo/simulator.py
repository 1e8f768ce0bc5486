"""Provides `simulator_shape`: `qwen35_397b_grpo` as `mlperf-tf simulate` times it, a step of
generated rollouts and training on them (`mlperf_tf.facts.Rollouts`; docs/scaling.md).

Every constant comes from the reference's layout (`llm_post_training/README.md` of
mlcommons/training, "Benchmark runtime"), its recipe and code (NeMo-RL 3fca04c9), the model's
shape, or is stated as assumed; two (the trainer's efficiency, the seconds a turn) are read
from the GBS 1,024 RCP logs' per-step breakdown, none from a published total (the GBS 256 and
512 logs, `rcp_logs/GBS*/`, are the check).
"""

from __future__ import annotations

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
# Read from the reference's GBS 1,024 RCP logs (rcp_logs/GBS1024/seed_1..6.out, steps 2-7 of
# each: the one published result this benchmark calibrates on; GBS 256 and 512 are tests):
# - the trainer's efficiency from `policy_training_time`, 243.0 s for 1,024 rollouts (64 GB300
#   at TP4 PP2 EP32): the fraction of the bf16 peak at which the simulated update of those
#   rollouts (8 x active weights x 25,500 tokens, recompute included, and its traffic) takes
#   243.0 s (`SIMULATOR_CALIBRATION`);
# - the seconds a turn beyond the simulated decode and prefill from the step's generation:
#   `train_step_time` 975.3 s minus `weight_sync_time` 15.9 s (means of the 6 seeds), the
#   time to generate 1,024 rollouts through 256 slots when generation is longer than training
#   (`mlperf_tf.simulate.model.rollout_times`): 3 mean rollouts and the slowest of 1,024. What
#   it holds is everything of a turn but the bandwidth-bound decode and the prefill: the tool
#   call in the task's container, the agent's own work, and vLLM's time beyond the bandwidth
#   bound; the logs split none of it (`tracked_stats` time no environment).
# Both are components of another run's breakdown, solved once with this file's other terms
# (tests/benchmarks/qwen35_397b_grpo/test_simulated.py recomputes both and fails when a term
# moves them); the GBS 256 and 512 times are not used.
CALIBRATION_POLICY_TRAINING_S = 243.0
CALIBRATION_GENERATION_S = 975.3 - 15.9
CALIBRATION_SOURCE = (
    "reference llm_post_training/rcp_logs/GBS1024/seed_1.out and seeds 2-6 (mlcommons/training "
    "aa344c7f), steps 2-7: policy_training_time 243.0 s; train_step_time - weight_sync_time "
    "959.4 s"
)
ENVIRONMENT_S_PER_TURN = 7.44
ENVIRONMENT_SOURCE = (
    "read: the GBS 1,024 reference logs' generation (train_step_time - weight_sync_time, "
    "959.4 s for 1,024 rollouts through 256 slots) less the simulated decode and prefill, "
    "over the turns; a turn's tool call, agent work and decoding beyond the bandwidth bound"
)
TRAINER_EFFICIENCY = 0.0934
SIMULATOR_CALIBRATION = (
    Calibration(("blackwell",), TRAINER_EFFICIENCY, "bf16", CALIBRATION_SOURCE),
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
        eval_generations=EVAL_GENERATIONS, concurrency=CONCURRENCY,
        recompute_forward=RECOMPUTE_FORWARD, logprob_pass=LOGPROB_PASS,
        drain_before_eval=DRAIN_BEFORE_EVAL, refit_whole=REFIT_WHOLE,
    )  # fmt: skip
    return SimulatorShape(
        precision="bf16", reference_batch=global_batch_size, rollouts=rollouts,
        weight_update_sharding=True, calibration=SIMULATOR_CALIBRATION,
    )  # fmt: skip
