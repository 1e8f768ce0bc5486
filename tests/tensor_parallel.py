"""Provides `train`: a few steps of a benchmark on a data x expert x model mesh of logical CPUs,
returning the losses, the whole first-step gradients and the whole weights, for the exactness
tests of tensor and expert parallelism (a split run against the unsplit run of the same number of
batch shards)."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.benchmark import RunContext
from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.optimizers import LAMB, LARS
from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.parallel import layout as layout_lib
from mlperf_tf.parallel.context import use_mesh
from mlperf_tf.parallel.input import for_mesh
from mlperf_tf.parallel.mesh import build_mesh
from tests import strategies
from tests.numerics import assert_close

STEPS = 10


@dataclasses.dataclass
class Result:
    losses: list[float]
    grads: list[np.ndarray]  # whole, summed over the data axis, at the initial weights
    weights: list[np.ndarray]  # whole, after the steps
    names: list[str]
    replicated_grads_agree: bool  # replicated weights got the same gradient on every shard
    slots: dict[str, np.ndarray]  # the optimizer's variables, whole, by name


def make_optimizer(name: str, benchmark):
    """ "adam" (the Transformer's fused Adam), "lamb" (BERT's), "lars" (ResNet-50's, whose
    trust ratio needs whole norms as LAMB's does), or "own": the benchmark's."""
    if name == "lamb":
        return LAMB(0.01, weight_decay=0.01)
    if name == "lars":
        return LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01)
    if name == "adam":
        # lr 1e-3: Adam divides each gradient by its running RMS, so an element whose gradient is
        # ~0 moves by up to lr on rounding alone (at 1e-2 one of 2,048 weights differed by 1.1e-5).
        return FusedAdam(1e-3)
    return benchmark.build_optimizer(100)


def _whole_grads(per_replica, variables, mesh):
    """Per replica lists of local gradients -> whole gradients, each shard summed over its
    layout's sum group (the batch shards that hold it), and whether every replica that holds a
    shard got the same sum (replicated weights across a model group)."""
    out, agree = [], True
    for i, v in enumerate(variables):
        layout = layout_lib.layout_of(v)
        split = layout.split and layout.num_shards(mesh) > 1
        shards = {}
        for r in range(mesh.size):
            s = layout.shard_index(mesh, r) if split else 0
            summed = sum(np.asarray(per_replica[m][i]) for m in layout.sum_group(mesh, r))
            if s in shards:
                agree &= bool(np.allclose(summed, shards[s], rtol=1e-5, atol=1e-7))
            else:
                shards[s] = summed
        if split:
            out.append(np.concatenate([shards[s] for s in sorted(shards)], axis=layout.split_axis))
        else:
            out.append(shards[0])
    return out, agree


def on_mesh(benchmark, num_devices: int, **mesh_flags):
    """(a MirroredStrategy over `num_devices` logical CPUs, the mesh of `mesh_flags`
    (`build_mesh`'s), `benchmark` in a run context on it, every collective bounded by 60 s);
    Keras' seed set to 1."""
    strategy = strategies.mirrored(num_devices)
    mesh = build_mesh(num_devices, **mesh_flags)
    context = RunContext(num_replicas=num_devices, seed=1, mesh=mesh, collective_timeout_s=60.0)
    keras.utils.set_random_seed(1)
    return strategy, mesh, benchmark.with_context(context)


def train(benchmark, *, num_devices: int, model_parallel: int, optimizer: str,
          steps: int = STEPS, all_reduce: str = "ring", weight_update_sharding: bool = False,
          clip_norm: float | None = None, save_to: str = "", restore_from: str = "",
          expert_parallel: int = 1, pack_mb: float = 0.0,
          context_parallel: int = 1, dense_gradients: bool = False) -> Result:  # fmt: skip
    """`steps` steps of `benchmark` (a Benchmark of a smoke config, dropout off) on
    `num_devices` logical CPUs split as `expert_parallel` x `context_parallel` x
    `model_parallel` (the rest: data);
    optionally restored from a checkpoint (`restore_from`, before the steps) and saved
    (`save_to`, after them), as the runner's checkpoint holds them
    (`tf.train.Checkpoint(model=..., optimizer=...)`). Every collective waits at most 60 s.
    The summer gets the gradients as taken (an embedding's sparse), or made dense
    (`dense_gradients`: the path that sums a table's whole gradient)."""
    strategy, mesh, benchmark = on_mesh(
        benchmark, num_devices, model_parallel=model_parallel, expert_parallel=expert_parallel,
        context_parallel=context_parallel,
    )  # fmt: skip
    settings = Settings(all_reduce=all_reduce, weight_update_sharding=weight_update_sharding,
                        pack_mb=pack_mb, timeout_s=60)  # fmt: skip
    summer = GradientSummer(strategy, settings, mesh)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        opt = make_optimizer(optimizer, benchmark)
        variables = model.trainable_variables
    # The model found the ambient mesh: it is split as asked, or the comparison would be of two
    # unsplit runs.
    shards = {layout_lib.layout_of(v).num_shards(mesh) for v in variables}
    assert max(shards) == max(model_parallel, expert_parallel), shards
    assert mesh.context == context_parallel
    with strategy.scope():
        opt.build([] if summer.sharded else variables)
        summer.build(opt, variables)
        layout_lib.split_slots(opt, mesh)
        checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)
        if restore_from:
            checkpoint.read(restore_from).assert_consumed()
    dataset = strategy.distribute_datasets_from_function(for_mesh(benchmark.train_dataset, mesh))
    data = iter(dataset)

    def replica_step(batch):
        with tf.GradientTape() as tape:
            loss = benchmark.compute_loss(model, batch, training=True)
        grads = tape.gradient(loss, variables)
        dense = [tf.convert_to_tensor(g) for g in grads]
        summer.apply(opt, dense if dense_gradients else grads, variables, clip_norm=clip_norm)
        return loss, dense

    @tf.function
    def step(iterator):
        loss, grads = strategy.run(replica_step, args=(next(iterator),))
        total = strategy.reduce("sum", loss, axis=None) / mesh.loss_copies
        return total, grads

    losses, first_grads, agree = [], None, True
    for s in range(steps):
        loss, grads = step(data)
        losses.append(float(loss))
        if s == 0:
            local = [strategy.experimental_local_results(g) for g in grads]
            per_replica = [[local[i][r] for i in range(len(local))] for r in range(num_devices)]
            first_grads, agree = _whole_grads(per_replica, variables, mesh)
    with strategy.scope():
        weights = [np.asarray(layout_lib.whole_value(v, mesh)) for v in variables]
        slots = {v.name: np.asarray(layout_lib.whole_value(v, mesh)) for v in opt.variables}
        if save_to:
            checkpoint.write(save_to)
    names = [v.path for v in variables]
    return Result(losses, first_grads, weights, names, agree, slots)


def assert_same_run(got: Result, ref: Result, *, rtol: float = 1e-5) -> None:
    """`got` (split) equals `ref` (unsplit): losses, first gradients and final weights.

    Gradients (and weights) are compared with an absolute floor at `rtol` times the largest
    gradient (weight) of the model: a gradient that is zero in exact arithmetic (BERT's key bias: softmax does not change
    when a constant is added to every score) is rounding noise of ~1e-13 on both sides.
    """
    assert got.replicated_grads_agree
    assert_close(got.losses, ref.losses, rtol=rtol, err_msg="losses")
    scale = max(float(np.max(np.abs(e))) for e in ref.grads)
    for name, a, e in zip(got.names, got.grads, ref.grads, strict=True):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * scale, err_msg=f"gradient {name}")
    # Weights likewise: BERT's key bias stays 0 in exact arithmetic and drifts by ~1e-9.
    weight_scale = max(float(np.max(np.abs(e))) for e in ref.weights)
    for name, a, e in zip(got.names, got.weights, ref.weights, strict=True):
        np.testing.assert_allclose(
            a, e, rtol=rtol, atol=rtol * weight_scale, err_msg=f"weight {name}"
        )


def assert_split_equals_unsplit(
    benchmark, *, num_devices: int, model_parallel: int, expert_parallel: int = 1,
    rtol: float = 1e-5, context_parallel: int = 1, **train_args,
) -> Result:  # fmt: skip
    """Trains `benchmark` split on `num_devices` logical CPUs (`expert_parallel` x
    `context_parallel` x `model_parallel`, the rest data) and unsplit on the same
    `num_devices // (model_parallel x context_parallel)` batch shards; asserts the two runs are the same (`assert_same_run`) and returns the split
    one. `train_args` (optimizer, steps, ...) go to both runs.

    The exactness test every split model shares: a layout may change where the work runs, never
    what the model computes.
    """
    shards = num_devices // (model_parallel * context_parallel)
    ref = train(benchmark, num_devices=shards, model_parallel=1, **train_args)
    got = train(
        benchmark, num_devices=num_devices, model_parallel=model_parallel,
        expert_parallel=expert_parallel, context_parallel=context_parallel, **train_args,
    )  # fmt: skip
    assert_same_run(got, ref, rtol=rtol)
    return got


def split_cases(default, *slow):
    """Parametrizes an exactness test by (`devices`, `model_parallel`, `optimizer`): `default`
    runs in the default test run, each of `slow` only under `-m slow` (one split of each model
    by default keeps the test run in its budget)."""
    return pytest.mark.parametrize(
        ("devices", "model_parallel", "optimizer"),
        [default, *(pytest.param(*case, marks=pytest.mark.slow) for case in slow)],
    )


def smoke(benchmark_class, **model):
    """`benchmark_class` on its smoke preset with the model fields in `model` replaced (dropout
    off for the exactness tests, more heads to split, ...)."""
    config = benchmark_class.preset("smoke")
    return benchmark_class(
        dataclasses.replace(config, model=dataclasses.replace(config.model, **model))
    )


def imported_whole(benchmark, load, num_devices: int, **mesh_flags) -> tuple[dict, int]:
    """A checkpoint import on a split model: `benchmark`'s model built on `num_devices`
    logical CPUs split as `mesh_flags`, then `load(model)` run there (cross-replica context, the
    mesh ambient, as the runner's `restore_initial_weights`). Returns ({variable path: its
    whole value}, how many variables the mesh splits)."""
    strategy, mesh, benchmark = on_mesh(benchmark, num_devices, **mesh_flags)
    with strategy.scope(), use_mesh(mesh):
        model = benchmark.build_model()
        load(model)
        whole = {v.path: layout_lib.whole_value(v, mesh).numpy() for v in model.weights}
    split = sum(
        1 for v in model.weights
        if layout_lib.layout_of(v).split and layout_lib.layout_of(v).num_shards(mesh) > 1
    )  # fmt: skip
    return whole, split


def assert_split_import_is_whole(benchmark, load, *, min_split: int, **mesh_flags) -> None:
    """`load` on `benchmark`'s model split over 2 logical CPUs as `mesh_flags` gives every
    variable the unsplit import's whole tensor, bit for bit (an import copies), and the mesh
    splits at least `min_split` variables (so the test checks a split)."""
    want, _ = imported_whole(benchmark, load, 1)
    got, split = imported_whole(benchmark, load, 2, **mesh_flags)
    assert split >= min_split
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def crossed_split_cases(variants: dict, *, default: tuple[str, str]) -> list:
    """pytest parameters (expert_parallel, model_parallel, variant value) of E2 and M2 on 2
    devices crossed with two variants (name -> value): E2 with `default[0]` and M2 with
    `default[1]` in the default run, the other two pairs `slow` (the default run's budget)."""
    cases = []
    for index, (layout, e, m) in enumerate((("E2", 2, 1), ("M2", 1, 2))):
        for name, value in variants.items():
            marks = () if name == default[index] else (pytest.mark.slow,)
            cases.append(pytest.param(e, m, value, marks=marks, id=f"{layout}-{name}"))
    return cases
