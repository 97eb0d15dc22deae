"""Tool calls parsed out of a model's free text (tool_choice "auto"), whole or as it streams.

Owns: finding the Hermes/Qwen `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks
(the form the replica's fallback instruction asks for, worker/text/tool_prompt.py, and the
form Qwen2.5 and Hermes templates ask for) and turning each into an OpenAI tool call (`id`
"call_...", type "function", `arguments` as JSON text). A block whose JSON does not parse, is
not an object, or names a function that `tools` does not define stays text, tags and all. The
last block may lack its closing tag (generation stopped at EOS right after the JSON): it is a
call when its JSON is complete. With `parallel` false only the first call is kept; later valid
blocks are dropped.

The content is the text outside the calls, held back while it could still be the start of
`<tool_call>`. Whitespace is held until text follows it; at the end it is kept when no call
was parsed (a plain reply comes out exactly as generated) and dropped when one was, as is
whitespace before the first call when no text came before it. So the whole reply's content
equals the streamed content deltas joined (`parse_tool_calls` is the stream, fed at once).
Never imports torch.
"""

from __future__ import annotations

import json
import uuid
from typing import Optional

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _prefix_len(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ToolCallParser:
    """One choice's text, fed in pieces; each `feed` / `finish` returns (content to send,
    calls to send) for what became certain."""

    def __init__(self, names, parallel: bool = True):
        self.names = frozenset(names)
        self.parallel = parallel
        self.num_calls = 0
        self._pending = ""        # outside a call: text not looked at for a tag yet
        self._body: Optional[str] = None  # inside a call: its text so far
        self._space = ""          # whitespace held until text follows it
        self._sent_text = False   # some content was returned

    def feed(self, text: str) -> tuple[str, list[dict]]:
        out: list[str] = []
        calls: list[dict] = []
        while text:
            if self._body is None:
                text = self._outside(self._pending + text, out)
            else:
                text = self._inside(self._body + text, out, calls)
        return "".join(out), calls

    def finish(self) -> tuple[str, list[dict]]:
        """The end of the reply: an unclosed block is a call if its JSON is complete, held text
        is sent (whitespace only when no call was parsed)."""
        out: list[str] = []
        calls: list[dict] = []
        if self._body is not None:
            body, self._body = self._body, None
            if not self._take(body, calls):
                self._emit(OPEN + body, out)
        if self._pending:
            pending, self._pending = self._pending, ""
            self._emit(pending, out)
        if self._space and not self.num_calls:
            out.append(self._space)
        self._space = ""
        return "".join(out), calls

    # -------------------------------------------------------------- internals

    def _outside(self, text: str, out: list) -> str:
        """Scan text outside a call; returns what follows an opening tag ("" if none)."""
        i = text.find(OPEN)
        if i < 0:
            keep = _prefix_len(text, OPEN)
            self._emit(text[:len(text) - keep], out)
            self._pending = text[len(text) - keep:]
            return ""
        self._emit(text[:i], out)
        self._pending, self._body = "", ""
        return text[i + len(OPEN):]

    def _inside(self, text: str, out: list, calls: list) -> str:
        """Scan a call's text; returns what follows its closing tag ("" if not closed yet)."""
        i = text.find(CLOSE)
        if i < 0:
            self._body = text
            return ""
        body, self._body = text[:i], None
        if not self._take(body, calls):
            self._emit(OPEN + body + CLOSE, out)
        return text[i + len(CLOSE):]

    def _take(self, body: str, calls: list) -> bool:
        """Whether `body` is a call (appended unless `parallel` is off and one was taken)."""
        call = self._call(body)
        if call is None:
            return False
        if self.num_calls == 0 or self.parallel:
            calls.append({"index": self.num_calls, **call})
            self.num_calls += 1
        if not self._sent_text:
            self._space = ""  # whitespace before the first call is no content
        return True

    def _call(self, body: str) -> Optional[dict]:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return None
        if not isinstance(value, dict) or value.get("name") not in self.names:
            return None
        args = value.get("arguments", value.get("parameters", {}))
        if isinstance(args, str):  # some models write the arguments as JSON text
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return None
        if not isinstance(args, dict):
            return None
        return {"id": call_id(), "type": "function",
                "function": {"name": value["name"],
                             "arguments": json.dumps(args, ensure_ascii=False)}}

    def _emit(self, text: str, out: list) -> None:
        """Content, with whitespace at its end held back until text follows it."""
        if not text:
            return
        text = self._space + text
        if not self._sent_text and self.num_calls:
            text = text.lstrip()
        body = text.rstrip()
        self._space = text[len(body):]
        if body:
            out.append(body)
            self._sent_text = True


def parse_tool_calls(text: str, names, parallel: bool = True) -> tuple[Optional[str], list[dict]]:
    """(content or None when empty, OpenAI tool calls) of a whole reply."""
    parser = ToolCallParser(names, parallel)
    content, calls = parser.feed(text)
    rest, more = parser.finish()
    content += rest
    return content or None, [{k: v for k, v in c.items() if k != "index"} for c in calls + more]
