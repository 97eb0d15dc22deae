"""Resuming on another replica continues the text exactly, not only the token ids.

A replica holds back text it cannot show yet (an incomplete UTF-8 character, a possible stop
string prefix). When it dies, the replica that resumes must emit that held-back text with its
first new tokens. This drives two real engines in-process through `EngineServer`'s dispatch
path: engine A streams k tokens, engine B resumes from them, and A's first k deltas + B's
deltas must equal an uninterrupted run, for every cut point.
"""

from __future__ import annotations

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.protocol.messages import DispatchRequest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def engine():
    from infer_cluster.worker.config import EngineConfig
    from infer_cluster.worker.engine.engine import DynamicEngine
    return DynamicEngine(EngineConfig(model="tiny-random", num_kv_blocks=256))


def _run(engine, rid, prompt, params, resume=None) -> list:
    """Dispatch like the replica server does and return the deltas' (tokens, text)."""
    from infer_cluster.worker.serving.server import EngineServer
    server = EngineServer.__new__(EngineServer)  # only the dispatch path, no sockets
    server.engine, server._prompt_ids, server.text = engine, {}, None  # the engine makes its text
    sent = []
    server._send_error = lambda request_id, error: sent.append(error)
    server._on_dispatch(DispatchRequest(request_id=rid, prompt=prompt,
                                        sampling_params=params.to_dict(),
                                        resume_token_ids=list(resume or [])))
    assert not sent, sent
    out = []
    while engine.has_unfinished_requests():
        for d in engine.step():
            if d.request_id == rid:
                out.append((d.token_ids, d.text))
    return out


@pytest.mark.parametrize("stop", [[], ["zzzz never"]])
def test_text_continues_across_every_resume_point(engine, stop):
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, stop=stop)
    prompt = "Once upon a time, the quick brown fox"
    full = _run(engine, f"full-{len(stop)}", prompt, params)
    tokens = [t for ids, _ in full for t in ids]
    text = "".join(s for _, s in full)
    assert len(tokens) == 20
    for k in (1, 2, 3, 4, 6, 9, 13, 19):
        delivered_text = "".join(s for _, s in full[:k])  # one token per decode delta
        rest = _run(engine, f"resume-{len(stop)}-{k}", prompt, params, resume=tokens[:k])
        assert [t for ids, _ in rest for t in ids] == tokens[k:]
        assert delivered_text + "".join(s for _, s in rest) == text, f"cut after {k} tokens"
