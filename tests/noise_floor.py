"""Provides the noise floor of an unsplit run: the same run in a subprocess with oneDNN off
(`TF_ENABLE_ONEDNN_OPTS=0`: other kernels, other summation orders), and the gap between two
runs' weights relative to the largest weight. Exactness tests of parallelism judge a split
run's gap to the unsplit run against it (the developers' guide: routing and Adam amplify
rounding, so a fixed tolerance can be too tight for one model and too loose for another)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np

# Prepended to a script: `devices` logical CPUs, as the tests' conftest makes them.
_DEVICES = """
import sys, numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * {n})
"""


def onednn_off_weights(script: str, tmp_path, *, devices: int, timeout: int = 600) -> list:
    """Runs `script` (Python that binds `weights`, a list or dict of arrays) in a subprocess on
    `devices` logical CPUs with oneDNN off; returns `weights` as a list of arrays (a dict's in
    its order)."""
    out = tmp_path / "onednn_off.npz"
    code = (_DEVICES.format(n=devices) + script
            + "\nw = list(weights.values()) if isinstance(weights, dict) else list(weights)"
            + "\nnp.savez(sys.argv[1], *w)\n")  # fmt: skip
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "PYTHONPATH": os.getcwd()}
    done = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with np.load(out) as saved:
        return [saved[f"arr_{i}"] for i in range(len(saved.files))]


def scaled_gap(a, b) -> float:
    """max |a - b| over every weight (lists, or dicts in the same order), relative to the
    largest weight of `b`."""
    a = list(a.values()) if isinstance(a, dict) else list(a)
    b = list(b.values()) if isinstance(b, dict) else list(b)
    scale = max(float(np.max(np.abs(x))) for x in b)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True)) / scale


def assert_within_noise_floor(got, ref, off, *, what: str, factor: float = 10.0,
                              least: float = 1e-6) -> None:  # fmt: skip
    """The split run `got` may not end further from the unsplit `ref` than `factor` times the
    oneDNN-off run `off` does (and at least `least` of the largest weight)."""
    floor, gap = scaled_gap(off, ref), scaled_gap(got, ref)
    print(f"{what}: gap {gap:.3g}, oneDNN-off noise floor {floor:.3g} (of the largest weight)")
    assert gap <= max(factor * floor, least), (what, gap, floor)
