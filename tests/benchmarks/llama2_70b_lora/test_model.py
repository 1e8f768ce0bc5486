"""Tests of the Llama 2 + LoRA model: logits equal keras-hub's `LlamaBackbone` with the weights
of an imported checkpoint (both source layouts), B = 0 gives the base, the base is frozen and
held in its dtype, and the trainable count follows the config."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.llama2_70b_lora import checkpoint
from benchmarks.llama2_70b_lora import config as config_lib
from benchmarks.llama2_70b_lora import model as M
from mlperf_tf.layers import lora as lora_lib
from mlperf_tf.lm.decoder import DecoderModel
from tests.benchmarks.llama2_70b_lora.hf_checkpoints import write_hf_checkpoint
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

# Head 16 and hidden 64: four query heads over two key/value heads (GQA), rope base 10,000.
TINY = dataclasses.replace(config_lib.tiny(96), hidden_size=64, head_dim=16)
LORA = lora_lib.LoraConfig(rank=4, alpha=8.0, dropout=0.0)


def _tokens(batch=2, seq=24, vocab=96, seed=0):
    return tf.constant(np.random.default_rng(seed).integers(0, vocab, (batch, seq)), tf.int32)


def _keras_hub_from_hf(weights, c):
    """keras-hub's `LlamaBackbone` carrying the Hugging Face (torch-layout) weights."""
    keras_hub = pytest.importorskip("keras_hub")
    hub = keras_hub.models.LlamaBackbone(
        vocabulary_size=c.vocab_size, num_layers=c.num_hidden_layers,
        num_query_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
        hidden_dim=c.hidden_size, intermediate_dim=c.intermediate_size,
        rope_max_wavelength=c.rope_theta, layer_norm_epsilon=c.rms_norm_eps, dtype="float32",
    )  # fmt: skip
    h, d = c.hidden_size, c.head_dim
    hub.token_embedding.embeddings.assign(weights["model.embed_tokens.weight"])
    for i, layer in enumerate(hub.transformer_layers):
        p = f"model.layers.{i}."
        att = layer._self_attention_layer
        att._query_dense.kernel.assign(weights[p + "self_attn.q_proj.weight"].T.reshape(h, -1, d))
        att._key_dense.kernel.assign(weights[p + "self_attn.k_proj.weight"].T.reshape(h, -1, d))
        att._value_dense.kernel.assign(weights[p + "self_attn.v_proj.weight"].T.reshape(h, -1, d))
        att._output_dense.kernel.assign(weights[p + "self_attn.o_proj.weight"].T.reshape(-1, d, h))
        layer._feedforward_gate_dense.kernel.assign(weights[p + "mlp.gate_proj.weight"].T)
        layer._feedforward_intermediate_dense.kernel.assign(weights[p + "mlp.up_proj.weight"].T)
        layer._feedforward_output_dense.kernel.assign(weights[p + "mlp.down_proj.weight"].T)
        layer._self_attention_layernorm.scale.assign(weights[p + "input_layernorm.weight"])
        layer._feedforward_layernorm.scale.assign(weights[p + "post_attention_layernorm.weight"])
    hub.layer_norm.scale.assign(weights["model.norm.weight"])
    return hub


@pytest.mark.peers
@pytest.mark.parametrize("fused", [True, False])
def test_imported_checkpoint_gives_keras_hub_llama_logits(tmp_path, fused):
    """HF or MLCommons checkpoint -> prepare's import -> our model: the logits of keras-hub's
    `LlamaBackbone` (plain RoPE, GQA, RMSNorm) with the same weights, times the output kernel."""
    weights = write_hf_checkpoint(str(tmp_path / "src"), TINY, fused=fused, seed=3)
    checkpoint.import_checkpoint(str(tmp_path / "src"), str(tmp_path / "base"), TINY)
    keras.utils.set_random_seed(1)
    ours = M.build_model(TINY, LORA)
    assert M.load_base(ours, str(tmp_path / "base"), TINY) > 0
    hub = _keras_hub_from_hf(weights, TINY)
    tokens = _tokens(seed=4)
    hidden = hub({"token_ids": tokens, "padding_mask": tf.ones_like(tokens)})
    expected = tf.matmul(hidden, weights["lm_head.weight"].T)
    assert_close(ours(tokens), expected, rtol=1e-5)


def test_b_zero_is_the_base_and_b_moves_it():
    keras.utils.set_random_seed(2)
    ours = M.build_model(TINY, LORA)
    keras.utils.set_random_seed(2)
    base = DecoderModel(TINY, name="base")
    base.build()
    base_vars = {v.path.split("/", 1)[1]: v for v in base.variables}
    for v in ours.variables:
        if not lora_lib.is_adapter_variable(v):
            v.assign(base_vars[v.path.split("/", 1)[1]].numpy())
    tokens = _tokens(seed=5)
    assert_close(ours(tokens), base(tokens), rtol=1e-6)
    # B != 0 on one o_proj: the logits move (the adapter is wired in).
    o = ours.decoder_layers[1].attention.o_proj.lora
    o.lora_b.assign(np.full(o.lora_b.shape, 0.05, np.float32))
    assert np.abs(ours(tokens).numpy() - base(tokens).numpy()).max() > 1e-3


def test_only_adapters_trainable_and_count_from_config():
    ours = M.build_model(TINY, LORA)
    names = {v.path.rsplit("/", 1)[-1] for v in ours.trainable_variables}
    assert names == {"lora_a", "lora_b"}
    counted = sum(int(np.prod(v.shape)) for v in ours.trainable_variables)
    assert counted == lora_lib.trainable_parameters(LORA, TINY.projections())
    assert ours.count_params() == TINY.parameter_count() + counted


def test_mlperf_trainable_count_without_allocating():
    c = config_lib.mlperf()
    trainable = lora_lib.trainable_parameters(c.lora, c.model.projections())
    assert trainable == 44_564_480  # 44.56 M: r (in + out) on qkv and o in 80 blocks
    assert c.model.parameter_count() == 68_976_648_192


@pytest.mark.bfloat16
def test_base_held_in_bfloat16_adapters_in_float32():
    c = dataclasses.replace(TINY, base_dtype="bfloat16")
    ours = M.build_model(c, LORA)
    dtypes = {v.path.split("/", 1)[1]: v.dtype for v in ours.variables}
    assert dtypes["decoder_0/attention/qkv_proj/kernel"] == "bfloat16"
    assert dtypes["decoder_0/mlp/down_proj/kernel"] == "bfloat16"
    assert dtypes["token_embedding/embeddings"] == "bfloat16"
    assert dtypes["decoder_0/attention_norm/scale"] == "float32"
    assert dtypes["decoder_0/attention/qkv_proj/lora/lora_a"] == "float32"
    assert ours(_tokens()).shape == (2, 24, 96)


def test_unknown_target_is_a_config_error():
    with pytest.raises(config_lib.ConfigError, match="lora.targets"):
        M.build_model(TINY, lora_lib.LoraConfig(targets=("query",)))
