"""Where does the `qwen35_397b_grpo` mini start, and what would supervision alone reach? The
pass@4 on the 251 held-out repair tasks (the run's own evaluation, `sft.held_out_pass_at_k`) of
the mini base model, then of the base after `--sft_steps` more supervised steps on expert
trajectories instead of GRPO steps (batch: the mini's rollouts per step; Adam at the mini's GRPO
learning rate), each with the time it took.

    python tools/studies/grpo_mini_baselines.py [--weights=BASE/model.weights.h5]
        [--sft_steps=8] [--eval_tasks=251]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="", help="default: the mini base's")
    parser.add_argument("--sft_steps", type=int, default=8, help="0: the base only")
    parser.add_argument("--eval_tasks", type=int, default=251)
    args = parser.parse_args(argv)
    if args.sft_steps < 0 or args.eval_tasks < 1:
        parser.error("--sft_steps must be >= 0 and --eval_tasks positive")

    import keras  # noqa: PLC0415 (TensorFlow after --help)

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft, tasks  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import build_model  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    config = config_lib.mini()
    config = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, eval_tasks=args.eval_tasks),
        eval_batch_size=min(config.eval_batch_size, args.eval_tasks),
    )  # fmt: skip
    weights = args.weights or os.path.join(config_lib.mini_base_dir(), sft.WEIGHTS)
    model = build_model(config.model)
    model.load_weights(weights)
    policy = input_lib.generator(model, config)
    begin = time.time()
    base = sft.held_out_pass_at_k(policy, config)
    print(f"base {weights}: pass@4 {base:.3f} ({time.time() - begin:.0f} s, load "
          f"{harness.load_average()})", flush=True)  # fmt: skip
    if not args.sft_steps:
        return
    pool = tasks.make_tasks(config.rollout.train_tasks, config.rollout.task_seed)
    rollouts = sft.expert_rollouts(config, pool)
    optimizer = keras.optimizers.Adam(config.optimizer.opt_base_learning_rate)
    optimizer.build(model.trainable_variables)
    step = sft.supervised_step(model, optimizer, config.gradient_clip_norm)
    data = sft.supervised_batches(rollouts, batch=config.global_batch_size, seed=1)
    for _ in range(args.sft_steps):
        loss = float(step(next(data)))
    begin = time.time()
    tuned = sft.held_out_pass_at_k(policy, config)
    print(f"base + {args.sft_steps} supervised steps (batch {config.global_batch_size}, last "
          f"loss {loss:.4f}): pass@4 {tuned:.3f} ({time.time() - begin:.0f} s, load "
          f"{harness.load_average()})", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
