"""Provides the `mini` preset's base model: the mini model trained supervised, untimed, on
expert trajectories of generated repair tasks, as the MLPerf run starts from the released
Qwen3.5 checkpoint.

An expert trajectory is a real rollout: `ExpertPolicy` writes `tasks.expert_turns` (look, edit,
test, finish) in place of the model, through `mlperf_tf.rl.rollout.run_rollouts`, so the tokens,
the chat layout and the observations are those a policy's rollout has (the sandbox runs the
tests); only trajectories that earn reward 1 are kept. The loss is the negative log-likelihood of
the policy's tokens (`mlperf_tf.rl.batch.supervised_loss`: prompts and tool output masked).
`train_base` writes the weights to `config.mini_base_dir()`, which `prepare --mini` fills and
the first `mini` run fills before `run_start` when it is missing (`Benchmark.
restore_initial_weights`), as `deepseekv3_671b`'s mini does with its base.
"""

from __future__ import annotations

import dataclasses
import os
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from benchmarks.qwen35_397b_grpo import config as config_lib
from benchmarks.qwen35_397b_grpo import tasks as tasks_lib
from benchmarks.qwen35_397b_grpo.environments import RepairEnvironment
from benchmarks.qwen35_397b_grpo.model import build_model
from mlperf_tf.optimizers.base import clipped_update
from mlperf_tf.rl import batch as batch_lib
from mlperf_tf.rl.chat import ByteChat
from mlperf_tf.rl.generation import Generated
from mlperf_tf.rl.rollout import run_rollouts
from mlperf_tf.sparse import merge_duplicate_rows

CHAT = ByteChat()
WEIGHTS = "model.weights.h5"


class ExpertPolicy:
    """A scripted generator for `run_rollouts`: for each conversation, the expert's next turn
    of its task (found by the first user message; the turn by the tool responses so far)."""

    def __init__(self, tasks):
        self.turns = {t.prompt(): tasks_lib.expert_turns(t) for t in tasks}

    def __call__(self, prompts, *, max_new_tokens: int, **unused) -> list[Generated]:
        outs = []
        for tokens in prompts:
            first = CHAT.decode(tokens[1 : tokens.index(CHAT.IM_END)])  # "user\n" + the prompt
            turn = CHAT.decode(tokens).count("<tool_response>")
            text = self.turns[first[len("user\n") :]][turn]
            ids = CHAT.encode(text)[:max_new_tokens]
            outs.append(Generated(ids, [0.0] * len(ids), "tool_call"))
        return outs


def expert_rollouts(config: config_lib.Qwen35GrpoConfig, tasks, *, chunk: int = 64) -> list:
    """The expert's rollouts of `tasks` that earn reward 1 (run `chunk` at a time)."""
    grpo, r = config.grpo, config.rollout
    kept = []
    envs = [RepairEnvironment(config.env) for _ in range(chunk)]
    try:
        for start in range(0, len(tasks), chunk):
            part = tasks[start : start + chunk]
            rollouts = run_rollouts(
                ExpertPolicy(part), envs[: len(part)], part, chat=CHAT,
                max_turns=grpo.max_rollout_turns, max_turn_tokens=r.max_turn_tokens,
                max_length=r.max_length, temperature=1.0, top_p=1.0, seed=0,
            )  # fmt: skip
            kept += [x for x in rollouts if x.reward == 1.0 and not x.truncated]
    finally:
        for env in envs:
            env.close()
    return kept


def supervised_batches(rollouts, *, batch: int, seed: int):
    """Endless batches of `batch` expert rollouts (`batch_lib.token_arrays`, one padded length:
    the longest, to a multiple of 64), in a seeded order that reshuffles every pass."""
    longest = max(len(x.tokens) for x in rollouts)
    length = -(-longest // 64) * 64
    arrays = batch_lib.token_arrays(rollouts, length=length, pad_id=CHAT.PAD)
    rng = np.random.default_rng(seed)
    while True:
        order = rng.permutation(len(rollouts))
        for start in range(0, len(order) - batch + 1, batch):
            rows = order[start : start + batch]
            yield {k: tf.constant(v[rows]) for k, v in arrays.items()}


def accumulated_step(model, optimizer, clip: float, loss_fn, micro_batch: int):
    """An update as the runner makes it with gradient accumulation: `loss_fn(model, batch)`'s
    gradients on micro-batches of `micro_batch` rows (compiled once), averaged, clipped to
    `clip`, one optimizer step. Returns a function of a batch (dict of [rows, ...] arrays)
    giving (the micro-batches' mean loss, the global gradient norm before the clip)."""

    @tf.function
    def gradients(batch):
        with tf.GradientTape() as tape:
            loss = loss_fn(model, batch)
        grads = tape.gradient(loss, model.trainable_variables)
        return loss, [tf.convert_to_tensor(g) for g in grads]

    def step(batch):
        rows = len(next(iter(batch.values())))
        total, losses = None, []
        for start in range(0, rows, micro_batch):
            loss, grads = gradients({k: v[start : start + micro_batch] for k, v in batch.items()})
            total = grads if total is None else [a + b for a, b in zip(total, grads)]
            losses.append(float(loss))
        parts = len(losses)
        grads, norm = tf.clip_by_global_norm([g / parts for g in total], clip)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return float(np.mean(losses)), float(norm)

    return step


@dataclasses.dataclass(frozen=True)
class BaseRecipe:
    """How `train_base` trains the base: `steps` supervised steps of `batch` expert rollouts,
    Adam at `lr` after `warmup` linear steps, cosine-decayed to `final_lr_fraction` x `lr` at the
    last step (1.0: constant), the token embedding at `embedding_lr_scale` x the rate, the
    global-norm clip `clip` (0: none). Defaults: the declared `config.MINI_BASE_*`.

    Why an embedding rate of its own: the bytes' embedding rows are each looked up hundreds of
    times a batch; the supervised loop before duplicate rows were merged gave them Adam's
    sum(g_i^2) second moment, moving them up to sqrt(n) x the rate, and that base was the
    strong one (README, "The mini")."""

    steps: int = config_lib.MINI_BASE_STEPS
    batch: int = config_lib.MINI_BASE_BATCH
    lr: float = config_lib.MINI_BASE_LR
    warmup: int = config_lib.MINI_BASE_WARMUP
    final_lr_fraction: float = config_lib.MINI_BASE_FINAL_LR_FRACTION
    embedding_lr_scale: float = config_lib.MINI_BASE_EMBEDDING_LR_SCALE
    clip: float = config_lib.MINI_BASE_CLIP
    seed: int = config_lib.MINI_BASE_SEED

    def schedule(self, scale: float = 1.0):
        """The rate (times `scale`) as a Keras schedule, or a float when constant."""
        peak = self.lr * scale
        if self.final_lr_fraction == 1.0 and not self.warmup:
            return peak
        return keras.optimizers.schedules.CosineDecay(
            0.0 if self.warmup else peak, max(self.steps - self.warmup, 1),
            alpha=self.final_lr_fraction, warmup_target=peak if self.warmup else None,
            warmup_steps=self.warmup,
        )  # fmt: skip


def recipe_step(model, recipe: BaseRecipe):
    """A compiled supervised step of `model` under `recipe`: the loss's gradients, duplicate
    rows merged and clipped together (`clipped_update`), then the embedding's Adam at its own
    rate and the other weights' Adam (two optimizers when the rates differ)."""
    variables = model.trainable_variables
    is_embedding = [v.path == model.token_embedding.embeddings.path for v in variables]
    groups = [[i for i, e in enumerate(is_embedding) if e == part] for part in (False, True)]
    if recipe.embedding_lr_scale == 1.0:
        groups = [list(range(len(variables)))]
    scales = (1.0, recipe.embedding_lr_scale)
    optimizers = [keras.optimizers.Adam(recipe.schedule(scales[k])) for k in range(len(groups))]
    for opt, group in zip(optimizers, groups):
        opt.build([variables[i] for i in group])

    @tf.function
    def step(batch):
        with tf.GradientTape() as tape:
            loss = batch_lib.supervised_loss(model, batch)
        grads = [merge_duplicate_rows(g) for g in tape.gradient(loss, variables)]
        if recipe.clip:
            grads, _ = tf.clip_by_global_norm(grads, recipe.clip)
        for opt, group in zip(optimizers, groups):
            clipped_update(opt, [grads[i] for i in group], [variables[i] for i in group], None)
        return loss

    return step


def train_base(out_dir: str, *, config=None, recipe: BaseRecipe | None = None,
               save_every: int = 0) -> dict:  # fmt: skip
    """Trains the `mini` model from its initializers on the expert rollouts of the mini's
    training tasks under `recipe` (default `BaseRecipe()`: the declared settings) and writes
    `out_dir/model.weights.h5` (with `save_every`, also `step<N>.weights.h5`).

    Returns:
      A summary: trajectories, steps, the last loss, seconds.
    """
    config = config or config_lib.mini()
    recipe = recipe or BaseRecipe()
    begin = time.time()
    pool = tasks_lib.make_tasks(config.rollout.train_tasks, config.rollout.task_seed)
    rollouts = expert_rollouts(config, pool)
    logging.info("qwen35_397b_grpo mini base: %d expert trajectories", len(rollouts))
    keras.utils.set_random_seed(recipe.seed)
    # The base is the plain model (the GRPO run's parametrization loads it scaled).
    model = build_model(dataclasses.replace(config.model, weight_scale=1.0))
    step = recipe_step(model, recipe)
    data = supervised_batches(rollouts, batch=recipe.batch, seed=recipe.seed)
    os.makedirs(out_dir, exist_ok=True)
    loss = float("nan")
    for i in range(recipe.steps):
        loss = float(step(next(data)))
        if (i + 1) % 25 == 0:
            logging.info("qwen35_397b_grpo mini base: step %d/%d loss %.4f", i + 1, recipe.steps,
                         loss)  # fmt: skip
        if save_every and (i + 1) % save_every == 0:
            model.save_weights(os.path.join(out_dir, f"step{i + 1}.weights.h5"))
    model.save_weights(os.path.join(out_dir, WEIGHTS))
    return {"trajectories": len(rollouts), "steps": recipe.steps, "loss": round(loss, 4),
            "seconds": round(time.time() - begin, 1)}  # fmt: skip


EDIT_PARAMETERS = ("old_str", "new_str")


def edit_positions(rollout) -> list[int]:
    """Token positions of the expert's edit in `rollout`: the bytes of the `str_replace` call's
    `old_str` and `new_str` values and the newline that ends each (where the value stops)."""
    tokens, positions = rollout.tokens, []
    for name in EDIT_PARAMETERS:
        opening = CHAT.encode(f"<parameter={name}>\n")
        closing = CHAT.encode("\n</parameter>")
        start = next(i for i in range(len(tokens)) if tokens[i : i + len(opening)] == opening)
        start += len(opening)
        end = next(i for i in range(start, len(tokens)) if tokens[i : i + len(closing)] == closing)
        positions += range(start, end + 1)
    return positions


def edit_accuracy(model, rollouts, *, batch: int = 8) -> dict[str, float]:
    """Teacher-forced accuracy of the edit on expert `rollouts` (a cheap proxy of pass@k): with
    the trajectory up to each byte of `old_str`/`new_str` given, is the model's most likely next
    token that byte (`edit_positions`)? `bytes`: the share of such bytes right; `edits`: the
    share of rollouts whose every edit byte is right (what greedy decoding of the edit would
    copy, given the view before it)."""
    right = total = whole = 0
    for start in range(0, len(rollouts), batch):
        part = rollouts[start : start + batch]
        length = -(-max(len(r.tokens) for r in part) // 64) * 64
        arrays = batch_lib.token_arrays(part, length=length, pad_id=CHAT.PAD)
        guess = np.argmax(model(tf.constant(arrays["input_ids"])), axis=-1)  # [B, length]
        for row, r in enumerate(part):
            at = np.asarray(edit_positions(r)) - 1  # predictions of tokens at those positions
            hits = guess[row, at] == arrays["targets"][row, at]
            right, total, whole = right + int(hits.sum()), total + len(at), whole + bool(hits.all())
    return {"bytes": right / max(total, 1), "edits": whole / max(len(rollouts), 1)}


def held_out_pass_at_k(policy, config: config_lib.Qwen35GrpoConfig, *, seed: int = 0) -> float:
    """Grouped pass@k of `policy` (a decoder or `input.generator`'s) on the held-out tasks, as
    the run's evaluation computes it (`input.validation_batches`, `eval_batch_size` tasks at a
    time): the `mini` base's and the supervised-only comparison's number."""
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415 (a cycle)

    solved = tasks = 0.0
    for b in input_lib.validation_batches(
        policy, config, batch_tasks=config.eval_batch_size, seed=seed
    ):
        solved += float(np.sum(np.any(b["rewards"] > 0, axis=1) * b["valid"]))
        tasks += float(np.sum(b["valid"]))
    return solved / max(tasks, 1.0)
