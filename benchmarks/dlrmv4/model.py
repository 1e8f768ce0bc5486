"""Provides `DlrmHstu`, the reference's HSTU ranking model (`modules/dlrm_hstu.py`) in Keras 3.

One sample is a user's history of H events (item, artist, album, action bits, time), eight
contextual ids (`uid` and seven hashed crosses) and one candidate listen; the model predicts
the candidate's `listen_plus` bit. The sequence the HSTU stack sees is, per sample,

    [8 contextual tokens][l history events][candidate]          (length L = 8 + l + 1)

(`ContextualPreprocessor` then `HSTUPositionalEncoder`), a stack of STU layers (`modules/stu.py`
with the formulas of `ops/pytorch/`), the candidate's output row through the timestamp
postprocessor, multiplied by the item MLP's candidate embedding, and a prediction MLP.

Jaggedness: a batch arrives padded to the config's history length `[B, H]` with the true
lengths `[B]`; every per-token layer runs on the padded rows and the attention masks keys at
or beyond each sample's L, exactly as the reference's PyTorch path (`pytorch_hstu_mha` pads to
the batch's `max_seq_len` too). At the MLPerf setting every history is full (gin
`MIN_HISTORY` 4086 = `HISTORY_LENGTH`), so the padding costs nothing there; the mini's short
histories pay it (README, "Jagged sequences").
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from benchmarks.dlrmv4.config import CROSS_FEATURES, ModelConfig
from mlperf_tf.errors import UserError
from mlperf_tf.layers.sharded_embedding import ShardedEmbeddings
from mlperf_tf.layers.tpu_embedding import Feature, TpuEmbeddingTables
from mlperf_tf.lm.parametrization import ScaledWeights

# The multitask module's one task: `listen_plus`, bit 1 of the action weight.
TIME_FEATURES = ((3600, 24), (86400, 7))  # postprocessors.py: hour of day, day of week
TWO_PI = 2 * 3.14  # postprocessors.py writes 2 * 3.14, not 2 * pi
SPARSE_PREFIX = "sparse_tables/"  # the layer holding the embedding tables (row-wise Adagrad's)
TABLES_LAYER = "sparse_tables"
# On TPU the tables live in the embedding engine (`TpuEmbeddingTables`): not Keras trainable
# weights, and a name outside `SPARSE_PREFIX` (its gradient-trap weight is dense).
TPU_TABLES_LAYER = "tpu_tables"
SEQUENCES = ("item", "artist", "album")  # the history's and the candidate's id features
CONTEXTUAL = ("uid", *(name for name, _ in CROSS_FEATURES))  # the contextual ids, in order
# The CPU model's checkpoint entries of the tables (`ShardedEmbeddings.embeddings`, canonical)
# and of their row-wise Adagrad slot (`AdamWRowWiseAdagrad`: the table's path, `/` as `_`).
TABLES_PATH = f"{TABLES_LAYER}/embeddings"
TABLES_SLOT_KEY = f"{TABLES_LAYER}_embeddings_row_accumulator"


def tpu_features(config: ModelConfig, contextual_names) -> dict[str, Feature]:
    """The model's lookups as TPU embedding features: each history sequence (`uih_<k>`, up to
    the history length, fed ragged: only real events are looked up), each candidate id
    (`cand_<k>`) and each contextual id, one a sample."""
    out = {}
    for k in SEQUENCES:
        out[f"uih_{k}"] = Feature(f"{k}_id", config.history_length)
        out[f"cand_{k}"] = Feature(f"{k}_id")
    out.update({name: Feature(name) for name in contextual_names})
    return out


def xavier(seed):
    """torch's `xavier_uniform_` (`init_mlp_weights_optional_bias`): U(+-sqrt(6/(in+out)))."""
    return keras.initializers.GlorotUniform(seed=seed)


def swish_layer_norm(x, gamma, beta, eps):
    """`SwishLayerNorm`: x * sigmoid(LN(x)) (pt_layer_norm.py `pytorch_swish_layer_norm`)."""
    return x * tf.sigmoid(layer_norm(x, gamma, beta, eps))


def layer_norm(x, gamma, beta, eps):
    """LayerNorm over the last axis (biased variance, as torch)."""
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + eps) * gamma + beta


class Mlp(keras.layers.Layer):
    """Linear -> SwishLayerNorm -> Linear [-> LayerNorm]: the reference's MLP blocks (the
    preprocessor's content, action and additional MLPs end in a LayerNorm; the prediction
    head does not)."""

    def __init__(self, hidden: int, out: int, *, final_norm: bool, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.out, self.final_norm, self.seed = hidden, out, final_norm, seed

    def build(self, input_shape):
        d = input_shape[-1]
        self.w1 = self.add_weight(shape=(d, self.hidden), initializer=xavier(self.seed), name="w1")
        self.b1 = self.add_weight(shape=(self.hidden,), initializer="zeros", name="b1")
        self.g1 = self.add_weight(shape=(self.hidden,), initializer="ones", name="swish_ln_gamma")
        self.n1 = self.add_weight(shape=(self.hidden,), initializer="zeros", name="swish_ln_beta")
        self.w2 = self.add_weight(
            shape=(self.hidden, self.out), initializer=xavier(self.seed + 1), name="w2"
        )
        self.b2 = self.add_weight(shape=(self.out,), initializer="zeros", name="b2")
        if self.final_norm:
            self.g2 = self.add_weight(shape=(self.out,), initializer="ones", name="ln_gamma")
            self.n2 = self.add_weight(shape=(self.out,), initializer="zeros", name="ln_beta")

    def call(self, x):
        h = swish_layer_norm(tf.matmul(x, self.w1) + self.b1, self.g1, self.n1, 1e-5)
        y = tf.matmul(h, self.w2) + self.b2
        return layer_norm(y, self.g2, self.n2, 1e-5) if self.final_norm else y


class StuLayer(keras.layers.Layer):
    """One STU layer (stu.py `STULayer`, PyTorch kernels), on padded rows `[B, S, D]`.

        n = LN(x; eps 1e-6);  u, v, q, k = split(n W_uvqk + b);  u = silu(u)
        A[i, j] = silu(alpha q_i . k_j) / N  for keys j <= i and j < L (causal, jagged)
        a = A v  (per head);  y = u * LN(a; eps 1e-6)
        x' = x + dropout([u, a, y]) W_out

    alpha = 1/sqrt(d_qk); N the sequence length attended over (the reference's
    `max_seq_len`); the target-aware mask of one candidate equals the causal one.
    """

    def __init__(self, config: ModelConfig, *, seed: int, **kwargs):
        super().__init__(**kwargs)
        self.c, self.seed = config, seed
        self.dropout = keras.layers.Dropout(config.linear_dropout, seed=seed + 7)

    def build(self, input_shape):
        c = self.c
        d, h = c.transducer_dim, c.num_heads
        width = (2 * c.attn_linear_dim + 2 * c.attn_qk_dim) * h
        self.uvqk = self.add_weight(shape=(d, width), initializer=xavier(self.seed), name="uvqk")
        self.uvqk_beta = self.add_weight(shape=(width,), initializer="zeros", name="uvqk_beta")
        self.in_gamma = self.add_weight(shape=(d,), initializer="ones", name="input_norm_gamma")
        self.in_beta = self.add_weight(shape=(d,), initializer="zeros", name="input_norm_beta")
        hv = h * c.attn_linear_dim
        self.out = self.add_weight(
            shape=(3 * hv, d), initializer=xavier(self.seed + 1), name="output_weight"
        )
        self.out_gamma = self.add_weight(shape=(hv,), initializer="ones", name="output_norm_gamma")
        self.out_beta = self.add_weight(shape=(hv,), initializer="zeros", name="output_norm_beta")

    def call(self, x, lengths, training=False):
        """x `[B, S, D]`, lengths `[B]` (L of each sample) -> `[B, S, D]`."""
        c = self.c
        h, dv, dq = c.num_heads, c.attn_linear_dim, c.attn_qk_dim
        s = tf.shape(x)[1]
        normed = layer_norm(x, self.in_gamma, self.in_beta, 1e-6)
        uvqk = tf.matmul(normed, self.uvqk) + self.uvqk_beta  # [B, S, 2 H dv + 2 H dq]
        u, v, q, k = tf.split(uvqk, [h * dv, h * dv, h * dq, h * dq], axis=-1)
        u = tf.nn.silu(u)
        q = tf.reshape(q, [-1, s, h, dq])
        k = tf.reshape(k, [-1, s, h, dq])
        v = tf.reshape(v, [-1, s, h, dv])
        scores = tf.einsum("bxha,byha->bhxy", q, k) * (1.0 / math.sqrt(dq))  # [B, H, S, S]
        rows = tf.range(s)[:, None]
        cols = tf.range(s)[None, :]
        mask = (cols <= rows)[None] & (cols[None] < lengths[:, None, None])  # [B, S, S]
        weights = tf.nn.silu(scores) / tf.cast(s, x.dtype)
        weights = weights * tf.cast(mask[:, None], x.dtype)
        attn = tf.reshape(tf.einsum("bhxy,byhv->bxhv", weights, v), [-1, s, h * dv])
        y = u * layer_norm(attn, self.out_gamma, self.out_beta, 1e-6)
        cat = self.dropout(tf.concat([u, attn, y], axis=-1), training=training)
        return x + tf.matmul(cat, self.out)


def position_indices(lengths, seq: int, num_contextual: int, num_buckets: int):
    """pt_position.py `_get_col_indices` with one target: `[B, S]` position buckets.

    Contextual tokens take 0..C-1; token p >= C of a sample of length L takes
    min(C + (L - 1) - min(p, L - 1), buckets - 1): the candidate C, the newest event C + 1, ...
    """
    p = tf.range(seq)[None, :]
    high = (lengths - 1)[:, None]  # seq_lengths - num_targets
    col = high - tf.minimum(p, high) + num_contextual
    col = tf.minimum(col, num_buckets - 1)
    return tf.where(p < num_contextual, tf.broadcast_to(p, tf.shape(col)), col)


def time_buckets(timestamps, query_time, num_buckets: int):
    """pt_position.py's sqrt time buckets: int(sqrt(max(query - t, 1e-6) / 60)) in [0, T]."""
    dt = tf.cast(query_time[:, None] - timestamps, tf.float32)
    dt = tf.maximum(dt, 1e-6) / 60.0
    return tf.clip_by_value(tf.cast(tf.sqrt(dt), tf.int32), 0, num_buckets)


def time_features(timestamps):
    """postprocessors.py `_concat_time_features`: [cos, sin] of the hour of day and the day
    of week, `[..., 4]`."""
    parts = []
    for period, units in TIME_FEATURES:
        since = tf.math.floordiv(timestamps, period)
        angle = tf.cast(tf.math.floormod(since, units), tf.float32) / units * TWO_PI
        parts += [tf.cos(angle), tf.sin(angle)]
    return tf.stack(parts, axis=-1)


class DlrmHstu(keras.Model):
    """The HSTU ranking model of `ModelConfig` (see the module docstring).

    Inputs (a dict, per replica): `uih_item`, `uih_artist`, `uih_album`, `uih_action` int32
    `[B, H]`, `uih_time` int64 `[B, H]`, `uih_length` int32 `[B]`, `contextual` int32 `[B, 8]`,
    `cand_item`, `cand_artist`, `cand_album` int32 `[B]`, `cand_time` int64 `[B]`.
    Output: the `listen_plus` logit `[B]`.
    """

    table_scale = 1.0  # what the looked-up rows are multiplied by (`ScaledDlrmHstu`)

    def __init__(self, config: ModelConfig, *, seed: int = 0, tpu_epsilon: float | None = None,
                 tpu_batch: int = 0, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        c = self.c = config
        e, d, hid = c.embedding_dim, c.transducer_dim, c.preprocessor_hidden_dim
        rows = c.table_rows()
        # TorchRec's default init U(+-sqrt(1/rows)) per table, seeded by its position and
        # drawn by row blocks (each replica its own rows; the same at every E, and on TPU).
        bounds = {name: math.sqrt(1.0 / n) for name, n in rows.items()}
        self.contextual_names = list(CONTEXTUAL)
        self.on_tpu = tpu_epsilon is not None
        if self.on_tpu:
            # TPU: the tables in the embedding engine, row-wise Adagrad at this eps.
            self.tables = TpuEmbeddingTables(
                rows, e, bounds=bounds, seed=seed, epsilon=tpu_epsilon, name=TPU_TABLES_LAYER,
                features=tpu_features(c, self.contextual_names), batch_size=tpu_batch,
                memory_limit_bytes=int(c.embedding_memory_gb * 2**30),
                limit_setting="model.embedding_memory_gb", batch_setting="global_batch_size",
            )  # fmt: skip
        else:
            # Every table in one layer, sharded over the mesh's `expert` axis when there is one.
            self.tables = ShardedEmbeddings(
                rows, e, name=TABLES_LAYER, seed=seed, bounds=bounds,
                memory_limit_bytes=int(c.embedding_memory_gb * 2**30),
                limit_setting="model.embedding_memory_gb",
            )  # fmt: skip
        self.content_mlp = Mlp(hid, d, final_norm=True, seed=seed + 100, name="content_mlp")
        self.additional_mlp = Mlp(hid, d, final_norm=True, seed=seed + 102, name="additional_mlp")
        self.action_mlp = Mlp(hid, d, final_norm=True, seed=seed + 104, name="action_mlp")
        self.item_mlp = Mlp(c.mlp_hidden_dim, d, final_norm=True, seed=seed + 106, name="item_mlp")
        self.head = Mlp(c.mlp_hidden_dim, 1, final_norm=False, seed=seed + 108, name="head")
        self.layers_ = [StuLayer(c, seed=seed + 200 + 10 * i, name=f"stu_{i}") for i in
                        range(c.num_layers)]  # fmt: skip
        self.input_dropout = keras.layers.Dropout(c.input_dropout, seed=seed + 300)
        self.seed_ = seed
        std = math.sqrt(2.0 / (e + d))
        nc = c.num_contextual
        self.ctx_w = self.add_weight(
            shape=(nc, e, d),
            initializer=keras.initializers.RandomNormal(0.0, std, seed=seed + 400),
            name="contextual_weights",
        )
        self.ctx_b = self.add_weight(shape=(nc, d), initializer="zeros", name="contextual_bias")
        na = c.num_action_types * c.action_embedding_dim
        normal = keras.initializers.RandomNormal(0.0, 0.1, seed=seed + 401)
        self.action_table = self.add_weight(
            shape=(c.num_action_types, c.action_embedding_dim), initializer=normal,
            name="action_embedding_table",
        )  # fmt: skip
        self.target_action = self.add_weight(
            shape=(na,), initializer=keras.initializers.RandomNormal(0.0, 0.1, seed=seed + 402),
            name="target_action_embedding",
        )  # fmt: skip
        pb, tb = c.num_position_buckets, c.num_time_buckets
        self.pos_table = self.add_weight(
            shape=(pb, d), name="position_embeddings",
            initializer=keras.initializers.RandomUniform(
                -math.sqrt(1 / pb), math.sqrt(1 / pb), seed=seed + 403),
        )  # fmt: skip
        self.time_table = self.add_weight(
            shape=(tb + 1, d), name="timestamp_embeddings",
            initializer=keras.initializers.RandomUniform(
                -math.sqrt(1 / tb), math.sqrt(1 / tb), seed=seed + 404),
        )  # fmt: skip
        self.post_w = self.add_weight(
            shape=(d + 2 * len(TIME_FEATURES), d), initializer=xavier(seed + 405),
            name="postprocessor_w",
        )  # fmt: skip
        self.post_b = self.add_weight(shape=(d,), initializer="zeros", name="postprocessor_b")
        self.post_gamma = self.add_weight(shape=(d,), initializer="ones", name="post_ln_gamma")
        self.post_beta = self.add_weight(shape=(d,), initializer="zeros", name="post_ln_beta")

    def checkpoint_format_entries(self, model_entries: dict, optimizer_entries: dict):
        """The run checkpoint's entries in the one format (`checkpoints.run_checkpoint`'s hook):
        on TPU the engine's tables and accumulators are saved as the CPU model's
        `sparse_tables/embeddings` `[sum of rows, dim]` and its row-wise Adagrad slot `[sum of
        rows]` (`TpuEmbeddingTables.checkpoint_entries`: mapped from the SparseCore layout),
        and the layer's own weights (the stacked storage, the gradient trap) and the trap's
        Adam slots (always zero) are left out, so a TPU run resumes on CPUs and the reverse.
        Off TPU the entries are the format's already."""
        if not self.on_tpu:
            return model_entries, optimizer_entries
        own = {id(v) for v in self.tables.weights}
        trap_slots = self.tables.trap.path.replace("/", "_") + "_"  # Keras' slot names
        models = {k: v for k, v in model_entries.items() if id(v) not in own}
        optimizers = {k: v for k, v in optimizer_entries.items() if not k.startswith(trap_slots)}
        tables, accumulators = self.tables.checkpoint_entries()
        models[TABLES_PATH] = tables
        optimizers[TABLES_SLOT_KEY] = accumulators
        return models, optimizers

    # ---- the reference's blocks, each tested against a NumPy transcription ---------------------
    def action_embeddings(self, actions):
        """ActionEncoder on history events: each set bit's embedding, `[B, H, 3 x a]`."""
        bits = tf.constant([1 << i for i in range(self.c.num_action_types)], tf.int32)
        on = tf.cast(tf.bitwise.bitwise_and(actions[..., None], bits) > 0, tf.float32)
        emb = on[..., None] * self.action_table  # [B, H, types, a]
        return tf.reshape(emb, tf.concat([tf.shape(actions), [-1]], 0))

    def embed(self, batch):
        """Every table lookup of a batch in one exchange (`ShardedEmbeddings`): the merged
        item, artist and album sequences (the history, then the candidate) `[B, H+1, E]` each
        and the contextual ids' embeddings `[B, C, E]`. On TPU `embed_tpu`."""
        if self.on_tpu:
            return self.embed_tpu(batch)
        merged = [
            tf.concat([batch[f"uih_{k}"], batch[f"cand_{k}"][:, None]], axis=1)
            for k in ("item", "artist", "album")
        ]  # 3 x [B, H+1]
        contextual = [batch["contextual"][:, i] for i in range(len(self.contextual_names))]
        out = self.tables(
            merged + contextual,
            tables=("item_id", "artist_id", "album_id", *self.contextual_names),
        )
        if self.table_scale != 1.0:  # the stored rows times the scale (`ScaledDlrmHstu`)
            out = [rows * self.table_scale for rows in out]
        return {"item": out[0], "artist": out[1], "album": out[2],
                "contextual": tf.stack(out[3:], axis=1)}  # fmt: skip

    def embed_tpu(self, batch):
        """`embed` through the TPU embedding engine (`TpuEmbeddingTables`): the histories as
        ragged sequences of their true lengths (history rows past a sample's length are zero,
        where `embed` reads the padding id's row: the model masks both alike), the candidates
        and contextual ids one a sample."""
        lengths = tf.cast(batch["uih_length"], tf.int32)  # [B]
        features = {}
        for k in SEQUENCES:
            features[f"uih_{k}"] = tf.RaggedTensor.from_tensor(batch[f"uih_{k}"], lengths=lengths)
            features[f"cand_{k}"] = batch[f"cand_{k}"]  # [B]
        for i, name in enumerate(self.contextual_names):
            features[name] = batch["contextual"][:, i]  # [B]
        out = self.tables(features)
        merged = {k: tf.concat([out[f"uih_{k}"], out[f"cand_{k}"][:, None]], 1) for k in
                  SEQUENCES}  # fmt: skip  # [B, H+1, E] each
        contextual = tf.stack([out[n] for n in self.contextual_names], axis=1)  # [B, C, E]
        return {**merged, "contextual": contextual}

    def preprocess(self, batch, training=False, embedded=None):
        """ContextualPreprocessor + HSTUPositionalEncoder + input dropout.

        Returns (x `[B, S, D]`, L `[B]`, times `[B, S]`) with S = 8 + H + 1: contextual tokens,
        the history and, at position 8 + l, the candidate; rows past L are padding. `embedded`:
        `embed(batch)` when the caller has it.
        """
        c = self.c
        nc, hist = c.num_contextual, tf.shape(batch["uih_item"])[1]
        lengths = tf.cast(batch["uih_length"], tf.int32)  # [B]
        embedded = self.embed(batch) if embedded is None else embedded
        item, artist, album = embedded["item"], embedded["artist"], embedded["album"]
        seq = self.content_mlp(item) + self.additional_mlp(tf.concat([artist, album], -1))
        actions = self.action_embeddings(batch["uih_action"])  # [B, H, 3a]
        target = tf.broadcast_to(self.target_action, tf.shape(actions[:, :1]))  # [B, 1, 3a]
        actions = tf.concat([actions, target], axis=1)  # [B, H+1, 3a]
        seq = seq + self.action_mlp(actions)  # [B, H+1, D]
        # Move the candidate (row H) to row l, right after the history (jagged layout).
        idx = tf.range(hist + 1)[None, :]  # [1, H+1]
        is_cand = idx == lengths[:, None]
        source = tf.where(is_cand, hist, tf.where(idx < lengths[:, None], idx, hist + 1))
        seq = tf.gather(
            tf.concat([seq, tf.zeros_like(seq[:, :1])], 1), source, batch_dims=1
        )  # [B, H+1, D]; rows past l zero
        times = tf.concat([batch["uih_time"], batch["cand_time"][:, None]], axis=1)  # [B, H+1]
        times = tf.concat([times, tf.zeros_like(times[:, :1])], 1)
        times = tf.gather(times, source, batch_dims=1)
        # Contextual tokens: a per-position linear map of each contextual id's embedding.
        ctx = embedded["contextual"]  # [B, C, E]
        ctx = tf.einsum("bce,ced->bcd", ctx, self.ctx_w) + self.ctx_b  # [B, C, D]
        x = tf.concat([ctx, seq], axis=1)  # [B, S, D]
        times = tf.concat([tf.zeros_like(times[:, :nc]), times], axis=1)  # [B, S]
        total = lengths + nc + 1  # L
        x = self.positional(x, times, total)
        return self.input_dropout(x, training=training), total, times

    def positional(self, x, times, lengths):
        """HSTUPositionalEncoder: x * sqrt(D) + position embedding + time-bucket embedding."""
        c = self.c
        s = tf.shape(x)[1]
        pos = position_indices(lengths, s, c.num_contextual, c.num_position_buckets)
        query = tf.gather(times, lengths - 1, batch_dims=1)  # [B]: the candidate's time
        tb = time_buckets(times, query, c.num_time_buckets)
        x = x * math.sqrt(c.transducer_dim)
        valid = tf.range(s)[None, :] < lengths[:, None]
        bias = tf.gather(self.pos_table, pos) + tf.gather(self.time_table, tb)
        return x + bias * tf.cast(valid, x.dtype)[..., None]

    def postprocess(self, candidate, cand_time):
        """TimestampLayerNormPostprocessor: LN(Linear([emb, time features]); eps 1e-5)."""
        y = tf.matmul(tf.concat([candidate, time_features(cand_time)], -1), self.post_w)
        return layer_norm(y + self.post_b, self.post_gamma, self.post_beta, 1e-5)

    def call(self, batch, training=False):
        embedded = self.embed(batch)
        x, lengths, times = self.preprocess(batch, training=training, embedded=embedded)
        for layer in self.layers_:
            x = layer(x, lengths, training=training)
        user = tf.gather(x, lengths - 1, batch_dims=1)  # [B, D]: the candidate's row
        user = self.postprocess(user, tf.gather(times, lengths - 1, batch_dims=1))
        items = tf.concat(
            [embedded[k][:, -1] for k in ("item", "artist", "album")], axis=-1
        )  # [B, 3E]: the candidate's rows of the merged sequences
        item = self.item_mlp(items)  # [B, D]
        return self.head(user * item)[:, 0]  # [B]


class ScaledDlrmHstu(ScaledWeights, DlrmHstu):
    """`DlrmHstu` whose trainable weights are stored divided by `config.weight_scale`
    (`mlperf_tf.lm.parametrization.ScaledWeights`), so that the closed rules' learning rate
    (1e-6 x batch / 8192, with its 24,000-step warm-up) moves a small model: Adam on the dense
    weights and row-wise Adagrad on the tables are both invariant to the gradient's scale (but
    for their epsilons), so each weight moves as at `weight_scale` times the logged rate.

    The dense weights are read as s x v through the mixin's scope; the tables are left out of
    it (mapping a table would read all its rows a step and make its gradient dense) and their
    looked-up rows are multiplied by s instead (`DlrmHstu.embed`): the same function, the
    tables' gradient still the touched rows'. The dense clip (the rules' 1.0) sees the
    s-times-larger gradient, which Adam's normalization then largely undoes."""

    scaled_methods = ("call", "embed")

    def __init__(self, config: ModelConfig, **kwargs):
        super().__init__(config, weight_scale=config.weight_scale, **kwargs)
        self.table_scale = self.weight_scale

    def build(self, input_shape=None):
        """Keras' build only: the layers create their weights at the first call (`build`
        below stores them scaled after it)."""
        DlrmHstu.build(self, input_shape)

    def effective_weights(self) -> keras.StatelessScope:
        """The dense weights read as s x v; the tables as stored (see the class)."""
        scale = self.weight_scale
        return keras.StatelessScope(state_mapping=[
            (v, v.value * scale) for v in self.trainable_variables
            if not v.path.startswith(SPARSE_PREFIX)
        ])  # fmt: skip


def build(config: ModelConfig, *, seed: int = 0, batch: int = 2,
          tpu_epsilon: float | None = None, tpu_batch: int = 0) -> DlrmHstu:  # fmt: skip
    """A built `DlrmHstu` (its weights created by one call on a zero batch); with
    `tpu_epsilon` its tables on the TPU embedding engine (row-wise Adagrad at that eps) for
    `tpu_batch` samples a replica; a `ScaledDlrmHstu` when `config.weight_scale` is not 1 (its
    initial function the plain model's).

    Raises:
      UserError: `weight_scale` not 1 with the tables on the TPU embedding engine (its
        lookups and updates are the engine's, not scaled here) or split over replicas (their
        shards are stored by replica, not divided here).
    """
    kwargs = dict(seed=seed, name="dlrm_hstu", tpu_epsilon=tpu_epsilon, tpu_batch=tpu_batch)
    if config.weight_scale == 1.0:
        model = DlrmHstu(config, **kwargs)
        model(dummy_batch(config, batch))
        return model
    if tpu_epsilon is not None:
        raise UserError(
            f"`model.weight_scale` ({config.weight_scale:g}) is not available with the tables "
            "on the TPU embedding engine: use 1 (the `mlperf` preset's)"
        )
    model = ScaledDlrmHstu(config, **kwargs)
    if model.tables.plan.shards > 1:
        raise UserError(
            f"`model.weight_scale` ({config.weight_scale:g}) is not available with the tables "
            f"split over --expert_parallel={model.tables.plan.shards}: use 1, or one replica's "
            "tables"
        )
    with model.stored_weights():
        model(dummy_batch(config, batch))  # creates every weight, initial values plain
    model.store_scaled()
    return model


def dummy_batch(config: ModelConfig, batch: int) -> dict[str, tf.Tensor]:
    """A batch of the model's input shapes (histories of length 1)."""
    h = config.history_length
    ints = lambda *shape: tf.zeros(shape, tf.int32)  # noqa: E731
    return {
        "uih_item": ints(batch, h),
        "uih_artist": ints(batch, h),
        "uih_album": ints(batch, h),
        "uih_action": ints(batch, h),
        "uih_time": tf.zeros((batch, h), tf.int64),
        "uih_length": tf.ones((batch,), tf.int32),
        "contextual": ints(batch, config.num_contextual),
        "cand_item": ints(batch),
        "cand_artist": ints(batch),
        "cand_album": ints(batch),
        "cand_time": tf.zeros((batch,), tf.int64),
    }


def parameter_counts(c: ModelConfig) -> tuple[int, int]:
    """(embedding, dense) parameters of `c`, from the shapes alone (nothing allocated)."""
    embedding = sum(c.table_rows().values()) * c.embedding_dim
    e, d, hid, m = c.embedding_dim, c.transducer_dim, c.preprocessor_hidden_dim, c.mlp_hidden_dim

    def mlp(inp, hidden, out, final_norm=True):
        return inp * hidden + hidden + 2 * hidden + hidden * out + out + (2 * out if final_norm
                                                                          else 0)  # fmt: skip

    na = c.num_action_types * c.action_embedding_dim
    dense = mlp(e, hid, d) + mlp(2 * e, hid, d) + mlp(na, hid, d)  # preprocessor MLPs
    dense += c.num_contextual * (e * d + d)  # contextual linear maps
    dense += c.num_action_types * c.action_embedding_dim + na  # action tables
    dense += c.num_position_buckets * d + (c.num_time_buckets + 1) * d  # positional encoder
    width = (2 * c.attn_linear_dim + 2 * c.attn_qk_dim) * c.num_heads
    hv = c.num_heads * c.attn_linear_dim
    dense += c.num_layers * (d * width + width + 2 * d + 3 * hv * d + 2 * hv)  # STU layers
    dense += (d + 2 * len(TIME_FEATURES)) * d + d + 2 * d  # postprocessor
    dense += mlp(3 * e, m, d) + mlp(d, m, 1, final_norm=False)  # item MLP, prediction head
    return embedding, dense


def numpy_weights(model: DlrmHstu) -> dict[str, np.ndarray]:
    """Path -> value of every weight (for tests and tools): the tables whole, each as
    `sparse_tables/<table name>`, whatever their sharding (on TPU: the host engine's; the
    engine's slots and gradient trap left out)."""
    if model.on_tpu:
        skip = {v.path for v in model.tables.weights}
        tables = model.tables.table_values()
    else:
        skip = {model.tables.embeddings.path}
        tables = model.tables.tables()
    out = {v.path: v.numpy() for v in model.weights if v.path not in skip}
    out.update({SPARSE_PREFIX + n: t for n, t in tables.items()})
    return out
