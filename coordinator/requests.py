"""Request table: every in-flight request, who owns it, where it runs, what was delivered.

Owns: `TrackedRequest` (one client request across all its dispatch attempts), the coordinator's
request state machine (`REQUEST_STATE_TRANSITIONS`) and `RequestTable` (lookup by the client's
key and by the per-attempt id a replica knows). It keeps the tokens already delivered to the
client, which is what makes a resume on another replica duplicate-free. Pure bookkeeping: no
sockets, no routing decisions. Never imports torch or zmq.

Why per-attempt ids: a request re-sent to another replica gets a new id (`<seq>.<attempt>`), so a
late delta from the replica that was given up on can never be mistaken for the live attempt.
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass, field
from typing import Iterator, Optional

from infer_cluster.protocol import SamplingParams


class RequestState(enum.Enum):
    PENDING = "pending"        # accepted, waiting for a replica
    DISPATCHED = "dispatched"  # sent to a replica, no token delivered by this attempt yet
    STREAMING = "streaming"    # this attempt has delivered tokens
    FINISHED = "finished"      # stop / length
    ABORTED = "aborted"        # client cancel or client gone
    FAILED = "failed"          # error or timeout

    @property
    def is_final(self) -> bool:
        return self in (RequestState.FINISHED, RequestState.ABORTED, RequestState.FAILED)


R = RequestState
_ENDS = frozenset({R.FINISHED, R.ABORTED, R.FAILED})
# A replica's death sends DISPATCHED/STREAMING back to PENDING (re-route); finals are final.
REQUEST_STATE_TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    R.PENDING: frozenset({R.DISPATCHED}) | _ENDS,
    R.DISPATCHED: frozenset({R.STREAMING, R.PENDING}) | _ENDS,
    R.STREAMING: frozenset({R.PENDING}) | _ENDS,
    R.FINISHED: frozenset(),
    R.ABORTED: frozenset(),
    R.FAILED: frozenset(),
}


def estimate_prompt_tokens(prompt: Optional[str], prompt_token_ids: Optional[list],
                           messages: Optional[list] = None, tools: Optional[list] = None) -> int:
    """Routing only needs a load estimate; ~4 bytes per token for text avoids a tokenizer here."""
    if prompt_token_ids is not None:
        return len(prompt_token_ids)
    if messages is not None:  # content plus a few template tokens per turn, and the tools' specs
        turns = sum(_num_bytes(m.content) // 4 + 4
                    + sum(len(c.arguments) // 4 + 8 for c in m.tool_calls or ()) for m in messages)
        specs = sum((_num_bytes(t.description) + len(t.parameters)) // 4 + 8 for t in tools or ())
        return turns + specs + 1
    return _num_bytes(prompt or "") // 4 + 1


def _num_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


@dataclass
class TrackedRequest:
    seq: int
    client: bytes                      # client socket identity
    request_id: str                    # the client's id
    prompt: Optional[str]
    prompt_token_ids: Optional[list]
    sampling_params: dict              # as validated, sent on to replicas
    max_tokens: int
    priority: int = 0
    submitted_at: float = 0.0
    deadline: Optional[float] = None
    timeout: Optional[float] = None
    state: RequestState = RequestState.PENDING
    attempt: int = 0
    replica: Optional[bytes] = None    # identity of the replica running the live attempt
    pending_since: float = 0.0
    delivered_token_ids: list = field(default_factory=list)
    num_reroutes: int = 0
    num_prompt_tokens_estimate: int = 0
    charged_tokens: int = 0            # what this request adds to its replica's routing load
    first_token_at: Optional[float] = None
    finished_at: Optional[float] = None
    messages: Optional[list] = None    # a chat request (ChatMessage structs) instead of a prompt
    tools: Optional[list] = None       # with messages: the ChatTools the template offers

    @property
    def key(self) -> tuple[bytes, str]:
        return (self.client, self.request_id)

    @property
    def attempt_id(self) -> str:
        return f"{self.seq}.{self.attempt}"

    @property
    def num_remaining_tokens(self) -> int:
        return max(0, self.max_tokens - len(self.delivered_token_ids))

    def load_estimate(self) -> int:
        """Tokens a replica still has to process for this request (prompt counted until the
        first token arrives, since that is when its prefill is done)."""
        prompt = self.num_prompt_tokens_estimate if self.state is not RequestState.STREAMING else 0
        return prompt + self.num_remaining_tokens

    def move(self, state: RequestState) -> None:
        if state is not self.state and state not in REQUEST_STATE_TRANSITIONS[self.state]:
            raise RuntimeError(f"request {self.request_id!r}: illegal transition "
                               f"{self.state.value} -> {state.value}")
        self.state = state


class RequestTable:
    """In-flight requests by client key and by live attempt id, plus a deadline heap."""

    def __init__(self):
        self._by_key: dict[tuple[bytes, str], TrackedRequest] = {}
        self._by_attempt: dict[str, TrackedRequest] = {}
        self._deadlines: list[tuple[float, int, tuple[bytes, str]]] = []
        self._next_seq = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def __iter__(self) -> Iterator[TrackedRequest]:
        return iter(list(self._by_key.values()))

    def create(self, client: bytes, request_id: str, prompt, prompt_token_ids,
               params: SamplingParams, priority: int, timeout: Optional[float],
               now: float, messages: Optional[list] = None,
               tools: Optional[list] = None) -> TrackedRequest:
        key = (client, request_id)
        if key in self._by_key:
            raise KeyError(f"request id {request_id!r} is already in flight for this client")
        req = TrackedRequest(seq=self._next_seq, client=client, request_id=request_id,
                             prompt=prompt, prompt_token_ids=prompt_token_ids,
                             sampling_params=params.to_dict(), max_tokens=params.max_tokens,
                             priority=priority, submitted_at=now, pending_since=now,
                             timeout=timeout,
                             deadline=(now + timeout) if timeout is not None else None,
                             messages=messages, tools=tools,
                             num_prompt_tokens_estimate=estimate_prompt_tokens(
                                 prompt, prompt_token_ids, messages, tools))
        self._next_seq += 1
        self._by_key[key] = req
        if req.deadline is not None:
            heapq.heappush(self._deadlines, (req.deadline, req.seq, key))
        return req

    def get(self, client: bytes, request_id: str) -> Optional[TrackedRequest]:
        return self._by_key.get((client, request_id))

    def by_attempt(self, attempt_id: str) -> Optional[TrackedRequest]:
        return self._by_attempt.get(attempt_id)

    def start_attempt(self, req: TrackedRequest, replica: bytes) -> str:
        """Give the request a fresh attempt id bound to `replica`; returns that id."""
        self._by_attempt.pop(req.attempt_id, None)
        req.attempt += 1
        req.replica = replica
        self._by_attempt[req.attempt_id] = req
        req.move(RequestState.DISPATCHED)
        return req.attempt_id

    def detach(self, req: TrackedRequest, now: float) -> None:
        """The live attempt is gone (replica died): back to PENDING, keep delivered tokens."""
        self._by_attempt.pop(req.attempt_id, None)
        req.replica = None
        req.pending_since = now
        req.move(RequestState.PENDING)

    def finish(self, req: TrackedRequest, state: RequestState, now: float) -> None:
        req.move(state)
        req.finished_at = now
        self._by_attempt.pop(req.attempt_id, None)
        self._by_key.pop(req.key, None)

    def expired(self, now: float) -> list[TrackedRequest]:
        """Requests whose deadline passed (each returned once)."""
        out = []
        while self._deadlines and self._deadlines[0][0] <= now:
            _, seq, key = heapq.heappop(self._deadlines)
            req = self._by_key.get(key)
            if req is not None and req.seq == seq:
                out.append(req)
        return out

    def next_deadline(self) -> Optional[float]:
        while self._deadlines and self._deadlines[0][2] not in self._by_key:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def of_client(self, client: bytes) -> list[TrackedRequest]:
        return [r for r in self._by_key.values() if r.client == client]
