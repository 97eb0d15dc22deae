"""Logprobs in OpenAI's two shapes, from the engine's per-token entries.

The engine reports, per generated token, `[sampled_logprob, {token_id: logprob, ...}]` (the
top-N alternatives). The gateway has no tokenizer, so tokens are named `token_id:<id>` (the
form vLLM uses with `--return-tokens-as-token-ids`); `text_offset` is the offset of the text
of the delta that carried the token. Never imports torch.
"""

from __future__ import annotations

from typing import Optional

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


def token_name(token_id) -> str:
    return f"token_id:{token_id}"


def _entries(token_ids: list, entries: Optional[list]):
    entries = entries or []
    for i, tid in enumerate(token_ids):
        entry = entries[i] if i < len(entries) else None
        if entry is None:
            yield tid, None, {}
        else:
            yield tid, entry[0], entry[1] if len(entry) > 1 and entry[1] else {}


def completion_logprobs(token_ids: list, entries: Optional[list], text_offset: int,
                        out: Optional[CompletionLogprobs] = None) -> CompletionLogprobs:
    out = out or CompletionLogprobs()
    for tid, lp, alts in _entries(token_ids, entries):
        out.tokens.append(token_name(tid))
        out.token_logprobs.append(lp)
        out.top_logprobs.append({token_name(a): v for a, v in alts.items()} if alts else None)
        out.text_offset.append(text_offset)
    return out


def chat_logprobs(token_ids: list, entries: Optional[list]) -> ChatLogprobs:
    content = []
    for tid, lp, alts in _entries(token_ids, entries):
        content.append(ChatTokenLogprob(
            token=token_name(tid), logprob=lp if lp is not None else float("-inf"),
            top_logprobs=[TopLogprob(token=token_name(a), logprob=v) for a, v in alts.items()]))
    return ChatLogprobs(content=content)
