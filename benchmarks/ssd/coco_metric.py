"""Provides COCO box mAP for SSD detections: the COCO json of detections and pycocotools' COCOeval.

This is the reference's `coco_eval` on the host: detections in normalized corners are scaled to
each image's original size, written as COCO result rows `[image_id, x, y, w, h, score,
category_id]`, and scored with `COCOeval(iouType="bbox")`; the metric is `stats[0]`, AP at
IoU 0.50:0.95 over all areas with 100 detections per image.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from collections.abc import Sequence

import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from mlperf_tf.errors import DataError


def load_groundtruth(path: str) -> COCO:
    """Loads a COCO instances json as the eval ground truth.

    Raises:
      DataError: the file is missing or is not a COCO instances json.
    """
    if not os.path.isfile(path):
        raise DataError(f"COCO annotations file '{path}' does not exist")
    try:
        with open(path, encoding="utf-8") as f:
            dataset = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"COCO annotations file '{path}' is not valid json: {e}") from None
    return groundtruth_from_dict(dataset, what=f"COCO annotations file '{path}'")


def groundtruth_from_dict(dataset: dict, *, what: str = "COCO ground truth") -> COCO:
    """A pycocotools `COCO` object from an in-memory instances dict (quietly).

    Raises:
      DataError: `images`, `annotations` or `categories` is missing.
    """
    missing = [k for k in ("images", "annotations", "categories") if k not in dataset]
    if missing:
        raise DataError(f"{what} lacks {', '.join(missing)}")
    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


def detection_rows(
    *,
    image_ids: np.ndarray,
    heights: np.ndarray,
    widths: np.ndarray,
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    category_ids: Sequence[int],
) -> np.ndarray:
    """COCO result rows for a batch of images' detections.

    Args:
      image_ids, heights, widths: `[B]` COCO image ids and original sizes in pixels.
      boxes: `[B, D, 4]` normalized corners `[ymin, xmin, ymax, xmax]`.
      scores: `[B, D]`; entries with score <= 0 are padding and dropped.
      classes: `[B, D]` contiguous classes 1..N.
      category_ids: COCO category id of each contiguous class (class k -> `category_ids[k-1]`).

    Returns:
      `[n, 7]` float64 rows `[image_id, x, y, w, h, score, category_id]` (pixels).
    """
    boxes = np.asarray(boxes, np.float64)
    scores = np.asarray(scores, np.float64)
    classes = np.asarray(classes, np.int64)
    keep = (scores > 0) & (classes > 0)
    image_index, det_index = np.nonzero(keep)
    b = boxes[image_index, det_index]  # [n, 4]
    h = np.asarray(heights, np.float64)[image_index]
    w = np.asarray(widths, np.float64)[image_index]
    lookup = np.asarray((0,) + tuple(category_ids), np.int64)
    return np.stack(
        [
            np.asarray(image_ids, np.float64)[image_index],
            b[:, 1] * w,
            b[:, 0] * h,
            (b[:, 3] - b[:, 1]) * w,
            (b[:, 2] - b[:, 0]) * h,
            scores[image_index, det_index],
            lookup[classes[image_index, det_index]].astype(np.float64),
        ],
        axis=1,
    ).reshape(-1, 7)


def to_coco_json(rows: np.ndarray) -> list[dict]:
    """COCO detection results (the json list pycocotools and the COCO server read) from rows.

    Each row `[image_id, x, y, w, h, score, category_id]` becomes
    `{"image_id", "category_id", "bbox": [x, y, w, h], "score"}` with plain Python numbers.
    """
    return [
        {
            "image_id": int(row[0]),
            "category_id": int(row[6]),
            "bbox": [float(v) for v in row[1:5]],
            "score": float(row[5]),
        }
        for row in np.asarray(rows, np.float64).reshape(-1, 7)
    ]


def box_map(groundtruth: COCO, rows: np.ndarray, image_ids: Sequence[int]) -> float:
    """COCO box mAP@[.5:.95] (`COCOeval.stats[0]`) of `rows` on the images `image_ids`.

    Args:
      groundtruth: the ground truth.
      rows: `[n, 7]` detection rows (`detection_rows`), scored as their COCO json.
      image_ids: the images evaluated (only these count, with or without detections).

    Returns:
      The mAP in [0, 1]; 0.0 when there are no detections at all.
    """
    image_ids = sorted({int(i) for i in image_ids})
    if len(rows) == 0 or not image_ids:
        return 0.0
    with contextlib.redirect_stdout(io.StringIO()):
        detections = groundtruth.loadRes(to_coco_json(rows))
        evaluator = COCOeval(groundtruth, detections, iouType="bbox")
        evaluator.params.imgIds = image_ids
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return max(0.0, float(evaluator.stats[0]))  # stats are -1 when no ground truth exists
