"""Expert parallelism of `MoEFeedForward` on 4 logical CPUs: E = 2 and 4 equal E = 1.

Each of the 4 replicas reads different tokens. With E = 1 every replica holds all experts (a
data axis of 4); with E = P the experts are split over P replicas of the expert axis (data axis
4 / P) and tokens travel by all-to-all. Routing is per replica (a replica's tokens are one
group, and the capacity counts the static `group_size`), so each token's experts, its place in
their buffers and which choices overflow do not depend on P: the capacity factor here (1.0)
really drops choices, and the results are still the same. Dropout and jitter are off.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives.ops import Collectives, Traffic, static_replica_id
from mlperf_tf.layers import moe
from mlperf_tf.parallel import expert_layout as layout
from mlperf_tf.parallel.mesh import DeviceMesh
from tests.numerics import assert_close
from tests.strategies import mirrored

pytestmark = pytest.mark.numerics

D, F, E, T, REPLICAS, STEPS = 8, 16, 4, 16, 4, 10


class TinyMoE(keras.Model):
    """Dense (replicated) -> MoE (split) with a residual."""

    def __init__(self, mesh: DeviceMesh, capacity_factor: float):
        super().__init__()
        self.dense = keras.layers.Dense(D, name="dense")
        self.moe = moe.MoEFeedForward(
            hidden_size=D, filter_size=F, num_experts=E, top_k=2,
            capacity_factor=capacity_factor, group_size=T, expert_parallel=mesh.expert,
            mesh=mesh, name="moe", collective_timeout_s=60,
        )  # fmt: skip

    def build(self, input_shape=None):
        self.dense.build((None, D))
        self.moe.build((None, D))
        super().build(input_shape)

    def call(self, x, training=False):
        h = self.dense(x)
        y, stats = self.moe(h, training=training)
        return h + y, stats


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, REPLICAS, T, D)).astype(np.float32)
    target = rng.normal(size=(STEPS, REPLICAS, T, D)).astype(np.float32)
    return x, target


def _run(expert_parallel: int, whole_init: list | None, capacity_factor: float):
    """10 SGD-momentum steps; returns (losses, first step's summed grads, whole weights)."""
    mesh = DeviceMesh(data=REPLICAS // expert_parallel, expert=expert_parallel)
    strategy = mirrored(REPLICAS)
    with strategy.scope():
        model = TinyMoE(mesh, capacity_factor)
        model.build()
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)
    variables = model.trainable_variables
    if whole_init is None:
        whole_init = [layout.gather_whole(strategy, mesh, v) for v in variables]
    for v, whole in zip(variables, whole_init, strict=True):
        layout.load_whole(strategy, mesh, v, whole)
    summer = layout.LayoutSummer(mesh, timeout_s=60)
    x_all, target_all = _data()

    def replica_step(x, target, apply):
        with tf.GradientTape() as tape:
            out, stats = model(x, training=True)
            loss = tf.reduce_mean(tf.square(out - target)) + model.moe.aux_loss(stats)
            loss = loss / REPLICAS
        grads = tape.gradient(loss, variables)
        if apply:
            summer.apply(optimizer, grads, variables)
            return loss, []
        return loss, summer.sum(grads, variables)

    def per_replica(values):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(values[ctx.replica_id_in_sync_group])
        )

    @tf.function
    def step(x, target, apply):
        loss, grads = strategy.run(replica_step, args=(x, target, apply))
        return strategy.reduce("SUM", loss, axis=None), grads

    losses, first_grads = [], None
    for s in range(STEPS):
        x, target = per_replica(x_all[s]), per_replica(target_all[s])
        if s == 0:
            _, grads = step(x, target, False)
            first_grads = []
            for v, g in zip(variables, grads, strict=True):
                parts = strategy.experimental_local_results(g)
                if layout.layout_of(v).split is None:
                    first_grads.append(parts[0].numpy())
                else:
                    first_grads.append(
                        np.concatenate(
                            [parts[mesh.replica(expert=i)].numpy() for i in range(mesh.expert)]
                        )
                    )
        loss, _ = step(x, target, True)
        losses.append(float(loss))
    weights = [layout.gather_whole(strategy, mesh, v) for v in variables]
    return losses, first_grads, weights, whole_init


@pytest.mark.parametrize("capacity_factor", [1.0, pytest.param(0.0, marks=pytest.mark.slow)])
def test_expert_parallel_equals_one_replica_per_expert_set(capacity_factor):
    losses1, grads1, weights1, init = _run(1, None, capacity_factor)
    for p in (2, 4):
        losses, grads, weights, _ = _run(p, init, capacity_factor)
        assert_close(losses, losses1, rtol=1e-5, err_msg=f"E={p} losses")
        for i, (a, b) in enumerate(zip(grads, grads1, strict=True)):
            assert_close(a, b, rtol=1e-5, err_msg=f"E={p} gradient {i}")
        for i, (a, b) in enumerate(zip(weights, weights1, strict=True)):
            assert_close(a, b, rtol=1e-5, err_msg=f"E={p} weight {i}")
    assert losses1[-1] < losses1[0]  # it trains


def test_per_replica_expert_weights_are_one_over_e():
    for p in (1, 2, 4):
        mesh = DeviceMesh(data=REPLICAS // p, expert=p)
        layer = moe.MoEFeedForward(
            hidden_size=D, filter_size=F, num_experts=E, group_size=T, expert_parallel=p,
            mesh=mesh if p > 1 else None,
        )  # fmt: skip
        layer.build((None, D))
        expert_bytes = sum(int(np.prod(w.shape)) * 4 for w in layer.expert_weights)
        whole = (D * F + F + F * D + D) * E * 4
        assert expert_bytes * p == whole


def test_all_to_all_sends_row_j_to_rank_j_and_its_gradient_returns():
    strategy = mirrored(REPLICAS)
    members = [0, 1, 2, 3]

    def replica():
        r = static_replica_id(tf.distribute.get_replica_context())
        ops = Collectives(replica=r, num_replicas=REPLICAS, timeout_s=60, traffic=Traffic())
        x = tf.constant([[10.0 * r + j, 1.0] for j in range(REPLICAS)])  # row j for rank j
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = ops.differentiable_all_to_all(x, members, "test_a2a")
            loss = tf.reduce_sum(y * tf.constant([[1.0 + i, 0.0] for i in range(REPLICAS)]))
        return y, tape.gradient(loss, x)

    y, grad = tf.function(lambda: strategy.run(replica))()
    for r, (yr, gr) in enumerate(
        zip(strategy.experimental_local_results(y), strategy.experimental_local_results(grad))
    ):
        # Row i of rank r came from rank i's row r.
        np.testing.assert_array_equal(yr.numpy()[:, 0], [10.0 * i + r for i in range(REPLICAS)])
        # d loss / d x[j] on rank r is the weight rank j gave to the row from rank r: 1 + r.
        np.testing.assert_array_equal(gr.numpy()[:, 0], [1.0 + r] * REPLICAS)


def _model_on(expert_parallel: int):
    mesh = DeviceMesh(data=REPLICAS // expert_parallel, expert=expert_parallel)
    strategy = mirrored(REPLICAS)
    with strategy.scope():
        model = TinyMoE(mesh, capacity_factor=1.0)
        model.build()
    return strategy, mesh, model


def test_checkpoint_holds_whole_experts_and_restores_on_another_expert_axis(tmp_path):
    # Before, an E>1 checkpoint held replica 0's experts only (E/P of them).
    strategy, mesh, model = _model_on(2)
    rng = np.random.default_rng(1)
    wholes = [
        rng.normal(size=(E, *v.shape[1:])).astype(np.float32) for v in model.moe.expert_weights
    ]
    for v, whole in zip(model.moe.expert_weights, wholes, strict=True):
        layout.load_whole(strategy, mesh, v, whole)
    path = str(tmp_path / "ckpt")
    with strategy.scope():
        tf.train.Checkpoint(model=model).write(path)
    saved = dict(tf.train.list_variables(path))
    reader = tf.train.load_checkpoint(path)
    names = [k for k in saved if "w_in" in k]
    assert len(names) == 1 and saved[names[0]] == [E, D, F], saved
    assert_close(reader.get_tensor(names[0]), wholes[0], rtol=0)
    for expert_parallel in (1, 4):
        strategy, mesh, restored = _model_on(expert_parallel)
        with strategy.scope():
            tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()
        for v, whole in zip(restored.moe.expert_weights, wholes, strict=True):
            assert_close(layout.gather_whole(strategy, mesh, v), whole, rtol=0)
