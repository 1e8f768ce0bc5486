"""The FLUX.1 MMDiT: parameter count from the config, patching and rotary positions against the
reference's formulas, and the forward pass against keras-hub's `FluxBackbone` on the same
weights once the documented differences are aligned."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from benchmarks.flux1 import config as config_lib
from benchmarks.flux1 import model as model_lib


def test_mlperf_parameter_count_is_flux_schnell():
    """11.9 B (text_to_image/README.md), counted without building anything."""
    assert config_lib.flux_schnell().parameter_count() == 11_891_178_560


@pytest.mark.parametrize("make", [config_lib.tiny, lambda: config_lib.mini().model])
def test_parameter_count_matches_a_built_model(make):
    config = make()
    model = model_lib.build_model(config)
    assert model.count_params() == config.parameter_count()


def test_parameter_count_follows_qkv_bias():
    config = dataclasses.replace(config_lib.tiny(), qkv_bias=False)
    assert model_lib.build_model(config).count_params() == config.parameter_count()
    assert config.parameter_count() == config_lib.tiny().parameter_count() - 2 * 3 * 32


def test_patching_is_the_references_einops_order():
    """`b c (h ph) (w pw) -> b (h w) (c ph pw)` on the channels-first latent."""
    rng = np.random.default_rng(0)
    latent = rng.normal(size=(2, 3, 4, 6)).astype(np.float32)  # [b, c, H, W]
    b, c, height, width = latent.shape
    want = latent.reshape(b, c, height // 2, 2, width // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    want = want.reshape(b, (height // 2) * (width // 2), c * 4)
    got = model_lib.pack_latents(tf.constant(latent.transpose(0, 2, 3, 1)))
    np.testing.assert_array_equal(got.numpy(), want)
    back = model_lib.unpack_latents(got, height, width).numpy()
    np.testing.assert_array_equal(back, latent.transpose(0, 2, 3, 1))


def test_rope_is_the_references_rotation():
    """math.py: pairs (x0, x1) -> (cos x0 - sin x1, sin x0 + cos x1), angle pos x theta^(-2j/a)
    per axis; text at (0, 0, 0) is not rotated."""
    axes, theta = (4, 6, 6), 10_000.0
    ids = model_lib.position_ids(2, 2, 3).numpy()
    assert ids.shape == (8, 3) and (ids[:2] == 0).all() and tuple(ids[-1]) == (0, 1, 2)
    angles = model_lib.rope_angles(tf.constant(ids), axes, theta).numpy()
    want = np.concatenate(
        [ids[:, i : i + 1] * theta ** (-np.arange(0, a, 2) / a) for i, a in enumerate(axes)], -1
    )
    np.testing.assert_allclose(angles, want, rtol=1e-6)
    x = np.random.default_rng(1).normal(size=(1, 1, 8, 16)).astype(np.float32)
    rotation = model_lib.rope_rotation(tf.constant(angles))
    out = model_lib.apply_rope(tf.constant(x), rotation).numpy()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    np.testing.assert_allclose(out[..., 0::2], np.cos(want) * x0 - np.sin(want) * x1, atol=1e-5)
    np.testing.assert_allclose(out[..., 1::2], np.sin(want) * x0 + np.cos(want) * x1, atol=1e-5)
    np.testing.assert_array_equal(out[:, :, :2], x[:, :, :2])


def test_initialization_is_the_references():
    """Zero modulation and output layers (DiT), N(0, 0.02) embedders, Xavier over the fused
    qkv fan: the untrained model predicts 0."""
    model = model_lib.build_model(config_lib.mini().model)
    block = model.double_blocks[0]
    assert not np.any(block.img.mod.lin.kernel.numpy())
    assert not np.any(model.final_layer.linear.kernel.numpy())
    std = np.std(model.time_in.in_layer.kernel.numpy())
    assert 0.015 < std < 0.025
    h = 128
    limit = np.sqrt(6 / (h + 3 * h))  # xavier_uniform_ on the fused [3h, h] weight
    q = block.img.qkv.q.kernel.numpy()
    assert limit * 0.9 < np.abs(q).max() <= limit


def _randomize(model, seed=0):
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        variable.assign(rng.normal(scale=0.2, size=variable.shape).astype(np.float32))


def _copy_to_keras_hub(ours, hub):
    """Our weights into keras-hub's layers (q, k, v and linear1/linear2 parts concatenated)."""

    def dense(target, kernel, bias):
        target.kernel.assign(kernel)
        target.bias.assign(bias)

    def cat(layers, axis=1):
        return (np.concatenate([x.kernel.numpy() for x in layers], axis),
                np.concatenate([x.bias.numpy() for x in layers], 0))  # fmt: skip

    for mine, theirs in ((ours.img_in, hub.image_input_embedder),
                         (ours.txt_in, hub.text_input_embedder)):  # fmt: skip
        dense(theirs, mine.kernel, mine.bias)
    for mine, theirs in ((ours.time_in, hub.time_input_embedder),
                         (ours.vector_in, hub.vector_embedder)):  # fmt: skip
        dense(theirs.input_layer, mine.in_layer.kernel, mine.in_layer.bias)
        dense(theirs.output_layer, mine.out_layer.kernel, mine.out_layer.bias)
    for mine, theirs in zip(ours.double_blocks, hub.double_blocks, strict=True):
        for stream, attn, mod, mlp in ((mine.img, theirs.image_attn, theirs.image_mod,
                                        theirs.image_mlp),
                                       (mine.txt, theirs.text_attn, theirs.text_mod,
                                        theirs.text_mlp)):  # fmt: skip
            dense(mod.linear_projection, stream.mod.lin.kernel, stream.mod.lin.bias)
            dense(attn.qkv, *cat([stream.qkv.q, stream.qkv.k, stream.qkv.v]))
            attn.norm.query_norm.scale.assign(stream.qkv.query_norm.scale)
            attn.norm.key_norm.scale.assign(stream.qkv.key_norm.scale)
            dense(attn.proj, stream.proj.kernel, stream.proj.bias)
            dense(mlp.layers[0], stream.mlp_in.kernel, stream.mlp_in.bias)
            dense(mlp.layers[2], stream.mlp_out.kernel, stream.mlp_out.bias)
    for mine, theirs in zip(ours.single_blocks, hub.single_blocks, strict=True):
        q = mine.qkv
        dense(theirs.linear1, *cat([q.q, q.k, q.v, mine.mlp_in]))
        linear2 = np.concatenate(
            [mine.linear2.attn_kernel.numpy(), mine.linear2.mlp_kernel.numpy()]
        )
        dense(theirs.linear2, linear2, mine.linear2.bias)
        theirs.norm.query_norm.scale.assign(q.query_norm.scale)
        theirs.norm.key_norm.scale.assign(q.key_norm.scale)
        dense(theirs.modulation.linear_projection, mine.mod.lin.kernel, mine.mod.lin.bias)
    dense(hub.final_layer.adaLN_modulation.layers[1], ours.final_layer.ada.kernel,
          ours.final_layer.ada.bias)  # fmt: skip
    dense(hub.final_layer.linear, ours.final_layer.linear.kernel, ours.final_layer.linear.bias)


def test_forward_matches_keras_hub_flux_backbone_on_the_same_weights():
    """Aligned differences (README.md): keras-hub's double-stream MLPs use exact GELU (the
    reference and its single blocks: tanh) -> set to tanh; its QK RMSNorm adds 1e-6 (the
    reference: float32 machine epsilon) -> ours at 1e-6; its LayerNorms have an affine
    gamma/beta (the reference: none) -> left at their identity init; it fuses q, k, v (and
    linear1/linear2) -> weights concatenated. Same weights, same inputs: same velocity."""
    keras_hub = pytest.importorskip("keras_hub")
    config = dataclasses.replace(config_lib.tiny(), depth=2, depth_single_blocks=2,
                                 qk_norm_epsilon=1e-6)  # fmt: skip
    ours = model_lib.build_model(config)
    _randomize(ours)
    grid, text = (4, 4), 5
    n = grid[0] * grid[1]
    hub = keras_hub.models.FluxBackbone(
        input_channels=config.in_channels, hidden_size=config.hidden_size,
        mlp_ratio=config.mlp_ratio, num_heads=config.num_heads, depth=config.depth,
        depth_single_blocks=config.depth_single_blocks, axes_dim=list(config.axes_dim),
        theta=config.theta, use_bias=config.qkv_bias, image_shape=(n, config.in_channels),
        text_shape=(text, config.context_in_dim), image_ids_shape=(n, 3),
        text_ids_shape=(text, 3), y_shape=(config.vec_in_dim,),
    )  # fmt: skip
    for block in hub.double_blocks:
        for mlp in (block.image_mlp, block.text_mlp):
            mlp.layers[1].activation = lambda x: keras.activations.gelu(x, approximate=True)
    _copy_to_keras_hub(ours, hub)
    rng = np.random.default_rng(3)
    latents = rng.normal(size=(2, 2 * grid[0], 2 * grid[1], 4)).astype(np.float32)
    t5 = rng.normal(size=(2, text, config.context_in_dim)).astype(np.float32)
    clip = rng.normal(size=(2, config.vec_in_dim)).astype(np.float32)
    t = np.array([0.25, 0.8], np.float32)
    mine = ours({"latents": latents, "t5": t5, "clip": clip, "timesteps": t})
    mine = model_lib.pack_latents(mine).numpy()
    ids = model_lib.position_ids(text, *grid).numpy()
    theirs = hub({
        "image": model_lib.pack_latents(tf.constant(latents)).numpy(),
        "image_ids": np.broadcast_to(ids[text:], (2, n, 3)), "text": t5,
        "text_ids": np.broadcast_to(ids[:text], (2, text, 3)), "y": clip, "timesteps": t,
        "guidance": np.zeros(2, np.float32),
    })  # fmt: skip
    theirs = np.asarray(theirs)
    scale = np.abs(theirs).max()
    assert scale > 0.1  # a real signal, not the zero-initialized output
    np.testing.assert_allclose(mine, theirs, atol=2e-5 * scale, rtol=0)
