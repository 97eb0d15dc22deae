"""Structured outputs on a rank group (CPU, gloo): tensor parallel (the runner returns logits,
not greedy ids, when a row is constrained) and pipeline micro-batches (a constrained request is
never continued from a queued draw), with async scheduling. Outputs validate and equal T=1's."""

import json

import jsonschema
import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from tests.structured.schemas import BOUNDED

from .conftest import ENGINE

LAYOUTS = {"tp2": (2, 1, "auto"), "pp2_microbatches": (1, 2, "on")}
NAMES = ["nested", "array_min_items", "any_of", "enum"]
PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12] * 7, [13] * 40, [30, 31], [40] * 17, [5, 6]]


def params():
    out = [SamplingParams(temperature=0.0 if i % 2 else 0.9, seed=i, max_tokens=80,
                          structured_outputs={"json": BOUNDED[NAMES[i % len(NAMES)]]})
           for i in range(4)]
    out.append(SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))  # free rows beside
    out.append(SamplingParams(temperature=0.8, seed=3, max_tokens=9, ignore_eos=True))
    return out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_constrained_rows_on_a_rank_group(started, dist_checkpoints, layout):
    tp, pp, microbatches = LAYOUTS[layout]
    path = dist_checkpoints["qwen3"]
    with LLM(path, **ENGINE) as single:
        want = [o.token_ids for o in single.generate(PROMPTS, params(), use_tqdm=False)]
    with LLM(path, tensor_parallel_size=tp, pipeline_parallel_size=pp, async_scheduling=True,
             pipeline_microbatches=microbatches, **ENGINE) as llm:
        started.track(llm)
        outs = llm.generate(PROMPTS, params(), use_tqdm=False)
    for i, o in enumerate(outs[:4]):
        assert o.finish_reason == "stop", o.text
        jsonschema.validate(json.loads(o.text), BOUNDED[NAMES[i % len(NAMES)]])
    assert [o.token_ids for o in outs] == want
