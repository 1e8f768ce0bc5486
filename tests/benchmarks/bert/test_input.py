"""Tests of the BERT input: parsing MLPerf records (eagerly and in tf.data), pipelines, synthetic."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.bert import BertBenchmark, prepare
from benchmarks.bert import config as C
from benchmarks.bert import input as input_lib
from mlperf_tf.errors import DataError
from tests.benchmarks.bert.test_prepare import write_text

SEQ, PRED = 24, 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bert_data")
    text = write_text(root / "text.txt")
    params = prepare.CreationParams(
        max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=4, random_seed=3
    )
    kw = dict(input_files=[text], params=params, vocab_size=90, learner="builtin")
    prepare.prepare(output_dir=str(root / "train"), num_shards=2, **kw)
    prepare.prepare(output_dir=str(root / "eval"), num_shards=1, prefix="eval", **kw)
    return str(root)


def config_for(data_dir, **kw):
    base = C.smoke()
    return dataclasses.replace(
        base,
        data_dir=data_dir,
        data=dataclasses.replace(base.data, max_seq_length=SEQ, max_predictions_per_seq=PRED),
        model=dataclasses.replace(base.model, vocab_size=90),
        **kw,
    )


def test_parse_eagerly_and_in_dataset_map_agree(data_dir):
    config = config_for(data_dir)
    parse = input_lib.make_parse_fn(config)
    files = input_lib.INPUT.train_files(config)
    records = list(tf.data.TFRecordDataset(files[0]).take(3))
    eager = [parse(r) for r in records]
    mapped = list(tf.data.TFRecordDataset(files[0]).take(3).map(parse))
    for a, b in zip(eager, mapped):
        assert set(a) == set(input_lib.INT_KEYS) | {"masked_lm_weights", "next_sentence_labels"}
        for key in a:
            np.testing.assert_array_equal(a[key].numpy(), b[key].numpy())
            assert a[key].dtype == b[key].dtype
        assert a["input_ids"].shape == (SEQ,) and a["input_ids"].dtype == tf.int32
        assert a["masked_lm_weights"].dtype == tf.float32
        assert a["next_sentence_labels"].shape == ()


def test_record_of_other_length_fails_to_parse(data_dir):
    config = config_for(data_dir)
    other = dataclasses.replace(config, data=dataclasses.replace(config.data, max_seq_length=32))
    record = next(iter(tf.data.TFRecordDataset(input_lib.INPUT.train_files(config)[0])))
    with pytest.raises(tf.errors.InvalidArgumentError):
        input_lib.make_parse_fn(other)(record)


def test_train_and_eval_datasets(data_dir):
    config = config_for(data_dir)
    count = sum(1 for _ in tf.data.TFRecordDataset(input_lib.INPUT.eval_files(config)))
    bench = BertBenchmark(dataclasses.replace(config, eval_examples=count))
    batch = next(iter(bench.train_dataset(tf.distribute.InputContext())))
    assert batch["input_ids"].shape == (8, SEQ)
    assert batch["masked_lm_positions"].shape == (8, PRED)
    eval_batches = list(bench.eval_dataset(tf.distribute.InputContext()))
    assert len(eval_batches) == bench.eval_steps(1) == -(-count // 8)
    valid = np.concatenate([b["valid"].numpy() for b in eval_batches])
    assert valid.sum() == count
    # An eval set larger than eval_examples is an error, not a silent truncation.
    small = BertBenchmark(dataclasses.replace(config, eval_examples=count - 8))
    with pytest.raises(tf.errors.InvalidArgumentError, match="more than num_batches"):
        list(small.eval_dataset(tf.distribute.InputContext()))


def test_missing_data_dir_is_a_data_error(tmp_path):
    bench = BertBenchmark(config_for(str(tmp_path / "none")))
    with pytest.raises(DataError, match="BERT train TFRecord"):
        bench.train_dataset(tf.distribute.InputContext())


def test_synthetic_examples_have_the_real_structure():
    config = C.smoke()
    for seed in range(5):
        ex = {k: v.numpy() for k, v in input_lib.synthetic_example(config, seed).items()}
        n = ex["input_mask"].sum()
        assert 16 <= n <= 32 and np.all(ex["input_mask"][:n] == 1)
        assert np.all(ex["input_ids"][n:] == 0)
        k = int(ex["masked_lm_weights"].sum())
        pos = ex["masked_lm_positions"][:k]
        assert len(set(pos.tolist())) == k and np.all(pos < n) and np.all(pos >= 1)
        assert np.all(np.diff(pos) > 0)


def test_synthetic_eval_dataset_pads_to_the_step_count():
    config = C.smoke()
    ds = input_lib.INPUT.synthetic_eval_dataset(config, batch_size=8, num_batches=3, seed=0)
    batches = list(ds)
    assert len(batches) == 3
    valid = np.concatenate([b["valid"].numpy() for b in batches])
    assert valid.sum() == config.eval_examples  # 16 real, 8 padding
