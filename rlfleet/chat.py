"""Chat templates at the token level: first prompts, the ids an environment turn adds, tool calls.

Turn t+1's prompt is turn t's ids plus the ids of the new messages, never a re-rendering of the
conversation: a re-tokenized sample can differ from what the model sampled (verl #6501, #6719),
and then the trainer grades tokens the model never produced. The new messages' ids are found by
rendering a fixed two-message conversation with and without them and tokenizing the difference,
plus whatever the template writes after an assistant message that the model did not sample
itself (e.g. the newline after Qwen's `<|im_end|>`).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

_SENTINEL = "\x00rlfleet-turn\x00"
_BASE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _SENTINEL}]


def render(
    tok: PreTrainedTokenizerBase, messages: list[dict], tools: list[dict] | None, generation: bool
) -> str:
    return tok.apply_chat_template(
        messages, tools=tools or None, add_generation_prompt=generation, tokenize=False
    )


def prompt_ids(
    tok: PreTrainedTokenizerBase, prompt: str | list[dict], tools: list[dict], chat: bool
) -> list[int]:
    """The first prompt's ids: the chat template over the messages, or BOS + raw text."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return tok(render(tok, messages, tools, True), add_special_tokens=False)["input_ids"]
    assert isinstance(prompt, str)
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    return [tok.bos_token_id, *ids] if tok.bos_token_id is not None else ids


def continuation_ids(
    tok: PreTrainedTokenizerBase, new_messages: list[dict], tools: list[dict], sampled_tail: str
) -> list[int]:
    """Ids that follow a finished assistant turn: the rest of its closing text, the new messages
    and the next generation prompt. `sampled_tail` is the decoded last sampled token (an EOS the
    template writes as its closing text is not written twice)."""
    before = render(tok, _BASE, tools, False)
    after = render(tok, _BASE + new_messages, tools, True)
    if not after.startswith(before):
        raise ValueError(
            "the chat template renders earlier messages differently once new ones follow; "
            "multi-turn rollouts need a template that only appends"
        )
    closing = before[before.rindex(_SENTINEL) + len(_SENTINEL) :]
    if sampled_tail and closing.startswith(sampled_tail):
        closing = closing[len(sampled_tail) :]
    return tok(closing + after[len(before) :], add_special_tokens=False)["input_ids"]


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_assistant(text: str) -> dict[str, Any]:
    """An assistant message from sampled text; `<tool_call>{"name", "arguments"}</tool_call>`
    blocks (the Hermes format of Qwen and most open chat templates) become `tool_calls`. A block
    that is not valid JSON stays in the content and is not called."""
    calls, content = [], text
    for m in _TOOL_CALL.finditer(text):
        try:
            body = json.loads(m.group(1))
            name, arguments = body["name"], body.get("arguments", {})
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                continue
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:8]}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
        )
        content = content.replace(m.group(0), "")
    message: dict[str, Any] = {"role": "assistant", "content": content.strip() if calls else text}
    if calls:
        message["tool_calls"] = calls
    return message
