"""Chat requests on the replica: turn a DISPATCH's `messages` (and `tools`) into prompt token ids.

Owns: rendering a conversation with the tokenizer's own chat template (the replica is the only
process that has the tokenizer), the choice between giving the template the tools and the
tool-call history as they are (a template that uses them) or as text (`tool_prompt.py`, for
one that does not), and the error a model without a template gives. It never tokenizes plain
prompts (the engine does) and never imports torch itself.

To support another conversation feature (multimodal parts), extend the message struct in
`protocol/chat.py` first, then pass the new keys through here.
"""

from __future__ import annotations

from typing import Optional, Union

from infer_cluster.protocol import InvalidRequestError

from .tool_prompt import (history_as_text, mentions, template_messages, tool_turns_as_user,
                          with_tools_instruction)


def prompt_of(msg, tokenizer) -> Union[str, list]:
    """The engine prompt of a `DispatchRequest`: its text, its token ids, or its chat
    `messages` (with its `tools`) rendered to token ids by the model's chat template."""
    if msg.messages is None:
        return msg.prompt if msg.prompt is not None else msg.prompt_token_ids
    tools = [t.to_openai() for t in msg.tools] if msg.tools else None
    return render_chat(tokenizer, [m.to_dict() for m in msg.messages], tools)


def render_chat(tokenizer, messages: list[dict], tools: Optional[list[dict]] = None) -> list[int]:
    """Token ids of `messages` (wire form: `ChatMessage.to_dict()`) followed by the assistant's
    generation prompt; `tools` in OpenAI's form. Raises `InvalidRequestError` when the model
    has no chat template or the template rejects the conversation."""
    return render_chats(tokenizer, [messages], tools)[0]


def render_chats(tokenizer, conversations: list[list[dict]],
                 tools: Optional[list[dict]] = None) -> list[list[int]]:
    """`render_chat` for several conversations: each is rendered to text, then all are tokenized
    in one batch call, which a fast tokenizer encodes on several threads (H200 host, 2026-11-30:
    eight ~1.1k-token SmolLM2 chats took 18 ms one at a time)."""
    texts = [render_chat_text(tokenizer, messages, tools) for messages in conversations]
    # The template already wrote any BOS it wants; adding special tokens again would double it.
    if len(texts) > 1 and callable(tokenizer):
        all_ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    else:
        all_ids = [tokenizer.encode(text, add_special_tokens=False) for text in texts]
    if not all(all_ids):
        raise InvalidRequestError("the rendered chat prompt is empty")
    return all_ids


def render_chat_text(tokenizer, messages: list[dict], tools: Optional[list[dict]] = None) -> str:
    """The text `render_chat` tokenizes: the chat template applied, with the tools as the
    template takes them or written as text (module docstring)."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "this model has no chat template, so /v1/chat/completions cannot render messages; "
            "use /v1/completions with a prompt, or serve a model whose tokenizer_config.json "
            "has a chat_template")
    has_history = any(m.get("tool_calls") or m["role"] == "tool" for m in messages)
    if mentions(tokenizer, "tools" if tools else "tool_calls"):
        return _apply(tokenizer, template_messages(messages), tools)
    # the template would drop the tools (and cannot write calls): say them in text
    plain = history_as_text(messages) if has_history else messages
    if tools:
        plain = with_tools_instruction(plain, tools)
    try:
        return _apply(tokenizer, plain, None)
    except InvalidRequestError:
        as_user = tool_turns_as_user(plain)  # a template that allows no role "tool"
        if as_user is None:
            raise
        return _apply(tokenizer, as_user, None)


def _apply(tokenizer, messages: list[dict], tools: Optional[list[dict]]) -> str:
    kwargs = {"tools": tools} if tools else {}
    try:
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                             **kwargs)
    except Exception as exc:  # jinja2 errors raised by the template itself (e.g. role order)
        raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from None
