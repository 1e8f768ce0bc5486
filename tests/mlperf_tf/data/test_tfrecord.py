"""Tests of mlperf_tf.data.tfrecord: feature builders and the sharded writers."""

import io

import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf.data import tfrecord
from mlperf_tf.errors import DataError


def _read(path):
    return [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)]


def test_features_round_trip_through_parse():
    example = tfrecord.make_example(
        {
            "text": "héllo",
            "raw": [b"a", b"bc"],
            "label": np.int64(7),
            "flags": [True, False],
            "boxes": np.array([[0.1, 0.2], [0.3, 0.4]], np.float32),
            "explicit": tfrecord.int64_feature([1, 2, 3]),
        }
    )
    spec = {
        "text": tf.io.FixedLenFeature([], tf.string),
        "raw": tf.io.FixedLenFeature([2], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64),
        "flags": tf.io.FixedLenFeature([2], tf.int64),
        "boxes": tf.io.FixedLenFeature([4], tf.float32),
        "explicit": tf.io.FixedLenFeature([3], tf.int64),
    }
    parsed = tf.io.parse_single_example(example.SerializeToString(), spec)
    assert parsed["text"].numpy().decode() == "héllo"
    assert parsed["raw"].numpy().tolist() == [b"a", b"bc"]
    assert parsed["label"].numpy() == 7
    assert parsed["flags"].numpy().tolist() == [1, 0]
    np.testing.assert_allclose(parsed["boxes"].numpy(), [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
    assert parsed["explicit"].numpy().tolist() == [1, 2, 3]


def test_make_example_rejects_empty_and_unknown_values():
    with pytest.raises(ValueError, match="feature 'empty' is empty"):
        tfrecord.make_example({"empty": []})
    with pytest.raises(ValueError, match="feature 'obj'.*unsupported type"):
        tfrecord.make_example({"obj": object()})


def test_write_sharded_round_robin(tmp_path):
    examples = [tfrecord.make_example({"i": i}) for i in range(7)]
    examples[3] = examples[3].SerializeToString()  # bytes are accepted too
    paths = tfrecord.write_sharded(examples, str(tmp_path / "out"), prefix="eval", num_shards=3)
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "eval-00000-of-00003",
        "eval-00001-of-00003",
        "eval-00002-of-00003",
    ]
    shards = [[e.features.feature["i"].int64_list.value[0] for e in _read(p)] for p in paths]
    assert shards == [[0, 3, 6], [1, 4], [2, 5]]
    with pytest.raises(ValueError, match="num_shards"):
        tfrecord.write_sharded([], str(tmp_path), prefix="x", num_shards=0)


def test_write_streamed_keeps_order_in_files_of_a_size_named_by_their_count(tmp_path):
    out = tmp_path / "out"
    examples = (tfrecord.make_example({"i": i}) for i in range(10))
    paths, count = tfrecord.write_streamed(
        examples, str(out), prefix="train", per_file=4, limit=9, suffix=".tfrecord"
    )
    assert count == 9
    assert sorted(p.name for p in out.iterdir()) == [
        "train-00000-of-00003.tfrecord",
        "train-00001-of-00003.tfrecord",
        "train-00002-of-00003.tfrecord",
    ]
    files = [[e.features.feature["i"].int64_list.value[0] for e in _read(p)] for p in paths]
    assert files == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert tfrecord.write_streamed([], str(tmp_path / "none"), prefix="x", per_file=2) == ([], 0)


def test_write_streamed_leaves_no_file_when_the_stream_fails(tmp_path):
    def failing():
        for i in range(5):
            yield tfrecord.make_example({"i": i})
        raise DataError("bad record")

    with pytest.raises(DataError, match="bad record"):
        tfrecord.write_streamed(failing(), str(tmp_path), prefix="train", per_file=2)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="per_file"):
        tfrecord.write_streamed([], str(tmp_path), prefix="x", per_file=0)


def make_square(item):
    """Module-level (picklable) maker for the parallel writer; skips negative items."""
    if item < 0:
        return None
    return tfrecord.make_example({"i": item, "square": item * item})


@pytest.mark.parametrize(
    "num_workers",
    # Spawned workers each import TensorFlow: tens of seconds on a loaded 2-core host.
    [0, pytest.param(2, marks=pytest.mark.slow)],
)
def test_write_sharded_parallel(tmp_path, num_workers):
    items = list(range(20)) + [-1, -2]
    paths = tfrecord.write_sharded_parallel(
        items,
        make_square,
        str(tmp_path),
        prefix="train",
        num_shards=4,
        num_workers=num_workers,
        progress=False,
    )
    values = sorted(
        (
            e.features.feature["i"].int64_list.value[0],
            e.features.feature["square"].int64_list.value[0],
        )
        for p in paths
        for e in _read(p)
    )
    assert values == [(i, i * i) for i in range(20)]


def test_progress_bar_and_all_skipped(tmp_path):
    stream = io.StringIO()
    bar = tfrecord.Progress(10, prefix="train", stream=stream)
    bar.update(4)
    bar.update(6)
    bar.close()
    assert "10/10" in stream.getvalue() and "#" * 30 in stream.getvalue()
    with pytest.raises(DataError, match="all 2 items skipped"):
        tfrecord.write_sharded_parallel(
            [-1, -2],
            make_square,
            str(tmp_path),
            prefix="t",
            num_shards=1,
            num_workers=0,
            progress=False,
        )
