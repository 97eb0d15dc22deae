"""int8 KV cache vs the model-dtype cache (float32 on CPU) on the tiny parity models.

What is measured, per family, over 16 prompts x 16 greedy tokens:
- positional match: the fraction of output positions whose tokens are equal (after a first
  difference the two runs continue from different text, so one flip costs every later position);
- step agreement: over the steps where both runs have produced the same tokens so far, the
  fraction choosing the same next token (greedy agreement given the same context);
- mean |logprob diff| of the chosen token over those same-context steps.
These random models are nearly flat (the top token has ~1.6% probability) and have near-ties,
so a flip is allowed only where the float32 run's top-2 gap is below `TIE_NATS`; any other flip
fails. Step agreement must be >= 95% and the mean logprob difference small. Run with `-s` to
see the figures. `force_int8_cvt` forces the Triton attention kernels' int8 operand method for a
test (test_gpu_int8.py runs these bounds with the int8-MMA mode "mma_k"; on the CPU the Triton
attention on the interpreter takes over 5 minutes per family, and the torch path has no modes).
"""

import pytest

from infer_cluster.protocol import SamplingParams
from infer_cluster.worker import LLM

from .conftest import FAMILIES
from .test_hf_parity import CPU, make_prompts

MAX_TOKENS = 16
PARAMS = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=2)
MIN_STEP_AGREEMENT = 0.95
MAX_MEAN_LOGPROB_DIFF = 0.02
TIE_NATS = 0.05


def compare(ref_outs, int8_outs):
    """dict(positional, step_agreement, mean_logprob_diff, flip_gaps)."""
    same = total = agree = steps = 0
    diffs, flip_gaps = [], []
    for a, b in zip(ref_outs, int8_outs):
        assert len(a.token_ids) == len(b.token_ids) == MAX_TOKENS
        same += sum(x == y for x, y in zip(a.token_ids, b.token_ids))
        total += MAX_TOKENS
        for x, y, la, lb in zip(a.token_ids, b.token_ids, a.logprobs, b.logprobs):
            steps += 1
            if x != y:
                top = sorted(la[1].values(), reverse=True)
                flip_gaps.append(top[0] - top[1])
                break
            agree += 1
            diffs.append(abs(la[0] - lb[0]))
    return dict(positional=same / total, step_agreement=agree / steps,
                mean_logprob_diff=sum(diffs) / len(diffs), flip_gaps=flip_gaps)


def force_int8_cvt(monkeypatch, cvt):
    """Make both attention kernels use int8 operand method `cvt` (a `CVT_MODES` name) whatever
    their defaults and device (the decode config is patched after `decode_config` picks it)."""
    from infer_cluster.kernels import attention_decode_triton as dec
    from infer_cluster.kernels import attention_prefill_triton as pre
    base = dec.decode_config
    monkeypatch.setattr(dec, "decode_config", lambda q, kv_dtype=None: dict(base(q, kv_dtype),
                                                                            cvt=cvt))
    monkeypatch.setattr(pre, "prefill_int8_cvt", lambda q: cvt)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_int8_kv_matches_model_dtype_kv(checkpoints, family):
    prompts = make_prompts()
    with LLM(checkpoints[family], block_size=16, **CPU) as llm:
        ref = llm.generate(prompts, PARAMS, use_tqdm=False)
    # Pressure and prefix sharing on the int8 side: a small pool (preemption) and the prompts'
    # shared prefixes (cache hits) must not change what the int8 cache computes.
    with LLM(checkpoints[family], block_size=16, kv_cache_dtype="int8", num_kv_blocks=24,
             max_num_batched_tokens=256, **CPU) as llm:
        got = llm.generate(prompts, PARAMS, use_tqdm=False)
        stats = llm.stats()
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hit_tokens"] > 0
    r = compare(ref, got)
    print(f"\n{family}: int8 KV vs float32 KV over {len(prompts)}x{MAX_TOKENS} greedy tokens: "
          f"positional match {r['positional']:.1%}, step agreement {r['step_agreement']:.1%}, "
          f"mean |logprob diff| {r['mean_logprob_diff']:.4f}, flips at top-2 gaps "
          f"{[round(g, 4) for g in r['flip_gaps']]}")
    assert all(g < TIE_NATS for g in r["flip_gaps"]), "int8 changed a clear greedy choice"
    assert r["step_agreement"] >= MIN_STEP_AGREEMENT
    assert r["mean_logprob_diff"] < MAX_MEAN_LOGPROB_DIFF
