"""Tests of the SSD input: record parsing, class mapping, SSD crop, train/eval transforms."""

import dataclasses
import io

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors, config, prepare
from benchmarks.ssd import input as input_lib
from benchmarks.ssd import model as model_lib


def _jpeg(height=60, width=80):
    from PIL import Image

    pixels = (np.arange(height * width * 3) % 251).astype(np.uint8).reshape(height, width, 3)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG")
    return buffer.getvalue()


def _record(annotations, height=60, width=80):
    image = {"id": 42, "file_name": "x.jpg", "height": height, "width": width}
    example = prepare.coco_example(
        image_bytes=_jpeg(height, width), image=image, annotations=annotations, image_format="jpeg"
    )
    return example.SerializeToString()


ANNOTATIONS = [
    {"bbox": [8, 6, 40, 30], "category_id": 90, "iscrowd": 0, "area": 1200},
    {"bbox": [50, 30, 20, 20], "category_id": 1, "iscrowd": 1, "area": 400},
    {"bbox": [0, 0, 0, 5], "category_id": 3, "iscrowd": 0, "area": 0},  # no area: dropped
]


def test_parse_record_round_trip():
    parsed = input_lib.parse_record(tf.constant(_record(ANNOTATIONS)))
    assert int(parsed["source_id"]) == 42
    assert (int(parsed["height"]), int(parsed["width"])) == (60, 80)
    np.testing.assert_allclose(
        parsed["boxes"],
        [[6 / 60, 8 / 80, 36 / 60, 48 / 80], [0.5, 50 / 80, 50 / 60, 70 / 80]],
        atol=1e-6,
    )
    np.testing.assert_array_equal(parsed["labels"], [90, 1])
    np.testing.assert_array_equal(parsed["is_crowd"], [0, 1])


def test_coco_ids_map_to_contiguous_classes():
    table = input_lib.class_lookup(config.COCO_CATEGORY_IDS)
    ids = tf.constant([1, 90, 12, 13, 500, -1])
    np.testing.assert_array_equal(input_lib.to_classes(ids, table), [1, 80, 0, 12, 0, 0])
    assert len(config.COCO_CATEGORY_IDS) == 80


def test_crop_window_respects_the_minimum_iou_and_centers():
    boxes = tf.constant([[0.2, 0.2, 0.6, 0.5], [0.5, 0.6, 0.9, 0.95]])
    sides, kept = [], 0
    for i in range(40):
        window, keep = input_lib.ssd_crop_window(boxes, max_samples=50, seed=tf.constant([i, 3]))
        window, keep = window.numpy(), keep.numpy()
        h, w = window[2] - window[0], window[3] - window[1]
        if (h, w) == (1.0, 1.0):
            assert keep.all()
            continue
        sides.append((h, w))
        assert 0.3 <= h <= 1 and 0.3 <= w <= 1 and 0.5 <= w / h <= 2
        centers = (boxes.numpy()[:, :2] + boxes.numpy()[:, 2:]) / 2
        inside = ((centers > window[:2]) & (centers < window[2:])).all(1)
        np.testing.assert_array_equal(keep, inside)
        kept += 1
    assert kept > 10  # most draws crop


def test_crop_of_an_image_without_boxes_keeps_it():
    window, keep = input_lib.ssd_crop_window(
        tf.zeros([0, 4]), max_samples=1, seed=tf.constant([1, 2])
    )
    np.testing.assert_array_equal(window, [0, 0, 1, 1])
    assert keep.shape == (0,)


def _cfg(**data):
    cfg = config.smoke()
    return dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, num_classes=81),
        data=dataclasses.replace(config.DataConfig(), **data),
    )


@pytest.mark.parametrize("in_dataset", [False, True])
def test_train_transform_eager_and_in_dataset(in_dataset):
    cfg = _cfg(max_samples=50)
    record = _record(ANNOTATIONS)

    def fn(serialized, seed):
        return input_lib.train_transform(cfg, input_lib.parse_record(serialized), seed)

    seeds = [tf.constant([s, 0], tf.int64) for s in range(8)]
    if in_dataset:
        ds = tf.data.Dataset.from_tensor_slices(([record] * 8, tf.stack(seeds))).map(fn)
        outputs = list(ds)
    else:
        outputs = [fn(tf.constant(record), s) for s in seeds]
    size, g = cfg.model.image_size, cfg.loss.max_num_boxes
    for out in outputs:
        assert out["image"].shape == (size, size, 3) and out["image"].dtype == tf.float32
        assert out["boxes"].shape == (g, 4) and out["classes"].shape == (g,)
        classes = out["classes"].numpy()
        # Only the non-crowd box with area survives, as class 80 (COCO id 90); maybe cropped out.
        assert set(classes[classes > 0]) <= {80}
        real = out["boxes"].numpy()[classes > 0]
        assert (real >= 0).all() and (real <= 1).all()
        assert (real[:, 2] > real[:, 0]).all() and (real[:, 3] > real[:, 1]).all()
    assert any((o["classes"].numpy() > 0).any() for o in outputs)


def test_train_transform_without_augmentation_keeps_boxes():
    cfg = _cfg(random_flip=False, color_jitter=False)
    # With all crop modes failing except "keep" (no box), the window is the image: use an image
    # without boxes to check the resize/normalize path alone.
    out = input_lib.train_transform(
        cfg, input_lib.parse_record(tf.constant(_record([]))), tf.constant([0, 1])
    )
    assert not out["classes"].numpy().any()
    mean = np.mean(out["image"].numpy())
    assert -3 < mean < 3


def test_flip_boxes():
    np.testing.assert_allclose(
        input_lib.flip_boxes(tf.constant([[0.1, 0.2, 0.5, 0.3]])), [[0.1, 0.7, 0.5, 0.8]], atol=1e-6
    )


def test_eval_transform_keeps_id_and_original_size():
    cfg = _cfg()
    out = input_lib.eval_transform(cfg, input_lib.parse_record(tf.constant(_record(ANNOTATIONS))))
    size = cfg.model.image_size
    assert out["image"].shape == (size, size, 3)
    assert int(out["source_id"]) == 42 and int(out["height"]) == 60 and int(out["width"]) == 80


def test_pad_boxes_truncates_and_pads():
    boxes, classes = input_lib.pad_boxes(tf.ones([5, 4]), tf.ones([5], tf.int32), 3)
    assert boxes.shape == (3, 4) and classes.numpy().tolist() == [1, 1, 1]
    boxes, classes = input_lib.pad_boxes(tf.ones([1, 4]), tf.ones([1], tf.int32), 3)
    assert classes.numpy().tolist() == [1, 0, 0]


def test_synthetic_example_boxes_are_valid():
    cfg = config.smoke()
    ex = input_lib.synthetic_example(cfg, 3)
    real = ex["boxes"][ex["classes"] > 0]
    assert len(real) >= 1 and (real[:, 2:] > real[:, :2]).all()
    # Every synthetic box is matchable: its best default box overlaps it.
    boxes = model_lib.default_boxes(cfg.model)
    iou = anchors.pairwise_iou(tf.constant(real), tf.constant(boxes.corners))
    assert float(tf.reduce_min(tf.reduce_max(iou, axis=1))) > 0.3
