"""The real packaged model through the whole cluster, as a newcomer meets it: `serve` with
SmolLM2-135M-Instruct (coordinator, replica and HTTP gateway as processes), asked by the real
`openai` client, plain and streaming. A model that loaded wrong weights, a chat template rendered
wrong, or a tokenizer that decodes wrong cannot answer "Paris"."""

from __future__ import annotations

import pytest

from tests.integration.conftest import openai_client

pytestmark = pytest.mark.timeout(300)

MODEL = "smollm2-135m-instruct"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def real_cluster(real_model_cluster):
    """The session's `serve` of MODEL (conftest.py), also asked by test_structured_real_model."""
    return real_model_cluster


@pytest.fixture(scope="module")
def oai(real_cluster):
    client = openai_client(real_cluster, timeout=120)
    yield client
    client.close()


def test_openai_client_hears_paris(real_cluster, oai):
    reply = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    choice = reply.choices[0]
    assert "Paris" in choice.message.content, choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage.prompt_tokens > 5 and reply.usage.completion_tokens > 0
    print(f"serve was healthy after {real_cluster.ready_s:.1f} s; answer: {choice.message.content!r}")


def test_streamed_answer_is_the_same_text(oai):
    whole = oai.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    pieces = [c.choices[0].delta.content or "" for c in oai.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    assert "Paris" in "".join(pieces)
