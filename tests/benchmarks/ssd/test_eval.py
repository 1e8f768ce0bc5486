"""Tests of the eval path (decode, NMS, COCO json, pycocotools) on hand-made cases."""

import dataclasses
import json

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors, coco_metric, config
from benchmarks.ssd.benchmark import SSDBenchmark
from mlperf_tf.errors import DataError

HEIGHT, WIDTH = 200, 400  # the original image; the model sees it resized to 300x300
# Two ground-truth boxes of the first category, COCO [x, y, w, h] in pixels.
BOX_A = [40.0, 20.0, 100.0, 100.0]
BOX_B = [250.0, 60.0, 100.0, 100.0]
IMAGE_ID = 7


def _groundtruth(category):
    return {
        "images": [{"id": IMAGE_ID, "height": HEIGHT, "width": WIDTH}],
        "annotations": [
            {
                "id": k + 1,
                "image_id": IMAGE_ID,
                "category_id": category,
                "bbox": box,
                "area": box[2] * box[3],
                "iscrowd": 0,
            }
            for k, box in enumerate([BOX_A, BOX_B])
        ],
        "categories": [{"id": category, "name": "thing"}],
    }


def _normalized(box):
    x, y, w, h = box
    return [y / HEIGHT, x / WIDTH, (y + h) / HEIGHT, (x + w) / WIDTH]


class FakeModel:
    """Stands in for the SSD model: fixed outputs that decode into chosen detections."""

    def __init__(self, default_boxes, num_classes, detections):
        a = default_boxes.num_anchors
        codes = np.zeros((1, a, 4), np.float32)
        logits = np.zeros((1, a, num_classes), np.float32)
        logits[0, :, 0] = 20.0  # every other default box is confidently background
        for anchor, (box, logit) in zip((100, 5000), detections):
            center = tf.constant(default_boxes.center[anchor : anchor + 1])
            codes[0, anchor] = anchors.encode(tf.constant([_normalized(box)]), center).numpy()[0]
            logits[0, anchor] = 0.0
            logits[0, anchor, 1] = logit
        # Image 2 of the batch is eval padding: it predicts the same, and must be ignored.
        self.outputs = (tf.constant(np.repeat(codes, 2, 0)), tf.constant(np.repeat(logits, 2, 0)))

    def __call__(self, images, training=False):
        return self.outputs


def _benchmark(tmp_path):
    cfg = config.smoke()
    category = cfg.data.category_ids[0]
    (tmp_path / "gt.json").write_text(json.dumps(_groundtruth(category)))
    cfg = dataclasses.replace(
        cfg,
        model=config.ModelConfig(num_classes=cfg.model.num_classes),  # SSD300: 8732 boxes
        data_dir=str(tmp_path),
        data=dataclasses.replace(cfg.data, val_annotations="gt.json"),
    )
    return SSDBenchmark(cfg)


def _map(tmp_path, detections):
    bench = _benchmark(tmp_path)
    model = FakeModel(bench.default_boxes, bench.config.model.num_classes, detections)
    batch = {
        "image": tf.zeros([2, 300, 300, 3]),
        "source_id": tf.constant([IMAGE_ID, 0], tf.int64),
        "height": tf.constant([HEIGHT, 0]),
        "width": tf.constant([WIDTH, 0]),
        "valid": tf.constant([1.0, 0.0]),
    }
    outputs = tf.function(bench.eval_step)(model, batch)
    state = bench.eval_reduce(bench.eval_begin(), {k: v.numpy() for k, v in outputs.items()})
    return bench.eval_result(state)


def test_perfect_detections_score_map_1(tmp_path):
    assert _map(tmp_path, [(BOX_A, 9.0), (BOX_B, 8.0)]) == pytest.approx(1.0, abs=1e-9)


def test_detection_shifted_below_iou_threshold_lowers_map_as_computed_by_hand(tmp_path):
    # The detection of B moves 20 px right: IoU with B = 80*100 / (120*100) = 2/3, so it is a
    # true positive at the IoU thresholds 0.50, 0.55, 0.60, 0.65 (AP 1 each: both boxes found,
    # in score order) and a false positive at 0.70 ... 0.95. There, the ranked detections are
    # A (TP: recall 1/2, precision 1), then B' (FP: recall 1/2, precision 1/2); COCO's
    # interpolated precision is 1 at the 51 recall points 0.00..0.50 and 0 at the 50 points
    # above, so AP = 51/101. mAP = (4 * 1 + 6 * 51/101) / 10.
    shifted = [BOX_B[0] + 20.0, BOX_B[1], BOX_B[2], BOX_B[3]]
    expected = (4 * 1.0 + 6 * 51 / 101) / 10
    assert _map(tmp_path, [(BOX_A, 9.0), (shifted, 8.0)]) == pytest.approx(expected, abs=1e-6)


def test_detection_rows_are_coco_pixels():
    rows = coco_metric.detection_rows(
        image_ids=np.array([5]),
        heights=np.array([200]),
        widths=np.array([400]),
        boxes=np.array([[[0.1, 0.1, 0.6, 0.35], [0, 0, 0, 0]]]),
        scores=np.array([[0.9, 0.0]]),
        classes=np.array([[2, 0]]),
        category_ids=(3, 8),
    )
    np.testing.assert_allclose(rows, [[5, 40, 20, 100, 100, 0.9, 8]], atol=1e-9)
    [result] = coco_metric.to_coco_json(rows)
    assert result["image_id"] == 5 and result["category_id"] == 8
    assert result["bbox"] == pytest.approx([40, 20, 100, 100]) and result["score"] == pytest.approx(
        0.9
    )
    json.dumps(result)  # plain Python numbers


def test_no_detections_scores_zero(tmp_path):
    bench = _benchmark(tmp_path)
    assert bench.eval_result(bench.eval_begin()) == 0.0


def test_missing_annotations_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="nothing.json"):
        coco_metric.load_groundtruth(str(tmp_path / "nothing.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(DataError, match="bad.json"):
        coco_metric.load_groundtruth(str(tmp_path / "bad.json"))
