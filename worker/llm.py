"""`LLM`: the offline, in-process API over one `DynamicEngine`.

Owns: batch generation with a progress bar, chat (conversations rendered with the model's
template, as a replica renders them), folding streamed deltas into `RequestOutput`s in
input order, and the step-level surface (`add_request`, `step`, `abort`, ...) for callers that
drive the engine themselves. Holds no scheduling logic of its own.

`generate()` runs text (detokenization, stop strings) on a `TextWorker` thread one step behind
the engine, as a replica does, so its throughput does not depend on the tokenizer; `step()`
returns text with each delta (the engine's inline `TextStage`). Outputs are the same either way.
`generate()` pauses Python's cyclic garbage collector while it runs (restored on return).
"""

from __future__ import annotations

import collections
import gc
from typing import Optional, Sequence, Union

from infer_cluster.protocol import InvalidRequestError, RequestDelta, RequestOutput, SamplingParams
from infer_cluster.protocol.chat import messages_from_openai, tools_from_openai

from infer_cluster.worker.config import EngineConfig
from infer_cluster.worker.engine.engine import DynamicEngine, Prompt
from infer_cluster.worker.text.chat import render_chats
from infer_cluster.worker.text.host_idle import HostIdle
from infer_cluster.worker.text.text_stage import TextWorker


class LLM:
    def __init__(self, model: str = "tiny-random", **engine_options):
        self.config = EngineConfig(model=model, **engine_options)
        self.engine = DynamicEngine(self.config)
        self.tokenizer = self.engine.tokenizer
        self._outputs: dict[str, RequestOutput] = {}  # requests `generate` is collecting

    # -- batch ----------------------------------------------------------------------------------

    def generate(self, prompts: Union[Prompt, Sequence[Prompt]],
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Generate for every prompt (a string, a token-id list, or a list of either); returns
        outputs in input order. Bad input raises before any request is queued."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and isinstance(prompts[0], int)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        ids = []
        try:
            for prompt, p in zip(prompts, params):
                rid = self.add_request(prompt, p)
                req = self.engine.request(rid)
                self._outputs[rid] = RequestOutput(rid, list(req.prompt_token_ids), prompt=req.prompt)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.abort(rid)
            self._drain_aborted(ids)
            raise
        pending = set(ids)
        bar = None
        gc_was_enabled = gc.isenabled()
        if use_tqdm:
            from tqdm.auto import tqdm
            bar = tqdm(total=len(ids), desc="Generating", unit="req", dynamic_ncols=True)
        # The outputs grow by a few container objects per token (logprob entries above all) and
        # live until we return: the cyclic collector would walk them again and again (1 s of a
        # 16 s logprobs run on the H100). The engine makes no reference cycles per step
        # (tests/engine/test_llm_gc.py), so reference counting frees everything else meanwhile;
        # the collector is back on, as it was, when generate returns.
        gc.disable()
        try:
            self._run_with_text_thread(pending, bar)
        finally:
            if gc_was_enabled:
                gc.enable()
            if bar is not None:
                bar.close()
        return [self._outputs.pop(rid) for rid in ids]

    def chat(self, messages: Union[Sequence[dict], Sequence[Sequence[dict]]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = True, tools: Optional[Sequence[dict]] = None) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation (a list of OpenAI
        `{"role", "content"}` maps; assistant turns may carry `tool_calls`, tool turns
        `tool_call_id`) or to each of several (a list of such lists), rendered with the model's
        chat template and its generation prompt; outputs in input order. `tools`: OpenAI's
        `[{"type": "function", "function": {...}}]`, given to every conversation's template
        (or, where the template ignores tools, written into a system instruction; the calls
        come back as `<tool_call>` blocks in the text). A model without a template, a malformed
        message or tool, or a conversation its template rejects, raises
        `InvalidRequestError` before any request is queued."""
        if not isinstance(messages, (list, tuple)) or not messages:
            raise InvalidRequestError("messages must be a conversation (a non-empty list of "
                                      "{role, content} maps) or a list of conversations")
        conversations = [messages] if isinstance(messages[0], dict) else list(messages)
        chat_tools = tools_from_openai(tools)
        tool_dicts = [t.to_openai() for t in chat_tools] if chat_tools else None
        prompts = render_chats(self.tokenizer, [[m.to_dict() for m in messages_from_openai(conv)]
                                                for conv in conversations], tool_dicts)
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_with_text_thread(self, pending: set, bar) -> None:
        """Step until every id in `pending` has its final delta; text runs on a helper thread
        that borrows the engine's `TextStage` (its requests are registered there already)."""
        engine, stage = self.engine, self.engine.text
        finished: collections.deque = collections.deque()

        def emit(deltas, _extra):
            for d in deltas:
                out = self._outputs.get(d.request_id)
                if out is not None:
                    out.apply(d)
                if d.finish_reason is not None:
                    finished.append(d.request_id)

        # Text runs while the engine's thread waits on the device (worker/text/host_idle.py).
        engine.host_idle = HostIdle()
        worker = TextWorker(stage, emit, name="llm-text", idle=engine.host_idle)
        engine.text, engine.defer_logprobs = None, True  # the text thread builds logprob entries
        worker.start()
        try:
            while pending:
                worker.wait_until_behind(1)
                if worker.error is not None:
                    raise RuntimeError(f"text thread failed: {worker.error}") from worker.error
                engine.stop_requests(worker.take_stops())
                while finished:
                    rid = finished.popleft()
                    if rid in pending:
                        pending.discard(rid)
                        if bar is not None:
                            bar.update(1)
                if not pending:
                    break
                if engine.has_unfinished_requests():
                    worker.submit(engine.step())
                elif worker.flush() and not finished:
                    raise RuntimeError(f"engine went idle with {len(pending)} request(s) unanswered")
        finally:
            worker.flush()
            worker.close()
            engine.text, engine.defer_logprobs, engine.host_idle = stage, False, None

    def _drain_aborted(self, ids):
        pending = set(ids)
        while pending and self.engine.has_unfinished_requests():
            for d in self.step():
                pending.discard(d.request_id)
        for rid in ids:
            self._outputs.pop(rid, None)

    # -- step level -----------------------------------------------------------------------------

    def add_request(self, prompt: Prompt, sampling_params: Optional[SamplingParams] = None,
                    request_id: Optional[str] = None, priority: int = 0) -> str:
        return self.engine.add_request(prompt, sampling_params, request_id, priority)

    def step(self) -> list[RequestDelta]:
        deltas = self.engine.step()
        for d in deltas:
            out = self._outputs.get(d.request_id)
            if out is not None:
                out.apply(d)
        return deltas

    def abort(self, request_id: str) -> bool:
        return self.engine.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.engine.has_unfinished_requests()

    def stats(self) -> dict:
        return self.engine.stats()

    def reset_cache(self, num_kv_blocks: Optional[int] = None,
                    kv_cache_dtype: Optional[str] = None) -> dict:
        """A new KV pool between steps (see `DynamicEngine.reset_cache`): requests in flight
        keep going (those that no longer fit are recomputed); returns the new capacity."""
        return self.engine.reset_cache(num_kv_blocks, kv_cache_dtype)

    # -- lifetime -------------------------------------------------------------------------------

    def close(self) -> None:
        """End the engine's helper processes (tensor/pipeline-parallel ranks); idempotent."""
        self.engine.close()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
