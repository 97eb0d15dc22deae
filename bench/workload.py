"""Shared benchmark workloads (no torch): nano-vllm's random-length workload.

`random_workload(n, prompt_range, output_range, vocab, seed)` gives `n` prompts of random token
ids with lengths uniform in `prompt_range` and an output length per prompt uniform in
`output_range` (used with ignore_eos so every request generates exactly that many tokens).
"""

from __future__ import annotations

import random


def random_workload(num_seqs: int, prompt_range: tuple[int, int], output_range: tuple[int, int],
                    vocab_size: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(2, min(vocab_size, 10000)) for _ in range(rng.randint(*prompt_range))]
               for _ in range(num_seqs)]
    outputs = [rng.randint(*output_range) for _ in range(num_seqs)]
    return prompts, outputs
