"""Tests of the SSD default boxes, box coding and matching against the MLPerf reference's rules."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors

pytestmark = pytest.mark.numerics


def _reference_boxes_xywh():
    """The reference's `DefaultBoxes` for dboxes300_coco, written out independently.

    Order as in the reference: per level, per size, per position; rows (cx, cy, w, h), clipped.
    """
    fig, feats = 300, [38, 19, 10, 5, 3, 1]
    steps, scales = [8, 16, 32, 64, 100, 300], [21, 45, 99, 153, 207, 261, 315]
    ratios = [[2], [2, 3], [2, 3], [2, 3], [2], [2]]
    rows = []
    for k, f in enumerate(feats):
        sk1, sk2 = scales[k] / fig, scales[k + 1] / fig
        sizes = [(sk1, sk1), (math.sqrt(sk1 * sk2), math.sqrt(sk1 * sk2))]
        for a in ratios[k]:
            sizes += [
                (sk1 * math.sqrt(a), sk1 / math.sqrt(a)),
                (sk1 / math.sqrt(a), sk1 * math.sqrt(a)),
            ]
        fk = fig / steps[k]
        for w, h in sizes:
            for i, j in itertools.product(range(f), repeat=2):
                rows.append(((j + 0.5) / fk, (i + 0.5) / fk, w, h))
    return np.clip(np.array(rows), 0, 1)


def test_ssd300_has_8732_default_boxes():
    boxes = anchors.ssd300_boxes()
    assert boxes.num_anchors == anchors.SSD300_NUM_ANCHORS == 8732
    assert boxes.center.shape == (8732, 4) and boxes.corners.shape == (8732, 4)
    per_level = [
        f * f * anchors.boxes_per_location(r)
        for f, r in zip(anchors.SSD300_FEATURE_SIZES, anchors.SSD300_ASPECT_RATIOS)
    ]
    assert per_level == [5776, 2166, 600, 150, 36, 4]


def test_ssd300_boxes_are_the_reference_set():
    ours = anchors.ssd300_boxes().center  # [cy, cx, h, w]
    ref = _reference_boxes_xywh()[:, [1, 0, 3, 2]]
    sort = lambda a: a[np.lexsort(np.round(a, 6).T[::-1])]  # noqa: E731
    np.testing.assert_allclose(sort(ours), sort(ref.astype(np.float32)), atol=1e-6)


def test_anchor_order_is_position_major_per_level():
    boxes = anchors.ssd300_boxes().center
    # Level 0 position (0, 1): boxes 4..7 share its center; the 4 sizes follow the reference.
    np.testing.assert_allclose(boxes[4:8, :2], [[4 / 300, 12 / 300]] * 4, atol=1e-6)
    s1, s2 = 21 / 300, 45 / 300
    np.testing.assert_allclose(boxes[4, 2:], [s1, s1], atol=1e-6)
    np.testing.assert_allclose(boxes[5, 2:], [math.sqrt(s1 * s2)] * 2, atol=1e-6)
    np.testing.assert_allclose(boxes[6, 2:], [s1 / math.sqrt(2), s1 * math.sqrt(2)], atol=1e-6)


def test_default_boxes_validates_lengths():
    with pytest.raises(ValueError, match="scales"):
        anchors.default_boxes(
            image_size=300, feature_sizes=[2], steps=[8], scales=[1], aspect_ratios=[[2]]
        )


def test_encode_decode_is_identity():
    boxes = anchors.ssd300_boxes()
    rng = np.random.default_rng(0)
    yx = rng.uniform(0.1, 0.6, (3, boxes.num_anchors, 2))
    hw = rng.uniform(0.01, 0.4, (3, boxes.num_anchors, 2))
    corners = tf.constant(np.concatenate([yx, yx + hw], -1), tf.float32)
    codes = anchors.encode(corners, tf.constant(boxes.center))
    np.testing.assert_allclose(anchors.decode(codes, tf.constant(boxes.center)), corners, atol=2e-6)


def test_encode_uses_variances_0p1_0p2():
    anchor = tf.constant([[0.5, 0.5, 0.2, 0.4]])  # cy, cx, h, w
    box = tf.constant([[0.42, 0.34, 0.62, 0.74]])  # center (0.52, 0.54), h 0.2, w 0.4
    code = anchors.encode(box, anchor).numpy()[0]
    np.testing.assert_allclose(code, [0.02 / 0.2 / 0.1, 0.04 / 0.4 / 0.1, 0.0, 0.0], atol=1e-5)
    box = tf.constant([[0.4, 0.3, 0.6 + 0.2, 0.7]])  # h doubled: th = log(2) / 0.2
    assert anchors.encode(box, anchor).numpy()[0, 2] == pytest.approx(math.log(2) / 0.2, rel=1e-5)


def test_pairwise_iou_hand_values():
    a = tf.constant([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.5, 0.5]])
    b = tf.constant([[0.0, 0.0, 0.5, 1.0], [2.0, 2.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(anchors.pairwise_iou(a, b), [[0.5, 0, 0], [0.5, 0, 0]], atol=1e-6)


def _toy_anchors():
    # Four anchors on a row, 0.25 wide.
    return tf.constant([[0.0, 0.25 * i, 0.25, 0.25 * (i + 1)] for i in range(4)], tf.float32)


def test_match_threshold_forced_best_and_padding():
    a = _toy_anchors()
    gt = tf.constant(
        [
            [
                [0.0, 0.0, 0.25, 0.25],  # equals anchor 0: IoU 1
                [0.0, 0.5, 0.25, 0.6],  # IoU 0.4 with anchor 2 only: forced match
                [0.0, 0.75, 0.25, 1.0],  # padding (class 0) on anchor 3: ignored
            ]
        ]
    )
    classes = tf.constant([[3, 5, 0]])
    matched, labels = anchors.match(gt, classes, a, iou_threshold=0.5)
    np.testing.assert_array_equal(labels.numpy(), [[3, 0, 5, 0]])
    np.testing.assert_allclose(matched[0, 2], gt[0, 1])


def test_match_threshold_is_strict():
    a = _toy_anchors()
    # Two boxes so that anchor 1's IoU with box 0 is exactly 0.5 (box 0 spans anchors 0-1):
    gt = tf.constant([[[0.0, 0.0, 0.25, 0.5], [0.0, 0.75, 0.25, 1.0]]])
    _, labels = anchors.match(gt, tf.constant([[1, 2]]), a, iou_threshold=0.5)
    # Box 0's best anchor is anchor 0 (first of the tie), forced; anchor 1 has IoU 0.5: not >.
    np.testing.assert_array_equal(labels.numpy(), [[1, 0, 0, 2]])
    _, labels = anchors.match(gt, tf.constant([[1, 2]]), a, iou_threshold=0.49)
    np.testing.assert_array_equal(labels.numpy(), [[1, 1, 0, 2]])


def test_match_later_box_wins_a_shared_best_anchor():
    a = _toy_anchors()
    gt = tf.constant([[[0.0, 0.0, 0.25, 0.2], [0.0, 0.0, 0.25, 0.15]]])  # both best at anchor 0
    _, labels = anchors.match(gt, tf.constant([[1, 2]]), a)
    assert labels.numpy()[0, 0] == 2


def test_match_compiles_with_xla():
    a = _toy_anchors()
    gt = tf.constant([[[0.0, 0.0, 0.25, 0.25], [0.0, 0.5, 0.25, 0.6]], [[0.0] * 4, [0.0] * 4]])
    classes = tf.constant([[3, 5], [0, 0]])
    eager = anchors.match(gt, classes, a)
    compiled = tf.function(lambda g, c: anchors.match(g, c, a), jit_compile=True)(gt, classes)
    for x, y in zip(eager, compiled):
        np.testing.assert_allclose(x, y)
    np.testing.assert_array_equal(compiled[1].numpy()[1], [0, 0, 0, 0])
