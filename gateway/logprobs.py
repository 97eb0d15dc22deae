"""Logprobs in OpenAI's two shapes, from the engine's per-token entries.

The engine reports, per generated token, `[sampled_logprob, {token_id: logprob, ...},
{token_id: bytes, ...}]`: the top-N alternatives, then the raw bytes of the sampled token and of
each alternative (the gateway asks for them with `SamplingParams.logprob_bytes`; the replica's
text stage looks them up in its tokenizer). A token is named by its bytes decoded as UTF-8 (a
partial character shows as U+FFFD, and chat's `bytes` field keeps the exact bytes), or
`token_id:<id>` where the entry has no bytes for it (an id past the tokenizer's vocabulary; the
form vLLM uses with `--return-tokens-as-token-ids`). `text_offset` is the offset of the text of
the delta that carried the token. Never imports torch.
"""

from __future__ import annotations

from typing import Optional

from .schemas import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


def token_name(token_id, names: dict) -> str:
    data = names.get(token_id)
    return f"token_id:{token_id}" if data is None else data.decode("utf-8", errors="replace")


def token_bytes(token_id, names: dict) -> Optional[list[int]]:
    data = names.get(token_id)
    return None if data is None else list(data)


def _entries(token_ids: list, entries: Optional[list]):
    """(token id, its logprob, {alternative id: logprob}, {id: bytes}) per token."""
    entries = entries or []
    for i, tid in enumerate(token_ids):
        entry = entries[i] if i < len(entries) else None
        if entry is None:
            yield tid, None, {}, {}
        else:
            alts = entry[1] if len(entry) > 1 and entry[1] else {}
            names = entry[2] if len(entry) > 2 and entry[2] else {}
            yield tid, entry[0], alts, names


def completion_logprobs(token_ids: list, entries: Optional[list], text_offset: int,
                        out: Optional[CompletionLogprobs] = None) -> CompletionLogprobs:
    out = out or CompletionLogprobs()
    for tid, lp, alts, names in _entries(token_ids, entries):
        out.tokens.append(token_name(tid, names))
        out.token_logprobs.append(lp)
        out.top_logprobs.append({token_name(a, names): v for a, v in alts.items()} if alts else None)
        out.text_offset.append(text_offset)
    return out


def chat_logprobs(token_ids: list, entries: Optional[list]) -> ChatLogprobs:
    content = []
    for tid, lp, alts, names in _entries(token_ids, entries):
        content.append(ChatTokenLogprob(
            token=token_name(tid, names), logprob=lp if lp is not None else float("-inf"),
            bytes=token_bytes(tid, names),
            top_logprobs=[TopLogprob(token=token_name(a, names), logprob=v, bytes=token_bytes(a, names))
                          for a, v in alts.items()]))
    return ChatLogprobs(content=content)
