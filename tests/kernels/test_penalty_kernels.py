"""The penalty state's kernels (kernels/penalty_triton.py) against their plain-torch references,
the torch paths of `SamplingState.apply_penalties` and `append`: the same logits after the
penalties, bit for bit, and the same slots (ids, counts, distinct counts) after many steps of
appends, with requests that come, go and reuse slots.

`INFER_CLUSTER_KERNELS` picks the path (dispatch.use_triton), so one run of the public
`SamplingState` runs each side on the same inputs.
"""

import random

import torch

from infer_cluster.protocol.sampling_params import SamplingParams
from infer_cluster.worker.sampling.state import SamplingState, penalty_columns

VOCAB = 300
KINDS = [SamplingParams(repetition_penalty=1.3),
         SamplingParams(frequency_penalty=0.4, presence_penalty=0.2),
         SamplingParams(repetition_penalty=0.8, frequency_penalty=-0.3, presence_penalty=0.5),
         SamplingParams(repetition_penalty=1.1, presence_penalty=0.3, frequency_penalty=0.2)]


def run(device):
    """Eight steps over a changing set of requests; returns every step's penalised logits and
    the final state's tensors, per live request."""
    rng = random.Random(0)
    g = torch.Generator().manual_seed(0)
    state = SamplingState(VOCAB, torch.device(device))
    live = {}  # key -> (prompt, output, params)
    next_key = 0
    seen = []
    for step in range(8):
        for _ in range(rng.randint(1, 3)):  # new requests; some prompts long enough to grow the width
            live[next_key] = ([rng.randrange(VOCAB) for _ in range(rng.choice([0, 3, 40, 150]))], [],
                              KINDS[next_key % len(KINDS)])
            next_key += 1
        if step in (3, 6):  # requests end: their slots are reused
            for key in list(live)[:2]:
                del live[key]
                state.remove(key)
        keys = list(live)
        entries = [state.entry(k, live[k][0], live[k][1], live[k][2]) for k in keys]
        x = torch.randn(len(keys), VOCAB, generator=g).to(device)
        upload = state.apply_penalties(x, list(range(len(keys))), entries,
                                       penalty_columns([live[k][2] for k in keys]))
        seen.append(x.cpu())
        # new tokens: often ones already seen (the count goes up), sometimes new ones
        new = [rng.choice(live[k][0] + live[k][1]) if (live[k][0] + live[k][1]) and rng.random() < 0.6
               else rng.randrange(VOCAB) for k in keys]
        # the sampler's path (the slots read from the penalties' upload) on even steps
        state.append(entries, torch.tensor(new, device=device), upload=upload if step % 2 == 0 else None)
        for k, t in zip(keys, new):
            live[k][1].append(t)
    slots = {}
    for k in live:
        e = state._entries[k]
        num = int(state.num_distinct[e.slot])
        ids = state.token_ids[e.slot, :num].cpu().tolist()
        counts = state.output_counts[e.slot, :num].cpu().tolist()
        slots[k] = sorted(zip(ids, counts))
    return seen, slots


def test_penalties_and_appends_equal_the_torch_path(device, monkeypatch):
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "torch")
    ref_logits, ref_slots = run(device)
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    got_logits, got_slots = run(device)
    assert got_slots == ref_slots
    for want, got in zip(ref_logits, got_logits):
        assert torch.equal(got, want)


def test_the_state_counts_what_the_requests_generated(device, monkeypatch):
    """The kernels' slots hold each request's distinct tokens and their output counts."""
    monkeypatch.setenv("INFER_CLUSTER_KERNELS", "triton")
    state = SamplingState(VOCAB, torch.device(device))
    prompt, output = [5, 6, 7, 5], []
    params = SamplingParams(frequency_penalty=0.5)
    for t in [6, 9, 9, 200, 6, 9]:
        e = state.entry("r", prompt, output, params)
        state.append([e], torch.tensor([t], device=device))
        output.append(t)
    e = state.entry("r", prompt, output, params)
    num = int(state.num_distinct[e.slot])
    got = dict(zip(state.token_ids[e.slot, :num].tolist(), state.output_counts[e.slot, :num].tolist()))
    assert got == {5: 0.0, 6: 2.0, 7: 0.0, 9: 3.0, 200: 1.0}
