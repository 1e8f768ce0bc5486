"""Reproduces a oneDNN fault: the kernel gradient of a strided 1x1 convolution with few input channels.

Under `ONEDNN_MAX_CPU_ISA=AVX2` on TF 2.20 (seen on an AVX-512 AMD EPYC), TF's
`Conv2DBackpropFilter` of a 1x1 convolution at a stride > 1 with few input channels (seen: 1 to 4
channels at strides 2 to 4, depending on the shape) differs from NumPy's `einsum` by a relative
error of ~0.5 to 1, and differently between identical calls; stride 1, 8 or more input channels,
the uncapped ISA and `TF_ENABLE_ONEDNN_OPTS=0` were right.
It is TF's fault, not the spatial layers': it was the whole-image Keras reference of the 1x1/2
case in `tests/mlperf_tf/layers/test_spatial.py` that was wrong under the cap (that case's kernel
gradient is now checked against NumPy); the layers' slabs happened to have shapes it computes
right. The suite's models are not affected as far as seen (their strided 1x1 convolutions have
32 or more input channels). Prints, per (input channels, stride), the worst relative error of three
identical calls.

Usage: ONEDNN_MAX_CPU_ISA=AVX2 python tools/studies/onednn_strided_1x1.py
"""

from __future__ import annotations

import argparse

import numpy as np
import tensorflow as tf


def worst_error(*, channels: int, stride: int, filters: int = 4, calls: int = 3) -> float:
    """Largest relative error of `calls` identical kernel gradients of a 1x1/`stride`
    convolution of a [2, 16, 8, channels] input against NumPy's."""
    rng = np.random.RandomState(0)
    x = rng.normal(0.5, 1.0, (2, 16, 8, channels)).astype(np.float32)
    rows, cols = -(-16 // stride), -(-8 // stride)
    dy = rng.normal(0.0, 1.0, (2, rows, cols, filters)).astype(np.float32)
    expected = np.einsum("bhwc,bhwo->co", x[:, ::stride, ::stride], dy)[None, None]
    worst = 0.0
    for _ in range(calls):
        got = tf.raw_ops.Conv2DBackpropFilter(
            input=x, filter_sizes=[1, 1, channels, filters], out_backprop=dy,
            strides=[1, stride, stride, 1], padding="VALID",
        ).numpy()  # fmt: skip
        worst = max(worst, float(np.abs(got - expected).max() / np.abs(expected).max()))
    return worst


def main(argv=None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    for channels in (1, 3, 4, 7, 8, 16, 64):
        errors = "  ".join(
            f"stride {s}: {worst_error(channels=channels, stride=s):.1e}" for s in (1, 2, 3, 4)
        )
        print(f"input channels {channels:3d}  {errors}")


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
