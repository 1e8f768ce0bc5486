"""The checkpoint format (`mlperf_tf.checkpoints.run_checkpoint`): variables keyed by stable path.

A model whose layers are built in another order (as SSD's spatial model builds them) restores a
checkpoint by path where the positional format fails; a checkpoint of another model is refused
naming the variables; a checkpoint of the earlier positional format still restores; optimizer
keys do not depend on Keras' process-wide naming (`adam`, `adam_1`, ...).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from mlperf_tf import checkpoints


def _model(order: str, *, extra: bool = False) -> keras.Model:
    """Two branches `a` and `b` joined in `order`, which is the order Keras lists them in."""
    inputs = keras.Input((3,))
    built = {}
    for name in order:
        built[name] = keras.layers.Dense(
            4 if name == "a" else 2, name=name, kernel_initializer="random_normal"
        )(inputs)
    outputs = keras.layers.Concatenate(name="join")([built[name] for name in order])
    if extra:
        outputs = keras.layers.Dense(1, name="head")(outputs)
    return keras.Model(inputs, outputs, name="net")


def _trained(model) -> keras.optimizers.Optimizer:
    optimizer = keras.optimizers.Adam(0.1)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.ones([2, 3])) ** 2)
    optimizer.apply_gradients(
        zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables, strict=True)
    )
    return optimizer


def _built(model) -> keras.optimizers.Optimizer:
    optimizer = keras.optimizers.Adam(0.1)
    optimizer.build(model.trainable_variables)
    return optimizer


def _checkpointer(model, optimizer, tmp_path, **kwargs) -> checkpoints.Checkpointer:
    return checkpoints.Checkpointer(
        checkpoint=checkpoints.run_checkpoint(model=model, optimizer=optimizer),
        model_dir=str(tmp_path),
        **kwargs,
    )


def test_a_model_built_in_another_order_restores_by_path(tmp_path):
    saved = _model("ab")
    saved_optimizer = _trained(saved)
    _checkpointer(saved, saved_optimizer, tmp_path).save(1)

    restored = _model("ba")
    optimizer = _built(restored)
    assert [v.path for v in restored.variables] != [v.path for v in saved.variables]
    assert _checkpointer(restored, optimizer, tmp_path).restore().endswith("ckpt-1")
    for path, variable in checkpoints.model_paths(saved).items():
        np.testing.assert_array_equal(
            checkpoints.model_paths(restored)[path].numpy(), variable.numpy(), err_msg=path
        )
    slots = checkpoints.optimizer_paths(optimizer)
    for key, variable in checkpoints.optimizer_paths(saved_optimizer).items():
        np.testing.assert_array_equal(slots[key].numpy(), variable.numpy(), err_msg=key)
    assert int(optimizer.iterations.numpy()) == 1


def test_the_positional_format_could_not_restore_that(tmp_path):
    # What the one format fixes: the same two models through Keras' own (positional) tracking.
    saved = _model("ab")
    path = tf.train.Checkpoint(model=saved).write(str(tmp_path / "positional"))
    with pytest.raises((ValueError, tf.errors.OpError), match="incompatible|shape"):
        tf.train.Checkpoint(model=_model("ba")).read(path).expect_partial()


def test_a_checkpoint_of_another_model_is_refused_naming_the_variables(tmp_path):
    bigger, smaller = _model("ab", extra=True), _model("ab")
    _checkpointer(bigger, _built(bigger), tmp_path / "bigger").save(1)
    _checkpointer(smaller, _built(smaller), tmp_path / "smaller").save(1)
    with pytest.raises(checkpoints.CheckpointError) as caught:
        _checkpointer(smaller, _built(smaller), tmp_path / "bigger").restore()
    message = str(caught.value)
    assert "holds 2 model variables the run has not (head/bias, head/kernel)" in message
    assert "\n" not in message
    with pytest.raises(checkpoints.CheckpointError, match=r"lacks 2 model variables \(head/bias"):
        _checkpointer(bigger, _built(bigger), tmp_path / "smaller").restore()


def test_a_checkpoint_of_the_positional_format_restores_under_its_layout(tmp_path):
    saved = _model("ab")
    saved_optimizer = _trained(saved)
    legacy = tf.train.Checkpoint(model=saved, optimizer=saved_optimizer)
    tf.train.CheckpointManager(legacy, str(tmp_path / "ckpt"), 3).save(checkpoint_number=1)

    restored = _model("ab")
    optimizer = _built(restored)
    positional = tf.train.Checkpoint(model=restored, optimizer=optimizer)
    _checkpointer(restored, optimizer, tmp_path, positional=positional).restore()
    for a, b in zip(restored.variables, saved.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert int(optimizer.iterations.numpy()) == 1
    # Without the positional fallback it is refused, not restored in part.
    with pytest.raises(checkpoints.CheckpointError, match="lacks"):
        _checkpointer(_model("ab"), _built(_model("ab")), tmp_path).restore()


def test_optimizer_keys_leave_out_the_optimizers_process_wide_name():
    model = _model("ab")
    first, second = keras.optimizers.Adam(), keras.optimizers.Adam()
    first.build(model.trainable_variables)
    second.build(model.trainable_variables)
    assert first.name != second.name  # adam, adam_1
    assert sorted(checkpoints.optimizer_paths(first)) == sorted(checkpoints.optimizer_paths(second))
    assert "a_kernel_momentum" in checkpoints.optimizer_paths(first)


def test_a_wrapped_optimizer_keeps_its_own_and_its_inner_variables_apart():
    model = _model("ab")
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    scaled.build(model.trainable_variables)
    keys = checkpoints.optimizer_paths(scaled)
    assert len(keys) == len(scaled.variables)
    assert {"iteration", "wrapper/iteration", "wrapper/dynamic_scale"} <= set(keys)


def test_two_variables_of_one_path_stay_apart():
    keyed = checkpoints._unique([("x/w", 1), ("y/w", 2), ("x/w", 3)])  # noqa: SLF001
    assert keyed == {"x/w": 1, "y/w": 2, "x/w#2": 3}
