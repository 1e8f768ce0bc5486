"""Where does the `qwen35_397b_grpo` mini start, and what would supervision alone reach? For the
mini base model: the teacher-forced accuracy of its edits on held-out expert trajectories
(`sft.edit_accuracy`, seconds: `--proxy_tasks`), its pass@4 on the held-out repair tasks (the
run's own evaluation, `sft.held_out_pass_at_k`), then the pass@4 after `--sft_steps` supervised
steps on expert trajectories instead of GRPO steps (batch: the mini's rollouts per step; the
GRPO run's optimizer: Adam at the rules' rate on the mini's scaled parametrization, the rules'
clip), each with the time it took and the load average.

    python tools/studies/grpo_mini_baselines.py [--weights=BASE/model.weights.h5]
        [--proxy_tasks=64] [--eval_tasks=251] [--sft_steps=33] [--no_base_eval]
        [--weight_scale=S]
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


def print_pass_at_k(policy, config, label: str) -> None:
    """Prints `policy`'s pass@4 on `config`'s held-out tasks (`sft.held_out_pass_at_k`, the
    run's evaluation), the seconds it took and the load average."""
    from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415 (TensorFlow after --help)
    from tools import harness  # noqa: PLC0415

    begin = time.time()
    value = sft.held_out_pass_at_k(policy, config)
    print(f"{label}: pass@4 {value:.3f} on {config.rollout.eval_tasks} held-out tasks "
          f"({time.time() - begin:.0f} s, load {harness.load_average()})", flush=True)  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="", help="default: the mini base's")
    parser.add_argument("--proxy_tasks", type=int, default=64, help="0: no teacher-forced proxy")
    parser.add_argument("--eval_tasks", type=int, default=251, help="0: no pass@4")
    parser.add_argument("--sft_steps", type=int, default=-1,
                        help="-1: the GRPO run's steps to its first evaluation; 0: none")  # fmt: skip
    parser.add_argument("--no_base_eval", action="store_true", help="measure after the steps only")
    parser.add_argument("--weight_scale", type=float, default=0.0,
                        help="the parametrization's s (default: the mini's)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.proxy_tasks < 0 or args.eval_tasks < 0:
        parser.error("--proxy_tasks and --eval_tasks must be >= 0")

    import keras  # noqa: PLC0415 (TensorFlow after --help)

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft, tasks  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import build_model, load_base_weights  # noqa: PLC0415
    from mlperf_tf.rl import batch as batch_lib  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    config = config_lib.mini()
    if args.weight_scale:
        config = dataclasses.replace(
            config, model=dataclasses.replace(config.model, weight_scale=args.weight_scale)
        )
    config = dataclasses.replace(
        config, rollout=dataclasses.replace(config.rollout, eval_tasks=max(args.eval_tasks, 1)),
        eval_batch_size=min(config.eval_batch_size, max(args.eval_tasks, 1)),
    )  # fmt: skip
    weights = args.weights or os.path.join(config_lib.mini_base_dir(), sft.WEIGHTS)
    model = build_model(config.model)
    load_base_weights(model, weights)
    policy = input_lib.generator(model, config)

    def measure(label: str) -> None:
        if args.proxy_tasks:
            begin = time.time()
            held_out = tasks.make_tasks(args.proxy_tasks, config.rollout.task_seed + 1)
            proxy = sft.edit_accuracy(model, sft.expert_rollouts(config, held_out))
            print(f"{label}: edit bytes right {proxy['bytes']:.3f}, whole edits right "
                  f"{proxy['edits']:.3f} on {args.proxy_tasks} held-out expert trajectories "
                  f"({time.time() - begin:.0f} s, load {harness.load_average()})", flush=True)  # fmt: skip
        if args.eval_tasks:
            print_pass_at_k(policy, config, label)

    if not args.no_base_eval:
        measure(f"base {weights}")
    steps = args.sft_steps
    if steps < 0:
        steps = config_lib.first_validation_step(config.global_batch_size)
    if not steps:
        return
    pool = tasks.make_tasks(config.rollout.train_tasks, config.rollout.task_seed)
    rollouts = sft.expert_rollouts(config, pool)
    lr = config_lib.learning_rate(config.global_batch_size)
    optimizer = keras.optimizers.Adam(lr)
    optimizer.build(model.trainable_variables)
    step = sft.accumulated_step(model, optimizer, config.gradient_clip_norm,
                                batch_lib.supervised_loss, config_lib.MINI_MICRO_BATCH)  # fmt: skip
    data = sft.supervised_batches(rollouts, batch=config.global_batch_size, seed=1)
    begin = time.time()
    for _ in range(steps):
        loss, _ = step(next(data))
    print(f"{steps} supervised steps (batch {config.global_batch_size}, Adam {lr:.3g} on the "
          f"weights scaled by {config.model.weight_scale:g}): last loss {loss:.4f} "
          f"({time.time() - begin:.0f} s)", flush=True)  # fmt: skip
    measure(f"base + {steps} supervised steps")


if __name__ == "__main__":
    main()
