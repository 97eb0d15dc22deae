"""`SamplingState`: the incremental penalty state equals the from-scratch computation after
random admissions, appends and removals; the incremental n-gram map equals the full scan."""

import random

import torch

from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.token_bans import banned_ngram_tokens
from infer_cluster.worker.sampling.state import SamplingState, penalty_columns

VOCAB = 50


def dense_penalties(x: torch.Tensor, prompt: list[int], output: list[int], p: SamplingParams) -> torch.Tensor:
    """The previous sampler's per-step rebuild: [vocab] counts from the token lists."""
    seen = torch.zeros(VOCAB, dtype=torch.bool)
    seen[prompt + output] = True
    counts = torch.zeros(VOCAB).scatter_add_(0, torch.tensor(output, dtype=torch.long),
                                             torch.ones(len(output)))
    rep = torch.tensor(p.repetition_penalty, dtype=torch.float32)
    x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    return x - p.frequency_penalty * counts - p.presence_penalty * (counts > 0).to(torch.float32)


def test_incremental_penalties_equal_the_rebuild_after_random_appends_and_removals():
    rng = random.Random(0)
    state = SamplingState(VOCAB, torch.device("cpu"))
    live: dict[str, tuple[list, list, SamplingParams]] = {}
    next_id = 0
    for step in range(60):
        for _ in range(rng.randint(0, 3)):  # admissions, some resumed with output already
            params = SamplingParams(repetition_penalty=rng.choice([1.0, 0.7, 1.4]),
                                    frequency_penalty=rng.choice([0.0, 0.5, -1.0]),
                                    presence_penalty=rng.choice([0.0, 0.3, 2.0]))
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]
            output = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 0, 5]))]
            live[f"r{next_id}"] = (prompt, output, params)
            next_id += 1
        for rid in rng.sample(sorted(live), k=min(len(live), rng.randint(0, 2))):
            del live[rid]
            state.remove(rid)
        if not live:
            continue
        ids = sorted(live)
        x = torch.randn(len(ids), VOCAB) * 3
        entries = [state.entry(rid, live[rid][0], live[rid][1], live[rid][2]) for rid in ids]
        got = x.clone()
        state.apply_penalties(got, list(range(len(ids))), entries, penalty_columns([live[rid][2] for rid in ids]))
        for j, rid in enumerate(ids):
            prompt, output, params = live[rid]
            assert torch.equal(got[j], dense_penalties(x[j], prompt, output, params)), (step, rid)
        # Fold one sampled token per request (the sampler's path); now and then a request's
        # lists move on without it (the entry must notice and rebuild).
        new = [rng.randrange(VOCAB) if rng.random() < 0.5 else rng.choice(live[rid][0]) for rid in ids]
        state.append(entries, torch.tensor(new), new)
        for rid, t in zip(ids, new):
            live[rid][1].append(t)
            if rng.random() < 0.05:
                live[rid][1].append(rng.randrange(VOCAB))
    assert len(state) == len(live)


def test_ngram_map_equals_the_full_scan_token_by_token():
    rng = random.Random(1)
    for trial in range(60):
        n = rng.randint(1, 4)
        alphabet = rng.randint(2, 6)  # small, so n-grams repeat
        prompt = [rng.randrange(alphabet) for _ in range(rng.randint(1, 8))]
        params = SamplingParams(no_repeat_ngram_size=n)
        state = SamplingState(VOCAB, torch.device("cpu"))
        seq = list(prompt)
        output: list[int] = []
        for _ in range(25):
            e = state.entry("r", prompt, output, params)
            assert e.banned() == banned_ngram_tokens(seq, n), (trial, n, seq)
            t = rng.randrange(alphabet)
            state.append([e], torch.tensor([t]), [t])
            output.append(t)
            seq.append(t)
