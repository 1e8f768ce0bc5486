"""Provides batched beam search and greedy decoding with a decoder cache, static shapes throughout.

The algorithm is the one of the MLPerf reference (tensor2tensor's beam search, as in
tensorflow/models `official/nlp/modeling/ops/beam_search.py`): each step extends every alive
hypothesis by every token, keeps the `2 * beam_size` best extensions (so that `beam_size` of
them survive even if all others end), moves the ones ending in EOS to the finished set scored by
log-probability over the GNMT length penalty `((5 + length) / 6) ** alpha`, and stops once no
alive hypothesis can beat the worst finished one. Sequences and caches have fixed sizes (the
"padded decode" mode of the reference), so the whole loop compiles under XLA.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from mlperf_tf.spmd import loop_function

# Stand-in for minus infinity in scores; finite so that sums and products stay finite.
INF = 1.0e7

SymbolsToLogitsFn = Callable[[tf.Tensor, tf.Tensor, Any, Any], tuple[tf.Tensor, Any]]


def length_penalty(length, alpha: float) -> tf.Tensor:
    """GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016), float32."""
    return tf.pow((5.0 + tf.cast(length, tf.float32)) / 6.0, alpha)


def _expand_to_beam(tensor: tf.Tensor, beam_size: int) -> tf.Tensor:
    """[batch, ...] -> [batch, beam, ...] by repetition."""
    tensor = tf.expand_dims(tensor, 1)
    multiples = [1, beam_size] + [1] * (tensor.shape.rank - 2)
    return tf.tile(tensor, multiples)


def _flatten_beam(tensor: tf.Tensor) -> tf.Tensor:
    """[batch, beam, ...] -> [batch * beam, ...]."""
    shape = tf.shape(tensor)
    return tf.reshape(tensor, tf.concat([[shape[0] * shape[1]], shape[2:]], axis=0))


def _unflatten_beam(tensor: tf.Tensor, batch_size, beam_size: int) -> tf.Tensor:
    """[batch * beam, ...] -> [batch, beam, ...]."""
    shape = tf.shape(tensor)
    return tf.reshape(tensor, tf.concat([[batch_size, beam_size], shape[1:]], axis=0))


def _gather_beams(nested, beam_indices: tf.Tensor):
    """Picks, for every batch entry, the beams `beam_indices` [batch, new_beam] of `nested`."""
    return tf.nest.map_structure(lambda t: tf.gather(t, beam_indices, axis=1, batch_dims=1), nested)


def _write_position(seq: tf.Tensor, position, ids: tf.Tensor) -> tf.Tensor:
    """Writes ids [batch, beam] at `position` of seq [batch, beam, length] (zeros there before)."""
    length = seq.shape[2] if seq.shape[2] is not None else tf.shape(seq)[2]
    one_hot = tf.one_hot(position, length, dtype=seq.dtype)  # [length]
    return seq + ids[:, :, None] * one_hot[None, None, :]


def _validate(beam_size: int, max_decode_length: int, alpha: float) -> None:
    if not isinstance(beam_size, int) or beam_size <= 0:
        raise ValueError(f"`beam_size` ({beam_size!r}) must be a positive integer.")
    if not isinstance(max_decode_length, int) or max_decode_length <= 0:
        raise ValueError(f"`max_decode_length` ({max_decode_length!r}) must be a positive integer.")
    if alpha < 0:
        raise ValueError(f"`alpha` ({alpha!r}) must not be negative.")


def sequence_beam_search(
    symbols_to_logits_fn: SymbolsToLogitsFn,
    initial_ids: tf.Tensor,
    initial_cache: Any,
    *,
    static: Any = None,
    vocab_size: int,
    beam_size: int,
    alpha: float,
    max_decode_length: int,
    eos_id: int,
    retire_finished: bool = False,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Beam search over `max_decode_length` steps.

    Each step gathers the cache once, with the beams the step keeps alive (the 2*beam
    candidates' beams picked by the alive top-k), instead of gathering it for all 2*beam
    candidates and then again for the survivors: the same tensors, a third of the copying.

    Args:
      symbols_to_logits_fn: `(ids [batch * beam, 1], step, cache, static) -> (logits
        [batch * beam, vocab], cache)`: the next-token logits given the token at position
        `step - 1` (the initial id at step 0).
      initial_ids: int32 [batch], usually the pad id.
      initial_cache: nest of tensors [batch, ...] that changes every step and is reordered with
        the beams (e.g. the self-attention keys/values of `Transformer.init_cache`). With
        `retire_finished`, a dimension of length 0 may grow between steps (a growing cache).
      static: nest of tensors [batch, ...] that does not change (e.g. the encoder's keys and
        values): tiled to [batch * beam, ...] once, never reordered; None for none.
      vocab_size: number of logits.
      beam_size: hypotheses kept per batch entry.
      alpha: length-penalty exponent (0 scores by plain log-probability).
      max_decode_length: static number of decoding steps.
      eos_id: the end-of-sequence id.
      retire_finished: drop a batch entry from the loop once its search is decided (no alive
        hypothesis can beat its worst finished one, t2t's stopping rule applied per entry) and
        decode only the others, so each step costs what its undecided entries cost. The best
        hypothesis of every entry is the same as without (a decided entry's best finished one
        can no longer be beaten); the other beams are those at the entry's own stop. Needs
        dynamic shapes (not under XLA) and a `symbols_to_logits_fn` whose rows are
        independent.

    Returns:
      (ids int32 [batch, beam, max_decode_length], best first, zeros after EOS;
       scores float32 [batch, beam], length-normalized log-probabilities).

    Raises:
      ValueError: a size argument is not positive or `alpha` is negative.
    """
    _validate(beam_size, max_decode_length, alpha)
    search = _BeamSearch(
        symbols_to_logits_fn, vocab_size=vocab_size, beam_size=beam_size, alpha=alpha,
        max_decode_length=max_decode_length, eos_id=eos_id,
    )  # fmt: skip
    state = search.initial_state(initial_ids, initial_cache)
    flat_static = None
    if static is not None:
        flat_static = tf.nest.map_structure(
            lambda t: _flatten_beam(_expand_to_beam(t, beam_size)), static
        )
    if retire_finished:
        seq, scores = _search_retiring(search, state, flat_static)
    else:
        seq, scores = search.search_to_the_end(state, flat_static)
    return _strip_after_eos(seq[:, :, 1:], eos_id), scores


@dataclasses.dataclass(frozen=True, eq=False)
class _BeamSearch:
    """One beam search's settings and its per-step pieces, shared by the fixed-batch loop
    (`search_to_the_end`) and the retiring one (`_search_retiring`).

    The state of a search is the tuple (alive_seq [b, beam, length + 1], alive_log_probs
    [b, beam], alive_cache (nest [b, beam, ...]), fin_seq [b, beam, length + 1], fin_scores
    [b, beam], fin_flags bool [b, beam]), for any number b of batch entries.
    """

    symbols_to_logits_fn: SymbolsToLogitsFn
    _: dataclasses.KW_ONLY
    vocab_size: int
    beam_size: int
    alpha: float
    max_decode_length: int
    eos_id: int

    def initial_state(self, initial_ids: tf.Tensor, initial_cache: Any) -> tuple:
        """The state before step 0: one live beam per entry holding the initial id."""
        beam_size = self.beam_size
        initial_ids = tf.cast(initial_ids, tf.int32)
        batch_size = tf.shape(initial_ids)[0]
        # Sequences keep the initial id at position 0: [batch, beam, max_decode_length + 1].
        alive_seq = _expand_to_beam(initial_ids[:, None], beam_size)
        alive_seq = tf.pad(alive_seq, [[0, 0], [0, 0], [0, self.max_decode_length]])
        # Only the first beam is live at the start, so the first top-k does not pick duplicates.
        alive_log_probs = tf.tile(
            tf.constant([[0.0] + [-INF] * (beam_size - 1)], tf.float32), [batch_size, 1]
        )
        alive_cache = tf.nest.map_structure(lambda t: _expand_to_beam(t, beam_size), initial_cache)
        finished_seq = tf.zeros_like(alive_seq)
        finished_scores = tf.fill([batch_size, beam_size], -INF)
        finished_flags = tf.zeros([batch_size, beam_size], tf.bool)
        return (alive_seq, alive_log_probs, alive_cache, finished_seq, finished_scores,
                finished_flags)  # fmt: skip

    def step_beams(self, step, alive_seq, alive_log_probs, alive_cache, fin_seq, fin_scores,
                   fin_flags, flat_static):  # fmt: skip
        """One step of the search for the entries in the state (any number of them)."""
        beam_size, vocab_size = self.beam_size, self.vocab_size
        batch = tf.shape(alive_seq)[0]
        # The 2*beam best one-token extensions of the alive hypotheses.
        flat_ids = _flatten_beam(alive_seq)  # [batch * beam, length + 1]
        current = tf.gather(flat_ids, [step], axis=1)  # [batch * beam, 1]
        flat_cache = tf.nest.map_structure(_flatten_beam, alive_cache)
        flat_logits, flat_cache = self.symbols_to_logits_fn(current, step, flat_cache, flat_static)
        logits = _unflatten_beam(tf.cast(flat_logits, tf.float32), batch, beam_size)
        log_probs = tf.nn.log_softmax(logits) + alive_log_probs[:, :, None]  # [b, beam, vocab]
        flat_log_probs = tf.reshape(log_probs, [batch, beam_size * vocab_size])
        topk_log_probs, topk_indices = tf.math.top_k(flat_log_probs, k=2 * beam_size)
        topk_beams = topk_indices // vocab_size  # [b, 2 * beam]
        topk_ids = topk_indices % vocab_size
        topk_seq = _gather_beams(alive_seq, topk_beams)
        topk_seq = _write_position(topk_seq, step + 1, topk_ids)
        topk_finished = tf.equal(topk_ids, self.eos_id)  # [b, 2 * beam]
        # Alive: the best `beam` extensions that did not end; their caches are the ones of the
        # beams they extend, gathered once.
        masked = topk_log_probs - tf.cast(topk_finished, tf.float32) * INF
        alive_log_probs, alive_indices = tf.math.top_k(masked, k=beam_size)
        alive_seq = _gather_beams(topk_seq, alive_indices)
        alive_beams = tf.gather(topk_beams, alive_indices, batch_dims=1)  # [b, beam]
        new_cache = tf.nest.map_structure(
            lambda t: _unflatten_beam(t, batch, beam_size), flat_cache
        )
        alive_cache = _gather_beams(new_cache, alive_beams)
        # Finished: the best `beam` among the old finished and the extensions that ended now.
        new_scores = topk_log_probs / length_penalty(step + 1, self.alpha)
        new_scores -= (1.0 - tf.cast(topk_finished, tf.float32)) * INF
        all_seq = tf.concat([fin_seq, topk_seq], axis=1)  # [b, 3 * beam, length + 1]
        all_scores = tf.concat([fin_scores, new_scores], axis=1)
        all_flags = tf.concat([fin_flags, topk_finished], axis=1)
        fin_scores, fin_indices = tf.math.top_k(all_scores, k=beam_size)
        fin_seq, fin_flags = _gather_beams((all_seq, all_flags), fin_indices)
        return step + 1, alive_seq, alive_log_probs, alive_cache, fin_seq, fin_scores, fin_flags

    def decided(self, alive_log_probs, fin_scores, fin_flags) -> tf.Tensor:
        """[b] bool: no alive hypothesis of the entry can still beat its worst finished one."""
        # The best an alive hypothesis can still score: its log-probability only decreases,
        # and the length penalty is largest at the maximum length.
        best_alive = alive_log_probs[:, 0] / length_penalty(self.max_decode_length, self.alpha)
        lowest_finished = tf.reduce_min(
            tf.where(fin_flags, fin_scores, tf.zeros_like(fin_scores)), axis=1
        )
        lowest_finished = tf.where(tf.reduce_any(fin_flags, axis=1), lowest_finished, -INF)
        return lowest_finished > best_alive

    def result(self, alive_seq, alive_log_probs, fin_seq, fin_scores, fin_flags):
        """An entry with no finished hypothesis returns its alive ones (they hit the length cap)."""
        any_finished = tf.reduce_any(fin_flags, axis=1)
        alive_scores = alive_log_probs / length_penalty(self.max_decode_length, self.alpha)
        seq = tf.where(any_finished[:, None, None], fin_seq, alive_seq)
        scores = tf.where(any_finished[:, None], fin_scores, alive_scores)
        return seq, scores

    def search_to_the_end(self, state: tuple, flat_static) -> tuple[tf.Tensor, tf.Tensor]:
        """Steps the whole batch until every entry is decided or the length cap.

        Returns:
          (seq int32 [batch, beam, max_decode_length + 1], scores float32 [batch, beam]).
        """

        def body(step, *beams):
            return self.step_beams(step, *beams, flat_static)

        def cond(step, alive_seq, alive_log_probs, alive_cache, fin_seq, fin_scores, fin_flags):
            del alive_seq, alive_cache, fin_seq
            done = tf.reduce_all(self.decided(alive_log_probs, fin_scores, fin_flags))
            return tf.logical_and(step < self.max_decode_length, tf.logical_not(done))

        loop_vars = (tf.constant(0, tf.int32), *state)
        _, alive_seq, alive_log_probs, _, fin_seq, fin_scores, fin_flags = tf.while_loop(
            cond, body, loop_vars, maximum_iterations=self.max_decode_length
        )
        return self.result(alive_seq, alive_log_probs, fin_seq, fin_scores, fin_flags)


def _search_retiring(search: _BeamSearch, state: tuple, flat_static):
    """The search loop of `sequence_beam_search(retire_finished=True)`.

    The loop state holds only the undecided entries (a dynamic batch dimension) and `rows`, their
    places in the batch. After each step the entries that became decided write their result
    (`search.result`) into the output at their rows and leave the state (a gather of the rest,
    only in steps where some entry was decided); the loop ends when none is left or at the
    length cap, after which the remaining entries write theirs.

    Returns:
      (seq int32 [batch, beam, max_decode_length + 1], scores float32 [batch, beam]).
    """
    has_static = flat_static is not None
    flat_static = flat_static if has_static else ()  # a loop variable must not be None
    batch_size = tf.shape(state[0])[0]
    rows = tf.range(batch_size)
    out_seq = tf.zeros_like(state[0])
    out_scores = tf.zeros([batch_size, search.beam_size], tf.float32)

    def body(step, rows, out_seq, out_scores, beams, flat_static):
        step, *beams = search.step_beams(step, *beams, flat_static if has_static else None)
        done = search.decided(beams[1], beams[4], beams[5])
        rows, out_seq, out_scores, beams, flat_static = tf.cond(
            tf.reduce_any(done),
            lambda: _retire(search, done, rows, out_seq, out_scores, beams, flat_static),
            lambda: (rows, out_seq, out_scores, tuple(beams), flat_static),
        )
        return step, rows, out_seq, out_scores, beams, flat_static

    def cond(step, rows, out_seq, out_scores, beams, flat_static):
        del out_seq, out_scores, beams, flat_static
        return tf.logical_and(step < search.max_decode_length, tf.size(rows) > 0)

    loop_vars = (tf.constant(0, tf.int32), rows, out_seq, out_scores, tuple(state), flat_static)
    _, rows, out_seq, out_scores, beams, _ = tf.while_loop(
        cond, body, loop_vars,
        shape_invariants=_retiring_invariants(state, out_seq, out_scores, flat_static),
        maximum_iterations=search.max_decode_length,
    )  # fmt: skip
    return _write_results(search, out_seq, out_scores, rows, beams)


def _write_results(search: _BeamSearch, out_seq, out_scores, rows, beams, pick=None):
    """The output with the results of `beams` (search states) written at their `rows`; with
    `pick` (a gather of some entries), only those entries'."""
    alive_seq, alive_log_probs, _, fin_seq, fin_scores, fin_flags = beams
    parts = (rows, alive_seq, alive_log_probs, fin_seq, fin_scores, fin_flags)
    rows, *parts = [pick(t) for t in parts] if pick else parts
    seq, scores = search.result(*parts)
    where = rows[:, None]
    return (tf.tensor_scatter_nd_update(out_seq, where, seq),
            tf.tensor_scatter_nd_update(out_scores, where, scores))  # fmt: skip


def _retire(search: _BeamSearch, done, rows, out_seq, out_scores, beams, flat_static):
    """Writes the decided entries' results and keeps the others' state (and static rows)."""
    leaving = tf.where(done)[:, 0]
    staying = tf.where(tf.logical_not(done))[:, 0]
    take = functools.partial(tf.gather, indices=leaving)
    new_out = _write_results(search, out_seq, out_scores, rows, beams, pick=take)
    keep = functools.partial(tf.gather, indices=staying)
    kept = tf.nest.map_structure(keep, (rows, tuple(beams)))
    # The static part is flat, [batch * beam, ...]: the staying entries' beam rows.
    beam_size = search.beam_size
    flat_rows = tf.reshape(
        tf.cast(staying, tf.int32)[:, None] * beam_size + tf.range(beam_size), [-1]
    )
    kept_static = tf.nest.map_structure(lambda t: tf.gather(t, flat_rows), flat_static)
    return (kept[0], *new_out, kept[1], kept_static)


def _retiring_invariants(state: tuple, out_seq, out_scores, flat_static) -> tuple:
    """The retiring loop's shape invariants: a free batch dimension for the state and the
    static part, and a free length for a cache dimension that grows."""

    def any_batch(t):
        return tf.TensorShape([None]).concatenate(t.shape[1:])

    def any_batch_and_growth(t):
        # A cache dimension of length 0 at the start can only grow (`Transformer.init_cache(
        # grow=True)`: a position per step): its length is free too.
        return tf.TensorShape([None] + [None if d == 0 else d for d in t.shape[1:]])

    state_invariants = [tf.nest.map_structure(any_batch, t) for t in state]
    state_invariants[2] = tf.nest.map_structure(any_batch_and_growth, state[2])  # alive_cache
    return (
        tf.TensorShape([]),
        tf.TensorShape([None]),
        out_seq.shape,
        out_scores.shape,
        tuple(state_invariants),
        tf.nest.map_structure(any_batch, flat_static),
    )


def greedy_search(
    symbols_to_logits_fn: SymbolsToLogitsFn,
    initial_ids: tf.Tensor,
    initial_cache: Any,
    *,
    static: Any = None,
    max_decode_length: int,
    eos_id: int,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Greedy (argmax) decoding, stopping when every sequence has produced EOS.

    Args and the cache contract are those of `sequence_beam_search`.

    Returns:
      (ids int32 [batch, max_decode_length], zeros after EOS; float32 [batch] log-probability
      of each sequence up to and including its EOS).
    """
    _validate(1, max_decode_length, 0.0)
    initial_ids = tf.cast(initial_ids, tf.int32)
    batch_size = tf.shape(initial_ids)[0]
    seq = tf.pad(initial_ids[:, None], [[0, 0], [0, max_decode_length]])  # [b, length + 1]

    def body(step, seq, log_prob, done, cache):
        current = tf.gather(seq, [step], axis=1)
        logits, cache = symbols_to_logits_fn(current, step, cache, static)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        ids = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        chosen = tf.gather(log_probs, ids, axis=1, batch_dims=1)
        ids = tf.where(done, tf.zeros_like(ids), ids)
        log_prob += tf.where(done, 0.0, chosen)
        seq = _write_position(seq[:, None, :], step + 1, ids[:, None])[:, 0, :]
        return step + 1, seq, log_prob, tf.logical_or(done, tf.equal(ids, eos_id)), cache

    def cond(step, seq, log_prob, done, cache):
        del seq, log_prob, cache
        return tf.logical_and(step < max_decode_length, tf.logical_not(tf.reduce_all(done)))

    _, seq, log_prob, _, _ = tf.while_loop(
        cond,
        body,
        (
            tf.constant(0, tf.int32),
            seq,
            tf.zeros([batch_size], tf.float32),
            tf.zeros([batch_size], tf.bool),
            initial_cache,
        ),
        maximum_iterations=max_decode_length,
    )
    return seq[:, 1:], log_prob


def _strip_after_eos(ids: tf.Tensor, eos_id: int) -> tf.Tensor:
    """Zeros every id after the first EOS along the last axis (the EOS itself is kept)."""
    is_eos = tf.cast(tf.equal(ids, eos_id), tf.int32)
    eos_before = tf.cumsum(is_eos, axis=-1, exclusive=True)
    return tf.where(eos_before > 0, tf.zeros_like(ids), ids)


def translate(
    model,
    inputs: tf.Tensor,
    *,
    beam_size: int,
    alpha: float,
    max_decode_length: int,
    eos_id: int,
    retire_finished: bool = False,
) -> tf.Tensor:
    """Decodes source ids with a `Transformer` (its `encode`/`init_cache`/`decode_step`).

    Args:
      model: a `benchmarks.transformer.model.Transformer`.
      inputs: int [batch, src_len] source ids, 0-padded.
      beam_size: 1 means greedy decoding; more means beam search.
      alpha: length-penalty exponent of the beam search.
      max_decode_length: static number of decoded positions.
      eos_id: the end-of-sequence id.
      retire_finished: beam search only: decode only the sentences whose search is not decided
        yet (`sequence_beam_search`); the same translations, dynamic shapes (not under XLA).

    Returns:
      int32 [batch, max_decode_length]: the best hypothesis, zeros after its EOS.
    """
    encoder_outputs, mask = model.encode(inputs, training=False)
    # The retiring search has dynamic shapes anyway: its caches grow a position per step (each
    # step's passes over them cost the positions decoded so far, not the length cap).
    grow = retire_finished and beam_size > 1
    cache, static = model.init_cache(encoder_outputs, mask, max_decode_length, grow=grow)
    initial_ids = tf.zeros([tf.shape(inputs)[0]], tf.int32)
    if beam_size == 1:
        search = functools.partial(
            greedy_search, model.decode_step, max_decode_length=max_decode_length, eos_id=eos_id
        )
    else:
        search = functools.partial(
            sequence_beam_search,
            functools.partial(model.decode_step, grow=grow),
            vocab_size=model.params.vocab_size,
            beam_size=beam_size,
            alpha=alpha,
            max_decode_length=max_decode_length,
            eos_id=eos_id,
            retire_finished=retire_finished,
        )
    if model.axis.size > 1:
        # The decoding loop issues the model shards' all-reduces: it runs as a function of its
        # own per replica, so that the shards' loops meet (see `loop_function`). Every shard
        # stops at the same step: the stop condition reads the all-reduced (identical) logits.
        search = loop_function(search)
    ids, _ = search(initial_ids, cache, static=static)
    return ids if beam_size == 1 else ids[:, 0, :]
