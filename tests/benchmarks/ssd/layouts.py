"""Provides the tiny default-box layout the SSD loss and post-processing tests share."""

from benchmarks.ssd import anchors


def two_level_layout():
    """4x4 and 2x2 maps on a 64 px image (4*4*4 + 2*2*4 = 80 default boxes)."""
    return anchors.default_boxes(
        image_size=64,
        feature_sizes=[4, 2],
        steps=[16, 32],
        scales=[16, 32, 48],
        aspect_ratios=[[2], [2]],
    )
