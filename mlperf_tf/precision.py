"""Provides the dtype policy of a run: fp32, bf16 (mixed) or fp16 (mixed, dynamic loss scaling)."""

from __future__ import annotations

import keras

from mlperf_tf.errors import UserError

DTYPES = ("fp32", "bf16", "fp16")
_POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}


def set_policy(dtype: str) -> str:
    """Sets Keras' global dtype policy for `dtype` and returns the policy name.

    Models built afterwards compute in bf16/fp16 and keep fp32 variables. bf16 is emulated on
    AVX2-only CPUs (no faster than fp32): it is meant for TPUs and recent GPUs.

    Raises:
      UserError: `dtype` is not one of fp32, bf16, fp16.
    """
    if dtype not in _POLICIES:
        raise UserError(f"--dtype={dtype!r} is not one of {', '.join(DTYPES)}")
    policy = _POLICIES[dtype]
    keras.mixed_precision.set_global_policy(policy)
    return policy


def wrap_optimizer(optimizer, dtype: str):
    """Wraps the optimizer in dynamic loss scaling for fp16; returns it unchanged otherwise."""
    if dtype == "fp16" and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
