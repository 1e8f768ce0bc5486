"""Tests of the deepseekv3_671b benchmark: the rules' hyperparameters at the RCP batches (LR
formula, 4 warm-up steps, cosine over 12,000 - 4 to 1e-8, AdamW epsilon 1e-8, aux coefficient
0.01, init_checkpoint_step 0), the eval cadence (first after floor(42 + 24,576 / GBS) steps,
then every step), bad input, the listed sizes, the MTP loss, the selection-bias update, and the
keys 6.0.0 and 6.1.0 require."""

import dataclasses
import json
import math
import os

import keras
import mlperf_logging
import numpy as np
import pytest
import tensorflow as tf
import yaml
from mlperf_logging.mllog import constants as C

from benchmarks.deepseekv3_671b import config as config_lib
from benchmarks.deepseekv3_671b.benchmark import DeepseekV3Benchmark
from mlperf_tf.benchmark import RunContext
from mlperf_tf.config import ConfigError
from mlperf_tf.errors import UserError
from mlperf_tf.parallel import DeviceMesh
from tests.closed_rules import logged_hparams

RULESETS = ("6.0.0", "6.1.0")


def _bench(preset="mlperf", mesh=None, **changes):
    config = dataclasses.replace(DeepseekV3Benchmark.preset(preset), **changes)
    return DeepseekV3Benchmark(config).with_context(RunContext(num_replicas=1, mesh=mesh))


@pytest.mark.parametrize("batch", [15_360, 16_384, 18_432])
def test_learning_rate_and_schedule_follow_the_rules(batch):
    bench = _bench(global_batch_size=batch)
    hparams = bench.mlperf_hparams()
    assert abs(hparams[C.OPT_BASE_LR] - 2.4e-5 * math.sqrt(batch / 16384)) < 1e-12
    assert hparams[C.OPT_LR_WARMUP_STEPS] == 4 and hparams[C.OPT_LR_DECAY_STEPS] == 11_996
    assert hparams[C.OPT_END_LR] == 1e-8 and hparams[C.OPT_ADAMW_EPSILON] == 1e-8
    assert hparams[C.MOE_AUX_LOSS_COEFF] == 0.01 and hparams[C.INIT_CHECKPOINT_STEP] == 0
    assert bench.scaled_settings() == {}
    schedule = bench.learning_rate_schedule()
    lr = hparams[C.OPT_BASE_LR]
    assert float(schedule(4)) == pytest.approx(lr, rel=1e-6)
    # Cosine from the peak at step 4 to 1e-8 at step 12,000.
    mid = 1e-8 + (lr - 1e-8) * 0.5 * (1 + math.cos(math.pi * 0.5))
    assert float(schedule(4 + 11_996 // 2)) == pytest.approx(mid, rel=1e-4)
    assert float(schedule(12_000)) == pytest.approx(1e-8, rel=1e-3)


@pytest.mark.parametrize("batch, first", [(15_360, 43), (16_384, 43), (18_432, 43), (8192, 45)])
def test_the_first_eval_follows_the_rules_then_every_step(batch, first):
    opt = config_lib.OptimizerConfig(opt_base_learning_rate=1e-5, opt_learning_rate_warmup_steps=4)
    points = _bench(global_batch_size=batch, optimizer=opt).eval_schedule()
    assert points[0].step == first == math.floor(42 + 24576 / batch)
    assert points[0].samples_count == batch * first
    assert [p.step for p in points[1:4]] == [first + 1, first + 2, first + 3]


def test_a_batch_with_no_rcp_is_one_line_naming_the_setting():
    bench = _bench(global_batch_size=15_872)
    with pytest.raises(ConfigError, match="opt_base_learning_rate") as e:
        bench.learning_rate_and_warmup()
    assert "\n" not in str(e.value)
    with pytest.raises(UserError, match="--expert_parallel=3 must divide"):
        _bench("smoke", mesh=DeviceMesh(expert=3)).check_layout()


@pytest.mark.parametrize("ruleset", RULESETS)
def test_mlperf_preset_logs_every_key_the_closed_rules_require(ruleset):
    bench = _bench()
    hparams = logged_hparams(bench, ruleset)
    assert hparams[C.MAX_SEQUENCE_LENGTH] == 4096 and bench.config.global_batch_size == 15_360
    assert bench.eval_samples() == 1024 and bench.quality_target == 3.6
    assert ("expert_parallelism" in hparams) == (ruleset == "6.1.0")
    # The reference's constant (its RCP logs: rcp_logs/15360/seed_1.out), not 12,000 x 15,360.
    assert bench.logged_hparams()[C.TRAIN_SAMPLES] == 1_574_207_408


def test_a_run_on_its_own_data_logs_the_sequences_of_its_schedule():
    bench = _bench("mini")
    want = bench.config.optimizer.max_steps * bench.config.global_batch_size
    assert bench.logged_hparams()[C.TRAIN_SAMPLES] == want != 1_574_207_408


def _rules(ruleset):
    path = os.path.join(
        os.path.dirname(mlperf_logging.__file__),
        f"compliance_checker/training_{ruleset}/closed_deepseekv3_671b.yaml",
    )
    with open(path) as f:
        return [entry["KEY"] for entry in yaml.safe_load(f) if "KEY" in entry]


@pytest.mark.parametrize("ruleset", RULESETS)
def test_mini_preset_fails_no_rule_but_the_sequence_length_and_the_batch(ruleset):
    """The rules' own CHECK, FIRST_CHECK and POST expressions (`closed_deepseekv3_671b.yaml`,
    in file order) on the mini's logged values and evaluation schedule: only
    `max_sequence_length` and `global_batch_size` fail; the LR is the rules' formula and the
    first eval the rules' GBS x floor(42 + 24,576 / GBS) samples, then one every step."""
    bench = _bench("mini")
    h = {**logged_hparams(bench, ruleset), C.GLOBAL_BATCH_SIZE: bench.config.global_batch_size,
         C.GRADIENT_ACCUMULATION_STEPS: 1, C.EVAL_SAMPLES: bench.eval_samples()}  # fmt: skip
    points = bench.eval_schedule()
    s, failed = {}, []
    for rule in _rules(ruleset):
        name = rule["NAME"]
        values = [{"metadata": {"samples_count": p.samples_count}} for p in points]
        if name != C.EVAL_ACCURACY:
            values = [{"value": h[name]}]
        checks = rule.get("CHECK", [])
        checks = [checks] if isinstance(checks, str) else checks
        first = [rule["FIRST_CHECK"]] if "FIRST_CHECK" in rule else []
        scope = {"math": math, "s": s}
        ok = all(eval(c, {**scope, "v": v}) for c in checks for v in values)  # noqa: S307
        ok = ok and all(eval(c, {**scope, "v": values[0]}) for c in first)  # noqa: S307
        if not ok:
            failed.append(name)
        if "POST" in rule:
            exec(rule["POST"], {**scope, "v": values[0]})  # noqa: S102
    assert failed == [C.GLOBAL_BATCH_SIZE, C.MAX_SEQUENCE_LENGTH], failed
    assert set(bench.scaled_settings()) == set(failed)
    batch = bench.config.global_batch_size
    assert points[0].samples_count == batch * math.floor(42 + 24576 / batch) > 24_576
    assert [p.step for p in points[:3]] == [points[0].step + i for i in range(3)]
    assert bench.config.model.weight_scale == config_lib.MINI_WEIGHT_SCALE > 1
    assert h[C.OPT_BASE_LR] == pytest.approx(2.4e-5 * math.sqrt(batch / 16384), rel=1e-12)


def test_the_pipeline_and_context_axes_are_taken_and_disclosed_as_used():
    """The reference's layout has a pipeline axis (TP1 x PP4 x CP1 x EP64): the benchmark takes
    pipeline and context (MTP on the last stage, MLA's latent gathered), and the 6.1 keys say
    the mesh's sizes; a P that does not divide the layers is one line."""
    bench = _bench("smoke", mesh=DeviceMesh(pipeline=2, context=2, expert=2))
    assert {"pipeline", "context", "expert"} <= set(bench.parallel_axes)
    keys = bench.round_hparams()
    assert (keys["pipeline_parallelism"], keys["context_parallelism"]) == (2, 2)
    assert (keys["expert_parallelism"], keys["tensor_parallelism"]) == (2, 1)
    with pytest.raises(UserError, match=r"--pipeline_parallel=2 must divide") as e:
        bench.build_model()  # the smoke model's 3 layers
    assert "\n" not in str(e.value)


def test_parameters_are_listed_by_mlperf_tf_list_json(capsys):
    from mlperf_tf import cli

    assert cli.main(["list", "--json"]) == 0
    listed = {entry["name"]: entry for entry in json.loads(capsys.readouterr().out)}
    model = config_lib.deepseek_v3_671b()
    assert listed["deepseekv3_671b"]["parameters"] == model.parameter_count()
    assert listed["deepseekv3_671b"]["active_parameters"] == model.active_parameter_count()
    assert listed["deepseekv3_671b"]["mlperf_benchmark"] == "deepseekv3_671b"


def test_training_flops_count_mla_widths_active_and_shared_experts_and_mtp():
    bench = _bench()
    m, seq = bench.config.model, 4096
    h, heads = m.hidden_size, m.num_attention_heads
    attention_weights = (
        h * 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 * heads * 256 + heads * 128 * h
    )
    moe = h * 256 + 8 * 3 * h * 2048 + 3 * h * 2048
    layers = 62  # 61 + the MTP block
    per_token = (
        layers * attention_weights + 3 * 3 * h * 18_432 + 59 * moe + 2 * m.vocab_size * h
        + 2 * h * h
    )  # fmt: skip
    forward = 2 * seq * per_token + 2 * seq * seq * heads * (192 + 128) * layers
    assert bench.training_flops_per_sample() == pytest.approx(3 * forward, rel=1e-12)


def test_training_flops_at_a_tiny_shape_by_hand_and_from_the_built_model_s_matmuls():
    """The FLOPs `bench` divides by (MFU) at the smoke model's shape, counted twice apart from
    `DecoderConfig.training_flops`: by hand from `config.tiny` and from the built model's
    kernels (every projection's weights twice per token, a routed expert's top-k of E, the
    output head once per head (main + MTP), the embedding a lookup; attention's scores at
    q_b's heads x (nope + rope) and its context at o_proj's heads x v, 2 s^2 each)."""
    bench = _bench("smoke")
    m, seq = bench.config.model, bench.config.data.max_sequence_length
    assert (m.hidden_size, m.num_attention_heads, seq) == (32, 4, 32)
    # Hand count: hidden 32, 4 heads; MLA: q latent 16, kv latent 8, nope 8, rope 4, v 8; layer 0
    # dense (64); layers 1-2 and the MTP block: router, 2 of 8 experts of 16, a shared one of 16.
    mla = 32 * 16 + 16 * 4 * (8 + 4) + 32 * (8 + 4) + 8 * 4 * (8 + 8) + 4 * 8 * 32
    moe = 32 * 8 + 2 * 3 * 32 * 16 + 3 * 32 * 16
    per_token = 4 * mla + 3 * 32 * 64 + 3 * moe + 2 * 128 * 32 + 2 * 32 * 32
    forward = 2 * seq * per_token + 4 * 2 * seq * seq * 4 * ((8 + 4) + 8)
    assert bench.training_flops_per_sample() == pytest.approx(3 * forward, rel=1e-12)

    keras.utils.set_random_seed(0)
    model = bench.build_model()
    weights, widths = 0, 0
    for v in model.trainable_variables:
        shape = tuple(v.shape)
        if len(shape) < 2 or v.path.endswith("token_embedding/embeddings"):
            continue  # norm scales; the input embedding is a lookup
        size = int(np.prod(shape))
        if len(shape) == 3:  # routed experts [E, in, out]: a token uses top_k of them
            size = size * m.moe.top_k // shape[0]
        weights += size * (1 + m.mtp_layers if v.path.endswith("lm_head/kernel") else 1)
        if v.path.endswith("q_b_proj/kernel"):
            widths += shape[1]  # heads x (nope + rope): the scores
        elif v.path.endswith("o_proj/kernel"):
            widths += shape[0]  # heads x v: the context
    built = 3 * (2 * seq * weights + 2 * seq * seq * widths)
    assert bench.training_flops_per_sample() == pytest.approx(built, rel=1e-12)


def test_the_training_loss_adds_the_mtp_loss_at_its_weight():
    keras.utils.set_random_seed(0)
    bench = _bench("smoke")
    model = bench.build_model()
    tokens = tf.random.uniform([8, 33], 0, 128, tf.int32, seed=1)
    batch = {"input_ids": tokens[:, :-1], "labels": tokens[:, 1:]}
    loss, metrics = bench.compute_loss_and_metrics(model, batch, training=True)
    plain = dataclasses.replace(bench.config.model, mtp_loss_weight=0.0)
    bench0 = DeepseekV3Benchmark(dataclasses.replace(bench.config, model=plain))
    loss0, _ = bench0.with_context(bench.context).compute_loss_and_metrics(model, batch, True)
    assert float(metrics["mtp/loss"]) > 0.1 * 4.0  # 0.1 x a cross-entropy near ln(128)
    assert float(loss) == pytest.approx(float(loss0) + float(metrics["mtp/loss"]), rel=1e-5)
    # NumPy: depth 1 predicts t_{i+2} over the first 30 positions.
    _, (mtp,) = model.with_mtp(batch["input_ids"], training=True)
    logits = mtp.numpy().astype(np.float64)[:, :-1]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    target = tokens.numpy()[:, 2:]
    nll = -np.take_along_axis(log_probs, target[..., None], -1)[..., 0]
    assert float(metrics["mtp/loss"]) == pytest.approx(0.1 * nll.mean(), rel=1e-4)


def test_the_selection_bias_moves_towards_balance_after_each_update():
    """`after_update` (the compiled step's, once per optimizer step) moves each MoE layer's
    bias by the rate x sign(mean - choices) of that layer's summed choices per expert; no host
    action does it (`tests/benchmarks/deepseekv3_671b/test_bias_update.py` runs it in steps)."""
    keras.utils.set_random_seed(0)
    bench = _bench("smoke")
    model = bench.build_model()
    assert bench.run_actions() == [] and bench.update_metrics() == ("moe/tokens_per_expert",)
    layers, experts = len(model.moe_layers), 8
    counts = np.full((layers, experts), 64.0, np.float32)
    counts[0, 0], counts[0, 1] = 128.0, 0.0  # expert 0 overloaded, 1 idle in layer 0
    bench.after_update(model, {"moe/tokens_per_expert": tf.constant(counts)})
    bias = model.moe_layers[0].router_bias.numpy()
    np.testing.assert_allclose(bias[:2], [-1e-3, 1e-3])
    np.testing.assert_array_equal(bias[2:], 0.0)  # at the mean: a tie moves nothing
    np.testing.assert_array_equal(model.moe_layers[1].router_bias.numpy(), 0.0)
    moe = dataclasses.replace(bench.config.model.moe, bias_update_rate=0.0)
    model_config = dataclasses.replace(bench.config.model, moe=moe)
    frozen = DeepseekV3Benchmark(dataclasses.replace(bench.config, model=model_config))
    assert frozen.update_metrics() == ()


def test_prepare_s_base_perplexity_is_the_main_head_s_over_the_eval_set():
    """What `prepare` logs of the mini base (`prepare.base_eval_log_perplexity`), at the smoke
    shape: the main head's mean next-token cross-entropy over every eval window's counted
    tokens, against NumPy on the same batches."""
    from benchmarks.deepseekv3_671b import prepare  # noqa: PLC0415

    keras.utils.set_random_seed(0)
    bench = _bench("smoke", eval_examples=12, eval_batch_size=8)  # 2 batches, the 2nd padded
    model = bench.build_model()
    got = prepare.base_eval_log_perplexity(bench, model)
    data = iter(bench.eval_dataset(tf.distribute.InputContext()))
    total, count = 0.0, 0.0
    for _ in range(bench.eval_steps(1)):
        batch = next(data)
        logits = model(batch["input_ids"]).numpy().astype(np.float64)
        top = logits.max(-1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
        labels = batch["labels"].numpy()
        counted = batch["valid"].numpy()[:, None] * (labels != -100)
        picked = np.take_along_axis(log_probs, np.maximum(labels, 0)[..., None], -1)[..., 0]
        total += float(np.sum(-picked * counted))
        count += float(np.sum(counted))
    assert count == 12 * bench.config.data.max_sequence_length  # the padding is not counted
    assert got == pytest.approx(total / count, rel=1e-5)
