"""Provides the SSD loss: anchor matching, smooth-L1 box loss and mined cross-entropy.

This is the MLPerf reference's `Loss` (single_stage_detector/ssd/base_model.py) with its
`Encoder.encode` matching moved onto the accelerator: per image,

    loss = (sum over positives of smooth-L1(box codes)
            + sum over positives and mined negatives of cross-entropy) / positives

and 0 for an image without positives. Mined negatives are the `negative_ratio * positives`
background anchors with the highest cross-entropy. Static shapes throughout, so it compiles
under XLA (`jit_compile=True`).
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from benchmarks.ssd import anchors as anchors_lib


@dataclasses.dataclass(frozen=True)
class LossTerms:
    """Per-image parts of the SSD loss (all `[B]`, float32; float64 for a float64 model).

    Attributes:
      total: (box + class) / positives; 0 for images without positives.
      box: summed smooth-L1 over positives (not normalized).
      cls: summed cross-entropy over positives and mined negatives (not normalized).
      num_positives: positive anchors.
      num_negatives: mined negative anchors.
    """

    total: tf.Tensor
    box: tf.Tensor
    cls: tf.Tensor
    num_positives: tf.Tensor
    num_negatives: tf.Tensor


def smooth_l1(x: tf.Tensor) -> tf.Tensor:
    """Elementwise smooth-L1 with beta 1 (PyTorch's `SmoothL1Loss` default)."""
    ax = tf.abs(x)
    return tf.where(ax < 1.0, 0.5 * x * x, ax - 0.5)


def mine_negatives(
    neg_losses: tf.Tensor, num_positives: tf.Tensor, *, negative_ratio: float
) -> tf.Tensor:
    """The reference's hard-negative mask: the top `ratio * positives` losses of each row.

    Args:
      neg_losses: `[B, A]` losses with positives already set to 0.
      num_positives: `[B]` positives per image.
      negative_ratio: negatives kept per positive.

    Returns:
      `[B, A]` bool: anchor ranks (descending loss, stable) below `min(ratio * pos, A)`.
    """
    num_anchors = tf.shape(neg_losses)[1]
    order = tf.argsort(neg_losses, axis=1, direction="DESCENDING", stable=True)
    rank = tf.argsort(order, axis=1, stable=True)  # inverse permutation: rank of each anchor
    num_neg = tf.cast(negative_ratio * tf.cast(num_positives, tf.float32), tf.int32)
    num_neg = tf.minimum(num_neg, num_anchors)
    return rank < num_neg[:, None]


def ssd_loss(
    box_codes: tf.Tensor,
    class_logits: tf.Tensor,
    gt_boxes: tf.Tensor,
    gt_classes: tf.Tensor,
    boxes: anchors_lib.DefaultBoxes,
    *,
    iou_threshold: float = 0.5,
    negative_ratio: float = 3.0,
) -> LossTerms:
    """The per-image SSD loss (replica context; no cross-replica reduction).

    Args:
      box_codes: `[B, A, 4]` predicted codes (any float dtype; computed in float32, or in
        float64 when the model is float64: hard-negative mining ranks the anchors' losses, so a
        float32 rounding of a float64 model's logits can swap two near-tied negatives and jump
        the gradient, which the float64 exactness tests of spatial partitioning must not see).
      class_logits: `[B, A, C]` logits, class 0 = background.
      gt_boxes: `[B, G, 4]` padded ground-truth corners, normalized.
      gt_classes: `[B, G]` int classes 1..C-1, 0 for padding.
      boxes: the default boxes, in the model's anchor order.
      iou_threshold: matching threshold (0.5).
      negative_ratio: mined negatives per positive (3).

    Returns:
      `LossTerms` with `[B]` tensors.
    """
    dtype = tf.float64 if box_codes.dtype == tf.float64 else tf.float32
    box_codes = tf.cast(box_codes, dtype)
    class_logits = tf.cast(class_logits, dtype)
    gt_boxes = tf.cast(gt_boxes, tf.float32)  # matching depends on the data only: float32
    anchors_corners = tf.constant(boxes.corners)
    anchors_center = tf.constant(boxes.center)

    matched, labels = anchors_lib.match(
        gt_boxes, gt_classes, anchors_corners, iou_threshold=iou_threshold
    )  # [B, A, 4], [B, A]
    positive = labels > 0
    # Background anchors get their own box as target (code 0), as in the reference, which
    # also keeps log() finite where padding (all-zero boxes) was gathered.
    matched = tf.where(positive[..., None], matched, anchors_corners[None])
    targets = tf.cast(tf.stop_gradient(anchors_lib.encode(matched, anchors_center)), dtype)
    positive_f = tf.cast(positive, dtype)
    num_pos = tf.reduce_sum(positive_f, axis=1)  # [B]

    box = tf.reduce_sum(smooth_l1(box_codes - targets), axis=2)  # [B, A]
    box = tf.reduce_sum(box * positive_f, axis=1)  # [B]

    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=labels, logits=class_logits
    )  # [B, A]
    neg_losses = tf.stop_gradient(tf.where(positive, tf.zeros_like(cross_entropy), cross_entropy))
    negative = mine_negatives(neg_losses, num_pos, negative_ratio=negative_ratio)
    negative_f = tf.cast(negative, dtype)
    cls = tf.reduce_sum(cross_entropy * (positive_f + negative_f), axis=1)  # [B]

    has_pos = tf.cast(num_pos > 0, dtype)
    total = (box + cls) * has_pos / tf.maximum(num_pos, 1e-6)
    return LossTerms(
        total=total,
        box=box,
        cls=cls,
        num_positives=num_pos,
        num_negatives=tf.reduce_sum(negative_f, axis=1),
    )
