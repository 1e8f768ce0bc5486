"""Tests of generation: the hybrid model's cached decoding (a prefill, then one token at a time;
left-padded next to a longer prompt) against its whole-sequence forward, sampling (greedy,
top-p, the log-probs), the generator's log-probs against the training forward's, and the
multi-turn rollout loop with the repair environment (a scripted expert earns the reward,
a silent agent does not, a rollout at the length limit is truncated)."""

import dataclasses
import threading

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo import config, environments, tasks
from mlperf_tf.lm.hybrid import build_hybrid_decoder
from mlperf_tf.parallel.mesh import DeviceMesh
from mlperf_tf.rl import generation as generation_lib
from mlperf_tf.rl import grpo
from mlperf_tf.rl.chat import ByteChat
from mlperf_tf.rl.generation import CompiledGenerator, generate, sample
from mlperf_tf.rl.rollout import run_rollouts
from mlperf_tf.rl.split_decoding import SplitDecoding, exclusive
from tests.numerics import assert_close

CHAT = ByteChat()


@pytest.fixture(scope="module")
def model():
    tf.keras.utils.set_random_seed(0)
    c = config.tiny(vocab_size=CHAT.vocab_size)
    return build_hybrid_decoder(c)


@pytest.mark.numerics
def test_cached_decoding_equals_the_forward_and_padding_is_exact(model):
    rng = np.random.default_rng(1)
    long = rng.integers(0, 256, size=11)
    short = rng.integers(0, 256, size=7)
    want_long = model(tf.constant(long[None])).numpy()[0]
    want_short = model(tf.constant(short[None])).numpy()[0]
    # Prefill the first 6 (short: 2 after 4 pads), then 5 single tokens.
    ids = np.stack([long, np.concatenate([np.full(4, CHAT.PAD), short])])
    valid = np.stack([np.ones(11, bool), np.arange(11) >= 4])
    logits, cache = model.decode(
        tf.constant(ids[:, :6]), model.empty_cache(2), tf.constant(valid[:, :6])
    )
    steps = [logits.numpy()]
    for t in range(6, 11):
        logits, cache = model.decode(
            tf.constant(ids[:, t : t + 1]), cache, tf.constant(valid[:, : t + 1])
        )
        steps.append(logits.numpy())
    got = np.concatenate(steps, axis=1)
    assert_close(got[0], want_long, rtol=1e-4)
    assert_close(got[1, 4:], want_short, rtol=1e-4)


def test_sampling():
    logits = tf.constant([[0.0, 2.0, 1.0, -1.0], [3.0, 0.0, 0.0, 0.0]])
    tokens, logp = sample(logits, temperature=0.0, top_p=1.0, seeds=[[0, 0], [1, 0]])
    np.testing.assert_array_equal(tokens.numpy(), [1, 0])
    # top_p below the top token's probability: only it is ever drawn.
    for s in range(20):
        tokens, _ = sample(logits, temperature=1.0, top_p=0.3, seeds=[[s, 1], [s, 2]])
        np.testing.assert_array_equal(tokens.numpy(), [1, 0])
    # The returned log-prob is the temperature-scaled one; the draws follow it.
    draws = [sample(logits, temperature=2.0, top_p=1.0, seeds=[[s, 2], [s, 3]]) for s in range(400)]
    want = tf.nn.log_softmax(logits / 2.0).numpy()
    for tok, lp in draws[:5]:
        np.testing.assert_allclose(lp.numpy(), want[[0, 1], tok.numpy()], rtol=1e-6)
    freq = np.bincount([int(t[0]) for t, _ in draws], minlength=4) / 400
    np.testing.assert_allclose(freq, np.exp(want[0]), atol=0.08)
    # A row's draw depends on its own seed only, not on the rows beside it.
    alone = sample(logits[:1], temperature=2.0, top_p=1.0, seeds=[[7, 2]])[0]
    together = sample(logits, temperature=2.0, top_p=1.0, seeds=[[7, 2], [9, 9]])[0]
    assert int(alone[0]) == int(together[0])


@pytest.mark.numerics
def test_generation_logprobs_equal_the_training_forward(model):
    prompts = [CHAT.encode("fix the bug"), CHAT.encode("hi")]
    outs = generate(model, prompts, max_new_tokens=6, eos_id=CHAT.IM_END, pad_id=CHAT.PAD,
                    temperature=1.0, top_p=1.0, seeds=[3, 4])  # fmt: skip
    for prompt, out in zip(prompts, outs):
        seq = prompt + out.tokens
        logits = model(tf.constant([seq[:-1]]))
        logp = grpo.token_logprobs(logits, tf.constant([seq[1:]]))[0, len(prompt) - 1 :]
        np.testing.assert_allclose(logp.numpy(), out.logprobs, atol=1e-4)


@pytest.fixture(scope="module")
def buffer_model():
    """The tiny model with its MoE on capacity buffers (dropless): static shapes, for XLA."""
    tf.keras.utils.set_random_seed(0)
    c = config.tiny(vocab_size=CHAT.vocab_size)
    return build_hybrid_decoder(
        dataclasses.replace(c, moe=dataclasses.replace(c.moe, dispatch="buffer"))
    )


@pytest.mark.numerics
# The plain compiled step is extended (CI runs it after README's default run): the default run
# covers compiled decoding by the XLA case, the mini's (`RolloutConfig.xla_decoding`).
@pytest.mark.parametrize("xla", [pytest.param(False, marks=pytest.mark.extended), True])
def test_compiled_generation_equals_the_eager_path(model, buffer_model, xla):
    """Same seeds, same tokens: prompts of three lengths (left-padded to a 16-token bucket, not
    to the longest prompt as eagerly; the batch of 3 padded to 4, prefilled 2 rows at a time),
    sampling with top-p; then one prompt at the next bucket. With `xla`, as the `mini`
    decodes: the step compiled by XLA on the buffer MoE, in groups of 2 rows (`step_rows`),
    the prefill a 16-token chunk at a time (`chunked_prefill`)."""
    model = buffer_model if xla else model
    compiled = CompiledGenerator(model, capacity=48, bucket=16, prefill_rows=2, jit_compile=xla,
                                 step_rows=2 if xla else 0, chunked_prefill=xla)  # fmt: skip
    kw = dict(max_new_tokens=6, eos_id=CHAT.IM_END, pad_id=CHAT.PAD, temperature=1.0,
              top_p=0.9, stop_suffixes=("</tool_call>",), decode_text=CHAT.decode)  # fmt: skip
    short = [CHAT.encode("fix the bug"), CHAT.encode("hi"), CHAT.encode("x = 1\n" * 2)]
    for prompts, seeds in ((short, [3, 4, 5]), ([CHAT.encode("a prompt of two buckets")], [11])):
        want = generate(model, prompts, seeds=seeds, **kw)
        got = compiled(prompts, seeds=seeds, **kw)
        for w, g in zip(want, got, strict=True):
            assert g.tokens == w.tokens and g.stop == w.stop
            np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
    prefill = compiled._chunk if xla else compiled._prefill
    assert prefill.experimental_get_tracing_count() == 2  # (rows 2, 16), (1, 32); chunks: 2, 1
    assert compiled._step.experimental_get_tracing_count() == 2  # batch 4 (or groups of 2), 1


class ScriptedModel:
    """Emits, for each row, the expert's next turn (chosen by how many tool responses its
    prompt holds) then end-of-turn; `silent` rows answer without a tool call."""

    def __init__(self, scripts, silent=()):
        self.scripts, self.silent = scripts, set(silent)

    def empty_cache(self, batch):
        return None

    def decode(self, token_ids, cache, key_valid):
        ids = token_ids.numpy()
        if cache is None:  # prefill: pick each row's script from its prompt
            cache = []
            for row in ids:
                text = CHAT.decode(row)
                task = next(i for i, s in enumerate(self.scripts) if s[0] in text)
                turn = text.count("<tool_response>")
                reply = "I am done." if task in self.silent else self.scripts[task][1][turn]
                cache.append([*CHAT.encode(reply), CHAT.IM_END])
        nxt = [s.pop(0) if s else CHAT.IM_END for s in cache]
        logits = np.full([len(ids), 1, CHAT.vocab_size], -30.0, np.float32)
        logits[np.arange(len(ids)), 0, nxt] = 30.0
        return tf.constant(logits), cache


def test_multi_turn_rollouts_in_the_sandbox():
    env_config = config.EnvironmentConfig(kind="repair", tool_timeout_s=5.0, test_timeout_s=5.0)
    chosen = tasks.make_tasks(3, seed=9)
    scripts = [(t.issue, tasks.expert_turns(t)) for t in chosen]
    envs = [environments.RepairEnvironment(env_config) for _ in chosen]
    try:
        rollouts = run_rollouts(
            ScriptedModel(scripts, silent=[2]), envs, chosen, chat=CHAT, max_turns=6,
            max_turn_tokens=400, max_length=4000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
        assert [r.reward for r in rollouts] == [1.0, 1.0, 0.0]
        assert [r.turns for r in rollouts] == [4, 4, 1]
        for r in rollouts:
            assert len(r.tokens) == len(r.policy_mask) == len(r.logprobs)
            assert not r.truncated and r.errors == 0
        text = CHAT.decode(rollouts[0].tokens)
        assert text.count("<tool_response>") == 3 and "[exit code 0]" in text
        policy = CHAT.decode([t for t, m in zip(rollouts[0].tokens, rollouts[0].policy_mask) if m])
        assert "<tool_response>" not in policy and "<function=str_replace>" in policy
        # A turn limit of 30 tokens cuts the expert's first call: truncated, no reward.
        cut = run_rollouts(
            ScriptedModel(scripts), envs[:1], chosen[:1], chat=CHAT, max_turns=6,
            max_turn_tokens=30, max_length=4000, temperature=1.0, top_p=1.0, seed=0,
        )  # fmt: skip
        assert cut[0].truncated and cut[0].reward == 0.0
    finally:
        for env in envs:
            env.close()


@pytest.mark.numerics
def test_extend_continues_rows_of_different_lengths(model):
    """`HybridDecoderModel.extend`: three rows, each at its own length, extended by different
    counts (right padding; a row of 0 tokens in a chunk and in a one-token step) give each
    row's logits of its whole-sequence forward: padding leaves the DeltaNet state, its conv
    state and the attention cache unchanged, RoPE at each row's positions."""
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, 256, size=n) for n in (13, 7, 20)]
    want = [model(tf.constant(s[None])).numpy()[0] for s in seqs]
    cache, position = model.empty_cache(3, 40), np.zeros(3, np.int32)
    got = [[] for _ in seqs]
    for counts in [(5, 7, 8), (4, 0, 8), (1, 0, 1), (1, 0, 1), (1, 0, 0), (1, 0, 2)]:
        ids = np.full([3, max(counts)], CHAT.PAD, np.int32)
        for i, (s, n) in enumerate(zip(seqs, counts)):
            ids[i, :n] = s[position[i] : position[i] + n]
        logits, cache = model.extend(tf.constant(ids), cache, tf.constant(position),
                                     tf.constant(np.array(counts, np.int32)))  # fmt: skip
        for i, n in enumerate(counts):
            got[i].append(logits.numpy()[i, :n])
        position += np.array(counts, np.int32)
    for g, w in zip(got, want):
        assert_close(np.concatenate(g), w, rtol=1e-4)


# Extended (CI runs it after README's default run); the default run covers its case by
# test_cached_decoding_equals_the_forward_and_padding_is_exact (the cache's tokens) and
# test_compiled_generation_equals_the_eager_path[True] (the mini's compiled decoding).
@pytest.mark.extended
@pytest.mark.numerics
def test_kept_cache_gives_the_tokens_of_prefilling_again(buffer_model):
    """Two turns of a multi-turn batch as `run_rollouts` makes them (the second's prompts the
    first's, its generated turn and an observation of its own length; a rollout dropped after
    the first turn): the session that keeps each row's cache and appends only the new
    tokens (the step in groups of 2 rows, on the `mini`'s buffer MoE) gives the eager path's
    tokens, which prefills every conversation again, for the same seeds, greedy and sampled
    (top-p). (The step compiled by XLA is `test_compiled_generation_equals_the_eager_path`'s;
    the session's calls are the same compiled functions.)"""
    compiled = CompiledGenerator(buffer_model, capacity=80, bucket=16, prefill_rows=2,
                                 step_rows=2, keep_cache=True)  # fmt: skip
    stops = set()
    for temperature, top_p in ((0.0, 1.0), (1.0, 0.9)):
        session = compiled.session()
        kw = dict(max_new_tokens=6, eos_id=CHAT.IM_END, pad_id=CHAT.PAD,
                  temperature=temperature, top_p=top_p, stop_suffixes=("S",),
                  decode_text=lambda t: "S" if t[-1] % 4 == 0 else "")  # fmt: skip
        prompts = [CHAT.encode("fix the bug"), CHAT.encode("hi"), CHAT.encode("x = 1\n" * 2)]
        ids, kept = [0, 1, 2], []
        for turn in range(2):
            seeds = [10 * i + turn for i in ids]
            want = generate(buffer_model, prompts, seeds=seeds, **kw)
            got = session(prompts, seeds=seeds, **kw)
            for w, g in zip(want, got, strict=True):
                assert g.tokens == w.tokens and g.stop == w.stop
                np.testing.assert_allclose(g.logprobs, w.logprobs, atol=1e-5)
                stops.add(g.stop)
            # Only the new tokens were appended to the kept rows, not the conversations.
            assert session.appended == sum(map(len, prompts)) - sum(map(len, kept))
            if turn:
                break
            keep = [0, 2]  # the second turn continues rows 0 and 2, each by its own count
            kept = [session.rows[k] for k in keep]
            prompts = [prompts[k] + got[k].tokens + CHAT.encode("obs" * (k + 1)) for k in keep]
            ids = [ids[k] for k in keep]
    assert stops == {"tool_call", "length"}  # rows stopped at different steps
    assert compiled._append.experimental_get_tracing_count() == 1  # (rows 2, bucket 16)


# Without a kept cache is extended (CI runs it after README's default run): the default run
# covers the warm-up by the kept-cache case (the mini's session; the same `warm_up` loop).
@pytest.mark.parametrize("keep_cache", [True, pytest.param(False, marks=pytest.mark.extended)])
def test_the_warm_up_makes_every_trace_the_rollouts_use(buffer_model, keep_cache):
    """After `warm_up` for 3 shrinking rows at two sampling settings, multi-turn generation as
    `run_rollouts` does it (3 rows, then 2 continuing, then 1; prompts of several buckets;
    rows stopping at different steps) traces nothing more, with the cache kept across turns
    (the mini's session) and without it (a chunked prefill each turn)."""
    compiled = CompiledGenerator(buffer_model, capacity=96, bucket=16, prefill_rows=2,
                                 step_rows=2, chunked_prefill=True,
                                 keep_cache=keep_cache)  # fmt: skip
    settings = ((1.0, 1.0), (0.1, 0.95))
    compiled.warm_up([(3, *s) for s in settings], token=CHAT.PAD, shrinking=True)
    parts = (compiled._append, compiled._row_step) if keep_cache else (
        compiled._chunk, compiled._step)  # fmt: skip
    traced = [f.experimental_get_tracing_count() for f in parts]
    assert min(traced) >= 2  # each shape and setting traced once, before any rollout
    for temperature, top_p in settings:
        session = compiled.session()
        kw = dict(max_new_tokens=5, eos_id=CHAT.IM_END, pad_id=CHAT.PAD,
                  temperature=temperature, top_p=top_p, stop_suffixes=("S",),
                  decode_text=lambda t: "S" if t[-1] % 3 == 0 else "")  # fmt: skip
        prompts = [CHAT.encode("fix the bug"), CHAT.encode("hi"), CHAT.encode("x = 1\n" * 4)]
        for _ in range(3):
            got = session(prompts, seeds=list(range(len(prompts))), **kw)
            keep = list(range(len(prompts) - 1))  # one rollout fewer each turn
            prompts = [prompts[k] + got[k].tokens + CHAT.encode("obs" * (k + 2)) for k in keep]
    assert [f.experimental_get_tracing_count() for f in parts] == traced


def test_rollouts_use_the_generator_session():
    """`run_rollouts` generates through `session()` when the generator has one (one session
    for the batch's turns)."""
    calls = []

    class Generator:
        def session(self):
            calls.append("session")
            return self

        def __call__(self, prompts, **kw):
            calls.append(len(prompts))
            return [generation_lib.Generated([CHAT.IM_END], [0.0], "eos") for _ in prompts]

    env_config = config.EnvironmentConfig(kind="repair", tool_timeout_s=5.0, test_timeout_s=5.0)
    chosen = tasks.make_tasks(2, seed=9)
    envs = [environments.RepairEnvironment(env_config) for _ in chosen]
    try:
        run_rollouts(Generator(), envs, chosen, chat=CHAT, max_turns=3, max_turn_tokens=8,
                     max_length=4000, temperature=1.0, top_p=1.0, seed=0)  # fmt: skip
    finally:
        for env in envs:
            env.close()
    assert calls == ["session", 2]


class NextTokenModel:
    """A model of a few ops (cheap to trace): each row's next token is its last one + 1; the
    cache counts the tokens fed."""

    def empty_cache(self, batch, capacity=0):
        return [tf.zeros([batch, 1])]

    def decode(self, token_ids, cache, key_valid, position=None):
        logits = 30.0 * tf.one_hot((token_ids + 1) % CHAT.vocab_size, CHAT.vocab_size)
        return logits, [cache[0] + tf.cast(tf.shape(token_ids)[1], tf.float32)]


def test_the_compiled_generator_waits_for_the_split_model_lock():
    """The compiled calls on a `SplitDecoding` hold its lock (`split_decoding.exclusive`): a
    generation started while another thread holds it waits, then gives the unsplit model's
    tokens. (A one-replica mesh and a model of a few ops: the lock's use, cheaply; two threads
    generating at once on a split model, whose collectives clash without it, are
    `test_parallel.py`'s slow `test_two_threads_generating_on_the_split_model_take_turns`.)"""
    model = NextTokenModel()
    split = SplitDecoding(model, tf.distribute.get_strategy(), DeviceMesh())
    assert exclusive(split) is split.lock and exclusive(model) is not split.lock
    kw = dict(max_new_tokens=3, eos_id=-1, pad_id=CHAT.PAD, temperature=0.0, top_p=1.0,
              seeds=[3, 4])  # fmt: skip
    prompts = [[5, 6, 7], [40]]
    got = []
    worker = threading.Thread(
        target=lambda: got.extend(CompiledGenerator(split, capacity=32, bucket=16)(prompts, **kw))
    )
    with split.lock:
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not got  # waiting for the lock
    worker.join(60)
    assert not worker.is_alive()
    assert [g.tokens for g in got] == [[8, 9, 10], [41, 42, 43]]
