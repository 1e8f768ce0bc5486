"""DLRMv4's TPU path (README "Tables on TPU"), without a TPU: under a strategy taken for a TPU
(`distribute.is_tpu` patched) the benchmark declares its tables to the TPU embedding engine
(`TpuEmbeddingTables`), and with the host engine in place of TPUEmbeddingV2 (which needs a
TPUStrategy) the model trains as the CPU model of `ShardedEmbeddings` does; through
`runner.run` (slow) the same. What TPUEmbeddingV2 and XLA do on a TPU is not tested (not run)."""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.dlrmv4 import input as input_lib
from benchmarks.dlrmv4 import model as model_lib
from benchmarks.dlrmv4.benchmark import DlrmV4Benchmark
from mlperf_tf import checkpoints, distribute, runner
from mlperf_tf.errors import UserError
from mlperf_tf.layers import tpu_embedding as te
from tests import tensor_parallel
from tests.mlperf_tf.layers.test_sparse_core_layout import sparse_core_counts, worst_ids
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

RTOL = 1e-5


def _benchmark() -> DlrmV4Benchmark:
    """The smoke preset, dropout off, a learning rate that moves the tables visibly."""
    bench = tensor_parallel.smoke(DlrmV4Benchmark, input_dropout=0.0, linear_dropout=0.0)
    c = bench.config
    optimizer = dataclasses.replace(c.optimizer, opt_base_learning_rate=0.05)
    return DlrmV4Benchmark(dataclasses.replace(c, optimizer=optimizer))


def _on_tpu():
    """The runner's TPU test: `is_tpu` true; TPUEmbeddingV2 replaced by the host engine."""
    return (
        mock.patch.object(distribute, "is_tpu", return_value=True),
        mock.patch.object(te, "make_engine", te.HostEngine),
    )


def _build(tpu: bool):
    bench = _benchmark()
    if tpu:
        patches = _on_tpu()
        with patches[0], patches[1]:
            model = bench.build_model()
            optimizer = bench.build_optimizer(10)
    else:
        model, optimizer = bench.build_model(), bench.build_optimizer(10)
    return bench, model, optimizer


def _steps(bench, model, optimizer, batches, steps: int) -> list[float]:
    """`steps` training steps of `model` on `batches`; their losses."""
    losses = []
    for _ in range(steps):
        batch = next(batches)
        with tf.GradientTape() as tape:
            loss = bench.compute_loss(model, batch)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        losses.append(float(loss))
    return losses


def test_the_benchmark_declares_its_tables_to_the_tpu_engine():
    bench, model, optimizer = _build(tpu=True)
    _, cpu_model, _ = _build(tpu=False)
    layer = model.tables
    assert isinstance(layer, te.TpuEmbeddingTables) and model.on_tpu
    m = bench.config.model
    # Tables: every one of the CPU model's, its rows, width and initial values.
    assert {n: (t.vocabulary_size, t.dim) for n, t in layer.tables.items()} == {
        n: (r, m.embedding_dim) for n, r in cpu_model.tables.rows.items()
    }
    cpu_tables = cpu_model.tables.tables()
    for name, value in layer.table_values().items():
        np.testing.assert_array_equal(value, cpu_tables[name])
    # Features: the histories as sequences of the history length; the rest one id a sample.
    features = layer.feature_configs
    for k in model_lib.SEQUENCES:
        assert features[f"uih_{k}"].table.name == f"{k}_id"
        assert features[f"uih_{k}"].max_sequence_length == m.history_length
        assert features[f"cand_{k}"].max_sequence_length == 0
    assert [n for n in features if features[n].table.name == n] == model.contextual_names
    # The optimizer: row-wise Adagrad at the rules' eps and the dense rate's warm-up.
    tpu_opt = layer.tpu_optimizer
    o = bench.config.optimizer
    assert tpu_opt.hyperparameters == (o.opt_sparse_epsilon,)
    assert all(t.optimizer is tpu_opt for t in layer.tables.values())
    warmup = o.opt_learning_rate_warmup_steps
    for step in (0, warmup // 2, warmup, warmup + 5):
        optimizer.iterations.assign(step)
        want = bench.config.learning_rate * min(1.0, step / warmup)
        assert float(tpu_opt.learning_rate()) == pytest.approx(want, rel=1e-6)
    # The dense optimizer never sees the tables.
    assert not any("tpu_tables/" in v.path and v.shape.rank == 2 for v in
                   model.trainable_variables)  # fmt: skip


def test_the_tpu_path_trains_as_the_sharded_tables():
    """Three steps of the smoke model on synthetic batches (ragged histories), the TPU path's
    (host engine) against `ShardedEmbeddings`: losses, tables and dense weights."""
    results = []
    for tpu in (False, True):
        bench, model, optimizer = _build(tpu)
        batches = iter(input_lib.synthetic_train_dataset(bench.config, batch_size=8, seed=4))
        losses = _steps(bench, model, optimizer, batches, 3)
        results.append((losses, model_lib.numpy_weights(model)))
        if tpu:  # the trap's gradient is zero: Adam leaves it at 0
            assert float(model.tables.trap.numpy()[0]) == 0.0
    (cpu_losses, cpu), (tpu_losses, tpu) = results
    assert_close(np.array(tpu_losses), np.array(cpu_losses), rtol=RTOL)
    assert sorted(tpu) == sorted(cpu)
    for path, value in cpu.items():
        assert_close(tpu[path], value, rtol=RTOL, err_msg=path)
    assert any(np.any(tpu[p] != model_lib.numpy_weights(_build(False)[1])[p])
               for p in tpu if p.startswith(model_lib.SPARSE_PREFIX))  # fmt: skip


def _resumed(tpu: bool, path: str, steps: int):
    """A fresh model and optimizer on the TPU path (host engine) or the CPU path, the run
    checkpoint at `path` restored as the runner restores (refused unless its entries are the
    model's), then `steps` steps on the batches after the first: (losses, weights)."""
    bench, model, optimizer = _build(tpu)
    optimizer.build(model.trainable_variables)
    checkpoint = checkpoints.run_checkpoint(model=model, optimizer=optimizer)
    checkpoints.check_matches(checkpoint, path, [n for n, _ in tf.train.list_variables(path)])
    checkpoint.restore(path).expect_partial()
    batches = iter(input_lib.synthetic_train_dataset(bench.config, batch_size=8, seed=4))
    next(batches)
    return _steps(bench, model, optimizer, batches, steps), model_lib.numpy_weights(model)


def test_a_tpu_checkpoint_resumes_on_cpus_and_the_reverse(tmp_path):
    """A step on each path saved by the runner's `run_checkpoint`: both checkpoints hold the
    same entries (the tables whole, `sparse_tables/embeddings` `[sum of rows, dim]`, their
    accumulators `[sum of rows]`; no stacked SparseCore tensor, no gradient trap), the TPU
    one's tables the host engine's stacked layout mapped whole. Each restored on the other
    path, a second step ends where 2 steps on the CPU path end (1e-5)."""
    paths, keys = {}, {}
    for tpu in (False, True):
        bench, model, optimizer = _build(tpu)
        batches = iter(input_lib.synthetic_train_dataset(bench.config, batch_size=8, seed=4))
        _steps(bench, model, optimizer, batches, 1)
        paths[tpu] = checkpoints.run_checkpoint(model=model, optimizer=optimizer).write(
            str(tmp_path / f"tpu{tpu}")
        )
        keys[tpu] = dict(tf.train.list_variables(paths[tpu]))
        if tpu:
            whole = model.tables.table_values()
            stored = checkpoints.read_part(paths[tpu])[model_lib.TABLES_PATH]
            split = np.cumsum(list(model.tables.rows.values()))[:-1]
            for name, value in zip(model.tables.rows, np.split(stored, split), strict=True):
                np.testing.assert_array_equal(value, whole[name])
        else:  # the reference: 2 steps on the CPU path
            _steps(bench, model, optimizer, batches, 1)
            reference = model_lib.numpy_weights(model)
    assert keys[True] == keys[False]  # the same entries, of the same shapes
    c = _benchmark().config.model
    rows = sum(c.table_rows().values())
    assert keys[True][f"model_variables/by_path/{model_lib.TABLES_PATH.replace('/', '.S')}"
                      "/.ATTRIBUTES/VARIABLE_VALUE"] == [rows, c.embedding_dim]  # fmt: skip
    for tpu in (True, False):  # the other path's checkpoint
        _, weights = _resumed(tpu, paths[not tpu], 1)
        assert sorted(weights) == sorted(reference)
        for path, value in reference.items():
            assert_close(weights[path], value, rtol=RTOL, err_msg=f"{tpu} {path}")


@pytest.mark.slow
def test_the_runner_takes_the_tpu_path(tmp_path):
    """`runner.run` of the smoke preset (its whole stream, two evals) on a one-device stand-in
    the runner takes for a TPU, the tables on the host engine, against the plain run on the
    same stand-in: the evals' AUCs and the final weights, tables whole."""
    from tests.mlperf_tf.test_runner_tpu_path import RecordingStrategy

    out = []
    for tpu in (False, True):
        config = runner.RunConfig(model_dir=str(tmp_path / str(tpu)), warm_up=False)
        with contextlib.ExitStack() as stack:
            for patch in _on_tpu() if tpu else ():
                stack.enter_context(patch)
            stack.enter_context(
                mock.patch.object(distribute, "resolve_strategy", return_value=RecordingStrategy())
            )
            result = runner.run(_benchmark(), config)
        assert result.model.on_tpu == tpu
        out.append((result, model_lib.numpy_weights(result.model)))
    (plain, plain_w), (tpu_run, tpu_w) = out
    assert tpu_run.steps == plain.steps > 0 and len(plain.evals) >= 1
    assert_close(np.array(tpu_run.evals), np.array(plain.evals), rtol=RTOL)
    for path, value in plain_w.items():
        assert_close(tpu_w[path], value, rtol=RTOL, err_msg=path)


def test_tables_too_large_for_the_tpu_replicas_are_a_one_line_error():
    """The reference's tables (293 M rows x 512) and their table-sized slot on 8 replicas:
    150 GB each, above the `mlperf` preset's 80 GB; refused before any table is made."""
    config = DlrmV4Benchmark.preset("mlperf").model
    strategy = tf.distribute.get_strategy()
    with (
        mock.patch.object(type(strategy), "num_replicas_in_sync", 8),
        pytest.raises(UserError, match=r"model.embedding_memory_gb.*need 1[45]\d GiB per replica"),
    ):
        model_lib.DlrmHstu(config, tpu_epsilon=1e-8)


def _preset_plan(preset: str, chips: int):
    """The TPU engine's plan of a preset's tables and lookups at `chips` (nothing allocated)."""
    c = DlrmV4Benchmark.preset(preset)
    m = c.model
    rows = m.table_rows()
    tables = te.table_configs(rows, m.embedding_dim, seed=0,
                              bounds={n: 1.0 / np.sqrt(r) for n, r in rows.items()})  # fmt: skip
    features = te.feature_configs(tables, model_lib.tpu_features(m, model_lib.CONTEXTUAL))
    batch = c.global_batch_size // chips
    return c, batch, te.plan_engine(features, batch=batch, chips=chips)


def _preset_feeds(c, batch: int, plan, rng, *, worst: bool) -> dict:
    """One replica's feeds of a generated batch, as `embed_tpu` gives them to the engine
    (histories one position a row): random lengths and ids, or `worst`: every history full,
    every id of a table on one SparseCore (`worst_ids`)."""
    m = c.model
    rows = m.table_rows()
    h = m.history_length
    lengths = np.full(batch, h) if worst else rng.integers(1, h + 1, batch)
    valid = (np.arange(h) < lengths[:, None]).reshape(-1)  # [B H]
    positions = np.arange(batch * h)[valid]
    feeds = {}
    for name, f in plan.engine_features.items():
        table = f.table.name
        history = len(f.output_shape) > 1
        count = batch * h if history else batch
        ids = (worst_ids(count, rows[table], plan.layouts[table]) if worst
               else rng.integers(0, rows[table], count))  # fmt: skip
        if history:
            feeds[name] = (table, positions, ids[valid], count)
        else:
            feeds[name] = (table, np.arange(batch), ids, count)
    return feeds


@pytest.mark.parametrize(("preset", "chips"), [("mlperf", 16), ("mini", 1), ("mini", 2)])
def test_the_engine_buffers_hold_every_batch_of_the_presets(preset, chips):
    """The SparseCore buffers sized from the batch shape (`buffer_limits`) against the engine's
    count (NumPy transcription) of generated batches: random ones below them, the worst (full
    4,087-event histories at the reference's, every id on one SparseCore) reaching the ids'
    limit; TF's defaults (256) far below."""
    c, batch, plan = _preset_plan(preset, chips)
    limits = plan.buffers
    rng = np.random.default_rng(0)
    for worst in (False, True):
        counts = sparse_core_counts(_preset_feeds(c, batch, plan, rng, worst=worst), plan.layouts)
        assert set(counts) == set(limits.max_ids)
        for stack, (ids, unique) in counts.items():
            assert ids <= limits.max_ids[stack], stack
            assert unique <= limits.max_unique_ids[stack], stack
            if worst:
                assert ids == limits.max_ids[stack], stack
    history = max(limits.max_ids.values())
    h = c.model.history_length
    assert history == 3 * batch * (h + 1) // 4 + (batch // 4) * sum(
        1 for t in model_lib.CONTEXTUAL if plan.layouts[t].stacked_table_name
        == plan.layouts["item_id"].stacked_table_name
    )  # fmt: skip
    assert history > 256  # TF's default `max_ids_per_table` would fail the first batch


def test_a_batch_the_engine_cannot_take_is_a_one_line_error():
    """A per-replica batch not divisible over a chip's 4 SparseCores, a chip count whose
    SparseCores are not a power of two, and an eval batch other than the training batch (the
    engine's shapes are one batch's: the mini's 512 vs 128): one-line errors naming the
    setting."""
    mini = DlrmV4Benchmark(DlrmV4Benchmark.preset("mini"))
    with (
        mock.patch.object(distribute, "is_tpu", return_value=True),
        pytest.raises(UserError, match=r"`eval_batch_size` \(512\) must equal the training batch"),
    ):
        mini.build_model()
    with pytest.raises(UserError, match=r"`global_batch_size` \(6 a replica\): feature "):
        model_lib.DlrmHstu(DlrmV4Benchmark.preset("smoke").model, tpu_epsilon=1e-8, tpu_batch=6)
    c = DlrmV4Benchmark.preset("smoke").model
    strategy = tf.distribute.get_strategy()
    with (
        mock.patch.object(type(strategy), "num_replicas_in_sync", 3),
        pytest.raises(UserError, match="power-of-two number of SparseCores; 12"),
    ):
        model_lib.DlrmHstu(c, tpu_epsilon=1e-8, tpu_batch=4)
