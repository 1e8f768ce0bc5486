"""Provides `train` and `assert_same_training`: a benchmark trained a few steps with its images
split into K slabs (`--spatial_partition=K`) or K x L tiles (`KxL`) against the unsplit run, on
logical CPU devices.

Both runs go through the runner's pieces: the mesh's input routing (`for_mesh`: every replica
of a spatial group gets its batch shard's images), `Benchmark.compute_loss` and the `Trainer`
(Keras' cross-replica gradient sum inside `apply_gradients`). The reference is K = 1 on the same
batch shards (4/K devices, the same global batch and batch-norm groups of images), starting
from the same weights; synthetic batches differ between batch shards.

`dtype="float64"` builds both models in float64 (`keras.config.set_floatx`, restored after).
Deep float32 models need it: a model with millions of ReLU inputs has some within float32
rounding (~1e-5 after tens of layers) of zero, and any change of kernels (split or not; oneDNN
on or off) moves such an input across the kink and a gradient by percents, while the float64
runs' ReLUs agree (`benchmarks/ssd/README.md`, the mini model).
"""

from __future__ import annotations

import contextlib

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.benchmark import Benchmark, RunContext
from mlperf_tf.parallel import input as parallel_input
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.runner.trainer import Trainer
from tests.numerics import assert_close, scale_of
from tests.strategies import mirrored


def train(
    bench: Benchmark, *, parts: int, devices: int, steps: int, weights=None, cols: int = 1
) -> dict:
    """`steps` optimizer steps on `devices` replicas in groups of `parts` tiles (`parts / cols`
    slabs of rows x `cols` of columns).

    Returns:
      {"weights": {path: value} at the start, "grads": {path: the first batch's gradient summed
      over the replicas} (before training), "losses": [steps], "final": {path: value} after.}
    """
    strategy = mirrored(devices)
    mesh = DeviceMesh(data=devices // parts, spatial=parts, spatial_cols=cols)
    bench = bench.with_context(RunContext(num_replicas=devices, seed=0, mesh=mesh))
    with strategy.scope():
        model = bench.build_model()
        optimizer = bench.build_optimizer(bench.train_steps)
        optimizer.build(model.trainable_variables)
        if weights is not None:
            for v in model.weights:
                v.assign(weights[v.path])
    start = {v.path: v.numpy() for v in model.weights}
    dataset = strategy.distribute_datasets_from_function(
        parallel_input.for_mesh(bench.train_dataset, mesh)
    )
    iterator = iter(dataset)
    trainer = Trainer(
        strategy=strategy, benchmark=bench, model=model, optimizer=optimizer, xla=False
    )
    # By variable path: the gathers of the split model can change the variables' order.
    paths = [v.path for v in model.trainable_variables]
    grads = trainer.summed_gradients(next(iterator))
    grads = {path: g.numpy() for path, g in zip(paths, grads)}
    losses = [float(trainer.loop(iterator, tf.constant(1))[0]) for _ in range(steps)]
    final = {v.path: v.numpy() for v in model.weights}
    return {"weights": start, "grads": grads, "losses": losses, "final": final}


@contextlib.contextmanager
def floatx(dtype: str):
    """Keras' default float type and global dtype policy (variables and layers' compute dtype)
    set to `dtype` inside, both restored after. The policy too: Keras keeps the first one it
    made from `floatx`, so `set_floatx` alone does not reach layers made later in a process."""
    before, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(before)
        keras.config.set_dtype_policy(policy)


def assert_same_training(
    bench: Benchmark,
    *,
    parts: int,
    steps: int = 5,
    rtol: float = 1e-5,
    cols: int = 1,
    dtype: str = "float32",
):  # fmt: skip
    """`parts` tiles (`parts / cols` x `cols`) on 4 devices equals the whole image on
    4/`parts` devices: losses, first gradients and every weight (moving statistics included)
    after `steps` steps, to `rtol`; both models in `dtype` (see the module docstring)."""
    devices = 4
    with floatx(dtype):
        reference = train(bench, parts=1, devices=devices // parts, steps=steps)
        split = train(
            bench, parts=parts, devices=devices, steps=steps, weights=reference["weights"],
            cols=cols,
        )  # fmt: skip
    assert split["grads"].keys() == reference["grads"].keys()
    assert_close(split["losses"], reference["losses"], rtol=rtol)
    nonzero = sum(bool(np.any(want)) for want in reference["grads"].values())
    assert nonzero >= 0.8 * len(reference["grads"]), "zero gradients compare nothing"
    for path, want in reference["grads"].items():
        assert_close(split["grads"][path], want, rtol=rtol, err_msg=path)
    assert split["final"].keys() == reference["final"].keys()
    for path, want in reference["final"].items():
        # The floor follows the layer's scale: a BN beta starts at 0 and moves by ~1e-4 in 5
        # steps, its rounding is that of the layer's gamma-sized values.
        layer = path.rsplit("/", 1)[0]
        scale = max(
            scale_of(want),
            *(scale_of(v) for p, v in reference["weights"].items() if p.startswith(layer + "/")),
        )
        assert_close(split["final"][path], want, rtol=rtol, err_msg=path, scale=scale)
    return reference, split
