"""DlrmHstu against a NumPy transcription of the reference's PyTorch formulas, block by block.

The transcription works as the reference does, on jagged values with offsets (one row per real
token, no padding): `ops/pytorch/pt_hstu_attention.py` (`pytorch_hstu_mha`,
`_get_valid_attn_mask`), `pt_hstu_linear.py` (`pytorch_hstu_compute_output`),
`ops/hstu_compute.py` (`hstu_compute_uqvk`), `pt_position.py`
(`pytorch_add_timestamp_positional_embeddings`, `_get_col_indices`), `modules/preprocessors.py`
(`ContextualPreprocessor`), `modules/action_encoder.py`, `modules/postprocessors.py`
(`TimestampLayerNormPostprocessor`) and `modules/dlrm_hstu.py` (item MLP, prediction head), all
at commit a67b8459 of mlcommons/training `recommendation_v4/`. Same weights (read from the Keras
model), a tiny configuration, histories of several lengths.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.dlrmv4 import config as config_lib
from benchmarks.dlrmv4 import input as input_lib
from benchmarks.dlrmv4 import model as model_lib

pytestmark = pytest.mark.numerics


# ---- NumPy transcription (float64) ---------------------------------------------------------------
def ln(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * w + b


def silu(x):
    return x / (1 + np.exp(-x))


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def mlp(x, w, prefix, final_norm=True):
    """nn.Sequential(Linear, SwishLayerNorm, Linear[, LayerNorm])."""
    h = x @ w[prefix + "/w1"] + w[prefix + "/b1"]
    h = h * sigmoid(ln(h, w[prefix + "/swish_ln_gamma"], w[prefix + "/swish_ln_beta"], 1e-5))
    y = h @ w[prefix + "/w2"] + w[prefix + "/b2"]
    return ln(y, w[prefix + "/ln_gamma"], w[prefix + "/ln_beta"], 1e-5) if final_norm else y


def valid_attn_mask(n, seq_lengths, num_targets):
    """`_get_valid_attn_mask(causal=True, num_targets, max_attn_len=0, contextual_seq_len=0)`."""
    ids = np.arange(n).reshape(1, n)
    max_ids = seq_lengths.reshape(-1, 1, 1) - num_targets.reshape(-1, 1, 1)
    ids = np.minimum(ids, max_ids)  # [B, 1, N]
    row_ids = np.broadcast_to(ids.reshape(-1, n, 1), (len(seq_lengths), n, n))
    col_ids = np.broadcast_to(ids.reshape(-1, 1, n), (len(seq_lengths), n, n))
    dist = row_ids - col_ids
    return np.logical_or(np.eye(n, dtype=bool)[None], dist > 0)


def jagged_to_padded(values, offsets, n):
    out = np.zeros((len(offsets) - 1, n) + values.shape[1:])
    for b in range(len(offsets) - 1):
        out[b, : offsets[b + 1] - offsets[b]] = values[offsets[b] : offsets[b + 1]]
    return out


def padded_to_jagged(padded, offsets):
    return np.concatenate(
        [padded[b, : offsets[b + 1] - offsets[b]] for b in range(len(offsets) - 1)]
    )


def hstu_mha(n, alpha, q, k, v, offsets, num_targets):
    """`pytorch_hstu_mha` (attn_scale None, no dropout): jagged [L, H, d] in and out."""
    length, h, _ = q.shape
    pq, pk, pv = (jagged_to_padded(t, offsets, n).transpose(0, 2, 1, 3) for t in (q, k, v))
    qk = np.einsum("bhxa,bhya->bhxy", pq, pk) * alpha
    qk = silu(qk) / n
    mask = valid_attn_mask(n, np.diff(offsets), num_targets)
    qk = qk * mask[:, None]
    attn = np.einsum("bhxd,bhdv->bhxv", qk, pv).transpose(0, 2, 1, 3)  # [B, N, H, V]
    return padded_to_jagged(attn.reshape(attn.shape[0], n, -1), offsets).reshape(length, h, -1)


def stu_layer(x, w, prefix, c, n, offsets, num_targets):
    """`hstu_compute_uqvk` + `pytorch_hstu_mha` + `pytorch_hstu_compute_output`
    (concat_u, concat_x, layer norm, no dropout)."""
    h, dv, dq = c.num_heads, c.attn_linear_dim, c.attn_qk_dim
    normed = ln(x, w[prefix + "/input_norm_gamma"], w[prefix + "/input_norm_beta"], 1e-6)
    uvqk = normed @ w[prefix + "/uvqk"] + w[prefix + "/uvqk_beta"]
    u, v, q, k = np.split(uvqk, np.cumsum([h * dv, h * dv, h * dq])[:3], axis=1)
    u = silu(u)
    attn = hstu_mha(
        n, 1 / math.sqrt(dq), q.reshape(-1, h, dq), k.reshape(-1, h, dq), v.reshape(-1, h, dv),
        offsets, num_targets,
    ).reshape(-1, h * dv)  # fmt: skip
    y = u * ln(attn, w[prefix + "/output_norm_gamma"], w[prefix + "/output_norm_beta"], 1e-6)
    return x + np.concatenate([u, attn, y], axis=1) @ w[prefix + "/output_weight"]


def col_indices(n, c_len, max_pos, seq_lengths, num_targets):
    """`_get_col_indices(interleave_targets=False)`."""
    col = np.broadcast_to(np.arange(n), (len(seq_lengths), n)).copy()
    high = seq_lengths - num_targets
    col = np.minimum(col, high.reshape(-1, 1))
    col = high.reshape(-1, 1) - col
    col = col + c_len
    col = np.minimum(col, max_pos - 1)
    col[:, :c_len] = np.arange(c_len)
    return col


def add_positional(seq, offsets, pos_emb, ts_emb, timestamps, n, c_len, num_targets, alpha):
    """`add_timestamp_positional_embeddings` (seq * alpha) then the PyTorch kernel (sqrt)."""
    seq = seq * alpha
    lengths = np.diff(offsets)
    pos = col_indices(n, c_len, pos_emb.shape[0], lengths, num_targets)
    num_time = ts_emb.shape[0] - 1
    padded_t = jagged_to_padded(timestamps.astype(np.float64), offsets, n)
    query = padded_t[np.arange(len(lengths)), np.maximum(lengths - 1, 0)][:, None]
    ts = np.maximum(query - padded_t, 1e-6) / 60.0
    ts = np.clip(np.maximum(np.sqrt(ts), 0).astype(np.int64), 0, num_time)
    summed = jagged_to_padded(seq, offsets, n) + ts_emb[ts] + pos_emb[pos]
    return padded_to_jagged(summed, offsets)


def reference_forward(w, c, batch, n):
    """DlrmHSTU's forward (training=False) in the reference's jagged form: the logits [B],
    and the positional encoder's jagged output."""
    t = {k: np.asarray(v) for k, v in batch.items()}
    tables = {name: w[model_lib.SPARSE_PREFIX + name].astype(np.float64)
              for name in c.table_rows()}  # fmt: skip
    lengths = t["uih_length"]
    bsz = len(lengths)

    def merged(key, cand):  # the merged jagged values: UIH events, then the candidate
        return np.concatenate(
            [np.concatenate([t[key][b, : lengths[b]], [t[cand][b]]]) for b in range(bsz)]
        )

    item = tables["item_id"][merged("uih_item", "cand_item")]
    artist = tables["artist_id"][merged("uih_artist", "cand_artist")]
    album = tables["album_id"][merged("uih_album", "cand_album")]
    seq = mlp(item, w, "dlrm_hstu/content_mlp")
    seq = seq + mlp(np.concatenate([artist, album], 1), w, "dlrm_hstu/additional_mlp")
    # ActionEncoder: exploded bits x table for history events, the target table for candidates.
    bits = np.array([1, 2, 4])
    act_rows = []
    for b in range(bsz):
        a = t["uih_action"][b, : lengths[b]]
        exploded = (np.bitwise_and(a[:, None], bits[None]) > 0)[..., None]
        act_rows.append(
            (exploded * w["dlrm_hstu/action_embedding_table"][None]).reshape(len(a), -1)
        )
        act_rows.append(w["dlrm_hstu/target_action_embedding"].reshape(1, -1))
    seq = seq + mlp(np.concatenate(act_rows), w, "dlrm_hstu/action_mlp")
    # Contextual tokens (baddbmm of per-position weights), concatenated left of each sequence.
    names = ["uid"] + [name for name, _ in config_lib.CROSS_FEATURES]
    ctx_in = np.stack([tables[nm][t["contextual"][:, i]] for i, nm in enumerate(names)], 1)
    ctx = np.einsum("bce,ced->bcd", ctx_in, w["dlrm_hstu/contextual_weights"])
    ctx = ctx + w["dlrm_hstu/contextual_bias"]
    c_len = c.num_contextual
    seq_offsets = np.concatenate([[0], np.cumsum(lengths + 1)])
    x_rows, t_rows = [], []
    for b in range(bsz):
        x_rows += [ctx[b], seq[seq_offsets[b] : seq_offsets[b + 1]]]
        t_rows += [np.zeros(c_len), t["uih_time"][b, : lengths[b]], [t["cand_time"][b]]]
    x = np.concatenate(x_rows)
    times = np.concatenate(t_rows)
    out_lengths = lengths + 1 + c_len
    offsets = np.concatenate([[0], np.cumsum(out_lengths)])
    num_targets = np.ones(bsz, np.int64)
    x = add_positional(
        x, offsets, w["dlrm_hstu/position_embeddings"], w["dlrm_hstu/timestamp_embeddings"],
        times, n, c_len, num_targets, math.sqrt(c.transducer_dim),
    )  # fmt: skip
    positional = x
    for i in range(c.num_layers):
        x = stu_layer(x, w, f"dlrm_hstu/stu_{i}", c, n, offsets, num_targets)
    cand = x[offsets[1:] - 1]  # split_2D_jagged: the one target of each sample
    cand_t = times[offsets[1:] - 1]
    feats = []
    for period, units in model_lib.TIME_FEATURES:
        angle = np.remainder(np.floor(cand_t / period), units) / units * 2 * 3.14
        feats += [np.cos(angle), np.sin(angle)]  # view_as_real(polar(1, angle))
    user = np.concatenate([cand, np.stack(feats, 1)], 1) @ w["dlrm_hstu/postprocessor_w"]
    user = ln(user + w["dlrm_hstu/postprocessor_b"], w["dlrm_hstu/post_ln_gamma"],
              w["dlrm_hstu/post_ln_beta"], 1e-5)  # fmt: skip
    items = np.concatenate(
        [tables["item_id"][t["cand_item"]], tables["artist_id"][t["cand_artist"]],
         tables["album_id"][t["cand_album"]]], 1)  # fmt: skip
    item_emb = mlp(items, w, "dlrm_hstu/item_mlp")
    return mlp(user * item_emb, w, "dlrm_hstu/head", final_norm=False)[:, 0], positional


# ---- the tests -----------------------------------------------------------------------------------
def tiny_config() -> config_lib.ModelConfig:
    return dataclasses.replace(
        config_lib.smoke().model, num_layers=2, input_dropout=0.0, linear_dropout=0.0
    )


def tiny_batch(c, lengths, seed=3):
    examples = [input_lib.synthetic_example(c, seed + i) for i in range(len(lengths))]
    batch = {k: tf.stack([e[k] for e in examples]) for k in examples[0]}
    h = c.history_length
    lengths = tf.constant(lengths, tf.int32)
    keep = tf.range(h)[None] < lengths[:, None]
    for key in input_lib.SEQUENCE_KEYS:
        batch[key] = tf.where(keep, batch[key], tf.zeros_like(batch[key]))
    batch["uih_length"] = lengths
    # Some contextual tokens far in the past (their time is 0) and all buckets in use.
    batch["cand_time"] = tf.reduce_max(batch["uih_time"], axis=1) + 7 * 3600
    return batch


@pytest.fixture(scope="module")
def built():
    c = tiny_config()
    model = model_lib.build(c, seed=5)
    # Non-trivial norms and biases (they start at ones and zeros).
    rng = np.random.default_rng(0)
    for v in model.weights:
        if any(s in v.path for s in ("gamma", "beta", "bias", "/b1", "/b2", "postprocessor_b")):
            v.assign(v.numpy() + 0.1 * rng.standard_normal(v.shape).astype(np.float32))
    return c, model


def test_forward_matches_the_reference_formulas_on_jagged_sequences(built):
    c, model = built
    batch = tiny_batch(c, [1, 5, c.history_length, 9])
    weights = {k: v.astype(np.float64) for k, v in model_lib.numpy_weights(model).items()}
    n = c.num_contextual + c.history_length + 1
    want, want_positional = reference_forward(weights, c, batch, n)
    got = model(batch, training=False).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    # The positional encoder's output (after the preprocessor) on the real rows.
    x, lengths, _ = model.preprocess(batch)
    rows = np.concatenate([x.numpy()[b, :n_b] for b, n_b in enumerate(lengths.numpy())])
    np.testing.assert_allclose(rows, want_positional, rtol=2e-4, atol=2e-4)


def test_padding_does_not_reach_the_real_rows(built):
    """Whatever the padded history slots hold, the logits are the same."""
    c, model = built
    batch = tiny_batch(c, [2, 4, 7])
    noisy = dict(batch)
    keep = tf.range(c.history_length)[None] < batch["uih_length"][:, None]
    for key in ("uih_item", "uih_artist", "uih_album", "uih_action"):
        noisy[key] = tf.where(keep, batch[key], tf.ones_like(batch[key]) * 3)
    noisy["uih_time"] = tf.where(keep, batch["uih_time"], tf.ones_like(batch["uih_time"]) * 99)
    np.testing.assert_allclose(model(noisy).numpy(), model(batch).numpy(), rtol=1e-6, atol=1e-6)


def test_an_stu_layer_matches_pytorch_hstu_mha_and_compute_output(built):
    c, model = built
    rng = np.random.default_rng(1)
    lengths = np.array([3, 11, 6])
    s = 12
    x = rng.standard_normal((3, s, c.transducer_dim)).astype(np.float32)
    got = model.layers_[0](tf.constant(x), tf.constant(lengths, tf.int32)).numpy()
    weights = {k: v.astype(np.float64) for k, v in model_lib.numpy_weights(model).items()}
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    jagged = np.concatenate([x[b, :n_b] for b, n_b in enumerate(lengths)]).astype(np.float64)
    want = stu_layer(jagged, weights, "dlrm_hstu/stu_0", c, s, offsets, np.ones(3, np.int64))
    got_rows = np.concatenate([got[b, :n_b] for b, n_b in enumerate(lengths)])
    np.testing.assert_allclose(got_rows, want, rtol=1e-4, atol=1e-4)


def test_position_and_time_buckets_match_the_reference_indices():
    lengths = np.array([4, 9, 12])
    n, c_len, buckets = 12, 3, 7
    got = model_lib.position_indices(tf.constant(lengths, tf.int32), n, c_len, buckets).numpy()
    np.testing.assert_array_equal(got, col_indices(n, c_len, buckets, lengths, np.ones(3, int)))
    times = tf.constant([[0, 60, 3600, 86400 * 30]], tf.int64)
    got_t = model_lib.time_buckets(times, tf.constant([86400 * 30], tf.int64), 2048).numpy()
    dt = np.maximum(86400 * 30 - np.array([0, 60, 3600, 86400 * 30], np.float64), 1e-6) / 60
    np.testing.assert_array_equal(got_t[0], np.clip(np.sqrt(dt).astype(int), 0, 2048))


def test_parameter_counts_are_the_built_models_without_allocating():
    c = tiny_config()
    model = model_lib.build(c)
    counts = {p: int(np.prod(v.shape)) for p, v in model_lib.numpy_weights(model).items()}
    embedding = sum(n for p, n in counts.items() if p.startswith(model_lib.SPARSE_PREFIX))
    assert model_lib.parameter_counts(c) == (embedding, sum(counts.values()) - embedding)
    # The reference's yambda-5b model: 293,051,712 rows of 512, ~15 M dense weights.
    emb, dense = model_lib.parameter_counts(config_lib.ModelConfig())
    assert emb == 293_051_712 * 512
    assert 10_000_000 < dense < 20_000_000


def test_time_features_are_the_postprocessors_hour_and_day_phases():
    ts = np.array([0, 3599, 3600, 86400 * 3 + 7200 + 5, 1_700_000_000])
    got = model_lib.time_features(tf.constant(ts, tf.int64)).numpy()
    want = []
    for period, units in ((3600, 24), (86400, 7)):
        angle = np.remainder(np.floor(ts / period), units) / units * 2 * 3.14  # not 2 pi
        want += [np.cos(angle), np.sin(angle)]
    np.testing.assert_allclose(got, np.stack(want, 1), rtol=0, atol=1e-6)


def test_the_scaled_model_is_the_plain_function_with_s_times_its_gradients():
    """`weight_scale` s (the mini's rules-rate parametrization, `ScaledDlrmHstu`): the same
    initial function as the plain model of the same seed; every stored weight is the plain one
    / s; the gradient of each stored weight is s times the plain gradient, the tables' still
    the touched rows alone (IndexedSlices), so Adam and row-wise Adagrad move the effective
    weights as at s times the rate. A scale that missed the tables or the dense weights would
    change the function by O(1)."""
    from tests.numerics import assert_close

    c = tiny_config()
    s = 1e6
    plain = model_lib.build(c, seed=5)
    scaled = model_lib.build(dataclasses.replace(c, weight_scale=s), seed=5)
    assert isinstance(scaled, model_lib.ScaledDlrmHstu)
    stored = {v.path: v.numpy() for v in scaled.trainable_variables}
    for v in plain.trainable_variables:
        assert_close(stored[v.path] * s, v.numpy(), rtol=1e-6)
    batch = tiny_batch(c, [1, 5, c.history_length, 9])
    want = plain(batch, training=False).numpy()
    assert_close(scaled(batch, training=False).numpy(), want, rtol=1e-5)

    def gradients(model):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(model(batch, training=True)))
        return dict(zip([v.path for v in model.trainable_variables],
                        tape.gradient(loss, model.trainable_variables)))  # fmt: skip

    g_plain, g_scaled = gradients(plain), gradients(scaled)
    table = model_lib.TABLES_PATH
    assert isinstance(g_scaled[table], tf.IndexedSlices)
    for path, g in g_plain.items():
        dense = lambda t: tf.convert_to_tensor(t).numpy()  # noqa: E731
        assert_close(dense(g_scaled[path]), s * dense(g), rtol=1e-4, scale=s * max(
            1.0, float(np.abs(dense(g)).max())))  # fmt: skip
