"""Provides generation for rollouts: `sample` (temperature and top-p, the log-probability the
update needs), `generate` (a batch of left-padded prompts continued with a model's cache until
each stops: an end-of-turn token, a closed tool call, or the length limit).

The model is any object with `empty_cache(batch)` and `decode(token_ids, cache, key_valid)`
(`mlperf_tf.lm.hybrid.HybridDecoderModel`): one prefill of the prompts, then one token per
step, with the DeltaNet layers' O(1) recurrent state and the attention layers' key/value cache.
Generation runs eagerly on the trained weights themselves (one copy: no refit step; the cost is
that generation and training share the devices and take turns).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from mlperf_tf.rl.split_decoding import exclusive


def sample(logits, *, temperature: float, top_p: float, seeds):
    """One token per row of `logits` [batch, vocab] and its log-probability.

    Temperature 0 is greedy. Otherwise the logits are divided by the temperature and, with
    top_p < 1, only the smallest set of most likely tokens whose probability reaches top_p keeps
    its mass (renormalized); the draw is the Gumbel-max of the kept logits with each row's own
    noise (`seeds`), so a row's token does not depend on the other rows of the batch. The
    log-probability returned is the token's under the temperature-scaled distribution before
    the top-p cut, the distribution the policy update recomputes
    (`mlperf_tf.rl.grpo.token_logprobs` at the same temperature).

    Args:
      logits: [batch, vocab] float.
      temperature: >= 0.
      top_p: in (0, 1].
      seeds: int32 [batch, 2], each row's stateless seed for this step.

    Returns:
      (tokens int32 [batch], log-probs float32 [batch]).
    """
    logits = tf.cast(logits, tf.float32)
    if temperature == 0:
        tokens = tf.argmax(logits, axis=-1, output_type=tf.int32)
        logp = tf.nn.log_softmax(logits, axis=-1)
        return tokens, tf.gather(logp, tokens, axis=-1, batch_dims=1)
    scaled = logits / temperature
    logp = tf.nn.log_softmax(scaled, axis=-1)
    filtered = scaled
    if top_p < 1.0:
        order = tf.argsort(scaled, axis=-1, direction="DESCENDING")
        sorted_probs = tf.gather(tf.exp(logp), order, batch_dims=1)
        before = tf.cumsum(sorted_probs, axis=-1, exclusive=True)  # mass of likelier tokens
        keep_sorted = before < top_p  # the first token always
        keep = tf.scatter_nd(
            tf.stack([tf.repeat(tf.range(tf.shape(order)[0]), tf.shape(order)[1]),
                      tf.reshape(order, [-1])], axis=1),
            tf.reshape(keep_sorted, [-1]), tf.shape(scaled),
        )  # fmt: skip
        filtered = tf.where(keep, scaled, -np.inf)
    gumbel = -tf.math.log(-tf.math.log(_hash_uniform(seeds, logits.shape[-1])))
    tokens = tf.argmax(filtered + gumbel, axis=-1, output_type=tf.int32)
    return tokens, tf.gather(logp, tokens, axis=-1, batch_dims=1)


_MASK32 = 0xFFFFFFFF


def _hash_uniform(seeds, vocab: int) -> tf.Tensor:
    """Uniforms in (0, 1) [batch, vocab], each from its row's seed and its column alone: a
    32-bit hash of (seed, column) (MurmurHash3's finalizer), so rows are independent of the
    batch they are drawn in."""
    seeds = tf.cast(seeds, tf.int64)
    column = tf.range(vocab, dtype=tf.int64)[None, :]
    x = (seeds[:, :1] * 0x9E3779B1 + seeds[:, 1:] * 0x85EBCA6B + column * 0xC2B2AE35) & _MASK32
    for shift, factor in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        x = ((x ^ tf.bitwise.right_shift(x, shift)) * factor) & _MASK32
    x = x ^ tf.bitwise.right_shift(x, 16)
    return tf.cast((tf.cast(x, tf.float64) + 0.5) / 2.0**32, tf.float32)


@dataclasses.dataclass
class Generated:
    """One sequence's continuation: its tokens, their log-probs, and why it stopped
    ("eos", "tool_call" or "length")."""

    tokens: list[int]
    logprobs: list[float]
    stop: str


def _record(results, done, tokens, logp, eos_id, stop_suffixes, decode_text) -> None:
    """Appends one step's token and log-prob to each unfinished row's `Generated` (rows past
    `len(results)` are batch padding) and marks the rows that stop on it."""
    for i in np.nonzero(~done)[0]:
        results[i].tokens.append(int(tokens[i]))
        results[i].logprobs.append(float(logp[i]))
        if tokens[i] == eos_id:
            results[i].stop, done[i] = "eos", True
        elif decode_text is not None and any(
            decode_text(results[i].tokens).endswith(s) for s in stop_suffixes
        ):
            results[i].stop, done[i] = "tool_call", True


def generate(model, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float, top_p: float, seeds: list[int], stop_suffixes=(),
             decode_text=None) -> list[Generated]:  # fmt: skip
    """Continues each prompt until `eos_id`, a stop suffix (e.g. a closed tool call, checked on
    `decode_text(tokens)`), or `max_new_tokens`; all prompts advance together.

    Prompts are left-padded with `pad_id` to one length (`HybridDecoderModel.decode` makes the
    padding exact). `seeds`: one per prompt; a sequence's tokens depend on its seed, not on
    the batch it is in. A finished sequence keeps being fed its last token until all stop; its
    outputs are dropped.
    """
    batch = len(prompts)
    width = max(len(p) for p in prompts)
    ids = np.full([batch, width], pad_id, np.int32)
    valid = np.zeros([batch, width], bool)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = p
        valid[i, width - len(p) :] = True
    logits, cache = model.decode(tf.constant(ids), model.empty_cache(batch), tf.constant(valid))
    last = logits[:, -1]
    results = [Generated([], [], "length") for _ in range(batch)]
    done = np.zeros(batch, bool)
    for step in range(max_new_tokens):
        step_seeds = np.stack([np.asarray(seeds, np.int64) % (2**31), np.full(batch, step)], 1)
        tokens, logp = sample(last, temperature=temperature, top_p=top_p,
                              seeds=tf.constant(step_seeds, tf.int32))  # fmt: skip
        tokens = tokens.numpy()
        _record(results, done, tokens, logp.numpy(), eos_id, stop_suffixes, decode_text)
        if done.all() or step == max_new_tokens - 1:
            break
        valid = np.concatenate([valid, np.ones([batch, 1], bool)], axis=1)
        logits, cache = model.decode(tf.constant(tokens[:, None]), cache, tf.constant(valid))
        last = logits[:, -1]
    return results


class CompiledGenerator:
    """`generate` with compiled steps: the prefill (`tf.function`, one trace per padded batch
    and prompt-length bucket) and one decoding step (the model's token, sampling included;
    one trace per padded batch and sampling setting) over a cache whose shapes never change:
    each attention layer's key/value cache is `capacity` slots written in place at the step's
    position (`HybridDecoderModel.decode(position=...)`), each DeltaNet layer's state is O(1).

    Prompts are left-padded to a multiple of `bucket` tokens and the batch to a power of two
    (rows of padding only: their outputs are dropped), so a run traces a handful of shapes;
    the prefill runs `prefill_rows` rows at a time (its attention scores are rows x length^2).
    Same tokens as `generate` for the same seeds (the padding is exact; tested).

    `jit_compile` compiles the step with XLA: one fused kernel set instead of the graph's
    hundreds of small ops a token (measured 4.4x the graph's tokens/s at the `mini`'s batch of
    128, README "Generation"). It needs static shapes throughout the model: a dropless MoE on
    its capacity buffers (`MoEConfig.dispatch` "buffer"), not "sorted" (`tf.dynamic_partition`
    has no XLA kernel). The prefill stays a graph: one XLA compile per length bucket costs
    more than it saves.

    `step_rows` (0: the whole batch) decodes the batch in groups of that many rows, one step
    call each, with the same compiled step: a group whose rows have all stopped is skipped (the
    end of a turn decodes only the groups still writing), and a group's key/value cache stays
    small enough for the CPU's caches (measured, XLA, `mini` shape: 1.3 ms a token at 128
    rows, 0.6 ms at 16; README "Generation"). A row's tokens do not depend on its group.

    `chunked_prefill` prefills `bucket` tokens at a time, each chunk continuing the cache at
    its position (the step's fixed-capacity write and attention, the DeltaNet's chunked form
    from its state; the left padding stays exact): one trace for every prompt length instead
    of one per bucket (each a graph of the whole model: tens of seconds on a loaded CPU).

    `keep_cache`: `session()` gives a generator that keeps each row's cache across its calls
    (`ContinuingSession`: a multi-turn rollout's next turn appends only its new tokens, the
    tool's observation and the next header, instead of prefilling the conversation again).
    """

    def __init__(self, model, *, capacity: int, bucket: int = 64, prefill_rows: int = 8,
                 jit_compile: bool = False, step_rows: int = 0,
                 chunked_prefill: bool = False, keep_cache: bool = False):  # fmt: skip
        self.model, self.capacity, self.bucket = model, capacity, bucket
        self.prefill_rows = prefill_rows  # rows a prefill call takes (its memory is rows x P^2)
        if step_rows & (step_rows - 1):
            raise ValueError(f"step_rows ({step_rows}) must be 0 or a power of two")
        self.step_rows = step_rows
        self.chunked_prefill = chunked_prefill
        self.keep_cache = keep_cache
        # Each compiled call runs holding the split model's lock (nothing on an unsplit one):
        # two threads generating at once (the training rollouts' and the evaluation's
        # pipelines) take turns call by call (`split_decoding`: their collectives' keys clash).
        guard = exclusive(model)
        self._prefill = _Holding(guard, tf.function(self._prefill_fn))
        self._chunk = _Holding(guard, tf.function(self._chunk_fn))
        self._step = _Holding(guard, tf.function(self._step_fn, jit_compile=jit_compile))
        self._append = _Holding(guard, tf.function(self._append_fn))
        self._row_step = _Holding(guard, tf.function(self._row_step_fn, jit_compile=jit_compile))

    def session(self):
        """What one batch of multi-turn rollouts generates with (`run_rollouts`): with
        `keep_cache` a `ContinuingSession` (each row's cache kept from one call to the next),
        else this generator (every call prefills its prompts)."""
        return ContinuingSession(self) if self.keep_cache else self

    def warm_up(self, batches, *, token: int, shrinking: bool) -> None:
        """Runs every compiled call on each shape the rollouts will give it: `batches` lists
        (rows, temperature, top_p), a batch of rollouts and its sampling setting (both are
        part of a trace); with `shrinking` (multi-turn rollouts, whose batch shrinks as they
        finish) also every smaller power of two. One-token prompts of `token`, two tokens
        generated (no end token stops them). The traces (with `jit_compile` the XLA
        compiles) are the ones the rollouts then reuse: a run makes them before `run_start`,
        as it traces its train step, on data that is not the dataset's. Not covered: a plain
        prefill (`chunked_prefill` and `keep_cache` off) of prompts longer than one `bucket`
        (a trace per width). The weights are read, not changed, and the draws are stateless
        (`sample`'s seeds): nothing a run samples moves."""
        shapes = set()
        for rows, temperature, top_p in batches:
            batch = 1 << (rows - 1).bit_length()
            sizes = [1 << i for i in range(batch.bit_length())] if shrinking else [batch]
            shapes.update((size, temperature, top_p) for size in sizes)
        for size, temperature, top_p in sorted(shapes):
            self.session()([[token]] * size, max_new_tokens=2, eos_id=-1, pad_id=token,
                           temperature=temperature, top_p=top_p,
                           seeds=list(range(size)))  # fmt: skip

    def _append_fn(self, ids, cache, position, count):
        logits, cache = self.model.extend(ids, cache, position, count)
        last = tf.gather(logits, tf.maximum(count - 1, 0), axis=1, batch_dims=1)
        return last, cache  # [rows, vocab]: each row's last real token's logits

    def _row_step_fn(self, tokens, cache, position, count, seeds, temperature, top_p):
        logits, cache = self.model.extend(tokens[:, None], cache, position, count)
        tokens, logp = sample(logits[:, -1], temperature=temperature, top_p=top_p, seeds=seeds)
        return tokens, logp, cache

    def _prefill_fn(self, ids, valid):
        batch = ids.shape[0]
        logits, cache = self.model.decode(
            ids, self.model.empty_cache(batch, self.capacity), valid, position=0
        )
        return logits[:, -1], cache

    def _chunk_fn(self, ids, cache, valid, position):
        logits, cache = self.model.decode(ids, cache, valid, position=position)
        return logits[:, -1], cache

    def _prefill_rows(self, ids, valid):
        """(last logits, cache) of `ids` [rows, width]: one call (a trace per width), or with
        `chunked_prefill` one `bucket`-token chunk at a time from the cache (one trace)."""
        if not self.chunked_prefill:
            return self._prefill(tf.constant(ids), tf.constant(valid))
        cache = self.model.empty_cache(ids.shape[0], self.capacity)
        valid = tf.constant(valid)
        for start in range(0, ids.shape[1], self.bucket):
            last, cache = self._chunk(tf.constant(ids[:, start : start + self.bucket]), cache,
                                      valid, tf.constant(start, tf.int32))  # fmt: skip
        return last, cache

    def _step_fn(self, tokens, cache, valid, position, seeds, temperature, top_p):
        logits, cache = self.model.decode(tokens[:, None], cache, valid, position=position)
        tokens, logp = sample(logits[:, -1], temperature=temperature, top_p=top_p, seeds=seeds)
        return tokens, logp, cache

    def __call__(self, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int,
                 pad_id: int, temperature: float, top_p: float, seeds: list[int],
                 stop_suffixes=(), decode_text=None) -> list[Generated]:  # fmt: skip
        """`generate`'s arguments and results."""
        count = len(prompts)
        batch = 1 << (count - 1).bit_length()  # the next power of two
        width = -(-max(len(p) for p in prompts) // self.bucket) * self.bucket
        steps = min(max_new_tokens, self.capacity - width)
        if steps < 1:
            raise ValueError(f"a prompt of {width} tokens fills the cache ({self.capacity})")
        ids = np.full([batch, width], pad_id, np.int32)
        valid = np.zeros([batch, self.capacity], bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = p
            valid[i, width - len(p) : width] = True
        rows = min(batch, self.prefill_rows)
        parts = [self._prefill_rows(ids[i : i + rows], valid[i : i + rows])
                 for i in range(0, batch, rows)]  # fmt: skip
        last = tf.concat([p[0] for p in parts], axis=0)
        cache = tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=0), *[p[1] for p in parts])
        group = min(batch, self.step_rows or batch)  # both powers of two: `group` divides
        caches = [tf.nest.map_structure(lambda x, g=g: x[g : g + group], cache)
                  for g in range(0, batch, group)]  # fmt: skip

        def step_group(index, rows, step, tokens, step_seeds, fed):
            valid[rows, width + step - 1] = True
            t, lp, caches[index] = self._step(
                tf.constant(tokens[rows]), caches[index], tf.constant(valid[rows]),
                tf.constant(width + step - 1, tf.int32), tf.constant(step_seeds[rows]),
                temperature, top_p,
            )  # fmt: skip
            return t, lp

        return _decode_loop(last, count, group, steps, seeds, step_group, temperature=temperature,
                            top_p=top_p, eos_id=eos_id, stop_suffixes=stop_suffixes,
                            decode_text=decode_text)  # fmt: skip


class _Holding:
    """`fn` (a `tf.function`) called with `guard` held (a lock, or `contextlib.nullcontext`);
    its other attributes (`experimental_get_tracing_count`, ...) are the function's."""

    def __init__(self, guard, fn):
        self._guard, self._fn = guard, fn

    def __call__(self, *args, **kwargs):
        with self._guard:
            return self._fn(*args, **kwargs)

    def __getattr__(self, name):
        if name == "_fn":  # not set yet (a copy): no recursion
            raise AttributeError(name)
        return getattr(self._fn, name)


def _decode_loop(last, count: int, group: int, steps: int, seeds, step_group, *, temperature,
                 top_p, eos_id, stop_suffixes, decode_text) -> list[Generated]:  # fmt: skip
    """The decoding loop of both compiled paths: the first token sampled from the prompts'
    `last` logits [batch, vocab], then up to `steps` - 1 more, each by
    `step_group(index, rows, step, tokens, step_seeds, fed)` (the group `index`'s slice `rows`
    of the batch; `fed` [batch] int32, 1 on rows still generating) for every group of `group`
    rows with a row still generating (a group whose rows have all stopped is skipped)."""
    batch = last.shape[0]
    row_seeds = np.zeros(batch, np.int64)
    row_seeds[:count] = np.asarray(seeds, np.int64) % (2**31)
    results = [Generated([], [], "length") for _ in range(count)]
    done = np.zeros(count, bool)
    finished = np.ones(batch, bool)  # rows done or batch padding (never decoded again)
    tokens = logp = None
    for step in range(steps):
        step_seeds = np.stack([row_seeds, np.full(batch, step)], 1).astype(np.int32)
        if step == 0:
            tokens, logp = sample(tf.constant(last), temperature=temperature, top_p=top_p,
                                  seeds=tf.constant(step_seeds))  # fmt: skip
            tokens, logp = tokens.numpy(), logp.numpy()
        else:
            fed = (~finished).astype(np.int32)  # a stopped row is fed nothing more
            for index, start in enumerate(range(0, batch, group)):
                rows = slice(start, start + group)
                if finished[rows].all():  # every row of the group has stopped: skip it
                    continue
                t, lp = step_group(index, rows, step, tokens, step_seeds, fed)
                tokens[rows], logp[rows] = t.numpy(), lp.numpy()
        _record(results, done, tokens, logp, eos_id, stop_suffixes, decode_text)
        finished[:count] = done
        if done.all():
            break
    return results


def _split_rows(cache, size: int) -> list:
    """The batch cache in groups of `size` rows (each a structure like the cache)."""
    batch = tf.nest.flatten(cache)[0].shape[0]
    return [tf.nest.map_structure(lambda x, g=g: x[g : g + size], cache)
            for g in range(0, batch, size)]  # fmt: skip


def _join_rows(groups: list):
    """`_split_rows`' inverse."""
    return tf.nest.map_structure(lambda *xs: tf.concat(xs, axis=0), *groups)


class ContinuingSession:
    """A `CompiledGenerator` that keeps each row's cache from one call to the next: a prompt
    that continues a row of the previous call (that row's prompt and generated tokens, all
    but the last, which was never fed) appends only its new tokens to that row's cache, each
    row at its own length (`HybridDecoderModel.extend`: per-row positions; padding leaves the
    DeltaNet state, its convolution state and the attention cache as they were), and a row
    that stops waits, unchanged, while the others decode. A prompt that continues no row
    starts from an empty cache. The tokens are `generate`'s for the same seeds (the same
    function: each row's tokens at their own positions, no padding anywhere; floats as
    close as two orders of summation; tested, greedy and sampled).

    One session serves one batch of rollouts (`run_rollouts`): the weights must not change
    between its calls (a kept cache is of the weights that wrote it). Its cache
    (`capacity` slots a row) is held from a call to the next.
    """

    def __init__(self, generator: CompiledGenerator):
        self.generator = generator
        self.rows: list[list[int]] = []  # the tokens each kept row's cache holds
        self.cache = None  # the previous call's batch cache (rows in `self.rows`' order)
        self.appended = 0  # tokens the last call appended (its prompts' new tokens)

    def _sources(self, prompts) -> list[int]:
        """For each prompt, the kept row it continues (in order, as `run_rollouts` drops
        finished rollouts and keeps the rest in order) or -1."""
        sources, start = [], 0
        for p in prompts:
            k = start
            while k < len(self.rows) and not (
                len(self.rows[k]) <= len(p) and p[: len(self.rows[k])] == self.rows[k]
            ):
                k += 1
            if k < len(self.rows):
                sources.append(k)
                start = k + 1
            else:
                sources.append(-1)
        return sources

    def __call__(self, prompts: list[list[int]], *, max_new_tokens: int, eos_id: int,
                 pad_id: int, temperature: float, top_p: float, seeds: list[int],
                 stop_suffixes=(), decode_text=None) -> list[Generated]:  # fmt: skip
        """`generate`'s arguments and results."""
        g = self.generator
        count = len(prompts)
        batch = 1 << (count - 1).bit_length()
        sources = self._sources(prompts) + [-1] * (batch - count)
        empty = g.model.empty_cache(1, g.capacity)
        if self.cache is None:
            cache = g.model.empty_cache(batch, g.capacity)
        else:  # the kept rows, an empty one (index len(rows)) for every new or padding row
            fresh = len(tf.nest.flatten(self.cache)[0])
            index = tf.constant([s if s >= 0 else fresh for s in sources], tf.int32)
            cache = tf.nest.map_structure(
                lambda old, zero: tf.gather(tf.concat([old, zero], axis=0), index),
                self.cache, empty,
            )  # fmt: skip
        length = np.array([len(self.rows[s]) if s >= 0 else 0 for s in sources], np.int32)
        suffixes = [p[length[i] :] for i, p in enumerate(prompts)]
        suffixes += [[] for _ in range(batch - count)]
        if min(len(x) for x in suffixes[:count]) < 1:
            raise ValueError("a prompt adds no token to the row it continues")
        added = np.array([len(x) for x in suffixes], np.int32)
        self.appended = int(added.sum())
        if int((length + added).max()) >= g.capacity:
            raise ValueError(f"a prompt of {int((length + added).max())} tokens fills the "
                             f"cache ({g.capacity})")  # fmt: skip
        rows = min(batch, g.prefill_rows)
        parts = _split_rows(cache, rows)
        last = None  # [batch, vocab]: each row's last prompt token's logits
        for start in range(0, int(added.max()), g.bucket):
            ids = np.full([batch, g.bucket], pad_id, np.int32)
            for i, x in enumerate(suffixes):
                chunk = x[start : start + g.bucket]
                ids[i, : len(chunk)] = chunk
            real = np.clip(added - start, 0, g.bucket).astype(np.int32)
            for index, r in enumerate(range(0, batch, rows)):
                part = slice(r, r + rows)
                if not real[part].any():  # no row of this group has tokens left
                    continue
                out, parts[index] = g._append(
                    tf.constant(ids[part]), parts[index], tf.constant(length[part] + start),
                    tf.constant(real[part]),
                )  # fmt: skip
                if last is None:
                    last = np.zeros([batch, out.shape[-1]], np.float32)
                has = real[part] > 0
                last[part][has] = out.numpy()[has]
        length = length + added
        group = min(batch, g.step_rows or batch)
        caches = _split_rows(_join_rows(parts), group)
        steps = min(max_new_tokens, g.capacity - int(length.max()))

        def step_group(index, rows, step, tokens, step_seeds, fed):
            t, lp, caches[index] = g._row_step(
                tf.constant(tokens[rows]), caches[index], tf.constant(length[rows]),
                tf.constant(fed[rows]), tf.constant(step_seeds[rows]), temperature, top_p,
            )  # fmt: skip
            length[rows] += fed[rows]  # a stopped row's cache stays as it was
            return t, lp

        results = _decode_loop(last, count, group, steps, seeds, step_group,
                               temperature=temperature, top_p=top_p, eos_id=eos_id,
                               stop_suffixes=stop_suffixes, decode_text=decode_text)  # fmt: skip
        self.rows = [p + out.tokens[:-1] for p, out in zip(prompts, results, strict=True)]
        self.cache = _join_rows(caches)
        return results
