"""Expert parallelism of `MoEFeedForward` on 4 logical CPUs: E = 2 and 4 equal E = 1.

Each of the 4 replicas reads different tokens. With E = 1 every replica holds all experts (a
data axis of 4); with E = P the experts are split over P replicas of the expert axis (data axis
4 / P) and tokens travel by all-to-all. Routing is per replica (a replica's tokens are one
group, and the capacity counts the static `group_size`), so each token's experts, its place in
their buffers and which choices overflow do not depend on P: the capacity factor here (1.0)
really drops choices, and the results are still the same. Dropout and jitter are off.

On a mesh with a model axis too (E = 2 x M = 2), the dense layers before the MoE layer are
Megatron's column- and row-parallel pair, the replicas of a model group read one batch, and
the run equals the unsplit one of the same batch shards (data = 2): the runner's one
`GradientSummer` sums the three layouts (model-split, expert-split, replicated) over their axes.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.collectives import GradientSummer, Settings
from mlperf_tf.collectives.ops import Collectives, Traffic, static_replica_id
from mlperf_tf.layers import moe
from mlperf_tf.layers.tensor_parallel import ColumnParallelDense, RowParallelDense
from mlperf_tf.optimizers import LAMB, LARS
from mlperf_tf.parallel import layout
from mlperf_tf.parallel.mesh import DeviceMesh
from tests.numerics import assert_close
from tests.strategies import mirrored

pytestmark = pytest.mark.numerics

D, F, E, T, REPLICAS, STEPS = 8, 16, 4, 16, 4, 10


class TinyMoE(keras.Model):
    """Column- then row-parallel dense (split over `model`) -> MoE (split over `expert`) with a
    residual."""

    def __init__(self, mesh: DeviceMesh, capacity_factor: float):
        super().__init__()
        split = mesh if mesh.model > 1 else None
        self.up = ColumnParallelDense(2 * D, mesh=split, activation="relu", name="up")
        self.down = RowParallelDense(D, mesh=split, name="down")
        self.moe = moe.MoEFeedForward(
            hidden_size=D, filter_size=F, num_experts=E, top_k=2,
            capacity_factor=capacity_factor, group_size=T, expert_parallel=mesh.expert,
            mesh=mesh, name="moe", collective_timeout_s=60,
        )  # fmt: skip

    def build(self, input_shape=None):
        self.up.build((None, D))
        self.down.build((None, 2 * D))
        self.moe.build((None, D))
        super().build(input_shape)

    def call(self, x, training=False):
        h = self.down(self.up(x))
        y, stats = self.moe(h, training=training)
        return h + y, stats


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS, REPLICAS, T, D)).astype(np.float32)
    target = rng.normal(size=(STEPS, REPLICAS, T, D)).astype(np.float32)
    return x, target


def _run(
    mesh: DeviceMesh, whole_init: list | None, capacity_factor: float, *,
    all_reduce: str = "ring", pack_mb: float = 0.0, clip_norm: float | None = None,
    make_optimizer=None, weight_update_sharding: bool = False, keep: dict | None = None,
):  # fmt: skip
    """10 steps on `mesh` (SGD-momentum, or `make_optimizer()`), batch shard i reading replica
    i's tokens of `_data`; returns (losses, first step's summed grads, whole weights, initial
    whole weights), and puts the summer in `keep["summer"]` when given."""
    strategy = mirrored(mesh.size)
    with strategy.scope():
        model = TinyMoE(mesh, capacity_factor)
        model.build()
        if make_optimizer is None:
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        else:
            optimizer = make_optimizer()
        optimizer.build([] if weight_update_sharding else model.trainable_variables)
    variables = model.trainable_variables
    if whole_init is None:
        whole_init = [layout.whole_value(v, mesh).numpy() for v in variables]
    for v, whole in zip(variables, whole_init, strict=True):
        layout.assign_whole(v, whole, mesh)
    # The runner's summer, as it is built for a mesh with an expert axis.
    settings = Settings(all_reduce=all_reduce, pack_mb=pack_mb, timeout_s=60,
                        weight_update_sharding=weight_update_sharding)  # fmt: skip
    summer = GradientSummer(strategy, settings, mesh)
    with strategy.scope():
        summer.build(optimizer, variables)
    if keep is not None:
        keep["summer"] = summer
    x_all, target_all = _data()

    def replica_step(x, target, apply):
        with tf.GradientTape() as tape:
            out, stats = model(x, training=True)
            loss = tf.reduce_mean(tf.square(out - target)) + model.moe.aux_loss(stats)
            loss = loss / mesh.batch_shards
        grads = tape.gradient(loss, variables)
        if apply:
            summer.apply(optimizer, grads, variables, clip_norm=clip_norm)
            return loss, []
        return loss, summer.sum_gradients(grads)

    def per_replica(values):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(values[mesh.batch_shard(ctx.replica_id_in_sync_group)])
        )

    @tf.function
    def step(x, target, apply):
        loss, grads = strategy.run(replica_step, args=(x, target, apply))
        return strategy.reduce("SUM", loss, axis=None) / mesh.group_size, grads

    losses, first_grads = [], None
    for s in range(STEPS):
        x, target = per_replica(x_all[s]), per_replica(target_all[s])
        if s == 0:
            _, grads = step(x, target, False)
            first_grads = []
            for v, g in zip(variables, grads, strict=True):
                parts = strategy.experimental_local_results(g)
                v_layout = layout.layout_of(v)
                if not v_layout.split:
                    first_grads.append(parts[0].numpy())
                else:  # the summed shards, from replica 0's shard group, in shard order
                    holders = v_layout.shard_group(mesh, 0)
                    first_grads.append(
                        np.concatenate(
                            [parts[r].numpy() for r in holders], axis=v_layout.split_axis
                        )
                    )
        loss, _ = step(x, target, True)
        losses.append(float(loss))
    weights = [layout.whole_value(v, mesh).numpy() for v in variables]
    return losses, first_grads, weights, whole_init


@pytest.mark.parametrize("capacity_factor", [1.0, pytest.param(0.0, marks=pytest.mark.slow)])
def test_expert_parallel_equals_one_replica_per_expert_set(capacity_factor):
    losses1, grads1, weights1, init = _run(DeviceMesh(data=REPLICAS), None, capacity_factor)
    for p in (2, 4):
        mesh = DeviceMesh(data=REPLICAS // p, expert=p)
        losses, grads, weights, _ = _run(mesh, init, capacity_factor)
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


def _model_on(mesh: DeviceMesh):
    strategy = mirrored(mesh.size)
    with strategy.scope():
        model = TinyMoE(mesh, capacity_factor=1.0)
        model.build()
    return strategy, model


@pytest.mark.parametrize(
    "saved_on",
    [DeviceMesh(data=2, expert=2), DeviceMesh(expert=2, model=2)],
    ids=["E2", "E2xM2"],
)
def test_checkpoint_holds_whole_tensors_and_restores_on_another_mesh(tmp_path, saved_on):
    # Before, an E>1 checkpoint held replica 0's experts only (E/P of them). Experts and
    # Megatron shards take one path: `parallel.layout.save_whole`.
    _, model = _model_on(saved_on)
    rng = np.random.default_rng(1)
    variables = model.trainable_variables
    wholes = []
    for v in variables:
        shape = list(v.shape)
        v_layout = layout.layout_of(v)
        if v_layout.split:
            shape[v_layout.split_axis] *= v_layout.num_shards(saved_on)
        wholes.append(rng.normal(size=shape).astype(np.float32))
    for v, whole in zip(variables, wholes, strict=True):
        layout.assign_whole(v, whole, saved_on)
    path = str(tmp_path / "ckpt")
    tf.train.Checkpoint(model=model).write(path)
    saved = dict(tf.train.list_variables(path))
    reader = tf.train.load_checkpoint(path)
    names = [k for k in saved if "w_in" in k]
    assert len(names) == 1 and saved[names[0]] == [E, D, F], saved
    assert_close(
        reader.get_tensor(names[0]),
        wholes[[v.path for v in variables].index(model.moe.w_in.path)],
        rtol=0,
    )
    assert [saved[k] for k in saved if "up/kernel" in k] == [[D, 2 * D]]
    for mesh in (DeviceMesh(data=4), DeviceMesh(expert=4), DeviceMesh(data=2, model=2)):
        _, restored = _model_on(mesh)
        tf.train.Checkpoint(model=restored).read(path).assert_existing_objects_matched()
        for v, whole in zip(restored.trainable_variables, wholes, strict=True):
            assert_close(layout.whole_value(v, mesh).numpy(), whole, rtol=0, err_msg=v.path)


# Extended (CI runs it after README's default run); the default run covers its case by
# llama31_8b/test_moe.py's E2 x M2 (experts and tensor parallelism in one run, equal to the
# unsplit run).
@pytest.mark.extended
def test_expert_parallelism_composes_with_model_parallelism():
    """E = 2 x M = 2 on 4 devices equals data = 2 on 2 (the same 2 batch shards), with the
    global-norm clip active: the norm adds the model shards' and the expert shards' squares."""
    base = dict(capacity_factor=1.0, clip_norm=0.05)
    losses1, grads1, weights1, init = _run(DeviceMesh(data=2), None, **base)
    losses, grads, weights, _ = _run(DeviceMesh(expert=2, model=2), init, **base)
    assert_close(losses, losses1, rtol=1e-5, err_msg="losses")
    for i, (a, b) in enumerate(zip(grads, grads1, strict=True)):
        assert_close(a, b, rtol=1e-5, err_msg=f"gradient {i}")
    for i, (a, b) in enumerate(zip(weights, weights1, strict=True)):
        assert_close(a, b, rtol=1e-5, err_msg=f"weight {i}")


# Extended (CI runs it after README's default run); the default run covers its case by
# test_expert_parallel_equals_one_replica_per_expert_set and collectives/test_summer.py (the
# algorithms and packing).
@pytest.mark.extended
def test_expert_parallel_with_the_summers_algorithms_and_packing():
    """The replicated weights (summed over 4 replicas, a 2 x 2 torus) and the experts (over the
    2 of the data axis) are summed by two groups of the one summer, each packed."""
    losses1, _, weights1, init = _run(DeviceMesh(data=REPLICAS), None, 1.0)
    losses, _, weights, _ = _run(
        DeviceMesh(data=2, expert=2), init, 1.0, all_reduce="torus2d", pack_mb=1.0
    )
    assert_close(losses, losses1, rtol=1e-5, err_msg="losses")
    for i, (a, b) in enumerate(zip(weights, weights1, strict=True)):
        assert_close(a, b, rtol=1e-5, err_msg=f"weight {i}")


def _lars():
    return LARS(0.5, momentum=0.9, weight_decay=1e-3, eeta=0.01)


def _lamb():
    return LAMB(0.01, weight_decay=0.01)


def _assert_same(got, ref, what: str, *, grads: bool = True) -> None:
    """Losses, first gradients and final weights of two runs of `_run`, at a tolerance that
    follows each tensor's scale (its largest element)."""
    assert_close(got[0], ref[0], rtol=1e-5, err_msg=f"{what}: losses")
    pairs = [("weight", got[2], ref[2])] + ([("gradient", got[1], ref[1])] if grads else [])
    for kind, a_list, b_list in pairs:
        for i, (a, b) in enumerate(zip(a_list, b_list, strict=True)):
            scale = float(np.max(np.abs(b)))
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale,
                                       err_msg=f"{what}: {kind} {i}")  # fmt: skip


def test_lars_with_model_parallelism_equals_the_unsplit_run():
    """LARS at M = 2 (column- and row-parallel kernels split over `model`; its trust ratio needs
    their whole norms |w| and |g|: `LARS.whole_norm_terms`) against M = 1 on the same 2 batch
    shards, each reading its own tokens; biases are excluded from the trust ratio, kernels
    and the experts not."""
    ref = _run(DeviceMesh(data=2), None, 1.0, make_optimizer=_lars)
    got = _run(DeviceMesh(data=2, model=2), ref[3], 1.0, make_optimizer=_lars)
    _assert_same(got, ref, "LARS M=2")
    assert ref[0][-1] < ref[0][0]  # it trains


@pytest.mark.parametrize(
    ("make_optimizer", "clip_norm"),
    [
        pytest.param(None, None, marks=pytest.mark.slow),
        # Extended (CI runs it after README's default run); the default run covers its case by
        # test_sharded_slots_of_experts_are_saved_whole_and_cut_again (the sharded update of
        # experts' slots).
        pytest.param(_lamb, 0.05, marks=pytest.mark.extended),
        pytest.param(_lars, None, marks=pytest.mark.slow),
    ],
    ids=["sgd", "lamb-clipped", "lars"],
)
def test_weight_update_sharding_with_expert_parallelism_equals_the_unsharded_run(
    make_optimizer, clip_norm
):
    """E = 2 on 4 devices with weight-update sharding (the replicated weights' pieces and slots
    over data x expert, 4 ways; the experts' over the data axis, 2 ways; the norms of LAMB's
    trust ratio and of the clip summed over both) against the same mesh without it."""
    mesh = DeviceMesh(data=2, expert=2)
    kwargs = dict(make_optimizer=make_optimizer, clip_norm=clip_norm)
    ref = _run(mesh, None, 1.0, **kwargs)
    got = _run(mesh, ref[3], 1.0, weight_update_sharding=True, **kwargs)
    _assert_same(got, ref, "E=2 sharded", grads=False)
    assert ref[0][-1] < ref[0][0]


def test_sharded_slots_of_experts_are_saved_whole_and_cut_again():
    """The checkpoint form of sharded slots (`GradientSummer.full_slots`) is the whole tensor
    whatever the layout: at E = 2 the experts' momentum is gathered over the data axis and then
    over the expert axis, and equals E = 1's (nothing split) after the same steps; E = 1's slots
    loaded into the E = 2 run are cut into its pieces and read back unchanged."""
    kept1, kept2 = {}, {}
    ref = _run(DeviceMesh(data=REPLICAS), None, 1.0, weight_update_sharding=True, keep=kept1)
    _run(DeviceMesh(data=2, expert=2), ref[3], 1.0, weight_update_sharding=True, keep=kept2)
    full1, full2 = kept1["summer"].full_slots(), kept2["summer"].full_slots()
    assert sorted(full1) == sorted(full2)
    assert any(tuple(full2[k].shape) == (E, D, F) for k in full2)  # w_in's, whole
    for key, expected in full1.items():
        expected = expected.numpy()
        assert tuple(full2[key].shape) == expected.shape, key
        scale = float(np.max(np.abs(expected)))
        assert scale > 0, key  # moved: not equal by being zero
        np.testing.assert_allclose(full2[key].numpy(), expected, rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=key)  # fmt: skip
    kept2["summer"].load_full_slots(full1)
    again = kept2["summer"].full_slots()
    for key, expected in full1.items():
        np.testing.assert_array_equal(again[key].numpy(), expected.numpy(), err_msg=key)
