"""Provides `CrossReplicaBatchNormalization`: batch norm over groups of replicas, one collective."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from mlperf_tf.config import ConfigError


def _check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"`{name}` ({value!r}) must be a positive integer.")
    return value


def model_bn_span(per_replica_batch: int, group_size: int) -> int:
    """Returns MLPerf's `model_bn_span`: the examples one batch-norm layer normalizes over.

    Args:
      per_replica_batch: examples per replica per step.
      group_size: replicas whose batches each batch-norm group shares (1 = local BN).

    Returns:
      `per_replica_batch * group_size`, in examples.

    Raises:
      ConfigError: an argument is not a positive integer.
    """
    _check_positive_int("per_replica_batch", per_replica_batch)
    _check_positive_int("group_size", group_size)
    return per_replica_batch * group_size


def check_group_size(
    group_size: int, num_replicas: int, *, layer_name: str = "", error=ConfigError
) -> int:
    """Returns the number of groups, or raises if `group_size` does not divide `num_replicas`.

    Args:
      group_size: replicas per batch-norm group.
      num_replicas: replicas in sync.
      layer_name: named in the message when given.
      error: the exception type to raise. Code traced by tf.function passes `ValueError`:
        autograph re-raises only built-in exception types as themselves.

    Raises:
      ConfigError (or `error`): `group_size` is not a divisor of `num_replicas`.
    """
    if num_replicas % group_size:
        where = f" of layer '{layer_name}'" if layer_name else ""
        raise error(
            f"batch-norm `group_size` ({group_size}){where} must divide the number of replicas "
            f"in sync ({num_replicas})."
        )
    return num_replicas // group_size


def group_moments(
    x, *, axis, mask=None, shift=None, group_size, replica_id, num_replicas, all_reduce
):
    """Mean and biased variance of `x` over a group of replicas, with one `all_reduce` call.

    Runs in replica context. Replica `r` belongs to group `r // group_size`; each replica puts its
    (sum, sum of squares, count) per channel into its group's row of a zero `[groups, 3, C]`
    table, `all_reduce` sums the tables over all replicas, and each replica reads its own row.

    Args:
      x: this replica's inputs, in the statistics dtype (fp32 or fp64); any rank.
      axis: the channel axis of `x`; statistics reduce over every other axis.
      mask: optional mask of shape `x.shape[:-1]`, True/1 where an element counts (as in Keras).
      shift: optional `[C]` tensor equal on all members of a group; the sums are taken around it
        to limit cancellation in E[x^2] - E[x]^2 (e.g. the moving mean, without gradient).
      group_size: replicas per group; must divide `num_replicas`.
      replica_id: this replica's id in its sync group (int or int tensor).
      num_replicas: replicas in sync (Python int).
      all_reduce: callable summing a tensor over all replicas (e.g. a `ReplicaContext`'s
        `all_reduce` with `ReduceOp.SUM`); it must be differentiable for training.

    Returns:
      (mean, variance) over the group's concatenated batch, each `[C]`.

    Raises:
      ValueError: `group_size` does not divide `num_replicas`.
    """
    num_groups = check_group_size(group_size, num_replicas, error=ValueError)
    ndim = len(x.shape)
    axis = axis % ndim
    axes = [i for i in range(ndim) if i != axis]
    channels = x.shape[axis]
    if shift is None:
        shift = tf.zeros([channels], x.dtype)
        d = x
    else:
        shape = [1] * ndim
        shape[axis] = channels
        d = x - tf.reshape(shift, shape)
    if mask is None:
        s1 = tf.reduce_sum(d, axis=axes)  # [C]
        s2 = tf.reduce_sum(tf.square(d), axis=axes)  # [C]
        count = tf.cast(tf.size(x, out_type=tf.int64) // channels, x.dtype) * tf.ones_like(
            s1
        )  # [C]
    else:
        w = tf.cast(tf.expand_dims(mask, -1), x.dtype)  # the mask broadcast over channels
        w = tf.broadcast_to(w, tf.shape(x))
        wd = w * d
        s1 = tf.reduce_sum(wd, axis=axes)
        s2 = tf.reduce_sum(wd * d, axis=axes)
        count = tf.reduce_sum(w, axis=axes)
    stats = tf.stack([s1, s2, count])  # [3, C]

    if num_groups == 1:
        group_stats = all_reduce(stats)  # [3, C]
    else:
        group = tf.cast(replica_id, tf.int32) // group_size
        row = tf.one_hot(group, num_groups, dtype=x.dtype)[:, None, None]  # [G, 1, 1]
        table = all_reduce(row * stats)  # [G, 3, C]: row g holds group g's sums
        group_stats = tf.reduce_sum(row * table, axis=0)  # [3, C]: this replica's group

    s1, s2, count = tf.unstack(group_stats)
    mean_d = tf.math.divide_no_nan(s1, count)
    variance = tf.maximum(tf.math.divide_no_nan(s2, count) - tf.square(mean_d), 0.0)
    return shift + mean_d, variance


@keras.saving.register_keras_serializable(package="mlperf_tf")
class CrossReplicaBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` whose training statistics span a group of replicas.

    Replicas are split into groups of `group_size` consecutive replica ids (Ying et al., 2018,
    "Image Classification at Supercomputer Scale", distributed batch normalization); in training
    each group normalizes over the union of its members' batches. `group_size=1` is plain local BN
    (no collective), `group_size=num_replicas_in_sync` is fully synchronized BN.

    Method (one collective per layer per step): in replica context every replica writes its
    per-channel (sum, sum of squares, count) into its group's row of a zero `[groups, 3, C]`
    tensor; one `all_reduce(SUM)` adds the rows over all replicas, and each replica reads its own
    group's row. The sums are taken around a shift (the moving mean, without gradient) to limit
    cancellation in E[x^2] - E[x]^2. The all-reduce is differentiable, so input gradients equal
    those of BN over the group's concatenated batch. Statistics are fp32 for fp16/bf16 inputs.

    The moving statistics are updated from the group statistics with the biased variance, as
    Keras does. Their variables keep Keras' per-replica aggregation ("none"): each replica's copy
    tracks its own group's statistics (all copies agree when there is one group), and checkpoints
    save replica 0's copy, as with Keras' layer.

    Outside a replica context, in a default (no strategy) context, in inference mode or with
    `trainable=False`, it computes what `keras.layers.BatchNormalization` computes.

    Fast path: where the statistics are local (`group_size=1`, no strategy, inference, or
    `trainable=False`) and the input is a 4-D channels-last tensor without a mask, the layer runs
    TF's fused batch-norm kernel (`tf.raw_ops.FusedBatchNormV3`, as tf_keras and the Model
    Garden do) instead of Keras 3's separate moment and normalization ops: the same result up
    to rounding, one kernel forward and one backward (ResNet-50 on a CPU: see
    `benchmarks/resnet50/README.md`). The kernel returns the Bessel-corrected batch variance;
    the moving variance is updated with the biased one, as Keras does. `fused=False` keeps
    Keras' ops.

    Args:
      *args: Keras' positional arguments (`axis`, `momentum`, ...), in Keras' order.
      group_size: (keyword-only) replicas per normalization group; must divide
        `num_replicas_in_sync` of the strategy the layer is built and called under.
      fused: (keyword-only) use the fused kernel where it applies (see above); False always
        uses Keras' separate ops.
      **kwargs: every argument of `keras.layers.BatchNormalization` (`axis`, `momentum`,
        `epsilon`, `center`, `scale`, initializers, regularizers, constraints, `synchronized`,
        `renorm`, ..., `name`, `dtype`). `synchronized=True` and `renorm=True` are only accepted
        with `group_size=1` (they are Keras' own code paths).

    Raises:
      ConfigError: `group_size` is not a positive integer, is combined with `synchronized=True`
        or `renorm=True`, or (when built under a strategy) does not divide the number of
        replicas in sync.
      ValueError: called in replica context where `group_size` does not divide the number of
        replicas in sync (a layer built without a strategy).
    """

    def __init__(self, *args, group_size: int = 1, fused: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.group_size = _check_positive_int("group_size", group_size)
        if not isinstance(fused, bool):
            raise ConfigError(f"`fused` ({fused!r}) must be a bool.")
        self.fused = fused
        if group_size > 1 and self.synchronized:
            raise ConfigError(
                f"`synchronized=True` with `group_size` ({group_size}) is ambiguous: use "
                "group_size=<replicas in sync> for fully synchronized batch norm."
            )
        if group_size > 1 and self.renorm:
            raise ConfigError(f"`renorm=True` is not supported with `group_size` ({group_size}).")

    def build(self, input_shape):
        # Only a real strategy has a replica count to check; without one the layer is plain BN.
        if self.group_size > 1 and tf.distribute.has_strategy():
            check_group_size(
                self.group_size,
                tf.distribute.get_strategy().num_replicas_in_sync,
                layer_name=self.name,
            )
        super().build(input_shape)

    def _replica_context(self):
        """Returns the replica context to reduce over, or None when local statistics apply."""
        if self.group_size == 1 or not tf.distribute.has_strategy():
            return None
        # None in cross-replica context (e.g. a call directly under `strategy.scope()`).
        return tf.distribute.get_replica_context()

    def _fused_applies(self, inputs, mask) -> bool:
        """Whether the fused kernel computes this call (local statistics checked by the caller)."""
        return (
            self.fused
            and mask is None
            and not self.renorm
            and not self.synchronized
            and len(inputs.shape) == 4
            and self.axis % 4 == 3
        )

    def call(self, inputs, training=None, mask=None):
        local_training = bool(training) and self.trainable
        ctx = self._replica_context() if local_training else None
        if ctx is None:
            if self._fused_applies(inputs, mask):
                return self._fused_call(inputs, training=local_training)
            return super().call(inputs, training=training, mask=mask)
        if mask is not None and len(mask.shape) != len(inputs.shape) - 1:
            raise ValueError(
                "The mask provided should be one dimension less than the inputs. Received: "
                f"mask.shape={mask.shape}, inputs.shape={inputs.shape}"
            )
        # fp16/bf16 inputs: statistics and normalization in fp32, as Keras does.
        compute_dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, compute_dtype)
        num_replicas = ctx.num_replicas_in_sync
        check_group_size(self.group_size, num_replicas, layer_name=self.name, error=ValueError)
        mean, variance = group_moments(
            x,
            axis=self.axis,
            mask=mask,
            # The same on every member of a group: all members apply the same updates to it.
            shift=tf.stop_gradient(ops.cast(self.moving_mean, compute_dtype)),
            group_size=self.group_size,
            replica_id=ctx.replica_id_in_sync_group,
            num_replicas=num_replicas,
            all_reduce=lambda t: ctx.all_reduce(tf.distribute.ReduceOp.SUM, t),
        )  # [C], [C]

        moving_mean = ops.cast(self.moving_mean, compute_dtype)
        moving_variance = ops.cast(self.moving_variance, compute_dtype)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            moving_variance * self.momentum + variance * (1.0 - self.momentum)
        )
        outputs = ops.batch_normalization(
            x=x,
            mean=mean,
            variance=variance,
            axis=self.axis,
            offset=ops.cast(self.beta, compute_dtype) if self.center else None,
            scale=ops.cast(self.gamma, compute_dtype) if self.scale else None,
            epsilon=self.epsilon,
        )
        return ops.cast(outputs, self.compute_dtype)

    def _fused_call(self, inputs, *, training: bool):
        """Batch norm of a `[batch, height, width, channels]` input by `FusedBatchNormV3`.

        Training normalizes by this replica's batch statistics and updates the moving ones;
        inference normalizes by the moving statistics. The kernel takes fp16/bf16/fp32 inputs
        with fp32 statistics, so half-precision inputs are not upcast.
        """
        x = inputs
        if x.dtype not in (tf.float16, tf.bfloat16, tf.float32):
            x = tf.cast(x, tf.float32)
        channels = x.shape[-1]
        stats_dtype = tf.float32
        gamma = tf.cast(self.gamma, stats_dtype) if self.scale else tf.ones([channels], stats_dtype)
        beta = tf.cast(self.beta, stats_dtype) if self.center else tf.zeros([channels], stats_dtype)
        moving_mean = tf.cast(self.moving_mean, stats_dtype)
        moving_variance = tf.cast(self.moving_variance, stats_dtype)
        if not training:
            outputs = tf.raw_ops.FusedBatchNormV3(
                x=x,
                scale=gamma,
                offset=beta,
                mean=moving_mean,
                variance=moving_variance,
                epsilon=self.epsilon,
                data_format="NHWC",
                is_training=False,
            )[0]
            return ops.cast(outputs, self.compute_dtype)
        empty = tf.zeros([0], stats_dtype)
        outputs, mean, unbiased_variance = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=gamma,
            offset=beta,
            mean=empty,
            variance=empty,
            epsilon=self.epsilon,
            exponential_avg_factor=1.0,
            data_format="NHWC",
            is_training=True,
        )[:3]  # [b, h, w, c], [c], [c]
        # The kernel scales the variance by n / max(n - 1, 1); Keras' moving variance is biased.
        n = tf.cast(tf.size(x) // channels, stats_dtype)
        variance = unbiased_variance * (tf.maximum(n - 1.0, 1.0) / n)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            moving_variance * self.momentum + variance * (1.0 - self.momentum)
        )
        return ops.cast(outputs, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "group_size": self.group_size, "fused": self.fused}
