"""Provides `CrossReplicaBatchNormalization`: batch norm over groups of replicas, one collective."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from mlperf_tf.collectives import ops as collective_ops
from mlperf_tf.collectives.axis_group import AxisGroup, batch_norm_group
from mlperf_tf.config import ConfigError
from mlperf_tf.parallel.context import current_mesh
from mlperf_tf.parallel.mesh import DeviceMesh


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


def group_moments(x, *, axis, mask=None, group_sum, rank=0, group_size=1):
    """Mean and biased variance of `x` over a group of replicas, with one `group_sum` call.

    Runs in replica context. Each replica computes its per-channel count, mean and sum of
    squared deviations from that mean (two passes over its own batch), writes them as its row
    of a `[group_size, 3, C]` table, and `group_sum` adds the members' tables; every member then
    combines the rows with Chan, Golub & LeVeque's pairwise formula (1979):
    M2 = sum_i M2_i + sum_i n_i (mean_i - mean)^2. Unlike E[x^2] - E[x]^2 from summed squares,
    this does not cancel when a channel's mean is large against its spread (fp32 inputs of mean
    1000 and std 1 lose more than 1e-3 of their variance to summed squares,
    `tests/mlperf_tf/layers/test_batch_norm.py`), and needs no shift: the moving mean the old
    sums were taken around is 0 at the first step, where it could not help. The table costs
    `group_size` x the bytes of the `[3, C]` sums, still one collective.

    Args:
      x: this replica's inputs, in the statistics dtype (fp32 or fp64); any rank.
      axis: the channel axis of `x`; statistics reduce over every other axis.
      mask: optional mask of shape `x.shape[:-1]`, True/1 where an element counts (as in Keras).
      group_sum: callable summing a `[group_size, 3, C]` tensor over this replica's group (e.g.
        `Collectives.differentiable_all_reduce` over the group's members, or
        `table_group_sum`); it must be differentiable for training.
      rank: this replica's position in its group (int or int tensor), `[0, group_size)`.
      group_size: members of the group (Python int).

    Returns:
      (mean, variance) over the group's concatenated batch, each `[C]`.
    """
    ndim = len(x.shape)
    axis = axis % ndim
    axes = [i for i in range(ndim) if i != axis]
    channels = x.shape[axis]
    per_channel = [1] * ndim
    per_channel[axis] = channels
    if mask is None:
        w = None
        count = tf.cast(tf.size(x, out_type=tf.int64) // channels, x.dtype) * tf.ones(
            [channels], x.dtype
        )  # [C]
        local_mean = tf.reduce_mean(x, axis=axes)
    else:
        w = tf.broadcast_to(tf.cast(tf.expand_dims(mask, -1), x.dtype), tf.shape(x))
        count = tf.reduce_sum(w, axis=axes)
        local_mean = tf.math.divide_no_nan(tf.reduce_sum(w * x, axis=axes), count)
    deviations = tf.square(x - tf.reshape(local_mean, per_channel))
    if w is not None:
        deviations *= w
    local_m2 = tf.reduce_sum(deviations, axis=axes)  # [C]
    row = tf.stack([count, count * local_mean, local_m2])  # [3, C]
    table = tf.one_hot(rank, group_size, dtype=x.dtype)[:, None, None] * row[None]
    counts, sums, m2s = tf.unstack(group_sum(table), axis=1)  # each [G, C]
    total = tf.reduce_sum(counts, axis=0)
    mean = tf.math.divide_no_nan(tf.reduce_sum(sums, axis=0), total)
    member_means = tf.math.divide_no_nan(sums, counts)
    m2 = tf.reduce_sum(m2s, axis=0) + tf.reduce_sum(counts * tf.square(member_means - mean), 0)
    return mean, tf.maximum(tf.math.divide_no_nan(m2, total), 0.0)


def table_group_sum(all_reduce, *, group_size, replica_id, num_replicas):
    """A group sum built from a sum over *all* replicas, for replica ids known only at run time.

    Replica `r` belongs to group `r // group_size`; it writes its tensor into its group's row of
    a zero `[groups, ...]` table, `all_reduce` adds the tables of all replicas, and the replica
    reads its own row back. This is the path for TPU replicas (tensor replica ids, where
    `all_reduce` is a `CrossReplicaSum`) and for eager replica functions; MirroredStrategy and
    MultiWorkerMirroredStrategy in a `tf.function` take the group collective instead.

    Args:
      all_reduce: callable summing a tensor over all replicas (differentiable for training).
      group_size: replicas per group; must divide `num_replicas`.
      replica_id: this replica's id in its sync group (int or int tensor).
      num_replicas: replicas in sync (Python int).

    Returns:
      A callable taking a tensor and returning its sum over the replica's group.

    Raises:
      ValueError: `group_size` does not divide `num_replicas`.
    """
    num_groups = check_group_size(group_size, num_replicas, error=ValueError)

    def group_sum(t):
        if num_groups == 1:
            return all_reduce(t)
        group = tf.cast(replica_id, tf.int32) // group_size
        row = tf.reshape(tf.one_hot(group, num_groups, dtype=t.dtype), [-1] + [1] * len(t.shape))
        table = all_reduce(row * t)  # [G, ...]: row g holds group g's sum
        return tf.reduce_sum(row * table, axis=0)

    return group_sum


@keras.saving.register_keras_serializable(package="mlperf_tf")
class CrossReplicaBatchNormalization(keras.layers.BatchNormalization):
    """`keras.layers.BatchNormalization` whose training statistics span a group of replicas.

    Replicas are split into groups of `group_size` replicas (Ying et al., 2018,
    "Image Classification at Supercomputer Scale", distributed batch normalization); in training
    each group normalizes over the union of its members' batches. `group_size=1` is plain local BN
    (no collective), `group_size=num_replicas_in_sync` is fully synchronized BN. The groups come
    from the run's mesh (`mlperf_tf.parallel.use_mesh` around the layer's construction or call):
    the replicas that share a batch (spatial tiles, model shards) over `group_size / (spatial x
    model)` consecutive batch shards (`collectives.axis_group.batch_norm_group`); without a mesh
    every replica is a batch shard. On the row-major mesh a group is consecutive replica ids.

    Method (one collective per layer per step): in replica context every replica computes its
    per-channel count, mean and sum of squared deviations, its row of a `[group, 3, C]` table,
    and one all-reduce over the replica's group adds the tables (`group_moments`: Chan's
    combination, no cancellation). Under MirroredStrategy and MultiWorkerMirroredStrategy
    (replica ids known at trace time) that is a `CollectiveReduceV2` over the group's members
    with a group key per group (`mlperf_tf.collectives`), run directly in replica context: no
    `merge_call`, which had made tracing full-depth ResNet-50 on 4 logical devices take more
    than 13 minutes. Elsewhere (TPU, eager replica functions) it is the replica context's
    `all_reduce` of a one-hot `[groups, group, 3, C]` table (`table_group_sum`). The
    all-reduce's gradient is the all-reduce of the upstream gradient over the same group, so
    input gradients equal those of BN over the group's concatenated batch.
    Statistics are fp32 for fp16/bf16 inputs.

    The moving statistics are updated from the group statistics with the biased variance, as
    Keras does. Their variables keep Keras' per-replica aggregation ("none"): each replica's copy
    tracks its own group's statistics (all copies agree when there is one group), and checkpoints
    save replica 0's copy, as with Keras' layer.

    Outside a replica context, in a default (no strategy) context, in inference mode or with
    `trainable=False`, it computes what `keras.layers.BatchNormalization` computes.

    Fast path: where the statistics are local (`group_size=1`, no strategy, inference, or
    `trainable=False`) and the input is a 4-D channels-last fp16, bf16 or fp32 tensor without a
    mask, the layer runs TF's fused batch-norm kernel (`tf.raw_ops.FusedBatchNormV3`, as
    tf_keras and the Model Garden do) instead of Keras 3's separate moment and normalization
    ops: the same result up to rounding, one kernel forward and one backward (ResNet-50 on a
    CPU: see `benchmarks/resnet50/README.md`). The kernel returns the Bessel-corrected batch variance;
    the moving variance is updated with the biased one, as Keras does. `fused=False` keeps
    Keras' ops. fp64 inputs always take Keras' ops: the kernel has no fp64 version, and casting
    to fp32 would round a float64 model's batch norm to fp32 (the float64 exactness tests of
    spatial partitioning compare against such a model).

    Args:
      *args: Keras' positional arguments (`axis`, `momentum`, ...), in Keras' order.
      group_size: (keyword-only) replicas per normalization group; must divide
        `num_replicas_in_sync` of the strategy the layer is built and called under.
      fused: (keyword-only) use the fused kernel where it applies (see above); False always
        uses Keras' separate ops.
      collective_timeout_s: (keyword-only) seconds a group all-reduce may wait for its peers
        before failing with DeadlineExceededError (0: no limit, as in `tf.distribute`; a
        timeout costs TF one sleeping thread per execution, see `mlperf_tf/collectives`).
      **kwargs: every argument of `keras.layers.BatchNormalization` (`axis`, `momentum`,
        `epsilon`, `center`, `scale`, initializers, regularizers, constraints, `synchronized`,
        `renorm`, ..., `name`, `dtype`). `synchronized=True` and `renorm=True` are only accepted
        with `group_size=1` (they are Keras' own code paths).

    Raises:
      ConfigError: `group_size` is not a positive integer, `collective_timeout_s` is negative,
        `group_size` is combined with `synchronized=True`
        or `renorm=True`, or (when built under a strategy) does not divide the number of
        replicas in sync.
      ValueError: called in replica context where `group_size` does not divide the number of
        replicas in sync (a layer built without a strategy).
    """

    def __init__(
        self,
        *args,
        group_size: int = 1,
        fused: bool = True,
        collective_timeout_s: float = 0.0,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.group_size = _check_positive_int("group_size", group_size)
        if (
            isinstance(collective_timeout_s, bool)
            or not isinstance(collective_timeout_s, (int, float))
            or not collective_timeout_s >= 0
        ):
            raise ConfigError(
                f"`collective_timeout_s` ({collective_timeout_s!r}) must be a number >= 0."
            )
        self.collective_timeout_s = float(collective_timeout_s)
        # The run's mesh when the layer is made inside one (`mlperf_tf.parallel.use_mesh`);
        # None: a mesh of data replicas only, made from the strategy at call time.
        self._mesh = current_mesh()
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

    def _group_sum(self, ctx):
        """The callable that sums a `[3, C]` tensor over this replica's group (replica context).

        With a replica id known at trace time (MirroredStrategy, MultiWorkerMirroredStrategy)
        inside a `tf.function`: one `CollectiveReduceV2` over the group's members, run directly
        in replica context (`mlperf_tf.collectives`), no `merge_call`. Otherwise (TPU replica
        ids, eager replica functions): the replica context's `all_reduce` of a one-hot table.
        """
        num_replicas = ctx.num_replicas_in_sync
        replica = collective_ops.static_replica_id(ctx)
        if replica is None or tf.executing_eagerly():
            return table_group_sum(
                lambda t: ctx.all_reduce(tf.distribute.ReduceOp.SUM, t),
                group_size=self.group_size,
                replica_id=ctx.replica_id_in_sync_group,
                num_replicas=num_replicas,
            )
        group = self._group(num_replicas)
        return lambda t: group.sum(t, "moments")

    def _group(self, num_replicas: int) -> AxisGroup:
        """This layer's batch-norm group on the run's mesh: the replicas that share a batch
        (spatial tiles, model shards) over `group_size / (spatial x model)` consecutive batch
        shards (`batch_norm_group`). Without a mesh, every replica is a batch shard.

        Raises:
          ValueError: `group_size` is not a multiple of the replicas that share a batch.
        """
        mesh = self._mesh or current_mesh() or DeviceMesh(data=num_replicas)
        return batch_norm_group(
            mesh, self.group_size, owner=self, timeout_s=self.collective_timeout_s
        )

    def _rank(self, ctx):
        """This replica's position in its group: from the mesh where replica ids are known at
        trace time; on TPUs (a tensor id) its id modulo the group size, the same position, since
        a group's members are consecutive ids on the row-major mesh."""
        replica = collective_ops.static_replica_id(ctx)
        if replica is None or tf.executing_eagerly():
            return tf.math.floormod(ctx.replica_id_in_sync_group, self.group_size)
        return self._group(ctx.num_replicas_in_sync).rank(replica)

    def _fused_applies(self, inputs, mask) -> bool:
        """Whether the fused kernel computes this call (local statistics checked by the caller)."""
        return (
            self.fused
            and mask is None
            and not self.renorm
            and not self.synchronized
            and len(inputs.shape) == 4
            and self.axis % 4 == 3
            # The kernel's input types; fp64 goes to Keras' ops rather than rounding to fp32.
            and inputs.dtype in (tf.float16, tf.bfloat16, tf.float32)
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
            group_sum=self._group_sum(ctx),
            rank=self._rank(ctx),
            group_size=self.group_size,
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
        x = inputs  # fp16, bf16 or fp32 (`_fused_applies`)
        channels = x.shape[-1]
        stats_dtype = tf.float32
        gamma = tf.cast(self.gamma, stats_dtype) if self.scale else tf.ones([channels], stats_dtype)
        beta = tf.cast(self.beta, stats_dtype) if self.center else tf.zeros([channels], stats_dtype)
        moving_mean = tf.cast(self.moving_mean, stats_dtype)
        moving_variance = tf.cast(self.moving_variance, stats_dtype)
        # Inference normalizes by the moving statistics; training passes none (empty tensors)
        # and gets the batch's back.
        empty = tf.zeros([0], stats_dtype)
        outputs, mean, unbiased_variance = tf.raw_ops.FusedBatchNormV3(
            x=x,
            scale=gamma,
            offset=beta,
            mean=empty if training else moving_mean,
            variance=empty if training else moving_variance,
            epsilon=self.epsilon,
            exponential_avg_factor=1.0,
            data_format="NHWC",
            is_training=training,
        )[:3]  # [b, h, w, c], [c], [c]
        if not training:
            return ops.cast(outputs, self.compute_dtype)
        # The kernel scales the variance by n / max(n - 1, 1); Keras' moving variance is biased.
        n = tf.cast(tf.size(x) // channels, stats_dtype)
        variance = unbiased_variance * (tf.maximum(n - 1.0, 1.0) / n)
        self.moving_mean.assign(moving_mean * self.momentum + mean * (1.0 - self.momentum))
        self.moving_variance.assign(
            moving_variance * self.momentum + variance * (1.0 - self.momentum)
        )
        return ops.cast(outputs, self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "group_size": self.group_size,
            "fused": self.fused,
            "collective_timeout_s": self.collective_timeout_s,
        }
