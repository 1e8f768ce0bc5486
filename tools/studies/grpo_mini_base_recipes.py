"""Which supervised recipe gives the `qwen35_397b_grpo` mini a base strong enough for GRPO? Trains
one base (`sft.train_base` under a `sft.BaseRecipe` from the flags; the unset ones are the
declared `config.MINI_BASE_*`) into `--out_dir`, saving every `--eval_every` steps, then prints
each saved step's teacher-forced edit accuracy on the held-out expert trajectories
(`sft.edit_accuracy`, the proxy of `grpo_mini_baselines.py`), the training time and the load.

    python tools/studies/grpo_mini_base_recipes.py --out_dir=DIR [--steps=200] [--lr=2e-3]
        [--warmup=0] [--final_lr_fraction=1.0] [--embedding_lr_scale=1.0] [--clip=1.0]
        [--batch=8] [--eval_every=50] [--proxy_tasks=64]
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
    parser.add_argument("--out_dir", required=True, help="a new folder (never the cache's bases)")
    parser.add_argument("--proxy_tasks", type=int, default=64)
    parser.add_argument("--eval_every", type=int, default=50, help="0: the last step only")
    fields = {f.name: f for f in dataclasses.fields(_recipe_class())}
    for name, field in fields.items():
        parser.add_argument(f"--{name}", type=type(field.default), default=field.default)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.proxy_tasks < 1 or args.eval_every < 0:
        parser.error("--steps and --proxy_tasks must be positive, --eval_every >= 0")

    from benchmarks.qwen35_397b_grpo import config as config_lib  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo import sft, tasks  # noqa: PLC0415
    from benchmarks.qwen35_397b_grpo.model import build_model  # noqa: PLC0415
    from tools import harness  # noqa: PLC0415

    recipe = sft.BaseRecipe(**{name: getattr(args, name) for name in fields})
    config = config_lib.mini()
    load = [harness.load_average()]
    summary = sft.train_base(args.out_dir, config=config, recipe=recipe,
                             save_every=args.eval_every)  # fmt: skip
    load.append(harness.load_average())
    print(f"{recipe}: {summary} (load {load[0]} -> {load[1]})", flush=True)
    held_out = sft.expert_rollouts(config, tasks.make_tasks(args.proxy_tasks,
                                                            config.rollout.task_seed + 1))  # fmt: skip
    model = build_model(dataclasses.replace(config.model, weight_scale=1.0))
    every = args.eval_every or args.steps
    for step in range(every, args.steps + 1, every):
        begin = time.time()
        name = sft.WEIGHTS if step == args.steps else f"step{step}.weights.h5"
        model.load_weights(os.path.join(args.out_dir, name))
        proxy = sft.edit_accuracy(model, held_out)
        print(f"step {step}: edit bytes right {proxy['bytes']:.3f}, whole edits right "
              f"{proxy['edits']:.3f} on {args.proxy_tasks} held-out expert trajectories "
              f"({time.time() - begin:.0f} s, load {harness.load_average()})", flush=True)  # fmt: skip


def _recipe_class():
    """`sft.BaseRecipe` (imported here: TensorFlow loads with it)."""
    from benchmarks.qwen35_397b_grpo.sft import BaseRecipe  # noqa: PLC0415

    return BaseRecipe


if __name__ == "__main__":
    main()
