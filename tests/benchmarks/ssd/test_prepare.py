"""Tests of SSD data preparation: the COCO converter and the digit-canvas mini dataset."""

import json

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import input as input_lib
from benchmarks.ssd import prepare
from mlperf_tf.errors import DataError, UserError


def _records(pattern):
    files = sorted(tf.io.gfile.glob(pattern))
    return [input_lib.parse_record(r) for r in tf.data.TFRecordDataset(files)]


@pytest.fixture(scope="module")
def mini_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ssd_mini") / "data"
    prepare.prepare_mini(str(root), num_train=12, num_eval=6)
    return root


def test_mini_writes_coco_json_and_matching_records(mini_dir):
    for split, count in (("train", 12), ("val", 6)):
        with open(mini_dir / "annotations" / f"instances_{split}.json") as f:
            dataset = json.load(f)
        assert len(dataset["images"]) == count
        assert [c["id"] for c in dataset["categories"]] == list(range(1, 11))
        records = _records(str(mini_dir / f"{split}-*"))
        assert len(records) == count
        by_id = {im["id"]: im for im in dataset["images"]}
        for rec in records:
            image = by_id[int(rec["source_id"])]
            anns = [a for a in dataset["annotations"] if a["image_id"] == image["id"]]
            assert 1 <= len(anns) <= prepare.MINI_MAX_DIGITS
            h, w = image["height"], image["width"]
            assert (int(rec["height"]), int(rec["width"])) == (h, w)
            expected = [
                [y / h, x / w, (y + bh) / h, (x + bw) / w]
                for x, y, bw, bh in (a["bbox"] for a in anns)
            ]
            np.testing.assert_allclose(rec["boxes"], expected, atol=1e-6)
            np.testing.assert_array_equal(rec["labels"], [a["category_id"] for a in anns])
            pixels = tf.io.decode_jpeg(rec["encoded"]).numpy()
            assert pixels.shape == (h, w, 3)
            # The digit is brighter than the dark background inside its box.
            x, y, bw, bh = (int(v) for v in anns[0]["bbox"])
            assert pixels[y : y + bh, x : x + bw].mean() > pixels.mean()


def test_mini_is_deterministic_and_held_out(mini_dir, tmp_path):
    again = tmp_path / "again"
    prepare.prepare_mini(str(again), num_train=12, num_eval=6)
    for name in ("instances_train.json", "instances_val.json"):
        assert (again / "annotations" / name).read_text() == (
            mini_dir / "annotations" / name
        ).read_text()
    with open(mini_dir / "annotations" / "instances_train.json") as f:
        train_ids = {im["id"] for im in json.load(f)["images"]}
    with open(mini_dir / "annotations" / "instances_val.json") as f:
        assert not train_ids & {im["id"] for im in json.load(f)["images"]}


def test_convert_split_skips_empty_images_and_keeps_crowd_flags(tmp_path):
    from PIL import Image

    images = tmp_path / "images"
    images.mkdir()
    for name in ("a.jpg", "b.png"):
        Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(images / name)
    dataset = {
        "images": [
            {"id": 3, "file_name": "a.jpg", "height": 20, "width": 30},
            {"id": 4, "file_name": "b.png", "height": 20, "width": 30},
        ],
        "annotations": [
            {
                "id": 1,
                "image_id": 3,
                "bbox": [3, 2, 15, 10],
                "category_id": 18,
                "iscrowd": 1,
                "area": 150,
            }
        ],
        "categories": [{"id": 18, "name": "dog"}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(dataset))
    kw = dict(
        image_dir=str(images),
        annotations_file=str(tmp_path / "ann.json"),
        num_shards=2,
        num_workers=0,
        progress=False,
    )
    prepare.convert_split(out_dir=str(tmp_path / "train"), prefix="train", skip_empty=True, **kw)
    records = _records(str(tmp_path / "train" / "train-*"))
    assert [int(r["source_id"]) for r in records] == [3]
    np.testing.assert_array_equal(records[0]["is_crowd"], [1])
    prepare.convert_split(out_dir=str(tmp_path / "val"), prefix="val", skip_empty=False, **kw)
    assert sorted(int(r["source_id"]) for r in _records(str(tmp_path / "val" / "val-*"))) == [3, 4]


def test_missing_inputs_are_data_errors(tmp_path):
    with pytest.raises(DataError, match="nowhere"):
        prepare.convert_split(
            image_dir=str(tmp_path / "nowhere"), annotations_file="x.json", out_dir=str(tmp_path),
            prefix="val", num_shards=1, skip_empty=False,
        )  # fmt: skip
    (tmp_path / "imgs").mkdir()
    (tmp_path / "ann.json").write_text(
        json.dumps(
            {
                "images": [{"id": 1, "file_name": "gone.jpg", "height": 2, "width": 2}],
                "annotations": [],
                "categories": [],
            }
        )
    )
    with pytest.raises(DataError, match="gone.jpg"):
        prepare.convert_split(
            image_dir=str(tmp_path / "imgs"), annotations_file=str(tmp_path / "ann.json"),
            out_dir=str(tmp_path), prefix="val", num_shards=1, skip_empty=False,
        )  # fmt: skip
    with pytest.raises(DataError, match="nowhere"):
        prepare.main(["--coco_dir", str(tmp_path / "nowhere"), "--out_dir", str(tmp_path / "o")])
    with pytest.raises(UserError, match="--coco_dir or --mini"):
        prepare.main(["--out_dir", str(tmp_path / "o")])
