"""Measures why SSD's mini model cannot be compared with spatial partitioning in float32.

Issue 29 had the mini preset's model (ResNet-34 depth, 1/4 width, BN in the extras) split into K
slabs with first-step gradients up to 8 % away from the unsplit model's. This tool shows that
the unsplit model is as far from itself under a rounding-sized change, and that the split is
exact in float64 (the mini-size test). For one set of initial weights and one batch it prints
the largest relative difference over the variables (max |a - b| / max |b| per variable) of the
first-step gradients:

* float32, unsplit, kernels scaled by 1 + `--perturb` (random per entry) vs unsplit;
* float32, K slabs vs unsplit.

Measured (seed 1, K = 2; 2026-11-26, shared 2-core AMD EPYC, load ~5): 19 % and 19 % (98 of
131 variables above 1e-4 each). In float64 (separate processes, same weights and batch) the
split and unsplit first-step gradients agreed to 3e-14 (`tests/benchmarks/ssd/test_spatial.py`
compares them in float64). The cause is ReLU's kink: about 2 M
ReLU inputs per replica, float32 rounding of ~1e-5 after tens of layers, so some input sits
that close to zero and its gradient is on or off depending on the kernels (oneDNN on vs off
moves the unsplit model the same way: rerun with `TF_ENABLE_ONEDNN_OPTS=0` and compare).

Usage: python tools/studies/ssd_relu_kinks.py [--seed=1] [--parts=2] [--perturb=1e-6]
(about 2 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository root

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tools import harness  # noqa: E402


def _bench():
    from benchmarks.ssd import config as config_lib  # noqa: PLC0415
    from benchmarks.ssd.benchmark import SSDBenchmark  # noqa: PLC0415

    config = config_lib.smoke()
    return SSDBenchmark(
        dataclasses.replace(config, global_batch_size=4, model=config_lib.mini().model)
    )


def first_gradients(bench, *, parts: int, devices: int, weights=None) -> dict:
    """{"weights": {path: value}, "grads": {path: the first batch's gradient summed over the
    replicas}} of `bench` on `devices` replicas in groups of `parts` slabs (K = `parts`).

    The mesh's input routing gives every replica of a spatial group its batch shard's images,
    so K = 1 on `devices / parts` replicas sees the same batch shards as the split run.
    """
    from mlperf_tf.benchmark import RunContext  # noqa: PLC0415
    from mlperf_tf.parallel import input as parallel_input  # noqa: PLC0415
    from mlperf_tf.parallel import mesh as parallel_mesh  # noqa: PLC0415
    from mlperf_tf.runner.trainer import Trainer  # noqa: PLC0415

    strategy = harness.mirrored_cpus(devices)
    mesh = parallel_mesh.DeviceMesh(data=devices // parts, spatial=parts)
    bench = bench.with_context(RunContext(num_replicas=devices, seed=0, mesh=mesh))
    with strategy.scope():
        model = bench.build_model()
        optimizer = bench.build_optimizer(bench.train_steps)
        for v in model.weights if weights is not None else ():
            v.assign(weights[v.path])
    start = {v.path: v.numpy() for v in model.weights}
    batches = strategy.distribute_datasets_from_function(
        parallel_input.for_mesh(bench.train_dataset, mesh)
    )
    # The runner's gradients (the spatial group's members share one batch shard's loss).
    trainer = Trainer(
        strategy=strategy, benchmark=bench, model=model, optimizer=optimizer, xla=False
    )
    # By variable path: the gathers of the split model can change the variables' order.
    paths = [v.path for v in model.trainable_variables]
    grads = trainer.summed_gradients(next(iter(batches)))
    return {"weights": start, "grads": {p: g.numpy() for p, g in zip(paths, grads)}}


def worst(grads: dict, reference: dict) -> tuple[float, int]:
    """(largest relative difference over the variables, variables above 1e-4)."""
    errors = [
        float(np.max(np.abs(grads[p] - want)) / max(float(np.max(np.abs(want))), 1e-30))
        for p, want in reference.items()
    ]
    return max(errors), sum(e > 1e-4 for e in errors)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--parts", type=int, default=2, choices=(2, 4))
    parser.add_argument("--perturb", type=float, default=1e-6)
    args = parser.parse_args(argv)
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 4)
    bench, k = _bench(), args.parts
    keras.utils.set_random_seed(args.seed)
    reference = first_gradients(bench, parts=1, devices=4 // k)
    weights = reference["weights"]
    rng = np.random.default_rng(args.seed)
    scaled = {
        p: (v * (1 + args.perturb * rng.standard_normal(v.shape))).astype(v.dtype)
        if p.endswith("kernel")
        else v
        for p, v in weights.items()
    }
    nudged = first_gradients(bench, parts=1, devices=4 // k, weights=scaled)
    split = first_gradients(bench, parts=k, devices=4, weights=weights)
    report = "{}: {:.2e} ({} of the variables > 1e-4)"
    perturbed = f"float32 unsplit, kernels x (1 + {args.perturb:g}) vs unsplit"
    print(report.format(perturbed, *worst(nudged["grads"], reference["grads"])))
    print(report.format(f"float32 K={k} vs unsplit", *worst(split["grads"], reference["grads"])))


if __name__ == "__main__":
    main()
