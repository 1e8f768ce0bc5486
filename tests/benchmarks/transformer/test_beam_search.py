"""Tests of beam search and greedy decoding: golden brute force, beam 1 = greedy, XLA, reference."""

import functools
import itertools

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.transformer import beam_search
from tests.benchmarks.transformer.test_model import tiny_model
from tests.numerics import assert_close

pytestmark = pytest.mark.numerics

EOS = 1


def markov_fn(table: np.ndarray):
    """symbols_to_logits_fn of a first-order Markov chain: logits = table[previous id].

    The cache counts the steps taken (a tensor with a batch dimension), so the test also sees
    that caches are carried and reordered with the beams.
    """
    table = tf.constant(table, tf.float32)

    def fn(ids, step, cache, static):
        del static
        logits = tf.gather(table, ids[:, 0])
        return logits, {"steps": cache["steps"] + 1}

    return fn


def markov_beam_search(table: np.ndarray, starts, **settings):
    """`sequence_beam_search` over the Markov chain `table` (its vocabulary: the table's rows)
    from the int32 ids `starts`, each sentence's step counter at 0; `settings`: beam_size, alpha,
    max_decode_length, retire_finished."""
    return beam_search.sequence_beam_search(
        markov_fn(table), starts, {"steps": tf.zeros_like(starts)}, vocab_size=len(table),
        eos_id=EOS, **settings,
    )  # fmt: skip


def brute_force_best(table: np.ndarray, max_len: int, alpha: float):
    """Best finished sequence (ending in EOS within max_len) by exhaustive search."""
    log_probs = table - np.log(np.exp(table).sum(axis=1, keepdims=True))
    vocab = table.shape[0]
    best, best_score = None, -np.inf
    for length in range(1, max_len + 1):
        for body in itertools.product(range(vocab), repeat=length - 1):
            if EOS in body:
                continue
            seq = list(body) + [EOS]
            previous, total = 0, 0.0
            for token in seq:
                total += log_probs[previous, token]
                previous = token
            score = total / ((5.0 + length) / 6.0) ** alpha
            if score > best_score:
                best, best_score = seq, score
    return best, best_score


@pytest.mark.parametrize("retire_finished", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_exhaustive_beam_finds_the_brute_force_optimum(alpha, retire_finished):
    rng = np.random.default_rng(3)
    vocab, max_len = 4, 4
    for trial in range(3):
        table = rng.normal(scale=2.0, size=(vocab, vocab))
        table[:, 0] = -5.0  # the pad id is unlikely but allowed
        best, best_score = brute_force_best(table, max_len, alpha)
        # A beam of vocab**max_len keeps every hypothesis: the search is exhaustive.
        ids, scores = markov_beam_search(
            table, tf.zeros([1], tf.int32), beam_size=vocab**max_len // 2, alpha=alpha,
            max_decode_length=max_len, retire_finished=retire_finished,
        )  # fmt: skip
        got = ids.numpy()[0, 0].tolist()
        assert got[: len(best)] == best, trial
        assert all(t == 0 for t in got[len(best) :])
        assert scores.numpy()[0, 0] == pytest.approx(best_score, rel=1e-5)
        assert np.all(np.diff(scores.numpy()[0]) <= 1e-6)  # best first


def test_beam_one_equals_greedy_on_a_transformer():
    model = tiny_model(seed=1, scale=3.0)
    inputs = tf.constant(np.random.default_rng(0).integers(3, 40, size=(6, 7)), tf.int32)
    encoder_outputs, mask = model.encode(inputs)
    cache, static = model.init_cache(encoder_outputs, mask, max_decode_length=10)
    start = tf.zeros([6], tf.int32)
    greedy, greedy_log_prob = tf.function(beam_search.greedy_search)(
        model.decode_step, start, cache, static=static, max_decode_length=10, eos_id=EOS
    )
    # With alpha 0 the score is the log-probability, so a beam of one is exactly greedy; with
    # alpha > 0 the length penalty may rightly prefer a longer continuation.
    beam, beam_scores = tf.function(beam_search.sequence_beam_search)(
        model.decode_step,
        start,
        cache,
        static=static,
        vocab_size=40,
        beam_size=1,
        alpha=0.0,
        max_decode_length=10,
        eos_id=EOS,
    )
    np.testing.assert_array_equal(beam.numpy()[:, 0], greedy.numpy())
    assert_close(beam_scores.numpy()[:, 0], greedy_log_prob.numpy(), rtol=1e-5)
    assert (greedy.numpy() == EOS).any()  # some sequences end early: the EOS path is covered


# Extended (CI runs it after README's default run); the default run covers its case by
# test_matches_model_garden_beam_search (the search) and test_benchmark.py's train step under XLA.
@pytest.mark.extended
def test_translate_compiles_under_xla_and_matches_graph_mode():
    model = tiny_model(seed=2, scale=3.0)
    inputs = tf.constant(np.random.default_rng(1).integers(3, 40, size=(4, 6)), tf.int32)

    def run(x):
        return beam_search.translate(
            model, x, beam_size=4, alpha=0.6, max_decode_length=9, eos_id=EOS
        )

    graph = tf.function(run)(inputs)
    compiled = tf.function(run, jit_compile=True)(inputs)
    assert compiled.shape == (4, 9)
    np.testing.assert_array_equal(compiled.numpy(), graph.numpy())


@pytest.mark.parametrize("beam_size, alpha", [(4, 0.6), (3, 1.0), (2, 0.0)])
def test_retiring_decided_sentences_keeps_every_translation(beam_size, alpha):
    """`retire_finished` drops decided sentences from the loop, with caches that grow a position
    per step (as `translate` runs it): the same best ids and scores as the whole-batch search
    over fixed-length caches."""
    model = tiny_model(seed=1, scale=3.0)
    inputs = tf.constant(np.random.default_rng(5).integers(3, 40, size=(12, 7)), tf.int32)
    encoder_outputs, mask = model.encode(inputs)
    search = tf.function(beam_search.sequence_beam_search)
    results = {}
    for retire in (False, True):
        cache, static = model.init_cache(encoder_outputs, mask, max_decode_length=14, grow=retire)
        assert cache["layer_0"]["k"].shape[2] == (0 if retire else 14)
        results[retire] = search(
            functools.partial(model.decode_step, grow=retire), tf.zeros([12], tf.int32), cache,
            static=static, vocab_size=40,
            beam_size=beam_size, alpha=alpha, max_decode_length=14, eos_id=EOS,
            retire_finished=retire,
        )  # fmt: skip
    (ids, scores), (retired_ids, retired_scores) = results[False], results[True]
    np.testing.assert_array_equal(retired_ids.numpy()[:, 0], ids.numpy()[:, 0])
    # Growing caches attend over step + 1 keys, fixed ones over 14 with the rest masked: float32
    # sums in another order (8e-6 of scores ~5 seen with oneDNN off), so 1e-5 of the scale.
    assert_close(retired_scores.numpy()[:, 0], scores.numpy()[:, 0], rtol=1e-5)
    ended = (ids.numpy()[:, 0] == EOS).any(axis=1)
    assert ended.any() and not ended.all()  # sentences that stop early and ones at the cap


def test_translate_retiring_equals_the_whole_batch_search():
    """`translate(retire_finished=True)` (growing caches, retiring) = the static-shape path.
    Eager (2.3 s against 5-6 s traced, each path): the traced search's retiring is
    `test_retiring_decided_sentences_keeps_every_translation`'s, and the benchmark's eval traces
    `translate` in the contract test."""
    model = tiny_model(seed=3, scale=3.0)
    inputs = tf.constant(np.random.default_rng(8).integers(3, 40, size=(10, 6)), tf.int32)
    ids = {
        retire: beam_search.translate(
            model,
            inputs,
            beam_size=4,
            alpha=0.6,
            max_decode_length=12,
            eos_id=EOS,
            retire_finished=retire,
        ).numpy()  # fmt: skip
        for retire in (False, True)
    }
    np.testing.assert_array_equal(ids[True], ids[False])
    ended = (ids[False] == EOS).any(axis=1)
    assert ended.any() and not ended.all()


def test_retiring_sentences_with_no_static_part():
    """A cache-only search (no `static`) retires too: the Markov chain's exhaustive optimum."""
    rng = np.random.default_rng(7)
    table = rng.normal(scale=2.0, size=(4, 4))
    starts = tf.constant([0, 2, 3], tf.int32)
    runs = [
        markov_beam_search(
            table, starts, beam_size=2, alpha=0.6, max_decode_length=5, retire_finished=retire
        )[0].numpy()[:, 0]
        for retire in (False, True)
    ]
    np.testing.assert_array_equal(runs[1], runs[0])


def test_strip_after_eos():
    ids = tf.constant([[5, 1, 7, 1], [1, 4, 4, 4], [3, 3, 3, 3]])
    np.testing.assert_array_equal(
        beam_search._strip_after_eos(ids, EOS).numpy(),
        [[5, 1, 0, 0], [1, 0, 0, 0], [3, 3, 3, 3]],
    )


def test_length_penalty_formula():
    assert float(beam_search.length_penalty(7, 0.6)) == pytest.approx((12 / 6) ** 0.6)
    assert float(beam_search.length_penalty(7, 0.0)) == 1.0


def test_argument_validation():
    with pytest.raises(ValueError, match="beam_size"):
        markov_beam_search(
            np.zeros([3, 3]), tf.zeros([1], tf.int32), beam_size=0, alpha=0.6, max_decode_length=3
        )
    with pytest.raises(ValueError, match="max_decode_length"):
        beam_search.greedy_search(
            markov_fn(np.zeros([3, 3])), tf.zeros([1], tf.int32),
            {"steps": tf.zeros([1], tf.int32)}, max_decode_length=0, eos_id=EOS,
        )  # fmt: skip


@pytest.mark.peers
def test_matches_model_garden_beam_search():
    reference = pytest.importorskip("official.nlp.modeling.ops.beam_search")
    model = tiny_model(seed=4, scale=3.0)
    inputs = tf.constant(np.random.default_rng(2).integers(3, 40, size=(5, 7)), tf.int32)
    encoder_outputs, mask = model.encode(inputs)
    cache, static = model.init_cache(encoder_outputs, mask, max_decode_length=12)

    # Model Garden's search has one cache, all of it reordered with the beams, and needs float
    # tensors: carry the static part in it, with the bool mask as float32.
    def reference_fn(ids, step, c):
        static = {**c["static"], "encdec_mask": c["static"]["encdec_mask"] > 0.5}
        logits, new_cache = model.decode_step(ids, step, c["cache"], static)
        return logits, {"cache": new_cache, "static": c["static"]}

    float_static = {**static, "encdec_mask": tf.cast(static["encdec_mask"], tf.float32)}
    float_cache = {"cache": cache, "static": float_static}
    for beam_size, alpha in ((1, 0.0), (4, 0.6), (3, 1.0)):
        ids, scores = tf.function(beam_search.sequence_beam_search)(
            model.decode_step, tf.zeros([5], tf.int32), cache, static=static, vocab_size=40,
            beam_size=beam_size, alpha=alpha, max_decode_length=12, eos_id=EOS,
        )  # fmt: skip
        ref_ids, ref_scores = tf.function(reference.sequence_beam_search)(
            reference_fn, tf.zeros([5], tf.int32), float_cache, vocab_size=40,
            beam_size=beam_size, alpha=alpha, max_decode_length=12, eos_id=EOS,
            padded_decode=True, dtype=tf.float32,
        )  # fmt: skip
        ref_ids = beam_search._strip_after_eos(ref_ids[:, :, 1:], EOS)
        np.testing.assert_array_equal(ids.numpy(), ref_ids.numpy())
        finished = (ids.numpy() == EOS).any(axis=2)
        assert_close(scores.numpy()[finished], ref_scores.numpy()[finished], rtol=1e-5)
