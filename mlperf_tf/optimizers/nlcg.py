"""Provides `NLCG`, stochastic preconditioned nonlinear conjugate gradients (Adya et al. 2019)."""

from __future__ import annotations

import keras
from keras import ops

from mlperf_tf.optimizers import base
from mlperf_tf.optimizers.registry import (
    OptimizerPlugin,
    fields_as_arguments,
    hparams_from_arguments,
)

BETA_RULES = ("FR", "PR")
_EPS = 1e-8  # the authors' guard on every division


@keras.saving.register_keras_serializable(package="mlperf_tf")
@base.document_base_keyword_args
class NLCG(base.Optimizer):
    """Preconditioned nonlinear conjugate gradients with a diagonal BFGS preconditioner.

    From "Nonlinear Conjugate Gradients For Scaling Synchronous Distributed DNN Training"
    (Adya, Palakkode and Tuzel, 2019, arXiv:1812.02886), as the authors' TensorFlow code
    (`apple/ml-ncg`, `ncg_core_tfop.py`) implements it. For each variable w, at step k with
    gradient g_k (cross-replica summed), residual r_k = -g_k and learning rate lr_k:

        preconditioner (diagonal BFGS; H = 1 at k = 0):
            s = w_k - w_{k-1} = lr_{k-1} d_{k-1},   y = g_k - g_{k-1}
            if y.s > eps and s.(H s) > eps:
                H = |H - (H s)**2 / (s.(H s)) + y**2 / (y.s)|      (element-wise squares)
            P = 1 / (H + eps)
        preconditioned residual:   z_k = P r_k
        beta (clipped to [0, 1]; `beta_rule`):
            FR:  beta = r_k.z_k / r_{k-1}.z_{k-1}
            PR:  beta = r_k.(z_k - z_{k-1}) / r_{k-1}.z_{k-1}
        restart: beta = 0 at k = 0, where the clip gives 0 (negative PR beta: a steepest-descent
            restart), and every `restart_interval` steps when set
        direction:  d_k = z_k + beta d_{k-1}
        step:       w_{k+1} = w_k + lr_k d_k

    where "." is the dot product over the whole variable (so beta and the preconditioner's
    scalars are per variable: layer-wise, like LARS' trust ratio; the authors' code treats the
    flattened model as one vector, which Keras' per-variable `update_step` does not see) and
    eps = 1e-8. The diagonal BFGS update is the authors' without their extra eps terms in the
    numerators (they guard with the same condition).

    Step size: the authors' code offers a loss-EMA rule that rescales lr from the training loss
    and a "no line search" mode; the loss is not an input of `apply_gradients`, so this class
    follows the no-line-search mode: the step is the (benchmark's) learning-rate schedule, with
    no extra forward pass. The paper itself was not available offline when this was written, so
    no equation numbers are quoted; the formulas above are those of the code.

    Weight decay, when set, is added to g_k (an L2 term) before all of the above.
    """

    config_arguments = ("beta_rule", "precondition", "restart_interval")

    def __init__(
        self,
        learning_rate,
        *,
        beta_rule: str = "FR",
        precondition: bool = True,
        restart_interval: int = 0,
        name: str = "NLCG",
        **kwargs,
    ):
        """Creates the optimizer.

        Args:
          learning_rate: lr_k: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
          beta_rule: "FR" (Fletcher-Reeves, the authors' default) or "PR" (Polak-Ribiere).
          precondition: use the diagonal BFGS preconditioner (else P = 1).
          restart_interval: steps between forced restarts (beta = 0); 0 means none.
          {{base_keyword_args}}

        Raises:
          ValueError: an argument is out of range.
        """
        super().__init__(learning_rate, name=name, **kwargs)
        if beta_rule not in BETA_RULES:
            raise ValueError(f"`beta_rule` ({beta_rule!r}) must be one of {BETA_RULES}.")
        self.beta_rule = beta_rule
        self.precondition = bool(precondition)
        if restart_interval != 0:
            base.check_positive_int("restart_interval", restart_interval)
        self.restart_interval = restart_interval

    def build(self, var_list):
        """Creates per variable: the diagonal H, g_{k-1}, z_{k-1}, d_{k-1}, the last step s and
        the scalar r_{k-1}.z_{k-1}."""
        if self.built:
            return
        super().build(var_list)
        self._hessians = []
        for v in var_list:
            h = self.add_variable_from_reference(v, name="hessian_diagonal")
            h.assign(ops.ones_like(h))
            self._hessians.append(h)
        self._old_gradients = [
            self.add_variable_from_reference(v, "old_gradient") for v in var_list
        ]
        self._old_residuals = [
            self.add_variable_from_reference(v, "preconditioned_residual") for v in var_list
        ]
        self._directions = [self.add_variable_from_reference(v, "direction") for v in var_list]
        self._steps = [self.add_variable_from_reference(v, "last_step") for v in var_list]
        self._residual_dots = [
            self.add_variable((), initializer="zeros", name=f"residual_dot_{i}")
            for i in range(len(var_list))
        ]

    def _preconditioner(self, index, g, first):
        h_var = self._hessians[index]
        h = ops.convert_to_tensor(h_var)
        s = ops.convert_to_tensor(self._steps[index])
        y = g - ops.convert_to_tensor(self._old_gradients[index])
        ys = ops.sum(y * s)
        hs = h * s
        shs = ops.sum(s * hs)
        ok = ops.logical_and(ys > _EPS, shs > _EPS)
        updated = ops.abs(
            h - ops.square(hs) / ops.where(ok, shs, 1.0) + ops.square(y) / ops.where(ok, ys, 1.0)
        )
        h_new = ops.where(first, ops.ones_like(h), ops.where(ok, updated, h))
        self.assign(h_var, h_new)
        return 1.0 / (h_new + _EPS)

    def update_step(self, gradient, variable, learning_rate):
        """Applies one NLCG step to one variable (update context, summed gradient)."""
        index = self._get_variable_index(variable)
        dtype = variable.dtype
        g = base.dense_gradient(gradient, dtype)
        if self._decay[index]:
            g = g + ops.cast(self.weight_decay_rate, dtype) * variable
        lr = ops.cast(learning_rate, dtype)
        step = self.iterations
        first = ops.equal(step, 0)
        r = -g
        z = r * self._preconditioner(index, g, first) if self.precondition else r
        rz = ops.sum(r * z)
        rz_old = self._residual_dots[index]
        if self.beta_rule == "FR":
            numerator = rz
        else:
            numerator = rz - ops.sum(r * ops.convert_to_tensor(self._old_residuals[index]))
        beta = ops.clip(numerator / (rz_old + _EPS), 0.0, 1.0)
        restart = first
        if self.restart_interval:
            restart = ops.logical_or(restart, ops.equal(ops.mod(step, self.restart_interval), 0))
        beta = ops.where(restart, 0.0, beta)
        d = z + ops.cast(beta, dtype) * ops.convert_to_tensor(self._directions[index])
        self.assign(self._directions[index], d)
        self.assign(self._old_residuals[index], z)
        self.assign(self._old_gradients[index], g)
        self.assign(rz_old, rz)
        self.assign(self._steps[index], lr * d)
        self.assign_add(variable, lr * d)


# `nlcg_beta_rule`, `nlcg_precondition`, `nlcg_restart_interval`, with the constructor's defaults.
NLCGHparams = hparams_from_arguments(NLCG, "nlcg_")


PLUGIN = OptimizerPlugin(
    hparams_class=NLCGHparams, make=fields_as_arguments(NLCG, "nlcg_"), log_name="nlcg"
)
