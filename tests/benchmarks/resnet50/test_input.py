"""Tests the ResNet-50 input: record parsing, train/eval transforms (eager and in tf.data), datasets."""

import dataclasses

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.resnet50 import config as rc
from benchmarks.resnet50 import input as input_lib
from benchmarks.resnet50 import prepare
from mlperf_tf.data import tfrecord
from mlperf_tf.errors import DataError


def _config(data_dir="", **data):
    cfg = rc.smoke()
    return dataclasses.replace(cfg, data_dir=data_dir, data=dataclasses.replace(cfg.data, **data))


def _jpeg(height, width, seed=0):
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, [height, width, 3], dtype=np.uint8)
    # No chroma subsampling: the fused crop-decode then matches decode-then-slice exactly.
    return image, tf.io.encode_jpeg(image, quality=100, chroma_downsampling=False).numpy()


def _record(jpeg, label, boxes=()):
    return prepare.image_example(
        jpeg, label=label, wnid="n0", file_name="x.JPEG", boxes=boxes
    ).SerializeToString()


def test_parse_record_reads_imagenet_keys_and_boxes():
    _, jpeg = _jpeg(20, 30)
    parsed = input_lib.parse_record(tf.constant(_record(jpeg, 7, [(0.1, 0.2, 0.5, 0.9)])))
    assert parsed["image/encoded"].numpy() == jpeg
    assert int(parsed["label"]) == 7
    # [1, boxes, 4] as [ymin, xmin, ymax, xmax]
    np.testing.assert_allclose(parsed["bbox"].numpy(), [[[0.2, 0.1, 0.9, 0.5]]], rtol=1e-6)
    no_box = input_lib.parse_record(tf.constant(_record(jpeg, 3)))
    assert no_box["bbox"].shape == (1, 0, 4)


def _both_ways(fn, example):
    """Runs `fn` eagerly and inside tf.data.map; returns both outputs."""
    eager = fn(example)
    mapped = next(iter(tf.data.Dataset.from_tensors(example).map(fn)))
    return eager, mapped


def test_train_transform_shapes_label_offset_and_normalization():
    cfg = _config(image_size=32, random_flip=True)
    _, jpeg = _jpeg(48, 40)
    example = input_lib.parse_record(tf.constant(_record(jpeg, 5, [(0.0, 0.0, 1.0, 1.0)])))
    for out in _both_ways(input_lib.make_train_transform(cfg, seed=1), example):
        assert out["image"].shape == (32, 32, 3) and out["image"].dtype == tf.float32
        assert int(out["label"]) == 4  # stored 5, label_offset 1
        # Normalized from [0, 255] with the ImageNet mean/std: roughly within [-2.2, 2.7].
        assert (
            -2.2 <= float(tf.reduce_min(out["image"])) and float(tf.reduce_max(out["image"])) <= 2.7
        )


def test_eval_transform_is_center_crop_then_resize():
    cfg = _config(image_size=16, crop_padding=16)  # keeps 16/32 of the shorter side
    image, jpeg = _jpeg(40, 60, seed=2)
    example = input_lib.parse_record(tf.constant(_record(jpeg, 1)))
    decoded = tf.io.decode_jpeg(jpeg).numpy().astype(np.float32)
    side = 20  # 0.5 * min(40, 60)
    top, left = (40 - side + 1) // 2, (60 - side + 1) // 2
    expected = tf.image.resize(decoded[top : top + side, left : left + side], [16, 16]).numpy()
    mean, std = np.array(cfg.data.mean_rgb), np.array(cfg.data.stddev_rgb)
    for out in _both_ways(input_lib.make_eval_transform(cfg), example):
        np.testing.assert_allclose(out["image"].numpy(), (expected - mean) / std, atol=1e-4)
        assert int(out["label"]) == 0
    del image


def test_label_offset_zero_keeps_stored_labels():
    cfg = _config(label_offset=0)
    _, jpeg = _jpeg(8, 8)
    example = input_lib.parse_record(tf.constant(_record(jpeg, 0)))
    assert int(input_lib.make_eval_transform(cfg)(example)["label"]) == 0


def test_out_of_range_label_fails():
    cfg = _config()  # 10 classes, offset 1: stored labels must be 1..10
    _, jpeg = _jpeg(8, 8)
    for stored in (0, 11):
        example = input_lib.parse_record(tf.constant(_record(jpeg, stored)))
        with pytest.raises(tf.errors.InvalidArgumentError, match="label"):
            input_lib.make_eval_transform(cfg)(example)


def _write_records(tmp_path, n_train=24, n_eval=10):
    train = [_record(_jpeg(24, 28, i)[1], 1 + i % 10) for i in range(n_train)]
    val = [_record(_jpeg(24, 28, 100 + i)[1], 1 + i % 10) for i in range(n_eval)]
    tfrecord.write_sharded(train, str(tmp_path), prefix="train", num_shards=3)
    tfrecord.write_sharded(val, str(tmp_path), prefix="validation", num_shards=2)
    return str(tmp_path)


def test_train_and_eval_datasets_from_records(tmp_path):
    cfg = _config(_write_records(tmp_path), image_size=16, shuffle_buffer=8)
    train = input_lib.train_dataset(cfg, input_context=None, batch_size=4, seed=0)
    batch = next(iter(train))
    assert batch["image"].shape == (4, 16, 16, 3) and batch["label"].shape == (4,)
    assert batch["label"].dtype == tf.int32
    evals = list(input_lib.eval_dataset(cfg, input_context=None, batch_size=4, num_batches=3))
    assert len(evals) == 3
    valid = np.concatenate([b["valid"].numpy() for b in evals])
    assert valid.sum() == 10 and valid.shape == (12,)


def test_train_files_are_sharded_per_input_pipeline(tmp_path):
    cfg = _config(_write_records(tmp_path, n_train=30), image_size=8, shuffle_buffer=1)
    seen = []
    for pipeline in range(3):
        ctx = tf.distribute.InputContext(
            num_input_pipelines=3, input_pipeline_id=pipeline, num_replicas_in_sync=3
        )
        ds = input_lib.train_dataset(cfg, input_context=ctx, batch_size=10, seed=0)
        seen.append(sorted(next(iter(ds))["label"].numpy().tolist()))
    # 30 records round-robin into 3 files: file k holds records k, k+3, ...; one file each.
    for pipeline, labels in enumerate(seen):
        expected = sorted((i % 10) for i in range(pipeline, 30, 3))
        assert labels == expected


def test_missing_data_dir_is_a_data_error(tmp_path):
    cfg = _config(str(tmp_path / "nope"))
    with pytest.raises(DataError, match="nope"):
        input_lib.train_dataset(cfg, input_context=None, batch_size=2)
    with pytest.raises(DataError, match="nope"):
        input_lib.eval_dataset(cfg, input_context=None, batch_size=2, num_batches=1)


def test_synthetic_datasets_have_the_real_shapes():
    cfg = _config(image_size=24)
    train = next(iter(input_lib.synthetic_train_dataset(cfg, batch_size=3)))
    assert train["image"].shape == (3, 24, 24, 3) and train["label"].dtype == tf.int32
    assert 0 <= int(tf.reduce_min(train["label"])) and int(tf.reduce_max(train["label"])) < 10
    evals = list(input_lib.synthetic_eval_dataset(cfg, batch_size=3, num_batches=2))
    assert len(evals) == 2 and float(evals[0]["valid"].numpy().sum()) == 3.0
