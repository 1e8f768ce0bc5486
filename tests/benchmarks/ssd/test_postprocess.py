"""Tests of batched SSD decoding and per-class greedy NMS."""

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors, postprocess
from tests.benchmarks.ssd.layouts import two_level_layout
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def test_greedy_nms_equals_tf_image_nms():
    rng = np.random.default_rng(0)
    for trial in range(5):
        yx = rng.uniform(0, 0.7, (30, 2))
        boxes = np.concatenate([yx, yx + rng.uniform(0.05, 0.3, (30, 2))], 1).astype(np.float32)
        scores = np.sort(rng.uniform(0, 1, 30))[::-1].astype(np.float32)
        valid = scores > 0.2
        keep = postprocess.greedy_nms(
            tf.constant(boxes[None]), tf.constant(valid[None]), iou_threshold=0.5
        ).numpy()[0]
        expected = tf.image.non_max_suppression(
            boxes, scores, 30, iou_threshold=0.5, score_threshold=0.2
        ).numpy()
        assert sorted(np.nonzero(keep)[0]) == sorted(expected), trial


def _outputs_for(boxes, targets, num_classes=4):
    """Codes/logits of a 'model' that predicts `targets`: {anchor: (box, class, logit)}."""
    a = boxes.num_anchors
    codes = np.zeros((1, a, 4), np.float32)
    logits = np.zeros((1, a, num_classes), np.float32)
    logits[0, :, 0] = 20.0  # background everywhere else
    for anchor, (box, cls, logit) in targets.items():
        codes[0, anchor] = anchors.encode(
            tf.constant([box], tf.float32), tf.constant(boxes.center[anchor : anchor + 1])
        ).numpy()[0]
        logits[0, anchor] = 0.0
        logits[0, anchor, cls] = logit
    return tf.constant(codes), tf.constant(logits)


def test_detect_decodes_classes_scores_and_suppresses_duplicates():
    boxes = two_level_layout()
    box = [0.1, 0.2, 0.5, 0.6]
    near = [0.12, 0.2, 0.5, 0.62]  # IoU ~0.9 with box: suppressed in its class
    other = [0.6, 0.6, 0.9, 0.9]
    codes, logits = _outputs_for(
        boxes, {3: (box, 2, 10.0), 7: (near, 2, 8.0), 11: (near, 1, 8.0), 20: (other, 3, 9.0)}
    )
    out = postprocess.detect(codes, logits, boxes, max_detections=10)
    n = int(out["num_detections"][0])
    assert n == 3
    np.testing.assert_array_equal(out["classes"][0, :n], [2, 3, 1])  # by descending score
    assert_close(out["boxes"][0, 0], box, rtol=1e-5)
    assert_close(out["boxes"][0, 1], other, rtol=1e-5)
    assert out["scores"][0, 0] > out["scores"][0, 1] > out["scores"][0, 2] > 0.05
    assert out["boxes"].shape == (1, 10, 4)
    np.testing.assert_array_equal(out["scores"][0, n:], 0.0)
    np.testing.assert_array_equal(out["classes"][0, n:], 0)


def test_detect_score_threshold_and_max_detections():
    boxes = two_level_layout()
    targets = {
        k: (
            [0.05 * (k % 10), 0.1 * (k // 10), 0.05 * (k % 10) + 0.04, 0.1 * (k // 10) + 0.08],
            1,
            6.0,
        )
        for k in range(0, 40, 2)
    }
    codes, logits = _outputs_for(boxes, targets)
    out = postprocess.detect(codes, logits, boxes, max_detections=5)
    assert int(out["num_detections"][0]) == 5
    low = postprocess.detect(codes, logits, boxes, score_threshold=0.999, max_detections=5)
    assert int(low["num_detections"][0]) == 0


def test_detect_compiles_with_xla():
    boxes = two_level_layout()
    rng = np.random.default_rng(1)
    codes = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)) * 0.5, tf.float32)
    logits = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)) * 3, tf.float32)
    fn = lambda c, z: postprocess.detect(c, z, boxes, max_detections=20)  # noqa: E731
    eager = fn(codes, logits)
    compiled = tf.function(fn, jit_compile=True)(codes, logits)
    for key in eager:
        assert_close(compiled[key], eager[key], rtol=1e-5)
    assert int(tf.reduce_sum(eager["num_detections"])) > 0
