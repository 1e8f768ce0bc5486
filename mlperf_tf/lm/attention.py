"""Provides `Attention`: causal grouped-query self-attention with the options of the MLPerf LLMs
(separate or fused q/k/v, biases, QK-norm, a sliding window, attention sinks) over rotary
positions, tensor-parallel as Megatron splits it; `attend` and `multi_head_attend`, the
scaled-dot-product core it shares with the Transformer's and BERT's attentions (any mask, an
additive bias, sinks, dropout on the probabilities); and the fused-qkv kernel's column order
(`fuse_qkv`, `split_qkv`)."""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from mlperf_tf.errors import UserError
from mlperf_tf.layers.context_parallel import ContextAxis
from mlperf_tf.layers.tensor_parallel import ModelAxis
from mlperf_tf.lm.layers import Linear, RMSNorm
from mlperf_tf.lm.rope import apply_rope
from mlperf_tf.parallel.layout import add_split_weight, model_split

# Logit of masked positions, added to float32 scores.
NEG_INF = -1e9


def _dims(t, count: int) -> list:
    """`t`'s first `count` dimensions: static ints where known (so outputs keep static shapes),
    else scalar tensors."""
    dynamic = tf.shape(t)
    return [t.shape[i] if t.shape[i] is not None else dynamic[i] for i in range(count)]


def attend(q, k, v, *, mask=None, bias=None, scale: float | None = None, sinks=None,
           dropout=None, training=False):  # fmt: skip
    """Dot-product attention of query groups over shared key/value heads.

    The scores are one batched matmul per key/value head (its `group` query heads stacked along
    the rows, so keys and values are never repeated); they, the mask, the bias and the softmax
    are float32 whatever the compute dtype; the probabilities are cast back to `v`'s dtype
    before the dropout and the second matmul.

    Args:
      q: [batch, kv_heads, group, q_len, d], already scaled unless `scale` is given.
      k, v: [batch, kv_heads, kv_len, d].
      mask: None, or bool broadcastable to [batch, kv_heads, group, q_len, kv_len], True where
        a key is visible (masked logits are `NEG_INF`).
      bias: None, or an additive float bias of the logits, broadcastable alike (after the
        mask; google-research BERT's -10000 padding bias).
      scale: None, or a factor of the float32 logits (BERT scales them after the product).
      sinks: None, or [kv_heads, group] learned logits, one extra softmax column per head that
        is dropped after the softmax (GPT-OSS): rows may sum to less than 1.
      dropout: None, or a callable `dropout(probs, training=training)` on the probabilities
        [batch, kv_heads, group * q_len, kv_len] (a Keras `Dropout` layer).
      training: passed to `dropout`.

    Returns:
      [batch, kv_heads, group, q_len, d] in `v`'s dtype.
    """
    batch, kv, group, length, d = _dims(q, 5)
    keys = _dims(k, 3)[2]
    scores = tf.matmul(tf.reshape(q, [batch, kv, group * length, d]), k, transpose_b=True)
    scores = tf.reshape(tf.cast(scores, tf.float32), [batch, kv, group, length, keys])
    if scale is not None:
        scores = scores * scale
    if mask is not None:
        scores = tf.where(mask, scores, NEG_INF)
    if bias is not None:
        scores = scores + tf.cast(bias, tf.float32)
    if sinks is not None:
        # [batch, kv, group, q_len, kv_len + 1]: each head's sink logit as a last key.
        sink = tf.reshape(tf.cast(sinks, tf.float32), [1, kv, group, 1, 1])
        sink = tf.broadcast_to(sink, tf.stack([batch, kv, group, length, 1]))
        probs = tf.nn.softmax(tf.concat([scores, sink], axis=-1), axis=-1)[..., :-1]
    else:
        probs = tf.nn.softmax(scores, axis=-1)
    probs = tf.reshape(tf.cast(probs, v.dtype), [batch, kv, group * length, keys])
    if dropout is not None:
        probs = dropout(probs, training=training)
    out = tf.matmul(probs, v)  # [batch, kv, group * q_len, d]
    return tf.reshape(out, [batch, kv, group, length, d])


def multi_head_attend(q, k, v, *, mask=None, bias=None, **kwargs):
    """`attend` with one key/value head per query head: q [batch, heads, q_len, d], k and v
    [batch, heads, kv_len, d]; `mask` and `bias` broadcastable to [batch, heads, q_len, kv_len]
    -> [batch, heads, q_len, d]. `kwargs`: `attend`'s."""

    def grouped(t):  # [..., heads, q_len, kv_len] -> [..., heads, 1, q_len, kv_len]
        return t if t is None or len(t.shape) < 3 else tf.expand_dims(t, -3)

    out = attend(q[:, :, None], k, v, mask=grouped(mask), bias=grouped(bias), **kwargs)
    return out[:, :, 0]


def fuse_qkv(q, k, v, *, num_kv_heads: int, head_dim: int):
    """Separate q [in, heads d], k and v [in, kv d] kernels (or biases, [heads d] / [kv d]) ->
    the fused [in, (heads + 2 kv) d] in Megatron's grouped order: for each key/value head, its
    group's query heads, then its key, then its value (`linear_qkv`, [kv, group + 2, d] along
    the output axis). That order makes a contiguous split over `model` hand each shard its own
    heads' q, k and v (M dividing kv heads). NumPy in, NumPy out."""
    q, k, v = (np.asarray(t) for t in (q, k, v))
    lead = q.shape[:-1]
    group = q.shape[-1] // (num_kv_heads * head_dim)
    q = q.reshape(*lead, num_kv_heads, group, head_dim)
    k = k.reshape(*lead, num_kv_heads, 1, head_dim)
    v = v.reshape(*lead, num_kv_heads, 1, head_dim)
    return np.concatenate([q, k, v], axis=-2).reshape(*lead, -1)


def split_qkv(fused, *, num_heads: int, num_kv_heads: int, head_dim: int):
    """The inverse of `fuse_qkv`: (q, k, v) from a fused kernel or bias (NumPy)."""
    fused = np.asarray(fused)
    lead = fused.shape[:-1]
    group = num_heads // num_kv_heads
    parts = fused.reshape(*lead, num_kv_heads, group + 2, head_dim)
    q = parts[..., :group, :].reshape(*lead, -1)
    k = parts[..., group, :].reshape(*lead, -1)
    v = parts[..., group + 1, :].reshape(*lead, -1)
    return q, k, v


def apply_partial_rope(x, cos, sin):
    """`apply_rope` on the first `cos.shape[-1]` features of `x`'s last axis (all of them when
    the tables are as wide as the heads); the rest pass unrotated."""
    rotary = cos.shape[-1]
    if rotary == x.shape[-1]:
        return apply_rope(x, cos, sin)
    rotated, rest = tf.split(x, [rotary, x.shape[-1] - rotary], axis=-1)
    return tf.concat([apply_rope(rotated, cos, sin), rest], axis=-1)


class Attention(keras.layers.Layer):
    """Causal grouped-query self-attention: [batch, seq, hidden] -> [batch, seq, hidden].

    `num_heads` query heads share `num_kv_heads` key/value heads in groups (query head h uses
    key/value head h // group, keras-hub's and Hugging Face's order); the groups are a reshape
    of the queries ([batch, seq, kv, group, d]), so keys and values are never repeated. Scores,
    masks and the softmax are float32.

    Options (each off by default, as in Llama):
      use_bias: biases on the q/k/v and output projections.
      fused_qkv: one projection `qkv_proj` [hidden, (heads + 2 kv) d] in Megatron's grouped
        order (`fuse_qkv`) instead of `q_proj`, `k_proj`, `v_proj`: the form of the MLCommons
        Llama 2 70B checkpoint, and one input for an adapter shared by q, k and v.
      qk_norm: RMSNorm over head_dim of every query and key head (one scale [d] each,
        `q_norm`, `k_norm`), after the projection and before RoPE: Megatron's `qk_layernorm`.
      sliding_window: W > 0: query i sees keys j with 0 <= i - j < W (W keys, itself included:
        Hugging Face's and keras-hub Mistral's convention; Megatron's and flash-attention's
        `window_size=(w, 0)` is W = w + 1, as is keras-hub GptOss's `sliding_window=w`).
      sinks: a learned logit per query head (`sinks` [heads]) joins each row's softmax as one
        more column and is dropped after it (GPT-OSS): rows may sum to less than 1.
      output_gate: Qwen3.5's gated attention (Qiu et al. 2025, "Gated Attention for LLMs"):
        `q_proj` also makes a gate per query head ([hidden, heads * 2d], each head's d query
        then d gate columns, Hugging Face's order) and each head's output is multiplied by
        sigmoid(gate) before `o_proj`.
      Partial RoPE (Qwen3.5: 64 of 256): when the cos/sin tables are narrower than head_dim,
        only the first `table width` features of each query and key head are rotated.

    Tensor parallelism (the ambient mesh's `model` axis, M shards): each shard holds heads/M
    query heads (q column-parallel, o row-parallel: f on the input, g on the output; the sinks
    split alike). With kv_heads divisible by M the key/value heads are split alike (kv/M per
    shard); otherwise (M a multiple of kv_heads) k_proj and v_proj are replicated and each shard
    keeps the one key/value head its query heads share. A fused projection is column-parallel
    and needs M to divide kv_heads. The norms' scales are replicated.

    Context parallelism (the ambient mesh's `context` axis, C members): each member holds 2 of
    every sequence's 2C chunks (`mlperf_tf.layers.context_parallel`); its queries attend to the
    keys and values of the whole sequence, gathered over the axis after RoPE (k and v in one
    all-gather), masked by the tokens' true positions. The window and the sinks apply alike.

    Args:
      hidden_size: the model width (the output's).
      num_heads, num_kv_heads, head_dim: the heads.
      stddev: init std of q, k, v (and the sinks); output_stddev: of o.
      norm_epsilon: QK-norm's epsilon.

    Call: `layer(x, cos, sin)` with cos, sin [seq, head_dim] (`RotaryEmbedding.tables`).
    """

    def __init__(self, *, hidden_size: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 stddev: float, output_stddev: float, use_bias: bool = False,
                 fused_qkv: bool = False, qk_norm: bool = False, norm_epsilon: float = 1e-5,
                 sliding_window: int = 0, sinks: bool = False, output_gate: bool = False,
                 **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must divide by num_kv_heads ({num_kv_heads})"
            )
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.stddev = stddev
        self.fused_qkv = fused_qkv
        self.qk_norm = qk_norm
        self.sliding_window = int(sliding_window)
        self.use_sinks = sinks
        self.output_gate = output_gate
        self.axis = ModelAxis(None, self)
        self.context = ContextAxis(self)
        m = self.axis.size
        if num_heads % m:
            raise UserError(f"--model_parallel={m} must divide the query heads ({num_heads})")
        split_kv = num_kv_heads % m == 0
        if not split_kv and m % num_kv_heads:
            raise UserError(
                f"--model_parallel={m} must divide the key/value heads ({num_kv_heads}) or be a "
                "multiple of them (key/value heads are split or replicated)"
            )
        if fused_qkv and output_gate:
            raise ValueError("output_gate needs separate q/k/v projections (fused_qkv False)")
        if fused_qkv and not split_kv:
            raise UserError(
                f"--model_parallel={m} must divide the key/value heads ({num_kv_heads}) of a "
                "fused q/k/v projection"
            )
        self.local_heads = num_heads // m
        self.local_kv = num_kv_heads // m if split_kv else 1
        d = head_dim
        if fused_qkv:
            self.qkv_proj = Linear(
                (num_heads + 2 * num_kv_heads) * d, stddev=stddev, use_bias=use_bias,
                parallel="column", name="qkv_proj",
            )  # fmt: skip
        else:
            kv_kind = "column" if split_kv else "replicated"

            def linear(units, name, parallel):
                return Linear(units, stddev=stddev, use_bias=use_bias, parallel=parallel,
                              name=name)  # fmt: skip

            self.q_proj = linear(num_heads * d * (2 if output_gate else 1), "q_proj", "column")
            self.k_proj = linear(num_kv_heads * d, "k_proj", kv_kind)
            self.v_proj = linear(num_kv_heads * d, "v_proj", kv_kind)
        self.o_proj = Linear(
            hidden_size, stddev=output_stddev, use_bias=use_bias, parallel="row", name="o_proj"
        )
        if qk_norm:
            # Each shard normalizes its own heads: the scales' gradients are summed over `model`.
            self.q_norm = RMSNorm(norm_epsilon, sharded_input=True, name="q_norm")
            self.k_norm = RMSNorm(norm_epsilon, sharded_input=True, name="k_norm")

    @classmethod
    def from_config(cls, config, index: int = 0, **kwargs) -> Attention:
        """The attention of layer `index` of a `DecoderConfig` (its window: `layer_window`)."""
        c = config
        return cls(
            hidden_size=c.hidden_size, num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
            stddev=c.initializer_range, output_stddev=c.output_init_std,
            use_bias=c.attention_bias, fused_qkv=c.fused_qkv, qk_norm=c.qk_norm,
            norm_epsilon=c.rms_norm_eps, sliding_window=c.layer_window(index),
            sinks=c.attention_sinks, output_gate=getattr(c, "attention_output_gate", False),
            **kwargs,
        )  # fmt: skip

    def build(self, input_shape):
        hidden = (None, None, input_shape[-1])
        if self.fused_qkv:
            self.qkv_proj.build(hidden)
        else:
            for proj in (self.q_proj, self.k_proj, self.v_proj):
                proj.build(hidden)
        self.o_proj.build((None, None, self.num_heads * self.head_dim))
        if self.qk_norm:
            self.q_norm.build((None, self.head_dim))
            self.k_norm.build((None, self.head_dim))
        if self.use_sinks:
            self.sinks = add_split_weight(
                self, name="sinks", shape=(self.num_heads,),
                initializer=keras.initializers.RandomNormal(stddev=self.stddev),
                layout=model_split(0), mesh=None,
            )  # fmt: skip
        self.built = True

    def _local_kv(self, t):
        """With replicated key/value heads: the one this shard's query heads use."""
        if self.axis.size == 1 or self.num_kv_heads % self.axis.size == 0:
            return t
        group = self.num_heads // self.num_kv_heads
        head = self.axis.index() * self.local_heads // group
        return t[:, :, head : head + 1]

    def project_qkv(self, x):
        """q [batch, seq, kv, group, d] (with `output_gate`, [..., 2d]: each head's query then
        its gate), k and v [batch, seq, kv, d]: this shard's heads, before QK-norm and RoPE (`x`
        already through f)."""
        kv, d = self.local_kv, self.head_dim
        group = self.local_heads // kv
        batch, seq = tf.shape(x)[0], tf.shape(x)[1]
        if self.fused_qkv:
            # One Split, not three slices: a slice's gradient (StridedSliceGrad) writes a
            # zero tensor of the whole qkv and the three are summed; Split's is one concat.
            # Profiled at the llama2_70b_lora mini shape: 0.21 s of StridedSliceGrad per step.
            qkv = tf.reshape(self.qkv_proj(x), [batch, seq, kv, group + 2, d])
            q, k, v = tf.split(qkv, [group, 1, 1], axis=3)
            return q, tf.squeeze(k, 3), tf.squeeze(v, 3)
        q = tf.reshape(self.q_proj(x), [batch, seq, kv, group, -1])
        k = self._local_kv(tf.reshape(self.k_proj(x), [batch, seq, -1, d]))
        v = self._local_kv(tf.reshape(self.v_proj(x), [batch, seq, -1, d]))
        return q, k, v

    def mask(self, seq):
        """bool [seq, seq]: query i may see key j (causal, and inside the window if any)."""
        causal = tf.linalg.band_part(tf.ones([seq, seq], tf.bool), -1, 0)
        if not self.sliding_window:
            return causal
        # i - j < W: band_part keeps at most W - 1 subdiagonals.
        return tf.linalg.band_part(causal, self.sliding_window - 1, 0)

    def mask_at(self, query_positions, key_positions):
        """bool [queries, keys] from true positions (NumPy int [queries], [keys]): key j is
        visible to query i when 0 <= p_i - p_j (< W with a window); `mask` for 0..seq-1."""
        distance = query_positions[:, None] - key_positions[None, :]
        visible = distance >= 0
        if self.sliding_window:
            visible &= distance < self.sliding_window
        return tf.constant(visible)

    def _heads(self, x, cos, sin):
        """q [batch, kv, group, seq, d] (scaled), k, v [batch, kv, seq, d], the output gate
        [batch, seq, kv, group, d] or None: this shard's heads after QK-norm and RoPE."""
        x = self.axis.copy(x)  # f: one all-reduce of the input gradient for q, k and v
        q, k, v = self.project_qkv(x)
        gate = None
        if self.output_gate:
            q, gate = tf.split(q, 2, axis=-1)  # each [batch, seq, kv, group, d]
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)  # this shard's heads; scales read through f
        q = apply_partial_rope(q, cos, sin)
        k = apply_partial_rope(k, cos, sin)
        q = tf.transpose(q, [0, 2, 3, 1, 4])  # [batch, kv, group, seq, d]
        q = q * tf.cast(1.0 / math.sqrt(self.head_dim), q.dtype)
        k = tf.transpose(k, [0, 2, 1, 3])  # [batch, kv, seq, d]
        v = tf.transpose(v, [0, 2, 1, 3])  # [batch, kv, seq, d]
        return q, k, v, gate

    def _output(self, q, k, v, gate, mask):
        """Attention of q over k, v under `mask`, gated, through o_proj: [batch, seq, hidden]."""
        kv = self.local_kv
        group = self.local_heads // kv
        batch, seq = tf.shape(q)[0], tf.shape(q)[3]
        sinks = tf.reshape(self.sinks, [kv, group]) if self.use_sinks else None
        out = attend(q, k, v, mask=mask, sinks=sinks)  # [batch, kv, group, seq, d]
        out = tf.transpose(out, [0, 3, 1, 2, 4])  # [batch, seq, kv, group, d]
        if gate is not None:
            out = out * tf.sigmoid(gate)
        out = tf.reshape(out, [batch, seq, self.local_heads * self.head_dim])
        return self.o_proj(out)

    def call(self, x, cos, sin):
        """x [batch, seq, hidden]; cos, sin [seq, head_dim] -> [batch, seq, hidden]."""
        q, k, v, gate = self._heads(x, cos, sin)
        if self.context.size == 1:
            return self._output(q, k, v, gate, self.mask(tf.shape(x)[1]))
        # This member's chunks attend to the whole sequence: k and v of every member, one
        # gather of [2, batch, kv, seq, d] -> [2, batch, kv, C seq, d].
        length = x.shape[1]
        k, v = tf.unstack(self.context.gather_sequence(tf.stack([k, v]), axis=3))
        mask = self.mask_at(self.context.positions(length), self.context.key_positions(length))
        return self._output(q, k, v, gate, mask)  # mask [seq, C seq]

    def decode(self, x, cos, sin, cache, key_valid, position=None):
        """Attention of new tokens over a key/value cache (generation).

        Args:
          x: [batch, new, hidden], the tokens after those in `cache`.
          cos, sin: the tables of the new tokens' positions [new, rotary width].
          cache: (k, v) each [batch, kv, past, d] (past may be 0); with `position`, a
            fixed-capacity cache [batch, kv, capacity, d] (`empty_cache(batch, capacity)`).
          key_valid: bool [batch, past + new] (with `position`: [batch, capacity]), False at
            left padding: no query sees those keys, except a padding query its own (its output
            is then its value, 0 for a zero input).
          position: None (the cache grows by concatenation: eager decoding), or the slot of
            the first new token in a fixed-capacity cache (an int32 scalar, a compiled
            decoding step's: every shape stays fixed, so one trace serves every step), or
            int32 [batch]: each row's own first slot (rows of different lengths, each
            contiguous from slot 0: `cos`, `sin` are then [batch, new, width] and `key_valid`
            is not read; a row's slots at and after its position hold nothing it has seen).

        Returns:
          ([batch, new, hidden], the cache with the new keys and values appended or written).
        """
        q, k, v, gate = self._heads(x, cos, sin)
        if position is not None and getattr(position, "shape", None) is not None:
            if position.shape.rank == 1:
                return self._decode_rows(q, k, v, gate, cache, position)
        written = None
        if position is not None:
            written = _write_cache(cache, k, v, position)
            past = position
            if isinstance(position, int) and position == 0:  # a prefill: its own keys only
                key_valid = key_valid[:, : k.shape[2]]
            else:
                k, v = written
        else:
            k = tf.concat([cache[0], k], axis=2)
            v = tf.concat([cache[1], v], axis=2)
            past = tf.shape(k)[2] - tf.shape(q)[3]
        new, total = tf.shape(q)[3], tf.shape(k)[2]
        rows = tf.range(new)[:, None] + past  # absolute positions of the queries
        cols = tf.range(total)[None, :]
        visible = (cols <= rows) & (self.sliding_window == 0 or rows - cols < self.sliding_window)
        mask = (visible[None] & key_valid[:, None, :]) | (cols == rows)[None]  # [batch, new, total]
        return self._output(q, k, v, gate, mask[:, None, None]), written or (k, v)

    def _decode_rows(self, q, k, v, gate, cache, position):
        """`decode` at per-row slots `position` [batch]: row b's new tokens are written at
        position[b] .. position[b] + new - 1 and see the slots up to their own (causal per
        row; a row's earlier slots are its tokens, the later ones are never shown)."""
        k, v = _write_cache_rows(cache, k, v, position)
        rows = position[:, None] + tf.range(tf.shape(q)[3])[None, :]  # [batch, new]
        cols = tf.range(tf.shape(k)[2])[None, None, :]
        distance = rows[:, :, None] - cols  # [batch, new, capacity]
        visible = distance >= 0
        if self.sliding_window:
            visible &= distance < self.sliding_window
        return self._output(q, k, v, gate, visible[:, None, None]), (k, v)

    def empty_cache(self, batch: int, capacity: int = 0):
        """An empty (k, v) cache: [batch, kv, 0, d] each (it grows), or [batch, kv, capacity,
        d] of zeros (written in place at `decode`'s `position`)."""
        empty = tf.zeros([batch, self.local_kv, capacity, self.head_dim], self.compute_dtype)
        return empty, empty


def _write_cache(cache, k, v, position):
    """Writes k, v [batch, kv, new, d] into a fixed-capacity cache [batch, kv, capacity, d] at
    slots position .. position + new - 1; returns the written (k, v). A Python 0 (a prefill) is
    one concatenation; a tensor position blends with a one-hot [new, capacity] (no scatter:
    the shapes and the graph stay the same for every step; for a decoding step under XLA, a
    scatter (`_scatter_step`) measured no faster: 9.2-10.9 against 8.9-9.2 CPU ms, load 7-10)."""
    capacity, new = cache[0].shape[2], k.shape[2]
    if isinstance(position, int) and position == 0:
        return (tf.concat([k, cache[0][:, :, new:]], axis=2),
                tf.concat([v, cache[1][:, :, new:]], axis=2))  # fmt: skip
    slots = tf.one_hot(position + tf.range(new), capacity, dtype=k.dtype)  # [new, capacity]
    keep = 1.0 - tf.reduce_sum(slots, axis=0)[:, None]  # [capacity, 1]
    k = cache[0] * keep + tf.einsum("nc,bknd->bkcd", slots, k)
    v = cache[1] * keep + tf.einsum("nc,bknd->bkcd", slots, v)
    return k, v


def _scatter_step(cache, new, position):
    """`cache` [batch, kv, capacity, d] with row b's slot position[b] set to new[b, :, 0]
    (a slot past the capacity is dropped: the row's cache is unchanged).

    Why a scatter, not a select over the cache: XLA fuses the new key's producers (its norm and
    RoPE) into a select's loop over every slot of the cache, so a step recomputed them
    capacity times (measured: the per-row step's key write 9.6 ms of its 26 at 16 rows and
    1,216 slots, `tools/costs/bench_grpo_row_step.py`); the scatter writes batch x kv rows."""
    batch, heads, capacity = tf.shape(new)[0], tf.shape(new)[1], cache.shape[2]
    inside = position < capacity  # [batch]
    slot = tf.where(inside, position, 0)
    index = tf.stack([tf.broadcast_to(tf.range(batch)[:, None], [batch, heads]),
                      tf.broadcast_to(tf.range(heads)[None, :], [batch, heads]),
                      tf.broadcast_to(slot[:, None], [batch, heads])], axis=-1)  # fmt: skip
    values = tf.where(inside[:, None, None], new[:, :, 0], tf.gather_nd(cache, index))
    return tf.tensor_scatter_nd_update(cache, index, values)  # index [batch, kv, 3]


def _write_cache_rows(cache, k, v, position):
    """`_write_cache` at each row's own slot: k, v [batch, kv, new, d] written at slots
    position[b] .. position[b] + new - 1 of row b (a one-hot [batch, new, capacity] blend, or
    for one new token a scatter, `_scatter_step`; slots past the capacity are dropped)."""
    capacity, new = cache[0].shape[2], tf.shape(k)[2]
    if k.shape[2] == 1:  # a decoding step: a scatter of one slot a row and head
        return _scatter_step(cache[0], k, position), _scatter_step(cache[1], v, position)
    slots = tf.one_hot(position[:, None] + tf.range(new)[None, :], capacity, dtype=k.dtype)
    keep = (1.0 - tf.reduce_sum(slots, axis=1))[:, None, :, None]  # [batch, 1, capacity, 1]
    k = cache[0] * keep + tf.einsum("bnc,bknd->bkcd", slots, k)
    v = cache[1] * keep + tf.einsum("bnc,bknd->bkcd", slots, v)
    return k, v
