"""The pipeline's stage-local update without `--weight_update_sharding`: on D2 x P2 each stage's
replicas sum their stage's gradients over data (whole), clip with the whole model's norm, update
their stage's variables with their stage's Adam moments (whole, not divided by data) and hand
the other stage the new weights; the moments are saved under the optimizer's own keys, so the
checkpoint is the one an unsharded P = 1 run writes, and each restores the other.

At tiny shapes on the summer itself (a two-layer Keras model, the stages given), against a NumPy
transcription of the summed, clipped Adam steps; the same update through the pipeline's
`Trainer` on the smoke Llama is `tests/mlperf_tf/test_runner_pipeline.py`'s.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import checkpoints
from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.collectives.stages import StageMap
from mlperf_tf.optimizers.adam import FusedAdam
from mlperf_tf.parallel.mesh import DeviceMesh
from tests import strategies

pytestmark = pytest.mark.numerics

LR, CLIP, STEPS = 0.1, 0.5, 2
B1, B2, EPS = 0.9, 0.999, 1e-7  # Keras' Adam defaults (FusedAdam's)
ATOL = 1e-4 * LR
STAGES = [0, 0, 1, 1]  # the first Dense's kernel and bias on stage 0, the second's on stage 1
SHARED = (0,)  # the first kernel is read by stage 1 too (as a tied embedding): owned by stage 0


def _model():
    # Named: the checkpoint's keys are the variables' paths, the same in every model made here.
    layers = [keras.Input((3,)), keras.layers.Dense(2, name="a"), keras.layers.Dense(5, name="b")]
    model = keras.Sequential(layers, name="tiny")
    for i, v in enumerate(model.trainable_variables):
        v.assign(np.linspace(-1.0, 1.0, int(np.prod(v.shape))).reshape(v.shape) * (i + 1))
    return model


def _gradients(mesh: DeviceMesh, shapes):
    """Per step and replica, its gradients: random on its stage's variables and the shared one,
    zero on the other stage's (as a pipeline stage computes them)."""
    rng = np.random.default_rng(7)
    out = []
    for _ in range(STEPS):
        per_replica = []
        for replica in range(mesh.size):
            stage = mesh.index(replica, "pipeline")
            per_replica.append([
                rng.normal(size=s).astype(np.float32) if STAGES[i] == stage or i in SHARED
                else np.zeros(s, np.float32)
                for i, s in enumerate(shapes)
            ])  # fmt: skip
        out.append(per_replica)
    return out


def _numpy_adam(weights, grads_per_step):
    """The transcription: gradients summed over replicas, clipped to the global norm CLIP,
    Keras' Adam (epsilon outside the bias-corrected sqrt(v))."""
    w = [x.astype(np.float64) for x in weights]
    m = [np.zeros_like(x) for x in w]
    v = [np.zeros_like(x) for x in w]
    for t, per_replica in enumerate(grads_per_step, start=1):
        g = [sum(r[i] for r in per_replica).astype(np.float64) for i in range(len(w))]
        norm = np.sqrt(sum(np.sum(x**2) for x in g))
        g = [x * CLIP / max(norm, CLIP) for x in g]
        alpha = LR * np.sqrt(1 - B2**t) / (1 - B1**t)
        for i in range(len(w)):
            m[i] = m[i] + (g[i] - m[i]) * (1 - B1)
            v[i] = v[i] + (g[i] ** 2 - v[i]) * (1 - B2)
            w[i] = w[i] - alpha * m[i] / (np.sqrt(v[i]) + EPS)
    return w, m, v


def _stage_local(strategy, mesh):
    with strategy.scope():
        model = _model()
        optimizer = FusedAdam(LR)
        summer = GradientSummer(strategy, Settings(all_reduce="ring", timeout_s=60), mesh)
        summer.build(optimizer, model.trainable_variables, stages=StageMap(STAGES, SHARED))
        optimizer.build([] if summer.holds_slots else model.trainable_variables)
    return model, optimizer, summer


def _checkpoint(model, optimizer, summer=None):
    slots = summer.optimizer_slots() if summer is not None else None
    return checkpoints.run_checkpoint(model=model, optimizer=optimizer, optimizer_slots=slots)


def test_stage_local_adam_ends_at_the_numpy_steps_and_saves_the_unsharded_format(tmp_path):
    strategy = strategies.mirrored(4)
    mesh = DeviceMesh(data=2, pipeline=2)
    model, optimizer, summer = _stage_local(strategy, mesh)
    variables = model.trainable_variables
    shapes = [tuple(v.shape) for v in variables]
    assert summer.stage_local and summer.owners == STAGES and summer.shared == SHARED
    assert summer.metadata()["optimizer_state"] == "its pipeline stage's, whole"
    # Each replica holds its stage's moments whole: one buffer per moment, of the larger stage's
    # elements (stage 1: 2 * 5 + 5 = 15; stage 0: 3 * 2 + 2 = 8), not the model's 23.
    for buffer in summer.stage_slots.variables():
        assert [c.shape for c in strategy.experimental_local_results(buffer)] == [[15]] * 4
    assert summer.slot_bytes_per_replica() == 2 * 15 * 4

    start = [v.numpy() for v in variables]
    steps = _gradients(mesh, shapes)

    @tf.function
    def step(per_replica):
        def replica(grads):
            summer.apply(optimizer, list(grads), variables, clip_norm=CLIP)

        strategy.run(replica, args=(per_replica,))

    for per_replica in steps:
        values = strategy.experimental_distribute_values_from_function(
            lambda ctx, p=per_replica: tuple(tf.constant(g) for g in p[ctx.replica_id_in_sync_group])
        )  # fmt: skip
        step(values)
    want_w, want_m, want_v = _numpy_adam(start, steps)
    # float32 against float64: m / sqrt(v) of a small summed gradient moves ~1e-6 of an Adam
    # step (LR); a missed sum, clip or stage would move weights by ~1e-2.
    for v, want in zip(variables, want_w, strict=True):
        for component in strategy.experimental_local_results(v.value):  # mirrored: every copy
            np.testing.assert_allclose(component.numpy(), want, rtol=1e-5, atol=ATOL)

    # The checkpoint holds the moments under the keys an optimizer holding its slots uses.
    path = _checkpoint(model, optimizer, summer).write(str(tmp_path / "p2"))
    with strategy.scope():
        unsharded = FusedAdam(LR)
        unsharded.build(variables)
    moment_keys = set(checkpoints.optimizer_paths(unsharded)) - set(
        checkpoints.optimizer_paths(optimizer)
    )
    assert moment_keys == set(summer.slot_paths()) and len(moment_keys) == 2 * len(variables)
    stored = checkpoints.read_part(path, checkpoints.OPTIMIZER_PART)
    for i, v in enumerate(variables):
        key = v.path.replace("/", "_")
        np.testing.assert_allclose(stored[f"{key}_momentum"], want_m[i], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(stored[f"{key}_velocity"], want_v[i], rtol=1e-5, atol=1e-9)
    assert int(stored["iteration"]) == STEPS

    # P = 1 without the flag (the optimizer's own slots, one device) restores it ...
    model_1 = _model()
    optimizer_1 = FusedAdam(LR)
    optimizer_1.build(model_1.trainable_variables)
    _checkpoint(model_1, optimizer_1).read(path).assert_consumed()
    got = {k: v for k, v in checkpoints.optimizer_paths(optimizer_1).items()}
    for i, v in enumerate(model_1.trainable_variables):
        key = v.path.replace("/", "_")
        np.testing.assert_allclose(got[f"{key}_momentum"].numpy(), want_m[i], rtol=1e-5,
                                   atol=1e-7)  # fmt: skip
        np.testing.assert_allclose(v.numpy(), want_w[i], rtol=1e-5, atol=ATOL)
    # ... and its checkpoint restores a fresh stage-local run: each replica its stage's moments.
    path_1 = _checkpoint(model_1, optimizer_1).write(str(tmp_path / "p1"))
    model_2, optimizer_2, summer_2 = _stage_local(strategy, mesh)
    _checkpoint(model_2, optimizer_2, summer_2).read(path_1).assert_consumed()
    full = {k: v.numpy() for k, v in summer_2.full_slots().items()}
    for i in range(len(variables)):
        np.testing.assert_allclose(full[f"momentum_{i}"], want_m[i], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(full[f"velocity_{i}"], want_v[i], rtol=1e-5, atol=1e-9)
    for buffer in summer_2.stage_slots.variables():  # on every replica, its own stage's
        name = buffer.name.split("_")[1]
        for replica, component in enumerate(strategy.experimental_local_results(buffer)):
            stage = mesh.index(replica, "pipeline")
            own = [i for i, s in enumerate(STAGES) if s == stage]
            flat = np.concatenate([(want_m if name == "momentum" else want_v)[i].ravel()
                                   for i in own])  # fmt: skip
            np.testing.assert_allclose(component.numpy()[: flat.size], flat, rtol=1e-5,
                                       atol=1e-9)  # fmt: skip


def test_an_optimizer_without_a_rule_on_pieces_keeps_every_slot():
    """Keras' own Adam declares no update on pieces: every replica keeps every slot, as before
    (logged), rather than a refusal."""
    strategy = strategies.mirrored(2)
    mesh = DeviceMesh(pipeline=2)
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.Adam(LR)
        summer = GradientSummer(strategy, Settings(all_reduce="ring", timeout_s=60), mesh)
        summer.build(optimizer, model.trainable_variables, stages=StageMap(STAGES))
    assert not summer.holds_slots and summer.owners is None
    assert summer.metadata()["optimizer_state"] == "every variable's, whole"
    assert (
        "optimizer_state" not in GradientSummer(strategy, Settings(), DeviceMesh(data=2)).metadata()
    )
