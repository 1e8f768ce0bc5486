"""Tests of mlperf_tf.data.pipeline: files, sharding, training/eval pipelines, padding, bad data."""

import collections
import os
import re
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
from absl import logging as absl_logging

from mlperf_tf.data import image_ops, pipeline
from mlperf_tf.errors import DataError
from tests.mlperf_tf.data import helpers


def _context(num_pipelines, pipeline_id, replicas=None):
    return tf.distribute.InputContext(
        num_input_pipelines=num_pipelines,
        input_pipeline_id=pipeline_id,
        num_replicas_in_sync=replicas or num_pipelines,
    )


def _xs(dataset, key="x"):
    return np.concatenate([b[key].numpy() for b in dataset]).tolist()


# ---- list_files -------------------------------------------------------------------------------
def test_list_files_sorted_and_deduplicated(tmp_path):
    paths = helpers.write_ints(tmp_path, 6, 3)
    pattern = str(tmp_path / "train-*")
    assert pipeline.list_files([pattern, pattern]) == sorted(paths)
    assert pipeline.list_files(str(tmp_path)) == sorted(paths)  # a directory means its files


def test_list_files_missing_dir_is_one_line_data_error(tmp_path):
    with pytest.raises(DataError, match=r"ImageNet directory '.*nowhere' does not exist") as e:
        pipeline.list_files(str(tmp_path / "nowhere" / "train-*"), what="ImageNet")
    assert "\n" not in str(e.value)


def test_list_files_empty_glob_is_one_line_data_error(tmp_path):
    with pytest.raises(DataError, match=r"no data files match '.*train-\*'") as e:
        pipeline.list_files(str(tmp_path / "train-*"))
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="no data file pattern"):
        pipeline.list_files([])


# ---- sharding ---------------------------------------------------------------------------------
def test_shard_files_file_level():
    files = [f"f{i}" for i in range(5)]
    shards = [pipeline.shard_files(files, _context(2, i)) for i in range(2)]
    assert shards == [(["f0", "f2", "f4"], None), (["f1", "f3"], None)]
    assert pipeline.shard_files(files, None) == (files, None)


def test_shard_files_record_level_when_fewer_files_warns():
    with mock.patch.object(absl_logging, "warning") as warning:
        assert pipeline.shard_files(["a", "b"], _context(3, 1)) == (["a", "b"], (3, 1))
    message = warning.call_args[0][0] % warning.call_args[0][1:]
    assert "record-level sharding" in message and "2 input files for 3" in message


def test_pipelines_partition_the_records(tmp_path):
    """File-level (4 files) and record-level (2 files, 3 pipelines) shards are disjoint and
    together hold every record once."""
    for num_files, num_pipelines in ((4, 2), (2, 3)):
        files = helpers.write_ints(tmp_path / f"{num_files}", 24, num_files)
        seen = []
        for i in range(num_pipelines):
            ds = pipeline.training_pipeline(
                files,
                input_context=_context(num_pipelines, i),
                parse_fn=helpers.parse_int,
                transform_fn=None,
                batch_size=4,
                num_epochs=1,
            )
            seen += _xs(ds)
        assert sorted(seen) == list(range(24)), (num_files, num_pipelines)


# ---- training ---------------------------------------------------------------------------------
def test_training_pipeline_epochs_are_shuffled_permutations(tmp_path):
    files = helpers.write_ints(tmp_path, 40, 4)
    ds = pipeline.training_pipeline(
        files, input_context=None, parse_fn=helpers.parse_int, transform_fn=None, batch_size=8
    )
    assert ds.element_spec["x"].shape.as_list() == [8]  # static batch: drop_remainder
    xs = _xs(ds.take(10))  # two epochs
    assert sorted(xs[:40]) == list(range(40)) and sorted(xs[40:]) == list(range(40))
    assert xs[:40] != list(range(40)) and xs[:40] != xs[40:]  # shuffled, reshuffled per epoch


def test_training_pipeline_applies_transform_and_options(tmp_path):
    files = helpers.write_ints(tmp_path, 12, 2)

    def transform(example):
        return {"x": example["x"], "double": tf.cast(2 * example["x"], tf.float32)}

    ds = pipeline.training_pipeline(
        files,
        input_context=None,
        parse_fn=helpers.parse_int,
        transform_fn=transform,
        batch_size=3,
        cache=True,
        num_epochs=2,
    )
    batches = list(ds)
    assert len(batches) == 8
    for b in batches:
        np.testing.assert_array_equal(b["double"].numpy(), 2 * b["x"].numpy())
    options = ds.options()
    assert options.deterministic is False
    assert options.autotune.enabled and options.autotune.ram_budget > 0
    assert options.threading.private_threadpool_size == (os.cpu_count() or 1)
    assert options.experimental_slack and options.experimental_optimization.map_parallelization


def test_training_pipeline_validates_arguments(tmp_path):
    files = helpers.write_ints(tmp_path, 4, 1)
    kwargs = dict(input_context=None, parse_fn=helpers.parse_int, transform_fn=None)
    with pytest.raises(ValueError, match=r"`batch_size` \(0\)"):
        pipeline.training_pipeline(files, batch_size=0, **kwargs)
    with pytest.raises(TypeError, match="parse_fn"):
        pipeline.training_pipeline(files, batch_size=2, **{**kwargs, "parse_fn": 3})
    with pytest.raises(DataError, match="does not exist"):
        pipeline.training_pipeline([str(tmp_path / "gone")], batch_size=2, **kwargs)


# ---- eval -------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_files", [4, 1])
def test_eval_pipeline_same_batches_per_pipeline_and_all_examples_once(tmp_path, num_files):
    """10 examples over 3 pipelines (at most 5 each), 3 batches of 2: every pipeline yields
    exactly 3 batches, padding is marked valid=0 and zero, and the real examples are each seen
    once."""
    files = helpers.write_ints(tmp_path, 10, num_files)
    real = []
    for i in range(3):
        ds = pipeline.eval_pipeline(
            files,
            input_context=_context(3, i),
            parse_fn=helpers.parse_int,
            transform_fn=None,
            batch_size=2,
            num_batches=3,
        )
        assert ds.cardinality().numpy() == 3
        batches = list(ds)
        assert len(batches) == 3
        valid = np.concatenate([b["valid"].numpy() for b in batches])
        xs = np.concatenate([b["x"].numpy() for b in batches])
        assert valid.dtype == np.float32 and set(valid.tolist()) <= {0.0, 1.0}
        assert np.all(xs[valid == 0] == 0)
        assert list(valid) == sorted(valid, reverse=True)  # real examples first
        real += xs[valid == 1].tolist()
    assert sorted(real) == list(range(10))


def test_eval_pipeline_is_deterministic(tmp_path):
    files = helpers.write_ints(tmp_path, 30, 3)
    kwargs = dict(
        input_context=None,
        parse_fn=helpers.parse_int,
        transform_fn=None,
        batch_size=4,
        num_batches=8,
        cache=False,
    )
    first = _xs(pipeline.eval_pipeline(files, **kwargs))
    second = _xs(pipeline.eval_pipeline(files, **kwargs))
    assert first == second and sorted(first[:30]) == list(range(30))
    ds = pipeline.eval_pipeline(files, **{**kwargs, "cache": True})
    assert _xs(ds) == _xs(ds) == first  # the cached second pass gives the same
    assert ds.options().deterministic is True


def test_eval_batches_per_pipeline():
    assert pipeline.eval_batches_per_pipeline(5, None) == 5
    assert pipeline.eval_batches_per_pipeline(5, _context(2, 0, replicas=8)) == 20
    with pytest.raises(ValueError, match="steps_per_replica"):
        pipeline.eval_batches_per_pipeline(0, None)


# ---- pad_eval_dataset -------------------------------------------------------------------------
def _examples(n):
    return tf.data.Dataset.range(n).map(
        lambda i: {"x": tf.fill([2], i), "name": tf.strings.as_string(i)}
    )


def test_pad_eval_dataset_pads_and_marks():
    batches = list(pipeline.pad_eval_dataset(_examples(5), batch_size=3, num_batches=3))
    assert len(batches) == 3
    valid = np.concatenate([b["valid"].numpy() for b in batches])
    np.testing.assert_array_equal(valid, [1, 1, 1, 1, 1, 0, 0, 0, 0])
    xs = np.concatenate([b["x"].numpy() for b in batches])
    np.testing.assert_array_equal(xs[:, 0], [0, 1, 2, 3, 4, 0, 0, 0, 0])
    names = np.concatenate([b["name"].numpy() for b in batches])
    assert names[-1] == b""


def test_pad_eval_dataset_exact_fit_and_overflow():
    assert len(list(pipeline.pad_eval_dataset(_examples(6), batch_size=3, num_batches=2))) == 2
    with pytest.raises(tf.errors.InvalidArgumentError, match="raise num_batches"):
        list(pipeline.pad_eval_dataset(_examples(7), batch_size=3, num_batches=2))


def test_pad_eval_dataset_rejects_bad_specs():
    with pytest.raises(ValueError, match="dicts"):
        pipeline.pad_eval_dataset(tf.data.Dataset.range(3), batch_size=1, num_batches=3)
    ragged = tf.data.Dataset.range(3).map(lambda i: {"x": tf.range(i)})
    with pytest.raises(ValueError, match="'x' needs a fixed shape"):
        pipeline.pad_eval_dataset(ragged, batch_size=1, num_batches=3)
    marked = _examples(2).map(lambda e: {**e, "valid": 1.0})
    with pytest.raises(ValueError, match="valid"):
        pipeline.pad_eval_dataset(marked, batch_size=1, num_batches=3)
    with pytest.raises(ValueError, match=r"`num_batches` \(0\)"):
        pipeline.pad_eval_dataset(_examples(2), batch_size=1, num_batches=0)


# ---- bad data ---------------------------------------------------------------------------------
def _decode(example):
    image = image_ops.decode_and_center_crop(example["image/encoded"], image_size=16)
    return {"image": image, "label": example["image/class/label"]}


def _image_pipelines(files, skip):
    common = dict(
        input_context=None,
        parse_fn=helpers.parse_image,
        transform_fn=_decode,
        batch_size=4,
        skip_bad_records=skip,
    )
    train = pipeline.training_pipeline(files, num_epochs=2, **common)
    evals = pipeline.eval_pipeline(files, num_batches=6, **common)
    return train, evals


def _labels(train, evals):
    with pipeline.translate_errors():
        train_labels = _xs(train, "label")
        eval_labels = [
            label
            for b in evals
            for label, v in zip(b["label"].numpy(), b["valid"].numpy(), strict=True)
            if v
        ]
    return train_labels, eval_labels


@pytest.mark.parametrize("bad_index", [5, 23])  # 23: the eval stream's very last record
def test_undecodable_image_names_its_file(tmp_path, bad_index):
    files = helpers.write_images(tmp_path, 24, 3, bad={bad_index})
    bad_file = files[bad_index % 3]
    train, evals = _image_pipelines(files, skip=False)
    for dataset in (train, evals):
        with pytest.raises(DataError) as e:
            _labels(dataset.take(100), evals.take(0))
        message = str(e.value)
        assert f"'{bad_file}'" in message and "skip_bad_records" in message
        assert "\n" not in message


def test_undecodable_image_skipped_and_counted(tmp_path, capfd):
    files = helpers.write_images(tmp_path, 24, 3, bad={5, 23})
    train, evals = _image_pipelines(files, skip=True)
    train_labels, eval_labels = _labels(train, evals)
    expected = sorted(set(range(24)) - {5, 23})
    assert sorted(eval_labels) == expected
    # 2 epochs of 22 good examples = 44 = 11 batches of 4: nothing else dropped
    assert collections.Counter(train_labels) == collections.Counter(expected * 2)
    err = capfd.readouterr().err
    warnings = [line for line in err.splitlines() if "bad record(s)" in line]
    counts = [int(re.search(r"skipped (\d+) bad record", w).group(1)) for w in warnings]
    assert sum(counts) == 2 + 4  # eval: 2; train: 2 per epoch
    assert all(f"in file(s) '{files[2]}" in w for w in warnings)  # 5 % 3 == 23 % 3 == 2
    assert any("(4 skipped by this input pipeline so far)" in w for w in warnings)


def test_corrupt_record_names_its_file_or_is_skipped(tmp_path, capfd):
    files = helpers.write_ints(tmp_path, 30, 3)
    helpers.corrupt(files[1])
    common = dict(input_context=None, parse_fn=helpers.parse_int, transform_fn=None)
    for make in (
        lambda skip: pipeline.training_pipeline(
            files, batch_size=1, num_epochs=1, skip_bad_records=skip, **common
        ),
        lambda skip: pipeline.eval_pipeline(
            files, batch_size=1, num_batches=30, skip_bad_records=skip, **common
        ),
        lambda skip: pipeline.training_pipeline(
            files, batch_size=1, num_epochs=1, skip_bad_records=skip, cache=True, **common
        ),
    ):
        with pytest.raises(DataError, match=f"corrupt TFRecord file '{files[1]}'"):
            with pipeline.translate_errors():
                list(make(False))
        with pipeline.translate_errors():
            batches = list(make(True))
        xs = [
            x
            for b in batches
            for x, v in zip(b["x"].numpy(), b.get("valid", tf.ones_like(b["x"])), strict=True)
            if v
        ]
        # The reader drops the rest of the corrupt file; the other files are complete.
        assert {x for x in range(30) if x % 3 != 1} <= set(xs)
        assert len(xs) < 30
        assert f"skipped the rest of corrupt TFRecord file '{files[1]}'" in capfd.readouterr().err


def test_translate_errors_passes_other_errors_through():
    with pytest.raises(tf.errors.InvalidArgumentError):
        with pipeline.translate_errors():
            tf.debugging.Assert(False, ["unrelated"])
    assert pipeline.data_error_message(ValueError("x")) is None


# ---- cache=True: parse_fn's outputs (decoded images) cached, transform_fn every epoch --------
def _parse_and_decode(record):
    example = helpers.parse_image(record)
    return {
        "image": tf.io.decode_jpeg(example["image/encoded"], channels=3),
        "label": example["image/class/label"],
    }


def _augment(example):
    image = image_ops.random_crop(example["image"], None, image_size=8, area_range=(0.1, 0.3))
    return {"image": image, "label": example["label"]}


def _cached_images(files, batch_size, **kwargs):
    """Two epochs of the images in `files`, decoded once into the cache and cropped at random
    after it (ResNet's split of the work)."""
    return pipeline.training_pipeline(
        files, input_context=None, parse_fn=_parse_and_decode, transform_fn=_augment,
        batch_size=batch_size, cache=True, num_epochs=2, **kwargs,
    )  # fmt: skip


def test_cached_decoded_images_are_augmented_anew_each_epoch(tmp_path):
    files = helpers.write_images(tmp_path, 12, 2)
    batches = list(_cached_images(files, batch_size=4))
    labels = [x for b in batches for x in b["label"].numpy()]
    assert sorted(labels[:12]) == sorted(labels[12:]) == list(range(12))
    first = {lab: img for b in batches[:3] for lab, img in zip(b["label"].numpy(), b["image"])}
    second = {lab: img for b in batches[3:] for lab, img in zip(b["label"].numpy(), b["image"])}
    assert all(not np.allclose(first[k], second[k]) for k in range(12))  # new random crops


@pytest.mark.parametrize("bad", [7, 11])  # 11: the last record of the first (finite) stage
def test_cached_pipeline_bad_records(tmp_path, capfd, bad):
    files = helpers.write_images(tmp_path, 12, 2, bad={bad})
    with pytest.raises(DataError, match=f"in file '{files[1]}'"):
        with pipeline.translate_errors():
            list(_cached_images(files, batch_size=1))
    labels = [
        b["label"].numpy()[0] for b in _cached_images(files, batch_size=1, skip_bad_records=True)
    ]
    assert sorted(labels) == sorted([i for i in range(12) if i != bad] * 2)
    err = capfd.readouterr().err
    assert err.count("skipped 1 bad record(s)") == 1  # once: the cache holds no bad record
