"""Start-up warm-up: serve a synthetic workload once so nothing compiles or grows while serving.

Owns: the shape of that workload and what it must reach. Triton compiles a kernel per
specialization (integer arguments are specialized on `== 1` and divisibility by 16), the
sampler and logprobs paths allocate `[rows, vocab]` buffers sized by the batch, and torch's
caching allocator keeps the largest blocks it has handed out. One pass through the real engine
(`DynamicEngine.step`, not a private path) with the largest shapes first reaches all of them:

  * a full batch of `max_num_seqs` short requests (capped by the pool), prompt lengths spread
    over residues mod 16, every sampling kind mixed in one batch (greedy, seeded top-k/top-p,
    min-p, penalties with no_repeat_ngram, logprobs), decoding at full batch width: the
    largest sampler buffers and every decode graph / eager decode variant;
  * up to 40 requests that all sample with top-k / top-p: the eager draw of a step whose rows
    are all random (past the draw graphs' 32 rows);
  * long prompts (up to `max_model_len`) worth about two `max_num_batched_tokens` budgets,
    all at once: full-budget prefill steps over several sequences, chunks that attend over a
    cached prefix, then long-context decode at that width;
  * the first long prompt again: a prefix-cache hit;
  * a ragged tail: 17 short requests with odd and even prompt lengths and 1..17 new tokens, so
    the batch shrinks through every width from 17 to 1 (each small-batch GEMV row count, eager
    and graph) and the prefill steps sample several rows at odd token totals. Traffic reaches
    these widths all the time; before this pass a first user paid their compiles
    (bench/RESULTS.md, "Cold start with an empty Triton cache").

It must never leave anything behind: the engine drops its scheduler, allocator and counters
afterwards (`bookkeeping.reset_bookkeeping`), so the first real request sees a fresh engine.
To extend: when a new kernel variant or sampling path appears, add a request here that uses it.
"""

from __future__ import annotations

import logging
import time

from infer_cluster.protocol import SamplingParams

log = logging.getLogger(__name__)

_KINDS = (
    SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=0.8, top_p=0.9, top_k=50, seed=1, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=0.7, repetition_penalty=1.1, presence_penalty=0.3,
                   frequency_penalty=0.2, no_repeat_ngram_size=3, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=0.0, logprobs=5, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=1.0, min_p=0.05, max_tokens=4, ignore_eos=True),
    SamplingParams(temperature=0.9, top_k=20, min_tokens=2, max_tokens=4),
    SamplingParams(temperature=0.8, top_p=0.95, seed=2, max_tokens=4, ignore_eos=True),  # top-p alone
)


_ALL_SAMPLED = 40  # rows of the all-sampled pass

# The ragged tail: widths 17 .. 1 (one past the small-batch GEMV's 16 rows), five kinds.
_TAIL = 17
_TAIL_KINDS = (dict(temperature=0.0, ignore_eos=True),
               dict(temperature=0.8, top_p=0.9, top_k=50, seed=3, ignore_eos=True),
               dict(temperature=0.0, logprobs=2, ignore_eos=True),
               # temperature alone, with no penalty row beside it: the full-vocabulary draw on
               # the model's own logits dtype (the kernels' other variant)
               dict(temperature=0.7, ignore_eos=True),
               # top-p alone: where its set is wider than its candidates, the draw finishes it on
               # the device (threshold kernel, active-row full draw) on the model's logits dtype
               dict(temperature=0.9, top_p=0.95, seed=4, ignore_eos=True))


def _prompt(length: int, salt: int, vocab: int) -> list[int]:
    # Deterministic ids away from the low special range; distinct per request so the prefix
    # cache does not shortcut the prefills this pass is meant to compile.
    return [10 + (salt * 7919 + j * 104729) % (vocab - 10) for j in range(length)]


def warm_up_engine(engine) -> dict:
    """Run the workload above through `engine`; returns what it took."""
    cfg = engine.config
    vocab = engine.spec.vocab_size
    max_len = engine.max_model_len
    bs = cfg.block_size
    started = time.perf_counter()
    pool = engine.allocator.num_blocks
    # A full batch of short requests: each needs at most 3 blocks (<= 40 prompt + 4 new tokens).
    width = max(1, min(cfg.max_num_seqs, (pool - 1) // max(1, -(-48 // bs))))
    ids = []
    for i in range(width):
        length = min(1 + (i * 5) % 40, max_len - 8)
        params = _KINDS[i % len(_KINDS)]
        ids.append(engine.add_request(_prompt(length, i, vocab), params, request_id=f"warmup-{i}"))
    num_steps = _drain(engine)
    # Every row sampled with top-k / top-p, wider than the draw graphs' plain steps (32 rows):
    # the eager candidate draw over the step's own logits (block maxima, rows kept for a redo).
    for i in range(min(width, _ALL_SAMPLED)):
        engine.add_request(_prompt(2 + i % 7, 3 * 10**6 + i, vocab), _KINDS[1], request_id=f"warmup-sampled-{i}")
    num_steps += _drain(engine)
    budget = cfg.max_num_batched_tokens
    long_len = min(budget + 17, max_len - 8, (pool // 2 - 2) * bs)
    num_long = 0
    if long_len > bs:
        blocks_each = -(-(long_len + 8) // bs)
        num_long = max(1, min(-(-(2 * budget + 17) // long_len), cfg.max_num_seqs,
                              (pool - 1) // blocks_each - 1))
        long_prompts = [_prompt(long_len - k, 10**6 + k, vocab) for k in range(num_long)]
        for k, p in enumerate(long_prompts):
            engine.add_request(p, _KINDS[k % len(_KINDS)], request_id=f"warmup-long-{k}")
        num_steps += _drain(engine)
        engine.add_request(long_prompts[0], _KINDS[3], request_id="warmup-long-cached")
        num_steps += _drain(engine)
    for i in range(min(_TAIL, cfg.max_num_seqs, max(1, (pool - 1) // max(1, -(-64 // bs))))):
        kind = _TAIL_KINDS[i % len(_TAIL_KINDS)]
        params = SamplingParams(**{**kind, "max_tokens": i + 1})
        engine.add_request(_prompt(min(3 + 2 * i + i % 2, max_len - 20), 2 * 10**6 + i, vocab), params,
                           request_id=f"warmup-tail-{i}")
    num_steps += _drain(engine)
    seconds = time.perf_counter() - started
    log.info("warm-up: %d steps (batch %d; %d long prompts of %d tokens) in %.1f s", num_steps, width,
             num_long, max(0, long_len), seconds)
    return {"seconds": seconds, "num_steps": num_steps, "batch": width, "num_long": num_long,
            "long_prompt": long_len}


def _drain(engine, max_steps: int = 100_000) -> int:
    n = 0
    while engine.has_unfinished_requests() and n < max_steps:
        for d in engine.step():
            if d.finish_reason == "error":
                raise RuntimeError(f"warm-up request {d.request_id} failed: {d.error}")
        n += 1
    return n
