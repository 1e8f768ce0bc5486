"""The TPU embedding mapping (`mlperf_tf.layers.tpu_embedding`), without a TPU: the configs
against the `ShardedEmbeddings` they replace, the row-wise Adagrad slot program against a NumPy
transcription of FBGEMM's `EXACT_ROWWISE_ADAGRAD`, TF's CPU serving lookups
(`TPUEmbeddingForServing`) against our layer's for the same weights, sequences included, and
the host engine's training against `AdamWRowWiseAdagrad` on the same rows. Nothing here runs
TPUEmbeddingV2 (it needs a TPUStrategy)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers import tpu_embedding as te
from mlperf_tf.layers.sharded_embedding import ShardedEmbeddings
from mlperf_tf.optimizers import AdamW
from mlperf_tf.optimizers.rowwise_adagrad import AdamWRowWiseAdagrad, rowwise_adagrad_rows
from tests.numerics import assert_close

ROWS = {"item": 50, "artist": 9, "uid": 7}
DIM = 8  # the SparseCore pads rows to a multiple of 8 (a narrower table is refused)
SEED = 3
BOUNDS = {n: math.sqrt(1.0 / r) for n, r in ROWS.items()}
FEATURES = {
    "item_history": te.Feature("item", 5),
    "item_candidate": te.Feature("item"),
    "artist_history": te.Feature("artist", 5),
    "uid": te.Feature("uid"),
}
IDS = np.array([[1, 2, 3, 0, 0], [4, 4, 1, 7, 0], [49, 0, 0, 0, 0], [8, 9, 8, 9, 8]],
               np.int32)  # fmt: skip  # [B, H]
LENGTHS = np.array([3, 4, 1, 5], np.int32)
CANDIDATES = np.array([9, 4, 49, 0], np.int32)
UIDS = np.array([1, 6, 1, 3], np.int32)
BATCH = len(IDS)


def _inputs():
    seq = tf.RaggedTensor.from_tensor(tf.constant(IDS), lengths=tf.constant(LENGTHS))
    return {"item_history": seq, "item_candidate": tf.constant(CANDIDATES),
            "artist_history": tf.RaggedTensor.from_tensor(tf.constant(IDS % 9),
                                                          lengths=tf.constant(LENGTHS)),
            "uid": tf.constant(UIDS)}  # fmt: skip


def _layer():
    return ShardedEmbeddings(ROWS, DIM, bounds=BOUNDS, seed=SEED, name="sparse_tables")


def _optimizer(lr=0.05):
    return AdamWRowWiseAdagrad(lr, sparse_variables=("sparse_tables/",), sparse_epsilon=1e-3)


def test_table_and_feature_configs_are_the_layers_tables():
    layer = _layer()
    opt = _optimizer()
    tpu_opt = te.tpu_optimizer(opt)
    tables = te.table_configs(ROWS, DIM, bounds=BOUNDS, seed=SEED, optimizer=tpu_opt)
    assert list(tables) == list(ROWS)
    whole = layer.tables()
    for name, config in tables.items():
        assert (config.name, config.vocabulary_size, config.dim) == (name, ROWS[name], DIM)
        assert config.optimizer is tpu_opt and config.combiner == "sum"
        np.testing.assert_array_equal(config.initializer((ROWS[name], DIM)).numpy(), whole[name])
    assert isinstance(tpu_opt, tf.tpu.experimental.embedding.CustomOptimizer)
    assert tpu_opt._slot_names() == [te.ACCUMULATOR]
    assert tpu_opt.hyperparameters == (1e-3,)
    assert float(tpu_opt.learning_rate()) == pytest.approx(0.05)
    features = te.feature_configs(tables, FEATURES)
    assert features["item_history"].table is tables["item"]
    assert features["item_history"].max_sequence_length == 5
    assert features["uid"].max_sequence_length == 0


def test_the_learning_rate_follows_the_optimizers_schedule():
    schedule = tf.keras.optimizers.schedules.PolynomialDecay(1.0, 10, 0.0)
    opt = AdamWRowWiseAdagrad(schedule, sparse_variables=("x",))
    tpu_opt = te.tpu_optimizer(opt)
    opt.iterations.assign(4)
    assert float(tpu_opt.learning_rate()) == pytest.approx(0.6)


def test_what_the_tpu_api_cannot_hold_is_a_one_line_error():
    with pytest.raises(UserError, match="table big: 2147483648 rows"):
        te.table_configs({"big": 2**31}, DIM, bounds={"big": 1.0}, seed=0)
    with pytest.raises(UserError, match="float32"):
        te.table_configs(ROWS, DIM, bounds=BOUNDS, seed=0, dtype="bfloat16")
    with pytest.raises(UserError, match="width 12 is not a multiple of 8"):
        te.table_configs(ROWS, 12, bounds=BOUNDS, seed=0)
    with pytest.raises(UserError, match="AdamW has no table channel"):
        te.tpu_optimizer(AdamW(1e-3))
    tables = te.table_configs(ROWS, DIM, bounds=BOUNDS, seed=0)
    with pytest.raises(UserError, match="feature x: no table album"):
        te.feature_configs(tables, {"x": te.Feature("album")})


def _numpy_rowwise_adagrad(rows, acc, grads, lr, eps):
    """FBGEMM's EXACT_ROWWISE_ADAGRAD (weight decay 0) on rows, one gradient a row."""
    acc = acc + (grads.astype(np.float64) ** 2).mean(axis=1)
    return rows - (lr / (np.sqrt(acc) + eps))[:, None] * grads, acc


@pytest.mark.numerics
def test_the_slot_program_is_rowwise_adagrad():
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(6, DIM)).astype(np.float32)
    acc = np.zeros(6)
    table, slot = tf.constant(rows), tf.zeros([6, DIM])
    lr, eps = 0.1, 1e-8
    for step in range(3):
        grads = rng.normal(size=(6, DIM)).astype(np.float32) * (step + 1)
        table, (slot,) = te.rowwise_adagrad_program(
            tf.constant(grads), table, (slot,), tf.constant(lr), (tf.constant(eps),)
        )
        rows, acc = _numpy_rowwise_adagrad(rows, acc, grads, lr, eps)
        assert_close(table.numpy(), rows, rtol=1e-6)
        # One accumulator a row, kept in every entry of the row's slot.
        assert_close(slot.numpy(), np.repeat(acc[:, None], DIM, 1), rtol=1e-6)
        # ... and the suite's CPU optimizer's row update is the same formula.
    cpu_rows, cpu_acc = rowwise_adagrad_rows(
        tf.constant(rows, tf.float32), tf.constant(grads), tf.constant(acc, tf.float32), lr, eps
    )
    new, (new_acc,) = te.rowwise_adagrad_update(
        tf.constant(grads), tf.constant(rows, tf.float32),
        (tf.constant(np.repeat(acc[:, None], DIM, 1), tf.float32),), lr, (eps,),
    )  # fmt: skip
    assert_close(new.numpy(), cpu_rows.numpy(), rtol=1e-6)
    assert_close(new_acc.numpy()[:, 0], cpu_acc.numpy(), rtol=1e-6)


@pytest.mark.numerics
def test_serving_lookups_equal_the_layers_with_sequences():
    layer = _layer()
    tables = te.table_configs(ROWS, DIM, bounds=BOUNDS, seed=SEED + 100)  # other values ...
    serving = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        te.feature_configs(tables, FEATURES), None
    )
    serving.build()
    whole = layer.tables()
    for config, variable in serving.embedding_tables.items():
        variable.assign(whole[config.name])  # ... then the layer's weights
    got = serving.embedding_lookup(_inputs())
    inputs = _inputs()
    want = layer([IDS, CANDIDATES, IDS % 9, UIDS], tables=("item", "item", "artist", "uid"))
    valid = (np.arange(IDS.shape[1])[None] < LENGTHS[:, None])[..., None]  # [B, H, 1]
    for k, name in enumerate(FEATURES):
        expected = want[k].numpy()
        if isinstance(inputs[name], tf.RaggedTensor):  # zero past each length
            expected = np.where(valid, expected, 0.0)
        np.testing.assert_array_equal(got[name].numpy(), expected)


@pytest.mark.numerics
def test_the_host_engine_trains_as_rowwise_adagrad_on_the_layer():
    """Three steps of a loss over every feature (ids repeated within a sample and across
    features of one table): the TPU layer's tables and accumulators against
    `ShardedEmbeddings` trained by `AdamWRowWiseAdagrad`."""
    weights = tf.constant(np.random.default_rng(1).normal(size=(DIM,)), tf.float32)
    layer = _layer()
    opt = _optimizer()
    with mock_engine():
        tpu_layer = te.TpuEmbeddingTables(
            ROWS, DIM, bounds=BOUNDS, seed=SEED, features=FEATURES, epsilon=1e-3, batch_size=BATCH
        )
    tpu_opt = _optimizer()
    with pytest.raises(RuntimeError, match="bind_optimizer"):
        tpu_layer.tpu_optimizer.learning_rate()
    with pytest.raises(UserError, match="sparse_epsilon 1e-08 is not"):
        tpu_layer.bind_optimizer(AdamWRowWiseAdagrad(0.1, sparse_variables=("x",)))
    tpu_layer.bind_optimizer(tpu_opt)
    names = ("item", "item", "artist", "uid")
    valid = tf.constant((np.arange(IDS.shape[1])[None] < LENGTHS[:, None])[..., None], tf.float32)

    def loss(outs):
        total = 0.0
        for k, out in enumerate(outs):
            out = out * valid if out.shape.rank == 3 else out
            total += tf.reduce_sum(tf.square(tf.reduce_sum(out * weights, -1) - 0.3 * k))
        return total

    for _ in range(3):
        with tf.GradientTape() as tape:
            ref = loss(layer([IDS, CANDIDATES, IDS % 9, UIDS], tables=names))
        grads = tape.gradient(ref, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        with tf.GradientTape() as tape:
            out = tpu_layer(_inputs())
            got = loss([out[n] for n in FEATURES])
        trap = tape.gradient(got, tpu_layer.trainable_variables)  # applies the tables' update
        tpu_opt.apply_gradients(zip(trap, tpu_layer.trainable_variables))
        assert_close(float(got), float(ref), rtol=1e-6)
    tables = tpu_layer.table_values()
    for name, value in layer.tables().items():
        assert_close(tables[name], value, rtol=1e-5)
    acc = opt._row_accumulators[0].numpy()  # one table after another (then padding rows)
    assert_close(tpu_layer.canonical(slot=True).numpy(), acc[: sum(ROWS.values())], rtol=1e-5)
    # ... kept in every entry of the row in the engine's stacked slot.
    ((stack, (_, slot)),) = tpu_layer.engine.read_stacks().items()
    np.testing.assert_array_equal(slot.numpy(), np.repeat(slot.numpy()[:, :1], DIM, 1))
    assert float(tpu_layer.trap.numpy()[0]) == 0.0


def mock_engine():
    """`make_engine` as the tests' host engine."""
    from unittest import mock

    return mock.patch.object(te, "make_engine", te.HostEngine)


@pytest.mark.numerics
def test_the_sparsecore_update_op_takes_the_program_per_row():
    """What can be checked of the SparseCore update without one: the op's graph (built, not
    run: its kernel is XLA's on a TPU) holds the table and its slot and the learning rate and
    eps, and its `custom_computation` is our program traced as the kernel compiles it, every
    argument `[1, dim]`; that traced program on rows broadcast so is row-wise Adagrad."""
    opt = te.rowwise_adagrad_optimizer(0.1, 1e-8)
    program = te.concrete_program(opt, DIM)
    assert [tuple(a.shape) for a in program.inputs] == [(1, DIM)] * 5
    csr = type("Csr", (), {})()
    for name in ("row_pointers", "sorted_sample_ids", "sorted_token_ids"):
        setattr(csr, name, tf.zeros([4], tf.int32))
    csr.sorted_gains = tf.ones([4])
    csr.num_minibatches_per_physical_sparse_core = tf.constant(1)

    @tf.function
    def update():
        return te.custom_optimizer_update(
            opt, csr=csr, gradients=tf.zeros([8, DIM]), table=tf.zeros([10, DIM]),
            slots=[tf.zeros([10, DIM])], learning_rate=0.1, table_name="item",
        )  # fmt: skip

    graph = update.get_concrete_function().graph
    (op,) = [o for o in graph.get_operations() if o.type == "XlaSparseDenseMatmulGradWithCsrInput"]
    assert (op.get_attr("N"), op.get_attr("M")) == (2, 2)  # [table, slot], [lr, eps]
    assert op.get_attr("custom_computation").name == program.name.decode()
    rng = np.random.default_rng(2)
    rows, grads = rng.normal(size=(2, 1, DIM)).astype(np.float32)
    acc = np.array([0.5])
    new, (new_acc,) = program(
        tf.constant(grads), tf.constant(rows), tf.fill([1, DIM], 0.5), tf.fill([1, DIM], 0.1),
        tf.fill([1, DIM], 1e-8),
    )  # fmt: skip
    want_rows, want_acc = _numpy_rowwise_adagrad(rows, acc, grads, 0.1, 1e-8)
    assert_close(new.numpy(), want_rows, rtol=1e-6)
    assert_close(new_acc.numpy(), np.full((1, DIM), want_acc[0]), rtol=1e-6)
