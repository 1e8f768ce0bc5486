"""Provides DeepSeek-V3's Hugging Face checkpoint layout: the `config.json` of a model config
(`hf_config`), the name map from Hugging Face tensor names to the model's variables
(`entries`), the import through the shared importer (`load`, `mlperf_tf.hf_checkpoint`) and the
export in that layout (`export`: the `mini` preset's base, and the tests' tiny checkpoints).

The names are the Hugging Face release's (`deepseek-ai/DeepSeek-V3`, and MLCommons' checkpoint
after its 50 warm-up steps, converted by Megatron-Bridge with `deepseek_mtp_module_conversion.
patch`): `model.embed_tokens`, `model.layers.{i}.{input_layernorm, self_attn.{q_a_proj,
q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj},
post_attention_layernorm}`, a dense block's `mlp.{gate,up,down}_proj`, an MoE block's
`mlp.gate.weight`, `mlp.gate.e_score_correction_bias` (the selection bias),
`mlp.experts.{e}.{gate,up,down}_proj` and `mlp.shared_experts.{gate,up,down}_proj`, `model.norm`,
`lm_head`; the MTP depth k is layer `num_hidden_layers + k - 1` with `enorm`, `hnorm`, `eh_proj`,
`shared_head.norm` beside its block's names (its `embed_tokens` and `shared_head.head` copies
are the main model's, not read). Linear weights are torch's [out, in], transposed into Keras
kernels [in, out]; FP8 weights with `weight_scale_inv` are dequantized by the importer.
"""

from __future__ import annotations

import json
import os

import numpy as np
from safetensors.numpy import save_file

from benchmarks.deepseekv3_671b.config import ModelConfig
from mlperf_tf import hf_checkpoint, prepare_cli
from mlperf_tf.hf_checkpoint import CheckpointImportError, Entry, transposed, whole_shape
from mlperf_tf.lm.parametrization import ScaledWeights

ARCHITECTURE = "DeepseekV3ForCausalLM"


def hf_config(model: ModelConfig) -> dict:
    """The Hugging Face `config.json` fields (`DeepseekV3Config`) of `model`."""
    m = model.moe
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "deepseek_v3",
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "moe_intermediate_size": m.filter_size,
        "num_hidden_layers": model.num_hidden_layers,
        "num_nextn_predict_layers": model.mtp_layers,
        "num_attention_heads": model.num_attention_heads,
        "n_shared_experts": 1 if m.shared_filter_size else 0,
        "n_routed_experts": m.num_experts,
        "num_experts_per_tok": m.top_k,
        "n_group": m.num_groups,
        "topk_group": m.topk_groups,
        "routed_scaling_factor": m.routed_scaling,
        "first_k_dense_replace": m.first_dense,
        "moe_layer_freq": m.every,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "norm_topk_prob": True,
        "q_lora_rank": model.q_lora_rank or None,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_nope_head_dim,
        "qk_rope_head_dim": model.qk_rope_head_dim,
        "v_head_dim": model.v_head_dim,
        "rms_norm_eps": model.rms_norm_eps,
        "rope_theta": model.rope_theta,
        "tie_word_embeddings": model.tie_word_embeddings,
        "max_position_embeddings": model.max_position_embeddings,
    }


# The fields a checkpoint must share with the run's model (the rest describe inference).
CHECKED_FIELDS = (
    "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
    "num_hidden_layers", "num_attention_heads", "n_shared_experts", "n_routed_experts",
    "first_k_dense_replace", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "v_head_dim", "tie_word_embeddings",
)  # fmt: skip


def check_hf_config(config: dict, model: ModelConfig, path: str) -> None:
    """Raises CheckpointImportError naming the first field of `config.json` that is another
    model's (another vocabulary: DeepSeek's own 129,280 release is not the benchmark's)."""
    want = hf_config(model)
    if model.mtp_layers and config.get("num_nextn_predict_layers", 0) < model.mtp_layers:
        raise CheckpointImportError(
            f"checkpoint config {path!r}: `num_nextn_predict_layers` is "
            f"{config.get('num_nextn_predict_layers', 0)!r}, the model needs {model.mtp_layers}"
        )
    hf_checkpoint.check_config(
        config, {k: want[k] for k in CHECKED_FIELDS}, path,
        defaults={"tie_word_embeddings": False},
        hint="a checkpoint of another model or vocabulary; --config.model.* sets the model",
    )  # fmt: skip


def _block_entries(block, src: str, model: ModelConfig) -> list[Entry]:
    """Entries of one `DecoderBlock` under Hugging Face prefix `src` ("model.layers.{i}.")."""
    h = model.hidden_size
    a, out = block.attention, []

    def kernel(name, layer):
        out.append(Entry(src + name + ".weight", whole_shape(layer.kernel), layer.kernel,
                         transposed))  # fmt: skip

    def norm(name, layer):
        out.append(Entry(src + name + ".weight", whole_shape(layer.scale), layer.scale))

    norm("input_layernorm", block.attention_norm)
    if model.q_lora_rank:
        kernel("self_attn.q_a_proj", a.q_a_proj)
        norm("self_attn.q_a_layernorm", a.q_a_layernorm)
        kernel("self_attn.q_b_proj", a.q_b_proj)
    else:
        kernel("self_attn.q_proj", a.q_proj)
    kernel("self_attn.kv_a_proj_with_mqa", a.kv_a_proj_with_mqa)
    norm("self_attn.kv_a_layernorm", a.kv_a_layernorm)
    kernel("self_attn.kv_b_proj", a.kv_b_proj)
    kernel("self_attn.o_proj", a.o_proj)
    norm("post_attention_layernorm", block.mlp_norm)
    mlp = block.mlp
    if not block.is_moe:
        for part in ("gate_proj", "up_proj", "down_proj"):
            kernel("mlp." + part, getattr(mlp, part))
        return out
    e = mlp.num_experts
    out.append(Entry(src + "mlp.gate.weight", (h, e), mlp.router_kernel, transposed))
    out.append(Entry(src + "mlp.gate.e_score_correction_bias", (e,), mlp.router_bias))
    for part, var in (("gate_proj", mlp.w_gate), ("up_proj", mlp.w_up), ("down_proj", mlp.w_down)):
        for i in range(e):
            name = f"{src}mlp.experts.{i}.{part}.weight"
            out.append(Entry(name, whole_shape(var)[1:], (var, i), transposed))
    if mlp.shared_filter_size:
        for part, var in (("gate_proj", mlp.shared_gate), ("up_proj", mlp.shared_up),
                          ("down_proj", mlp.shared_down)):  # fmt: skip
            out.append(Entry(f"{src}mlp.shared_experts.{part}.weight", whole_shape(var), var,
                             transposed))  # fmt: skip
    return out


def entries(keras_model, model: ModelConfig) -> list[Entry]:
    """DeepSeek-V3's name map onto a built model of `model` (targets: a variable, or (variable,
    expert) for one expert of a stacked [E, ...] weight)."""
    out = [
        Entry(
            "model.embed_tokens.weight",
            (model.vocab_size, model.hidden_size),
            keras_model.token_embedding.embeddings,
        )  # fmt: skip
    ]
    for i, block in enumerate(keras_model.decoder_layers):
        out += _block_entries(block, f"model.layers.{i}.", model)
    for k, module in enumerate(keras_model.mtp):
        src = f"model.layers.{model.num_hidden_layers + k}."
        out += _block_entries(module.block, src, model)
        for name, layer in (("enorm", module.enorm), ("hnorm", module.hnorm),
                            ("shared_head.norm", module.shared_head_norm)):  # fmt: skip
            out.append(Entry(src + name + ".weight", whole_shape(layer.scale), layer.scale))
        kernel = module.eh_proj.kernel
        out.append(Entry(src + "eh_proj.weight", whole_shape(kernel), kernel, transposed))
    out.append(Entry("model.norm.weight", (model.hidden_size,), keras_model.final_norm.scale))
    kernel = keras_model.lm_head.kernel
    out.append(Entry("lm_head.weight", whole_shape(kernel), kernel, transposed))
    return out


def load(directory: str, keras_model, model: ModelConfig) -> int:
    """Loads the Hugging Face checkpoint `directory` into `keras_model` (built from `model`, on
    any mesh: each replica takes its shard of each whole tensor), shard by shard; returns the
    tensors loaded.

    Raises:
      CheckpointImportError: another model's config, a missing or truncated shard, a tensor
        missing or of another shape.
    """
    source = hf_checkpoint.HFCheckpoint(directory)
    check_hf_config(source.config(), model, os.path.join(directory, hf_checkpoint.CONFIG))
    count = source.load(entries(keras_model, model), hf_checkpoint.assign)
    if isinstance(keras_model, ScaledWeights):  # the file holds effective weights
        keras_model.store_scaled()
    return count


def export(keras_model, model: ModelConfig, out_dir: str, *, shards: int = 2,
           dtype=np.float32) -> dict:  # fmt: skip
    """Writes `keras_model` (its effective weights, when parametrized) as a Hugging Face
    DeepSeek-V3 folder (`config.json`,
    `model.safetensors.index.json`, `shards` safetensors files of `dtype`), staged: a reader
    never sees half of it. Returns a summary (tensors, shards)."""
    scaled = isinstance(keras_model, ScaledWeights)
    tensors = {}
    for entry in entries(keras_model, model):
        variable, index = entry.target if isinstance(entry.target, tuple) else (entry.target, ())
        value = variable[index].numpy()
        if scaled and variable.trainable:  # the effective weight, as the plain model's
            value = value * keras_model.weight_scale
        if entry.convert is transposed:
            value = value.T
        tensors[entry.name] = np.ascontiguousarray(value).astype(dtype)
    names = list(tensors)
    per_shard = -(-len(names) // shards)
    with prepare_cli.staged_folder(os.path.abspath(out_dir)) as staging:
        weight_map = {}
        for s in range(shards):
            part = names[s * per_shard : (s + 1) * per_shard]
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({n: tensors[n] for n in part}, os.path.join(staging, file),
                      metadata={"format": "pt"})  # fmt: skip
            weight_map.update(dict.fromkeys(part, file))
        with open(os.path.join(staging, hf_checkpoint.INDEX), "w", encoding="utf-8") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
        with open(os.path.join(staging, hf_checkpoint.CONFIG), "w", encoding="utf-8") as f:
            json.dump(hf_config(model), f, indent=1)
    return {"tensors": len(names), "shards": shards}
