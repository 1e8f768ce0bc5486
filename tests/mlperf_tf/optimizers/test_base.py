"""Tests for mlperf_tf.optimizers.base: one meaning of `weight_decay`, base arguments documented once."""

import keras
import pytest

from mlperf_tf.optimizers import LAMB, LARS, base


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_weight_decay_is_the_in_update_rate_and_keras_decay_stays_off(cls):
    optimizer = cls(0.1, weight_decay=0.02, exclude_from_weight_decay=["bias"])
    assert optimizer.weight_decay is None  # Keras' decoupled decay: never applied
    assert optimizer.weight_decay_rate == 0.02
    config = optimizer.get_config()
    assert config["weight_decay"] == 0.02 and config["exclude_from_weight_decay"] == ["bias"]
    assert cls.from_config(config).weight_decay_rate == 0.02
    var_list = [keras.Variable([1.0], name="kernel"), keras.Variable([1.0], name="bias")]
    optimizer.build(var_list)
    assert optimizer._decay == [True, False]


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_base_keyword_arguments_are_documented_from_one_text(cls):
    doc = cls.__init__.__doc__
    assert "{{" not in doc
    assert "Keras' decoupled weight decay is never used." in doc
    assert "gradient_accumulation_steps" in doc


@pytest.mark.parametrize("cls", [LARS, LAMB])
def test_keras_exclusion_hook_is_refused(cls):
    with pytest.raises(NotImplementedError, match="exclude_from_weight_decay"):
        cls(0.1).exclude_from_weight_decay(var_names=["bias"])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: base.check_number("beta", float("nan")), r"`beta` \(nan\)"),
        (lambda: base.check_number("beta", "x"), "must be a number"),
        (lambda: base.check_positive_int("reset_interval", 0), r"`reset_interval` \(0\)"),
        (lambda: base.compile_exclusion_patterns("exclude", "bias"), "not one string"),
    ],
)
def test_validators_name_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()
