"""Provides the chat layouts rollouts speak: `ByteChat`, the `mini` and `smoke` presets' (bytes as
tokens in Qwen's ChatML layout: no vocabulary file to ship or download), and `TemplateChat`, a
Hugging Face chat checkpoint's own: its `tokenizer.json` and its chat template, with the run's
system prompt and tools. `load_template_chat` reads one from a checkpoint folder.

A rollout is one token list that grows turn by turn (the policy's tokens are kept as they were
generated: the update trains exactly what was sampled). So a chat gives the pieces a rollout
appends, not whole renderings:

- `start(task)`: the first turn (system prompt and tools, the task as the user's message, the
  generation prompt);
- `end_turn()`: what closes an assistant turn that a tool call stopped before its end token;
- `after_tool(observation)`: the tool's response and the next generation prompt.

`TemplateChat` renders the template as transformers' `apply_chat_template` does (a sandboxed
Jinja environment with `trim_blocks` and `lstrip_blocks`, loop controls, `tojson`,
`raise_exception`, `strftime_now`, the special tokens of `tokenizer_config.json` as variables,
`messages`, `tools`, `add_generation_prompt` and the run's template settings, e.g. Qwen3.5's
`enable_thinking`). A later turn is spliced as the reference's generation server splices it
(NeMo-RL's vLLM server, `nemo_rl/models/generation/openai_server_utils.py`
`replace_prefix_tokens`, read at 7ea279ab: the conversation's earlier prompt and generated
tokens and an end token are kept, and what the re-rendered conversation has after the last
assistant turn's end token is appended): a template may render earlier assistant turns
differently from how they were generated (Qwen3's drops the empty think block of a turn that is
no longer the last), and the model still sees, and the update still trains, exactly the tokens
it produced. So `end_turn` is the end token, and `after_tool` is what follows that token in the
rendering of a probe conversation with the tool's message added, through the next generation
prompt. Each piece is tokenized on its own; they meet at special tokens (`<|im_end|>`,
`<|im_start|>`), which no merge crosses.
"""

from __future__ import annotations

import datetime
import json
import os

from mlperf_tf.errors import UserError
from mlperf_tf.hf_checkpoint import read_json


class ByteChat:
    """Bytes as tokens (0-255) plus ChatML's `<|im_start|>`, `<|im_end|>` and a pad: the
    `mini` and `smoke` presets' tokenizer (no vocabulary file to ship or download). No system
    prompt (the minis' tasks carry their instructions)."""

    IM_START, IM_END, PAD = 256, 257, 258
    vocab_size = 259

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, tokens) -> str:
        return bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")

    def message(self, role: str, text: str) -> list[int]:
        """`<|im_start|>role\\ntext<|im_end|>\\n`."""
        return [self.IM_START, *self.encode(f"{role}\n{text}"), self.IM_END, *self.encode("\n")]

    def assistant_header(self) -> list[int]:
        return [self.IM_START, *self.encode("assistant\n")]

    def tool_response(self, observation: str) -> list[int]:
        """Qwen's tool result turn: a user message wrapping `<tool_response>`."""
        return self.message("user", f"<tool_response>\n{observation}\n</tool_response>")

    def start(self, task: str) -> list[int]:
        return self.message("user", task) + self.assistant_header()

    def end_turn(self) -> list[int]:
        return [self.IM_END, *self.encode("\n")]

    def after_tool(self, observation: str) -> list[int]:
        return self.tool_response(observation) + self.assistant_header()


# Probe contents for the template's pieces: plain words (templates may strip or split
# whitespace), unlikely in a template's own text.
_PROBE_TASK = "probe-task-5c1e"
_PROBE_REPLY = "probe-reply-5c1e"


class TemplateChat:
    """A Hugging Face chat checkpoint's tokenizer and chat template (module docstring).

    Args:
      tokenizer: a `tokenizers.Tokenizer` (the checkpoint's `tokenizer.json`).
      template: the chat template's Jinja source.
      special_tokens: the template's special-token variables (`bos_token`, `eos_token`, ...).
      end_token: the token that ends an assistant turn (Qwen: `<|im_end|>`).
      pad_token: the pad token (Qwen: `<|endoftext|>`).
      system: the system prompt ("" for none).
      tools: the tools as OpenAI function schemas (`{"type": "function", "function": {...}}`),
        rendered into the first turn by the template.
      template_kwargs: more template variables (Qwen3.5: `{"enable_thinking": False}`).

    Raises:
      UserError: a token is not in the vocabulary, or the template does not render, or it does
        not end an assistant turn with `end_token` (one line naming which).
    """

    def __init__(self, tokenizer, template: str, *, special_tokens: dict[str, str],
                 end_token: str, pad_token: str, system: str = "", tools=(),
                 template_kwargs: dict | None = None):  # fmt: skip
        self._tokenizer = tokenizer
        self._special = dict(special_tokens)
        self._system = system
        self._tools = list(tools) or None
        self._kwargs = dict(template_kwargs or {})
        self._template = _compile(template)
        self.IM_END = self._token_id(end_token, "end-of-turn")
        self.PAD = self._token_id(pad_token, "pad")
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._end_token = end_token
        self._reply = [*self._head(_PROBE_TASK), {"role": "assistant", "content": _PROBE_REPLY}]
        self._after_reply(self._render(self._reply))  # a template without the end token fails here

    def _token_id(self, token: str, what: str) -> int:
        token_id = self._tokenizer.token_to_id(token) if token else None
        if token_id is None:
            raise UserError(f"chat template: the {what} token {token!r} is not in tokenizer.json")
        return token_id

    def _head(self, task: str) -> list[dict]:
        system = [{"role": "system", "content": self._system}] if self._system else []
        return [*system, {"role": "user", "content": task}]

    def _render(self, messages, generation_prompt: bool = False) -> str:
        import jinja2  # noqa: PLC0415 (a checkpoint's template only)

        try:
            return self._template.render(
                messages=messages, tools=self._tools, add_generation_prompt=generation_prompt,
                **self._special, **self._kwargs,
            )  # fmt: skip
        except jinja2.TemplateError as e:
            raise UserError(f"chat template does not render: {e}") from None

    def _after_reply(self, text: str) -> str:
        """What `text` (a rendering of the probe conversation) has after the probe assistant
        turn's end token."""
        at = text.rfind(_PROBE_REPLY)
        end = text.find(self._end_token, at) if at >= 0 else -1
        if end < 0:
            raise UserError(
                "chat template: an assistant message is not rendered as its content followed by "
                f"the end-of-turn token {self._end_token!r}"
            )
        return text[end + len(self._end_token) :]

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, tokens) -> str:
        return self._tokenizer.decode(list(tokens), skip_special_tokens=True)

    def start(self, task: str) -> list[int]:
        return self.encode(self._render(self._head(task), generation_prompt=True))

    def end_turn(self) -> list[int]:
        return [self.IM_END]

    def after_tool(self, observation: str) -> list[int]:
        conversation = [*self._reply, {"role": "tool", "content": observation}]
        return self.encode(self._after_reply(self._render(conversation, generation_prompt=True)))


def _compile(source: str):
    """The template in transformers' Jinja environment (`apply_chat_template`'s)."""
    try:
        import jinja2  # noqa: PLC0415
        from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: PLC0415
    except ImportError:
        raise UserError("a checkpoint's chat template needs jinja2: pip install jinja2") from None

    def raise_exception(message):
        raise jinja2.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)  # fmt: skip

    def strftime_now(format):
        return datetime.datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise UserError(f"chat template does not parse: {e}") from None


def _token_text(value) -> str:
    """A special token of `tokenizer_config.json`: a string or an AddedToken's dict."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def load_template_chat(folder: str, *, system: str = "", tools=(), template_kwargs=None,
                       end_token: str = "<|im_end|>") -> TemplateChat:  # fmt: skip
    """The chat of a Hugging Face checkpoint folder: `tokenizer.json`, `tokenizer_config.json`
    (special tokens; the template when there is no `chat_template.jinja`, as transformers
    reads it), the run's system prompt, tools and template settings.

    Raises:
      UserError: a file is missing or corrupt, there is no chat template, or the template
        does not render (one line naming the file or the problem).
    """
    path = os.path.join(folder, "tokenizer.json")
    if not os.path.isfile(path):
        raise UserError(f"{folder}: no tokenizer.json (the checkpoint's tokenizer)")
    try:
        import tokenizers  # noqa: PLC0415
    except ImportError:
        raise UserError("reading tokenizer.json needs the `tokenizers` package") from None
    try:
        tokenizer = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # noqa: BLE001 (the Rust reader's errors have no common type)
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{path}: not a Hugging Face tokenizer.json: {first}") from None
    config = read_json(os.path.join(folder, "tokenizer_config.json"), "tokenizer config")
    jinja_path = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            template = f.read()
    else:
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
    if not isinstance(template, str) or not template:
        raise UserError(
            f"{folder}: no chat template (chat_template.jinja or tokenizer_config.json)"
        )
    special = {
        key: _token_text(value) for key, value in config.items()
        if key.endswith("_token") and isinstance(value, (str, dict))
    }  # fmt: skip
    pad = special.get("pad_token") or special.get("eos_token", "")
    return TemplateChat(tokenizer, template, special_tokens=special, end_token=end_token,
                        pad_token=pad, system=system, tools=tools,
                        template_kwargs=template_kwargs)  # fmt: skip
