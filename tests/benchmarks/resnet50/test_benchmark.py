"""Tests ResNet50Benchmark: loss, eval step, schedule, optimizer, MLPerf hparams against the rules."""

import dataclasses
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml
from mlperf_logging import compliance_checker
from mlperf_logging.mllog import constants as C

from benchmarks.resnet50 import config as rc
from benchmarks.resnet50.benchmark import ResNet50Benchmark, decayed_variables
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError, override
from mlperf_tf.optimizers import LARS

pytestmark = pytest.mark.numerics

RULES_DIR = os.path.dirname(compliance_checker.__file__)


def _smoke(**overrides):
    return ResNet50Benchmark(override(rc.smoke(), overrides) if overrides else rc.smoke())


def _batch(bench, batch_size, seed=0):
    rng = np.random.default_rng(seed)
    size = bench.config.data.image_size
    return {
        "image": tf.constant(rng.normal(size=[batch_size, size, size, 3]), tf.float32),
        "label": tf.constant(rng.integers(0, bench.config.model.num_classes, batch_size), tf.int32),
    }


def test_registry_names_this_class():
    from mlperf_tf import registry

    assert registry.get("resnet50") is ResNet50Benchmark
    assert ResNet50Benchmark.mlperf_benchmark == C.RESNET == "resnet"
    assert set(ResNet50Benchmark.presets) == {"mlperf", "mini", "smoke"}


def test_loss_is_label_smoothed_cross_entropy_over_the_micro_batch():
    bench = _smoke()
    model = bench.build_model()
    batch = _batch(bench, 4)
    loss = bench.compute_loss(model, batch, training=False)
    logits = model(batch["image"], training=False)
    reference = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1, reduction="sum"
    )(tf.one_hot(batch["label"], 10), logits)
    # Summed over this replica's 4 examples, divided by the global micro batch (16).
    np.testing.assert_allclose(float(loss), float(reference) / 16, rtol=1e-5)


def test_sgd_adds_half_weight_decay_l2_over_kernels_per_replica():
    bench = _smoke(**{"optimizer.opt_name": "sgd", "optimizer.sgd_opt_weight_decay": "0.0008"})
    bench = bench.with_context(RunContext(num_replicas=2))
    model = bench.build_model()
    batch = _batch(bench, 8)
    with_wd = float(bench.compute_loss(model, batch, training=False))
    plain = float(
        ResNet50Benchmark(
            dataclasses.replace(
                bench.config, optimizer=dataclasses.replace(bench.config.optimizer, opt_name="lars")
            )
        ).compute_loss(model, batch, training=False)
    )
    kernels = decayed_variables(model)
    assert kernels and all(len(v.shape) >= 2 for v in kernels)
    names = " ".join(v.path for v in kernels)
    assert "bn" not in names and "bias" not in names
    l2 = sum(float(np.sum(np.square(v.numpy()))) for v in kernels)
    np.testing.assert_allclose(with_wd - plain, 0.5 * 0.0008 * l2 / 2, rtol=1e-4)


def test_eval_step_counts_only_valid_examples():
    bench = _smoke()
    model = bench.build_model()
    batch = _batch(bench, 6)
    predictions = np.argmax(model(batch["image"], training=False).numpy(), axis=-1)
    labels = predictions.copy()
    labels[1] = (labels[1] + 1) % 10  # one wrong
    valid = np.array([1, 1, 1, 1, 0, 0], np.float32)
    labels[4] = (labels[4] + 1) % 10  # wrong but padding: ignored
    out = bench.eval_step(
        model, {**batch, "label": tf.constant(labels, tf.int32), "valid": tf.constant(valid)}
    )
    assert out["correct"].shape == (6,) and out["count"].shape == (6,)
    state = bench.eval_reduce(bench.eval_begin(), {k: v.numpy() for k, v in out.items()})
    assert bench.eval_result(state) == pytest.approx(3 / 4)
    with pytest.raises(ValueError, match="no real examples"):
        bench.eval_result({"correct": 0.0, "count": 0.0})


def _schedule(bench):
    return [(p.epoch_num, p.first_epoch_num, p.epoch_count, p.step) for p in bench.eval_schedule()]


def test_mlperf_eval_schedule_offset_2_every_4():
    bench = ResNet50Benchmark(rc.mlperf())
    spe = 1281167 // 4096
    expected = [(2, 1, 2, 2 * spe)] + [(e, e - 3, 4, e * spe) for e in range(6, 43, 4)]
    assert _schedule(bench) == expected


def test_eval_schedule_without_offset_and_with_a_budget_off_the_grid():
    bench = _smoke(max_epochs="10")
    assert _schedule(bench) == [(4, 1, 4, 16), (8, 5, 4, 32), (10, 9, 2, 40)]
    bench = _smoke(eval_offset_epochs="1", max_epochs="9")
    assert [p.epoch_num for p in bench.eval_schedule()] == [1, 5, 9]


def test_mini_schedule_meets_the_mlperf_rule():
    points = ResNet50Benchmark(rc.mini()).eval_schedule()
    epochs = [p.epoch_num for p in points]
    assert 1 <= epochs[0] <= 4
    assert all(b - a == 4 for a, b in zip(epochs, epochs[1:]))
    assert epochs[-1] == rc.mini().max_epochs


def test_optimizer_schedule_warmup_and_polynomial_decay():
    bench = _smoke()  # 4 steps per epoch, 1 warmup epoch, base LR 1.0
    train_steps = bench.train_steps
    assert train_steps == 32
    opt = bench.build_optimizer(train_steps)
    assert isinstance(opt, LARS)
    assert opt.weight_decay_rate == bench.config.optimizer.lars_opt_weight_decay
    assert opt.epsilon == 0.0 and opt.momentum == 0.9
    values = []
    for step in (0, 2, 4, 18, 32):
        opt.iterations.assign(step)
        values.append(float(opt.learning_rate))  # the schedule at `iterations`
    decay = 32 - 4 + 1
    assert values[0] == 0.0
    assert values[1] == pytest.approx(0.5)
    assert values[2] == pytest.approx(1.0)
    assert values[3] == pytest.approx((1 - 1e-4) * (1 - 14 / decay) ** 2 + 1e-4, rel=1e-5)
    assert values[4] == pytest.approx((1 - 1e-4) * (1 / decay) ** 2 + 1e-4, rel=1e-4)
    sgd = _smoke(**{"optimizer.opt_name": "sgd"}).build_optimizer(train_steps)
    assert isinstance(sgd, keras.optimizers.SGD) and sgd.momentum == 0.9


def _check_rules(hparams, ruleset, opt_name):
    """Evaluates the CHECK expressions of closed_resnet_<opt>.yaml the way the checker does."""
    path = os.path.join(RULES_DIR, f"training_{ruleset}", f"closed_resnet_{opt_name}.yaml")
    with open(path) as f:
        rules = yaml.safe_load(f)
    namespace = {"math": math, "is_integer": lambda x: abs(round(x) - x) < 0.00001}
    for rule in rules:
        key = rule["KEY"]
        assert key["NAME"] in hparams, f"{ruleset}: missing {key['NAME']}"
        check = key.get("CHECK")
        if check:
            v = {"value": hparams[key["NAME"]], "metadata": {}}
            assert eval(check, dict(namespace, v=v)), f"{ruleset}: {key['NAME']} fails {check}"


@pytest.mark.parametrize("ruleset", ["0.7.0", "1.0.0"])
@pytest.mark.parametrize("preset", ["mlperf", "mini", "smoke"])
def test_lars_hparams_satisfy_the_closed_rules(ruleset, preset):
    bench = ResNet50Benchmark(ResNet50Benchmark.preset(preset))
    hparams = bench.mlperf_hparams()
    assert hparams[C.OPT_NAME] == "lars"
    _check_rules(hparams, ruleset, "lars")
    assert hparams[C.LARS_OPT_LR_DECAY_STEPS] == bench.decay_steps(bench.train_steps)
    assert hparams[C.MODEL_BN_SPAN] == bench.config.global_batch_size


@pytest.mark.parametrize("ruleset", ["0.7.0", "1.0.0"])
def test_sgd_hparams_satisfy_the_closed_rules(ruleset):
    bench = _smoke(**{"optimizer.opt_name": "sgd", "optimizer.sgd_opt_base_learning_rate": "0.256"})
    hparams = bench.mlperf_hparams()
    assert hparams[C.OPT_NAME] == "sgd"
    _check_rules(hparams, ruleset, "sgd")
    assert not any(k.startswith("lars") for k in hparams)


def test_sgd_rules_reject_an_illegal_base_learning_rate():
    bench = _smoke(
        **{"optimizer.opt_name": "sgd", "optimizer.sgd_opt_base_learning_rate": "0.1234"}
    )
    with pytest.raises(AssertionError, match="sgd_opt_base_learning_rate"):
        _check_rules(bench.mlperf_hparams(), "1.0.0", "sgd")


def test_model_bn_span_follows_replicas_accumulation_and_group_size():
    bench = _smoke(**{"gradient_accumulation_steps": "2", "model.bn_group_size": "2"})
    bench = bench.with_context(RunContext(num_replicas=4))
    # micro batch 16 / 2 = 8 over 4 replicas = 2 per replica, groups of 2 replicas -> 4.
    assert bench.per_replica_batch_size == 2
    assert bench.mlperf_hparams()[C.MODEL_BN_SPAN] == 4
    bench = bench.with_context(RunContext(num_replicas=3))
    with pytest.raises(ConfigError, match="divisible"):
        bench.mlperf_hparams()


def test_step_methods_compile_with_xla():
    bench = _smoke(**{"data.image_size": "16"})
    model = bench.build_model()
    batch = _batch(bench, 4)

    @tf.function(jit_compile=True)
    def loss_and_grads(batch):
        with tf.GradientTape() as tape:
            loss = bench.compute_loss(model, batch, training=True)
        return loss, tape.gradient(loss, model.trainable_variables)

    @tf.function(jit_compile=True)
    def eval_step(batch):
        return bench.eval_step(model, batch)

    loss, grads = loss_and_grads(batch)
    eager_loss = bench.compute_loss(model, batch, training=True)
    np.testing.assert_allclose(float(loss), float(eager_loss), rtol=1e-4)
    assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)
    out = eval_step({**batch, "valid": tf.ones([4])})
    assert out["correct"].shape == (4,) and float(tf.reduce_sum(out["count"])) == 4.0


def test_two_replicas_with_grouped_batch_norm_give_the_one_replica_loss():
    """compute_loss per replica (÷ micro batch) summed over 2 replicas whose batch norm spans
    both equals one replica's loss on the whole batch: the loss scaling and the BN grouping fit."""
    config = override(rc.smoke(), {"model.bn_group_size": "2", "data.image_size": "16"})
    batch = _batch(ResNet50Benchmark(config), 16)
    single = ResNet50Benchmark(dataclasses.replace(config, model=rc.smoke().model))
    single_model = single.build_model()
    expected = float(single.compute_loss(single_model, batch, training=True))

    strategy = tf.distribute.MirroredStrategy(
        ["CPU:0", "CPU:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    bench = ResNet50Benchmark(config)
    bench = bench.with_context(RunContext(num_replicas=strategy.num_replicas_in_sync))
    assert bench.mlperf_hparams()[C.MODEL_BN_SPAN] == 16
    with strategy.scope():
        model = bench.build_model()
    model.set_weights(single_model.get_weights())
    halves = iter(
        strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensors(batch).unbatch().batch(16)
        )
    )

    @tf.function
    def loss(inputs):
        per_replica = strategy.run(
            lambda b: bench.compute_loss(model, b, training=True), args=(inputs,)
        )
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    np.testing.assert_allclose(float(loss(next(halves))), expected, rtol=1e-4)
