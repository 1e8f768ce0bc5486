"""Provides batched SSD detection decoding with per-class greedy NMS (static shapes, XLA-ready).

The MLPerf reference's `Encoder.decode_batch` per image: softmax over classes, decode the box
codes, then for every non-background class keep the boxes with probability > 0.05, take the
200 highest, run greedy NMS (drop boxes with IoU >= 0.5 to a kept one), and finally keep the
200 highest-scoring detections over all classes. Here all images and classes run at once on
padded `[images * classes, candidates]` tensors, and NMS is a fixed-length loop over candidate
rank, so the whole function compiles under XLA.
"""

from __future__ import annotations

import tensorflow as tf

from benchmarks.ssd import anchors as anchors_lib


def greedy_nms(boxes: tf.Tensor, valid: tf.Tensor, *, iou_threshold: float) -> tf.Tensor:
    """Greedy NMS on candidates already sorted by descending score.

    Args:
      boxes: `[M, K, 4]` corners; row m holds one (image, class) candidate list.
      valid: `[M, K]` bool: candidates that pass the score threshold.
      iou_threshold: a candidate is dropped if its IoU with a kept, higher-ranked one is >= this.

    Returns:
      `[M, K]` bool: the kept candidates.
    """
    num_candidates = boxes.shape[1]
    later = tf.range(num_candidates)  # [K]

    def body(i, suppressed):
        keep_i = tf.logical_and(valid[:, i], tf.logical_not(suppressed[:, i]))  # [M]
        # IoU of candidate i with all candidates of its row: [M, 1, 4] x [M, K, 4] -> [M, K].
        iou = anchors_lib.pairwise_iou(boxes[:, i : i + 1, :], boxes)[:, 0, :]
        hit = tf.logical_and(iou >= iou_threshold, (later > i)[None, :])
        suppressed = tf.logical_or(suppressed, tf.logical_and(keep_i[:, None], hit))
        return i + 1, suppressed

    _, suppressed = tf.while_loop(
        lambda i, _: i < num_candidates,
        body,
        (tf.constant(0), tf.zeros_like(valid)),
        maximum_iterations=num_candidates,
    )
    return tf.logical_and(valid, tf.logical_not(suppressed))


def detect(
    box_codes: tf.Tensor,
    class_logits: tf.Tensor,
    boxes: anchors_lib.DefaultBoxes,
    *,
    nms_iou_threshold: float = 0.5,
    score_threshold: float = 0.05,
    max_candidates_per_class: int = 200,
    max_detections: int = 200,
) -> dict[str, tf.Tensor]:
    """Decodes SSD outputs into at most `max_detections` detections per image.

    Args:
      box_codes: `[B, A, 4]` predicted codes.
      class_logits: `[B, A, C]` logits, class 0 = background.
      boxes: the default boxes in the model's anchor order.
      nms_iou_threshold, score_threshold, max_candidates_per_class, max_detections: the
        reference's 0.5, 0.05, 200 and 200.

    Returns:
      A dict of `boxes` `[B, D, 4]` normalized corners `[ymin, xmin, ymax, xmax]` (not
      clipped, as in the reference), `scores` `[B, D]` (0 for padding), `classes` `[B, D]`
      int32 contiguous classes 1..C-1 (0 for padding) and `num_detections` `[B]` int32;
      detections are sorted by descending score.
    """
    box_codes = tf.cast(box_codes, tf.float32)
    class_logits = tf.cast(class_logits, tf.float32)
    batch, num_anchors, num_classes = class_logits.shape
    if batch is None:
        batch = tf.shape(class_logits)[0]
    foreground = num_classes - 1
    k = min(max_candidates_per_class, num_anchors)
    decoded = anchors_lib.decode(box_codes, tf.constant(boxes.center))  # [B, A, 4]
    probs = tf.nn.softmax(class_logits, axis=-1)[:, :, 1:]  # [B, A, C-1]
    probs = tf.transpose(probs, [0, 2, 1])  # [B, C-1, A]
    scores, indices = tf.math.top_k(probs, k=k, sorted=True)  # [B, C-1, k]
    candidates = tf.gather(decoded, indices, batch_dims=1)  # [B, C-1, k, 4]
    valid = scores > score_threshold
    keep = greedy_nms(
        tf.reshape(candidates, [-1, k, 4]),
        tf.reshape(valid, [-1, k]),
        iou_threshold=nms_iou_threshold,
    )
    kept_scores = tf.where(
        tf.reshape(keep, [batch, foreground * k]), tf.reshape(scores, [batch, foreground * k]), 0.0
    )
    d = min(max_detections, foreground * k)
    top_scores, top = tf.math.top_k(kept_scores, k=d, sorted=True)  # [B, D]
    found = top_scores > 0.0
    top_boxes = tf.gather(tf.reshape(candidates, [batch, foreground * k, 4]), top, batch_dims=1)
    classes = tf.where(found, top // k + 1, 0)
    if d < max_detections:  # fewer candidates than requested: pad to a fixed D
        pad = max_detections - d
        top_scores = tf.pad(top_scores, [[0, 0], [0, pad]])
        top_boxes = tf.pad(top_boxes, [[0, 0], [0, pad], [0, 0]])
        classes = tf.pad(classes, [[0, 0], [0, pad]])
        found = tf.pad(found, [[0, 0], [0, pad]])
    return {
        "boxes": tf.where(found[..., None], top_boxes, 0.0),
        "scores": top_scores,
        "classes": tf.cast(classes, tf.int32),
        "num_detections": tf.reduce_sum(tf.cast(found, tf.int32), axis=1),
    }
