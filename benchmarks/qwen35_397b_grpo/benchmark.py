"""Provides `Qwen35GrpoBenchmark`, MLPerf `qwen35_397b_grpo` on the Benchmark contract: a training
"batch" is one step's rollouts (generated on the host by the policy itself, `input.py`), the
loss is GRPO's (`mlperf_tf.rl`), an evaluation is pass@k over validation rollouts."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import time
from typing import Any

import keras
import tensorflow as tf
from absl import logging
from mlperf_logging.mllog import constants as C

from benchmarks.qwen35_397b_grpo import checkpoint as checkpoint_lib
from benchmarks.qwen35_397b_grpo import config as config_lib
from benchmarks.qwen35_397b_grpo import input as input_lib
from benchmarks.qwen35_397b_grpo import sft
from benchmarks.qwen35_397b_grpo import simulator as simulator_lib
from benchmarks.qwen35_397b_grpo.model import build_model, load_base_weights
from mlperf_tf.benchmark import Benchmark, EvalPoint
from mlperf_tf.errors import UserError
from mlperf_tf.facts import Blocks, EvalCadence, Experts, SimulatorShape
from mlperf_tf.rl import batch as batch_lib
from mlperf_tf.rl.age import AgeGate
from mlperf_tf.rl.rollout import RolloutClock
from mlperf_tf.rl.split_decoding import for_generation
from mlperf_tf.runner.actions import Action, LoopOutput, TrackedStats
from mlperf_tf.spmd import use_mesh

_METRICS = ("reward", "is_oob_ratio", "sampling_importance_ratio", "masked_sequences",
            "avg_trajectory_age", "global_valid_toks", "global_valid_seqs")  # fmt: skip


class Qwen35GrpoBenchmark(Benchmark):
    """Qwen3.5-397B-A17B GRPO (README.md). Splits over `expert` and `model` (the rollouts'
    generation decodes on every replica of the split model); `smoke` runs end to end, `mlperf`
    needs what README.md lists."""

    name = "qwen35_397b_grpo"
    config_class = config_lib.Qwen35GrpoConfig
    sample_unit = "rollout"
    convergence = simulator_lib.CONVERGENCE  # rollouts to pass@4 0.69 at 256, 512, 1,024
    # The rollouts are generated on the host as the policy trains (`from_generator`, held by the
    # age gate): a second copy of the pipeline would generate other rollouts.
    repeatable_input = False

    def __init__(self, config, *, context=None):
        super().__init__(config, context=context)
        self._policy = None
        self._optimizer = None  # its `iterations`: the policy's version (updates applied)
        self._gates: list[AgeGate] = []  # one per training pipeline made
        # The training rollouts' generation and environment time (`bench`'s shares).
        self.rollout_clock = RolloutClock()

    # ---- sizes -----------------------------------------------------------------------------------
    def parameter_count(self) -> int:
        return self.config.model.parameter_count()

    def active_parameter_count(self) -> int:
        return self.config.model.active_parameter_count()

    def trainable_parameter_count(self) -> int:
        m = self.config.model
        frozen = m.moe.count(m.num_hidden_layers) * m.hidden_size * m.moe.num_experts
        return self.parameter_count() - (frozen if m.freeze_router else 0)

    def training_flops_per_sample(self) -> float:
        """An estimate: 6 x active parameters x the rollout's length (the attention and
        DeltaNet state products and the generation are not counted)."""
        return 6.0 * self.active_parameter_count() * self.config.rollout.max_length

    def simulator_shape(self) -> SimulatorShape:
        """Rollouts, training and refit as `mlperf-tf simulate` times them (`simulator.py`), at
        this config's trajectory age (`grpo.max_trajectory_age_steps`: 0 adds generation and
        training, 1 overlaps them), and what the training's split sends:

        - blocks: every one of the 60 layers is a mixer (Gated DeltaNet or gated attention)
          and an MoE feed-forward; under `--model_parallel` each ends in a row-parallel
          projection (the DeltaNet's `out_proj` or the attention's `o_proj`; the routed
          experts' and the shared expert's sum) whose output is all-reduced: 2 all-reduces a
          block of tokens x hidden, as Megatron's blocks (README "Parallelism"); a rollout's
          tokens are its mean context (`Rollouts.context_tokens`, what training runs on);
        - experts: 512 routed experts top-10 in every layer, each one SwiGLU of
          `moe.filter_size` (`ffn_parameters`), the forward FLOPs a token of one expert and the
          shared expert (`ffn_flops_per_token`, as `deepseekv3_671b` counts its shared one).
        """
        m = self.config.model
        grpo = self.config.grpo
        shape = simulator_lib.simulator_shape(
            m, self.config.global_batch_size, grpo.max_rollout_turns,
            group_size=grpo.num_generations_per_prompt,
        )  # fmt: skip
        h, f = m.hidden_size, m.moe.filter_size
        rollouts = dataclasses.replace(
            shape.rollouts, max_age=self.config.grpo.max_trajectory_age_steps
        )
        blocks = Blocks(
            m.num_hidden_layers, 2, h, round(rollouts.context_tokens), 3 * h * f,
            2.0 * 3 * h * (f + m.shared_expert_size),
        )  # fmt: skip
        experts = Experts(num_experts=m.moe.num_experts, top_k=m.moe.top_k, every=m.moe.every)
        return dataclasses.replace(shape, blocks=blocks, experts=experts, rollouts=rollouts)

    @property
    def train_steps(self) -> int:
        return self.config.grpo.max_steps

    def eval_steps(self, num_replicas: int) -> int:
        return math.ceil(self.config.eval_examples / self.config.eval_batch_size)

    # ---- model and optimizer -----------------------------------------------------------------------
    # The mesh axes `run` offers (tests/benchmarks/qwen35_397b_grpo/test_parallel.py): data,
    # the heads of the attention and the DeltaNet, the shared expert and the vocabulary over
    # `model`, and the routed experts over `expert` (the simulator models both: `Blocks`,
    # `Experts` in `simulator_shape`).
    parallel_axes = ("data", "model", "expert")

    def build_model(self):
        """The policy under this benchmark's mesh (the runner has made it ambient already;
        tests that build a benchmark directly get it here).

        Raises:
          UserError: `--expert_parallel` does not divide the experts, or `--model_parallel`
            the heads, the shared expert or the vocabulary.
        """
        experts, axis = self.config.model.moe.num_experts, self.mesh.expert
        if experts % axis:
            raise UserError(
                f"--expert_parallel={axis} must divide `model.moe.num_experts` ({experts})"
            )
        # Static tokens per replica (the all-to-all's buffers have one shape on every replica).
        tokens = self.per_replica_batch_size * (self.config.rollout.max_length - 1)
        with use_mesh(self.mesh):
            return build_model(
                self.config.model, moe_group_size=tokens if axis > 1 else None,
                collective_timeout_s=self.context.collective_timeout_s,
            )  # fmt: skip

    def bind_model(self, model) -> None:
        """The policy the rollout pipelines generate with: the trained weights themselves,
        through one compiled generator (`input.generator`); on a split mesh, decoding on every
        replica (`mlperf_tf.rl.split_decoding`)."""
        self._policy = input_lib.generator(for_generation(model, self.mesh), self.config)

    def prepare_initial_weights(self) -> None:
        """The mini's first run trains its missing base here (`sft.train_base`, untimed, before
        `run_start`, outside the strategy's scope, as `prepare --mini` would).

        Raises:
          UserError: the rollouts' chat cannot be made (`input.make_chat`: a real checkpoint's
            tokenizer or chat template missing or wrong, the reference's prompt templates
            missing): refused before anything is loaded.
        """
        input_lib.make_chat(self.config)
        path = self.config.init_checkpoint
        missing = not os.path.exists(os.path.join(path, sft.WEIGHTS))
        if path and path == config_lib.mini_base_dir() and missing:
            logging.info("qwen35_397b_grpo: training the mini base into %s", path)
            logging.info("qwen35_397b_grpo: %s", sft.train_base(path))

    def restore_initial_weights(self, model) -> None:
        """Loads `config.init_checkpoint` into the policy before `run_start`: a Hugging Face
        Qwen3.5 folder (its `config.json`: the released Qwen3.5-397B-A17B) through the shared
        importer (`checkpoint.load`), else a folder with `sft.WEIGHTS` (the `mini` base, trained
        by `prepare_initial_weights` when missing). Nothing when it is "" (`smoke`: the
        initializers)."""
        path = self.config.init_checkpoint
        if not path:
            return
        if not os.path.isdir(path):
            raise UserError(f"`init_checkpoint` {path!r} is not a folder")
        if os.path.isfile(os.path.join(path, "config.json")):
            with use_mesh(self.mesh):
                count = checkpoint_lib.load(path, model, self.config.model)
            logging.info("qwen35_397b_grpo: %d tensors from %s", count, path)
            return
        weights = os.path.join(path, sft.WEIGHTS)
        if not os.path.exists(weights):
            raise UserError(
                f"`init_checkpoint` ({path!r}): neither a Hugging Face checkpoint (config.json) "
                f"nor the mini base ({sft.WEIGHTS})"
            )
        with use_mesh(self.mesh):
            load_base_weights(model, weights)
        logging.info("qwen35_397b_grpo: initial weights from %s", weights)

    def learning_rate(self) -> float:
        return self.config.optimizer.opt_base_learning_rate or config_lib.learning_rate(
            self.config.global_batch_size
        )

    def gradient_clip_norm(self) -> float:
        return self.config.gradient_clip_norm or config_lib.gradient_clip(
            self.config.global_batch_size
        )

    def build_optimizer(self, train_steps: int):
        """Adam at a constant rate, no weight decay (the reference's `optimizer: adam`)."""
        opt = self.config.optimizer
        self._optimizer = keras.optimizers.Adam(
            learning_rate=self.learning_rate(), beta_1=opt.opt_adamw_beta_1,
            beta_2=opt.opt_adamw_beta_2, epsilon=opt.opt_adamw_epsilon,
        )  # fmt: skip
        return self._optimizer

    # ---- data: rollouts ----------------------------------------------------------------------------
    def _policy_model(self):
        if self._policy is None:
            raise RuntimeError("bind_model() must run before the rollout datasets are read")
        return self._policy

    def _policy_version(self):
        """The policy's version (the optimizer's updates applied), or None before an optimizer
        is built (nothing updates the weights)."""
        optimizer = self._optimizer
        return None if optimizer is None else (lambda: int(optimizer.iterations.numpy()))

    def _rollout_steps(self):
        """One training pipeline's rollout batches, held to `grpo.max_trajectory_age_steps`
        by their own gate (the async schedule: README "How it plugs into the runner")."""
        gate = AgeGate(self.config.grpo.max_trajectory_age_steps, self._policy_version())
        self._gates.append(gate)
        return input_lib.rollout_steps(self._policy_model(), self.config, seed=self.seed,
                                       gate=gate, clock=self.rollout_clock)  # fmt: skip

    def host_step_parts(self) -> dict[str, tuple[float | None, float]]:
        """`bench`'s parts of a GRPO step (`rollout_clock`): the rollouts' generation (the
        generator's prefill and decoding calls; the tokens it generated), their environments
        (resets, tool calls, the tests' run), and the update (the compiled step outside its
        wait for rollouts; the policy tokens it trains, counted as each batch is made: over a
        window, the batches generated in it, which the gate keeps at most
        `grpo.max_trajectory_age_steps` ahead of those trained)."""
        c = self.rollout_clock.snapshot()
        return {
            "rollout generation": (c["generation_s"], c["generated_tokens"]),
            "environment": (c["environment_s"], 0.0),
            "training": (None, c["trained_tokens"]),
        }

    def release_input(self) -> None:
        """Ends the rollout pipelines' waits for the next update (`AgeGate.close`)."""
        for gate in self._gates:
            gate.close()

    def train_dataset(self, input_context) -> tf.data.Dataset:
        gbs = self.config.global_batch_size
        dataset = tf.data.Dataset.from_generator(
            self._rollout_steps, output_signature=input_lib.train_signature(self.config, gbs)
        )
        per_replica = self.replica_batch_size(self.micro_batch_size, input_context)
        if per_replica != gbs:
            dataset = dataset.unbatch().batch(per_replica, drop_remainder=True)
        return dataset

    def eval_dataset(self, input_context) -> tf.data.Dataset:
        tasks = self.config.eval_batch_size
        k = self.config.grpo.num_val_generations_per_prompt
        dataset = tf.data.Dataset.from_generator(
            lambda: input_lib.validation_batches(
                self._policy_model(), self.config, batch_tasks=tasks, seed=self.seed
            ),
            output_signature={
                "rewards": tf.TensorSpec([tasks, k], tf.float32),
                "valid": tf.TensorSpec([tasks], tf.float32),
            },
        )
        # Each batch shard takes its share of a validation batch's tasks (the host generates
        # them all once), as the training batch is cut into the replicas' micro-batches.
        per_replica = self.replica_batch_size(tasks, input_context)
        if per_replica != tasks:
            dataset = dataset.unbatch().batch(per_replica, drop_remainder=True)
        return dataset

    def run_actions(self) -> list[Action]:
        """The reference's per-step statistics in the MLPerf log (`tracked_stats`, two events
        a step as NeMo-RL's `mlperf_grpo_logging.py` writes them; `tracked_stats`), the
        async schedule's guard (`AgeGuard`) and the generator's warm-up (`GenerationWarmUp`)."""
        stats = functools.partial(tracked_stats, chips=self.mesh.size)
        return [TrackedStats(stats, self.config.global_batch_size), AgeGuard(self),
                GenerationWarmUp(self)]  # fmt: skip

    # ---- loss and eval -------------------------------------------------------------------------
    def compute_loss_and_metrics(self, model, batch, training: bool = True):
        """The GRPO loss as a share of the step's token mean: normalized by the step's valid
        tokens (`valid_tokens`, over all its rollouts, NeMo-RL's `global_valid_toks`), times
        the accumulation steps, since the runner averages the micro-batches' gradients and sums
        the replicas': their sum is then the gradient of the mean over the step's tokens,
        whatever the rollouts' lengths in each micro-batch."""
        grpo = self.config.grpo
        loss, metrics = batch_lib.policy_loss(
            model, batch, loss=grpo.loss, logprob_error_threshold=grpo.seq_logprob_error_threshold,
            temperature=grpo.training_temperature, global_valid_tokens=batch["valid_tokens"][0],
        )  # fmt: skip
        parts = float(self.config.gradient_accumulation_steps)
        metrics["reward"] = tf.reduce_mean(batch["rewards"])
        # NeMo-RL's `avg_trajectory_age`: updates between the weights that sampled the batch
        # and the weights it trains (`mlperf_tf.rl.age`).
        metrics["avg_trajectory_age"] = tf.reduce_mean(batch["trajectory_age"])
        # A token mean over the step: this micro-batch's share of the step's tokens, which the
        # runner averages over the micro-batches and the replicas (the batch shards' shares sum).
        metrics["sampling_importance_ratio"] *= parts * self.batch_shards
        # NeMo-RL's `global_valid_toks` (the step's policy tokens: every row holds the count)
        # and `global_valid_seqs` (its rollouts the overlong filter kept: this micro-batch's
        # share, summed as the ratio above).
        metrics["global_valid_toks"] = batch["valid_tokens"][0]
        metrics["global_valid_seqs"] = (
            tf.reduce_sum(batch["sample_mask"]) * parts * self.batch_shards
        )
        return loss * parts, {k: metrics[k] for k in _METRICS}

    def compute_loss(self, model, batch, training: bool = True):
        return self.compute_loss_and_metrics(model, batch, training)[0]

    def train_metric_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: () for k in _METRICS}

    def eval_step(self, model, batch) -> dict[str, tf.Tensor]:
        solved = tf.cast(tf.reduce_any(batch["rewards"] > 0, axis=1), tf.float32)
        return {"solved": solved * batch["valid"], "tasks": batch["valid"]}

    def eval_result(self, state) -> float:
        return float(state["solved"] / max(state["tasks"], 1.0))

    def eval_cadence(self) -> EvalCadence:
        """`eval_schedule()` as `simulate` counts it: step `val_start_step`, or the rules'
        ceil(2.5 + 3840 / GBS), then every step."""
        if self.config.grpo.val_start_step:
            return EvalCadence(
                every_samples=1.0, first=(float(self.config.grpo.val_start_step), 0.0)
            )
        first = (config_lib.FIRST_VALIDATION_STEPS, float(config_lib.FIRST_VALIDATION_SAMPLES))
        return EvalCadence(every_samples=1.0, first=first)

    def eval_schedule(self) -> list[EvalPoint]:
        """Step `val_start_step` (default: the rules' ceil(2.5 + 3840 / GBS)), then every step to
        `max_steps`; `samples_count` is the rollouts trained on (the rules check it)."""
        gbs, last = self.config.global_batch_size, self.train_steps
        first = self.config.grpo.val_start_step or config_lib.first_validation_step(gbs)
        points, previous = [], 0
        for step in range(min(first, last), last + 1):
            points.append(
                EvalPoint(step=step, epoch_num=step * gbs, first_epoch_num=previous * gbs,
                          epoch_count=(step - previous) * gbs, samples_count=step * gbs)
            )  # fmt: skip
            previous = step
        return points

    # ---- log ---------------------------------------------------------------------------------------
    def mlperf_hparams(self) -> dict[str, Any]:
        """The keys of closed_qwen35_397b_grpo.yaml (6.1.0), then those the reference logs beside
        them (NeMo-RL's `mlperf_grpo_logging.py`, as its RCP logs show): the generation side and
        the importance-sampling settings; the disclosure keys are the runner's (`round_hparams`).
        """
        opt, grpo = self.config.optimizer, self.config.grpo
        loss, mesh = grpo.loss, self.mesh
        return {
            C.MAX_SEQUENCE_LENGTH: self.config.rollout.max_length,
            C.INIT_CHECKPOINT_STEP: 0,
            C.MAX_STEPS: grpo.max_steps,
            C.OPT_NAME: "adamw",
            C.OPT_BASE_LR: self.learning_rate(),
            C.OPT_ADAMW_BETA_1: opt.opt_adamw_beta_1,
            C.OPT_ADAMW_BETA_2: opt.opt_adamw_beta_2,
            C.OPT_ADAMW_EPSILON: opt.opt_adamw_epsilon,
            C.OPT_ADAMW_WEIGHT_DECAY: opt.opt_adamw_weight_decay,
            C.OPT_GRADIENT_CLIP_NORM: self.gradient_clip_norm(),
            C.OPT_LR_WARMUP_STEPS: opt.opt_learning_rate_warmup_steps,
            C.OPT_LR_DECAY_SCHEDULE: "constant",
            C.GENERATION_TRAINING_ROLLOUT_TEMPERATURE: grpo.training_temperature,
            C.GENERATION_TRAINING_ROLLOUT_TOP_P: grpo.training_top_p,
            C.GENERATION_VALIDATION_ROLLOUT_TEMPERATURE: grpo.validation_temperature,
            C.GENERATION_VALIDATION_ROLLOUT_TOP_P: grpo.validation_top_p,
            C.NUM_PROMPTS_PER_STEP: grpo.num_prompts_per_step,
            C.NUM_GENERATIONS_PER_PROMPT: grpo.num_generations_per_prompt,
            C.OPT_END_LR: self.learning_rate(),  # constant
            # The rollouts are generated by this process's TensorFlow model on the run's own mesh
            # (one copy of the weights, no refit): the training layout is the generation's.
            "generation_backend": "tensorflow",
            "generation_tensor_parallelism": mesh.model,
            "generation_pipeline_parallelism": mesh.pipeline,
            "generation_expert_parallelism": mesh.expert,
            "truncated_importance_sampling_type": loss.truncated_importance_sampling_type or "none",
            "truncated_importance_sampling_ratio": loss.truncated_importance_sampling_ratio,
            "truncated_importance_sampling_ratio_min": loss.truncated_importance_sampling_ratio_min,
        }

    def scaled_settings(self) -> dict[str, str]:
        """What a `smoke`/`mini` run sets off the closed rules, and why."""
        notes = {}
        gbs = self.config.global_batch_size
        if self.config.rollout.max_length != config_lib.MLPERF_SEQUENCE_LENGTH:
            notes[C.MAX_SEQUENCE_LENGTH] = "short rollouts of the generated repair tasks"
        if self.config.eval_examples == config_lib.VAL_ROWS:
            notes[C.EVAL_SAMPLES] = (
                f"all {config_lib.VAL_ROWS} held-out tasks, as the reference validates (its "
                f"README and RCP logs); the rules check {config_lib.EVAL_SAMPLES}"
            )
        elif self.config.eval_examples != config_lib.EVAL_SAMPLES:
            notes[C.EVAL_SAMPLES] = "a small held-out task set"
        if self.config.grpo.num_generations_per_prompt != config_lib.NUM_GENERATIONS_PER_PROMPT:
            notes[C.NUM_GENERATIONS_PER_PROMPT] = "fewer rollouts per task"
        first = config_lib.first_validation_step(gbs)
        if self.config.grpo.val_start_step not in (0, first):
            notes[C.EVAL_ACCURACY] = (
                f"evaluated from step {self.config.grpo.val_start_step} (the rules: step {first} "
                f"at this batch size, {first * gbs} rollouts)"
            )
        if not self.config.grpo.overlong_filtering:
            notes["overlong_filtering"] = "off: the smoke's turns all end at their length limit"
        if self.learning_rate() != config_lib.learning_rate(gbs):
            notes[C.OPT_BASE_LR] = "the tiny model's rate"
        return notes


class GenerationWarmUp(Action):
    """Before `run_start` (with the runner's warm-up on, `--warm_up`): the rollouts' compiled
    generator traces (with `rollout.xla_decoding` compiles) its calls on every batch shape and
    sampling setting of the run (`CompiledGenerator.warm_up`: a step's rollouts and a
    validation batch's, at the training and the validation temperature and top-p), as the
    runner's warm-up traces the train and eval steps: otherwise the first step's and the first
    evaluation's rollouts trace them inside the time to train."""

    def __init__(self, benchmark: Qwen35GrpoBenchmark):
        self.benchmark = benchmark
        self.seconds = 0.0

    def attach(self, controller) -> None:
        policy = self.benchmark._policy
        if not controller.run_config.warm_up or not hasattr(policy, "warm_up"):
            return  # warm-up off, or eager generation (nothing to trace)
        config, grpo = self.benchmark.config, self.benchmark.config.grpo
        batches = [
            (config.global_batch_size, grpo.training_temperature, grpo.training_top_p),
            (config.eval_batch_size * grpo.num_val_generations_per_prompt,
             grpo.validation_temperature, grpo.validation_top_p),
        ]  # fmt: skip
        begin = time.monotonic()
        policy.warm_up(batches, token=0, shrinking=grpo.max_rollout_turns > 1)
        self.seconds = time.monotonic() - begin
        logging.info("warm-up: the rollouts' generator traced before run_start in %.1f s",
                     self.seconds)  # fmt: skip


class AgeGuard(Action):
    """The bug guard of the async schedule: after each host loop, a batch generated more than
    `grpo.max_trajectory_age_steps` updates before the update that trained it (which the
    rollout pipelines' gates exist to prevent) stops the run with a one-line error."""

    def __init__(self, benchmark: Qwen35GrpoBenchmark):
        self.benchmark = benchmark

    def after_loop(self, output: LoopOutput) -> None:
        limit = self.benchmark.config.grpo.max_trajectory_age_steps
        seen = max((gate.max_seen for gate in self.benchmark._gates), default=0)
        if seen > limit:
            raise UserError(
                f"step {output.step}: rollouts generated {seen} updates before the update that "
                f"trained them, above `grpo.max_trajectory_age_steps` ({limit}): a bug in the "
                "rollout pipeline's gate"
            )


def tracked_stats(output: LoopOutput, *, chips: int = 1) -> list[dict[str, float]]:
    """A host loop's statistics as the reference logs a step's (its `tracked_stats` in
    `llm_post_training/rcp_logs`): the loss, mean reward, valid tokens and rollouts, then where
    the step's time went and the valid tokens a second per chip (`chips`: the run's; the
    reference divides by all its GPUs, generation's included: 1,280,272 tokens / 471.2 s / 256
    = 10.613 at GBS256 seed 1 step 1, its logged value).

    `exposed_generation_time` is the time the update waited for its rollouts (the runner's
    input wait: generation not hidden behind the previous update); `policy_training_time` the
    rest of the step; `weight_sync_time` 0, since generation reads the policy's own weights (one
    copy, no refit: README "Generation"). Per step means over the loop (one step a loop at
    `--steps_per_loop=1`, as the reference logs them).
    """
    steps = max(output.steps, 1)
    step_time, waited = output.seconds / steps, output.input_wait_s / steps
    metrics = output.metrics
    tokens = float(metrics["global_valid_toks"])
    return [
        {"reduced_train_loss": float(output.loss), "reward": float(metrics["reward"]),
         "global_valid_toks": tokens, "global_valid_seqs": float(metrics["global_valid_seqs"])},
        {"train_step_time": step_time, "policy_training_time": step_time - waited,
         "exposed_generation_time": waited, "weight_sync_time": 0.0,
         "valid_tokens_per_sec_per_gpu": tokens / max(step_time, 1e-9) / chips},
    ]  # fmt: skip
