"""Tests ResNet-50 data preparation: ImageNet-tree conversion, labels files, the digits mini set."""

import io
import os

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from benchmarks.resnet50 import config as rc
from benchmarks.resnet50 import input as input_lib
from benchmarks.resnet50 import prepare
from mlperf_tf.errors import DataError, UserError


def _jpeg_file(path, color=(200, 10, 10), size=(12, 10), mode="RGB", fmt="JPEG"):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    image = Image.new("RGB", size, color)
    if mode != "RGB":
        image = image.convert(mode)
    image.save(path, format=fmt)


def _read(pattern):
    files = sorted(tf.io.gfile.glob(pattern))
    records = [r.numpy() for r in tf.data.TFRecordDataset(files)]
    return [tf.train.Example.FromString(r) for r in records]


def _feature(example, key):
    feature = example.features.feature[key]
    return list(feature.bytes_list.value or feature.int64_list.value or feature.float_list.value)


def _tree(root, val_labels="pairs"):
    """2 classes x 2 training images (one PNG, one CMYK JPEG) and 3 validation images."""
    _jpeg_file(f"{root}/train/n02/a.JPEG")
    _jpeg_file(f"{root}/train/n02/b.JPEG", mode="CMYK")
    _jpeg_file(f"{root}/train/n01/c.JPEG", fmt="PNG")  # a PNG named .JPEG, as in ImageNet
    _jpeg_file(f"{root}/train/n01/d.JPEG", size=(30, 20))
    names = ["v1.JPEG", "v2.JPEG", "v3.JPEG"]
    wnids = ["n02", "n01", "n02"]
    for name in names:
        _jpeg_file(f"{root}/val/{name}")
    if val_labels == "pairs":
        text = "".join(f"{n} {w}\n" for n, w in zip(names, wnids))
        path = f"{root}/val_labels.txt"
    elif val_labels == "wnids":
        text = "".join(f"{w}\n" for w in wnids)
        path = f"{root}/imagenet_2012_validation_synset_labels.txt"
    else:  # kaggle
        rows = [f"{n[:-5]},{w} 1 2 3 4" for n, w in zip(names, wnids)]
        text = "ImageId,PredictionString\n" + "\n".join(rows) + "\n"
        path = f"{root}/LOC_val_solution.csv"
    with open(path, "w") as f:
        f.write(text)
    return dict(zip(names, wnids))


@pytest.mark.parametrize("val_labels", ["pairs", "wnids", "kaggle"])
def test_imagenet_tree_to_records(tmp_path, val_labels):
    raw, out = str(tmp_path / "raw"), str(tmp_path / "out")
    expected_val = _tree(raw, val_labels)
    with open(tmp_path / "boxes.csv", "w") as f:
        f.write("a.JPEG,0.1,0.2,0.6,0.9\na.JPEG,0.0,0.0,0.5,0.5\n")
    counts = prepare.prepare_imagenet(
        raw,
        out,
        bbox_csv=str(tmp_path / "boxes.csv"),
        train_shards=2,
        eval_shards=1,
        num_workers=0,
        progress=False,
    )
    assert counts == {"train": 4, "validation": 3, "classes": 2}
    assert sorted(os.listdir(out)) == [
        "train-00000-of-00002",
        "train-00001-of-00002",
        "validation-00000-of-00001",
    ]
    train = {_feature(e, "image/filename")[0].decode(): e for e in _read(f"{out}/train-*")}
    assert sorted(train) == ["a.JPEG", "b.JPEG", "c.JPEG", "d.JPEG"]
    # Labels: 1 + index of the sorted wnids (n01 -> 1, n02 -> 2).
    assert {k: _feature(e, "image/class/label")[0] for k, e in train.items()} == {
        "a.JPEG": 2,
        "b.JPEG": 2,
        "c.JPEG": 1,
        "d.JPEG": 1,
    }
    for example in train.values():
        jpeg = _feature(example, "image/encoded")[0]
        assert jpeg[:2] == b"\xff\xd8"  # PNG and CMYK were re-encoded as JPEG
        assert tf.io.decode_jpeg(jpeg).shape[-1] == 3
    assert _feature(train["d.JPEG"], "image/height") == [20]
    assert _feature(train["d.JPEG"], "image/width") == [30]
    np.testing.assert_allclose(_feature(train["a.JPEG"], "image/object/bbox/xmin"), [0.1, 0.0])
    np.testing.assert_allclose(_feature(train["a.JPEG"], "image/object/bbox/ymax"), [0.9, 0.5])
    assert _feature(train["c.JPEG"], "image/object/bbox/xmin") == []
    val = {
        _feature(e, "image/filename")[0].decode(): _feature(e, "image/class/synset")[0].decode()
        for e in _read(f"{out}/validation-*")
    }
    assert val == expected_val
    # The records parse with the benchmark's own parser.
    record = next(iter(tf.data.TFRecordDataset(f"{out}/validation-00000-of-00001")))
    assert input_lib.parse_record(record)["image/encoded"].dtype == tf.string


def test_validation_class_folders_are_accepted(tmp_path):
    raw = tmp_path / "raw"
    _jpeg_file(f"{raw}/train/n01/a.JPEG")
    _jpeg_file(f"{raw}/val/n01/v.JPEG")
    train, val, synsets = prepare.scan_imagenet(str(raw))
    assert synsets == ["n01"] and len(train) == 1 and val[0][1:3] == (1, "n01")


@pytest.mark.slow  # spawns worker processes that each import TensorFlow (~1-2 min on 2 cores)
def test_parallel_workers_write_the_same_records(tmp_path):
    raw = str(tmp_path / "raw")
    _tree(raw)
    prepare.prepare_imagenet(
        raw, str(tmp_path / "a"), train_shards=2, eval_shards=1, num_workers=0, progress=False
    )
    prepare.prepare_imagenet(
        raw, str(tmp_path / "b"), train_shards=2, eval_shards=1, num_workers=2, progress=False
    )
    # Compare parsed examples: the byte order of a proto's map entries may differ by process.
    for name in os.listdir(tmp_path / "a"):
        assert _read(str(tmp_path / "a" / name)) == _read(str(tmp_path / "b" / name))


@pytest.mark.parametrize(
    "breakage, fragment",
    [
        ("no_train", "train"),
        ("no_labels", "validation labels"),
        ("unknown_wnid", "not a training class"),
        ("unlabelled", "has no label"),
        ("count_mismatch", "lines for"),
    ],
)
def test_bad_trees_raise_data_errors_naming_the_problem(tmp_path, breakage, fragment):
    raw = tmp_path / "raw"
    _tree(str(raw), "wnids" if breakage == "count_mismatch" else "pairs")
    labels = raw / "val_labels.txt"
    if breakage == "no_train":
        os.rename(raw / "train", raw / "elsewhere")
    elif breakage == "no_labels":
        os.remove(labels)
    elif breakage == "unknown_wnid":
        labels.write_text("v1.JPEG n99\nv2.JPEG n01\nv3.JPEG n01\n")
    elif breakage == "unlabelled":
        labels.write_text("v1.JPEG n01\nv2.JPEG n01\n")
    elif breakage == "count_mismatch":
        (raw / "imagenet_2012_validation_synset_labels.txt").write_text("n01\n")
    with pytest.raises(DataError, match=fragment):
        prepare.scan_imagenet(str(raw))


def test_malformed_bbox_file(tmp_path):
    path = tmp_path / "boxes.csv"
    path.write_text("a.JPEG,0.1,zero,0.5,0.5\n")
    with pytest.raises(DataError, match="line 1"):
        prepare.read_bboxes(str(path))


def test_unreadable_image_is_skipped_with_a_warning(tmp_path, capsys):
    path = tmp_path / "broken.JPEG"
    path.write_bytes(b"not an image")
    assert prepare.example_from_item((str(path), 1, "n01", ())) is None
    assert "broken.JPEG" in capsys.readouterr().err


def test_rgb_jpeg_keeps_rgb_and_grayscale_jpegs_unchanged():
    for mode in ("RGB", "L"):
        buffer = io.BytesIO()
        Image.new(mode, (4, 4)).save(buffer, format="JPEG")
        assert prepare.rgb_jpeg(buffer.getvalue()) == buffer.getvalue()


def test_mini_images_are_a_fixed_split_of_the_digits():
    train_x, train_y, eval_x, eval_y = prepare.mini_images()
    assert train_x.shape == (rc.MINI_TRAIN_EXAMPLES, 32, 32, 3) and train_x.dtype == np.uint8
    assert eval_x.shape == (rc.MINI_EVAL_EXAMPLES, 32, 32, 3)
    assert set(train_y) == set(eval_y) == set(range(10))
    again = prepare.mini_images()
    np.testing.assert_array_equal(again[3], eval_y)
    np.testing.assert_array_equal(again[2], eval_x)


def test_prepare_mini_writes_what_the_mini_preset_expects(tmp_path):
    data_dir = str(tmp_path / "resnet50-mini")
    counts = prepare.prepare_mini(data_dir)
    cfg = rc.mini()
    assert counts == {
        "train": cfg.train_examples,
        "validation": cfg.eval_examples,
        "classes": cfg.model.num_classes,
    }
    labels = [_feature(e, "image/class/label")[0] for e in _read(f"{data_dir}/validation-*")]
    assert len(labels) == cfg.eval_examples and set(labels) == set(range(1, 11))
    assert [n for n in os.listdir(tmp_path) if "partial" in n] == []  # no leftovers
    with pytest.raises(UserError, match="already exists"):
        prepare.prepare_mini(data_dir)


def test_main_requires_raw_dir(tmp_path):
    with pytest.raises(UserError, match="raw_dir"):
        prepare.main(["--out_dir", str(tmp_path)])
