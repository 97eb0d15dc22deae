"""Chat requests on the replica: turn a DISPATCH's `messages` into prompt token ids.

Owns: rendering a conversation with the tokenizer's own chat template (the replica is the only
process that has the tokenizer), and the error a model without a template gives. It never
tokenizes plain prompts (the engine does) and never imports torch itself.

To support another conversation feature (tools, multimodal parts), extend the message struct in
`protocol/messages.py` first, then pass the new keys through here.
"""

from __future__ import annotations

from typing import Union

from infer_cluster.protocol import InvalidRequestError


def prompt_of(msg, tokenizer) -> Union[str, list]:
    """The engine prompt of a `DispatchRequest`: its text, its token ids, or its chat
    `messages` rendered to token ids by the model's chat template."""
    if msg.messages is None:
        return msg.prompt if msg.prompt is not None else msg.prompt_token_ids
    return render_chat(tokenizer, [m.to_dict() for m in msg.messages])


def render_chat(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` followed by the assistant's generation prompt. Raises
    `InvalidRequestError` when the model has no chat template or the template rejects the
    conversation."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequestError(
            "this model has no chat template, so /v1/chat/completions cannot render messages; "
            "use /v1/completions with a prompt, or serve a model whose tokenizer_config.json "
            "has a chat_template")
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # jinja2 errors raised by the template itself (e.g. role order)
        raise InvalidRequestError(f"the chat template rejected the messages: {exc}") from None
    # The template already wrote any BOS it wants; adding special tokens again would double it.
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise InvalidRequestError("the rendered chat prompt is empty")
    return ids
