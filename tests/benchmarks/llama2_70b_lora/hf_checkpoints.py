"""Provides `write_hf_checkpoint`: tiny Llama checkpoints in the Hugging Face layout (separate
q/k/v) or the MLCommons one (fused `qkv_proj`, q|k|v along its rows), safetensors shards with an
index, from NumPy weights in torch's [out, in] layout."""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf
from safetensors.tensorflow import save_file

from benchmarks.llama2_70b_lora.config import ModelConfig


def hf_config(model: ModelConfig, **overrides) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"], "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size, "num_hidden_layers": model.num_hidden_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads, "vocab_size": model.vocab_size,
        "rms_norm_eps": model.rms_norm_eps, "rope_theta": model.rope_theta, "rope_scaling": None,
        "tie_word_embeddings": False, "max_position_embeddings": model.max_position_embeddings,
    }  # fmt: skip
    config.update(overrides)
    return config


def random_weights(model: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """torch-named, torch-shaped ([out, in]) float32 weights with q/k/v apart."""
    rng = np.random.default_rng(seed)
    h, f, v = model.hidden_size, model.intermediate_size, model.vocab_size
    q, kv = model.num_attention_heads * model.head_dim, model.num_key_value_heads * model.head_dim

    def w(*shape):
        return (rng.normal(size=shape) * 0.1).astype(np.float32)

    weights = {"model.embed_tokens.weight": w(v, h), "model.norm.weight": 1 + w(h),
               "lm_head.weight": w(v, h)}  # fmt: skip
    for i in range(model.num_hidden_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": 1 + w(h), p + "post_attention_layernorm.weight": 1 + w(h),
            p + "self_attn.q_proj.weight": w(q, h), p + "self_attn.k_proj.weight": w(kv, h),
            p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, q),
            p + "mlp.gate_proj.weight": w(f, h), p + "mlp.up_proj.weight": w(f, h),
            p + "mlp.down_proj.weight": w(h, f),
        })  # fmt: skip
    return weights


def fuse(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The MLCommons layout: each layer's q, k, v weights stacked as `self_attn.qkv_proj`."""
    out = {}
    for name, value in weights.items():
        if name.endswith("self_attn.q_proj.weight"):
            p = name[: -len("q_proj.weight")]
            out[p + "qkv_proj.weight"] = np.concatenate(
                [value, weights[p + "k_proj.weight"], weights[p + "v_proj.weight"]], 0
            )
        elif not name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            out[name] = value
    return out


def write_hf_checkpoint(
    directory: str,
    model: ModelConfig,
    *,
    fused: bool,
    seed: int = 0,
    shards: int = 2,
    dtype=tf.float32,
    config: dict | None = None,
) -> dict:
    """Writes a checkpoint folder; returns the torch-layout weights (q/k/v apart) it holds."""
    weights = random_weights(model, seed)
    stored = fuse(weights) if fused else weights
    os.makedirs(directory, exist_ok=True)
    names = sorted(stored)
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tf.cast(stored[n], dtype) for n in names[s::shards]}
        save_file(part, os.path.join(directory, file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(directory, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {}, "weight_map": weight_map}, handle)
    with open(os.path.join(directory, "config.json"), "w") as handle:
        json.dump(config or hf_config(model), handle)
    return weights
