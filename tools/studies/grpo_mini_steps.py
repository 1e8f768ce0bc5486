"""What does a `qwen35_397b_grpo` mini GRPO step cost, and does GRPO move the mini base? Runs
`--steps` GRPO steps from a base (the mini's settings: 8 tasks x 16 rollouts, the rules'
learning rate and clip on the scaled parametrization, the benchmark's own rollouts, batch and
loss), printing each step's rollout time, update time, mean reward and the tokens the policy
wrote, then the pass@4 on `--eval_tasks` held-out tasks before and after (0: none), with the
load average. A study of the run, not the run: no MLPerf log, no async overlap.

    python tools/studies/grpo_mini_steps.py [--weights=BASE/model.weights.h5] [--steps=4]
        [--eval_tasks=64] [--prompts_per_step=8] [--no_base_eval]
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
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval_tasks", type=int, default=64, help="0: no pass@4")
    parser.add_argument("--prompts_per_step", type=int, default=0, help="0: the mini's")
    parser.add_argument("--no_base_eval", action="store_true", help="evaluate after only")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.eval_tasks < 0 or args.prompts_per_step < 0:
        parser.error("--steps must be positive, --eval_tasks and --prompts_per_step >= 0")

    import numpy as np  # noqa: PLC0415 (the heavy imports after --help)

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import load_base_weights  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415
    from tools.studies.grpo_mini_baselines import print_pass_at_k  # noqa: PLC0415

    config = config_lib.mini()
    prompts = args.prompts_per_step or config.grpo.num_prompts_per_step
    grpo = dataclasses.replace(config.grpo, num_prompts_per_step=prompts)
    config = dataclasses.replace(
        config, grpo=grpo, global_batch_size=grpo.global_batch_size,
        gradient_clip_norm=config_lib.gradient_clip(grpo.global_batch_size),
        gradient_accumulation_steps=grpo.global_batch_size // config_lib.MINI_MICRO_BATCH,
        rollout=dataclasses.replace(config.rollout, eval_tasks=max(args.eval_tasks, 1)),
        eval_batch_size=min(config.eval_batch_size, max(args.eval_tasks, 1)),
    )  # fmt: skip
    bench = Qwen35GrpoBenchmark(config)
    model = bench.build_model()
    load_base_weights(model, args.weights or os.path.join(config_lib.mini_base_dir(), sft.WEIGHTS))
    bench.bind_model(model)
    policy = bench._policy_model()
    optimizer = bench.build_optimizer(args.steps)
    optimizer.build(model.trainable_variables)
    clip = bench.gradient_clip_norm()
    print(f"GBS {config.global_batch_size}, Adam {bench.learning_rate():.3g} on weights scaled by "
          f"{config.model.weight_scale:g}, clip {clip:.3g}", flush=True)  # fmt: skip

    update = sft.accumulated_step(
        model,
        optimizer,
        clip,
        lambda m, b: bench.compute_loss_and_metrics(m, b)[0],
        bench.micro_batch_size,
    )

    def evaluate(label: str) -> None:
        if args.eval_tasks:
            print_pass_at_k(policy, config, label)

    if not args.no_base_eval:
        evaluate("base")
    steps = input_lib.rollout_steps(policy, config, seed=0)
    for i in range(args.steps):
        begin = time.time()
        batch = next(steps)
        rollout_s = time.time() - begin
        policy_tokens = int(batch["token_mask"].sum())
        begin = time.time()
        loss, norm = update(batch)
        print(f"step {i + 1}: rollouts {rollout_s:.0f} s ({policy_tokens} policy tokens), update "
              f"{time.time() - begin:.0f} s, reward {float(np.mean(batch['rewards'])):.3f}, "
              f"grad norm {norm:.3g}, loss {loss:.4f}, load "
              f"{harness.load_average()}", flush=True)  # fmt: skip
    evaluate(f"base + {args.steps} GRPO steps")


if __name__ == "__main__":
    main()
