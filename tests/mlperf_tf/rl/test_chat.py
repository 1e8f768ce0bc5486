"""`mlperf_tf.rl.chat.TemplateChat`: a checkpoint's tokenizer and chat template, read from a
folder these tests write (`tests.tiny_chat`: a byte-level BPE, a Qwen-shaped template), against
the renderings the template's own text defines, written out literally."""

from __future__ import annotations

import json
import os

import pytest

from mlperf_tf.errors import UserError
from mlperf_tf.rl.chat import load_template_chat
from tests.tiny_chat import TEMPLATE, TOOL
from tests.tiny_chat import write_chat_checkpoint as _write_checkpoint


@pytest.fixture
def checkpoint(tmp_path):
    folder = str(tmp_path / "ckpt")
    return folder, _write_checkpoint(folder)


def _chat(folder, **kw):
    kw.setdefault("system", "You are a helpful agent.")
    kw.setdefault("tools", [TOOL])
    kw.setdefault("template_kwargs", {"enable_thinking": False})
    return load_template_chat(folder, **kw)


def test_the_first_turn_is_the_whole_rendering_with_system_prompt_tools_and_no_thinking(checkpoint):
    folder, tok = checkpoint
    chat = _chat(folder)
    text = ("<|im_start|>system\nYou are a helpful agent.\n\n# Tools\n<tools>\n"
            + json.dumps(TOOL) + "\n</tools><|im_end|>\n<|im_start|>user\nFix calc.py<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # fmt: skip
    tokens = chat.start("Fix calc.py")
    assert tokens == tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(tokens, skip_special_tokens=False) == text
    assert tokens.count(tok.token_to_id("<|im_start|>")) == 3  # each a single id
    assert chat.IM_END == tok.token_to_id("<|im_end|>")
    assert chat.PAD == tok.token_to_id("<|endoftext|>")
    assert chat.vocab_size == tok.get_vocab_size(with_added_tokens=True)


def test_turn_by_turn_tokens_equal_the_whole_conversation_encoded(checkpoint):
    folder, tok = checkpoint
    chat = _chat(folder, tools=[])
    call = "Let me look.\n<tool_call>\n<function=execute_bash>\n</function>\n</tool_call>"
    tokens = chat.start("Fix calc.py") + chat.encode(call) + chat.end_turn()
    tokens += chat.after_tool("  FAILED test_sub\n")  # the observation's spaces kept
    whole = ("<|im_start|>system\nYou are a helpful agent.<|im_end|>\n<|im_start|>user\n"
             "Fix calc.py<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n" + call
             + "<|im_end|>\n<|im_start|>user\n<tool_response>\n  FAILED test_sub\n\n"
             "</tool_response><|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")  # fmt: skip
    assert tokens == tok.encode(whole, add_special_tokens=False).ids


def test_decode_drops_special_tokens_and_keeps_the_tool_call_tags(checkpoint):
    folder, tok = checkpoint
    chat = _chat(folder)
    text = "<tool_call>\n<function=finish>\n</function>\n</tool_call>"
    assert chat.decode(chat.encode(text) + [chat.IM_END]) == text


def test_chat_template_jinja_is_read_before_tokenizer_config(tmp_path):
    folder = str(tmp_path / "ckpt")
    _write_checkpoint(folder, TEMPLATE.replace("# Tools", "# Functions"), in_config=False)
    assert "# Functions" in _chat(folder).decode(_chat(folder).start("x"))


def test_a_template_that_rerenders_earlier_turns_keeps_the_generated_tokens(tmp_path):
    """Like Qwen3's template, this one gives the last assistant message an empty think block and
    earlier ones none. The reference's server keeps a conversation's own tokens and appends what
    follows the last assistant turn's end token: so do the rollouts (the generation prompt's
    think block stays in the first turn)."""
    folder = str(tmp_path / "ckpt")
    qwen3_like = TEMPLATE.replace(
        "{{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}",
        "{{- '<|im_start|>assistant\\n' + ('<think>\\n\\n</think>\\n\\n' if loop.last else '')"
        " + message.content + '<|im_end|>\\n' }}",
    )
    assert qwen3_like != TEMPLATE
    tok = _write_checkpoint(folder, qwen3_like)
    chat = _chat(folder, tools=[])
    call = "<tool_call>\n<function=think>\n</function>\n</tool_call>"
    tokens = chat.start("Fix it") + chat.encode(call) + chat.end_turn() + chat.after_tool("ok")
    head = ("<|im_start|>system\nYou are a helpful agent.<|im_end|>\n<|im_start|>user\nFix it"
            "<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    tail = ("<|im_end|>\n<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")  # fmt: skip
    spliced = head + "<think>\n\n</think>\n\n" + call + tail
    assert tokens == tok.encode(spliced, add_special_tokens=False).ids
    rerendered = head + call + tail  # the template's own view of the history
    assert tokens != tok.encode(rerendered, add_special_tokens=False).ids


@pytest.mark.parametrize(
    "damage, message",
    [
        ("no_tokenizer", "no tokenizer.json"),
        ("corrupt_tokenizer", "not a Hugging Face tokenizer.json"),
        ("corrupt_config", "tokenizer config .*tokenizer_config.json.* is not valid JSON"),
        ("no_template", "no chat template"),
        ("bad_syntax", "chat template does not parse"),
        ("raises", "chat template does not render: unknown role"),
        ("no_end_token", "end-of-turn token '<|end|>' is not in tokenizer.json"),
        ("unended", "assistant message is not rendered as its content followed by the end-of"),
    ],
)
def test_a_wrong_or_corrupt_checkpoint_is_one_line(tmp_path, damage, message):
    folder = str(tmp_path / "ckpt")
    template = {"bad_syntax": "{% if %}", "raises": "{{ raise_exception('unknown role x') }}",
                "unended": "{% for m in messages %}{{ m.content }}{% endfor %}"}  # fmt: skip
    _write_checkpoint(folder, template.get(damage, TEMPLATE))
    config = os.path.join(folder, "tokenizer_config.json")
    if damage == "no_tokenizer":
        os.remove(os.path.join(folder, "tokenizer.json"))
    elif damage == "corrupt_tokenizer":
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            f.write('{"version": "1.0", "model": ')
    elif damage == "corrupt_config":
        with open(config, "w") as f:
            f.write("{")
    elif damage == "no_template":
        with open(config, "w") as f:
            json.dump({"eos_token": "<|im_end|>"}, f)
    kw = {"end_token": "<|end|>"} if damage == "no_end_token" else {}
    with pytest.raises(UserError, match=message) as e:
        _chat(folder, **kw)
    assert "\n" not in str(e.value)
