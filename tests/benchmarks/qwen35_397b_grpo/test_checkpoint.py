"""Tests of Qwen3.5's Hugging Face import (`benchmarks.qwen35_397b_grpo.checkpoint`, through the
shared `mlperf_tf.hf_checkpoint`): the tests WRITE tiny checkpoints themselves, by the names and
torch layouts of transformers 5.25.0's `modeling_qwen3_5_moe.py` (written here from that file,
not from the name map under test), with random weights; the import's MoE block equals a NumPy
transcription of `Qwen3_5MoeSparseMoeBlock` on the written tensors (fused and per-expert
layouts); a dense variant's logits equal keras-hub's own converter's (`Qwen3_5Backbone.
from_preset` of the same folder), and the MoE model's those of keras-hub's Qwen3.5-MoE
(`Qwen3_5MoeBackbone`, keras-hub >= 0.32); another model's config, a missing tensor, a wrong shape and a
truncated shard are one-line errors naming it."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from benchmarks.qwen35_397b_grpo import checkpoint
from benchmarks.qwen35_397b_grpo import config as config_lib
from benchmarks.qwen35_397b_grpo import model as model_lib
from benchmarks.qwen35_397b_grpo.benchmark import Qwen35GrpoBenchmark
from mlperf_tf.errors import UserError
from mlperf_tf.hf_checkpoint import CheckpointImportError
from tests import tensor_parallel
from tests.numerics import assert_close

TOKENS = np.random.default_rng(0).integers(0, 64, (2, 11)).astype(np.int32)
P = "model.language_model."


def _dense_config():
    return dataclasses.replace(
        config_lib.tiny(), shared_expert_size=0,
        moe=dataclasses.replace(config_lib.REFERENCE_MOE, num_experts=0),
    )  # fmt: skip


def _hf_tensors(c, *, seed=1, fused=True) -> dict:
    """A random checkpoint of config `c` in transformers' names and torch layouts ([out, in]
    Linear weights, (1 + w) norms near 0, conv1d [channels, 1, K]), plus the vision tower and
    MTP tensors the import must skip."""
    rng = np.random.default_rng(seed)

    def w(*shape, scale=0.2):
        return rng.normal(0.0, scale, shape).astype(np.float32)

    h, hd = c.hidden_size, c.head_dim
    kd = c.linear_num_key_heads * c.linear_key_head_dim
    vd = c.linear_num_value_heads * c.linear_value_head_dim
    t = {P + "embed_tokens.weight": w(c.vocab_size, h, scale=1.0), P + "norm.weight": w(h),
         "lm_head.weight": w(c.vocab_size, h), "model.visual.blocks.0.attn.qkv.weight": w(3, 3),
         "mtp.fc.weight": w(h, 2 * h)}  # fmt: skip
    for i in range(c.num_hidden_layers):
        s = f"{P}layers.{i}."
        t[s + "input_layernorm.weight"] = w(h)
        t[s + "post_attention_layernorm.weight"] = w(h)
        if c.is_linear(i):
            a = s + "linear_attn."
            t[a + "in_proj_qkv.weight"] = w(2 * kd + vd, h)
            t[a + "in_proj_z.weight"] = w(vd, h)
            t[a + "in_proj_b.weight"] = w(c.linear_num_value_heads, h)
            t[a + "in_proj_a.weight"] = w(c.linear_num_value_heads, h)
            t[a + "conv1d.weight"] = w(2 * kd + vd, 1, c.linear_conv_kernel_dim, scale=0.5)
            t[a + "dt_bias"] = w(c.linear_num_value_heads, scale=1.0)
            t[a + "A_log"] = rng.uniform(0.0, 2.0, c.linear_num_value_heads).astype(np.float32)
            t[a + "norm.weight"] = rng.uniform(0.5, 1.5, c.linear_value_head_dim).astype(np.float32)
            t[a + "out_proj.weight"] = w(h, vd)
        else:
            a = s + "self_attn."
            t[a + "q_proj.weight"] = w(c.num_attention_heads * hd * 2, h)
            t[a + "k_proj.weight"] = w(c.num_key_value_heads * hd, h)
            t[a + "v_proj.weight"] = w(c.num_key_value_heads * hd, h)
            t[a + "o_proj.weight"] = w(h, c.num_attention_heads * hd)
            t[a + "q_norm.weight"] = w(hd)
            t[a + "k_norm.weight"] = w(hd)
        if not c.moe.enabled:
            f = c.intermediate_size
            t.update({s + "mlp.gate_proj.weight": w(f, h), s + "mlp.up_proj.weight": w(f, h),
                      s + "mlp.down_proj.weight": w(h, f)})  # fmt: skip
            continue
        e, f, sf = c.moe.num_experts, c.moe.filter_size, c.shared_expert_size
        t[s + "mlp.gate.weight"] = w(e, h, scale=1.0)
        gate_up, down = w(e, 2 * f, h), w(e, h, f)
        if fused:
            t[s + "mlp.experts.gate_up_proj"] = gate_up
            t[s + "mlp.experts.down_proj"] = down
        else:  # one tensor per expert, the layout transformers' qwen2_moe conversion merges
            for x in range(e):
                t[f"{s}mlp.experts.{x}.gate_proj.weight"] = gate_up[x, :f].copy()
                t[f"{s}mlp.experts.{x}.up_proj.weight"] = gate_up[x, f:].copy()
                t[f"{s}mlp.experts.{x}.down_proj.weight"] = down[x]
        t[s + "mlp.shared_expert.gate_proj.weight"] = w(sf, h)
        t[s + "mlp.shared_expert.up_proj.weight"] = w(sf, h)
        t[s + "mlp.shared_expert.down_proj.weight"] = w(h, sf)
        t[s + "mlp.shared_expert_gate.weight"] = w(1, h)
    return t


def _write(path, c, tensors) -> str:
    os.makedirs(path, exist_ok=True)
    save_file(tensors, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(checkpoint.hf_config(c), f)
    return str(path)


def _model(c, seed=7):
    keras.utils.set_random_seed(seed)
    return model_lib.build_model(c)


@pytest.fixture(scope="module")
def moe_checkpoint(tmp_path_factory):
    c = config_lib.tiny()
    tensors = _hf_tensors(c)
    return c, tensors, _write(tmp_path_factory.mktemp("qwen") / "hf", c, tensors)


def _one_line(excinfo) -> str:
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def _np_rms(x, w, eps):
    """`Qwen3_5MoeRMSNorm`: x / rms(x) * (1 + w)."""
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1.0 + w)


def _np_moe_block(x, t, s, top_k):
    """`Qwen3_5MoeSparseMoeBlock.forward` on tokens x [T, hidden] (transformers 5.25.0):
    softmax router, top-k renormalized, experts silu(gate) * up from `gate_up_proj.chunk(2)`,
    plus sigmoid(shared_expert_gate) x the shared SwiGLU expert."""
    silu = lambda v: v / (1.0 + np.exp(-v))  # noqa: E731
    logits = x @ t[s + "mlp.gate.weight"].T
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    gate_up, down = t[s + "mlp.experts.gate_up_proj"], t[s + "mlp.experts.down_proj"]
    for n in range(x.shape[0]):
        top = np.argsort(-probs[n])[:top_k]
        weights = probs[n, top] / probs[n, top].sum()
        for e, r in zip(top, weights, strict=True):
            g, u = np.split(gate_up[e] @ x[n], 2)
            out[n] += r * (down[e] @ (silu(g) * u))
    se = s + "mlp.shared_expert."
    shared = (silu(x @ t[se + "gate_proj.weight"].T) * (x @ t[se + "up_proj.weight"].T)) @ t[
        se + "down_proj.weight"
    ].T
    gate = 1.0 / (1.0 + np.exp(-(x @ t[s + "mlp.shared_expert_gate.weight"].T)))
    return out + gate * shared


@pytest.mark.numerics
def test_import_moe_block_equals_numpy_transcription_of_transformers(moe_checkpoint):
    c, t, path = moe_checkpoint
    model = _model(c)
    before = model(tf.constant(TOKENS)).numpy()
    count = checkpoint.load(path, model, c)
    # Every language-model tensor, one entry each; the vision and MTP tensors are not read.
    assert count == len([n for n in t if n.startswith(P) or n == "lm_head.weight"])
    after = model(tf.constant(TOKENS)).numpy()
    assert np.max(np.abs(after - before)) > 1e-2  # the import did the work
    x = np.random.default_rng(3).normal(0, 1, (1, 5, c.hidden_size)).astype(np.float32)
    for i in (0, 3):  # a DeltaNet layer's and the attention layer's MoE block
        s = f"{P}layers.{i}."
        normed = _np_rms(x[0], t[s + "post_attention_layernorm.weight"], c.rms_norm_eps)
        want = x[0] + _np_moe_block(normed, t, s, c.moe.top_k)
        got = model.decoder_layers[i].feed_forward(tf.constant(x))[0]
        assert_close(got, want, rtol=1e-5)
    np.testing.assert_array_equal(
        model.final_norm.scale.numpy(), t[P + "norm.weight"] + 1.0
    )  # (1 + w) norms
    gated = model.decoder_layers[0].attention.norm.scale.numpy()  # plain w
    np.testing.assert_array_equal(gated, t[P + "layers.0.linear_attn.norm.weight"])


def test_per_expert_layout_imports_as_the_fused_one(moe_checkpoint, tmp_path):
    c, _, path = moe_checkpoint
    per_expert = _write(tmp_path / "per_expert", c, _hf_tensors(c, fused=False))
    a, b = _model(c, 1), _model(c, 2)
    checkpoint.load(path, a, c)
    checkpoint.load(per_expert, b, c)
    for x, y in zip(a.weights, b.weights, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.path)


@pytest.mark.parametrize(
    ("expert_parallel", "model_parallel", "fused"),
    # slow: the other two pairs (each ~2 s at load 3)
    tensor_parallel.crossed_split_cases({"fused": True, "per_expert": False},
                                        default=("per_expert", "fused")),
)  # fmt: skip
def test_a_split_model_imports_the_unsplit_models_whole_tensors(
    moe_checkpoint, tmp_path, fused, expert_parallel, model_parallel
):
    """The import on a model split over 2 logical devices (`--expert_parallel=2`: the routed
    experts, each one written into its replica's shard; `--model_parallel=2`: heads, experts'
    width, shared expert and vocabulary) gives every variable the unsplit import's whole
    tensor, bit for bit."""
    c, _, path = moe_checkpoint
    if not fused:
        path = _write(tmp_path / "per_expert", c, _hf_tensors(c, fused=False))
    bench = Qwen35GrpoBenchmark(dataclasses.replace(Qwen35GrpoBenchmark.preset("smoke"), model=c))

    def load(model):
        checkpoint.load(path, model, c)

    tensor_parallel.assert_split_import_is_whole(
        bench, load, min_split=8 if model_parallel > 1 else 3, expert_parallel=expert_parallel,
        model_parallel=model_parallel,
    )  # fmt: skip


@pytest.mark.peers
@pytest.mark.numerics
def test_dense_variant_logits_equal_keras_hub_converter(tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    c = _dense_config()
    path = _write(tmp_path / "dense", c, _hf_tensors(c, seed=4))
    ours = _model(c)
    checkpoint.load(path, ours, c)
    hub = keras_hub.models.Qwen3_5Backbone.from_preset(path, dtype="float32")
    hidden = hub({"token_ids": tf.constant(TOKENS), "padding_mask": tf.ones_like(TOKENS)})
    want = hub.token_embedding(hidden, reverse=True).numpy()
    got = ours(tf.constant(TOKENS)).numpy()
    assert_close(got, want, rtol=1e-4)


@pytest.mark.peers
@pytest.mark.numerics
def test_moe_model_logits_equal_keras_hub_qwen3_5_moe(moe_checkpoint):
    """The whole MoE model (DeltaNet and gated-attention layers, each with its routed experts
    and gated shared expert) imported from the written checkpoint, against keras-hub's own
    Qwen3.5-MoE (`Qwen3_5MoeBackbone.from_preset` of the same folder: its converter, its
    layers; keras-hub >= 0.32). Measured: 4.5e-5 of logits of scale 4.7."""
    keras_hub = pytest.importorskip("keras_hub")
    if not hasattr(keras_hub.models, "Qwen3_5MoeBackbone"):
        pytest.skip("keras-hub before 0.32 has no Qwen3.5-MoE (the peers extra pins >= 0.32)")
    c, _, path = moe_checkpoint
    ours = _model(c)
    checkpoint.load(path, ours, c)
    hub = keras_hub.models.Qwen3_5MoeBackbone.from_preset(path, dtype="float32")
    assert hub.count_params() == ours.count_params()
    hidden = hub({"token_ids": tf.constant(TOKENS), "padding_mask": tf.ones_like(TOKENS)})
    want = hub.token_embedding(hidden, reverse=True).numpy()
    got = ours(tf.constant(TOKENS)).numpy()
    assert_close(got, want, rtol=1e-4)


def test_checkpoint_of_another_model_is_one_line(moe_checkpoint, tmp_path):
    c, t, _ = moe_checkpoint
    other = dataclasses.replace(c, moe=dataclasses.replace(c.moe, num_experts=8))
    path = _write(tmp_path / "other", other, t)
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(path, _model(c), c)
    assert "`num_experts` is 8" in _one_line(e) and "config.json" in str(e.value)
    dense = _write(tmp_path / "dense", _dense_config(), t)
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(dense, _model(c), c)
    assert "num_experts" in _one_line(e)


def test_missing_tensor_is_one_line_naming_it(moe_checkpoint, tmp_path):
    c, t, _ = moe_checkpoint
    name = P + "layers.2.linear_attn.A_log"
    path = _write(tmp_path / "missing", c, {k: v for k, v in t.items() if k != name})
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(path, _model(c), c)
    assert name in _one_line(e)


def test_wrong_shape_is_one_line_naming_it(moe_checkpoint, tmp_path):
    c, t, _ = moe_checkpoint
    name = P + "layers.3.self_attn.q_proj.weight"
    path = _write(tmp_path / "shape", c, {**t, name: t[name][: t[name].shape[0] // 2]})
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(path, _model(c), c)
    assert name in _one_line(e) and "shape" in str(e.value)


def test_truncated_shard_is_one_line(moe_checkpoint, tmp_path):
    c, t, _ = moe_checkpoint
    path = _write(tmp_path / "truncated", c, t)
    file = os.path.join(path, "model.safetensors")
    os.truncate(file, os.path.getsize(file) - 64)
    with pytest.raises(CheckpointImportError) as e:
        checkpoint.load(path, _model(c), c)
    assert "model.safetensors" in _one_line(e) and "truncated" in str(e.value)


def test_benchmark_restores_init_checkpoint_before_the_run(tmp_path):
    smoke = config_lib.smoke()
    t = _hf_tensors(smoke.model, seed=5)
    path = _write(tmp_path / "init", smoke.model, t)
    bench = Qwen35GrpoBenchmark(dataclasses.replace(smoke, init_checkpoint=path))
    model = bench.build_model()
    bench.restore_initial_weights(model)
    np.testing.assert_array_equal(
        model.token_embedding.embeddings.numpy(), t[P + "embed_tokens.weight"]
    )
    empty = Qwen35GrpoBenchmark(smoke)  # "": the initializers, nothing read
    empty.restore_initial_weights(model)
    bad = Qwen35GrpoBenchmark(dataclasses.replace(smoke, init_checkpoint=str(tmp_path / "none")))
    with pytest.raises(UserError) as e:
        bad.restore_initial_weights(model)
    assert "none" in _one_line(e) and "not a folder" in str(e.value)


def test_config_check_reads_the_release_form_of_config_json():
    """The full model against a `config.json` in the form transformers writes for Qwen3.5-MoE
    (written here by hand): `text_config` without `layer_types` (transformers derives them from
    `full_attention_interval`), an integer `rope_theta` and the M-RoPE fields inside
    `rope_parameters`, `tie_word_embeddings` at the top only."""
    release = {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "vision_config": {"depth": 27},
        "text_config": {
            "model_type": "qwen3_5_moe_text", "vocab_size": 248320, "hidden_size": 4096,
            "num_hidden_layers": 60, "num_attention_heads": 32, "num_key_value_heads": 2,
            "head_dim": 256, "full_attention_interval": 4, "linear_num_key_heads": 16,
            "linear_num_value_heads": 64, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
            "num_experts_per_tok": 10, "moe_intermediate_size": 1024,
            "shared_expert_intermediate_size": 1024, "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                                "partial_rotary_factor": 0.25, "mrope_interleaved": True,
                                "mrope_section": [11, 11, 10]},
        },
    }  # fmt: skip
    full = config_lib.qwen35_397b()
    checkpoint.check_hf_config(release, full, "config.json")
    release["text_config"]["full_attention_interval"] = 3
    with pytest.raises(CheckpointImportError, match="`layer_types`"):
        checkpoint.check_hf_config(release, full, "config.json")
    release["text_config"].update(full_attention_interval=4, num_experts_per_tok=8)
    with pytest.raises(CheckpointImportError, match="`num_experts_per_tok` is 8"):
        checkpoint.check_hf_config(release, full, "config.json")


def test_a_checkpoints_own_tokenizer_and_template_drive_the_rollouts(tmp_path):
    """The `mlperf` path in small: a Hugging Face folder holding the weights and the chat
    (`tokenizer.json`, the template; `tests/tiny_chat.py`) of a model whose vocabulary is not
    the byte chat's. The benchmark checks the chat before loading, imports the weights, and the
    rollouts (the training pipeline of smoke's synthetic tasks) speak the checkpoint's chat:
    each row starts with the template's first turn, pads with its pad id, and the policy's
    tokens are the model's."""
    from benchmarks.qwen35_397b_grpo import input as input_lib
    from tests.tiny_chat import write_chat_checkpoint

    smoke = config_lib.smoke()
    c = dataclasses.replace(smoke.model, vocab_size=512)
    path = _write(tmp_path / "hf", c, _hf_tensors(c, seed=3))
    tok = write_chat_checkpoint(path)
    config = dataclasses.replace(smoke, model=c, init_checkpoint=path)
    bench = Qwen35GrpoBenchmark(config)
    bench.prepare_initial_weights()
    model = bench.build_model()
    bench.restore_initial_weights(model)
    chat = input_lib.make_chat(config)
    assert chat.PAD == tok.token_to_id("<|endoftext|>") and chat.vocab_size == 304
    batch = next(input_lib.rollout_steps(model, config, seed=0))
    tasks = input_lib._tasks(config, 1, config.rollout.task_seed)
    first = chat.start(tasks[0])
    assert tok.decode(first, skip_special_tokens=False).startswith("<|im_start|>user\ntask ")
    ids, mask = batch["input_ids"], batch["token_mask"]
    np.testing.assert_array_equal(ids[0, : len(first)], first)
    policy = ids[0, len(first) : len(first) + config.rollout.max_turn_tokens]
    assert mask[0, len(first) - 1 : len(first) - 1 + len(policy)].all()  # the model's own tokens
    assert (ids[:, -1] == chat.PAD).all()  # short rollouts padded with the checkpoint's pad
