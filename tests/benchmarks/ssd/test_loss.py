"""Tests of the SSD loss: perfect predictions, hard-negative mining, the reference formula, XLA."""

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors, loss
from tests.benchmarks.ssd.layouts import two_level_layout
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics


def _ground_truth():
    boxes = tf.constant(
        [
            [[0.1, 0.1, 0.35, 0.3], [0.5, 0.4, 0.9, 0.8], [0, 0, 0, 0]],
            [[0.2, 0.55, 0.45, 0.95], [0, 0, 0, 0], [0, 0, 0, 0]],
        ],
        tf.float32,
    )
    classes = tf.constant([[1, 2, 0], [3, 0, 0]], tf.int32)
    return boxes, classes


def _perfect_outputs(boxes, gt_boxes, gt_classes, num_classes=4, margin=30.0):
    matched, labels = anchors.match(gt_boxes, gt_classes, tf.constant(boxes.corners))
    positive = labels > 0
    matched = tf.where(positive[..., None], matched, tf.constant(boxes.corners)[None])
    codes = anchors.encode(matched, tf.constant(boxes.center))
    logits = tf.one_hot(labels, num_classes) * margin
    return codes, logits, labels


def test_perfect_prediction_has_near_zero_loss():
    boxes = two_level_layout()
    gt_boxes, gt_classes = _ground_truth()
    codes, logits, _ = _perfect_outputs(boxes, gt_boxes, gt_classes)
    terms = loss.ssd_loss(codes, logits, gt_boxes, gt_classes, boxes)
    assert_close(terms.total.numpy(), [0.0, 0.0], rtol=1e-6)
    # A wrong class on the positives costs about `margin` per positive.
    wrong = tf.roll(logits, shift=1, axis=-1)
    assert float(tf.reduce_min(loss.ssd_loss(codes, wrong, gt_boxes, gt_classes, boxes).total)) > 10


def test_hard_negative_mining_keeps_three_negatives_per_positive():
    boxes = two_level_layout()
    gt_boxes, gt_classes = _ground_truth()
    rng = np.random.default_rng(1)
    codes = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)), tf.float32)
    logits = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)), tf.float32)
    terms = loss.ssd_loss(codes, logits, gt_boxes, gt_classes, boxes)
    positives = terms.num_positives.numpy()
    assert (positives > 0).all()
    np.testing.assert_array_equal(terms.num_negatives.numpy(), 3 * positives)


def test_mining_takes_the_highest_losses_and_caps_at_anchor_count():
    neg = tf.constant([[0.1, 0.9, 0.0, 0.5, 0.7, 0.2]])
    mask = loss.mine_negatives(neg, tf.constant([1.0]), negative_ratio=3.0).numpy()
    np.testing.assert_array_equal(mask, [[False, True, False, True, True, False]])
    mask = loss.mine_negatives(neg, tf.constant([5.0]), negative_ratio=3.0).numpy()
    assert mask.all()


def test_image_without_boxes_has_zero_loss():
    boxes = two_level_layout()
    gt_boxes = tf.zeros([1, 3, 4])
    gt_classes = tf.zeros([1, 3], tf.int32)
    logits = tf.random.normal([1, boxes.num_anchors, 4])
    terms = loss.ssd_loss(tf.zeros([1, boxes.num_anchors, 4]), logits, gt_boxes, gt_classes, boxes)
    assert float(terms.total[0]) == 0.0 and float(terms.num_positives[0]) == 0.0


def _reference_loss(codes, logits, gt_boxes, gt_classes, boxes):
    """The reference's Encoder.encode + Loss.forward, in numpy, one image at a time."""
    a_corners, a_center = boxes.corners.astype(np.float64), boxes.center.astype(np.float64)
    totals = []
    for b in range(codes.shape[0]):
        valid = gt_classes[b] > 0
        gtb, gtc = gt_boxes[b][valid].astype(np.float64), gt_classes[b][valid]
        tl = np.maximum(gtb[:, None, :2], a_corners[None, :, :2])
        br = np.minimum(gtb[:, None, 2:], a_corners[None, :, 2:])
        inter = np.prod(np.clip(br - tl, 0, None), -1)
        area = lambda x: (x[..., 2] - x[..., 0]) * (x[..., 3] - x[..., 1])  # noqa: E731
        ious = inter / (area(gtb)[:, None] + area(a_corners)[None] - inter)
        best_dbox_ious, best_dbox_idx = ious.max(0), ious.argmax(0)
        best_bbox_idx = ious.argmax(1)
        best_dbox_ious[best_bbox_idx] = 2.0
        for g in range(len(gtb)):
            best_dbox_idx[best_bbox_idx[g]] = g
        mask = best_dbox_ious > 0.5
        labels = np.zeros(len(a_corners), np.int64)
        labels[mask] = gtc[best_dbox_idx[mask]]
        out = a_corners.copy()
        out[mask] = gtb[best_dbox_idx[mask]]
        cyx, hw = (out[:, :2] + out[:, 2:]) / 2, out[:, 2:] - out[:, :2]
        target = np.concatenate(
            [(cyx - a_center[:, :2]) / a_center[:, 2:] / 0.1, np.log(hw / a_center[:, 2:]) / 0.2], 1
        )
        d = np.abs(codes[b] - target)
        sl1 = (np.where(d < 1, 0.5 * d * d, d - 0.5).sum(1) * mask).sum()
        z = logits[b] - logits[b].max(1, keepdims=True)
        con = -(z[np.arange(len(labels)), labels] - np.log(np.exp(z).sum(1)))
        con_neg = np.where(mask, 0.0, con)
        rank = np.argsort(np.argsort(-con_neg, kind="stable"), kind="stable")
        neg = rank < min(3 * mask.sum(), len(labels))
        closs = (con * (mask + neg)).sum()
        pos = mask.sum()
        totals.append((sl1 + closs) / pos if pos else 0.0)
    return np.array(totals)


def test_matches_the_reference_formula():
    boxes = two_level_layout()
    gt_boxes, gt_classes = _ground_truth()
    rng = np.random.default_rng(2)
    codes = rng.normal(size=(2, boxes.num_anchors, 4)).astype(np.float32)
    logits = rng.normal(size=(2, boxes.num_anchors, 4)).astype(np.float32)
    ours = loss.ssd_loss(codes, logits, gt_boxes, gt_classes, boxes).total.numpy()
    ref = _reference_loss(codes, logits, gt_boxes.numpy(), gt_classes.numpy(), boxes)
    assert_close(ours, ref, rtol=1e-4)


def test_a_float64_model_gets_a_float64_loss():
    """Float64 outputs keep float64 through the loss (the float64 exactness tests of spatial
    partitioning: a float32 rounding before hard-negative mining can swap near-tied negatives).
    A 1e-9 nudge of the box codes, far below float32's resolution, moves the float64 loss by its
    gradient times the nudge and leaves the float32 loss unchanged. (The matching targets stay
    float32: they depend on the data only.)"""
    boxes = two_level_layout()
    gt_boxes, gt_classes = _ground_truth()
    rng = np.random.default_rng(4)
    codes = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)))
    logits = tf.constant(rng.normal(size=(2, boxes.num_anchors, 4)))

    def total(c, dtype):
        c, z = tf.cast(c, dtype), tf.cast(logits, dtype)
        return tf.reduce_sum(loss.ssd_loss(c, z, gt_boxes, gt_classes, boxes).total)

    with tf.GradientTape() as tape:
        tape.watch(codes)
        before = total(codes, tf.float64)
    expected = tf.reduce_sum(tape.gradient(before, codes) * 1e-9).numpy()
    moved = (total(codes + 1e-9, tf.float64) - before).numpy()
    assert before.dtype == tf.float64 and expected != 0.0
    assert abs(moved - expected) <= 1e-3 * abs(expected)
    assert (total(codes + 1e-9, tf.float32) - total(codes, tf.float32)).numpy() == 0.0


def test_loss_and_gradient_compile_with_xla():
    boxes = two_level_layout()
    gt_boxes, gt_classes = _ground_truth()
    rng = np.random.default_rng(3)
    codes = tf.Variable(rng.normal(size=(2, boxes.num_anchors, 4)).astype(np.float32))
    logits = tf.Variable(rng.normal(size=(2, boxes.num_anchors, 4)).astype(np.float32))

    def value_and_grad():
        with tf.GradientTape() as tape:
            total = tf.reduce_sum(loss.ssd_loss(codes, logits, gt_boxes, gt_classes, boxes).total)
        return total, tape.gradient(total, [codes, logits])

    eager = value_and_grad()
    compiled = tf.function(value_and_grad, jit_compile=True)()
    assert_close(compiled[0], eager[0], rtol=1e-5)
    for x, y in zip(compiled[1], eager[1]):
        assert_close(x, y, rtol=1e-4)
