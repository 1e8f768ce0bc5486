"""What does a `qwen35_397b_grpo` mini GRPO step cost, and does GRPO move the mini base? Runs
`--steps` GRPO steps from a base (the mini's settings: 8 tasks x 16 rollouts, the rules'
learning rate and clip on the scaled parametrization, `--weight_scale` to try another s; the
benchmark's own rollouts, batch and loss), printing each step's rollout time, update time,
mean reward, the advantage signal (groups of 16 whose rewards are all 0 or all 1 carry no
gradient), the policy's tokens a rollout, the rollouts overlong filtering dropped and the
gradient norm against the clip; then the pass@4 on the first `--eval_tasks` held-out tasks
(the same tasks and seed every time) before, every `--eval_every` steps and after, with its
binomial standard error, and, with `--compare=FILE` (a `--solved_out` of another run), the
paired difference on the same tasks. With the load average. A study of the run, not the run:
no MLPerf log, no async overlap.

    python tools/studies/grpo_mini_steps.py [--weights=BASE/model.weights.h5] [--steps=4]
        [--eval_tasks=64] [--eval_every=0] [--prompts_per_step=8] [--no_base_eval]
        [--weight_scale=S] [--solved_out=FILE.json] [--compare=FILE.json]
        [--save_weights=FILE.weights.h5]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root


def step_signal(rewards, sample_mask, token_mask, generations: int) -> dict[str, float]:
    """A step's advantage signal: of its groups of `generations` rollouts, how many have all
    rewards 0 or all 1 (no advantage, no gradient), the policy's tokens a rollout and the
    rollouts overlong filtering dropped (`sample_mask` 0)."""
    import numpy as np  # noqa: PLC0415

    groups = np.asarray(rewards, np.float64).reshape(-1, generations)
    return {
        "all_0": int(np.sum(groups.max(axis=1) == 0)),
        "all_1": int(np.sum(groups.min(axis=1) == 1)),
        "groups": len(groups),
        "tokens": float(np.mean(np.sum(token_mask, axis=1))),
        "dropped": int(np.sum(np.asarray(sample_mask) == 0)),
    }


def paired_difference(solved, base) -> tuple[float, float, int, int]:
    """(mean difference, its paired standard error, tasks gained, tasks lost) of two 0/1
    vectors over the same tasks."""
    if len(solved) != len(base):
        raise ValueError(f"error: --compare has {len(base)} tasks, this run {len(solved)}")
    gained = sum(1 for a, b in zip(solved, base) if a and not b)
    lost = sum(1 for a, b in zip(solved, base) if b and not a)
    n = len(solved)
    diff = (gained - lost) / n
    var = ((gained + lost) / n - diff**2) / n
    return diff, math.sqrt(max(var, 0.0)), gained, lost


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", default="", help="default: the mini base's")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--eval_tasks", type=int, default=64, help="0: no pass@4")
    parser.add_argument("--eval_every", type=int, default=0, help="0: after the last step only")
    parser.add_argument("--prompts_per_step", type=int, default=0, help="0: the mini's")
    parser.add_argument("--no_base_eval", action="store_true", help="evaluate after only")
    parser.add_argument("--weight_scale", type=float, default=0.0,
                        help="the parametrization's s (default: the mini's)")  # fmt: skip
    parser.add_argument("--solved_out", default="", help="JSON of each evaluation's tasks solved")
    parser.add_argument("--compare", default="", help="a --solved_out whose first is the base")
    parser.add_argument(
        "--save_weights", default="", help="the weights after the last step (unscaled)"
    )
    args = parser.parse_args(argv)
    if args.steps < 1 or min(args.eval_tasks, args.prompts_per_step, args.eval_every) < 0:
        parser.error("--steps must be positive, --eval_tasks, --eval_every and "
                     "--prompts_per_step >= 0")  # fmt: skip
    if args.weight_scale < 0:
        parser.error("--weight_scale must be >= 0 (0: the mini's)")
    base_solved = None
    if args.compare:
        try:
            with open(args.compare) as f:
                base_solved = json.load(f)[0]["solved"]
        except (OSError, ValueError, KeyError, IndexError) as e:
            parser.error(f"--compare={args.compare}: not a --solved_out file ({e})")

    import numpy as np  # noqa: PLC0415 (the heavy imports after --help)

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import input as input_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import load_base_weights  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    config = config_lib.mini()
    prompts = args.prompts_per_step or config.grpo.num_prompts_per_step
    grpo = dataclasses.replace(config.grpo, num_prompts_per_step=prompts)
    model_config = config.model
    if args.weight_scale:
        model_config = dataclasses.replace(model_config, weight_scale=args.weight_scale)
    config = dataclasses.replace(
        config, grpo=grpo, global_batch_size=grpo.global_batch_size, model=model_config,
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
          f"{config.model.weight_scale:g} (as Adam at "
          f"{bench.learning_rate() * config.model.weight_scale:.3g}), clip {clip:.3g}",
          flush=True)  # fmt: skip

    update = sft.accumulated_step(
        model,
        optimizer,
        clip,
        lambda m, b: bench.compute_loss_and_metrics(m, b)[0],
        bench.micro_batch_size,
    )
    evaluations = []

    def evaluate(label: str) -> None:
        if not args.eval_tasks:
            return
        begin = time.time()
        solved = []
        batches = input_lib.validation_batches(
            policy, config, batch_tasks=config.eval_batch_size, seed=0
        )  # the run's evaluation
        for b in batches:
            hit = np.any(b["rewards"] > 0, axis=1)
            solved += [int(h) for h, v in zip(hit, b["valid"]) if v]
        n = len(solved)
        p = sum(solved) / n
        line = (f"{label}: pass@4 {p:.3f} +- {math.sqrt(p * (1 - p) / n):.3f} (binomial s.e.) "
                f"on the first {n} held-out tasks")  # fmt: skip
        reference = base_solved or (evaluations[0]["solved"] if evaluations else None)
        if reference is not None:
            diff, se, gained, lost = paired_difference(solved, reference)
            line += f"; against the base {diff:+.3f} +- {se:.3f} (paired: +{gained} -{lost})"
        print(f"{line} ({time.time() - begin:.0f} s, load {harness.load_average()})", flush=True)
        evaluations.append({"label": label, "solved": solved})
        if args.solved_out:
            with open(args.solved_out, "w") as f:
                json.dump(evaluations, f)

    if not args.no_base_eval:
        evaluate("base")
    steps = input_lib.rollout_steps(policy, config, seed=0)
    for i in range(args.steps):
        begin = time.time()
        batch = next(steps)
        rollout_s = time.time() - begin
        signal = step_signal(batch["rewards"], batch["sample_mask"], batch["token_mask"],
                             grpo.num_generations_per_prompt)  # fmt: skip
        begin = time.time()
        loss, norm = update(batch)
        print(f"step {i + 1}: rollouts {rollout_s:.0f} s, update {time.time() - begin:.0f} s, "
              f"reward {float(np.mean(batch['rewards'])):.3f}, groups all-0 {signal['all_0']} "
              f"all-1 {signal['all_1']} of {signal['groups']}, {signal['tokens']:.0f} policy "
              f"tokens a rollout, {signal['dropped']} overlong dropped, grad norm {norm:.3g} "
              f"(clip {clip:.3g}), loss {loss:.4f}, load {harness.load_average()}",
              flush=True)  # fmt: skip
        if args.eval_every and (i + 1) % args.eval_every == 0 and i + 1 < args.steps:
            evaluate(f"base + {i + 1} GRPO steps")
    evaluate(f"base + {args.steps} GRPO steps")
    if args.save_weights:  # in the plain model's form, as the base's (`load_base_weights`)
        if config.model.weight_scale != 1.0:
            for v, value in zip(model.trainable_variables, model.effective_values()):
                v.assign(value)
        model.save_weights(args.save_weights)


if __name__ == "__main__":
    main()
