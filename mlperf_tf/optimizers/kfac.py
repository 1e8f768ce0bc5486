"""Provides `KFAC`: Kronecker-factored preconditioning of Dense and Conv2D layers (distributed).

K-FAC (Martens and Grosse 2015, arXiv:1503.05671; Grosse and Martens 2016 for convolutions)
approximates each layer's Fisher block by a Kronecker product of two small factors, from the
layer's inputs and the gradients of its outputs, and preconditions that layer's gradient with
their inverse. The distributed design is Pauloski et al. 2022 ("Deep Neural Network Training
With Distributed K-FAC", `gpauloski/kfac-pytorch`): factors are all-reduced, each layer's
eigendecomposition is computed by one replica (layer-wise assignment) and broadcast.

The protocol with the training step (a plain `apply_gradients` does not see layer inputs or
output gradients), in replica context:

    optimizer.register_model(model)            # once, in the strategy scope, before the first step
    with tf.GradientTape() as tape:
        with optimizer.capture():              # records Dense/Conv2D inputs and pre-activations
            loss = compute_loss(model, batch)
    grads = optimizer.gradients(tape, loss, model.trainable_variables)   # + layer statistics
    optimizer.apply_gradients(zip(grads, model.trainable_variables))     # K-FAC, then the base

The runner's `Trainer` does exactly this when the optimizer has `capture` (not under XLA: the
statistics cross the compiled function's boundary).
"""

from __future__ import annotations

import contextlib
import dataclasses

import keras
import tensorflow as tf
from keras import ops

from mlperf_tf.optimizers import base
from mlperf_tf.optimizers.lars import LARS
from mlperf_tf.optimizers.registry import (
    OptimizerPlugin,
    alias,
    fields_as_arguments,
    hparams_from_arguments,
)

BASE_OPTIMIZERS = ("sgd", "lars")


def _layers(layer):
    """`layer` and every layer nested in it, depth first, each once."""
    seen, stack, found = set(), [layer], []
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        found.append(current)
        stack.extend(reversed(getattr(current, "layers", []) or []))
    return found


@dataclasses.dataclass
class _Block:
    """One preconditioned layer: its variables, factor state and this step's captured tensors."""

    layer: keras.layers.Layer
    index: int
    kernel: keras.Variable
    bias: keras.Variable | None
    a_factor: keras.Variable = None  # A: [k_a, k_a], k_a = fan-in (+ 1 with a bias)
    g_factor: keras.Variable = None  # G: [out, out]
    a_vectors: keras.Variable = None  # Q_A, eigenvectors of A
    a_values: keras.Variable = None  # d_A
    g_vectors: keras.Variable = None
    g_values: keras.Variable = None
    inputs: tf.Tensor | None = None  # captured this step (trace time)
    outputs: tf.Tensor | None = None  # pre-activations

    def rows(self, inputs):
        """The layer's input rows a: [rows, k_a] (patches for Conv2D, ones column for a bias)."""
        layer = self.layer
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw = layer.kernel_size
            sh, sw = layer.strides
            dh, dw = layer.dilation_rate
            patches = tf.image.extract_patches(
                inputs,
                sizes=[1, kh, kw, 1],
                strides=[1, sh, sw, 1],
                rates=[1, dh, dw, 1],
                padding=layer.padding.upper(),
            )  # [batch, out_h, out_w, kh * kw * in], ordered like kernel.reshape(-1, out)
            a = tf.reshape(patches, [-1, patches.shape[-1]])
        else:
            a = tf.reshape(inputs, [-1, inputs.shape[-1]])
        if self.bias is not None:
            a = tf.concat([a, tf.ones_like(a[:, :1])], axis=1)
        return a


@keras.saving.register_keras_serializable(package="mlperf_tf")
@base.document_base_keyword_args
class KFAC(LARS):
    """K-FAC preconditioning of Dense and Conv2D layers on top of SGD-momentum or LARS.

    For each registered layer with inputs a (one row per example, and per output position for
    Conv2D: the im2col patch; a trailing 1 when the layer has a bias) and pre-activation
    gradients dz of the replica's loss (which is its share of the global mean), with N rows and B
    examples summed over replicas:

        every `factor_update_interval` steps (factors all-reduced across replicas):
            A_new = sum(a a^T) / N                       G_new = B^2 sum(dz dz^T) / N
            A = decay A + (1 - decay) A_new              (A = A_new on the first update; G alike)
        every `inverse_update_interval` steps (layer l on replica l mod R, then broadcast):
            A = Q_A diag(d_A) Q_A^T,  G = Q_G diag(d_G) Q_G^T   (eigenvalues clamped at 0)
        every step, with W the layer's summed gradient as a [k_a, out] matrix (bias as last row):
            P = Q_A [(Q_A^T W Q_G) / (d_A d_G^T + damping)] Q_G^T
        KL clipping over all layers (kl_clip > 0), lr the current learning rate:
            nu = min(1, sqrt(kl_clip / |lr^2 sum(P * W)|));   P = nu P

    B dz is the per-example gradient of the loss, so G is the mean outer product of per-example
    output gradients (for Dense on [batch, features] this is Martens and Grosse's G). The damping
    added to the products of eigenvalues, the eigendecomposition, the KL clip and the defaults
    (damping 0.001, factor decay 0.95, factors every 10 steps, inverses every 100, kl_clip 0.001)
    are kfac-pytorch's. The preconditioned gradients of the registered layers, and the plain
    gradients of every other variable (batch norm, embeddings, ...), then go to the base update:
    `base_optimizer="sgd"`, classic momentum (Keras' SGD: velocity = mu velocity - lr g, with
    g = P + wd * w on variables not excluded from weight decay), or `base_optimizer="lars"`,
    `LARS` with its trust ratio, weight decay and exclusions.

    Distributed: factors are summed with the strategy's reduce, each layer's eigendecomposition
    runs on worker device l mod R (one replica's device in a single-host `MirroredStrategy`) and
    is assigned to the mirrored state (the broadcast), and the summed gradients of the registered
    layers are preconditioned once and handed to Keras as equal shares (P / R per replica), which
    its cross-replica sum restores. With gradient accumulation the statistics of the step's last
    micro-batch are used. Conv2D layers must be `channels_last` with `groups=1`.
    """

    config_arguments = (
        *LARS.config_arguments,
        "base_optimizer",
        "damping",
        "factor_decay",
        "factor_update_interval",
        "inverse_update_interval",
        "kl_clip",
    )

    def __init__(
        self,
        learning_rate,
        *,
        base_optimizer: str = "sgd",
        damping: float = 0.001,
        factor_decay: float = 0.95,
        factor_update_interval: int = 10,
        inverse_update_interval: int = 100,
        kl_clip: float = 0.001,
        name: str = "KFAC",
        **kwargs,
    ):
        """Creates the optimizer.

        Args:
          learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
          base_optimizer: "sgd" (classic momentum) or "lars": the update that applies the
            preconditioned gradients and every other layer's.
          damping: added to d_A d_G^T (> 0).
          factor_decay: running-average decay of the factors, in [0, 1).
          factor_update_interval: steps between factor updates (>= 1).
          inverse_update_interval: steps between eigendecompositions (>= 1).
          kl_clip: the KL clip bound; 0 turns clipping off.
          momentum, eeta, epsilon, nesterov: of the base update, passed to `LARS` with its
            defaults (eeta and epsilon only matter with `base_optimizer="lars"`).
          {{base_keyword_args}}

        Raises:
          ValueError: an argument is out of range.
        """
        super().__init__(learning_rate, name=name, **kwargs)
        if base_optimizer not in BASE_OPTIMIZERS:
            raise ValueError(
                f"`base_optimizer` ({base_optimizer!r}) must be one of {BASE_OPTIMIZERS}."
            )
        self.base_optimizer = base_optimizer
        self.damping = base.check_number("damping", damping)
        if self.damping <= 0:
            raise ValueError(f"`damping` ({damping!r}) must be > 0.")
        self.factor_decay = base.check_number("factor_decay", factor_decay, high=1.0)
        self.factor_update_interval = base.check_positive_int(
            "factor_update_interval", factor_update_interval
        )
        self.inverse_update_interval = base.check_positive_int(
            "inverse_update_interval", inverse_update_interval
        )
        self.kl_clip = base.check_number("kl_clip", kl_clip)
        self._blocks: list[_Block] = []
        self._capturing = False

    # ---- registration and capture --------------------------------------------------------------
    def register_model(self, model: keras.Model) -> int:
        """Finds the model's Dense and Conv2D layers and creates their factor state.

        Call once, inside the strategy scope, after the model is built and before the first step.

        Returns:
          The number of preconditioned layers.

        Raises:
          ValueError: a Conv2D layer is not channels_last or is grouped.
        """
        if self._blocks:
            return len(self._blocks)
        for layer in _layers(model):
            if not isinstance(layer, (keras.layers.Dense, keras.layers.Conv2D)):
                continue
            if not layer.trainable or not layer.built:
                continue
            if isinstance(layer, keras.layers.Conv2D) and (
                layer.data_format != "channels_last" or layer.groups != 1
            ):
                raise ValueError(
                    f"K-FAC layer '{layer.name}': Conv2D needs data_format='channels_last' "
                    f"and groups=1 (got {layer.data_format!r}, {layer.groups})."
                )
            bias = layer.bias if getattr(layer, "use_bias", False) else None
            block = _Block(layer=layer, index=len(self._blocks), kernel=layer.kernel, bias=bias)
            k_a = _prod(layer.kernel.shape[:-1]) + (bias is not None)
            out = int(layer.kernel.shape[-1])
            tag = f"kfac_{block.index}"
            block.a_factor = self.add_variable((k_a, k_a), initializer="zeros", name=f"{tag}_A")
            block.g_factor = self.add_variable((out, out), initializer="zeros", name=f"{tag}_G")
            block.a_vectors = self.add_variable(
                (k_a, k_a), initializer="identity", name=f"{tag}_QA"
            )
            block.g_vectors = self.add_variable(
                (out, out), initializer="identity", name=f"{tag}_QG"
            )
            block.a_values = self.add_variable((k_a,), initializer="ones", name=f"{tag}_dA")
            block.g_values = self.add_variable((out,), initializer="ones", name=f"{tag}_dG")
            self._blocks.append(block)
        return len(self._blocks)

    @contextlib.contextmanager
    def capture(self):
        """Within it, registered layers record their inputs and pre-activation outputs.

        Each layer's `call` is replaced on the instance by the same math (linear part, then the
        activation) that keeps the pre-activation tensor; the original is restored on exit.
        """
        originals = []
        for block in self._blocks:
            layer = block.layer
            originals.append((layer, layer.__dict__.get("call")))
            layer.__dict__["call"] = self._recording_call(block)
        self._capturing = True
        try:
            yield self
        finally:
            self._capturing = False
            for layer, original in originals:
                if original is None:
                    layer.__dict__.pop("call", None)
                else:
                    layer.__dict__["call"] = original

    def _recording_call(self, block: _Block):
        layer = block.layer

        def call(inputs, *args, **kwargs):
            del args, kwargs  # training flags: Dense and Conv2D ignore them
            if isinstance(layer, keras.layers.Conv2D):
                z = layer.convolution_op(inputs, layer.kernel)
                if block.bias is not None:
                    z = ops.add(z, ops.reshape(block.bias, (1, 1, 1, -1)))
            else:
                z = ops.matmul(inputs, layer.kernel)
                if block.bias is not None:
                    z = ops.add(z, block.bias)
            block.inputs, block.outputs = inputs, z
            return layer.activation(z) if layer.activation is not None else z

        return call

    def gradients(self, tape: tf.GradientTape, loss, variables) -> list:
        """`tape.gradient(loss, variables)`, and this replica's factor statistics (replica context).

        Call after a forward pass under `capture()`; the statistics are kept for the next
        `apply_gradients` of the same step (a trace-time hand-over within one step function).
        """
        captured = [b for b in self._blocks if b.outputs is not None]
        outputs = [b.outputs for b in captured]
        all_grads = tape.gradient(loss, list(variables) + outputs)
        grads, output_grads = all_grads[: len(variables)], all_grads[len(variables) :]
        update = ops.equal(ops.mod(self.iterations, self.factor_update_interval), 0)
        self._statistics = {}
        for block, dz in zip(captured, output_grads):
            a_rows = block.rows(tf.cast(block.inputs, tf.float32))
            dz = tf.cast(tf.reshape(dz, [-1, dz.shape[-1]]), tf.float32)
            examples = tf.cast(tf.shape(block.inputs)[0], tf.float32)
            rows = tf.cast(tf.shape(a_rows)[0], tf.float32)

            def compute(a_rows=a_rows, dz=dz, examples=examples, rows=rows):
                return (
                    tf.matmul(a_rows, a_rows, transpose_a=True),
                    tf.matmul(dz, dz, transpose_a=True),
                    tf.stack([rows, examples]),
                )

            def skip(a_rows=a_rows, dz=dz):
                k_a, out = a_rows.shape[-1], dz.shape[-1]
                return tf.zeros([k_a, k_a]), tf.zeros([out, out]), tf.zeros([2])

            # Local work only under the cond: collectives happen later in cross-replica context.
            self._statistics[block.index] = tf.cond(update, compute, skip)
            block.inputs = block.outputs = None
        return grads

    # ---- the update ----------------------------------------------------------------------------
    # The preconditioning runs in `apply`, which the runner's summer does not call when it
    # updates pieces or shards: K-FAC declares neither LARS' sharded rule nor its whole norms.
    whole_norm_terms = None
    update_step_with_norms = None

    def sharded_update(self, variables) -> None:
        """None: K-FAC has no rule for weight-update sharding (its preconditioning needs the
        whole gradient of each layer in `apply`)."""
        del variables
        return None

    def build(self, var_list):
        """Builds the base update's slots (momentum); plain SGD-momentum turns LARS' trust off."""
        if self.built:
            return
        super().build(var_list)
        if self.base_optimizer == "sgd":
            self._adapt = [False] * len(var_list)

    def update_step(self, gradient, variable, learning_rate):
        """The base update; with `base_optimizer="sgd"`, g + wd * w on decayed variables first
        (L2 on the preconditioned gradient, as torch's SGD in kfac-pytorch)."""
        if self.base_optimizer == "sgd" and self._decay[self._get_variable_index(variable)]:
            gradient = ops.add(gradient, ops.multiply(self.weight_decay_rate, variable))
        super().update_step(gradient, variable, learning_rate)

    def apply(self, grads, trainable_variables=None):
        """Preconditions the registered layers' gradients, then applies the base update.

        `apply_gradients` (and a wrapper's call of `apply`) come through here.
        """
        if trainable_variables is None:
            trainable_variables = self._trainable_variables
        grads_and_vars = list(zip(grads, trainable_variables))
        by_id = {id(v): i for i, (_, v) in enumerate(grads_and_vars)}
        slots = []  # (block, kernel index, bias index or None)
        for block in self._blocks:
            if id(block.kernel) in by_id:
                bias_index = by_id.get(id(block.bias)) if block.bias is not None else None
                slots.append((block, by_id[id(block.kernel)], bias_index))
        if not slots:
            return super().apply(grads, trainable_variables)
        statistics = getattr(self, "_statistics", {})
        if not statistics:
            raise ValueError(
                "K-FAC's update needs this step's layer statistics: run the forward "
                "pass under `optimizer.capture()` and take the gradients with "
                "`optimizer.gradients(tape, loss, variables)` (a loss-scaling wrapper, as for "
                "--dtype=fp16, hides both; K-FAC does not run under it)."
            )
        self._statistics = {}
        local = []
        for _, k, b in slots:
            grad = tf.cast(grads_and_vars[k][0], tf.float32)
            matrix = tf.reshape(grad, [-1, grad.shape[-1]])
            if b is not None:
                matrix = tf.concat([matrix, tf.cast(grads_and_vars[b][0], tf.float32)[None]], 0)
            local.append(matrix)
        stats = [statistics.get(block.index) for block, _, _ in slots]
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync
        blocks = [block for block, _, _ in slots]
        preconditioned = context.merge_call(self._kfac_step, args=(blocks, local, stats))
        grads = [g for g, _ in grads_and_vars]
        for (block, k, b), p in zip(slots, preconditioned):
            p = p / replicas  # equal shares: Keras' cross-replica sum restores P
            kernel_part = p[:-1] if b is not None else p
            grads[k] = tf.cast(tf.reshape(kernel_part, block.kernel.shape), grads[k].dtype)
            if b is not None:
                grads[b] = tf.cast(p[-1], grads[b].dtype)
        return super().apply(grads, [v for _, v in grads_and_vars])

    def _kfac_step(self, strategy, blocks, local_grads, stats):
        """Cross-replica context: factor update, eigendecompositions, preconditioning, KL clip."""
        step = self.iterations

        def reduce(value):
            return strategy.reduce(tf.distribute.ReduceOp.SUM, value, axis=None)

        def update_factors():
            for block, stat in zip(blocks, stats):
                if stat is None:
                    continue
                sum_aa, sum_gg, counts = (reduce(s) for s in stat)
                rows, examples = counts[0], counts[1]
                a_new = sum_aa / rows
                g_new = sum_gg * examples**2 / rows
                first = step < self.factor_update_interval
                decay = tf.where(first, 0.0, self.factor_decay)
                block.a_factor.assign(decay * block.a_factor + (1.0 - decay) * a_new)
                block.g_factor.assign(decay * block.g_factor + (1.0 - decay) * g_new)
            return tf.constant(0)

        def update_inverses():
            devices = _worker_devices(strategy)
            for block in blocks:
                device = devices[block.index % len(devices)] if devices else None
                with tf.device(device):  # layer-wise assignment; the assign is the broadcast
                    d_a, q_a = tf.linalg.eigh(tf.convert_to_tensor(block.a_factor))
                    d_g, q_g = tf.linalg.eigh(tf.convert_to_tensor(block.g_factor))
                block.a_values.assign(tf.maximum(d_a, 0.0))
                block.a_vectors.assign(q_a)
                block.g_values.assign(tf.maximum(d_g, 0.0))
                block.g_vectors.assign(q_g)
            return tf.constant(0)

        done = tf.cond(
            ops.equal(ops.mod(step, self.factor_update_interval), 0),
            update_factors,
            lambda: tf.constant(0),
        )
        with tf.control_dependencies([done]):
            done = tf.cond(
                ops.equal(ops.mod(step, self.inverse_update_interval), 0),
                update_inverses,
                lambda: tf.constant(0),
            )
        with tf.control_dependencies([done]):
            summed = [reduce(g) for g in local_grads]
        preconditioned = []
        for block, grad in zip(blocks, summed):
            q_a = tf.convert_to_tensor(block.a_vectors)
            q_g = tf.convert_to_tensor(block.g_vectors)
            v1 = tf.matmul(tf.matmul(q_a, grad, transpose_a=True), q_g)
            v2 = v1 / (block.a_values[:, None] * block.g_values[None, :] + self.damping)
            preconditioned.append(tf.matmul(tf.matmul(q_a, v2), q_g, transpose_b=True))
        if self.kl_clip > 0:
            lr = tf.cast(self.learning_rate, tf.float32)
            vg = tf.add_n([tf.reduce_sum(p * g) for p, g in zip(preconditioned, summed)])
            vg = tf.abs(vg * lr**2)
            safe = tf.where(vg > 0, vg, 1.0)
            nu = tf.where(vg > 0, tf.minimum(1.0, tf.sqrt(self.kl_clip / safe)), 1.0)
            preconditioned = [nu * p for p in preconditioned]
        return preconditioned


def _prod(shape) -> int:
    result = 1
    for dim in shape:
        result *= int(dim)
    return result


def _worker_devices(strategy) -> tuple[str, ...]:
    """The strategy's local replica devices, or () for the default strategy."""
    if strategy.num_replicas_in_sync <= 1 or not hasattr(strategy.extended, "worker_devices"):
        return ()
    try:
        return tuple(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy refuses
        return ()


# `kfac_base_optimizer` ... `kfac_kl_clip`, with the constructor's defaults; the base update's
# momentum and weight decay come from the benchmark's SGD or LARS fields when it has them.
KFACHparams = hparams_from_arguments(
    KFAC,
    "kfac_",
    ("kfac_momentum", float, alias(0.9, "sgd_opt_momentum", "lars_opt_momentum", "momentum")),
    ("kfac_weight_decay", float, alias(0.0, "lars_opt_weight_decay")),
)


PLUGIN = OptimizerPlugin(
    hparams_class=KFACHparams, make=fields_as_arguments(KFAC, "kfac_"), log_name="kfac"
)
