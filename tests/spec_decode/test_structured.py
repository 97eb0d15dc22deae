"""Speculative decoding of structured-output requests on tiny-random: prompt lookup proposes
only what each request's grammar allows, every proposed position is masked by the grammar after
the proposals before it, and the output is speculation off's, token for token."""

import json

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from tests.spec_decode.test_engine import PROMPTS, SPEC, greedy

STRUCTURED = [  # (structured_outputs, temperature, seed, max_tokens)
    ({"json": {"type": "object", "properties": {"a": {"type": "integer"},
                                                "b": {"type": "string", "maxLength": 10}},
               "required": ["a", "b"]}}, 0, None, 60),
    ({"json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "minItems": 12, "maxItems": 30}}, 0, None, 80),
    ({"regex": r"(ab, ){3,12}ab"}, 0, None, 60),
    ({"json": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
               "minItems": 12, "maxItems": 30}}, 0.8, 5, 80),  # seeded top-p
    ({"choice": ["alpha", "beta"]}, 0, None, 10),
]


@pytest.mark.parametrize("setting", ["defaults", "preemption", "async"])
def test_structured_outputs_speculate_with_speculation_offs_output(setting):
    """Constrained requests get the proposals their grammar allows (prompt lookup, cut at the
    first refused token and before a stop token), every proposed position masked by the grammar
    after the proposals before it: the same tokens, text and finish as speculation off (greedy
    and seeded), proposals accepted, with preemption and with async scheduling too; beside a
    free row. worker/structured/state.py rolls each state back to the tokens kept."""
    kw = {"defaults": dict(num_kv_blocks=64), "preemption": dict(num_kv_blocks=8, max_num_batched_tokens=64),
          "async": dict(num_kv_blocks=64, async_scheduling=True)}[setting]
    params = [SamplingParams(temperature=t, seed=seed, top_p=0.9 if t else 1.0, max_tokens=n, structured_outputs=so)
              for so, t, seed, n in STRUCTURED] + [greedy(40)]
    prompts = [[5, 6, 7, 8] * 4, [13, 14, 15] * 6, [20, 21, 22, 23], [30, 31] * 5, [40] * 7, PROMPTS[0]]
    want = LLM("tiny-random", **kw).generate(prompts, params, use_tqdm=False)
    llm = LLM("tiny-random", speculative_config=SPEC, **kw)
    got = llm.generate(prompts[:-1], params[:-1], use_tqdm=False)  # constrained rows alone first
    stats = llm.stats()
    assert stats["num_spec_accepted_tokens"] > 20, stats
    got += llm.generate(prompts[-1:], params[-1:], use_tqdm=False)
    assert [(o.token_ids, o.text, o.finish_reason) for o in got] == \
        [(o.token_ids, o.text, o.finish_reason) for o in want]
    assert json.loads(got[1].text) and got[2].text.startswith("ab, ab, ab, ")
    if setting == "preemption":
        assert llm.stats()["num_preemptions"] > 0
    stats = llm.stats()
    assert stats["num_free_blocks"] == stats["num_total_blocks"]
