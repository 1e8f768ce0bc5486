"""Prints, step by step, the sizes of the Neumann optimizer's regularizer forces against |g|.

It trains the resnet50 benchmark's model (mini data, `--base_width` channels) with `Neumann`
built by the benchmark (its LR schedule, the registry hyperparameters given by `--params`) and,
before each `apply_gradients`, computes what that step's update will use: per variable
|w - v|, |g| and the repulsive force beta / |w - v|^2 (beta = repulsive_regularizer x elements
of the variable), and the same over the whole model (one norm over all variables, beta =
repulsive_regularizer x all parameters). It answers "where does the NaN come from".

    python tools/studies/probe_neumann.py [--steps=12] [--batch=256] [--base_width=16] [--lr=0.1]
        [--params=neumann_reset_interval=10,neumann_momentum_ramp_steps=5,neumann_warmup_steps=5]
        [--norm_scope=variable|model]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from mlperf_tf import config as config_lib  # noqa: E402
from mlperf_tf import registry  # noqa: E402


def build(args):
    """The benchmark, its model, its Neumann optimizer and an iterator over its train batches."""
    benchmark_class = registry.get("resnet50")
    overrides = {
        "model.base_width": str(args.base_width),
        "global_batch_size": str(args.batch),
        "max_epochs": str(args.epochs),
        "optimizer.opt_name": "neumann",
        "optimizer.lars_opt_base_learning_rate": str(args.lr),
        "optimizer.lars_opt_learning_rate_warmup_epochs": "1",
    }
    params = [p for p in args.params.split(",") if p]
    if args.norm_scope:
        params.append(f"neumann_norm_scope={args.norm_scope}")
    if params:
        overrides["optimizer.opt_params"] = "(" + ",".join(params) + ")"
    config = config_lib.override(benchmark_class.preset("mini"), overrides)
    benchmark = benchmark_class(config)
    model = benchmark.build_model()
    optimizer = benchmark.build_optimizer(benchmark.train_steps)
    optimizer.build(model.trainable_variables)
    dataset = benchmark.train_dataset(tf.distribute.InputContext())
    return benchmark, model, optimizer, iter(dataset)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--epochs", type=float, default=4.0)
    parser.add_argument("--base_width", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument(
        "--params",
        default="neumann_reset_interval=10,neumann_momentum_ramp_steps=5,neumann_warmup_steps=5",
    )
    parser.add_argument("--norm_scope", default="", help="neumann_norm_scope, when it exists")
    args = parser.parse_args(argv)

    benchmark, model, optimizer, batches = build(args)
    variables = model.trainable_variables
    total = sum(int(np.prod(v.shape)) for v in variables)
    print(f"{len(variables)} variables, {total} parameters; {type(optimizer).__name__}")
    beta_scale = optimizer.repulsive_regularizer

    @tf.function
    def gradients(batch):
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch)
        return loss, tape.gradient(loss, variables)

    @tf.function
    def apply(grads):
        optimizer.apply_gradients(zip(grads, variables))

    for _ in range(args.steps):
        loss, grads = gradients(next(batches))
        iteration = int(optimizer.iterations.numpy())
        lr = float(optimizer.learning_rate.numpy())
        t = iteration - optimizer.warmup_steps
        phase = (
            "warm-up" if t < 0 else ("reset" if t % optimizer.reset_interval == 0 else "neumann")
        )
        rows = []
        for variable, grad, average in zip(variables, grads, optimizer._averages):
            delta = variable.numpy().astype(np.float64) - average.numpy()
            norm = float(np.linalg.norm(delta))
            size = delta.size
            force = beta_scale * size / norm**2 if norm > 0 else 0.0
            rows.append((force, norm, float(np.linalg.norm(grad.numpy())), size, variable.path))
        all_delta = np.sqrt(sum(r[1] ** 2 for r in rows))
        all_grad = np.sqrt(sum(r[2] ** 2 for r in rows))
        # Per variable the repulsive step on variable i is beta_i / |d_i|^2 along a unit vector,
        # so over the model its size is the root of the sum of their squares.
        per_variable_total = np.sqrt(sum(r[0] ** 2 for r in rows))
        global_force = beta_scale * total / all_delta**2 if all_delta > 0 else 0.0
        worst = max(rows)
        print(
            f"step {iteration:2d} ({phase:7s}) lr {lr:.4g} loss {float(loss):.4g} "
            f"|g| {all_grad:.3g} |w-v| {all_delta:.3g}: repulsive force per variable "
            f"(model total) {per_variable_total:.3g}, worst {worst[0]:.3g} on {worst[4]} "
            f"({worst[3]} elements, |w-v| {worst[1]:.3g}, |g| {worst[2]:.3g}); "
            f"over the model (one norm) {global_force:.3g}"
        )
        apply(grads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
