"""Provides `copy_decoder_into`: our decoder's weights (`mlperf_tf.lm.DecoderModel`) written into a
keras-hub Llama-family backbone, for tests that compare the two on the same weights."""


def copy_decoder_into(hub, ours, *, hidden_size: int, head_dim: int):
    """Assigns `ours`' embedding, attention, SwiGLU and norm weights to keras-hub backbone `hub`
    (`Llama3Backbone`, `MistralBackbone`: the same transformer layer); returns `hub`.

    keras-hub keeps its attention kernels per head (einsum dense: [hidden, heads, head_dim] and
    [heads, head_dim, hidden]) where ours are flat [hidden, heads * head_dim]; the rest match.
    Our lm_head is not copied: the backbones end at the final norm.
    """
    h, d = hidden_size, head_dim
    hub.token_embedding.embeddings.assign(ours.token_embedding.embeddings.numpy())
    for layer, hub_layer in zip(ours.decoder_layers, hub.transformer_layers, strict=True):
        att, hub_att = layer.attention, hub_layer._self_attention_layer
        hub_att._query_dense.kernel.assign(att.q_proj.kernel.numpy().reshape(h, -1, d))
        hub_att._key_dense.kernel.assign(att.k_proj.kernel.numpy().reshape(h, -1, d))
        hub_att._value_dense.kernel.assign(att.v_proj.kernel.numpy().reshape(h, -1, d))
        hub_att._output_dense.kernel.assign(att.o_proj.kernel.numpy().reshape(-1, d, h))
        hub_layer._feedforward_gate_dense.kernel.assign(layer.mlp.gate_proj.kernel.numpy())
        hub_layer._feedforward_intermediate_dense.kernel.assign(layer.mlp.up_proj.kernel.numpy())
        hub_layer._feedforward_output_dense.kernel.assign(layer.mlp.down_proj.kernel.numpy())
        hub_layer._self_attention_layernorm.scale.assign(layer.attention_norm.scale.numpy())
        hub_layer._feedforward_layernorm.scale.assign(layer.mlp_norm.scale.numpy())
    hub.layer_norm.scale.assign(ours.final_norm.scale.numpy())
    return hub
