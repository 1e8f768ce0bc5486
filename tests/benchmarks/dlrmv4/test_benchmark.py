"""DLRMv4's rules: the learning-rate band, the eval grid and first eval, the logged keys, the AUC,
and the data checks (windows in time order, ids inside their tables)."""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest
import yaml

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4 import input as input_lib
from benchmarks.dlrmv4.benchmark import AUC_BINS, DlrmV4Benchmark, binned_auc
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError


def rules_file() -> str:
    import mlperf_logging  # noqa: PLC0415

    return os.path.join(
        os.path.dirname(mlperf_logging.__file__),
        "compliance_checker", "training_6.1.0", "closed_dlrmv4.yaml",
    )  # fmt: skip


def test_the_learning_rate_defaults_to_the_rules_law_and_is_held_to_its_band():
    for batch in (8192, 16384, 32768):
        config = dataclasses.replace(config_lib.mlperf(), global_batch_size=batch)
        assert config.learning_rate == pytest.approx(1e-6 * batch / 8192)
    optimizer = dataclasses.replace(config_lib.OptimizerConfig(), opt_base_learning_rate=2e-6)
    with pytest.raises(ConfigError, match=r"opt_base_learning_rate.*outside the rules' band") as e:
        dataclasses.replace(config_lib.mlperf(), optimizer=optimizer)
    assert "\n" not in str(e.value)
    ok = dataclasses.replace(optimizer, opt_base_learning_rate=1.5e-6)
    assert dataclasses.replace(config_lib.mlperf(), optimizer=ok).learning_rate == 1.5e-6


@pytest.mark.parametrize("batch, block", [(8192, 25), (16384, 31), (32768, 41)])
def test_the_first_eval_and_the_grid_are_the_rules(batch, block):
    """closed_dlrmv4.yaml: eval every ceil(0.001 x 2,290,835,423 / batch) steps; the first at
    block 25, 31, 41 of that grid for batch 8192, 16384, 32768."""
    config = dataclasses.replace(config_lib.mlperf(), global_batch_size=batch)
    schedule = DlrmV4Benchmark(config).eval_schedule()
    interval = math.ceil(0.001 * 2_290_835_423 / batch) * batch
    assert schedule[0].samples_count == block * interval
    assert all(p.samples_count % interval == 0 for p in schedule)
    assert all(b.step - a.step == interval // batch for a, b in zip(schedule, schedule[1:]))
    assert schedule[-1].samples_count <= config_lib.TRAIN_SAMPLES


def test_the_log_holds_every_key_the_rules_require():
    with open(rules_file()) as f:
        rules = yaml.safe_load(f)
    required = {r["KEY"]["NAME"] for r in rules if "KEY" in r} - {"eval_accuracy"}
    hparams = DlrmV4Benchmark(config_lib.mlperf()).logged_hparams()
    assert required <= set(hparams)
    assert hparams["opt_sparse_base_learning_rate"] == hparams["opt_base_learning_rate"]
    assert hparams["opt_sparse_name"] == "RowWiseAdagrad" and hparams["eval_samples"] == 2058204


def test_binned_auc_is_the_pairwise_auc_when_scores_fall_in_distinct_bins():
    rng = np.random.default_rng(0)
    bins = rng.choice(AUC_BINS, 300, replace=False)
    labels = rng.random(300) < 0.4
    pos = np.bincount(bins[labels], minlength=AUC_BINS)
    neg = np.bincount(bins[~labels], minlength=AUC_BINS)
    pairs = (bins[labels][:, None] > bins[~labels][None, :]).mean()
    assert binned_auc(pos, neg) == pytest.approx(pairs, abs=1e-12)
    # Ties in one bin count half; an empty class gives 0.5.
    assert binned_auc(np.array([1, 0]), np.array([1, 0])) == 0.5
    assert binned_auc(np.array([3, 0]), np.zeros(2)) == 0.5


def test_eval_counts_are_summed_exactly_over_replicas_and_padding_is_left_out():
    benchmark = DlrmV4Benchmark(config_lib.smoke())
    rng = np.random.default_rng(1)
    outputs = {
        "bin": rng.integers(0, AUC_BINS, 64).astype(np.int32),
        "label": (rng.random(64) < 0.5).astype(np.float32),
        "valid": np.r_[np.ones(60), np.zeros(4)].astype(np.float32),
    }
    whole = benchmark.eval_reduce(benchmark.eval_begin(), outputs)
    halves = benchmark.eval_begin()
    for part in (slice(0, 32), slice(32, 64)):  # two replicas' gathered rows
        halves = benchmark.eval_reduce(halves, {k: v[part] for k, v in outputs.items()})
    assert whole["pos"].sum() + whole["neg"].sum() == 60
    np.testing.assert_array_equal(whole["pos"], halves["pos"])
    np.testing.assert_array_equal(whole["neg"], halves["neg"])


def _manifest(tmp_path, windows, table_rows=None):
    manifest = {
        "train_windows": windows[:-1],
        "eval_window": windows[-1],
        "table_rows": table_rows or {"item_id": 10},
        "history_length": 4,
    }
    (tmp_path / input_lib.MANIFEST).write_text(json.dumps(manifest))
    return input_lib.read_manifest(str(tmp_path))


def test_data_errors_are_one_line_naming_the_window_or_the_table(tmp_path):
    config = dataclasses.replace(
        config_lib.smoke(), data=dataclasses.replace(config_lib.smoke().data, num_train_windows=2)
    )
    w = lambda name, start: {"file": name, "start": start, "end": start + 10}  # noqa: E731
    good = [w("a", 0), w("b", 10), w("eval", 20)]
    input_lib.check_manifest(_manifest(tmp_path, good), config)
    with pytest.raises(UserError, match=r"window b \[5, 15\) is out of time order after a"):
        input_lib.check_manifest(_manifest(tmp_path, [w("a", 0), w("b", 5), w("e", 20)]), config)
    with pytest.raises(UserError, match="window eval .* out of time order"):
        input_lib.check_manifest(_manifest(tmp_path, [w("a", 0), w("b", 10), w("eval", 0)]),
                                 config)  # fmt: skip
    rows = config.model.item_rows
    with pytest.raises(UserError, match=f"ids up to {rows} in table item_id, outside its {rows}"):
        input_lib.check_manifest(_manifest(tmp_path, good, {"item_id": rows + 1}), config)
    with pytest.raises(UserError, match="no manifest.json"):
        input_lib.read_manifest(str(tmp_path / "missing"))
    (tmp_path / input_lib.MANIFEST).write_text("{not json")
    with pytest.raises(UserError, match="is corrupt"):
        input_lib.read_manifest(str(tmp_path))


def test_list_reports_embedding_and_dense_parameters_apart():
    from mlperf_tf import cli  # noqa: PLC0415

    groups = cli._count(DlrmV4Benchmark, "parameter_groups")  # what `list --json` prints
    assert groups == {"embedding": 293_051_712 * 512, "dense": groups["dense"]}
    assert sum(groups.values()) == DlrmV4Benchmark(config_lib.mlperf()).parameter_count()


def test_training_flops_are_the_references_yardstick():
    """dlrm_hstu.py `_hstu_layer_flops`, D = 512, H = 4, d = 128, 3 layers, at the jagged
    sequence's mean length S = 8 contextual + 4,086 history (gin HISTORY_LENGTH = MIN_HISTORY)
    + 1 candidate = 4,095, not the padded 4,096 (the simulator's compute)."""
    s, d, h, dv = 4095.0, 512, 4, 128
    uvqk = 2 * 3 * s * d * (4 * dv) * h
    attn = 2 * 3.5 * (s * s / 2) * h * (2 * dv)
    out = 2 * 3 * s * (3 * h * dv) * d
    want = 3 * (uvqk + attn + out) + 2 * 3 * 1 * d
    got = DlrmV4Benchmark(config_lib.mlperf()).training_flops_per_sample()
    assert got == pytest.approx(want, rel=1e-12)
    assert 3 * attn / want == pytest.approx(0.57, abs=0.01)  # "attention is ~57% of the total"


def test_an_id_outside_its_table_in_a_record_is_a_one_line_data_error(tmp_path):
    import tensorflow as tf  # noqa: PLC0415

    from benchmarks.dlrmv4 import prepare  # noqa: PLC0415
    from mlperf_tf.data.pipeline import DataError, translate_errors  # noqa: PLC0415

    config = dataclasses.replace(
        config_lib.smoke(),
        data_dir=str(tmp_path),
        global_batch_size=2,
        data=dataclasses.replace(config_lib.smoke().data, num_train_windows=1),
    )
    rows = config.model.item_rows
    good = prepare._example(([1], [1], [1], [1], [5]), [0] * 8, (2, 1, 1, 6), 1)
    bad = prepare._example(([rows], [1], [1], [1], [5]), [0] * 8, (2, 1, 1, 6), 1)
    for name, records in (("train-00000.tfrecord", [good, bad]), ("eval.tfrecord", [good])):
        with tf.io.TFRecordWriter(str(tmp_path / name)) as writer:
            for record in records:
                writer.write(record)
    w = lambda name, start: {"file": name, "start": start, "end": start + 10}  # noqa: E731
    _manifest(tmp_path, [w("train-00000.tfrecord", 0), w("eval.tfrecord", 10)])
    data = input_lib.train_dataset(
        config, input_context=None, batch_size=1, seed=0, skip_bad_records=False
    )
    with pytest.raises(DataError, match=r"an id outside its table \(`model.item_rows` 64\)") as e:
        with translate_errors():
            for _ in data.take(2):
                pass
    assert "\n" not in str(e.value) and "train-00000.tfrecord" in str(e.value)
