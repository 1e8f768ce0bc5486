"""Provides SSD default boxes (MLPerf's SSD300 layout), IoU, box coding and anchor matching.

Boxes are normalized to the image ([0, 1] on both axes) and stored as corners
`[ymin, xmin, ymax, xmax]` unless a name says `center` (`[cy, cx, h, w]`). Box regression
targets are MLPerf's (the reference's `Encoder` with `scale_xy=0.1, scale_wh=0.2`):

    ty = (gy - ay) / ah / 0.1    tx = (gx - ax) / aw / 0.1
    th = log(gh / ah) / 0.2      tw = log(gw / aw) / 0.2

Anchor order: level by level; inside a level, row-major positions, and at each position the
box sizes in the reference's order (scale s_k, scale sqrt(s_k s_k+1), then for each aspect
ratio a: w/h = a and w/h = 1/a). This is the reference's set of default boxes in the natural
order of an NHWC head (`[B, H, W, boxes * 4]` reshaped to `[B, H * W * boxes, 4]`); the
reference orders size-major because its heads are NCHW.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

# MLPerf SSD300 (the reference's `dboxes300_coco`).
SSD300_IMAGE_SIZE = 300
SSD300_FEATURE_SIZES = (38, 19, 10, 5, 3, 1)
SSD300_STEPS = (8, 16, 32, 64, 100, 300)
SSD300_SCALES = (21, 45, 99, 153, 207, 261, 315)
SSD300_ASPECT_RATIOS = ((2,), (2, 3), (2, 3), (2, 3), (2,), (2,))
SSD300_NUM_ANCHORS = 8732

# Box-coding variances: the reference's `scale_xy` and `scale_wh`.
SCALE_XY = 0.1
SCALE_WH = 0.2


def boxes_per_location(aspect_ratios: Sequence[int]) -> int:
    """Default boxes at one feature-map position: 2 squares plus 2 per aspect ratio."""
    return 2 + 2 * len(aspect_ratios)


@dataclasses.dataclass(frozen=True)
class DefaultBoxes:
    """The default boxes of one SSD layout, in both encodings.

    Attributes:
      center: `[A, 4]` float32 `[cy, cx, h, w]`, each clipped to [0, 1] as the reference does.
      corners: `[A, 4]` float32 `[ymin, xmin, ymax, xmax]` from `center` (may leave [0, 1]).
    """

    center: np.ndarray
    corners: np.ndarray

    @property
    def num_anchors(self) -> int:
        return int(self.center.shape[0])


def default_boxes(
    *,
    image_size: int,
    feature_sizes: Sequence[int],
    steps: Sequence[float],
    scales: Sequence[float],
    aspect_ratios: Sequence[Sequence[int]],
) -> DefaultBoxes:
    """Builds the default boxes of an SSD layout (the reference's `DefaultBoxes`).

    Args:
      image_size: side of the square input, in pixels (300 for SSD300).
      feature_sizes: side of each level's square feature map (38, 19, 10, 5, 3, 1).
      steps: pixels between neighbouring box centers on each level (8, 16, 32, 64, 100, 300);
        centers are at `(j + 0.5) * step / image_size`.
      scales: box sizes in pixels, one more than levels; level k uses `scales[k]` and
        `sqrt(scales[k] * scales[k+1])` for its squares.
      aspect_ratios: per level, the ratios a whose boxes `w/h = a` and `w/h = 1/a` are added.

    Returns:
      The `DefaultBoxes` (8732 of them for the SSD300 arguments).

    Raises:
      ValueError: the lengths do not fit or a size is not positive.
    """
    levels = len(feature_sizes)
    if not levels:
        raise ValueError("`feature_sizes` must not be empty.")
    if len(steps) != levels or len(aspect_ratios) != levels:
        raise ValueError(
            f"`steps` ({len(steps)}) and `aspect_ratios` ({len(aspect_ratios)}) need one entry "
            f"per level ({levels})."
        )
    if len(scales) != levels + 1:
        raise ValueError(f"`scales` ({len(scales)} values) needs levels + 1 = {levels + 1}.")
    if image_size <= 0 or min(feature_sizes) <= 0 or min(steps) <= 0 or min(scales) <= 0:
        raise ValueError(
            f"sizes must be positive: image_size={image_size}, feature_sizes={feature_sizes}, "
            f"steps={steps}, scales={scales}."
        )
    boxes = []
    for level, size in enumerate(feature_sizes):
        s1 = scales[level] / image_size
        s2 = scales[level + 1] / image_size
        s12 = math.sqrt(s1 * s2)
        shapes = [(s1, s1), (s12, s12)]  # (h, w)
        for ratio in aspect_ratios[level]:
            root = math.sqrt(ratio)
            shapes.append((s1 / root, s1 * root))  # w / h = ratio
            shapes.append((s1 * root, s1 / root))  # w / h = 1 / ratio
        cells_per_image = image_size / steps[level]
        for i, j in itertools.product(range(size), repeat=2):
            cy, cx = (i + 0.5) / cells_per_image, (j + 0.5) / cells_per_image
            boxes.extend((cy, cx, h, w) for h, w in shapes)
    center = np.clip(np.asarray(boxes, dtype=np.float64), 0.0, 1.0)
    corners = np.concatenate(
        [center[:, :2] - center[:, 2:] / 2, center[:, :2] + center[:, 2:] / 2], 1
    )
    return DefaultBoxes(center=center.astype(np.float32), corners=corners.astype(np.float32))


def ssd300_boxes() -> DefaultBoxes:
    """MLPerf's 8732 SSD300 default boxes."""
    return default_boxes(
        image_size=SSD300_IMAGE_SIZE,
        feature_sizes=SSD300_FEATURE_SIZES,
        steps=SSD300_STEPS,
        scales=SSD300_SCALES,
        aspect_ratios=SSD300_ASPECT_RATIOS,
    )


def corners_to_center(boxes: tf.Tensor) -> tf.Tensor:
    """`[..., 4]` `[ymin, xmin, ymax, xmax]` -> `[cy, cx, h, w]`."""
    ymin, xmin, ymax, xmax = tf.unstack(boxes, axis=-1)
    return tf.stack([(ymin + ymax) / 2, (xmin + xmax) / 2, ymax - ymin, xmax - xmin], axis=-1)


def center_to_corners(boxes: tf.Tensor) -> tf.Tensor:
    """`[..., 4]` `[cy, cx, h, w]` -> `[ymin, xmin, ymax, xmax]`."""
    cy, cx, h, w = tf.unstack(boxes, axis=-1)
    return tf.stack([cy - h / 2, cx - w / 2, cy + h / 2, cx + w / 2], axis=-1)


def pairwise_iou(boxes1: tf.Tensor, boxes2: tf.Tensor) -> tf.Tensor:
    """IoU of every pair of corner boxes.

    Args:
      boxes1: `[..., N, 4]` corners.
      boxes2: `[..., M, 4]` corners (same leading dims as `boxes1`, or none: `[M, 4]`).

    Returns:
      `[..., N, M]` IoU; 0 where the union is empty.
    """
    b1 = boxes1[..., :, None, :]  # [..., N, 1, 4]
    b2 = boxes2[..., None, :, :]  # [..., 1, M, 4]
    top_left = tf.maximum(b1[..., :2], b2[..., :2])
    bottom_right = tf.minimum(b1[..., 2:], b2[..., 2:])
    hw = tf.maximum(bottom_right - top_left, 0.0)
    intersection = hw[..., 0] * hw[..., 1]
    area1 = (b1[..., 2] - b1[..., 0]) * (b1[..., 3] - b1[..., 1])
    area2 = (b2[..., 2] - b2[..., 0]) * (b2[..., 3] - b2[..., 1])
    union = area1 + area2 - intersection
    return tf.math.divide_no_nan(intersection, union)


def encode(boxes: tf.Tensor, anchors_center: tf.Tensor) -> tf.Tensor:
    """Regression targets of corner `boxes` `[..., A, 4]` against `anchors_center` `[A, 4]`.

    Returns `[..., A, 4]` `[ty, tx, th, tw]` with the variances (0.1, 0.2) divided out.
    """
    center = corners_to_center(boxes)
    yx = (center[..., :2] - anchors_center[:, :2]) / anchors_center[:, 2:] / SCALE_XY
    hw = tf.math.log(center[..., 2:] / anchors_center[:, 2:]) / SCALE_WH
    return tf.concat([yx, hw], axis=-1)


def decode(codes: tf.Tensor, anchors_center: tf.Tensor) -> tf.Tensor:
    """Corner boxes `[..., A, 4]` from regression codes `[..., A, 4]`; inverse of `encode`."""
    yx = codes[..., :2] * SCALE_XY * anchors_center[:, 2:] + anchors_center[:, :2]
    hw = tf.exp(codes[..., 2:] * SCALE_WH) * anchors_center[:, 2:]
    return center_to_corners(tf.concat([yx, hw], axis=-1))


def match(
    gt_boxes: tf.Tensor,
    gt_classes: tf.Tensor,
    anchors_corners: tf.Tensor,
    *,
    iou_threshold: float = 0.5,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Assigns ground truth to anchors as the MLPerf reference's `Encoder.encode` does.

    Each anchor takes the ground-truth box it overlaps most; each ground-truth box also takes
    its best anchor (ties: the later box wins, as in the reference's index assignment), which
    counts as IoU 2. Anchors whose IoU exceeds `iou_threshold` are positives. Static shapes,
    no data-dependent control flow: compiles under XLA.

    Args:
      gt_boxes: `[B, G, 4]` corners, padded.
      gt_classes: `[B, G]` int, 1.. for real boxes and 0 for padding.
      anchors_corners: `[A, 4]`.
      iou_threshold: anchors with IoU > this are positives (the reference: 0.5).

    Returns:
      (matched_boxes `[B, A, 4]` corners of each anchor's ground truth (meaningful only for
      positives), labels `[B, A]` int32: the class of positives, 0 for background).
    """
    gt_classes = tf.cast(gt_classes, tf.int32)
    valid = gt_classes > 0  # [B, G]
    num_gt = tf.shape(gt_boxes)[1]
    num_anchors = tf.shape(anchors_corners)[0]
    iou = pairwise_iou(gt_boxes, anchors_corners)  # [B, G, A]
    iou = tf.where(valid[:, :, None], iou, -1.0)
    best_gt_iou = tf.reduce_max(iou, axis=1)  # [B, A]
    best_gt = tf.argmax(iou, axis=1, output_type=tf.int32)  # [B, A]
    best_anchor = tf.argmax(iou, axis=2, output_type=tf.int32)  # [B, G]
    # forced[b, g, a]: anchor a is the best anchor of real box g.
    forced = tf.logical_and(
        tf.equal(best_anchor[:, :, None], tf.range(num_anchors)[None, None, :]), valid[:, :, None]
    )
    forced_any = tf.reduce_any(forced, axis=1)  # [B, A]
    # The last box g forcing an anchor wins: argmax of (g + 1) over the forcing boxes.
    box_ids = tf.range(1, num_gt + 1)[None, :, None]  # [1, G, 1]
    forced_gt = tf.argmax(tf.where(forced, box_ids, 0), axis=1, output_type=tf.int32)
    matched_gt = tf.where(forced_any, forced_gt, best_gt)  # [B, A]
    matched_iou = tf.where(forced_any, 2.0, best_gt_iou)
    positive = matched_iou > iou_threshold
    labels = tf.where(positive, tf.gather(gt_classes, matched_gt, batch_dims=1), 0)
    matched_boxes = tf.gather(gt_boxes, matched_gt, batch_dims=1)
    return matched_boxes, labels
