"""Provides `run_rollouts`: many concurrent multi-turn agent rollouts, each in its own
`Environment`, generated together turn by turn, and `Rollout`, what the policy update needs
from one (its tokens, which of them the policy wrote, their generation log-probs, the reward,
whether it was cut by the length limit).

A turn: every unfinished rollout's conversation so far is prefilled (left-padded, one batch),
the policy generates until end-of-turn, a closed tool call or the turn's token limit, and the
environment answers the tool calls; the answer joins the conversation as a tool-response
message. A rollout ends when the agent calls `finish`, writes no tool call, runs out of turns,
or reaches `max_length` tokens or a turn's limit (then `truncated`: it still gets its reward
from the environment, and overlong filtering drops it from the update). Between turns the
conversation is prefilled again, unless the generator keeps each rollout's cache across its
turns (`CompiledGenerator(keep_cache=True).session()`: only the observation and the next
header are appended; the reference's vLLM keeps a prefix cache).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time

from mlperf_tf.errors import UserError
from mlperf_tf.rl.chat import ByteChat, TemplateChat
from mlperf_tf.rl.generation import generate
from mlperf_tf.rl.tool_calls import CALL_CLOSE


@dataclasses.dataclass
class Rollout:
    tokens: list[int]
    policy_mask: list[int]  # 1 on tokens the policy generated, 0 on prompts and tool output
    logprobs: list[float]  # the generator's log-prob of each token (0 where policy_mask is 0)
    reward: float = 0.0
    truncated: bool = False
    turns: int = 0
    errors: int = 0
    invalid: bool = False  # cut by the agent timeout (`Turn.invalid`); also `truncated`

    def extend(self, tokens, *, policy: bool, logprobs=None):
        self.tokens += tokens
        self.policy_mask += [int(policy)] * len(tokens)
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(tokens)


@dataclasses.dataclass
class RolloutClock:
    """Where rollouts' time goes, summed over every `run_rollouts` call given it (for `bench`'s
    shares of a step): the generator's calls (prefill and decoding) and the tokens they
    generated, and the environments' (reset, tool calls, the reward's test run); and, added
    by whoever makes the training batches of them, the policy tokens those batches train
    (`trained_tokens`). Read and written under `lock` (the input pipeline's thread writes,
    the caller's reads)."""

    generation_s: float = 0.0
    generated_tokens: int = 0
    environment_s: float = 0.0
    rollouts: int = 0
    trained_tokens: float = 0.0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def add(self, **amounts) -> None:
        with self.lock:
            for name, value in amounts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, float]:
        with self.lock:
            return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                    if f.name != "lock"}  # fmt: skip


class _Stopwatch:
    """Seconds spent inside `with` blocks."""

    def __init__(self):
        self.seconds = 0.0

    def __enter__(self):
        self._begin = time.perf_counter()

    def __exit__(self, *exc):
        self.seconds += time.perf_counter() - self._begin


def run_rollouts(model, environments, tasks, *, chat: ByteChat | TemplateChat, max_turns: int,
                 max_turn_tokens: int, max_length: int, temperature: float, top_p: float,
                 seed: int, ids=None, clock: RolloutClock | None = None) -> list[Rollout]:  # fmt: skip
    """One rollout per (environment, task) pair, all generated together.

    Args:
      model: a decoder with `empty_cache` and `decode` (eager `generation.generate`), or a
        generator called as `generate` is without its model: a `generation.CompiledGenerator`
        (compiled steps, the same tokens) or a scripted policy (the expert trajectories).
      environments: one `Environment` per rollout (each resets to its task here).
      tasks: the tasks, as many as environments.
      chat: the tokenizer and chat layout (`mlperf_tf.rl.chat`): its first turn, the end of a
        turn a tool call stopped, a tool's response with the next generation prompt.
      max_turns: agent turns per rollout.
      max_turn_tokens: tokens one turn may generate.
      max_length: a rollout's whole length (prompt, turns, tool output) in tokens.
      temperature, top_p: sampling.
      seed: the sampling seed.
      ids: one int per rollout (default its position): rollout i's tokens depend on the seed,
        its id and its own context only, not on the other rollouts of the batch.
      clock: where the generator's and the environments' seconds and the generated tokens
        are added (None: not timed).

    Returns:
      The rollouts, in the tasks' order, each with its reward from the environment.
    """
    rollouts = []
    generating, acting = _Stopwatch(), _Stopwatch()
    generated = 0
    for env, task in zip(environments, tasks, strict=True):
        with acting:
            prompt = env.reset(task)
        r = Rollout([], [], [])
        r.extend(chat.start(prompt), policy=False)
        if len(r.tokens) >= max_length:
            raise UserError(
                f"task {getattr(task, 'task_id', task)!r}: its prompt is {len(r.tokens)} tokens, "
                f"not below the rollout length limit ({max_length})"
            )
        rollouts.append(r)
    ids = list(range(len(rollouts))) if ids is None else list(ids)
    if hasattr(model, "decode"):
        generator = functools.partial(generate, model)
    else:  # a `CompiledGenerator` may keep each rollout's cache across its turns
        generator = model.session() if hasattr(model, "session") else model
    active = list(range(len(rollouts)))
    for turn in range(max_turns):
        if not active:
            break
        with generating:
            outs = generator(
                [rollouts[i].tokens for i in active], max_new_tokens=max_turn_tokens,
                eos_id=chat.IM_END, pad_id=chat.PAD, temperature=temperature, top_p=top_p,
                seeds=[(seed * 1_000_003 + ids[i]) * 101 + turn for i in active],
                stop_suffixes=(CALL_CLOSE,), decode_text=chat.decode,
            )  # fmt: skip
        still = []
        for i, out in zip(active, outs, strict=True):
            r = rollouts[i]
            r.extend(out.tokens, policy=True, logprobs=out.logprobs)
            r.turns += 1
            generated += len(out.tokens)
            with acting:
                answer = environments[i].act(chat.decode(out.tokens))
            r.errors += answer.errors
            if answer.invalid:  # never a sample: dropped from the update as a truncated one
                r.invalid = r.truncated = True
                continue
            if out.stop == "length" or len(r.tokens) >= max_length:
                r.truncated = True  # the environment saw the cut turn (a tool call in it ran)
                continue
            if answer.done:
                continue
            if out.stop != "eos":  # close the assistant turn the tool call ended
                r.extend(chat.end_turn(), policy=False)
            r.extend(chat.after_tool(answer.observation), policy=False)
            if len(r.tokens) >= max_length:
                r.truncated = True
                continue
            still.append(i)
        active = still
    # A rollout out of turns ended without `finish`: its reward is its state's, as it stands.
    for r, env in zip(rollouts, environments, strict=True):
        with acting:
            r.reward = env.reward()  # truncated ones too; overlong filtering drops them
        del r.tokens[max_length:], r.policy_mask[max_length:], r.logprobs[max_length:]
    if clock is not None:
        clock.add(generation_s=generating.seconds, generated_tokens=generated,
                  environment_s=acting.seconds, rollouts=len(rollouts))  # fmt: skip
    return rollouts
